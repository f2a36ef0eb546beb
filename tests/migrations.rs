//! Databases written by older versions of precedent, committed in `fixtures/schemas/`
//! (how each was made and what it holds: `fixtures/schemas/README.md`), open with the
//! current store: migrated to the current schema version, `verify` clean, and everything
//! written still there: released facts under their hashes, held facts held and released
//! when their missing ancestor arrives, queue state and peer bookmarks.
//!
//! The bug this prevents: a migration that drops or misreads rows of an older layout (or
//! a schema file rewritten in place after databases were written with it), which tests
//! that build old databases from today's schema files cannot see.

mod common;

use std::path::{Path, PathBuf};

use common::assert_topological;
use common::shop::shop;
use precedent::{Error, Fact, FactHash, Store};

/// A committed database and what its version's command line could write into it.
struct Fixture {
    file: &'static str,
    version: u32,
    /// Written with queue commands: the `ship` queue.
    queue: bool,
    /// Written with `sync` against a `serve`: one peer bookmark.
    sync: bool,
}

impl Fixture {
    /// Written by a command line of facts alone (no queue or sync commands yet).
    const fn facts_only(file: &'static str, version: u32) -> Fixture {
        Fixture {
            file,
            version,
            queue: false,
            sync: false,
        }
    }

    /// Written by a command line with queue and sync commands.
    const fn full(file: &'static str, version: u32) -> Fixture {
        Fixture {
            file,
            version,
            queue: true,
            sync: true,
        }
    }
}

const V1: Fixture = Fixture::facts_only("v1.db", 1);
const V2: Fixture = Fixture::facts_only("v2.db", 2);
/// Version 3 as first written: sync commands, no queue commands yet.
const V3_HELD_BY_HASH: Fixture = Fixture {
    sync: true,
    ..Fixture::facts_only("v3-held-by-hash.db", 3)
};
const V3: Fixture = Fixture::full("v3.db", 3);
const V4: Fixture = Fixture::full("v4.db", 4);
const V4_HELD_CHILD: Fixture = Fixture::full("v4-held-child.db", 4);
const V5: Fixture = Fixture::full("v5.db", 5);

/// The facts `fixtures/schemas/make.sh` gives, built again here from the same inputs.
struct Written {
    shop: Fact,
    /// Orders 1 to 7 (index 0 is order 1); 6 comes after 5 and 7 after 6.
    orders: Vec<Fact>,
    /// The fact the peer held besides the shop.
    note: Fact,
}

impl Written {
    fn new() -> Written {
        let shop = shop("corner");
        let mut orders: Vec<Fact> = Vec::new();
        for id in 1..=7 {
            let mut b = Fact::builder("Shop.Order")
                .field("id", id)
                .predecessor("shop", shop.hash());
            if id >= 6 {
                b = b.predecessor("after", orders.last().unwrap().hash());
            }
            orders.push(b.build().unwrap());
        }
        let note = Fact::builder("Shop.Note")
            .field("text", "from the peer")
            .predecessor("shop", shop.hash())
            .build()
            .unwrap();
        Written { shop, orders, note }
    }

    fn order(&self, id: usize) -> &Fact {
        &self.orders[id - 1]
    }
}

/// The schema version this build writes: one migration per file in `schema/`.
fn current_version() -> u32 {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema");
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "sql")
        })
        .count() as u32
}

fn user_version(path: &Path) -> u32 {
    rusqlite::Connection::open(path)
        .unwrap()
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap()
}

/// A copy of the fixture in a temporary directory, so that the committed file is never
/// migrated in place.
fn copy(fixture: &Fixture) -> (tempfile::TempDir, PathBuf) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/schemas")
        .join(fixture.file);
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join(fixture.file);
    std::fs::copy(&from, &to).unwrap();
    assert_eq!(user_version(&to), fixture.version, "{}", fixture.file);
    (dir, to)
}

fn assert_clean(store: &Store) {
    let v = store.verify(|_| {}).unwrap();
    assert!(v.is_clean(), "{:?}", v.problems);
}

/// The one fact of `type_name`, and the fact it names through `role`.
fn only_of_type(store: &Store, type_name: &str, role: &str) -> FactHash {
    let facts = store.facts_of_type(type_name).unwrap();
    assert_eq!(facts.len(), 1, "{type_name}: {facts:?}");
    *facts[0].predecessors()[role].iter().next().unwrap()
}

/// Everything a fixture holds, checked after it is opened (and so migrated) by this build.
fn opens_and_keeps_what_it_held(fixture: Fixture) {
    let (_dir, path) = copy(&fixture);
    let w = Written::new();
    let store = Store::open(&path).unwrap();
    assert_eq!(user_version(&path), current_version());
    assert_clean(&store);
    assert!(!store.store_id().unwrap().is_empty());

    // Released, each under the hash this build computes from the same inputs.
    let mut released = vec![&w.shop, w.order(1), w.order(2)];
    if fixture.queue {
        released.extend([w.order(3), w.order(4)]);
    }
    if fixture.sync {
        released.push(&w.note);
    }
    for f in &released {
        let got = store.lookup(&f.hash()).unwrap().expect("released fact");
        assert_eq!(got.fact.canonical_bytes(), f.canonical_bytes());
        assert!(got.seq.is_some(), "{} is held", f.hash());
    }
    // Besides those, the queue wrote a completion and a dead letter.
    let extra = if fixture.queue { 2 } else { 0 };
    let (count, max_seq) = store.count_and_max_seq().unwrap();
    assert_eq!(count, (released.len() + extra) as u64);

    // Held, behind order 5 which was never given.
    assert_eq!(store.held_count().unwrap(), 2);
    for id in [6, 7] {
        let got = store
            .lookup(&w.order(id).hash())
            .unwrap()
            .expect("held fact");
        assert_eq!(got.seq, None, "order {id} released without order 5");
    }

    if fixture.queue {
        let s = store.queue_stats("ship").unwrap();
        assert_eq!((s.ready, s.completed, s.dead), (2, 1, 1), "{s:?}");
        assert_eq!(
            (s.leased, s.delayed, s.blocked, s.poison),
            (0, 0, 0, 0),
            "{s:?}"
        );
        assert_eq!(
            only_of_type(&store, "Shop.Shipped", "order"),
            w.order(1).hash()
        );
        assert_eq!(
            only_of_type(&store, "precedent.DeadLetter", "input"),
            w.order(2).hash()
        );
    }

    if fixture.sync {
        let peers = store.peers().unwrap();
        assert_eq!(peers.len(), 1, "{peers:?}");
        let p = &peers[0];
        assert!(p.url.starts_with("http://127.0.0.1:"), "{}", p.url);
        // The peer held the shop and the note; the sync was the last thing written, so
        // everything released here had been pushed.
        assert_eq!((p.pull_after, p.remote_seq), (2, 2), "{p:?}");
        assert_eq!(p.push_after, max_seq, "{p:?}");
        assert_eq!(p.last_error, None);
    }

    // The missing ancestor releases the held orders, in order, and the queue takes them in.
    assert_eq!(store.insert(w.order(5)).unwrap().released(), 3);
    assert_eq!(store.held_count().unwrap(), 0);
    assert_clean(&store);
    assert_topological(&store);
    if fixture.queue {
        let s = store.queue_stats("ship").unwrap();
        // Orders 3, 4 and 5 are ready; 6 and 7 wait for the order before them.
        assert_eq!((s.ready, s.blocked), (3, 2), "{s:?}");
    }
    drop(store);

    // Reopened, it is not migrated again.
    let store = Store::open(&path).unwrap();
    assert_eq!(user_version(&path), current_version());
    assert_clean(&store);
}

#[test]
fn a_version_1_database_opens_and_keeps_its_facts() {
    opens_and_keeps_what_it_held(V1);
}

#[test]
fn a_version_2_database_opens_and_keeps_its_facts() {
    opens_and_keeps_what_it_held(V2);
}

#[test]
fn a_first_version_3_database_opens_with_its_peer() {
    opens_and_keeps_what_it_held(V3_HELD_BY_HASH);
}

#[test]
fn a_version_3_database_opens_with_its_queue_and_peer() {
    opens_and_keeps_what_it_held(V3);
}

#[test]
fn a_version_4_database_opens_with_its_queue_and_peer() {
    opens_and_keeps_what_it_held(V4);
}

/// Version 4 as first written (held_child, before 004_held_set.sql replaced that file).
#[test]
fn a_first_version_4_database_opens_with_its_queue_and_peer() {
    opens_and_keeps_what_it_held(V4_HELD_CHILD);
}

#[test]
fn a_version_5_database_opens_with_its_queue_and_peer() {
    opens_and_keeps_what_it_held(V5);
}

/// A database of a newer version than this build is refused, and left byte for byte as
/// it was: an older build must not migrate (or damage) what a newer one wrote.
#[test]
fn a_database_from_a_newer_version_is_refused_unchanged() {
    let (_dir, path) = copy(&V5);
    drop(Store::open(&path).unwrap());
    let newer = current_version() + 1;
    rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", newer)
        .unwrap();
    let before = std::fs::read(&path).unwrap();
    match Store::open(&path) {
        Err(Error::SchemaTooNew { supported, found }) => {
            assert_eq!((supported, found), (current_version(), newer));
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened a database of version {newer}"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(user_version(&path), newer);
}

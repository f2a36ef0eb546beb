//! Watches woken by wake-ups instead of their poll interval: on PostgreSQL by the
//! `LISTEN`/`NOTIFY` of another store's commit (another connection pool, another
//! process), also after the listener's connection was killed; on SQLite by a commit
//! through the same `Store`.
//!
//! Every watch here has an interval of an hour, so a change that arrives within the
//! bound was woken, not polled for; the bound is only there so that a missing wake-up
//! fails the test instead of hanging it.

mod common;

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::bin::run_ok;
use common::pg::{self, PgDb};
use precedent::query::Change;
use precedent::query::watch::WatchHandle;
use precedent::{Fact, Store};

/// The longest a wake-up may take on a loaded machine.
const BOUND: Duration = Duration::from_secs(30);
/// An interval no test waits out.
const HOUR: Duration = Duration::from_secs(3600);

/// A watch of the shop's order ids on `store`, with an interval of an hour, on a thread.
fn watch_orders(store: &Arc<Store>, shop: &Fact) -> WatchHandle {
    let mut watch = store
        .prepare("given s: Shop match o: Shop.Order where o->shop = s select o.id")
        .unwrap()
        .given("s", shop)
        .unwrap()
        .watch()
        .unwrap();
    watch.interval = HOUR;
    watch.spawn(store.clone()).unwrap()
}

/// The id of the next change, an addition, within [`BOUND`].
fn next_added(handle: &WatchHandle) -> i64 {
    match handle.recv_timeout(BOUND) {
        Ok(Ok(Change::Added(row))) => row.value_as::<i64>().unwrap(),
        other => panic!("expected an addition within {BOUND:?}, got {other:?}"),
    }
}

/// The backend pids of the sessions listening on `db`'s channel.
fn listeners(db: &PgDb) -> Vec<String> {
    let out = db.psql(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
         AND query = 'LISTEN precedent_released' ORDER BY pid",
    );
    out.lines().map(str::to_string).collect()
}

/// Waits (bounded) until `db` has one listener that is not among `old`, and returns its
/// pid; then a little longer, so that the watch has read what the listener's first
/// wake-up asked it to and is waiting again.
fn new_listener(db: &PgDb, old: &[String]) -> String {
    let until = Instant::now() + BOUND;
    loop {
        if let Some(pid) = listeners(db).into_iter().find(|p| !old.contains(p)) {
            std::thread::sleep(Duration::from_millis(300));
            return pid;
        }
        assert!(Instant::now() < until, "no listener on {} in time", db.name);
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn order_json(shop: &Fact, id: i64) -> String {
    format!(
        r#"{{"type":"Shop.Order","fields":{{"id":{id}}},"predecessors":{{"shop":"{}"}}}}"#,
        shop.hash()
    )
}

#[test]
fn a_watch_on_postgres_is_woken_by_other_stores_and_processes_and_after_its_listener_dies() {
    let Some(db) = pg::db() else { return };
    let watching = Arc::new(Store::open(&db.url).unwrap());
    let shop = common::shop::shop("corner");
    watching.insert(&shop).unwrap();
    let handle = watch_orders(&watching, &shop);
    let first = new_listener(&db, &[]);

    // Another store in this process: its own pool, so only the notification tells.
    let other = Store::open(&db.url).unwrap();
    other.insert(&common::shop::order(&shop, "id", 1)).unwrap();
    assert_eq!(next_added(&handle), 1);

    // Another process.
    run_ok(Path::new(&db.url), &["add", &order_json(&shop, 2)], b"");
    assert_eq!(next_added(&handle), 2);

    // The listener's connection killed: it connects again, and a later write still wakes.
    let killed = db.psql(&format!("SELECT pg_terminate_backend({first})"));
    assert_eq!(killed, "t");
    new_listener(&db, &[first]);
    run_ok(Path::new(&db.url), &["add", &order_json(&shop, 3)], b"");
    assert_eq!(next_added(&handle), 3);

    // Closing the watching store ends its listener (the server's session ends soon after).
    drop(handle);
    drop(watching);
    let until = Instant::now() + BOUND;
    while !listeners(&db).is_empty() {
        assert!(Instant::now() < until, "the listener outlived its store");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_watch_on_sqlite_is_woken_by_a_write_through_the_same_store() {
    let store = Arc::new(Store::open_in_memory().unwrap());
    let shop = common::shop::shop("corner");
    store.insert(&shop).unwrap();
    let handle = watch_orders(&store, &shop);
    for id in 1..=3 {
        // A moment for the watch to be waiting again: a write before that is found by
        // the poll it makes anyway, and the test proves less.
        std::thread::sleep(Duration::from_millis(100));
        store.insert(&common::shop::order(&shop, "id", id)).unwrap();
        assert_eq!(next_added(&handle), id);
    }
}

conformance! {
    /// The seam itself: a wait after a mark returns `true` (woken) for a write after the
    /// mark, through the same store on either backend and, on PostgreSQL, through
    /// another store; it returns `false` only when its timeout passes.
    fn wait_for_wake_is_woken_by_a_later_commit(b: Backend) {
        let db = b.db();
        let store = db.store();
        if db.pg.is_some() {
            // The first wait starts the listener, which wakes every waiter once it
            // listens (what was committed before is then found by a read): a wake-up
            // with no write, which came within a 1 ms wait when the listener connected
            // that fast.
            let before = store.wake_mark();
            assert!(store.wait_for_wake(before, BOUND), "no wake-up when the listener starts");
        }
        let mark = store.wake_mark();
        assert!(!store.wait_for_wake(mark, Duration::from_millis(1)));
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                store.insert(&common::shop::shop("corner")).unwrap();
            });
            assert!(store.wait_for_wake(mark, BOUND), "no wake-up for the store's own write");
        });
        if let Some(pg) = &db.pg {
            // The listener of the first wait is listening; its own first wake-up came
            // before the mark.
            new_listener(pg, &[]);
            let mark = store.wake_mark();
            db.store().insert(&common::shop::shop("other")).unwrap();
            assert!(store.wait_for_wake(mark, BOUND), "no wake-up for another store's write");
        }
    }
}

#[test]
fn precedent_watch_on_postgres_prints_another_process_s_write_at_once() {
    let Some(db) = pg::db() else { return };
    let shop = common::shop::shop("corner");
    Store::open(&db.url).unwrap().insert(&shop).unwrap();
    let query = "given s: Shop match o: Shop.Order where o->shop = s select o.id";
    let mut child = common::bin::cmd(
        Path::new(&db.url),
        &[
            "watch",
            query,
            "--given",
            &format!("s={}", shop.hash()),
            "--interval",
            "1h",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    new_listener(&db, &[]);
    run_ok(Path::new(&db.url), &["add", &order_json(&shop, 5)], b"");
    let line = rx.recv_timeout(BOUND);
    common::process::kill(&mut child);
    let line: serde_json::Value =
        serde_json::from_str(&line.expect("a line within the bound")).unwrap();
    assert_eq!(
        (line["change"].as_str(), line["result"].as_i64()),
        (Some("added"), Some(5)),
        "{line}"
    );
}

/// The cost of the `pg_notify` on the write path, roughly: write transactions that run one
/// `SELECT 1` against ones that run one `pg_notify` instead, alternating in rounds,
/// beside one-fact insert transactions (which carry the notification) for scale. Ignored
/// by default: `cargo test --test pg_notify -- --ignored --nocapture notify_cost`.
#[test]
#[ignore]
fn notify_cost() {
    let Some(db) = pg::db() else { return };
    let store = Store::open(&db.url).unwrap();
    let shop = common::shop::shop("corner");
    store.insert(&shop).unwrap();
    let (n, rounds) = (500, 5);
    let timed = |sql: &str| {
        let start = Instant::now();
        for _ in 0..n {
            store
                .write(|w| w.sql().execute(sql, &[]).map(drop))
                .unwrap();
        }
        start.elapsed() / n
    };
    let mut id = 0;
    for round in 0..rounds {
        let plain = timed("SELECT 1");
        let notify = timed("SELECT pg_notify('precedent_cost', '1')");
        let start = Instant::now();
        for _ in 0..n {
            id += 1;
            store.insert(&common::shop::order(&shop, "id", id)).unwrap();
        }
        let insert = start.elapsed() / n;
        eprintln!(
            "round {round}: tx with SELECT 1 {plain:?}, with pg_notify {notify:?} \
             (+{:?}), one-fact insert {insert:?}: notify is {:.1}% of an insert",
            notify.saturating_sub(plain),
            100.0 * notify.saturating_sub(plain).as_secs_f64() / insert.as_secs_f64()
        );
    }
}

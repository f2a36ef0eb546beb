//! The invariants the crash loops check after each kill, on any backend (`db` is a
//! SQLite file or a `postgres://` URL): see tests/crash_loops.rs.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use precedent::{Fact, FactHash, Store, StoreOptions};

use super::assert_topological;
use super::bin::{cmd, run_ok as run};
use super::queue;

/// The store at `db`, a file or a URL.
pub fn open(db: &Path) -> Store {
    Store::open_with(db, StoreOptions::default()).unwrap()
}

/// The invariants every restart checks: `verify` passes, release order is topological,
/// and everything in `acked` is still released. Returns the released facts in order.
pub fn check_store(db: &Path, acked: &HashSet<FactHash>) -> Vec<Fact> {
    let out = cmd(db, &["verify"]).output().unwrap();
    assert!(
        out.status.success(),
        "verify failed after a kill: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let store = open(db);
    assert_topological(&store);
    let mut released = Vec::new();
    store
        .for_each_released(0, |_, _, bytes| {
            released.push(Fact::from_canonical(bytes).unwrap());
            Ok(())
        })
        .unwrap();
    let now: HashSet<FactHash> = released.iter().map(Fact::hash).collect();
    let lost = acked.difference(&now).count();
    assert_eq!(lost, 0, "{lost} released facts lost after a kill");
    released
}

/// `chains` chains of `len` facts each.
pub fn chains(tag: &str, chains: usize, len: usize) -> Vec<Fact> {
    chains_from(tag, &vec![None; chains], len)
}

/// A chain of `len` facts per entry of `roots`, its first fact after that root (if any).
pub fn chains_from(tag: &str, roots: &[Option<FactHash>], len: usize) -> Vec<Fact> {
    let mut out = Vec::with_capacity(roots.len() * len);
    for (c, root) in roots.iter().enumerate() {
        let mut prev: Option<FactHash> = *root;
        for i in 0..len {
            let mut b = Fact::builder("Link")
                .field("tag", tag)
                .field("chain", c as i64)
                .field("n", i as i64)
                .field("pad", "x".repeat(64));
            if let Some(p) = prev {
                b = b.predecessor("prev", p);
            }
            let f = b.build().unwrap();
            prev = Some(f.hash());
            out.push(f);
        }
    }
    out
}

/// Per input: (effects, completions, dead letters), checked to be at most one each and
/// an effect exactly when a completion.
pub fn queue_outcomes(released: &[Fact]) -> BTreeMap<FactHash, (usize, usize, usize)> {
    let mut out: BTreeMap<FactHash, (usize, usize, usize)> = BTreeMap::new();
    for f in released {
        let role = match f.type_name() {
            "Effect" => "input",
            "Shop.Shipped" => "order",
            "precedent.DeadLetter" => "input",
            "precedent.Poison" => panic!("no input may be poisoned: {f:?}"),
            _ => continue,
        };
        let input = *f.predecessors()[role].iter().next().unwrap();
        let e = out.entry(input).or_default();
        match f.type_name() {
            "Effect" => e.0 += 1,
            "Shop.Shipped" => e.1 += 1,
            _ => e.2 += 1,
        }
    }
    for (input, (effects, done, dead)) in &out {
        assert!(
            *effects <= 1 && *done <= 1 && *dead <= 1,
            "{input}: {effects} effects, {done} completions, {dead} dead letters"
        );
        assert_eq!(effects, done, "{input}: an effect without its completion");
        assert!(
            *done + *dead <= 1,
            "{input}: both completed and dead-lettered"
        );
    }
    out
}

/// Every fact of `from` through release sequence `through` is released in `to`.
pub fn assert_prefix_present(from: &Path, through: i64, to: &Path) {
    let from = open(from);
    let to = open(to);
    from.for_each_in_range(0, through, |seq, h, _| {
        assert!(
            to.get(&h).unwrap().is_some(),
            "fact at seq {seq} is covered by the bookmark but not stored"
        );
        Ok(())
    })
    .unwrap();
}

/// A database with `n` orders (in chains of four if `chained`: a dead-lettered input
/// would block the rest of its chain) and a queue `ship` over them.
pub fn queue_db(path: &Path, n: usize, max_attempts: &str, chained: bool) -> Vec<FactHash> {
    run(path, &["init"], b"");
    let facts = queue::orders(n, chained.then_some(4));
    queue::import(path, &facts);
    queue::declare_ship(path, "300ms", max_attempts, "5ms");
    facts[1..].iter().map(Fact::hash).collect()
}

/// What is left to do of `ship`, dead letters aside.
pub const PENDING: &[&str] = &["ready", "leased", "delayed", "blocked"];

/// A database at `path` with `facts` stored.
pub fn seeded_db(path: &Path, facts: &[Fact]) {
    run(path, &["init"], b"");
    open(path).insert_batch(facts.to_vec()).unwrap();
}

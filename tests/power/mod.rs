//! The workload, the reference model and the checks shared by tests/power_loss.rs and
//! tests/io_faults.rs: a store on the crash VFS ([`vfs`]) driven through the public API
//! (imports with held release, claims, completions with effects, dead letters, redrives,
//! sync with a hub on 127.0.0.1), and after a cut or a fault the store's answers compared
//! with what the model says may be there.
#![allow(dead_code)]

pub mod vfs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use precedent::clock::ManualClock;
use precedent::queue::{Completion, FailOutcome, Failure, ItemState, Lease, QueueSpec};
use precedent::store::{Durability, SqlExt};
use precedent::sync::client::{Client, ClientOptions, SyncOptions};
use precedent::sync::server::{Running, ServerConfig};
use precedent::{Error, Fact, FactHash, Store, StoreOptions, args};

pub use vfs::Disk;
#[allow(unused_imports)]
pub use vfs::{Fault, FaultKind};

const T0: i64 = 1_800_000_000_000;
const QUEUE: &str = "ship";

/// The seed of a run: `var` if set (to replay one run), else random.
pub fn seed_from(var: &str) -> Option<u64> {
    std::env::var(var)
        .ok()
        .map(|s| s.parse().expect("a seed is a number"))
}

/// A number from the environment, or `default`.
pub fn env_count(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .map_or(default, |s| s.parse().expect("a count is a number"))
}

/// One store on one crash disk, with the hub it syncs with.
pub struct Rig {
    pub disk: Arc<Disk>,
    root: tempfile::TempDir,
    pub db: PathBuf,
    pub options: StoreOptions,
    pub hub: Hub,
}

/// A sync hub on a real file (not on the crash disk), served on 127.0.0.1.
pub struct Hub {
    _dir: tempfile::TempDir,
    /// The hub's files live on a disk in memory of their own, never cut: fast, and
    /// untouched by the store's cuts.
    _disk: Arc<Disk>,
    pub store: Store,
    server: Option<Running>,
    pub url: String,
    /// Its own facts, a chain: some local facts wait for them.
    pub chain: Vec<Fact>,
    /// How many of `chain` it holds.
    pub given: usize,
}

impl Hub {
    fn new(seed: u64) -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let disk = Disk::new(dir.path(), seed);
        let db = dir.path().canonicalize().unwrap().join("hub.db");
        let store = Store::open_with(&db, StoreOptions::default()).unwrap();
        let mut c = ServerConfig::new(&db);
        c.listen = "127.0.0.1:0".parse().unwrap();
        let server = Running::start(c).unwrap();
        let url = server.url();
        let mut chain: Vec<Fact> = Vec::new();
        for i in 0..24 {
            let mut b = Fact::builder("Hub").field("run", seed as i64).field("n", i);
            if let Some(p) = chain.last() {
                b = b.predecessor("prev", p.hash());
            }
            chain.push(b.build().unwrap());
        }
        Hub {
            _dir: dir,
            _disk: disk,
            store,
            server: Some(server),
            url,
            chain,
            given: 0,
        }
    }

    /// Gives the hub `n` more of its chain.
    fn grow(&mut self, n: usize) {
        let to = (self.given + n).min(self.chain.len());
        self.store
            .insert_batch(self.chain[self.given..to].to_vec())
            .unwrap();
        self.given = to;
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            let _ = s.stop();
        }
        self._disk.forget();
    }
}

impl Rig {
    pub fn new(seed: u64, durability: Durability) -> Rig {
        let root = tempfile::tempdir().unwrap();
        let disk = Disk::new(root.path(), seed);
        // A deliberate break, to see the checks fail: a disk that ignores fsync.
        if std::env::var("PRECEDENT_POWER_BREAK").as_deref() == Ok("nosync") {
            disk.lie_about_sync(true);
        }
        let db = root.path().canonicalize().unwrap().join("store.db");
        let options = StoreOptions {
            clock: ManualClock::starting_at(T0),
            durability,
            // A cut makes the writer fail, not wait.
            busy_timeout: std::time::Duration::from_millis(200),
            ..StoreOptions::default()
        };
        Rig {
            disk,
            root,
            db,
            options,
            hub: Hub::new(seed),
        }
    }

    pub fn open(&self) -> precedent::Result<Store> {
        Store::open_with(&self.db, self.options.clone())
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.disk.forget();
        let _ = &self.root;
    }
}

/// The queue: orders, done by a `Shipped` naming the order.
pub fn spec() -> QueueSpec {
    QueueSpec::new(
        QUEUE,
        "Order",
        vec![Completion {
            type_name: "Shipped".into(),
            role: "order".into(),
        }],
    )
}

/// Declares the queue and makes the handler's table.
pub fn setup(store: &Store) -> precedent::Result<()> {
    store.declare_queue(&spec())?;
    store.write(|w| {
        w.sql()
            .batch("CREATE TABLE IF NOT EXISTS effect (input TEXT PRIMARY KEY)")
    })
}

/// The facts a run imports, in an order where most come after their predecessors but a
/// batch may hold a child before its parent: links in chains, orders (queue inputs) after
/// a shop and sometimes a link, and replies waiting for facts only the hub has.
fn pool(rng: &mut fastrand::Rng, hub: &[Fact], seed: u64) -> Vec<Fact> {
    let shop = Fact::builder("Shop")
        .field("seed", seed as i64)
        .build()
        .unwrap();
    let mut out = vec![shop.clone()];
    let mut links: Vec<FactHash> = Vec::new();
    for i in 0..120 {
        let f = match rng.u8(..10) {
            0..=3 => {
                let mut b = Fact::builder("Link")
                    .field("n", i)
                    .field("pad", "x".repeat(rng.usize(0..600)));
                if let Some(&p) = links.last().filter(|_| rng.u8(..4) != 0) {
                    b = b.predecessor("prev", p);
                }
                let f = b.build().unwrap();
                links.push(f.hash());
                f
            }
            4..=7 => {
                let mut b = Fact::builder("Order")
                    .field("n", i)
                    .predecessor("shop", shop.hash());
                if let Some(&p) = links.last().filter(|_| rng.bool()) {
                    b = b.predecessor("after", p);
                }
                b.build().unwrap()
            }
            _ => Fact::builder("Reply")
                .field("n", i)
                .predecessor("to", hub[rng.usize(..hub.len())].hash())
                .build()
                .unwrap(),
        };
        out.push(f);
    }
    out
}

/// What the store should answer: its facts (released or held), the queue's inputs and
/// where each stands, and the handler's rows.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// Every stored fact, with its predecessors.
    facts: BTreeMap<FactHash, Vec<FactHash>>,
    orders: BTreeSet<FactHash>,
    leased: BTreeSet<FactHash>,
    done: BTreeSet<FactHash>,
    dead: BTreeSet<FactHash>,
    effects: BTreeSet<FactHash>,
    /// Claimed by an operation whose answer is unknown (the one in flight at a cut).
    claimed_unseen: u64,
}

/// What the store answers, in the model's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub released: BTreeSet<FactHash>,
    pub held: BTreeMap<FactHash, BTreeSet<FactHash>>,
    /// Ready or delayed, leased, dead, completed.
    pub queue: [u64; 4],
    pub effects: BTreeSet<FactHash>,
}

impl Model {
    fn add(&mut self, f: &Fact) {
        self.facts
            .insert(f.hash(), f.predecessor_hashes().into_iter().collect());
        if f.type_name() == "Order" {
            self.orders.insert(f.hash());
        }
    }

    fn released(&self) -> BTreeSet<FactHash> {
        let mut out = BTreeSet::new();
        loop {
            let before = out.len();
            for (h, preds) in &self.facts {
                if !out.contains(h) && preds.iter().all(|p| out.contains(p)) {
                    out.insert(*h);
                }
            }
            if out.len() == before {
                return out;
            }
        }
    }

    fn waiting(&self, released: &BTreeSet<FactHash>) -> BTreeSet<FactHash> {
        self.orders
            .iter()
            .filter(|o| released.contains(o))
            .filter(|o| {
                !self.leased.contains(o) && !self.done.contains(o) && !self.dead.contains(o)
            })
            .copied()
            .collect()
    }

    pub fn seen(&self) -> Seen {
        let released = self.released();
        let held = self
            .facts
            .iter()
            .filter(|(h, _)| !released.contains(h))
            .map(|(h, preds)| {
                let missing = preds.iter().filter(|p| !released.contains(p)).copied();
                (*h, missing.collect())
            })
            .collect();
        let waiting = self.waiting(&released).len() as u64 - self.claimed_unseen;
        Seen {
            queue: [
                waiting,
                self.leased.len() as u64 + self.claimed_unseen,
                self.dead.len() as u64,
                self.done.len() as u64,
            ],
            released,
            held,
            effects: self.effects.clone(),
        }
    }
}

/// What the store holds now, through its public API.
pub fn observe(store: &Store) -> precedent::Result<Seen> {
    let mut released = BTreeSet::new();
    store.for_each_released(0, |_, h, bytes| {
        let f = Fact::from_canonical(bytes)?;
        if !f.type_name().starts_with("precedent.") {
            released.insert(h);
        }
        Ok(())
    })?;
    let held = store
        .held(usize::MAX)?
        .into_iter()
        .map(|h| (h.fact.hash(), h.missing.into_iter().collect()))
        .collect();
    let st = store.queue_stats(QUEUE)?;
    assert_eq!(
        st.blocked + st.poison,
        0,
        "no order waits for another: {st:?}"
    );
    let effects = store.read(|r| {
        r.query_vec("SELECT input FROM effect", args![], |row| {
            row.get::<String>(0)
        })
    })?;
    Ok(Seen {
        released,
        held,
        queue: [st.ready + st.delayed, st.leased, st.dead, st.completed],
        effects: effects.iter().map(|h| h.parse().unwrap()).collect(),
    })
}

/// One operation of the workload.
#[derive(Clone, Debug)]
pub enum Op {
    Import(Vec<Fact>),
    Claim(usize),
    Complete(FactHash),
    Fail(FactHash),
    Redrive(FactHash),
    /// The hub grows by this many facts first.
    Sync(usize),
}

/// A run of the workload: the model after each operation that returned `Ok`.
pub struct Run {
    pub model: Model,
    /// `snaps[k]`: what the store must answer after the first `k` operations.
    pub snaps: Vec<Seen>,
    /// The operations that returned `Ok`, in order.
    pub done: Vec<Op>,
    /// The operation that returned `Err`, and what the store would hold had it committed
    /// (`None` for a sync, which commits page by page).
    pub failed: Option<(Op, Option<Seen>, Error)>,
    /// The model the failed operation would have left (`None` for a sync).
    failed_model: Option<Model>,
    /// How many operations had returned `Ok` when it failed: its outcome is still open
    /// only while no later write overwrote what it may have left in the WAL.
    failed_at: usize,
    leases: BTreeMap<FactHash, Lease>,
    pool: Vec<Fact>,
    next: usize,
    rng: fastrand::Rng,
}

impl Run {
    pub fn new(seed: u64, rig: &Rig) -> Run {
        let mut rng = fastrand::Rng::with_seed(seed);
        let pool = pool(&mut rng, &rig.hub.chain, seed);
        let model = Model::default();
        Run {
            snaps: vec![model.seen()],
            model,
            done: Vec::new(),
            failed: None,
            failed_model: None,
            failed_at: 0,
            leases: BTreeMap::new(),
            pool,
            next: 0,
            rng,
        }
    }

    /// The next operation, chosen at random among those that make sense now.
    pub fn choose(&mut self) -> Op {
        loop {
            match self.rng.u8(..12) {
                0..=3 if self.next < self.pool.len() => {
                    // A window of the pool, shuffled: children may come before parents.
                    let end = (self.next + self.rng.usize(1..10)).min(self.pool.len());
                    let mut batch = self.pool[self.next..end].to_vec();
                    self.next = end;
                    self.rng.shuffle(&mut batch);
                    return Op::Import(batch);
                }
                4 | 5 => return Op::Claim(self.rng.usize(1..4)),
                6 | 7 if !self.leases.is_empty() => {
                    let k = *self
                        .leases
                        .keys()
                        .nth(self.rng.usize(..self.leases.len()))
                        .unwrap();
                    return Op::Complete(k);
                }
                8 if !self.leases.is_empty() => {
                    let k = *self
                        .leases
                        .keys()
                        .nth(self.rng.usize(..self.leases.len()))
                        .unwrap();
                    return Op::Fail(k);
                }
                9 if !self.model.dead.is_empty() => {
                    let d = &self.model.dead;
                    return Op::Redrive(*d.iter().nth(self.rng.usize(..d.len())).unwrap());
                }
                10 | 11 => return Op::Sync(self.rng.usize(0..4)),
                _ => {}
            }
        }
    }

    /// Runs `op` on `store` and checks its answer against the model. Returns whether it
    /// returned `Ok`.
    pub fn step(&mut self, store: &Store, hub: &mut Hub, op: Op) -> bool {
        let before = self.model.clone();
        let mut after = self.model.clone();
        let result = self.apply(store, hub, &op, &mut after);
        match result {
            Ok(()) => {
                self.model = after;
                self.snaps.push(self.model.seen());
                self.done.push(op);
                true
            }
            Err(e) => {
                let expected = match op {
                    Op::Sync(_) => None,
                    _ => Some(after.seen()),
                };
                self.model = before;
                self.failed_model = expected.is_some().then_some(after);
                self.failed = Some((op, expected, e));
                self.failed_at = self.done.len();
                false
            }
        }
    }

    /// The failed operation turned out to have committed: the model takes it.
    pub fn adopt_failed(&mut self) {
        let (op, s, _) = self.failed.take().expect("a failed operation");
        self.model = self.failed_model.take().unwrap();
        self.snaps.push(s.unwrap());
        self.done.push(op);
    }

    /// After an operation failed and the store still works: what it answers now says
    /// whether the operation committed; the model follows. Panics if it is neither.
    pub fn resolve(&mut self, store: &Store, hub: &Hub) -> Result<(), String> {
        let seen = observe(store).map_err(|e| format!("reading: {e}"))?;
        if seen == *self.snaps.last().unwrap() {
            return Ok(());
        }
        let committed = self.failed.as_ref().and_then(|(_, s, _)| s.as_ref()) == Some(&seen);
        if committed {
            self.adopt_failed();
            return Ok(());
        }
        let last = self.snaps.len() - 1;
        if let Err(e) = check(store, Path::new(""), self, last..=last + 1, hub, false) {
            panic!(
                "after a failed operation {:?}: {e}",
                self.failed.as_ref().map(|f| &f.2)
            );
        }
        // A sync that stopped part way: the facts it brought are in the model.
        for f in &hub.chain[..hub.given] {
            if seen.released.contains(&f.hash()) || seen.held.contains_key(&f.hash()) {
                self.model.add(f);
            }
        }
        assert_eq!(self.model.seen(), seen, "the model follows a partial sync");
        self.snaps.push(seen);
        self.done.push(Op::Sync(0));
        self.failed = None;
        Ok(())
    }

    fn apply(
        &mut self,
        store: &Store,
        hub: &mut Hub,
        op: &Op,
        m: &mut Model,
    ) -> precedent::Result<()> {
        match op {
            Op::Import(batch) => {
                let released_before = m.released().len() as u64;
                let new = batch
                    .iter()
                    .filter(|f| !m.facts.contains_key(&f.hash()))
                    .count();
                for f in batch {
                    m.add(f);
                }
                let report = store.insert_batch(batch.clone())?;
                let released_after = m.released().len() as u64;
                assert_eq!(
                    report.released,
                    released_after - released_before,
                    "released by {report:?}"
                );
                assert_eq!(
                    report.inserted + report.held,
                    new as u64,
                    "new facts in {report:?}"
                );
            }
            Op::Claim(n) => {
                let waiting = m.waiting(&m.released());
                let expect = (*n).min(waiting.len() - m.claimed_unseen as usize);
                m.claimed_unseen += expect as u64;
                let leases = store.claim(QUEUE, *n)?;
                m.claimed_unseen -= expect as u64;
                assert_eq!(
                    leases.len(),
                    expect,
                    "claim({n}) with {} waiting",
                    waiting.len()
                );
                for l in leases {
                    let h = l.input.hash();
                    assert!(waiting.contains(&h), "claimed {h}, which is not waiting");
                    m.leased.insert(h);
                    self.leases.insert(h, l);
                }
            }
            Op::Complete(input) => {
                let lease = self.leases[input].clone();
                let shipped = Fact::builder("Shipped")
                    .predecessor("order", *input)
                    .build()
                    .unwrap();
                let effect = Fact::builder("Effect")
                    .predecessor("input", *input)
                    .build()
                    .unwrap();
                m.leased.remove(input);
                m.done.insert(*input);
                m.effects.insert(*input);
                m.add(&shipped);
                m.add(&effect);
                store.complete(&lease, |w| {
                    let text = input.to_string();
                    w.sql()
                        .execute("INSERT INTO effect VALUES (?1)", args![text.as_str()])?;
                    w.insert(&effect)?;
                    w.insert(&shipped)?;
                    Ok(())
                })?;
                self.leases.remove(input);
            }
            Op::Fail(input) => {
                let lease = self.leases[input].clone();
                m.leased.remove(input);
                m.dead.insert(*input);
                let out = store.fail(&lease, Failure::Permanent(format!("refused {input}")))?;
                assert!(matches!(out, FailOutcome::DeadLettered(_)), "{out:?}");
                self.leases.remove(input);
            }
            Op::Redrive(input) => {
                m.dead.remove(input);
                store.redrive(QUEUE, input)?;
            }
            Op::Sync(grow) => {
                hub.grow(*grow);
                for f in &hub.chain[..hub.given] {
                    m.add(f);
                }
                let client = Client::new(
                    &hub.url,
                    ClientOptions {
                        batch: 8,
                        ..ClientOptions::default()
                    },
                )?;
                client.sync(store, &SyncOptions::default(), &mut |_| {})?;
            }
        }
        Ok(())
    }
}

/// Checks a store reopened after a cut: `verify` and SQLite's integrity check are clean
/// (if `verify`), the bookmarks are honest, the dead letters carry their reasons, and what
/// it answers is one of the states `allowed`: `k` is the state after the first `k`
/// operations that returned `Ok` (`run.snaps[k]`), or part way through a sync among them;
/// one past the last is the failed operation's outcome, had it committed. Returns the `k`
/// that matched.
pub fn check(
    store: &Store,
    db: &Path,
    run: &Run,
    allowed: std::ops::RangeInclusive<usize>,
    hub: &Hub,
    verify: bool,
) -> Result<usize, String> {
    if verify {
        let report = store.verify(|_| {}).map_err(|e| format!("verify: {e}"))?;
        if !report.is_clean() {
            return Err(format!("verify: {:?}", report.problems));
        }
        integrity(db)?;
    }
    let seen = observe(store).map_err(|e| format!("reading: {e}"))?;
    check_bookmarks(store, hub)?;
    for item in store
        .queue_items(QUEUE, Some(ItemState::Dead), usize::MAX)
        .map_err(|e| format!("reading: {e}"))?
    {
        let want = format!("refused {}", item.input);
        if item.last_error.as_deref() != Some(want.as_str()) || item.entry.is_none() {
            return Err(format!("dead letter without its reason: {item:?}"));
        }
    }
    let top = (*allowed.end()).min(run.snaps.len() - 1);
    for k in *allowed.start()..=top {
        if run.snaps[k] == seen {
            return Ok(k);
        }
    }
    if let Some((_, Some(s), _)) = &run.failed
        && run.failed_at == run.done.len()
        && *allowed.end() >= run.snaps.len()
        && *s == seen
    {
        return Ok(run.snaps.len());
    }
    // A sync commits page by page: between the state before it and after it, any set of
    // the hub's facts may have arrived.
    let syncs = run
        .done
        .iter()
        .enumerate()
        .filter(|(_, op)| matches!(op, Op::Sync(_)))
        .map(|(k, _)| k);
    let mut between: Vec<usize> = syncs.filter(|k| allowed.contains(k)).collect();
    if matches!(run.failed, Some((Op::Sync(_), _, _)))
        && run.failed_at == run.done.len()
        && allowed.contains(&run.done.len())
    {
        between.push(run.done.len());
    }
    for k in between {
        let mut m = model_at(run, k);
        for f in &hub.chain[..hub.given] {
            if seen.released.contains(&f.hash()) || seen.held.contains_key(&f.hash()) {
                m.add(f);
            }
        }
        if m.seen() == seen {
            return Ok(k);
        }
    }
    let nearest = diff(&run.snaps[top], &seen);
    Err(format!(
        "the store matches none of the allowed states {allowed:?}: {nearest}"
    ))
}

/// The model after the first `k` operations that returned `Ok`, rebuilt from the snaps'
/// facts (only what [`check`] needs: the stored facts, the queue and the effects).
fn model_at(run: &Run, k: usize) -> PartialModel {
    PartialModel {
        base: run.snaps[k].clone(),
        extra: Vec::new(),
    }
}

/// A state plus facts that arrived on top of it (a sync in flight).
struct PartialModel {
    base: Seen,
    extra: Vec<Fact>,
}

impl PartialModel {
    fn add(&mut self, f: &Fact) {
        self.extra.push(f.clone());
    }

    fn seen(&self) -> Seen {
        let mut m = Model::default();
        for (h, missing) in &self.base.held {
            m.facts.insert(*h, missing.iter().copied().collect());
        }
        for h in &self.base.released {
            m.facts.insert(*h, Vec::new());
        }
        for f in &self.extra {
            let preds = f.predecessor_hashes().into_iter().collect();
            m.facts.entry(f.hash()).or_insert(preds);
        }
        let mut s = m.seen();
        s.queue = self.base.queue;
        s.effects = self.base.effects.clone();
        s
    }
}

fn diff(want: &Seen, got: &Seen) -> String {
    let lost: Vec<_> = want.released.difference(&got.released).take(3).collect();
    let extra: Vec<_> = got.released.difference(&want.released).take(3).collect();
    format!(
        "released {} (want {}), lost {lost:?}, extra {extra:?}; held {} (want {}); queue {:?} (want {:?}); effects {} (want {})",
        got.released.len(),
        want.released.len(),
        got.held.len(),
        want.held.len(),
        got.queue,
        want.queue,
        got.effects.len(),
        want.effects.len()
    )
}

/// Every hub fact through the pull bookmark is here, and every local fact through the
/// push bookmark is on the hub.
fn check_bookmarks(store: &Store, hub: &Hub) -> Result<(), String> {
    let reading = |e: Error| format!("reading: {e}");
    let Some(peer) = store.peer(&hub.url).map_err(reading)? else {
        return Ok(());
    };
    let mut bad = None;
    hub.store
        .for_each_in_range(0, peer.pull_after, |seq, h, _| {
            if bad.is_none() && store.get(&h)?.is_none() {
                bad = Some(format!(
                    "hub fact at seq {seq} is under the pull bookmark {} but not here",
                    peer.pull_after
                ));
            }
            Ok(())
        })
        .map_err(reading)?;
    store
        .for_each_in_range(0, peer.push_after, |seq, h, _| {
            if bad.is_none() && hub.store.get(&h)?.is_none() {
                bad = Some(format!(
                    "local fact at seq {seq} is under the push bookmark {} but not on the hub",
                    peer.push_after
                ));
            }
            Ok(())
        })
        .map_err(reading)?;
    bad.map_or(Ok(()), Err)
}

/// SQLite's own integrity check of the file, on a connection of its own.
pub fn integrity(db: &Path) -> Result<(), String> {
    let c = rusqlite::Connection::open(db).map_err(|e| format!("integrity_check open: {e}"))?;
    let rows: Vec<String> = c
        .prepare("PRAGMA integrity_check")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(|e| format!("integrity_check: {e}"))?;
    if rows != ["ok"] {
        return Err(format!("integrity_check: {rows:?}"));
    }
    Ok(())
}

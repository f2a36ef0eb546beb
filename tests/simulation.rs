//! Deterministic simulation: several nodes in one process, each a `Store` on its own file,
//! driven by one seeded RNG and a `ManualClock`. Every step picks an action: a node writes
//! new facts (stores, orders naming a store and earlier orders, shipments naming orders), a
//! worker claims, completes, fails (transiently, permanently or as poison) or abandons inputs
//! of a declared queue, an operator redrives a dead-lettered or poison input, a remote
//! worker claims, extends, completes, fails or abandons inputs of one node's queue (the hub)
//! over HTTP, the clock moves, a sync message is sent or delivered through a network that
//! loses, duplicates, delays and reorders messages and partitions nodes, or a node restarts
//! (its store is dropped and its file reopened; messages in flight to it and its workers'
//! leases are lost; the hub's server restarts too, and the remote worker keeps its leases).
//!
//! The remote worker is `sync::client::RemoteQueue`, the client `precedent work --remote`
//! uses, talking to a `sync::server::Running` on 127.0.0.1 that serves the hub's database
//! with the simulation's `ManualClock`. Each call is one blocking request answered before
//! the next step, and the hub's claims never wait (`wait` 0), so a run stays a function of
//! its seed: the port and the lease tokens differ between runs, the outcomes do not.
//!
//! Sync messages are the protocol's (docs/protocol.md) carried over the Store API: a pull
//! batch is the facts a node released after the receiver's pull bookmark (or, like a push of
//! recent facts, a later window of them), and an ancestor fetch asks another node for the
//! hashes held facts wait on. The pull bookmark lives in the receiver's database and moves in
//! the transaction that commits the facts it covers, only when the batch starts at or before
//! it.
//!
//! After each run partitions heal, and sync rounds run until nothing changes alternately with
//! a drain of every node's queue (an operator redrives every dead letter and poison input,
//! a worker completes everything claimable) until a drain finds nothing; then every node
//! holds the same fact set, nothing is held, `verify` is clean, release order is
//! topological, no acknowledged write is lost, no queue input has two effect facts from one
//! database's completions (local and remote workers of the hub together), no input is left
//! unfinished (so no dead letter's input is lost), and every input is completed, redriven
//! ones once.
//!
//! A failing run panics with `seed=<n>`; `PRECEDENT_SIM_SEED=<n> cargo test --test
//! simulation` replays exactly that run. `PRECEDENT_SIM_SEEDS=<count>` runs `count` seeds
//! (default 20) from `PRECEDENT_SIM_FIRST` (default 1), and `PRECEDENT_SIM_STEPS=<steps>`
//! sets the steps per run (default 200). It runs on SQLite and on PostgreSQL (`tests/common/backend.rs`): a node's
//! database is a file or a PostgreSQL database, emptied before each seed's run.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use precedent::clock::ManualClock;
use std::time::Duration;

use precedent::queue::{
    Completion, FailOutcome, Failure, ItemState, Lease, QueueSpec, RetryPolicy,
};
use precedent::store::Durability;
use precedent::sync::client::{ClientOptions, RemoteLease, RemoteQueue};
use precedent::sync::server::{Running, ServerConfig};
use precedent::{Error, Fact, FactHash, Store, StoreOptions, Value};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use common::backend::TestDb;

const T0: i64 = 1_800_000_000_000;
const QUEUE: &str = "handle";
const ORDER: &str = "Sim.Order";
const SHOP: &str = "Sim.Shop";
const SHIPMENT: &str = "Sim.Shipment";
const HANDLED: &str = "Sim.Handled";
const EFFECT: &str = "Sim.Effect";

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}"))
    })
}

fn peer_url(node: usize) -> String {
    format!("sim://node-{node}")
}

fn queue_spec() -> QueueSpec {
    let mut spec = QueueSpec::new(
        QUEUE,
        ORDER,
        vec![Completion {
            type_name: HANDLED.into(),
            role: "order".into(),
        }],
    );
    spec.lease_ms = 5_000;
    // No jitter: the store draws backoff jitter from its own RNG, which a seed cannot
    // replay, so retries wait for the simulated clock alone.
    spec.retry = RetryPolicy {
        max_attempts: 4,
        max_age_ms: 10 * 60 * 1000,
        backoff_base_ms: 0,
        backoff_cap_ms: 0,
    };
    spec
}

/// A message in flight.
#[derive(Clone, Debug)]
enum Message {
    /// Facts `from` released with sequence numbers in `(after, upto]`: all of them when
    /// `contiguous`, else a later window of them.
    Batch {
        from: usize,
        to: usize,
        after: i64,
        upto: i64,
        contiguous: bool,
        facts: Vec<Vec<u8>>,
    },
    /// `from` asks `to` for these hashes.
    Fetch {
        from: usize,
        to: usize,
        hashes: Vec<FactHash>,
    },
    /// The answer to a fetch.
    Fetched {
        from: usize,
        to: usize,
        facts: Vec<Vec<u8>>,
    },
}

impl Message {
    fn ends(&self) -> (usize, usize) {
        match self {
            Message::Batch { from, to, .. }
            | Message::Fetch { from, to, .. }
            | Message::Fetched { from, to, .. } => (*from, *to),
        }
    }
}

struct Node {
    path: PathBuf,
    store: Store,
    leases: Vec<Lease>,
}

/// One node's database served over HTTP, and a remote worker claiming from it.
struct Hub {
    node: usize,
    // Dropped before the server, whose graceful stop waits for its connections.
    queue: RemoteQueue,
    server: Running,
    leases: Vec<RemoteLease>,
}

/// A server for the database at `path` on the simulation's clock, and a client of its queue.
fn serve(path: &PathBuf, clock: &Arc<ManualClock>) -> (Running, RemoteQueue) {
    let mut config = ServerConfig::new(path);
    config.store_options = options(clock);
    config.listen = "127.0.0.1:0".parse().unwrap();
    let server = Running::start(config).unwrap();
    let client = ClientOptions {
        timeout: Duration::from_secs(30),
        ..ClientOptions::default()
    };
    let queue = RemoteQueue::new(&server.url(), QUEUE, client).unwrap();
    (server, queue)
}

struct Sim {
    seed: u64,
    rng: SmallRng,
    clock: Arc<ManualClock>,
    nodes: Vec<Node>,
    hub: Option<Hub>,
    net: Vec<Message>,
    /// The side of the partition each node is on; all zero when healed.
    side: Vec<u8>,
    /// Every fact whose insert (or completion) returned Ok somewhere.
    acked: BTreeSet<FactHash>,
    /// Shops and orders written so far, to name as predecessors.
    shops: Vec<FactHash>,
    orders: Vec<FactHash>,
    /// `(node, input)`: inputs an operator redrove on a node.
    redriven: BTreeSet<(usize, FactHash)>,
    /// How often each of the queue actions took effect, for the summary.
    counts: BTreeMap<&'static str, u64>,
    next: i64,
    log: Vec<String>,
}

fn options(clock: &Arc<ManualClock>) -> StoreOptions {
    StoreOptions {
        clock: clock.clone(),
        durability: Durability::Normal,
        ..StoreOptions::default()
    }
}

fn open(path: &PathBuf, clock: &Arc<ManualClock>) -> Store {
    Store::open_with(path, options(clock)).unwrap()
}

fn decode(facts: &[Vec<u8>]) -> Vec<Fact> {
    facts
        .iter()
        .map(|b| Fact::from_canonical(b).expect("a stored fact decodes"))
        .collect()
}

impl Sim {
    /// A simulation of `nodes` nodes on the first of `dbs`, emptied first.
    fn new(seed: u64, nodes: usize, dbs: &[TestDb]) -> Sim {
        let clock = ManualClock::starting_at(T0);
        let nodes = dbs[..nodes]
            .iter()
            .map(|db| {
                db.reset();
                let path = db.location.clone();
                let store = open(&path, &clock);
                store.declare_queue(&queue_spec()).unwrap();
                Node {
                    path,
                    store,
                    leases: Vec::new(),
                }
            })
            .collect::<Vec<_>>();
        let n = nodes.len();
        let mut rng = SmallRng::seed_from_u64(seed);
        let hub = rng.random_range(0..n);
        let (server, queue) = serve(&nodes[hub].path, &clock);
        Sim {
            seed,
            rng,
            clock,
            nodes,
            hub: Some(Hub {
                node: hub,
                queue,
                server,
                leases: Vec::new(),
            }),
            net: Vec::new(),
            side: vec![0; n],
            acked: BTreeSet::new(),
            shops: Vec::new(),
            orders: Vec::new(),
            redriven: BTreeSet::new(),
            counts: BTreeMap::new(),
            next: 0,
            log: Vec::new(),
        }
    }

    fn note(&mut self, s: String) {
        self.log.push(s);
    }

    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    fn pick(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n)
    }

    fn connected(&self, a: usize, b: usize) -> bool {
        self.side[a] == self.side[b]
    }

    /// Predecessor candidates `node` has released, at most `want` of them.
    fn known(&mut self, node: usize, pool: &[FactHash], want: usize) -> Vec<FactHash> {
        let mut out = Vec::new();
        for _ in 0..want * 4 {
            if pool.is_empty() || out.len() >= want {
                break;
            }
            let h = pool[self.rng.random_range(0..pool.len())];
            if !out.contains(&h) && self.nodes[node].store.seq_of(&h).unwrap().is_some() {
                out.push(h);
            }
        }
        out
    }

    fn write(&mut self, node: usize) {
        let count = self.rng.random_range(1..=3);
        let mut facts = Vec::new();
        for _ in 0..count {
            self.next += 1;
            let n = self.next;
            let kind = self.rng.random_range(0..10);
            let shops = self.shops.clone();
            let orders = self.orders.clone();
            let shop = self.known(node, &shops, 1);
            let fact = if shop.is_empty() || kind == 0 {
                let f = Fact::builder(SHOP)
                    .field("node", node as i64)
                    .field("n", n)
                    .build()
                    .unwrap();
                self.shops.push(f.hash());
                f
            } else if kind < 7 || orders.is_empty() {
                let want = self.rng.random_range(0..=2);
                let mut b = Fact::builder(ORDER)
                    .field("node", node as i64)
                    .field("n", n)
                    .predecessor("shop", shop[0]);
                for o in self.known(node, &orders, want) {
                    b = b.predecessor("after", o);
                }
                let f = b.build().unwrap();
                self.orders.push(f.hash());
                f
            } else {
                let want = self.rng.random_range(1..=2);
                let named = self.known(node, &orders, want);
                if named.is_empty() {
                    continue;
                }
                let mut b = Fact::builder(SHIPMENT)
                    .field("node", node as i64)
                    .field("n", n);
                for o in named {
                    b = b.predecessor("order", o);
                }
                b.build().unwrap()
            };
            facts.push(fact);
        }
        let hashes: Vec<FactHash> = facts.iter().map(Fact::hash).collect();
        let result = if facts.len() == 1 && self.rng.random_bool(0.5) {
            self.nodes[node].store.insert(&facts[0]).map(|_| ())
        } else {
            self.nodes[node].store.insert_batch(facts).map(|_| ())
        };
        result.unwrap_or_else(|e| panic!("write on node {node}: {e}"));
        self.note(format!("node {node} wrote {}", hashes.len()));
        self.acked.extend(hashes);
    }

    fn claim(&mut self, node: usize) {
        let n = self.rng.random_range(1..=3);
        let leases = self.nodes[node].store.claim(QUEUE, n).unwrap();
        self.note(format!("node {node} claimed {}", leases.len()));
        self.nodes[node].leases.extend(leases);
    }

    fn take_lease(&mut self, node: usize) -> Option<Lease> {
        let leases = &self.nodes[node].leases;
        if leases.is_empty() {
            return None;
        }
        let i = self.rng.random_range(0..leases.len());
        Some(self.nodes[node].leases.swap_remove(i))
    }

    fn complete(&mut self, node: usize) {
        if let Some(lease) = self.take_lease(node) {
            self.complete_lease(node, &lease);
        }
    }

    fn complete_lease(&mut self, node: usize, lease: &Lease) {
        let input = lease.input.hash();
        let handled = lease
            .completion()
            .field("node", node as i64)
            .field("attempt", i64::from(lease.attempt))
            .build()
            .unwrap();
        let effect = Fact::builder(EFFECT)
            .field("node", node as i64)
            .field("attempt", i64::from(lease.attempt))
            .predecessor("order", input)
            .build()
            .unwrap();
        let written = [handled.hash(), effect.hash()];
        let result = self.nodes[node].store.complete(lease, |w| {
            w.insert(&handled)?;
            w.insert(&effect)?;
            Ok(())
        });
        match result {
            Ok(()) => {
                self.count("completed");
                self.note(format!("node {node} completed attempt {}", lease.attempt));
                self.acked.extend(written);
            }
            Err(Error::LeaseLost { .. }) => self.note(format!("node {node} lost a lease")),
            Err(e) => panic!("complete on node {node}: {e}"),
        }
    }

    fn fail(&mut self, node: usize) {
        let Some(lease) = self.take_lease(node) else {
            return;
        };
        let failure = match self.rng.random_range(0..10) {
            0 => Failure::Permanent("simulated".into()),
            1 => Failure::Poison("simulated".into()),
            _ => Failure::Transient("simulated".into()),
        };
        match self.nodes[node].store.fail(&lease, failure) {
            Ok(outcome) => {
                if matches!(
                    outcome,
                    FailOutcome::DeadLettered(_) | FailOutcome::Poisoned(_)
                ) {
                    self.count("dead-lettered or poisoned");
                }
                self.note(format!("node {node} failed: {outcome:?}"));
            }
            Err(Error::LeaseLost { .. }) => self.note(format!("node {node} lost a lease")),
            Err(e) => panic!("fail on node {node}: {e}"),
        }
    }

    /// The dead-lettered and poison inputs of `node`'s queue, at most `limit` of each.
    fn dead(&self, node: usize, limit: usize) -> Vec<FactHash> {
        let store = &self.nodes[node].store;
        let mut out = Vec::new();
        for state in [ItemState::Dead, ItemState::Poison] {
            let items = store.queue_items(QUEUE, Some(state), limit).unwrap();
            out.extend(items.into_iter().map(|i| i.input));
        }
        out
    }

    /// An operator sends a dead-lettered or poison input back to the queue.
    fn redrive(&mut self, node: usize) {
        let dead = self.dead(node, 5);
        if dead.is_empty() {
            return;
        }
        let input = dead[self.pick(dead.len())];
        self.redrive_input(node, input);
    }

    fn redrive_input(&mut self, node: usize, input: FactHash) {
        let fact = self.nodes[node]
            .store
            .redrive(QUEUE, &input)
            .unwrap_or_else(|e| panic!("redrive on node {node}: {e}"));
        self.count("redriven");
        self.note(format!("node {node} redrove {input}"));
        self.acked.insert(fact);
        self.redriven.insert((node, input));
    }

    fn remote_claim(&mut self) {
        let n = self.rng.random_range(1..=3);
        let hub = self.hub.as_mut().unwrap();
        let leases = hub
            .queue
            .claim(n, Duration::ZERO)
            .unwrap_or_else(|e| panic!("remote claim on node {}: {e}", hub.node));
        let node = hub.node;
        let got = leases.len();
        hub.leases.extend(leases);
        self.note(format!("remote worker claimed {got} on node {node}"));
    }

    fn take_remote(&mut self) -> Option<RemoteLease> {
        let n = self.hub.as_ref().unwrap().leases.len();
        if n == 0 {
            return None;
        }
        let i = self.pick(n);
        Some(self.hub.as_mut().unwrap().leases.swap_remove(i))
    }

    /// One lease result: whether it took effect; a refusal other than a lost lease fails.
    fn remote_result(
        &mut self,
        what: &str,
        results: Vec<precedent::sync::queue_wire::LeaseResult>,
    ) -> bool {
        assert_eq!(results.len(), 1, "remote {what}: {results:?}");
        let r = &results[0];
        if !r.ok {
            assert_eq!(
                r.error.as_deref(),
                Some("lease_lost"),
                "remote {what}: {r:?}"
            );
            self.note(format!("remote worker lost a lease ({what})"));
        }
        r.ok
    }

    fn remote_complete(&mut self) {
        let Some(lease) = self.take_remote() else {
            return;
        };
        let node = self.hub.as_ref().unwrap().node;
        let input = lease.input.hash();
        let handled = lease
            .completion()
            .field("node", node as i64)
            .field("attempt", i64::from(lease.attempt))
            .field("remote", true)
            .build()
            .unwrap();
        let effect = Fact::builder(EFFECT)
            .field("node", node as i64)
            .field("attempt", i64::from(lease.attempt))
            .field("remote", true)
            .predecessor("order", input)
            .build()
            .unwrap();
        let written = [handled.hash(), effect.hash()];
        let results = (self.hub.as_ref().unwrap().queue)
            .complete(&[(lease.id.as_str(), vec![handled, effect])])
            .unwrap_or_else(|e| panic!("remote complete on node {node}: {e}"));
        if self.remote_result("complete", results) {
            self.count("completed remotely");
            self.note(format!("remote worker completed attempt {}", lease.attempt));
            self.acked.extend(written);
        }
    }

    fn remote_fail(&mut self) {
        let Some(lease) = self.take_remote() else {
            return;
        };
        let permanent = self.rng.random_bool(0.2);
        let queue = &self.hub.as_ref().unwrap().queue;
        let results = queue
            .fail(&[(lease.id.as_str(), "simulated")], permanent)
            .unwrap_or_else(|e| panic!("remote fail: {e}"));
        if self.remote_result("fail", results) {
            self.count("failed remotely");
            self.note(format!("remote worker failed (permanent: {permanent})"));
        }
    }

    fn remote_extend(&mut self) {
        let Some(mut lease) = self.take_remote() else {
            return;
        };
        let queue = &self.hub.as_ref().unwrap().queue;
        let results = queue
            .extend(&[lease.id.as_str()])
            .unwrap_or_else(|e| panic!("remote extend: {e}"));
        let expires = results.first().and_then(|r| r.expires_at_ms);
        if self.remote_result("extend", results) {
            lease.expires_at_ms = expires.expect("an extended lease's end");
            self.hub.as_mut().unwrap().leases.push(lease);
            self.count("extended remotely");
            self.note("remote worker extended a lease".into());
        }
    }

    fn remote_crash(&mut self) {
        if self.take_remote().is_some() {
            self.note("remote worker crashed".into());
        }
    }

    fn crash_worker(&mut self, node: usize) {
        if let Some(lease) = self.take_lease(node) {
            drop(lease);
            self.note(format!("node {node} worker crashed"));
        }
    }

    fn pull_bookmark(&self, node: usize, from: usize) -> i64 {
        self.nodes[node]
            .store
            .peer(&peer_url(from))
            .unwrap()
            .map_or(0, |p| p.pull_after)
    }

    /// The batch `from` would send `to`: facts after `to`'s bookmark, at most `limit`;
    /// when `skip` > 0, the window starts that many facts later (not contiguous).
    fn batch(&self, from: usize, to: usize, limit: usize, skip: usize) -> Option<Message> {
        let after = self.pull_bookmark(to, from);
        let mut facts = Vec::new();
        let mut upto = after;
        let mut seen = 0;
        self.nodes[from]
            .store
            .for_each_released(after, |seq, _, bytes| {
                seen += 1;
                if seen > skip && facts.len() < limit {
                    facts.push(bytes.to_vec());
                    upto = seq;
                }
                Ok(())
            })
            .unwrap();
        if facts.is_empty() {
            return None;
        }
        Some(Message::Batch {
            from,
            to,
            after,
            upto,
            contiguous: skip == 0,
            facts,
        })
    }

    fn send_batch(&mut self) {
        let n = self.nodes.len();
        let from = self.pick(n);
        let to = (from + 1 + self.pick(n - 1)) % n;
        let limit = self.rng.random_range(1..=20);
        let skip = if self.rng.random_bool(0.25) {
            self.rng.random_range(1..=10)
        } else {
            0
        };
        if let Some(m) = self.batch(from, to, limit, skip) {
            self.note(format!("send batch {from}->{to}"));
            self.net.push(m);
        }
    }

    fn send_fetch(&mut self) {
        let n = self.nodes.len();
        let from = self.pick(n);
        let to = (from + 1 + self.pick(n - 1)) % n;
        let hashes = self.nodes[from].store.absent_ancestors(50).unwrap();
        if !hashes.is_empty() {
            self.note(format!("send fetch {from}->{to} ({})", hashes.len()));
            self.net.push(Message::Fetch { from, to, hashes });
        }
    }

    /// Handles a message at its destination.
    fn handle(&mut self, m: Message) {
        match m {
            Message::Batch {
                from,
                to,
                after,
                upto,
                contiguous,
                facts,
            } => {
                let facts = decode(&facts);
                let url = peer_url(from);
                self.nodes[to]
                    .store
                    .write(|w| {
                        w.insert_batch(facts)?;
                        if contiguous {
                            let current = w.peer(&url)?.map_or(0, |p| p.pull_after);
                            if after <= current {
                                w.set_pull_bookmark(&url, upto, upto)?;
                            }
                        }
                        Ok(())
                    })
                    .unwrap_or_else(|e| panic!("batch {from}->{to}: {e}"));
            }
            Message::Fetch { from, to, hashes } => {
                let found = self.nodes[to].store.fetch_bytes(&hashes).unwrap();
                if !found.is_empty() {
                    self.net.push(Message::Fetched {
                        from: to,
                        to: from,
                        facts: found.into_iter().map(|(_, b)| b).collect(),
                    });
                }
            }
            Message::Fetched { from, to, facts } => {
                self.nodes[to]
                    .store
                    .insert_batch(decode(&facts))
                    .unwrap_or_else(|e| panic!("fetched {from}->{to}: {e}"));
            }
        }
    }

    fn deliver(&mut self) {
        if self.net.is_empty() {
            return;
        }
        // Any message in flight may be the next to arrive: reordering and delay.
        let i = self.pick(self.net.len());
        let m = if self.rng.random_bool(0.1) {
            self.net[i].clone() // duplicated: a copy stays in flight
        } else {
            self.net.swap_remove(i)
        };
        let (from, to) = m.ends();
        if self.rng.random_bool(0.1) || !self.connected(from, to) {
            self.note(format!("lost {from}->{to}"));
            return;
        }
        self.note(format!("deliver {from}->{to}"));
        self.handle(m);
    }

    fn partition(&mut self) {
        loop {
            for s in &mut self.side {
                *s = self.rng.random_range(0..2);
            }
            if self.side.iter().any(|s| *s != self.side[0]) {
                break;
            }
        }
        self.note(format!("partition {:?}", self.side));
    }

    fn heal(&mut self) {
        self.side.iter_mut().for_each(|s| *s = 0);
        self.note("heal".into());
    }

    fn restart(&mut self, node: usize) {
        let path = self.nodes[node].path.clone();
        let old = std::mem::replace(
            &mut self.nodes[node].store,
            Store::open_in_memory().unwrap(),
        );
        drop(old);
        self.nodes[node].store = open(&path, &self.clock);
        self.nodes[node].leases.clear();
        if let Some(hub) = self.hub.as_mut().filter(|h| h.node == node) {
            // The hub's server restarts too; its remote worker keeps its leases (lease
            // ids are stateless) and talks to the new server.
            let (server, queue) = serve(&path, &self.clock);
            drop(std::mem::replace(&mut hub.queue, queue));
            std::mem::replace(&mut hub.server, server).stop().unwrap();
        }
        self.net.retain(|m| m.ends().1 != node);
        self.note(format!("restart node {node}"));
    }

    fn step(&mut self) {
        let n = self.nodes.len();
        let node = self.pick(n);
        match self.rng.random_range(0..110) {
            0..20 => self.write(node),
            20..28 => self.claim(node),
            28..38 => self.complete(node),
            38..41 => self.fail(node),
            41..43 => self.crash_worker(node),
            43..49 => {
                let ms = self.rng.random_range(0..4_000);
                self.clock.advance(ms);
            }
            49..66 => self.send_batch(),
            66..71 => self.send_fetch(),
            71..95 => self.deliver(),
            95..97 => self.partition(),
            97..99 => self.heal(),
            99 => self.restart(node),
            100..102 => self.redrive(node),
            102..104 => self.remote_claim(),
            104..106 => self.remote_complete(),
            106 => self.remote_fail(),
            107 => self.remote_extend(),
            108 => self.remote_crash(),
            _ => self.clock.advance(1_000),
        }
    }

    fn state(&self) -> Vec<(i64, u64)> {
        self.nodes
            .iter()
            .map(|n| (n.store.max_seq().unwrap(), n.store.held_count().unwrap()))
            .collect()
    }

    /// Heals, stops the workers, and syncs every pair reliably until nothing changes,
    /// alternately with a drain of every queue, until a drain finds nothing to do.
    fn quiesce(&mut self) {
        self.heal();
        self.net.clear();
        for node in &mut self.nodes {
            node.leases.clear();
        }
        if let Some(hub) = self.hub.as_mut() {
            hub.leases.clear();
        }
        for _ in 0..10 {
            self.sync_all();
            if !self.drain() {
                return;
            }
        }
        panic!("queues did not drain");
    }

    /// On every node, past every lease and backoff: redrives every dead-lettered and
    /// poison input and completes everything claimable, until nothing is left. Returns
    /// whether it did anything.
    fn drain(&mut self) -> bool {
        let mut did = false;
        for node in 0..self.nodes.len() {
            for round in 0.. {
                assert!(round < 1_000, "node {node}'s queue did not drain");
                let dead = self.dead(node, 1_000);
                for &input in &dead {
                    self.redrive_input(node, input);
                }
                self.clock.advance(queue_spec().lease_ms + 1);
                let leases = self.nodes[node].store.claim(QUEUE, 100).unwrap();
                if dead.is_empty() && leases.is_empty() {
                    break;
                }
                did = true;
                for lease in &leases {
                    self.complete_lease(node, lease);
                }
            }
        }
        did
    }

    /// Syncs every pair, reliably, until nothing changes.
    fn sync_all(&mut self) {
        let n = self.nodes.len();
        let mut last = self.state();
        for _ in 0..100 {
            for from in 0..n {
                for to in 0..n {
                    if from == to {
                        continue;
                    }
                    while let Some(m) = self.batch(from, to, 50, 0) {
                        let before = self.pull_bookmark(to, from);
                        self.handle(m);
                        if self.pull_bookmark(to, from) == before {
                            break;
                        }
                    }
                    let hashes = self.nodes[to].store.absent_ancestors(500).unwrap();
                    if !hashes.is_empty() {
                        self.handle(Message::Fetch {
                            from: to,
                            to: from,
                            hashes,
                        });
                        while let Some(m) = self.net.pop() {
                            self.handle(m);
                        }
                    }
                }
            }
            let now = self.state();
            if now == last {
                return;
            }
            last = now;
        }
        panic!("sync did not quiesce: {last:?}");
    }

    fn check(&self) {
        let mut sets = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let store = &node.store;
            assert_eq!(store.held_count().unwrap(), 0, "node {i} holds facts");
            // Drained: nothing unfinished, no dead letter or poison input left behind.
            let left = store.queue_items(QUEUE, None, 10).unwrap();
            assert!(
                left.is_empty(),
                "node {i} has unfinished inputs after the drain: {:?}",
                left.iter()
                    .map(|l| (l.input, l.describe()))
                    .collect::<Vec<_>>()
            );
            let mut orders = BTreeSet::new();
            let mut handled = BTreeSet::new();
            let report = store.verify(|_| {}).unwrap();
            assert!(report.is_clean(), "node {i} verify: {report:?}");
            let mut seqs: HashMap<FactHash, i64> = HashMap::new();
            let mut effects: BTreeMap<(FactHash, i128), Vec<i128>> = BTreeMap::new();
            store
                .for_each_released(0, |seq, hash, bytes| {
                    let f = Fact::from_canonical(bytes).unwrap();
                    assert_eq!(f.hash(), hash);
                    for p in f.predecessor_hashes() {
                        assert!(
                            seqs.get(&p).is_some_and(|ps| *ps < seq),
                            "node {i}: {hash} released before its predecessor {p}"
                        );
                    }
                    if f.type_name() == ORDER {
                        orders.insert(hash);
                    }
                    if f.type_name() == HANDLED {
                        handled.extend(f.predecessor_hashes());
                    }
                    if f.type_name() == EFFECT {
                        let (Some(Value::Integer(by)), Some(Value::Integer(attempt))) =
                            (f.field("node"), f.field("attempt"))
                        else {
                            panic!("effect without node and attempt: {f:?}");
                        };
                        for input in f.predecessor_hashes() {
                            effects.entry((input, *by)).or_default().push(*attempt);
                        }
                    }
                    seqs.insert(hash, seq);
                    Ok(())
                })
                .unwrap();
            for ((input, by), attempts) in &effects {
                assert!(
                    attempts.len() == 1,
                    "node {i}: input {input} has {} effects from node {by}'s completions \
                     (attempts {attempts:?})",
                    attempts.len()
                );
            }
            for h in &self.acked {
                assert!(seqs.contains_key(h), "node {i} lost acknowledged fact {h}");
            }
            // Every input is completed, a dead letter's input included: none is lost.
            for o in &orders {
                assert!(
                    handled.contains(o),
                    "node {i}: input {o} was never completed"
                );
            }
            // A redriven input completes once in the database that redrove it.
            for (_, input) in self.redriven.iter().filter(|(n, _)| *n == i) {
                let by_here = effects.get(&(*input, i as i128)).map_or(0, Vec::len);
                assert!(
                    by_here == 1 || (by_here == 0 && handled.contains(input)),
                    "node {i}: redriven input {input} has {by_here} effects from its completions"
                );
            }
            sets.push(seqs.into_keys().collect::<BTreeSet<_>>());
        }
        for (i, set) in sets.iter().enumerate().skip(1) {
            assert!(
                *set == sets[0],
                "node {i} has {} facts, node 0 has {}; {} differ",
                set.len(),
                sets[0].len(),
                set.symmetric_difference(&sets[0]).count()
            );
        }
    }
}

/// One run; returns the number of facts every node ended with, and how often each queue
/// action took effect.
fn run(dbs: &[TestDb], seed: u64, steps: u64) -> (usize, BTreeMap<&'static str, u64>) {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5EED);
    let nodes = rng.random_range(3..=4);
    let mut sim = Sim::new(seed, nodes, dbs);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..steps {
            sim.step();
        }
        sim.quiesce();
        sim.check();
        sim.nodes[0].store.max_seq().unwrap() as usize
    }));
    let counts = std::mem::take(&mut sim.counts);
    match result {
        Ok(facts) => (facts, counts),
        Err(_) => {
            let tail = sim.log.len().saturating_sub(30);
            panic!(
                "simulation failed: seed={} ({nodes} nodes, {steps} steps); last actions:\n  {}\n\
                 replay: PRECEDENT_SIM_SEED={} cargo test --test simulation",
                sim.seed,
                sim.log[tail..].join("\n  "),
                sim.seed
            );
        }
    }
}

conformance! {
    /// The runs share one database per node, emptied before each run.
    fn nodes_converge_under_loss_partitions_and_restarts(b: Backend) {
        let dbs: Vec<TestDb> = (0..4).map(|_| b.db()).collect();
        let steps = env_u64("PRECEDENT_SIM_STEPS").unwrap_or(200);
        let seeds: Vec<u64> = match env_u64("PRECEDENT_SIM_SEED") {
            Some(seed) => vec![seed],
            None => {
                let first = env_u64("PRECEDENT_SIM_FIRST").unwrap_or(1);
                let count = env_u64("PRECEDENT_SIM_SEEDS").unwrap_or(20);
                (first..first + count).collect()
            }
        };
        let mut facts = 0;
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        for &seed in &seeds {
            let (f, c) = run(&dbs, seed, steps);
            facts += f;
            for (k, v) in c {
                *counts.entry(k).or_default() += v;
            }
        }
        eprintln!(
            "simulation: {} seeds of {steps} steps, {facts} facts converged; {counts:?}",
            seeds.len()
        );
        assert!(facts > 0);
        // The queue actions the checks are about happened (every seed, drains included).
        for what in ["completed", "completed remotely", "redriven", "dead-lettered or poisoned"] {
            assert!(counts.get(what).is_some_and(|n| *n > 0), "nothing {what}: {counts:?}");
        }
    }
}

//! The harness of the 100-client soak of `benches/soak_clients.rs`, a module of its own so
//! that a short test can run it as well.
//!
//! One hub, `precedent serve` on 127.0.0.1 (a SQLite file, or the PostgreSQL database of
//! a `postgres://` URL), with the queue `jobs` (input `Soak.Job`, done by `Soak.Done.job`),
//! and four kinds of clients, each a thread of its own:
//! - **sync nodes**: a SQLite store each, writing two `Soak.Note` facts and then syncing
//!   both ways with the hub through the library's [`Client::sync`], every 2 s;
//! - **JSON API clients**: `POST /v1/facts` of two `Soak.Api` facts in JSON, then
//!   `POST /v1/query` for the facts of that round, which must be exactly those two;
//! - **SSE watchers**: `GET /v1/watch` of one API client's facts, each result carrying its
//!   write time, so that the delay from write to event is measured;
//! - **remote workers**: [`RemoteQueue::claim`] with a long-poll wait, then `complete` with
//!   the completion and an effect fact, or, for one input in ten on its first attempt,
//!   `fail` (transient: retried after the queue's backoff);
//!
//! and a producer pushing `Soak.Job` inputs at a steady rate. A run has two phases: a
//! floor (one client of each kind, a few seconds, on an idle hub) and the load (all the
//! clients); each ends by stopping the writers, draining the queue and checking that
//! nothing was lost (see [`Lost`]).

mod clients;
mod hub;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use precedent::sync::client::{Client, ClientOptions, SyncOptions};
use precedent::{Fact, FactHash, Store};

use crate::common;
use clients::{
    Jobs, Seen, Shared, WorkCounts, agent, api_client, api_fact, now_ms, producer, push_json,
    sync_node, watcher, worker,
};
use hub::{Hub, rss_kib, sqlite_bytes};

/// How often the hub's memory and database are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// The longest the end of a phase waits for the queue to drain and the watchers to
/// catch up.
const DRAIN: Duration = Duration::from_secs(120);
const WATCH_QUERY: &str =
    "given c: Soak.Client match a: Soak.Api where a->client = c select {h: hash(a), t: a.t_ms}";

/// What a run does.
#[derive(Clone, Debug)]
pub struct Config {
    /// Length of the load phase.
    pub seconds: u64,
    /// Length of the floor phase (one client of each kind).
    pub floor_seconds: u64,
    pub sync_nodes: usize,
    pub api_clients: usize,
    pub watchers: usize,
    pub workers: usize,
    /// Inputs per second the producer enqueues during the load phase; the floor phase
    /// enqueues this divided by the number of workers (one worker's share).
    pub job_rate: f64,
    /// A `postgres://` URL for the hub's database; `None`: a SQLite file.
    pub db_url: Option<String>,
    /// Print a line every few seconds on stderr.
    pub verbose: bool,
}

impl Config {
    /// The settings of the environment: `PRECEDENT_SOAK_SECONDS` (default `seconds`),
    /// `PRECEDENT_SOAK_FLOOR_SECONDS` (10), `PRECEDENT_SOAK_SYNC`, `_API`, `_WATCH`,
    /// `_WORKERS` (25 each), `PRECEDENT_SOAK_JOB_RATE` (40 inputs/s), `PRECEDENT_SOAK_DB`
    /// (a `postgres://` URL; SQLite otherwise).
    pub fn from_env(seconds: u64) -> Config {
        let n = |name: &str, default: u64| common::env_num(name).unwrap_or(default);
        Config {
            seconds: n("PRECEDENT_SOAK_SECONDS", seconds),
            floor_seconds: n("PRECEDENT_SOAK_FLOOR_SECONDS", 10),
            sync_nodes: n("PRECEDENT_SOAK_SYNC", 25) as usize,
            api_clients: n("PRECEDENT_SOAK_API", 25) as usize,
            watchers: n("PRECEDENT_SOAK_WATCH", 25) as usize,
            workers: n("PRECEDENT_SOAK_WORKERS", 25) as usize,
            job_rate: n("PRECEDENT_SOAK_JOB_RATE", 40) as f64,
            db_url: std::env::var("PRECEDENT_SOAK_DB")
                .ok()
                .filter(|u| !u.is_empty()),
            verbose: true,
        }
    }

    pub fn clients(&self) -> usize {
        self.sync_nodes + self.api_clients + self.watchers + self.workers
    }
}

/// The requests whose latency is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// One `Client::sync` round of a node (pull, push, pull what the push released).
    Sync,
    /// `POST /v1/facts` of two facts in JSON.
    Push,
    /// `POST /v1/query` of one round's facts.
    Query,
    /// Write of a watched fact (before its push) to its event on a watcher.
    Watch,
    /// `claim` of up to 8 inputs without waiting (a worker that finds none then waits
    /// in a long-poll claim of 1 s, not timed).
    Claim,
    /// `complete` of the inputs a claim got.
    Complete,
    /// `fail` of the inputs a claim got that fail.
    Fail,
    /// Enqueue of an input (its push) to its completion.
    Job,
}

pub const OPS: [Op; 8] = [
    Op::Sync,
    Op::Push,
    Op::Query,
    Op::Watch,
    Op::Claim,
    Op::Complete,
    Op::Fail,
    Op::Job,
];

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Sync => "sync node: sync round",
            Op::Push => "JSON API: POST /v1/facts",
            Op::Query => "JSON API: POST /v1/query",
            Op::Watch => "SSE watcher: write to event",
            Op::Claim => "remote worker: claim (no wait)",
            Op::Complete => "remote worker: complete",
            Op::Fail => "remote worker: fail",
            Op::Job => "input: enqueue to completion",
        }
    }
}

/// Latencies of one kind of request, in microseconds, sorted.
#[derive(Clone, Debug, Default)]
pub struct Latencies(pub Vec<u64>);

impl Latencies {
    pub fn pct(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        self.0[((self.0.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
    }
    pub fn max(&self) -> f64 {
        self.0.last().map_or(f64::NAN, |&v| v as f64 / 1000.0)
    }
}

/// What a phase lost or got wrong; all zero in a good run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lost {
    /// Facts acknowledged to a JSON API client, a sync node or the producer that are not
    /// released on the hub at the end.
    pub facts: u64,
    /// `POST /v1/query` answers for a round that were not exactly that round's facts.
    pub queries: u64,
    /// Sync nodes whose released facts differ from the hub's after a final sync.
    pub nodes_diverged: u64,
    /// Watched results missing from a watcher at the end (in its last connection).
    pub watch_missing: u64,
    /// Results a watcher received twice in one connection, or that do not belong.
    pub watch_extra: u64,
    /// Inputs with no completion, or with no effect.
    pub jobs_lost: u64,
    /// Inputs with more than one completion or effect.
    pub jobs_doubled: u64,
}

impl Lost {
    pub fn total(&self) -> u64 {
        self.facts
            + self.queries
            + self.nodes_diverged
            + self.watch_missing
            + self.watch_extra
            + self.jobs_lost
            + self.jobs_doubled
    }
}

/// One phase's figures.
#[derive(Clone, Debug, Default)]
pub struct Phase {
    pub seconds: f64,
    pub latencies: Vec<(Op, Latencies)>,
    pub api_facts: u64,
    pub node_facts: u64,
    pub syncs: u64,
    pub queries: u64,
    pub events: u64,
    pub jobs: u64,
    pub completed: u64,
    pub failed: u64,
    /// Completions refused because the lease was lost (the input is offered again).
    pub lease_lost: u64,
    /// Inputs stored on the hub whose push the producer saw fail (a timeout): allowed,
    /// and worked like the others.
    pub recovered: u64,
    pub watch_reconnects: u64,
    /// Requests that failed (transport or server errors), with the first few messages.
    pub errors: u64,
    pub error_samples: Vec<String>,
    /// Facts released on the hub at the end of the phase.
    pub hub_facts: u64,
    pub hub_held: u64,
    pub drain_seconds: f64,
    pub lost: Lost,
    /// Hub memory samples: seconds since the phase began, RSS in KiB, and the bytes SQLite
    /// holds in it (`precedent_sqlite_memory_bytes` of `/metrics`); database sizes (bytes).
    pub rss: Vec<(f64, u64, u64)>,
    pub db_bytes: Vec<u64>,
}

impl Phase {
    pub fn latency(&self, op: Op) -> &Latencies {
        &self.latencies.iter().find(|(o, _)| *o == op).unwrap().1
    }
}

/// A whole run: the floor phase, then the load phase.
pub struct Report {
    pub backend: &'static str,
    pub floor: Phase,
    pub load: Phase,
    pub load_average: (f64, f64),
}

impl Report {
    pub fn lost(&self) -> u64 {
        self.floor.lost.total() + self.load.lost.total()
    }
}

struct Counts {
    sync: usize,
    api: usize,
    watch: usize,
    workers: usize,
    job_rate: f64,
}

/// Runs one phase against the hub for `seconds`, then stops the writers, drains the queue,
/// syncs every node once more and checks that nothing was lost.
fn phase(hub: &Hub, dir: &Path, name: &str, counts: Counts, seconds: u64, verbose: bool) -> Phase {
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let shared = Arc::new(Shared {
        url: hub.url.clone(),
        stop: AtomicBool::new(false),
        lat: OPS.iter().map(|_| Mutex::new(Vec::new())).collect(),
        errors: AtomicU64::new(0),
        error_samples: Mutex::new(Vec::new()),
    });
    // The run's root and one fact per API client, each with a first fact of its own, so
    // that the watchers' query names stored roles and fields from the start.
    let run = Fact::builder("Soak.Run")
        .field("phase", name)
        .field("started_ms", now_ms())
        .build()
        .unwrap();
    let api_roots: Vec<Fact> = (0..counts.api.max(1))
        .map(|i| {
            Fact::builder("Soak.Client")
                .field("i", i as i64)
                .predecessor("run", run.hash())
                .build()
                .unwrap()
        })
        .collect();
    let seeds: Vec<Fact> = api_roots
        .iter()
        .enumerate()
        .map(|(i, c)| api_fact(run.hash(), c.hash(), i, 0, 0))
        .collect();
    let acked: Vec<Arc<Mutex<Vec<FactHash>>>> = seeds
        .iter()
        .map(|s| Arc::new(Mutex::new(vec![s.hash()])))
        .collect();
    let agent = agent();
    let mut setup = vec![run.clone()];
    setup.extend(api_roots.iter().cloned());
    setup.extend(seeds.iter().cloned());
    push_json(&agent, &hub.url, &setup).unwrap();

    let watch_done = Arc::new(AtomicBool::new(false));
    let watchers: Vec<(usize, Arc<Mutex<Seen>>, JoinHandle<()>)> = (0..counts.watch)
        .map(|i| {
            let c = i % api_roots.len();
            let seen = Arc::new(Mutex::new(Seen::default()));
            let (shared, s, d, h) = (
                shared.clone(),
                seen.clone(),
                watch_done.clone(),
                api_roots[c].hash(),
            );
            (
                c,
                seen,
                std::thread::spawn(move || watcher(shared, h, s, d)),
            )
        })
        .collect();
    let nodes: Vec<JoinHandle<(Store, [u64; 2])>> = (0..counts.sync)
        .map(|i| {
            let (shared, dir, n, r) = (shared.clone(), dir.clone(), counts.sync, run.hash());
            std::thread::spawn(move || sync_node(shared, dir, i, n, r))
        })
        .collect();
    let apis: Vec<JoinHandle<(u64, u64)>> = (0..counts.api)
        .map(|i| {
            let (shared, n, r, me, a) = (
                shared.clone(),
                counts.api,
                run.hash(),
                api_roots[i].hash(),
                acked[i].clone(),
            );
            std::thread::spawn(move || api_client(shared, i, n, r, me, a))
        })
        .collect();
    let jobs: Jobs = Arc::default();
    let work = Arc::new(Mutex::new(WorkCounts::default()));
    let work_done = Arc::new(AtomicBool::new(false));
    let workers: Vec<JoinHandle<()>> = (0..counts.workers)
        .map(|w| {
            let (shared, c, j, d) = (
                shared.clone(),
                work.clone(),
                jobs.clone(),
                work_done.clone(),
            );
            std::thread::spawn(move || worker(shared, w, c, j, d))
        })
        .collect();
    let producer = {
        let (shared, r, rate, j) = (shared.clone(), run.hash(), counts.job_rate, jobs.clone());
        std::thread::spawn(move || producer(shared, r, rate, j))
    };

    // The phase runs; the hub is sampled.
    let started = Instant::now();
    let pid = hub.server.id();
    let (mut rss, mut db_bytes) = (Vec::new(), Vec::new());
    loop {
        let el = started.elapsed();
        rss.push((
            el.as_secs_f64(),
            rss_kib(pid),
            sqlite_bytes(&agent, &hub.url),
        ));
        db_bytes.push(hub.db_bytes());
        if verbose {
            eprintln!(
                "  {name} {:>4.0} s: hub RSS {:.1} MiB, jobs {} completed {}, errors {}",
                el.as_secs_f64(),
                rss.last().unwrap().1 as f64 / 1024.0,
                jobs.lock().unwrap().len(),
                work.lock().unwrap().completed.len(),
                shared.errors.load(Ordering::Relaxed)
            );
        }
        if el >= Duration::from_secs(seconds) {
            break;
        }
        std::thread::sleep(SAMPLE_EVERY.min(Duration::from_secs(seconds) - el));
    }
    let elapsed = started.elapsed().as_secs_f64();
    shared.stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    let mut queries = 0;
    let mut lost = Lost::default();
    for a in apis {
        let (q, wrong) = a.join().unwrap();
        queries += q;
        lost.queries += wrong;
    }
    let (stores, mut written): (Vec<Store>, Vec<[u64; 2]>) =
        nodes.into_iter().map(|n| n.join().unwrap()).unzip();

    // Drain: the workers go on until every input enqueued is completed.
    // Every input of this phase on the hub: the acknowledged ones, and those whose push
    // was stored though its answer was lost (a timeout), which are worked all the same.
    let drain = Instant::now();
    let hub_store = hub.open();
    let of_run = |type_name: &str| -> Vec<Fact> {
        let mut facts = hub_store.facts_of_type(type_name).unwrap();
        facts.retain(|f| f.predecessor_hashes().contains(&run.hash()));
        facts
    };
    let ours: HashSet<FactHash> = of_run("Soak.Job").iter().map(Fact::hash).collect();
    let mut want = ours.clone();
    want.extend(jobs.lock().unwrap().keys().copied());
    while drain.elapsed() < DRAIN
        && !want.is_subset(&work.lock().unwrap().completed)
        && counts.workers > 0
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    work_done.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    // Every node syncs once more, now that nothing is written.
    let both = SyncOptions::default();
    for (i, store) in stores.iter().enumerate() {
        let client = Client::new(&hub.url, ClientOptions::default()).unwrap();
        match client.sync(store, &both, &mut |_| {}) {
            Ok(_) => written[i][0] = written[i][1],
            Err(e) => shared.error("final sync", e),
        }
    }

    let hub_set = released_set(&hub_store);
    // Watchers: each must hold, in its last connection, every fact of its API client on
    // the hub (acknowledged or not), once.
    let api_on_hub = of_run("Soak.Api");
    let expected: Vec<HashSet<String>> = api_roots
        .iter()
        .map(|c| {
            let of_c = api_on_hub
                .iter()
                .filter(|f| f.predecessor_hashes().contains(&c.hash()));
            of_c.map(|f| f.hash().to_string()).collect()
        })
        .collect();
    let caught_up = |c: usize, s: &Arc<Mutex<Seen>>| s.lock().unwrap().results == expected[c];
    while drain.elapsed() < DRAIN && !watchers.iter().all(|(c, s, _)| caught_up(*c, s)) {
        std::thread::sleep(Duration::from_millis(100));
    }
    // A moment more, for anything sent twice.
    std::thread::sleep(Duration::from_millis(500));
    watch_done.store(true, Ordering::Relaxed);
    let (mut events, mut reconnects) = (0, 0);
    for (c, seen, handle) in watchers {
        handle.join().unwrap();
        let s = seen.lock().unwrap();
        lost.watch_missing += expected[c].difference(&s.results).count() as u64;
        lost.watch_extra += s.extra + s.results.difference(&expected[c]).count() as u64;
        events += s.events;
        reconnects += s.reconnects;
    }
    let drain_seconds = drain.elapsed().as_secs_f64();

    // Facts acknowledged to API clients and the producer are on the hub.
    let api_facts: u64 = acked.iter().map(|a| a.lock().unwrap().len() as u64).sum();
    for a in &acked {
        lost.facts += a
            .lock()
            .unwrap()
            .iter()
            .filter(|h| !hub_set.contains(*h))
            .count() as u64;
    }
    let jobs = jobs.lock().unwrap();
    lost.facts += jobs.keys().filter(|h| !hub_set.contains(*h)).count() as u64;
    // Every note a node pushed in a sync that succeeded reached the hub, and the nodes
    // hold what the hub holds.
    let notes: HashSet<(i64, i64)> = of_run("Soak.Note")
        .iter()
        .map(|f| {
            let j = precedent::json::to_json(f);
            let n = |k: &str| j["fields"][k].as_i64().unwrap_or(-1);
            (n("node"), n("k"))
        })
        .collect();
    let node_facts = notes.len() as u64;
    for (i, &[w, _]) in written.iter().enumerate() {
        lost.facts += (1..=w as i64)
            .filter(|k| !notes.contains(&(i as i64, *k)))
            .count() as u64;
    }
    for store in &stores {
        let set = released_set(store);
        if set != hub_set {
            lost.nodes_diverged += 1;
        }
    }
    // Every input completed once, with one effect.
    let by_job = |type_name: &str| -> HashMap<FactHash, u64> {
        let mut m = HashMap::new();
        for f in hub_store.facts_of_type(type_name).unwrap() {
            for p in f.predecessor_hashes() {
                *m.entry(p).or_insert(0) += 1;
            }
        }
        m
    };
    let (done, effects) = (by_job("Soak.Done"), by_job("Soak.Effect"));
    for job in &want {
        for m in [&done, &effects] {
            match m.get(job).copied().unwrap_or(0) {
                0 => lost.jobs_lost += 1,
                1 => {}
                _ => lost.jobs_doubled += 1,
            }
        }
    }
    // Inputs acknowledged that are not on the hub are lost facts, counted above; inputs
    // stored without an acknowledgement are recovered.
    let recovered = ours.iter().filter(|j| !jobs.contains_key(*j)).count() as u64;
    let work = work.lock().unwrap();
    let latencies = OPS
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let mut v = std::mem::take(&mut *shared.lat[i].lock().unwrap());
            v.sort_unstable();
            (*op, Latencies(v))
        })
        .collect::<Vec<_>>();
    Phase {
        seconds: elapsed,
        syncs: latencies[0].1.0.len() as u64,
        latencies,
        api_facts,
        node_facts,
        queries,
        events,
        jobs: jobs.len() as u64,
        completed: work.completed.len() as u64,
        failed: work.failed,
        lease_lost: work.lease_lost,
        recovered,
        watch_reconnects: reconnects,
        errors: shared.errors.load(Ordering::Relaxed),
        error_samples: shared.error_samples.lock().unwrap().clone(),
        hub_facts: hub_set.len() as u64,
        hub_held: hub_store.held_count().unwrap(),
        drain_seconds,
        lost,
        rss,
        db_bytes,
    }
}

/// A whole run: the floor phase (one client of each kind), then the load phase.
pub fn run(config: &Config) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let hub = Hub::start(dir.path(), config);
    let load0 = common::load_average();
    if config.verbose {
        eprintln!(
            "soak_clients: hub {} on {}, floor {} s, then {} clients for {} s",
            hub.url,
            if hub.sqlite { "SQLite" } else { "PostgreSQL" },
            config.floor_seconds,
            config.clients(),
            config.seconds
        );
    }
    let one = |n: usize| n.min(1);
    let floor = phase(
        &hub,
        dir.path(),
        "floor",
        Counts {
            sync: one(config.sync_nodes),
            api: one(config.api_clients),
            watch: one(config.watchers),
            workers: one(config.workers),
            job_rate: config.job_rate / config.workers.max(1) as f64,
        },
        config.floor_seconds,
        config.verbose,
    );
    let load = phase(
        &hub,
        dir.path(),
        "load",
        Counts {
            sync: config.sync_nodes,
            api: config.api_clients,
            watch: config.watchers,
            workers: config.workers,
            job_rate: config.job_rate,
        },
        config.seconds,
        config.verbose,
    );
    let load1 = common::load_average();
    let report = Report {
        backend: if hub.sqlite { "SQLite" } else { "PostgreSQL" },
        floor,
        load,
        load_average: (load0, load1),
    };
    drop(hub);
    report
}

/// The hub's memory over a phase, in MiB: before the clients start, then the first sample
/// under load (5 s in), the middle one, the last one and the highest, and the slope of a
/// least-squares line over the second half of the samples under load (MiB per minute);
/// for its RSS and for its RSS without what SQLite holds (page caches, statements).
pub struct Memory {
    pub idle: f64,
    pub first: f64,
    pub mid: f64,
    pub last: f64,
    pub max: f64,
    pub slope: f64,
}

pub fn memory(phase: &Phase, without_sqlite: bool) -> Memory {
    let mib = |p: &(f64, u64, u64)| {
        let sqlite = if without_sqlite { p.2 / 1024 } else { 0 };
        p.1.saturating_sub(sqlite) as f64 / 1024.0
    };
    let r = &phase.rss[1.min(phase.rss.len() - 1)..];
    let half = &r[r.len() / 2..];
    let n = half.len() as f64;
    let (mx, my) = (
        half.iter().map(|p| p.0).sum::<f64>() / n,
        half.iter().map(mib).sum::<f64>() / n,
    );
    let cov: f64 = half.iter().map(|p| (p.0 - mx) * (mib(p) - my)).sum();
    let var: f64 = half.iter().map(|p| (p.0 - mx).powi(2)).sum();
    Memory {
        idle: mib(&phase.rss[0]),
        first: mib(&r[0]),
        mid: mib(&r[r.len() / 2]),
        last: mib(r.last().unwrap()),
        max: r.iter().map(mib).fold(0.0, f64::max),
        slope: if var > 0.0 { cov / var * 60.0 } else { 0.0 },
    }
}

/// The hashes of every fact released in `store`.
fn released_set(store: &Store) -> HashSet<FactHash> {
    let mut set = HashSet::new();
    store
        .for_each_released(0, |_, h, _| {
            set.insert(h);
            Ok(())
        })
        .unwrap();
    set
}

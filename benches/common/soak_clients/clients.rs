//! The clients of the soak, each a thread: sync nodes, JSON API clients, SSE watchers,
//! remote workers, and the producer of the queue's inputs.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use precedent::sync::client::{Client, ClientOptions, RemoteLease, RemoteQueue, SyncOptions};
use precedent::{Fact, FactHash, Store};

use super::{OPS, Op, WATCH_QUERY};

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// What the clients of a phase share.
pub struct Shared {
    pub url: String,
    pub stop: AtomicBool,
    pub lat: Vec<Mutex<Vec<u64>>>,
    pub errors: AtomicU64,
    pub error_samples: Mutex<Vec<String>>,
}

impl Shared {
    pub fn record(&self, op: Op, since: Instant) {
        self.record_us(op, since.elapsed().as_micros() as u64);
    }
    pub fn record_us(&self, op: Op, us: u64) {
        let i = OPS.iter().position(|o| *o == op).unwrap();
        self.lat[i].lock().unwrap().push(us);
    }
    pub fn error(&self, what: &str, e: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.sample(what, e);
    }
    /// Keeps the first few messages, for the report.
    pub fn sample(&self, what: &str, e: impl std::fmt::Display) {
        let mut s = self.error_samples.lock().unwrap();
        if s.len() < 5 {
            s.push(format!("{what}: {e}"));
        }
    }
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .new_agent()
}

/// Pushes facts in one JSON body; `Ok` when every one is released on the hub.
pub fn push_json(agent: &ureq::Agent, url: &str, facts: &[Fact]) -> Result<(), String> {
    let body: Vec<String> = facts
        .iter()
        .map(|f| precedent::json::to_json(f).to_string())
        .collect();
    let mut resp = agent
        .post(format!("{url}/v1/facts"))
        .header("content-type", "application/json")
        .send(format!("[{}]", body.join(",")))
        .map_err(|e| e.to_string())?;
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    let report: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let n = |k: &str| report[k].as_u64().unwrap_or(u64::MAX);
    let empty = |k: &str| report[k].as_array().is_some_and(|a| a.is_empty());
    if n("inserted") + n("duplicates") == facts.len() as u64
        && n("held") == 0
        && empty("rejected")
        && empty("refused")
    {
        Ok(())
    } else {
        Err(format!("push report {text}"))
    }
}

/// Sleeps until `next` (or until the phase stops), then moves `next` on by `every`.
pub fn pace(shared: &Shared, next: &mut Instant, every: Duration) {
    while !shared.stopped() {
        let now = Instant::now();
        if now >= *next {
            break;
        }
        std::thread::sleep((*next - now).min(Duration::from_millis(100)));
    }
    *next += every;
    if *next < Instant::now() {
        *next = Instant::now();
    }
}

/// A first delay in `[0, every)`, so that the clients of a kind do not move in step.
pub fn offset(i: usize, n: usize, every: Duration) -> Instant {
    Instant::now() + every.mul_f64(i as f64 / n.max(1) as f64)
}

pub const SYNC_EVERY: Duration = Duration::from_secs(2);
pub const API_EVERY: Duration = Duration::from_secs(1);

/// A sync node: writes two notes, syncs, every [`SYNC_EVERY`]; after the phase stops it
/// returns its store, for the final sync and check, and how many of the notes it wrote
/// (numbered from 1) a sync that succeeded has pushed, and how many it wrote.
pub fn sync_node(
    shared: Arc<Shared>,
    dir: PathBuf,
    i: usize,
    n: usize,
    run: FactHash,
) -> (Store, [u64; 2]) {
    let store = Store::open(dir.join(format!("node-{i}.db"))).unwrap();
    let options = ClientOptions {
        decode_threads: 1,
        ..ClientOptions::default()
    };
    let client = Client::new(&shared.url, options).unwrap();
    let both = SyncOptions::default();
    if let Err(e) = client.sync(&store, &both, &mut |_| {}) {
        shared.error("first sync", e);
    }
    let mut next = offset(i, n, SYNC_EVERY);
    let (mut k, mut acked) = (0i64, 0u64);
    loop {
        pace(&shared, &mut next, SYNC_EVERY);
        if shared.stopped() {
            return (store, [acked, k as u64]);
        }
        let notes: Vec<Fact> = (0..2)
            .map(|_| {
                k += 1;
                Fact::builder("Soak.Note")
                    .field("node", i as i64)
                    .field("k", k)
                    .field("t_ms", now_ms())
                    .predecessor("run", run)
                    .build()
                    .unwrap()
            })
            .collect();
        store.insert_batch(notes).unwrap();
        let t = Instant::now();
        match client.sync(&store, &both, &mut |_| {}) {
            Ok(_) => {
                shared.record(Op::Sync, t);
                acked = k as u64;
            }
            Err(e) => shared.error("sync", e),
        }
    }
}

/// A JSON API client: pushes two facts, then queries that round's facts, every
/// [`API_EVERY`]. Returns the hashes acknowledged and the query answers that were wrong.
pub fn api_client(
    shared: Arc<Shared>,
    i: usize,
    n: usize,
    run: FactHash,
    me: FactHash,
    acked: Arc<Mutex<Vec<FactHash>>>,
) -> (u64, u64) {
    let agent = agent();
    let query = "given c: Soak.Client match a: Soak.Api where a->client = c and a.round = ROUND \
                 select hash(a)";
    let mut next = offset(i, n, API_EVERY);
    let (mut wrong, mut queries) = (0, 0);
    for round in 1i64.. {
        pace(&shared, &mut next, API_EVERY);
        if shared.stopped() {
            break;
        }
        let facts: Vec<Fact> = (0..2).map(|k| api_fact(run, me, i, round, k)).collect();
        let t = Instant::now();
        if let Err(e) = push_json(&agent, &shared.url, &facts) {
            shared.error("push", e);
            continue;
        }
        shared.record(Op::Push, t);
        acked.lock().unwrap().extend(facts.iter().map(Fact::hash));
        let body = serde_json::json!({
            "query": query.replace("ROUND", &round.to_string()),
            "givens": {"c": me.to_string()},
        });
        let t = Instant::now();
        let answer = agent
            .post(format!("{}/v1/query", shared.url))
            .header("content-type", "application/json")
            .send(body.to_string())
            .map_err(|e| e.to_string())
            .and_then(|mut r| r.body_mut().read_to_string().map_err(|e| e.to_string()));
        match answer {
            Ok(text) => {
                shared.record(Op::Query, t);
                queries += 1;
                let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                let got: HashSet<&str> = v["results"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|h| h.as_str()).collect())
                    .unwrap_or_default();
                let want: Vec<String> = facts.iter().map(|f| f.hash().to_string()).collect();
                if got.len() != 2 || !want.iter().all(|h| got.contains(h.as_str())) {
                    wrong += 1;
                }
            }
            Err(e) => shared.error("query", e),
        }
    }
    (queries, wrong)
}

pub fn api_fact(run: FactHash, me: FactHash, i: usize, round: i64, k: i64) -> Fact {
    Fact::builder("Soak.Api")
        .field("client", i as i64)
        .field("round", round)
        .field("k", k)
        .field("t_ms", now_ms())
        .predecessor("run", run)
        .predecessor("client", me)
        .build()
        .unwrap()
}

/// What a watcher has seen in its current connection.
#[derive(Default)]
pub struct Seen {
    pub results: HashSet<String>,
    /// Results received twice in one connection, and `removed`/`updated` events (the
    /// watched query has neither).
    pub extra: u64,
    pub events: u64,
    pub reconnects: u64,
}

/// An SSE watcher of `GET /v1/watch` for the facts of one API client, until `done` is set.
/// A cut stream is opened again (counted), starting from a new snapshot.
pub fn watcher(
    shared: Arc<Shared>,
    client: FactHash,
    seen: Arc<Mutex<Seen>>,
    done: Arc<AtomicBool>,
) {
    let addr = shared.url.strip_prefix("http://").unwrap().to_string();
    let path = format!(
        "/v1/watch?query={}&c={client}",
        crate::common::url_encode(WATCH_QUERY)
    );
    let mut attempts = 0;
    while !done.load(Ordering::Relaxed) && attempts < 100 {
        attempts += 1;
        let Ok(mut tcp) = TcpStream::connect(&addr) else {
            shared.error("watch", "connect failed");
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        // HTTP/1.0: the body comes as it is, without the chunked coding's size lines.
        write!(tcp, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
        tcp.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let mut line = Vec::new();
        let (mut headers, mut event, mut ready) = (true, String::new(), false);
        let cut = loop {
            if done.load(Ordering::Relaxed) {
                break false;
            }
            let n = match tcp.read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue;
                }
                Err(_) => break true,
            };
            for part in buf[..n].split_inclusive(|&b| b == b'\n') {
                line.extend_from_slice(part);
                if !part.ends_with(b"\n") {
                    continue;
                }
                let text = String::from_utf8_lossy(&line).trim_end().to_string();
                line.clear();
                if headers {
                    if text.starts_with("HTTP/") && !text.contains(" 200") {
                        shared.error("watch", &text);
                    }
                    headers = !text.is_empty();
                } else if let Some(e) = text.strip_prefix("event: ") {
                    event = e.to_string();
                    if event == "ready" {
                        ready = true;
                    }
                    seen.lock().unwrap().events += 1;
                } else if let Some(data) = text.strip_prefix("data: ") {
                    if event != "added" {
                        if event != "ready" {
                            seen.lock().unwrap().extra += 1;
                        }
                        continue;
                    }
                    let results: Vec<serde_json::Value> =
                        serde_json::from_str(data).unwrap_or_default();
                    let now = now_ms();
                    let mut s = seen.lock().unwrap();
                    for r in results {
                        let (Some(h), Some(t)) = (r["h"].as_str(), r["t"].as_i64()) else {
                            s.extra += 1;
                            continue;
                        };
                        if !s.results.insert(h.to_string()) {
                            s.extra += 1;
                        }
                        if ready {
                            shared.record_us(Op::Watch, (now - t).max(0) as u64 * 1000);
                        }
                    }
                }
            }
        };
        if !cut {
            return;
        }
        // A new connection starts from a new snapshot.
        let mut s = seen.lock().unwrap();
        s.results.clear();
        s.reconnects += 1;
    }
}

/// The inputs the producer enqueued, by hash, with their write times.
pub type Jobs = Arc<Mutex<HashMap<FactHash, i64>>>;

/// The producer: pushes `Soak.Job` inputs every 100 ms so that the stream is steady at
/// `rate` per second.
pub fn producer(shared: Arc<Shared>, run: FactHash, rate: f64, jobs: Jobs) {
    let agent = agent();
    let started = Instant::now();
    let mut n = 0u64;
    while !shared.stopped() {
        let due = (started.elapsed().as_secs_f64() * rate) as u64;
        if due > n {
            let t = now_ms();
            let batch: Vec<Fact> = (n..due)
                .map(|k| {
                    Fact::builder("Soak.Job")
                        .field("n", k as i64)
                        .field("t_ms", t)
                        .predecessor("run", run)
                        .build()
                        .unwrap()
                })
                .collect();
            match push_json(&agent, &shared.url, &batch) {
                Ok(()) => {
                    let mut j = jobs.lock().unwrap();
                    j.extend(batch.iter().map(|f| (f.hash(), t)));
                    n = due;
                }
                Err(e) => shared.error("enqueue", e),
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Counts of the workers.
#[derive(Default)]
pub struct WorkCounts {
    pub completed: HashSet<FactHash>,
    pub failed: u64,
    pub lease_lost: u64,
}

/// A remote worker: claims up to 8 inputs (then waits up to 1 s for some), fails one in ten on its
/// first attempt, completes the others with a `Soak.Done` and a `Soak.Effect`. Runs until
/// `done` is set.
pub fn worker(
    shared: Arc<Shared>,
    w: usize,
    counts: Arc<Mutex<WorkCounts>>,
    jobs: Jobs,
    done: Arc<AtomicBool>,
) {
    let queue = RemoteQueue::new(&shared.url, "jobs", ClientOptions::default()).unwrap();
    while !done.load(Ordering::Relaxed) {
        // A claim that does not wait is timed; when it finds nothing, one that waits
        // up to 1 s for an input (a long-poll) is not.
        let t = Instant::now();
        let mut leases = queue.claim(8, Duration::ZERO);
        if leases.is_ok() {
            shared.record(Op::Claim, t);
        }
        if leases.as_ref().is_ok_and(|l| l.is_empty()) {
            leases = queue.claim(8, Duration::from_secs(1));
        }
        let leases = match leases {
            Ok(l) if l.is_empty() => continue,
            Ok(l) => l,
            Err(e) => {
                shared.error("claim", e);
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let n_of = |l: &RemoteLease| {
            precedent::json::to_json(&l.input)["fields"]["n"]
                .as_i64()
                .unwrap_or(0)
        };
        let (fail, complete): (Vec<_>, Vec<_>) = leases
            .iter()
            .partition(|l| l.attempt == 1 && n_of(l) % 10 == 3);
        if !fail.is_empty() {
            let items: Vec<(&str, &str)> = fail
                .iter()
                .map(|l| (l.id.as_str(), "the first attempt of one input in ten fails"))
                .collect();
            let t = Instant::now();
            match queue.fail(&items, false) {
                Ok(results) => {
                    shared.record(Op::Fail, t);
                    let ok = results.iter().filter(|r| r.ok).count() as u64;
                    counts.lock().unwrap().failed += ok;
                }
                Err(e) => shared.error("fail", e),
            }
        }
        if complete.is_empty() {
            continue;
        }
        let items: Vec<(&str, Vec<Fact>)> = complete
            .iter()
            .map(|l| {
                let done = l
                    .completion()
                    .field("by", w as i64)
                    .field("attempt", l.attempt as i64)
                    .build()
                    .unwrap();
                let effect = Fact::builder("Soak.Effect")
                    .field("by", w as i64)
                    .field("attempt", l.attempt as i64)
                    .predecessor("job", l.input.hash())
                    .build()
                    .unwrap();
                (l.id.as_str(), vec![done, effect])
            })
            .collect();
        let t = Instant::now();
        match queue.complete(&items) {
            Ok(results) => {
                shared.record(Op::Complete, t);
                let now = now_ms();
                let mut c = counts.lock().unwrap();
                let jobs = jobs.lock().unwrap();
                for (l, r) in complete.iter().zip(&results) {
                    if r.ok {
                        c.completed.insert(l.input.hash());
                        if let Some(t) = jobs.get(&l.input.hash()) {
                            shared.record_us(Op::Job, (now - t).max(0) as u64 * 1000);
                        }
                    } else {
                        c.lease_lost += 1;
                        shared.sample("complete refused", r.message.as_deref().unwrap_or(""));
                    }
                }
            }
            Err(e) => shared.error("complete", e),
        }
    }
}

//! Remote workers benchmark: batched claim+complete through the client library
//! ([`RemoteQueue`]) against a local `precedent serve` on SQLite, and, as the floor in
//! the same run, the library's own batched claim+complete ([`Store::claim`] and
//! [`Store::complete_batch`]) on a database of its own.
//!
//! `cargo bench --bench remote_work` prints both rates, their ratio and the load average.
//! Each completion writes a `Shop.Shipped` fact naming its order, on both sides.
//!
//! A second line compares, in the same run, `precedent work ship --once --process
//! --in-flight 256 -- python3 examples/handlers/ship.py` against a hub (`--remote`) with
//! the same command on a local database, and with the remote library rate above (the
//! floor of what a remote worker can do over HTTP).
//!
//! Settings, from the environment:
//! - `PRECEDENT_BENCH_REMOTE_N`: inputs per phase (default 20,000).
//! - `PRECEDENT_BENCH_REMOTE_BATCH`: inputs per claim and per completion request
//!   (default 500).
//! - `PRECEDENT_BENCH_REMOTE_WORKERS`: remote workers (threads, each its own client;
//!   default 2). The floor runs as many threads.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use precedent::sync::client::{ClientOptions, RemoteQueue};
use precedent::{Fact, Store};

mod common;
#[path = "common/shop.rs"]
mod shop_facts;

use common::{BIN, env_num, serve};
use shop_facts::{order, shop, spec};

/// A database with the `ship` queue over `n` orders.
fn load(path: &Path, n: u64) {
    let store = Store::open(path).unwrap();
    store.declare_queue(&spec()).unwrap();
    let s = shop(0);
    let mut facts = vec![s.clone()];
    facts.extend((0..n as usize).map(|i| order(&s, 0, i)));
    for chunk in facts.chunks(50_000) {
        store.insert_batch(chunk.to_vec()).unwrap();
    }
}

fn shipped(completion: precedent::FactBuilder) -> Fact {
    completion.field("by", "bench").build().unwrap()
}

/// `workers` threads, thread `i` running `work(i)` until it returns 0; completions per
/// second.
fn timed(n: u64, workers: usize, work: impl Fn(usize) -> u64 + Send + Sync + 'static) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let work = Arc::new(work);
    let started = Instant::now();
    let threads: Vec<_> = (0..workers)
        .map(|i| {
            let (done, work) = (done.clone(), work.clone());
            std::thread::spawn(move || {
                loop {
                    let k = work(i);
                    if k == 0 {
                        break;
                    }
                    done.fetch_add(k, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(
        done.load(Ordering::Relaxed),
        n,
        "every input completed once"
    );
    n as f64 / secs
}

fn floor(path: &Path, n: u64, workers: usize, batch: usize) -> f64 {
    let store = Arc::new(Store::open(path).unwrap());
    timed(n, workers, move |_| {
        let leases = store.claim("ship", batch).unwrap();
        let results = store
            .complete_batch(&leases, |w, l| {
                w.insert(&shipped(l.completion())).map(|_| ())
            })
            .unwrap();
        assert!(results.iter().all(|r| r.is_ok()));
        leases.len() as u64
    })
}

fn remote(url: &str, n: u64, workers: usize, batch: usize) -> f64 {
    let url = url.to_string();
    let clients: Vec<_> = (0..workers)
        .map(|_| RemoteQueue::new(&url, "ship", ClientOptions::default()).unwrap())
        .collect();
    // Each thread its own client, and so its own connection.
    let clients = Arc::new(clients);
    timed(n, workers, move |i| {
        let q = &clients[i];
        let leases = q.claim(batch, Duration::ZERO).unwrap();
        let items: Vec<(&str, Vec<Fact>)> = leases
            .iter()
            .map(|l| (l.id.as_str(), vec![shipped(l.completion())]))
            .collect();
        let results = q.complete(&items).unwrap();
        assert!(results.iter().all(|r| r.ok), "{results:?}");
        leases.len() as u64
    })
}

/// `precedent work ship --once --process` with ship.py, `--remote url` when given, on a
/// database of `n` orders (the hub's when remote); inputs per second.
fn cli_process(db: &Path, n: u64, remote: Option<&str>) -> f64 {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/handlers/ship.py");
    let mut c = Command::new(BIN);
    match remote {
        Some(_) => c.arg("--db").arg(db.with_extension("absent")),
        None => c.arg("--db").arg(db),
    };
    c.args(["--quiet", "work", "ship"]);
    if let Some(url) = remote {
        c.args(["--remote", url]);
    }
    let start = Instant::now();
    let out = c
        .args(["--once", "--process", "--in-flight", "256"])
        .arg("--")
        .arg("python3")
        .arg(&python)
        .output()
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats = Store::open(db).unwrap().queue_stats("ship").unwrap();
    assert_eq!(stats.completed, n, "every input completed once");
    n as f64 / secs
}

fn main() {
    let n = env_num("PRECEDENT_BENCH_REMOTE_N").unwrap_or(20_000);
    let batch = env_num("PRECEDENT_BENCH_REMOTE_BATCH").unwrap_or(500) as usize;
    let workers = env_num("PRECEDENT_BENCH_REMOTE_WORKERS").unwrap_or(2) as usize;
    // `cargo test --benches` runs this once, briefly, as a check that it works.
    let n = if std::env::args().any(|a| a == "--bench") {
        n
    } else {
        n.min(1_000)
    };
    let dir = tempfile::tempdir().unwrap();
    let (local, hub) = (dir.path().join("local.db"), dir.path().join("hub.db"));
    load(&local, n);
    load(&hub, n);
    let load_before = common::load_average();
    let floor_rate = floor(&local, n, workers, batch);
    let (mut child, url) = serve(&hub);
    let remote_rate = remote(&url, n, workers, batch);
    let _ = child.kill();
    let _ = child.wait();
    let (local_p, hub_p) = (dir.path().join("process.db"), dir.path().join("hub-p.db"));
    load(&local_p, n);
    load(&hub_p, n);
    let local_process = cli_process(&local_p, n, None);
    let (mut child, url) = serve(&hub_p);
    let remote_process = cli_process(&hub_p, n, Some(&url));
    let _ = child.kill();
    let _ = child.wait();
    println!(
        "remote_work: {n} inputs, {workers} workers, batch {batch}: local {floor_rate:.0}/s, \
         remote {remote_rate:.0}/s, remote/local {:.2}; load average {load_before:.2} before, {:.2} after",
        remote_rate / floor_rate,
        common::load_average()
    );
    println!(
        "remote_work --process: {n} inputs, ship.py, in-flight 256: local {local_process:.0}/s, \
         remote {remote_process:.0}/s, remote/local {:.2}, remote/remote library {:.2}; load average {:.2}",
        remote_process / local_process,
        remote_process / remote_rate,
        common::load_average()
    );
}

//! Server-Sent Events benchmark: does listening slow writers?
//!
//! `cargo bench --bench sse` starts a real `precedent serve` and a writer pushing shop
//! orders to it over HTTP (JSON pushes of 200 facts), and measures the writer's rate, in
//! one run, in rounds that alternate
//! - **0 clients**, and
//! - **100 clients**: 50 on `GET /v1/events` and 50 on `GET /v1/watch` of the shop's
//!   orders (an events client counts its events; a watch client counts the results in
//!   its events' arrays, with a scan of the bytes that finds the array's top-level
//!   commas rather than a JSON tree),
//!
//! so that a change in the machine's load hits both alike. It prints the median rate of
//! each and their ratio (the target: 100 clients slow the writer by no more than 10%),
//! and what the clients received. After each round every watch client must have received
//! exactly the round's facts as results (none lost, none twice), or the bench fails.
//!
//! Settings, from the environment:
//! - `PRECEDENT_BENCH_N`: facts pushed per round (default 20,000).
//! - `PRECEDENT_BENCH_ROUNDS`: rounds of each kind (default 3).
//! - `PRECEDENT_BENCH_CLIENTS`: `both` (default), `events` (all 100 on `/v1/events`) or
//!   `watch` (all 100 on `/v1/watch`), to tell their costs apart.
//!
//! See `docs/performance.md`, "Server-Sent Events".

mod common;
#[path = "common/shop.rs"]
mod shop;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use precedent::Fact;

const BATCH: usize = 200;
const CLIENTS: usize = 100;

/// Counts what an event stream holds, a line at a time: the events (`event:` lines) and
/// the results in the arrays of `data: [...]` lines (top-level commas, outside strings,
/// plus one for a non-empty array).
#[derive(Default)]
struct Counter {
    line: Vec<u8>,
    events: u64,
    results: u64,
}

impl Counter {
    fn feed(&mut self, bytes: &[u8]) {
        for part in bytes.split_inclusive(|&b| b == b'\n') {
            self.line.extend_from_slice(part);
            if part.ends_with(b"\n") {
                self.count_line();
                self.line.clear();
            }
        }
    }

    fn count_line(&mut self) {
        if self.line.starts_with(b"event: ") {
            self.events += 1;
        }
        let Some(array) = self.line.strip_prefix(b"data: [") else {
            return;
        };
        let (mut depth, mut in_string, mut escaped, mut any) = (0usize, false, false, false);
        for &b in array {
            if in_string {
                match b {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                b'[' | b'{' => depth += 1,
                b']' | b'}' if depth == 0 => break,
                b']' | b'}' => depth -= 1,
                b',' if depth == 0 => self.results += 1,
                _ if b.is_ascii_whitespace() => continue,
                _ => {}
            }
            any = true;
        }
        if any {
            self.results += 1;
        }
    }
}

/// A client reading an event stream until `stop` (or until it has `want` results, then
/// it goes on reading until `stop`), publishing its counts in `events` and `results`.
fn client(
    url: &str,
    path: String,
    stop: Arc<AtomicBool>,
    events: Arc<AtomicU64>,
    results: Arc<AtomicU64>,
) -> JoinHandle<()> {
    let addr = url.strip_prefix("http://").unwrap().to_string();
    std::thread::spawn(move || {
        let mut tcp = TcpStream::connect(&addr).unwrap();
        // HTTP/1.0: the body comes as it is, without the chunked coding's size lines.
        write!(tcp, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
        tcp.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let mut counter = Counter::default();
        let mut published = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            match tcp.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    counter.feed(&buf[..n]);
                    events.fetch_add(counter.events - published.0, Ordering::Relaxed);
                    results.fetch_add(counter.results - published.1, Ordering::Relaxed);
                    published = (counter.events, counter.results);
                }
                Err(_) => {}
            }
        }
    })
}

/// Pushes `n` new orders of `shop` in JSON pushes of [`BATCH`]; facts per second.
fn write(agent: &ureq::Agent, url: &str, shop: &Fact, from: usize, n: usize) -> f64 {
    let start = Instant::now();
    for chunk in (from..from + n).collect::<Vec<_>>().chunks(BATCH) {
        let body: Vec<String> = chunk
            .iter()
            .map(|&i| precedent::json::to_json(&shop::order(shop, 0, i)).to_string())
            .collect();
        let r = agent
            .post(format!("{url}/v1/facts"))
            .header("content-type", "application/json")
            .send(format!("[{}]", body.join(",")))
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let n = common::env_num("PRECEDENT_BENCH_N").unwrap_or(20_000) as usize;
    let rounds = common::env_num("PRECEDENT_BENCH_ROUNDS").unwrap_or(3) as usize;
    let kind = std::env::var("PRECEDENT_BENCH_CLIENTS").unwrap_or_else(|_| "both".into());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("sse.db");
    // A shop per round, so that each round's watches start from an empty snapshot and
    // their events are the writer's facts alone.
    let shops: Vec<Fact> = (0..=rounds).map(shop::shop).collect();
    precedent::Store::open(&db)
        .unwrap()
        .insert_batch(shops.clone())
        .unwrap();
    let shop = shops[0].clone();
    let (mut server, url) = common::serve(&db);
    let agent = ureq::Agent::new_with_defaults();
    // A first round warms the database file and the server.
    write(&agent, &url, &shop, 0, n / 4);
    let mut next = n / 4;
    let (mut bare, mut listened) = (Vec::new(), Vec::new());
    let events = Arc::new(AtomicU64::new(0));
    let mut results_total = 0;
    for r in 1..=rounds {
        let shop = &shops[r];
        let watch = format!(
            "/v1/watch?query={}&s={}",
            common::url_encode("given s: Shop match o: Shop.Order where o->shop = s select o.id"),
            shop.hash()
        );
        bare.push(write(&agent, &url, &shops[0], next, n));
        next += n;
        let stop = Arc::new(AtomicBool::new(false));
        // Results received, one counter per watch client.
        let mut results = Vec::new();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let events_client = match kind.as_str() {
                    "events" => true,
                    "watch" => false,
                    _ => i % 2 == 0,
                };
                let path = if events_client {
                    "/v1/events".to_string()
                } else {
                    watch.clone()
                };
                let mine = Arc::new(AtomicU64::new(0));
                if !events_client {
                    results.push(mine.clone());
                }
                client(&url, path, stop.clone(), events.clone(), mine)
            })
            .collect();
        // Connected (their snapshots are empty) before the writer starts.
        std::thread::sleep(Duration::from_secs(1));
        listened.push(write(&agent, &url, shop, next, n));
        next += n;
        // Every watch client gets each of the round's facts as one result, and nothing
        // more: wait (bounded) for the last of them, then a moment for any extra.
        let got = |results: &[Arc<AtomicU64>]| -> Vec<u64> {
            results.iter().map(|r| r.load(Ordering::Relaxed)).collect()
        };
        let until = Instant::now() + Duration::from_secs(60);
        while got(&results).iter().any(|&g| g < n as u64) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.join().unwrap();
        }
        let got = got(&results);
        assert!(
            got.iter().all(|&g| g == n as u64),
            "round {r}: the watch clients received {got:?} results, not {n} each"
        );
        results_total += got.iter().sum::<u64>();
    }
    let (b, l) = (median(bare), median(listened));
    println!("sse: {n} facts per round, {rounds} rounds of each, pushes of {BATCH}");
    println!("  writer, 0 clients:   {b:>9.0} facts/s (median)");
    println!("  writer, {CLIENTS} clients: {l:>9.0} facts/s (median; clients: {kind})");
    println!("  ratio (0 clients / 100 clients): {:.3}", b / l);
    println!(
        "  events received by the clients: {}; results in the watches' events: {results_total}",
        events.load(Ordering::Relaxed)
    );
    let _ = server.kill();
    let _ = server.wait();
}

//! Server-Sent Events benchmark: does listening slow writers?
//!
//! `cargo bench --bench sse` starts a real `precedent serve` and a writer pushing shop
//! orders to it over HTTP (JSON pushes of 200 facts), and measures the writer's rate, in
//! one run, in rounds that alternate
//! - **0 clients**, and
//! - **100 clients**: 50 on `GET /v1/events` and 50 on `GET /v1/watch` of the shop's
//!   orders (each reading and counting every event),
//!
//! so that a change in the machine's load hits both alike. It prints the median rate of
//! each and their ratio (the target: 100 clients slow the writer by no more than 10%),
//! and the events the clients received (so a client that got nothing is seen).
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

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A client reading an event stream until `stop`, counting `event:` lines.
fn client(
    url: &str,
    path: String,
    stop: Arc<AtomicBool>,
    events: Arc<AtomicU64>,
) -> JoinHandle<()> {
    let addr = url.strip_prefix("http://").unwrap().to_string();
    std::thread::spawn(move || {
        let mut tcp = TcpStream::connect(&addr).unwrap();
        write!(
            tcp,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        tcp.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        while !stop.load(Ordering::Relaxed) {
            match tcp.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let seen = buf[..n].windows(7).filter(|w| w == b"event: ").count();
                    events.fetch_add(seen as u64, Ordering::Relaxed);
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
    for r in 1..=rounds {
        let shop = &shops[r];
        let watch = format!(
            "/v1/watch?query={}&s={}",
            encode("given s: Shop match o: Shop.Order where o->shop = s select o.id"),
            shop.hash()
        );
        bare.push(write(&agent, &url, &shops[0], next, n));
        next += n;
        let stop = Arc::new(AtomicBool::new(false));
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
                client(&url, path, stop.clone(), events.clone())
            })
            .collect();
        // Connected (their snapshots are empty) before the writer starts.
        std::thread::sleep(Duration::from_secs(1));
        listened.push(write(&agent, &url, shop, next, n));
        next += n;
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.join().unwrap();
        }
    }
    let (b, l) = (median(bare), median(listened));
    println!("sse: {n} facts per round, {rounds} rounds of each, pushes of {BATCH}");
    println!("  writer, 0 clients:   {b:>9.0} facts/s (median)");
    println!("  writer, {CLIENTS} clients: {l:>9.0} facts/s (median; clients: {kind})");
    println!("  ratio (0 clients / 100 clients): {:.3}", b / l);
    println!(
        "  events received by the clients: {}",
        events.load(Ordering::Relaxed)
    );
    let _ = server.kill();
    let _ = server.wait();
}

//! The console's JSON lists and page with a million facts and 100,000 dead letters: each
//! endpoint's latency over HTTP on 127.0.0.1 against a floor, the same list read by
//! hand with rusqlite on the same file, and a check that each answers in under 100 ms.
//! The floors' statements are the endpoints' own, and their plans (EXPLAIN QUERY PLAN)
//! are printed and checked to use an index, never a scan of a whole table.
//!
//! `cargo bench --bench console` prints one line per endpoint. Settings, from the
//! environment:
//! - `PRECEDENT_BENCH_CONSOLE_FACTS`: shop facts loaded besides the jobs (default
//!   1,000,000);
//! - `PRECEDENT_BENCH_CONSOLE_DEAD`: jobs dead-lettered (default 100,000);
//! - `PRECEDENT_BENCH_CONSOLE_RUNS`: requests timed per endpoint (default 30).
//!
//! The dead letters are made through the library: a queue `jobs` with one attempt,
//! claimed 1,000 at a time in one transaction and failed permanently. See
//! `docs/performance.md`, "Console".

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use precedent::queue::{Completion, Failure, Ordering, QueueSpec};
use precedent::sync::server::{Running, ServerConfig};
use precedent::{Fact, Store};
use rusqlite::Connection;

#[path = "common/shop.rs"]
mod shop_facts;

const BUDGET: Duration = Duration::from_millis(100);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn job(i: u64) -> Fact {
    Fact::builder("Job").field("n", i as i64).build().unwrap()
}

fn jobs_spec() -> QueueSpec {
    let mut spec = QueueSpec::new(
        "jobs",
        "Job",
        vec![Completion {
            type_name: "Job.Done".into(),
            role: "job".into(),
        }],
    );
    spec.retry.max_attempts = 1;
    spec.ordering = Ordering::None;
    spec
}

/// Loads the shop facts and the jobs, and dead-letters every job.
fn load(store: &Store, facts: u64, dead: u64) -> Fact {
    let t = Instant::now();
    let shops: Vec<Fact> = (0..10).map(shop_facts::shop).collect();
    // Each order brings its shipment 9 times in 10: 1.9 facts per order.
    let per_shop = (facts as f64 / 1.9 / 10.0) as usize;
    let n = shop_facts::store_shop_orders(store, &shops, per_shop);
    eprintln!("loaded {n} shop facts in {:.1?}", t.elapsed());
    let t = Instant::now();
    store.declare_queue(&jobs_spec()).unwrap();
    let mut i = 0;
    while i < dead {
        let chunk: Vec<Fact> = (i..(i + 50_000).min(dead)).map(job).collect();
        i += chunk.len() as u64;
        store.insert_batch(chunk).unwrap();
    }
    let failure = Failure::Permanent("bench: refused".into());
    loop {
        let n = store
            .write(|w| {
                let leases = w.claim("jobs", 1000)?;
                for l in &leases {
                    w.fail(l, &failure)?;
                }
                Ok(leases.len())
            })
            .unwrap();
        if n == 0 {
            break;
        }
    }
    let stats = store.queue_stats("jobs").unwrap();
    assert_eq!(stats.dead, dead, "every job dead-lettered");
    eprintln!("dead-lettered {dead} jobs in {:.1?}", t.elapsed());
    shops[0].clone()
}

/// One GET over a fresh connection: status and body.
fn get(addr: SocketAddr, path: &str) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = std::str::from_utf8(&buf[9..12]).unwrap().parse().unwrap();
    (status, buf[end + 4..].to_vec())
}

/// The median and the slowest of `runs` timings of `f`.
fn time(runs: u64, mut f: impl FnMut()) -> (Duration, Duration) {
    let mut all: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    all.sort();
    (all[all.len() / 2], *all.last().unwrap())
}

/// The `next` cursor of a list answer.
fn next_of(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    v["next"].as_str().map(str::to_string)
}

/// Checks that a statement's plan reads an index (no `SCAN` of a table without one).
fn plan(conn: &Connection, sql: &str, params: &[&dyn rusqlite::ToSql]) -> String {
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    let rows: Vec<String> = stmt
        .query_map(params, |r| r.get::<_, String>(3))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let text = rows.join("; ");
    for r in &rows {
        let scans_table = r.starts_with("SCAN") && !r.contains("INDEX");
        assert!(!scans_table, "a whole-table scan in {sql:?}: {text}");
        assert!(!r.contains("TEMP B-TREE"), "a sort in {sql:?}: {text}");
    }
    text
}

/// A floor: the endpoint's statement by hand, reading the rows as the endpoint does.
fn floor(conn: &Connection, sql: &str, params: &[&dyn rusqlite::ToSql]) -> usize {
    let mut stmt = conn.prepare_cached(sql).unwrap();
    let mut rows = stmt.query(params).unwrap();
    let mut n = 0;
    while let Some(r) = rows.next().unwrap() {
        let _ = r.get_ref(0).unwrap();
        n += 1;
    }
    n
}

struct Case {
    name: &'static str,
    path: String,
    floor: Option<(&'static str, Vec<Box<dyn rusqlite::ToSql>>)>,
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let facts = env_u64("PRECEDENT_BENCH_CONSOLE_FACTS", 1_000_000);
    let dead = env_u64("PRECEDENT_BENCH_CONSOLE_DEAD", 100_000);
    let runs = env_u64("PRECEDENT_BENCH_CONSOLE_RUNS", 30);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("console.db");
    let store = Store::open(&path).unwrap();
    let shop = load(&store, facts, dead);
    let (total, _) = store.count_and_max_seq().unwrap();
    drop(store);
    let mut config = ServerConfig::new(&path);
    config.listen = "127.0.0.1:0".parse().unwrap();
    let server = Running::start(config).unwrap();
    let addr = server.addr();
    let conn = Connection::open(&path).unwrap();
    let queue_id: i64 = conn
        .query_row("SELECT id FROM queue WHERE name = 'jobs'", [], |r| r.get(0))
        .unwrap();
    let shop_seq: i64 = conn
        .query_row(
            "SELECT seq FROM fact WHERE hash = ?1",
            [shop.hash().0.to_vec()],
            |r| r.get(0),
        )
        .unwrap();

    // Deep pages start from a cursor half-way through the list.
    let (_, body) = get(addr, "/v1/queues/jobs/items?state=dead&limit=1000");
    let mut cursor = next_of(&body).unwrap();
    for _ in 0..(dead / 2000) {
        let (_, body) = get(
            addr,
            &format!("/v1/queues/jobs/items?state=dead&limit=1000&after={cursor}"),
        );
        cursor = next_of(&body).unwrap();
    }
    let dead_mid: i64 = cursor.parse().unwrap();
    let (_, body) = get(addr, "/v1/find?type=Shop.Order&limit=1000");
    let order_cursor = next_of(&body).unwrap();
    let (_, body) = get(
        addr,
        &format!("/v1/facts/{}/successors?limit=1000", shop.hash()),
    );
    let succ_cursor = next_of(&body).unwrap();

    let items_sql = "SELECT input FROM queue_item WHERE queue_id = ?1 AND state = ?2 AND input > ?3 ORDER BY input LIMIT ?4";
    let type_sql = "SELECT seq, hash, bytes FROM fact WHERE type_id = (SELECT id FROM fact_type WHERE name = 'Shop.Order') AND seq < ?1 ORDER BY seq DESC LIMIT ?2";
    let prefix_sql =
        "SELECT seq, hash, bytes FROM fact WHERE hash >= ?1 AND hash <= ?2 ORDER BY hash LIMIT ?3";
    let succ_sql = "SELECT e.role_id, e.successor_type, e.successor, f.hash, f.bytes FROM edge e JOIN fact f ON f.seq = e.successor
                    WHERE e.predecessor = ?1 AND (e.role_id, e.successor_type, e.successor) > (?2, ?3, ?4)
                    ORDER BY e.role_id, e.successor_type, e.successor LIMIT ?5";
    let held_sql = "SELECT id, hash, bytes, held_at FROM held WHERE id > ?1 ORDER BY id LIMIT ?2";
    let quarantine_sql = "SELECT id, peer, received_ms, reason FROM sync_quarantine WHERE id < ?1 ORDER BY id DESC LIMIT ?2";
    let peers_sql = "SELECT url FROM sync_peer WHERE url > ?1 ORDER BY url LIMIT ?2";
    let lo = [0xabu8, 0xcd]
        .iter()
        .copied()
        .chain([0u8; 30])
        .collect::<Vec<u8>>();
    let hi = [0xabu8, 0xcd]
        .iter()
        .copied()
        .chain([0xffu8; 30])
        .collect::<Vec<u8>>();
    let succ_parts: Vec<i64> = succ_cursor.split('.').map(|x| x.parse().unwrap()).collect();
    let b = |v: i64| -> Box<dyn rusqlite::ToSql> { Box::new(v) };
    let cases = vec![
        Case {
            name: "/ui/",
            path: "/ui/".into(),
            floor: None,
        },
        Case {
            name: "overview",
            path: "/v1/overview".into(),
            floor: None,
        },
        Case {
            name: "queues",
            path: "/v1/queues".into(),
            floor: None,
        },
        Case {
            name: "queue (stats, last hour)",
            path: "/v1/queues/jobs".into(),
            floor: None,
        },
        Case {
            name: "dead letters, first page",
            path: "/v1/queues/jobs/items?state=dead".into(),
            floor: Some((items_sql, vec![b(queue_id), b(3), b(0), b(101)])),
        },
        Case {
            name: "dead letters, middle page",
            path: format!("/v1/queues/jobs/items?state=dead&after={dead_mid}"),
            floor: Some((items_sql, vec![b(queue_id), b(3), b(dead_mid), b(101)])),
        },
        Case {
            name: "find by type, newest",
            path: "/v1/find?type=Shop.Order".into(),
            floor: Some((type_sql, vec![b(i64::MAX), b(101)])),
        },
        Case {
            name: "find by type, deeper page",
            path: format!("/v1/find?type=Shop.Order&after={order_cursor}"),
            floor: Some((type_sql, vec![b(order_cursor.parse().unwrap()), b(101)])),
        },
        Case {
            name: "find by prefix abcd",
            path: "/v1/find?prefix=abcd".into(),
            floor: Some((
                prefix_sql,
                vec![Box::new(lo.clone()), Box::new(hi.clone()), b(101)],
            )),
        },
        Case {
            name: "successors of a shop, page 2",
            path: format!("/v1/facts/{}/successors?after={succ_cursor}", shop.hash()),
            floor: Some((
                succ_sql,
                vec![
                    b(shop_seq),
                    b(succ_parts[0]),
                    b(succ_parts[1]),
                    b(succ_parts[2]),
                    b(101),
                ],
            )),
        },
        Case {
            name: "held",
            path: "/v1/held".into(),
            floor: Some((held_sql, vec![b(0), b(101)])),
        },
        Case {
            name: "peers",
            path: "/v1/peers".into(),
            floor: Some((peers_sql, vec![Box::new(String::new()), b(101)])),
        },
        Case {
            name: "quarantine",
            path: "/v1/quarantine".into(),
            floor: Some((quarantine_sql, vec![b(i64::MAX), b(101)])),
        },
    ];
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "console: {total} facts, {dead} dead letters, {runs} runs each, load average {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "{:<32} {:>10} {:>10} {:>10} {:>7}",
        "endpoint", "median", "max", "floor", "ratio"
    );
    let mut over = Vec::new();
    for case in &cases {
        let (status, _) = get(addr, &case.path);
        assert_eq!(status, 200, "{}", case.path);
        let (median, max) = time(runs, || {
            get(addr, &case.path);
        });
        let floor_t = case.floor.as_ref().map(|(sql, params)| {
            let p: Vec<&dyn rusqlite::ToSql> = params.iter().map(|b| b.as_ref()).collect();
            let plan_text = plan(&conn, sql, &p);
            eprintln!("  plan of {}: {plan_text}", case.name);
            time(runs, || {
                floor(&conn, sql, &p);
            })
            .0
        });
        let (floor_s, ratio) = match floor_t {
            Some(f) => (
                format!("{:.2?}", f),
                format!("{:.1}", median.as_secs_f64() / f.as_secs_f64().max(1e-9)),
            ),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:<32} {:>10} {:>10} {:>10} {:>7}",
            case.name,
            format!("{median:.2?}"),
            format!("{max:.2?}"),
            floor_s,
            ratio
        );
        if median > BUDGET {
            over.push(case.name);
        }
    }
    server.stop().unwrap();
    assert!(over.is_empty(), "over {BUDGET:?} (median): {over:?}");
    println!("every endpoint's median is under {BUDGET:?}");
}

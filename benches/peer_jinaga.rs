//! Peer benchmark: `precedent serve` on PostgreSQL against Jinaga's server on PostgreSQL,
//! end to end over HTTP on 127.0.0.1, on the same workload in the same run.
//!
//! The workload is the peer's (its `bench.js`): one `Bench.Store`, N `Bench.Order`s naming
//! it (`id` text, `total` float, `note` text), and a `Bench.OrderShipped` for every
//! second order: 1.5 N + 1 facts. "Pending orders" are the orders of the store with no
//! shipment (N / 2).
//!
//! Ours, `RUNS` times, each on a fresh database: `precedent --db postgres://... serve`;
//! the facts posted in the JSON form (`POST /v1/facts`, `application/json`), 1,000 a
//! request one after another, orders first (the peer sends the same chunks, each with
//! the closure of its predecessors), each request's time kept (`saveRequestMs`); then the pending orders asked twice as hashes
//! (`POST /v1/query`, `select hash(o)`) and twice as whole facts (`select o`); the
//! server's peak resident memory (`VmHWM`).
//!
//! The peer, in the same run: when `PRECEDENT_BENCH_PEER_DIR` names a copy of the peer's
//! folder (`run.sh`, `bench.js`, `server.js`, `summarize.js`, `package.json`: it installs
//! what it lacks), `bash run.sh N 1` there in batch mode after each run of ours, so that
//! the two sides take turns and meet the machine in the same minutes; the medians of
//! its runs, and each run of ours against the peer's next to it. Without it the bench
//! prints ours alone and says that the peer did not run.
//!
//! The floor, in the same run, `RUNS` times each on a fresh database of our schema: the
//! same rows written by a plain client, a transaction per 1,000 facts, by `COPY` and by
//! our server's `INSERT` statement (each fact's one edge in its own row, schema version
//! 7), and the pending query's statement alone, on the fact rows (see `floor`):
//! PostgreSQL's own cost of what ours asks of it. Beside it, `COPY` of our fact rows
//! alone (no edge in them), to show what the edges cost.
//!
//! The least floor, in the same run, `RUNS` times each on a fresh database: the same
//! facts' hashes and canonical bytes written the same way by `COPY` into one table
//! `(hash bytea PRIMARY KEY, bytes bytea NOT NULL)` (see `least_floor`): the least any
//! content-addressed store on PostgreSQL must write to keep a fact durably and collapse
//! duplicates, whatever its schema. The floors are printed with their ratios to the
//! peer's save rate.
//!
//! Both sides get a PostgreSQL with initdb's settings (fsync and synchronous commit on):
//! the peer's script starts its own; ours is `PRECEDENT_BENCH_PG_URL` when set (a
//! database on a server of your own, emptied), else a throwaway cluster started here with
//! initdb's settings (`tests/common/pg.rs`, `use_settings`).
//!
//! Targets (issue "Hubs on PostgreSQL"): ours at least 20x the peer's save rate, and at
//! least 10x on the pending query (as hashes; as facts reported too); the server under
//! 300 MB.
//!
//! Settings: `PRECEDENT_BENCH_PEER_N` (10,000), `PRECEDENT_BENCH_PEER_RUNS` (3),
//! `PRECEDENT_BENCH_PEER_FLOORS` (`0` skips the floors), `PRECEDENT_BENCH_OUT` (`target/bench-peer-jinaga.json`). See `docs/performance.md`,
//! "Against Jinaga's server on PostgreSQL".

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use precedent::{Fact, FactHash};
use serde_json::{Value as Json, json};

mod common;

use common::{BIN, env_num, peak_mb};

#[allow(dead_code)]
#[path = "../tests/common/pg.rs"]
mod pg;

const CHUNK: usize = 1_000;
const INGEST_TARGET: f64 = 20.0;
const QUERY_TARGET: f64 = 10.0;
const MEMORY_LIMIT_MB: f64 = 300.0;

fn facts(n: usize) -> (Fact, Vec<Fact>) {
    let store = Fact::builder("Bench.Store")
        .field("id", "store-precedent")
        .build()
        .unwrap();
    let mut all = vec![store.clone()];
    let mut orders = Vec::with_capacity(n);
    for i in 0..n {
        let o = Fact::builder("Bench.Order")
            .field("id", format!("order-{i}"))
            .field("total", (i % 1000) as f64 + 0.5)
            .field("note", format!("note for order {i}"))
            .predecessor("store", store.hash())
            .build()
            .unwrap();
        orders.push(o);
    }
    let shipments: Vec<Fact> = orders
        .iter()
        .step_by(2)
        .map(|o| {
            Fact::builder("Bench.OrderShipped")
                .predecessor("order", o.hash())
                .build()
                .unwrap()
        })
        .collect();
    all.extend(orders);
    all.extend(shipments);
    (store, all)
}

fn pending(store: &FactHash, project: &str) -> String {
    json!({
        "query": format!(
            "given s: Bench.Store
             match o: Bench.Order where o->store = s
               and not exists (match sh: Bench.OrderShipped where sh->order = o)
             select {project}"
        ),
        "givens": {"s": store.to_string()},
    })
    .to_string()
}

fn database() -> String {
    match std::env::var("PRECEDENT_BENCH_PG_URL") {
        Ok(base) => {
            let mut c = postgres::Client::connect(&base, postgres::NoTls).unwrap();
            c.batch_execute("DROP DATABASE IF EXISTS bench_peer")
                .unwrap();
            c.batch_execute("CREATE DATABASE bench_peer").unwrap();
            let at = base.rfind('/').unwrap();
            format!("{}/bench_peer", &base[..at])
        }
        Err(_) => {
            // initdb's settings, as the peer's server gets: fsync and synchronous commit on.
            pg::use_settings(&[]);
            pg::db().expect("PostgreSQL is installed").url
        }
    }
}

/// `precedent --db URL init`, then [`common::serve`] on it.
fn serve(db: &str) -> (Child, String) {
    let init = Command::new(BIN)
        .args(["--db", db, "init"])
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "init: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    common::serve(db)
}

fn post(agent: &ureq::Agent, url: &str, body: &str) -> Vec<u8> {
    let mut resp = agent
        .post(url)
        .header("content-type", "application/json")
        .send(body)
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(1 << 30)
        .read_to_vec()
        .unwrap();
    assert_eq!(status, 200, "{url}: {}", String::from_utf8_lossy(&body));
    body
}

/// One run of ours on a fresh database.
fn ours(n: usize) -> Json {
    let db = database();
    let (mut server, base) = serve(&db);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into();
    let (store, all) = facts(n);
    let bodies: Vec<String> = all
        .chunks(CHUNK)
        .map(|c| {
            let forms: Vec<String> = c
                .iter()
                .map(|f| precedent::json::to_json(f).to_string())
                .collect();
            format!("[{}]", forms.join(","))
        })
        .collect();
    let started = Instant::now();
    let mut inserted = 0u64;
    let mut request_ms = Vec::with_capacity(bodies.len());
    for b in &bodies {
        let sent = Instant::now();
        let answer = post(&agent, &format!("{base}/v1/facts"), b);
        request_ms.push((sent.elapsed().as_secs_f64() * 1e4).round() / 10.0);
        let report: Json = serde_json::from_slice(&answer).unwrap();
        assert!(
            report["rejected"].as_array().unwrap().is_empty(),
            "{report}"
        );
        inserted += report["inserted"].as_u64().unwrap();
    }
    let save_secs = started.elapsed().as_secs_f64();
    assert_eq!(inserted, all.len() as u64, "every fact stored once");
    let query = format!("{base}/v1/query");
    let ask = |project: &str| {
        let t = Instant::now();
        let body = post(&agent, &query, &pending(&store.hash(), project));
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let answer: Json = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            answer["count"].as_u64().unwrap(),
            (n / 2) as u64,
            "pending orders"
        );
        (ms, body.len())
    };
    let (hash1, _) = ask("hash(o)");
    let (hash2, _) = ask("hash(o)");
    let (fact1, bytes) = ask("o");
    let (fact2, _) = ask("o");
    let server_peak = peak_mb(server.id()).unwrap_or(f64::NAN);
    server.kill().unwrap();
    server.wait().unwrap();
    json!({"facts": all.len(), "saveSecs": save_secs,
           "saveFactsPerSec": all.len() as f64 / save_secs, "saveRequestMs": request_ms,
           "readHashMs": hash1, "readHashMs2": hash2, "readFactMs": fact1, "readFactMs2": fact2,
           "readFactBytes": bytes, "serverPeakMB": server_peak})
}

/// A fact's row for the floors: seq, hash, type id, bytes, and its first edge (schema
/// version 7: `p1`, `p1_role`, `p1_type`), `None`s for a fact with no predecessor.
type FloorRow = (i64, Vec<u8>, i64, Vec<u8>, [Option<i64>; 3]);

/// The floors' rows of `all`, computed before the clock starts: seq, hash, type id, bytes;
/// an edge per fact but the store's, in the fact's row: predecessor, role, predecessor
/// type. No fact here has a second edge, so none is a row of `edge_more`.
fn floor_rows(all: &[Fact]) -> Vec<FloorRow> {
    let seq_of: std::collections::HashMap<FactHash, i64> = all
        .iter()
        .enumerate()
        .map(|(i, f)| (f.hash(), i as i64 + 1))
        .collect();
    all.iter()
        .enumerate()
        .map(|(i, f)| {
            let seq = i as i64 + 1;
            let ty = match f.type_name() {
                "Bench.Store" => 1,
                "Bench.Order" => 2,
                _ => 3,
            };
            let preds = f.predecessor_hashes();
            assert!(preds.len() <= 1, "one edge at most, in the fact's row");
            let edge = match preds.first() {
                Some(p) => {
                    let (role, pty) = if ty == 2 { (1, 1) } else { (2, 2) };
                    [Some(seq_of[p]), Some(role), Some(pty)]
                }
                None => [None; 3],
            };
            (
                seq,
                f.hash().0.to_vec(),
                ty,
                f.canonical_bytes().to_vec(),
                edge,
            )
        })
        .collect()
}

/// Writes `rows` as the floors do: a transaction per 1,000 facts as the requests are, each
/// commit flushed (`synchronous_commit` as initdb sets it, on), the rows of a transaction
/// written by `write`. Returns the facts per second.
fn save_chunks(
    c: &mut postgres::Client,
    rows: &[FloorRow],
    mut write: impl FnMut(&mut postgres::Transaction, &[FloorRow]),
) -> f64 {
    let started = Instant::now();
    for chunk in rows.chunks(CHUNK) {
        let mut tx = c.transaction().unwrap();
        write(&mut tx, chunk);
        tx.commit().unwrap();
    }
    rows.len() as f64 / started.elapsed().as_secs_f64()
}

/// `copy` (a `COPY ... FROM STDIN BINARY` of `K` columns of `types`) of `rows` in `tx`.
fn copy_in<'a, const K: usize>(
    tx: &mut postgres::Transaction,
    copy: &str,
    types: &[postgres::types::Type; K],
    rows: impl Iterator<Item = [&'a (dyn postgres::types::ToSql + Sync); K]>,
) {
    let mut w = postgres::binary_copy::BinaryCopyInWriter::new(tx.copy_in(copy).unwrap(), types);
    for r in rows {
        w.write(&r).unwrap();
    }
    w.finish().unwrap();
}

/// The floor of one run, on a fresh database with our schema (`precedent init`): the same
/// rows (facts, each with its edge in its row, [`floor_rows`]) written by a plain client
/// ([`save_chunks`]); with `COPY ... BINARY` of the fact rows with their `p1` columns
/// (`copy`), with our server's own statement (`insert`: one `INSERT ... SELECT FROM
/// unnest(...)` for the fact rows and the rows of `edge_more`, none here), or by `COPY` of
/// the fact rows without their edge (`fact`: `p1` left NULL, so our fact table and its
/// three indexes, without an entry in the partial index `fact_by_first`, to show what the
/// edges cost). Then, but for `fact`, the pending query's statement on the fact rows,
/// prepared, run twice by the same client (`readHashMs`, the better of the two):
/// PostgreSQL's own cost of the answer ours gives.
fn floor(n: usize, how: &str) -> Json {
    use postgres::types::Type;
    let db = database();
    let init = Command::new(BIN)
        .args(["--db", &db, "init"])
        .output()
        .unwrap();
    assert!(init.status.success(), "init");
    let mut c = postgres::Client::connect(&db, postgres::NoTls).unwrap();
    c.batch_execute(
        "INSERT INTO fact_type (id, name) VALUES (1, 'Bench.Store'), (2, 'Bench.Order'), (3, 'Bench.OrderShipped');
         INSERT INTO role (id, name) VALUES (1, 'store'), (2, 'order')",
    )
    .unwrap();
    let (store, all) = facts(n);
    let rows = floor_rows(&all);
    // Our server's statement (schema version 7): the fact rows with their first edges,
    // and the other edges as rows of `edge_more` ($5 to $10: none in this workload).
    let insert = c
        .prepare(
            "WITH f AS (
                 INSERT INTO fact (seq, hash, type_id, bytes, p1, p1_role, p1_type)
                 SELECT * FROM unnest($1::bigint[], $2::bytea[], $3::bigint[], $4::bytea[],
                                      $11::bigint[], $12::bigint[], $13::bigint[])
                 ON CONFLICT (hash) DO NOTHING RETURNING 1),
             e AS (
                 INSERT INTO edge_more (predecessor, role_id, successor_type, successor, predecessor_type, successor_hash)
                 SELECT * FROM unnest($5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bytea[]))
             SELECT count(*) FROM f",
        )
        .unwrap();
    let rate = save_chunks(&mut c, &rows, |tx, chunk| {
        if how == "insert" {
            let p1 = |k: usize| chunk.iter().map(|r| r.4[k]).collect::<Vec<Option<i64>>>();
            let no_edge: Vec<i64> = Vec::new();
            let no_hash: Vec<&[u8]> = Vec::new();
            let seqs: Vec<i64> = chunk.iter().map(|r| r.0).collect();
            let hashes: Vec<&[u8]> = chunk.iter().map(|r| &r.1[..]).collect();
            let types: Vec<i64> = chunk.iter().map(|r| r.2).collect();
            let bytes: Vec<&[u8]> = chunk.iter().map(|r| &r.3[..]).collect();
            let n: i64 = tx
                .query_one(
                    &insert,
                    &[
                        &seqs,
                        &hashes,
                        &types,
                        &bytes,
                        &no_edge,
                        &no_edge,
                        &no_edge,
                        &no_edge,
                        &no_edge,
                        &no_hash,
                        &p1(0),
                        &p1(1),
                        &p1(2),
                    ],
                )
                .unwrap()
                .get(0);
            assert_eq!(n as usize, chunk.len());
            return;
        }
        if how == "copy" {
            copy_in(
                tx,
                "COPY fact (seq, hash, type_id, bytes, p1, p1_role, p1_type) FROM STDIN BINARY",
                &[
                    Type::INT8,
                    Type::BYTEA,
                    Type::INT8,
                    Type::BYTEA,
                    Type::INT8,
                    Type::INT8,
                    Type::INT8,
                ],
                chunk.iter().map(|r| {
                    [
                        &r.0 as _,
                        &r.1 as _,
                        &r.2 as _,
                        &r.3 as _,
                        &r.4[0] as _,
                        &r.4[1] as _,
                        &r.4[2] as _,
                    ]
                }),
            );
            return;
        }
        copy_in(
            tx,
            "COPY fact (seq, hash, type_id, bytes) FROM STDIN BINARY",
            &[Type::INT8, Type::BYTEA, Type::INT8, Type::BYTEA],
            chunk
                .iter()
                .map(|r| [&r.0 as _, &r.1 as _, &r.2 as _, &r.3 as _]),
        );
    });
    if how == "fact" {
        return json!({"how": how, "saveFactsPerSec": rate});
    }
    // The pending statement for `select hash(o)` on our layout (schema version 7), by
    // hand: the orders and their shipments found by the fact rows' first edges (the
    // partial index `fact_by_first`), the hashes from the order rows; ids as literals.
    let q = c
        .prepare(
            "SELECT o.seq, o.hash, NULL::bytea FROM fact s CROSS JOIN fact o
             WHERE s.hash = $1 AND s.type_id = 1 AND o.p1 = s.seq AND o.p1_role = 1
             AND o.type_id = 2 AND NOT EXISTS (SELECT 1 FROM fact sh
             WHERE sh.p1 = o.seq AND sh.p1_role = 2 AND sh.type_id = 3)
             ORDER BY o.seq",
        )
        .unwrap();
    let mut best = f64::INFINITY;
    for _ in 0..2 {
        let t = Instant::now();
        let got = c.query(&q, &[&&store.hash().0[..]]).unwrap();
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(got.len(), n / 2, "pending orders");
    }
    json!({"how": how, "saveFactsPerSec": rate, "readHashMs": best})
}

/// The least floor of one run: the least any content-addressed store on PostgreSQL must
/// write per fact to keep it durably and collapse duplicates, whatever its schema. One
/// table in a fresh database, `(hash bytea PRIMARY KEY, bytes bytea NOT NULL)`: the
/// unique index on the hash is what collapses a duplicate, the bytes are the fact; no
/// sequence, type, edge or other index. The same facts' hashes and canonical bytes
/// ([`floor_rows`]) written as the floor writes them ([`save_chunks`]) by `COPY ...
/// BINARY`. If this is short of a target against the peer, no schema meets it here.
fn least_floor(n: usize) -> Json {
    use postgres::types::Type;
    let db = database();
    let mut c = postgres::Client::connect(&db, postgres::NoTls).unwrap();
    c.batch_execute("CREATE TABLE fact (hash bytea PRIMARY KEY, bytes bytea NOT NULL)")
        .unwrap();
    let (_, all) = facts(n);
    let rows = floor_rows(&all);
    let rate = save_chunks(&mut c, &rows, |tx, chunk| {
        copy_in(
            tx,
            "COPY fact (hash, bytes) FROM STDIN BINARY",
            &[Type::BYTEA, Type::BYTEA],
            chunk.iter().map(|r| [&r.1 as _, &r.3 as _]),
        )
    });
    json!({"how": "least", "saveFactsPerSec": rate})
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// One run of the peer in batch mode (its line of figures), or `None` if it is not to
/// run.
fn peer(n: usize) -> Option<Json> {
    let dir = std::env::var("PRECEDENT_BENCH_PEER_DIR").ok()?;
    let out = Command::new("bash")
        .arg("run.sh")
        .arg(n.to_string())
        .arg("1")
        .current_dir(&dir)
        .env("MODES", "batch")
        .env("CLIENT_QUERY", "off")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "the peer's run.sh failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let run = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<Json>(l).unwrap())
        .find(|v| v.get("run").is_some())
        .expect("the peer printed its run");
    Some(run)
}

/// The median of the figure `k` of `runs`.
fn median_of(runs: &[Json], k: &str) -> f64 {
    median(
        &runs
            .iter()
            .filter_map(|r| r[k].as_f64())
            .collect::<Vec<_>>(),
    )
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("peer_jinaga: benchmark");
        return;
    }
    let n = env_num("PRECEDENT_BENCH_PEER_N").unwrap_or(10_000) as usize;
    let runs = env_num("PRECEDENT_BENCH_PEER_RUNS").unwrap_or(3) as usize;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!(
        "peer bench: N = {n} ({} facts), {runs} runs each; load average {}",
        n + n / 2 + 1,
        load.trim()
    );
    // Ours and the peer in turn, a run of each, so that both meet the machine as it is
    // in the same minute: its speed swings by up to twice from one minute to the next
    // (docs/performance.md), and runs of one side taken together could meet a slow
    // spell the other missed.
    let mut ours_runs: Vec<Json> = Vec::new();
    let mut peer_runs: Vec<Json> = Vec::new();
    for _ in 0..runs {
        ours_runs.push(ours(n));
        peer_runs.extend(peer(n));
    }
    // The floors, in the same run: a plain client's COPY and our statement, and the
    // pending query's statement alone; the fact table alone; the least floor.
    // `PRECEDENT_BENCH_PEER_FLOORS=0` leaves them out (a quicker run while changing ours;
    // their figures then print as NaN).
    let floor_runs = if env_num("PRECEDENT_BENCH_PEER_FLOORS") == Some(0) {
        0
    } else {
        runs
    };
    let floors: Vec<Json> = (0..floor_runs)
        .flat_map(|_| {
            [
                floor(n, "copy"),
                floor(n, "insert"),
                floor(n, "fact"),
                least_floor(n),
            ]
        })
        .collect();
    let fm = |how: &str, k: &str| {
        median(
            &floors
                .iter()
                .filter(|f| f["how"] == how)
                .map(|f| f[k].as_f64().unwrap())
                .collect::<Vec<_>>(),
        )
    };
    let floor_median = json!({
        "copy": fm("copy", "saveFactsPerSec"), "insert": fm("insert", "saveFactsPerSec"),
        "fact": fm("fact", "saveFactsPerSec"), "least": fm("least", "saveFactsPerSec"),
        "readHashMs": fm("insert", "readHashMs").min(fm("copy", "readHashMs")),
    });
    println!(
        "floor (a plain client, same rows, a transaction per {CHUNK} facts): COPY {:.0} facts/s, our INSERT statement {:.0} facts/s, COPY of the fact table alone {:.0} facts/s; the pending statement alone {:.1} ms",
        floor_median["copy"].as_f64().unwrap_or(f64::NAN),
        floor_median["insert"].as_f64().unwrap_or(f64::NAN),
        floor_median["fact"].as_f64().unwrap_or(f64::NAN),
        floor_median["readHashMs"].as_f64().unwrap_or(f64::NAN)
    );
    println!(
        "least floor (one table, hash primary key and bytes, COPY, a transaction per {CHUNK} facts): {:.0} facts/s",
        floor_median["least"].as_f64().unwrap_or(f64::NAN)
    );
    let m = |k: &str| median_of(&ours_runs, k);
    let ours_median = json!({
        "saveFactsPerSec": m("saveFactsPerSec"), "readHashMs": m("readHashMs"),
        "readHashMs2": m("readHashMs2"), "readFactMs": m("readFactMs"),
        "readFactMs2": m("readFactMs2"), "serverPeakMB": m("serverPeakMB"),
    });
    println!(
        "ours: save {:.0} facts/s, pending as hashes {:.1} ms (again {:.1}), as facts {:.1} ms (again {:.1}), server peak {:.1} MB",
        m("saveFactsPerSec"),
        m("readHashMs"),
        m("readHashMs2"),
        m("readFactMs"),
        m("readFactMs2"),
        m("serverPeakMB")
    );
    let memory_met = ours_runs
        .iter()
        .all(|r| r["serverPeakMB"].as_f64().unwrap() < MEMORY_LIMIT_MB);
    let mut report = json!({"n": n, "runs": runs, "load_average": load.trim(),
                            "ours": {"median": ours_median, "runs": ours_runs},
                            "memory_met": memory_met,
                            "floors": {"median": floor_median, "runs": floors}});
    let peer_median = |k: &str| median_of(&peer_runs, k);
    let peer = (!peer_runs.is_empty()).then(|| {
        let median = json!({
            "saveFactsPerSec": peer_median("saveFactsPerSec"),
            "readHashMs": peer_median("readHashMs"), "readFactMs": peer_median("readFactMs"),
            "serverPeakRssMB": peer_median("serverPeakRssMB"),
        });
        json!({"median": median, "runs": peer_runs})
    });
    match peer {
        None => {
            println!("peer: not run (set PRECEDENT_BENCH_PEER_DIR to a copy of the peer's folder)")
        }
        Some(p) => {
            let pm = &p["median"];
            let f = |k: &str| pm[k].as_f64().unwrap_or(f64::NAN);
            let ingest = m("saveFactsPerSec") / f("saveFactsPerSec");
            let hashes = f("readHashMs") / m("readHashMs");
            let facts = f("readFactMs") / m("readFactMs");
            println!(
                "peer: save {:.0} facts/s, pending as hashes {:.1} ms, as facts {:.1} ms, server peak {} MB",
                f("saveFactsPerSec"),
                f("readHashMs"),
                f("readFactMs"),
                pm["serverPeakRssMB"]
            );
            let verdict = |x: f64, t: f64| if x >= t { "met" } else { "missed" };
            println!(
                "ours / peer: ingest {ingest:.1}x (target >= {INGEST_TARGET}x: {}), pending hashes {hashes:.1}x (target >= {QUERY_TARGET}x: {}), pending facts {facts:.1}x",
                verdict(ingest, INGEST_TARGET),
                verdict(hashes, QUERY_TARGET)
            );
            // Each run of ours against the peer's run next to it.
            let pairs: Vec<(f64, f64)> = ours_runs
                .iter()
                .zip(p["runs"].as_array().into_iter().flatten())
                .map(|(o, q)| {
                    let v = |r: &Json, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
                    (
                        v(o, "saveFactsPerSec") / v(q, "saveFactsPerSec"),
                        v(q, "readHashMs") / v(o, "readHashMs"),
                    )
                })
                .collect();
            let list = |i: usize| {
                pairs
                    .iter()
                    .map(|p| format!("{:.1}x", if i == 0 { p.0 } else { p.1 }))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            println!(
                "each run beside the peer's next to it: ingest {}; pending hashes {}",
                list(0),
                list(1)
            );
            let of_peer =
                |how: &str| floor_median[how].as_f64().unwrap_or(f64::NAN) / f("saveFactsPerSec");
            println!(
                "floors / peer (save): COPY {:.1}x, our INSERT statement {:.1}x, fact table alone {:.1}x, least floor {:.1}x",
                of_peer("copy"),
                of_peer("insert"),
                of_peer("fact"),
                of_peer("least")
            );
            report["floor_ratios"] = json!({"copy": of_peer("copy"), "insert": of_peer("insert"),
                                            "fact": of_peer("fact"), "least": of_peer("least")});
            report["peer"] = p;
            report["pair_ratios"] = json!(
                pairs
                    .iter()
                    .map(|p| json!({"ingest": p.0, "pending_hashes": p.1}))
                    .collect::<Vec<_>>()
            );
            report["ratios"] = json!({"ingest": ingest, "pending_hashes": hashes, "pending_facts": facts,
                                      "ingest_met": ingest >= INGEST_TARGET, "query_met": hashes >= QUERY_TARGET});
        }
    }
    println!(
        "memory: our server under {MEMORY_LIMIT_MB} MB in every run: {}",
        if memory_met { "met" } else { "missed" }
    );
    let out = std::env::var("PRECEDENT_BENCH_OUT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("target/bench-peer-jinaga.json")
        });
    if let Some(dir) = out.parent() {
        // `target/` is not there when CARGO_TARGET_DIR puts it elsewhere.
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(out, serde_json::to_string_pretty(&report).unwrap()).unwrap();
}

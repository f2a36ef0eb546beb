//! Sync with real processes: a `precedent sync` killed with SIGKILL mid-batch resumes
//! without loss, `precedent serve` stops cleanly on SIGTERM, the command line's `peers`
//! and `poison`, and random topologies of nodes syncing in random orders.

mod common;
mod sync_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{chain, fact};
use precedent::sync::client::{Client, ClientOptions, Direction, SyncOptions};
use precedent::{Fact, FactHash, Store};
use proptest::prelude::*;
use sync_support::*;

const BIN: &str = env!("CARGO_BIN_EXE_precedent");

fn wait_until(mut ok: impl FnMut() -> bool) -> bool {
    for _ in 0..1200 {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    false
}

/// Every fact of `from` with a release sequence up to `through` is released in `to`.
fn assert_prefix_present(from: &Store, through: i64, to: &Store) {
    from.for_each_in_range(0, through, |seq, h, _| {
        assert!(
            to.get(&h).unwrap().is_some(),
            "fact at remote seq {seq} is covered by the bookmark but not stored"
        );
        Ok(())
    })
    .unwrap();
}

#[test]
fn a_pull_killed_mid_batch_resumes_without_loss() {
    let a = Node::new();
    let base = chain(100);
    a.store().insert_batch(base.clone()).unwrap();
    a.store()
        .insert_batch(tree("A", &base[99], 30_000))
        .unwrap();
    let server = a.serve();
    let b = Node::new();
    let url = server.url();
    let total = a.store().max_seq().unwrap();
    let mut killed_mid_way = 0;
    for round in 0..3 {
        let mut child = Command::new(BIN)
            .args([
                "--db",
                b.db.to_str().unwrap(),
                "sync",
                &url,
                "--pull",
                "--batch",
                "50",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let sb = b.store();
        let start = sb.peer(&url).unwrap().map_or(0, |p| p.pull_after);
        wait_until(|| {
            sb.peer(&url)
                .unwrap()
                .is_some_and(|p| p.pull_after > start + 2000 * round)
        });
        child.kill().unwrap(); // SIGKILL
        let _ = child.wait();
        let p = sb.peer(&url).unwrap().unwrap();
        if p.pull_after < total {
            killed_mid_way += 1;
        }
        // The bookmark never runs ahead of what is committed.
        assert_prefix_present(&a.store(), p.pull_after, &sb);
        assert!(sb.verify(|_| {}).unwrap().is_clean());
    }
    assert!(
        killed_mid_way > 0,
        "the sync always finished before the kill"
    );
    // Resuming receives exactly what lies after the bookmark: nothing committed comes again.
    let bookmark = b.store().peer(&url).unwrap().unwrap().pull_after;
    let out = Command::new(BIN)
        .args([
            "--db",
            b.db.to_str().unwrap(),
            "--json",
            "sync",
            &url,
            "--pull",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pulled"].as_i64(), Some(total - bookmark));
    assert_eq!(report["inserted"].as_i64(), Some(total - bookmark));
    assert_converged(&[&a, &b]);
}

#[test]
fn a_push_killed_mid_batch_resumes_without_loss() {
    let a = Node::new();
    let b = Node::new();
    let base = chain(50);
    b.store().insert_batch(base.clone()).unwrap();
    b.store()
        .insert_batch(tree("B", &base[49], 20_000))
        .unwrap();
    let server = a.serve();
    let url = server.url();
    let mut child = Command::new(BIN)
        .args([
            "--db",
            b.db.to_str().unwrap(),
            "sync",
            &url,
            "--push",
            "--batch",
            "50",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sb = b.store();
    wait_until(|| sb.peer(&url).unwrap().is_some_and(|p| p.push_after > 1000));
    child.kill().unwrap();
    let _ = child.wait();
    let p = sb.peer(&url).unwrap().unwrap();
    assert_prefix_present(&sb, p.push_after, &a.store());
    let status = Command::new(BIN)
        .args(["--db", b.db.to_str().unwrap(), "sync", &url, "--push"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    assert_converged(&[&a, &b]);
}

#[test]
fn serve_stops_cleanly_on_sigterm_and_the_cli_reports_peers_and_poison() {
    let a = Node::new();
    a.store().insert_batch(chain(10)).unwrap();
    let mut child = Command::new(BIN)
        .args([
            "--db",
            a.db.to_str().unwrap(),
            "serve",
            "--listen",
            "127.0.0.1:0",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    let b = Node::new();
    let out = Command::new(BIN)
        .args(["--db", b.db.to_str().unwrap(), "--json", "sync", &url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pulled"], 10);
    let out = Command::new(BIN)
        .args(["--db", b.db.to_str().unwrap(), "--json", "peers"])
        .output()
        .unwrap();
    let peer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (peer["url"].as_str(), peer["lag"].as_i64()),
        (Some(&url[..]), Some(0))
    );
    // Poison pushed to the server shows in `poison list` and `poison show`.
    let addr = url.strip_prefix("http://").unwrap().parse().unwrap();
    let (status, _) = raw_http(addr, "POST", "/v1/facts", CBOR, &[0x82, 0x01, 0x02], None);
    assert_eq!(status, 200);
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert!(status.success(), "{status:?} {rest}");
    assert!(rest.contains("stopped"), "{rest}");
    let out = Command::new(BIN)
        .args(["--db", a.db.to_str().unwrap(), "poison", "list"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("anonymous") && text.contains("a fact is an array"),
        "{text}"
    );
    let out = Command::new(BIN)
        .args(["--db", a.db.to_str().unwrap(), "poison", "show", "1"])
        .output()
        .unwrap();
    assert!(String::from_utf8(out.stdout).unwrap().contains("820102"));
    let out = Command::new(BIN)
        .args(["--db", a.db.to_str().unwrap(), "poison", "show", "99"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    // A peer that does not answer: exit code 5 and the error recorded.
    drop(std::net::TcpListener::bind(addr)); // the port is free again
    let out = Command::new(BIN)
        .args(["--db", b.db.to_str().unwrap(), "sync", &url])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sb = b.store();
    assert!(sb.peer(&url).unwrap().unwrap().last_error.is_some());
}

/// One step of a random scenario.
#[derive(Clone, Debug)]
enum Step {
    /// Node `node` writes `n` new facts below what it has.
    Write { node: usize, n: usize, seed: u64 },
    /// Node `node` syncs with node `peer`'s server in `dir`.
    Sync { node: usize, peer: usize, dir: u8 },
}

fn step(nodes: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..nodes, 1..40usize, any::<u64>()).prop_map(|(node, n, seed)| Step::Write {
            node,
            n,
            seed
        }),
        (0..nodes, 0..nodes, 0..3u8).prop_map(|(node, peer, dir)| Step::Sync { node, peer, dir }),
    ]
}

fn scenario() -> impl Strategy<Value = (usize, Vec<Step>)> {
    (2..=4usize).prop_flat_map(|n| (Just(n), proptest::collection::vec(step(n), 1..14)))
}

/// New facts at `store`, each naming up to three facts it already has (or none).
fn write_random(store: &mut Store, n: usize, seed: u64, tag: usize) {
    let mut known: Vec<FactHash> = Vec::new();
    store
        .for_each_released(0, |_, h, _| {
            known.push(h);
            Ok(())
        })
        .unwrap();
    let mut x = seed | 1;
    let mut new: Vec<Fact> = Vec::new();
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut preds = Vec::new();
        for k in 0..(x % 4) {
            let pool = known.len() + new.len();
            if pool == 0 {
                break;
            }
            let j = ((x >> (8 * (k + 1))) as usize) % pool;
            preds.push(if j < known.len() {
                known[j]
            } else {
                new[j - known.len()].hash()
            });
        }
        new.push(fact(
            &format!("N{tag}"),
            (seed as i64).wrapping_add(i as i64),
            &preds,
        ));
    }
    // Any order: children may be given before their parents.
    new.reverse();
    store.insert_batch(new).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, .. ProptestConfig::default() })]

    #[test]
    fn random_topologies_converge((n, steps) in scenario()) {
        let nodes: Vec<Node> = (0..n).map(|_| Node::new()).collect();
        let servers: Vec<_> = nodes.iter().map(|x| x.serve()).collect();
        for s in &steps {
            match *s {
                Step::Write { node, n, seed } => write_random(&mut nodes[node].store(), n, seed, node),
                Step::Sync { node, peer, dir } => {
                    if node == peer {
                        continue;
                    }
                    let client = Client::new(&servers[peer].url(), ClientOptions {
                        batch: 7,
                        ..ClientOptions::default()
                    }).unwrap();
                    let direction = [Direction::Both, Direction::Pull, Direction::Push][dir as usize];
                    let opts = SyncOptions { direction, ..SyncOptions::default() };
                    client.sync(&nodes[node].store(), &opts, &mut |_| {}).unwrap();
                    common::assert_topological(&nodes[node].store());
                }
            }
        }
        // Everyone syncs with node 0, twice round, so node 0 has everything and passes it on.
        for _ in 0..2 {
            for x in &nodes[1..] {
                sync_pair(x, &servers[0].url());
            }
        }
        let refs: Vec<&Node> = nodes.iter().collect();
        assert_converged(&refs);
    }
}

/// `serve --sqlite-memory MIB` bounds SQLite's page caches over every connection of the
/// server: after clients pull a database of many MiB whole, SQLite holds about the limit,
/// where without one it keeps the pages it read.
#[test]
fn serve_keeps_sqlite_memory_near_its_limit() {
    let a = Node::new();
    let base = chain(100);
    a.store().insert_batch(base.clone()).unwrap();
    a.store()
        .insert_batch(tree("A", &base[99], 100_000))
        .unwrap();
    let held_after_pulls = |limit: &str| -> u64 {
        let server = common::process::Server::start_with(
            &a.db,
            &["--listen", "127.0.0.1:0", "--sqlite-memory", limit],
        );
        // Two clients at once, so the server reads on more than one connection.
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let b = Node::new();
                    sync_pair(&b, &server.url);
                    assert_eq!(b.store().max_seq().unwrap(), 100_100);
                });
            }
        });
        let addr = server.url.strip_prefix("http://").unwrap().parse().unwrap();
        let (status, body) = raw_http(addr, "GET", "/metrics", "", b"", None);
        assert_eq!(status, 200);
        String::from_utf8(body)
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("precedent_sqlite_memory_bytes "))
            .and_then(|v| v.parse().ok())
            .expect("precedent_sqlite_memory_bytes")
    };
    let unlimited = held_after_pulls("0");
    let limited = held_after_pulls("2");
    // The database is large enough for the limit to matter...
    assert!(
        unlimited > 12 << 20,
        "without a limit SQLite held {unlimited} bytes"
    );
    // ...and with it SQLite holds about the limit (its schemas and statements beside it).
    assert!(
        limited < 4 << 20,
        "with --sqlite-memory 2 SQLite held {limited} bytes"
    );
}

//! Crash test of the worker (issue 4, point 10): `precedent work` is killed with SIGKILL
//! at random moments, many times, and restarted. Its handler writes one application row
//! per input in the completion transaction: an `Effect` fact naming the input and carrying
//! the attempt number, so a second application of the same input would be a second,
//! different fact. At the end every input has exactly one Effect, nothing is pending and
//! `precedent verify` passes.
//!
//! The bug this prevents: an effect stored outside the completion transaction (or a
//! completion accepted on a lost lease) shows up here as two Effects for one input, or as
//! an input completed without its Effect.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use precedent::{Fact, FactHash, json};
use rand::{RngExt, SeedableRng};
use serde_json::Value as Json;

const BIN: &str = env!("CARGO_BIN_EXE_precedent");
const INPUTS: usize = 1_500;
const KILLS: usize = 50;

/// A handler that prints an `Effect` fact naming its input and carrying the attempt.
const EFFECT: &str = r#"printf '{"type":"Effect","fields":{"attempt":%s},"predecessors":{"input":"%s"}}\n' "$PRECEDENT_ATTEMPT" "$PRECEDENT_INPUT_HASH""#;

fn cmd(db: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--db").arg(db).args(args).env_remove("PRECEDENT_DB");
    c
}

fn run(db: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = cmd(db, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn queue_stats(db: &Path) -> Json {
    let out = run(db, &["--json", "queue", "stats", "ship"], b"");
    serde_json::from_slice::<Json>(&out.stdout).unwrap()[0].clone()
}

/// Orders in chains of five (each after the previous), so causal release is crossed by
/// the kills as well.
fn inputs() -> Vec<Fact> {
    let shop = Fact::builder("Shop")
        .field("name", "corner")
        .build()
        .unwrap();
    let mut facts = vec![shop.clone()];
    for i in 0..INPUTS {
        let mut b = Fact::builder("Shop.Order")
            .field("id", i as i64)
            .predecessor("shop", shop.hash());
        if i % 5 != 0 {
            b = b.predecessor("after", facts[i].hash());
        }
        facts.push(b.build().unwrap());
    }
    facts
}

#[test]
fn sigkilled_workers_apply_each_input_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let db: PathBuf = dir.path().join("crash.db");
    run(&db, &["init"], b"");
    let facts = inputs();
    let text: String = facts
        .iter()
        .map(|f| json::to_json(f).to_string() + "\n")
        .collect();
    run(&db, &["import", "-"], text.as_bytes());
    // A short lease so inputs stranded by a kill come back quickly; a budget no number
    // of kills can exhaust, so nothing is dead-lettered.
    run(
        &db,
        &[
            "queue",
            "add",
            "ship",
            "--input",
            "Shop.Order",
            "--done-by",
            "Shop.Shipped.order",
            "--lease",
            "400ms",
            "--max-attempts",
            "100000",
            "--max-age",
            "1d",
            "--backoff-base",
            "1ms",
            "--backoff-cap",
            "10ms",
        ],
        b"",
    );

    let mut rng = rand::rngs::StdRng::seed_from_u64(0x0005_eed4);
    let started = Instant::now();
    let mut kills_mid_work = 0;
    for _ in 0..KILLS {
        let mut child = cmd(
            &db,
            &[
                "work", "ship", "-j", "2", "--batch", "4", "--poll", "20ms", "--quiet", "--", "sh",
                "-c", EFFECT,
            ],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(5..80)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let s = queue_stats(&db);
        if s["completed"].as_u64().unwrap() < INPUTS as u64 {
            kills_mid_work += 1;
        }
    }
    // Restart until everything is done: leases stranded by the last kill expire first.
    let mut rounds = 0;
    loop {
        let s = queue_stats(&db);
        let pending: u64 = ["ready", "leased", "delayed", "blocked", "dead", "poison"]
            .iter()
            .map(|k| s[k].as_u64().unwrap())
            .sum();
        if pending == 0 {
            break;
        }
        rounds += 1;
        assert!(rounds < 200, "still pending after {rounds} rounds: {s}");
        run(
            &db,
            &[
                "work", "ship", "-j", "2", "--once", "--quiet", "--", "sh", "-c", EFFECT,
            ],
            b"",
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "{KILLS} SIGKILLs ({kills_mid_work} with work pending), {rounds} restarts to drain, {:?}",
        started.elapsed()
    );
    assert!(
        kills_mid_work >= KILLS / 2,
        "most kills must land while work is pending ({kills_mid_work} of {KILLS})"
    );

    // Exactly one Effect and one completion per input.
    let exported = run(&db, &["export"], b"");
    let mut effects: BTreeMap<String, usize> = BTreeMap::new();
    let mut shipped: BTreeMap<String, usize> = BTreeMap::new();
    for line in String::from_utf8(exported.stdout).unwrap().lines() {
        let f: Json = serde_json::from_str(line).unwrap();
        match f["type"].as_str().unwrap() {
            "Effect" => {
                *effects
                    .entry(f["predecessors"]["input"].as_str().unwrap().to_string())
                    .or_default() += 1
            }
            "Shop.Shipped" => {
                *shipped
                    .entry(f["predecessors"]["order"].as_str().unwrap().to_string())
                    .or_default() += 1
            }
            "precedent.DeadLetter" | "precedent.Poison" => panic!("no input may fail: {line}"),
            _ => {}
        }
    }
    let orders: Vec<FactHash> = facts[1..].iter().map(Fact::hash).collect();
    for h in &orders {
        let h = h.to_string();
        assert_eq!(effects.get(&h), Some(&1), "effects of {h}");
        assert_eq!(shipped.get(&h), Some(&1), "completions of {h}");
    }
    assert_eq!(effects.len(), INPUTS);
    let s = queue_stats(&db);
    assert_eq!(s["completed"], INPUTS as u64, "{s}");
    let items = run(&db, &["queue", "items", "ship"], b"");
    assert!(items.stdout.is_empty(), "nothing pending");
    run(&db, &["verify"], b"");
}

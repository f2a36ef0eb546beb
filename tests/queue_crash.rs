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

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::bin::{cmd, run_ok as run};
use common::process::quiet;
use common::queue::{self, EFFECT};
use precedent::{Fact, FactHash};
use rand::{RngExt, SeedableRng};
use serde_json::Value as Json;

const INPUTS: usize = 1_500;
const KILLS: usize = 50;

#[test]
fn sigkilled_workers_apply_each_input_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    run(&db, &["init"], b"");
    // Orders in chains of five (each after the previous), so causal release is crossed by
    // the kills as well.
    let facts = queue::orders(INPUTS, Some(5));
    queue::import(&db, &facts);
    // A short lease so inputs stranded by a kill come back quickly; a budget no number
    // of kills can exhaust, so nothing is dead-lettered.
    queue::declare_ship(&db, "400ms", "100000", "10ms");

    let mut rng = rand::rngs::StdRng::seed_from_u64(0x0005_eed4);
    let started = Instant::now();
    let mut kills_mid_work = 0;
    for _ in 0..KILLS {
        let mut child = quiet(&mut cmd(
            &db,
            &[
                "work", "ship", "-j", "2", "--batch", "4", "--poll", "20ms", "--quiet", "--", "sh",
                "-c", EFFECT,
            ],
        ))
        .spawn()
        .unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(5..80)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let s = queue::stats(&db);
        if s["completed"].as_u64().unwrap() < INPUTS as u64 {
            kills_mid_work += 1;
        }
    }
    // Restart until everything is done: leases stranded by the last kill expire first.
    let rounds = queue::drain(
        &db,
        EFFECT,
        &["ready", "leased", "delayed", "blocked", "dead", "poison"],
        Duration::from_millis(50),
    );
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
    let s = queue::stats(&db);
    assert_eq!(s["completed"], INPUTS as u64, "{s}");
    let items = run(&db, &["queue", "items", "ship"], b"");
    assert!(items.stdout.is_empty(), "nothing pending");
    run(&db, &["verify"], b"");
}

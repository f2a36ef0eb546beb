//! `precedent work` throughput, in one run on SQLite: a process per input, a long-running
//! handler (`--process`), and the library's batched claim+complete as the floor.
//!
//! `cargo bench --bench work` prints one JSON line per phase (with the load average) and
//! the ratios. Every phase works a fresh database of orders of one shop, the `ship` queue
//! over them, each input completed by a `Shop.Shipped` fact:
//! - `per-input`: `work ship --once --batch 10 -- sh -c 'cat >/dev/null'` (the worker
//!   writes the completion), `PRECEDENT_BENCH_WORK_SLOW_N` inputs (default 500);
//! - `process-python`: `work ship --once --process --in-flight 256 -- python3
//!   examples/handlers/ship.py`, whose answer carries the completion,
//!   `PRECEDENT_BENCH_WORK_N` inputs (default 20,000);
//! - `process-shell`: the same with `examples/handlers/ship.sh` (two `sed` per input),
//!   the slow-phase count;
//! - `library`: `Store::claim` of 256 and `Store::complete_batch` writing the completion,
//!   in this process, `PRECEDENT_BENCH_WORK_N` inputs.
//!
//! Targets (`docs/performance.md`, "Long-running handlers"): `process-python` at least 10x
//! `per-input` and at least half of `library`.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use precedent::{Fact, Store};
use serde_json::{Value as Json, json};

#[path = "common/mod.rs"]
mod common;
#[path = "common/shop.rs"]
mod shop_facts;

use common::{BIN, env_num};

/// A fresh database at `path` with `n` orders and the `ship` queue.
fn setup(path: &Path, n: usize) {
    let store = Store::open(path).unwrap();
    let shop = shop_facts::shop(0);
    let mut facts: Vec<Fact> = vec![shop.clone()];
    facts.extend((0..n).map(|i| shop_facts::order(&shop, 0, i)));
    store.insert_batch(facts).unwrap();
    store.declare_queue(&shop_facts::spec()).unwrap();
}

/// Runs `precedent work ship --once` with `args` on a fresh database of `n` orders and
/// checks that every input was completed.
fn cli_phase(dir: &Path, name: &str, n: usize, args: &[&str]) -> Json {
    let db = dir.join(format!("{name}.db"));
    setup(&db, n);
    let start = Instant::now();
    let out = Command::new(BIN)
        .arg("--db")
        .arg(&db)
        .args(["--quiet", "work", "ship", "--once"])
        .args(args)
        .output()
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats = Store::open(&db).unwrap().queue_stats("ship").unwrap();
    assert_eq!(stats.completed, n as u64, "{name}: every input completed");
    phase(name, n, secs)
}

/// The floor: claim and complete in batches through the library, in this process.
fn library_phase(dir: &Path, n: usize) -> Json {
    let db = dir.join("library.db");
    setup(&db, n);
    let store = Store::open(&db).unwrap();
    let start = Instant::now();
    loop {
        let leases = store.claim("ship", 256).unwrap();
        if leases.is_empty() {
            break;
        }
        let results = store
            .complete_batch(&leases, |w, lease| {
                w.insert(&shop_facts::shipped(&lease.input.hash()))?;
                Ok(())
            })
            .unwrap();
        assert!(results.iter().all(Result::is_ok));
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(store.queue_stats("ship").unwrap().completed, n as u64);
    phase("library", n, secs)
}

fn phase(name: &str, n: usize, secs: f64) -> Json {
    let r = json!({
        "phase": name,
        "inputs": n,
        "secs": (secs * 1000.0).round() / 1000.0,
        "per_sec": (n as f64 / secs).round(),
        "load_average": common::load_average(),
    });
    eprintln!("{r}");
    r
}

fn main() {
    let n = env_num("PRECEDENT_BENCH_WORK_N").unwrap_or(20_000) as usize;
    let slow = env_num("PRECEDENT_BENCH_WORK_SLOW_N").unwrap_or(500) as usize;
    let dir = tempfile::tempdir().unwrap();
    let handlers = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/handlers");
    let python = handlers.join("ship.py").display().to_string();
    let shell = handlers.join("ship.sh").display().to_string();
    eprintln!("work bench: N = {n}, slow N = {slow}");
    let per_input = cli_phase(
        dir.path(),
        "per-input",
        slow,
        &["--batch", "10", "--", "sh", "-c", "cat >/dev/null"],
    );
    let process = cli_phase(
        dir.path(),
        "process-python",
        n,
        &["--process", "--in-flight", "256", "--", "python3", &python],
    );
    let shell = cli_phase(
        dir.path(),
        "process-shell",
        slow,
        &["--process", "--in-flight", "256", "--", "sh", &shell],
    );
    let library = library_phase(dir.path(), n);
    let rate = |r: &Json| r["per_sec"].as_f64().unwrap();
    let ratios = json!({
        "process_python_over_per_input": (rate(&process) / rate(&per_input) * 10.0).round() / 10.0,
        "process_shell_over_per_input": (rate(&shell) / rate(&per_input) * 10.0).round() / 10.0,
        "process_python_over_library": (rate(&process) / rate(&library) * 100.0).round() / 100.0,
        "load_average": common::load_average(),
    });
    eprintln!("{ratios}");
}

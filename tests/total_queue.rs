//! The total-queue checker (docs/robustness.md, "Total-queue checker"): three SQLite
//! nodes and a PostgreSQL hub served by two `precedent serve` processes; unique inputs
//! imported on every node (synced to the hub through faulty proxies) and on the hub;
//! local and remote workers, per-input and `--process` handlers, whose effect is a fact
//! written in the completion's transaction. Faults on a seeded schedule: SIGKILL and
//! SIGSTOP/SIGCONT of servers, syncers and workers, sync links cut and healed, clocks
//! skewed against the leases, PostgreSQL restarted. Then heal, drain, and tally: 0 lost
//! and 0 doubled is the figure to hold.
//!
//! `PRECEDENT_CHECKER_RUNS=N` runs N runs (default 2); `PRECEDENT_CHECKER_SEED=S`
//! starts at seed S (a failing run prints its seed and schedule);
//! `PRECEDENT_CHECKER_FAULTS_MS` is the fault phase of each run (default 6000).

mod checker;
mod common;
mod sync_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use checker::inputs::{Ledger, Producer};
use checker::tally::{self, Tally};
use checker::{NODES, Topology};
use common::pg;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?}: not a whole number")),
        Err(_) => default,
    }
}

/// One run: the topology up, producers and faults, heal, drain, tally.
fn one_run(
    cluster: &'static pg::Cluster,
    seed: u64,
    span: Duration,
    by_worker: &mut BTreeMap<String, usize>,
) -> Tally {
    let mut topo = Topology::new(cluster.db(), seed);
    let schedule = checker::draw(&topo, seed, span);
    topo.supervise();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let batches = 16;
    let every = span / (batches as u32 + 2);
    let mut producers: Vec<Producer> = (0..NODES)
        .map(|i| Producer {
            db: topo.nodes[i].clone(),
            prefix: format!("n{i}"),
            batches,
            per_batch: 5,
            every,
            seed: seed ^ (i as u64 + 11),
        })
        .collect();
    producers.push(Producer {
        db: topo.hub_path(),
        prefix: "hub".into(),
        batches,
        per_batch: 5,
        every,
        seed: seed ^ 7,
    });
    let threads: Vec<_> = producers
        .into_iter()
        .map(|p| p.spawn(topo.dir.path(), ledger.clone()))
        .collect();
    let failed = |topo: &Topology, what: &str| -> String {
        format!(
            "{what}\n{schedule}\nlogs in {}:\n{}",
            topo.dir.path().display(),
            topo.logs()
        )
    };
    topo.run_faults(cluster, &schedule, span);
    for t in threads {
        t.join().unwrap();
    }
    let drained = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        topo.drain(Duration::from_secs(120));
    }));
    if let Err(e) = drained {
        let why = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        // Keep the folder with the logs and the node databases.
        let kept = topo.dir.path().to_path_buf();
        std::mem::forget(std::mem::replace(
            &mut topo.dir,
            tempfile::tempdir().unwrap(),
        ));
        panic!(
            "{}",
            failed(&topo, &format!("{why} (kept {})", kept.display()))
        );
    }
    topo.roles.clear();
    let hub = tally::read(&topo.hub_path());
    let nodes: Vec<_> = topo.nodes.iter().map(|n| tally::read(n)).collect();
    let t = Tally::judge(&ledger.lock().unwrap(), &hub, &nodes);
    for (w, n) in &hub.by_worker {
        *by_worker.entry(w.clone()).or_default() += n;
    }
    let [kills, pauses, cuts, skews, pg] = schedule.counts();
    eprintln!(
        "seed={seed}: {t} | faults: {kills} kills, {pauses} pauses, {cuts} cuts, {skews} \
         skews, {pg} PostgreSQL restarts"
    );
    assert!(
        t.lost == 0 && t.doubled == 0 && t.unexpected == 0,
        "{}",
        failed(&topo, &format!("seed={seed}: {t}"))
    );
    t
}

#[test]
fn no_acknowledged_input_is_lost_and_no_effect_doubled_under_faults() {
    let Some(cluster) = pg::private_cluster() else {
        return;
    };
    let _only_us = pg::private_lock();
    cluster.start_again();
    let runs = env_u64("PRECEDENT_CHECKER_RUNS", 2);
    let first = env_u64("PRECEDENT_CHECKER_SEED", fastrand::u64(..));
    let span = Duration::from_millis(env_u64("PRECEDENT_CHECKER_FAULTS_MS", 6_000));
    let started = Instant::now();
    let mut total = Tally::default();
    let mut by_worker = BTreeMap::new();
    for run in 0..runs {
        let seed = first.wrapping_add(run);
        let t = one_run(cluster, seed, span, &mut by_worker);
        total.add(&t);
        eprintln!("run {}/{runs} done at {:?}", run + 1, started.elapsed());
    }
    eprintln!(
        "total-queue checker: {runs} runs from seed={first} in {:.0?}: {total}",
        started.elapsed()
    );
    eprintln!("completions by worker: {by_worker:?}");
    // The topology works as drawn: every worker, local and remote, per-input and
    // long-running, completed inputs.
    for w in [
        "work-local",
        "work-local-process",
        "work-remote-a-process",
        "work-remote-b",
    ] {
        assert!(
            by_worker.get(w).is_some_and(|&n| n > 0),
            "{w} completed nothing: {by_worker:?}"
        );
    }
}

/// The clock-skew hook: `PRECEDENT_CLOCK_OFFSET_MS` moves the process's now (an input
/// not before an hour from now is claimed by a worker two hours ahead, by no other), and
/// a value that is not an integer is refused with a one-line error.
#[test]
fn a_clock_offset_moves_the_now_of_one_process() {
    use common::bin::{cmd, code, run_ok, stderr};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("clock.db");
    run_ok(&db, &["init"], b"");
    run_ok(
        &db,
        &[checker::DECLARE, &["--not-before", "at"]].concat(),
        b"",
    );
    let hour = 3_600_000;
    let now = precedent::clock::Clock::now_ms(&precedent::clock::SystemClock);
    let input = format!(
        "{{\"type\":\"Q.In\",\"fields\":{{\"id\":\"x\",\"at\":{}}}}}\n",
        now + hour
    );
    run_ok(&db, &["import", "-"], input.as_bytes());
    let work = |offset: Option<&str>| {
        let mut c = cmd(
            &db,
            &["work", "q", "--once", "--", "sh", "-c", checker::EFFECT],
        );
        c.env("W", "clock");
        if let Some(o) = offset {
            c.env(precedent::clock::CLOCK_OFFSET_ENV, o);
        }
        c.output().unwrap()
    };
    let completed = || {
        let out = run_ok(&db, &["--json", "queue", "stats", "q"], b"");
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        s["completed"].as_u64().unwrap()
    };
    for offset in [None, Some("0"), Some("-7200000")] {
        assert_eq!(code(&work(offset)), 0);
        assert_eq!(
            completed(),
            0,
            "claimed an hour early with offset {offset:?}"
        );
    }
    let out = work(Some("soon"));
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim(),
        "error: PRECEDENT_CLOCK_OFFSET_MS=\"soon\": not an integer number of milliseconds"
    );
    assert_eq!(code(&work(Some(&(2 * hour).to_string()))), 0);
    assert_eq!(completed(), 1, "a worker two hours ahead claims the input");
}

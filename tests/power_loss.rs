//! Power loss under SQLite: a store on the crash VFS (tests/power/vfs.rs) runs a random
//! workload through the public API (imports with held release, claims, completions with
//! effects, dead letters, redrives, sync pull and push with a hub on 127.0.0.1), the
//! power is cut after a random number of VFS calls (so inside commits, checkpoints and
//! syncs), and the store reopened on what the disk kept is checked against the model:
//! `verify` and SQLite's integrity check clean, the bookmarks honest, and its answers one
//! of the states docs/semantics.md allows. See docs/robustness.md, "Power loss and I/O
//! faults".
//!
//! `PRECEDENT_POWER_CUTS=2000 cargo test --release --test power_loss` runs more cuts;
//! `PRECEDENT_POWER_SEED=N` replays one run (printed as `seed=N` on failure).

mod power;

use std::sync::atomic::{AtomicU64, Ordering};

use power::{Rig, Run, check, env_count, seed_from, setup};
use precedent::store::Durability;

/// Operations per run at most: the cut usually comes first.
const OPS: usize = 40;

/// Prints the seed of a run that panics.
struct Replay(u64);

impl Drop for Replay {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "seed={} (replay with PRECEDENT_POWER_SEED={})",
                self.0, self.0
            );
        }
    }
}

/// VFS calls a whole run makes, measured once: cuts are drawn below it.
static CALLS: AtomicU64 = AtomicU64::new(0);

fn calls_per_run() -> u64 {
    let known = CALLS.load(Ordering::Relaxed);
    if known > 0 {
        return known;
    }
    let mut total = 0;
    for seed in 0..3 {
        let mut rig = Rig::new(seed, Durability::Full);
        let store = rig.open().unwrap();
        setup(&store).unwrap();
        let mut run = Run::new(seed, &rig);
        for _ in 0..OPS {
            let op = run.choose();
            assert!(run.step(&store, &mut rig.hub, op), "{:?}", run.failed);
        }
        let c = rig.disk.counts();
        total += c.reads + c.writes + c.syncs;
    }
    let calls = total / 3;
    CALLS.store(calls, Ordering::Relaxed);
    calls
}

/// One run: the workload, a cut, a reopen, the checks. Returns the operations that
/// returned `Ok` before the cut, how many of them the cut undid, and the cuts made.
fn one_run(seed: u64, durability: Durability) -> (usize, usize, u64) {
    let _replay = Replay(seed);
    let mut rig = Rig::new(seed, durability);
    let mut rng = fastrand::Rng::with_seed(seed ^ 0xC0FFEE);
    let cut = rng.u64(0..calls_per_run() * 11 / 10);
    let cut = std::env::var("PRECEDENT_POWER_CUT_AT").map_or(cut, |c| c.parse().unwrap());
    rig.disk.cut_after(cut);
    let mut run = Run::new(seed, &rig);
    let mut ready = false;
    if let Ok(store) = rig.open() {
        ready = setup(&store).is_ok();
        if ready {
            for _ in 0..OPS {
                let op = run.choose();
                if !run.step(&store, &mut rig.hub, op) {
                    break;
                }
            }
        }
        if !rig.disk.is_frozen() {
            // A failure that no cut explains is a bug.
            assert!(
                run.failed.is_none(),
                "an error with the power on: {:?}",
                run.failed
            );
            if ready {
                rig.disk.cut_now();
            }
        }
    }
    assert!(
        rig.disk.is_frozen(),
        "open or setup failed with the power on"
    );
    rig.disk.reboot();
    if rng.u8(..3) == 0 {
        // Once in three runs the power goes again while the store recovers (reads the
        // WAL, rebuilds its index, checkpoints) and answers its first reads.
        rig.disk.cut_after(rng.u64(0..400));
        if let Ok(store) = rig.open() {
            let _ = store.verify(|_| {});
        }
        if !rig.disk.is_frozen() {
            rig.disk.cut_now();
        }
        rig.disk.reboot();
    }
    let cuts = rig.disk.counts().cuts;
    let store = rig
        .open()
        .unwrap_or_else(|e| panic!("reopening after a cut: {e}"));
    let declared = store.queue("ship").is_ok();
    if !declared || !ready {
        // Setup was cut (or, with Normal, lost): it runs again, as an application would.
        setup(&store).unwrap_or_else(|e| panic!("setup again after a cut: {e}"));
    }
    let n = run.done.len();
    let allowed = match durability {
        _ if !declared || !ready => {
            assert!(
                !ready || durability == Durability::Normal,
                "the queue declared before the cut is gone"
            );
            0..=0
        }
        Durability::Full => n..=n + 1,
        Durability::Normal => 0..=n + 1,
    };
    let matched = check(&store, &rig.db, &run, allowed.clone(), &rig.hub, true);
    if let Err(e) = &matched {
        if std::env::var("PRECEDENT_POWER_DEBUG").is_ok() {
            for (i, op) in run.done.iter().enumerate() {
                let d = match op {
                    power::Op::Import(b) => format!("Import {}", b.len()),
                    o => format!("{o:?}"),
                };
                eprintln!("op {i}: {d}");
            }
            for it in store.queue_items("ship", None, 1000).unwrap() {
                if it.state != precedent::queue::ItemState::Ready {
                    eprintln!("{it:?}");
                }
            }
            eprintln!("{:?}", store.queue_stats("ship").unwrap());
        }
        panic!(
            "after a cut at call {cut} ({} operations done, failed: {:?}), allowed {allowed:?}: {e}",
            n,
            run.failed.as_ref().map(|f| (&f.0, &f.2))
        );
    }
    (n, n.saturating_sub(matched.unwrap()), cuts)
}

fn runs(durability: Durability, default: u64) {
    if let Some(seed) = seed_from("PRECEDENT_POWER_SEED") {
        one_run(seed, durability);
        return;
    }
    let count = env_count("PRECEDENT_POWER_CUTS", default);
    let base = fastrand::u64(..);
    let (mut ops, mut undone, mut runs_undone) = (0, 0, 0);
    let mut cuts = 0;
    for i in 0..count {
        let (n, lost, c) = one_run(base.wrapping_add(i), durability);
        cuts += c;
        ops += n;
        undone += lost;
        runs_undone += usize::from(lost > 0);
    }
    eprintln!(
        "{count} runs, {} cuts with {durability:?} (about {} VFS calls a run, {:.1} operations acknowledged \
         before a cut on average; {undone} acknowledged operations undone, in {runs_undone} runs): all checks passed",
        cuts,
        calls_per_run(),
        ops as f64 / count as f64
    );
}

#[test]
fn full_durability_keeps_every_acknowledged_transaction_across_power_cuts() {
    runs(Durability::Full, 200);
}

#[test]
fn normal_durability_loses_at_most_a_suffix_of_commits_across_power_cuts() {
    runs(Durability::Normal, 100);
}

//! I/O faults under SQLite: the crash VFS (tests/power/vfs.rs) fails the Nth read, the
//! Nth write or the Nth sync, once (transient) or from then on (persistent), for N = 1,
//! 2, ... until a run injects no fault, across a workload that opens a new store
//! (migrations), writes on every path, cuts the power and reopens it (WAL recovery) and
//! writes again. Every fault must come out as an `Err`, never a panic or a wrong answer
//! (answers that return are checked against the model as they come); after the fault is
//! cleared and the store reopened, `verify` and SQLite's integrity check are clean and
//! nothing that returned `Ok` is lost. See docs/robustness.md, "Power loss and I/O faults".
//!
//! `PRECEDENT_IO_FAULT_STRIDE=1 cargo test --release --test io_faults` tries every N (the
//! default steps N by a stride, to stay quick); `PRECEDENT_IO_FAULT=read:17` (or `read:17:always`) replays
//! one run.

mod power;

use power::{Fault, FaultKind, Rig, Run, check, env_count, setup};
use precedent::Store;
use precedent::store::Durability;

const SEED: u64 = 13;
/// Operations before the cut, and after the reopen.
const OPS: usize = 12;

/// How one run ended.
struct Outcome {
    /// Faults the VFS injected.
    injected: u64,
    /// Errors the API returned.
    errors: u64,
}

/// Opens the store, once more if the first try met the fault.
fn open(rig: &Rig, run: &mut Run, errors: &mut u64, persistent: bool) -> Option<Store> {
    for _ in 0..2 {
        match rig.open().and_then(|s| setup(&s).map(|()| s)) {
            Ok(s) => return Some(s),
            Err(_) if !persistent => *errors += 1,
            Err(_) => {
                *errors += 1;
                return None;
            }
        }
    }
    let _ = run;
    panic!("a transient fault failed two opens in a row");
}

/// Runs `n` operations; after a transient fault the store's answers say whether the
/// failed one committed. Returns false if a persistent fault stopped the workload.
fn ops(
    rig: &mut Rig,
    run: &mut Run,
    store: &Store,
    n: usize,
    errors: &mut u64,
    persistent: bool,
) -> bool {
    for _ in 0..n {
        let op = run.choose();
        if !run.step(store, &mut rig.hub, op) {
            *errors += 1;
            if persistent {
                return false;
            }
            if !recovered(store, rig, run, errors, persistent) {
                return false;
            }
        }
    }
    true
}

/// Checks the store just recovered from the WAL: it holds what had returned `Ok`, and
/// the operation in flight at the cut either whole or not at all (the model follows).
/// A read the fault fails is an error like any other. Returns false if a persistent
/// fault stopped it.
fn recovered(store: &Store, rig: &Rig, run: &mut Run, errors: &mut u64, persistent: bool) -> bool {
    for _ in 0..2 {
        match run.resolve(store, &rig.hub) {
            Ok(()) => return true,
            Err(_) => {
                *errors += 1;
                if persistent {
                    return false;
                }
            }
        }
    }
    panic!("a transient fault failed two reads in a row");
}

fn one_run(kind: FaultKind, nth: u64, persistent: bool) -> Outcome {
    let mut rig = Rig::new(SEED, Durability::Full);
    let mut run = Run::new(SEED, &rig);
    rig.disk.set_fault(Some(Fault {
        kind,
        nth,
        persistent,
    }));
    let mut errors = 0;
    // Faults that land while a store is dropped: SQLite's checkpoint at close reports to
    // no one, and loses nothing (the WAL stays, for the next open to recover).
    let mut silent = 0;
    let mut going = false;
    if let Some(store) = open(&rig, &mut run, &mut errors, persistent) {
        going = ops(&mut rig, &mut run, &store, OPS, &mut errors, persistent);
        // The power goes while the store is open: the reopen recovers from the WAL.
        rig.disk.cut_now();
        drop(store);
    }
    if going {
        rig.disk.reboot();
        if let Some(store) = open(&rig, &mut run, &mut errors, persistent) {
            if recovered(&store, &rig, &mut run, &mut errors, persistent) {
                ops(&mut rig, &mut run, &store, OPS, &mut errors, persistent);
            }
            let before = rig.disk.counts().faults;
            drop(store);
            silent += rig.disk.counts().faults - before;
        }
    }
    let injected = rig.disk.counts().faults;
    rig.disk.set_fault(None);
    rig.disk.reboot();
    let store = rig
        .open()
        .unwrap_or_else(|e| panic!("reopening after {kind:?} #{nth} failed: {e}"));
    // As every open here does (the fault may have stopped the first one's).
    setup(&store).unwrap_or_else(|e| panic!("setup after {kind:?} #{nth} failed: {e}"));
    let n = run.done.len();
    if let Err(e) = check(&store, &rig.db, &run, n..=n + 1, &rig.hub, true) {
        panic!("after {kind:?} #{nth} (persistent: {persistent}) failed: {e}");
    }
    assert!(
        injected == silent || errors > 0,
        "{kind:?} #{nth}: {injected} faults injected ({silent} while closing) and no error returned"
    );
    Outcome { injected, errors }
}

fn sweep(kind: FaultKind, persistent: bool) {
    let stride = env_count("PRECEDENT_IO_FAULT_STRIDE", 0);
    let (mut runs, mut injected, mut errors) = (0, 0, 0);
    let mut nth = 1;
    loop {
        let out = one_run(kind, nth, persistent);
        runs += 1;
        injected += out.injected;
        errors += out.errors;
        if out.injected == 0 {
            break;
        }
        // By default a stride that grows with N: every early call, a sample of later ones.
        nth += if stride > 0 { stride } else { 1 + nth / 8 };
    }
    eprintln!(
        "{kind:?} faults (persistent: {persistent}): {runs} runs, N up to {nth}, {injected} faults injected, {errors} errors returned, all checks passed"
    );
}

fn replay() -> bool {
    let Ok(spec) = std::env::var("PRECEDENT_IO_FAULT") else {
        return false;
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let kind = match parts[0] {
        "read" => FaultKind::Read,
        "write" => FaultKind::Write,
        "sync" => FaultKind::Sync,
        other => panic!("PRECEDENT_IO_FAULT: unknown kind {other}"),
    };
    one_run(
        kind,
        parts[1].parse().unwrap(),
        parts.get(2) == Some(&"always"),
    );
    true
}

#[test]
fn every_failed_write_surfaces_as_an_error_and_loses_nothing_committed() {
    if replay() {
        return;
    }
    sweep(FaultKind::Write, false);
    sweep(FaultKind::Write, true);
}

#[test]
fn every_failed_sync_surfaces_as_an_error_and_loses_nothing_committed() {
    if replay() {
        return;
    }
    sweep(FaultKind::Sync, false);
    sweep(FaultKind::Sync, true);
}

#[test]
fn every_failed_read_surfaces_as_an_error_and_loses_nothing_committed() {
    if replay() {
        return;
    }
    sweep(FaultKind::Read, false);
    sweep(FaultKind::Read, true);
}

//! Crash loops over every writing path (issue 6, point 2): import (with held facts
//! released as their ancestors arrive), claim/complete, dead-lettering, sync pull and sync
//! push. A child `precedent` process is killed with SIGKILL at a random moment (seeded),
//! then the database is checked before the next restart:
//!
//! - `precedent verify` exits 0 (nothing half-written: every fact, edge and held record
//!   is whole);
//! - every fact released before is still released (nothing acknowledged is lost);
//! - release order is topological (every fact after all its predecessors);
//! - no queue input has two effects, two completions or two dead letters, and no input is
//!   both completed and dead-lettered;
//! - for sync, a bookmark never runs ahead of what is committed.
//!
//! When a database has taken in everything, the loop starts again on a fresh one, so kills
//! keep landing while there is writing to do. Only kills that landed while the child was
//! still running with work left count; each path asserts its count.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::bin::{cmd, run_ok as run};
use common::crash::{
    PENDING, assert_prefix_present, chains, check_store, queue_db, queue_outcomes, seeded_db,
};
use common::process::{Server, kill, quiet, random_pause, spawn_and_kill};
use common::queue::{self, EFFECT};
use precedent::{Fact, FactHash, Store, json};
use rand::SeedableRng;
use rand::rngs::StdRng;
/// Kills that must land per path.
const KILLS: usize = 50;
/// Attempts per path before giving up on reaching `KILLS`.
const MAX_TRIES: usize = 400;

fn report(path: &str, kills: usize, tries: usize, epochs: usize, started: Instant) {
    eprintln!(
        "crash loop {path}: {kills} SIGKILLs landed mid-write ({tries} runs, {epochs} fresh databases), {:?}",
        started.elapsed()
    );
    assert!(
        kills >= KILLS,
        "{path}: only {kills} of {KILLS} kills landed while the child was writing"
    );
}

#[test]
fn crash_loop_import_and_held_release() {
    let dir = tempfile::tempdir().unwrap();
    // Chains listed in reverse: every fact but a chain's root arrives before its ancestors
    // and is held, then the whole chain is released when its root comes.
    let mut facts = chains("import", 12, 100);
    facts.reverse();
    let all: HashSet<FactHash> = facts.iter().map(Fact::hash).collect();
    let jsonl = dir.path().join("facts.jsonl");
    let cbor = dir.path().join("facts.cbor");
    let text: String = facts
        .iter()
        .map(|f| json::to_json(f).to_string() + "\n")
        .collect();
    std::fs::write(&jsonl, text).unwrap();
    let bytes: Vec<u8> = facts
        .iter()
        .flat_map(|f| f.canonical_bytes().to_vec())
        .collect();
    std::fs::write(&cbor, bytes).unwrap();

    // How long an undisturbed import takes: kills fall uniformly within it.
    let probe = dir.path().join("probe.db");
    run(&probe, &["init"], b"");
    let t = Instant::now();
    run(&probe, &["import", jsonl.to_str().unwrap()], b"");
    let full = t.elapsed() + Duration::from_millis(5);

    let mut rng = StdRng::seed_from_u64(0xC0A5_0001);
    let started = Instant::now();
    let (mut kills, mut tries, mut epochs) = (0, 0, 0);
    let mut db = PathBuf::new();
    let mut acked: HashSet<FactHash> = HashSet::new();
    while kills < KILLS && tries < MAX_TRIES {
        if acked.len() == all.len() || tries == 0 {
            epochs += 1;
            db = dir.path().join(format!("import-{epochs}.db"));
            run(&db, &["init"], b"");
            acked.clear();
        }
        tries += 1;
        let file = if tries % 2 == 0 { &jsonl } else { &cbor };
        let landed = spawn_and_kill(
            &mut cmd(&db, &["import", file.to_str().unwrap()]),
            &mut rng,
            full,
        );
        let released = check_store(&db, &acked);
        for f in &released {
            assert!(all.contains(&f.hash()), "a fact never imported: {f:?}");
        }
        let held = Store::open(&db).unwrap().held_count().unwrap();
        assert!(
            released.len() as u64 + held <= all.len() as u64,
            "{} released and {held} held of {}",
            released.len(),
            all.len()
        );
        if landed && released.len() < all.len() {
            kills += 1;
        }
        acked = released.iter().map(Fact::hash).collect();
    }
    // Restarting completes it: everything released, nothing held.
    run(&db, &["import", jsonl.to_str().unwrap()], b"");
    let released = check_store(&db, &acked);
    assert_eq!(released.len(), all.len());
    assert_eq!(Store::open(&db).unwrap().held_count().unwrap(), 0);
    report("import + held release", kills, tries, epochs, started);
}

#[test]
fn crash_loop_claim_and_complete() {
    const INPUTS: usize = 120;
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(0xC0A5_0002);
    let started = Instant::now();
    let (mut kills, mut tries, mut epochs) = (0, 0, 0);
    let mut db = PathBuf::new();
    let mut inputs = Vec::new();
    let mut acked: HashSet<FactHash> = HashSet::new();
    let mut completed = 0;
    while kills < KILLS && tries < MAX_TRIES {
        if tries == 0 || completed == INPUTS as u64 {
            epochs += 1;
            db = dir.path().join(format!("work-{epochs}.db"));
            inputs = queue_db(&db, INPUTS, "100000", true);
            acked.clear();
            completed = 0;
        }
        tries += 1;
        let mut c = cmd(
            &db,
            &[
                "work", "ship", "-j", "2", "--batch", "4", "--poll", "10ms", "--quiet", "--", "sh",
                "-c", EFFECT,
            ],
        );
        let landed = spawn_and_kill(&mut c, &mut rng, Duration::from_millis(120));
        let released = check_store(&db, &acked);
        queue_outcomes(&released);
        let s = queue::stats(&db);
        let now = s["completed"].as_u64().unwrap();
        assert!(
            now >= completed,
            "completions went back: {completed} -> {now}"
        );
        assert_eq!(s["dead"], 0, "{s}");
        completed = now;
        if landed && completed < INPUTS as u64 {
            kills += 1;
        }
        acked = released.iter().map(Fact::hash).collect();
    }
    // Drain the last database: stranded leases expire, then every input has one effect.
    queue::drain(&db, EFFECT, PENDING, Duration::from_millis(30));
    let released = check_store(&db, &acked);
    let outcomes = queue_outcomes(&released);
    for h in &inputs {
        assert_eq!(outcomes.get(h), Some(&(1, 1, 0)), "{h}");
    }
    report("claim/complete", kills, tries, epochs, started);
}

#[test]
fn crash_loop_dead_letter() {
    const INPUTS: usize = 120;
    // Fails every time: with a budget of two attempts each input is dead-lettered.
    const FAIL: &str = "cat >/dev/null; exit 1";
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(0xC0A5_0003);
    let started = Instant::now();
    let (mut kills, mut tries, mut epochs) = (0, 0, 0);
    let mut db = PathBuf::new();
    let mut inputs = Vec::new();
    let mut acked: HashSet<FactHash> = HashSet::new();
    let mut dead = 0;
    while kills < KILLS && tries < MAX_TRIES {
        if tries == 0 || dead == INPUTS as u64 {
            epochs += 1;
            db = dir.path().join(format!("dlq-{epochs}.db"));
            inputs = queue_db(&db, INPUTS, "2", false);
            acked.clear();
            dead = 0;
        }
        tries += 1;
        let mut c = cmd(
            &db,
            &[
                "work", "ship", "-j", "2", "--batch", "4", "--poll", "10ms", "--quiet", "--", "sh",
                "-c", FAIL,
            ],
        );
        let landed = spawn_and_kill(&mut c, &mut rng, Duration::from_millis(120));
        let released = check_store(&db, &acked);
        let outcomes = queue_outcomes(&released);
        let s = queue::stats(&db);
        let now = s["dead"].as_u64().unwrap();
        assert!(now >= dead, "dead letters went back: {dead} -> {now}");
        assert_eq!(s["completed"], 0, "{s}");
        let letters = outcomes.values().filter(|o| o.2 == 1).count() as u64;
        assert_eq!(
            letters, now,
            "dead count and DeadLetter facts disagree: {s}"
        );
        dead = now;
        if landed && dead < INPUTS as u64 {
            kills += 1;
        }
        acked = released.iter().map(Fact::hash).collect();
    }
    queue::drain(&db, FAIL, PENDING, Duration::from_millis(30));
    let released = check_store(&db, &acked);
    let outcomes = queue_outcomes(&released);
    for h in &inputs {
        assert_eq!(outcomes.get(h), Some(&(0, 0, 1)), "{h}");
    }
    assert_eq!(queue::stats(&db)["dead"], INPUTS as u64);
    report("dead-letter", kills, tries, epochs, started);
}

fn sync_time(db: &Path, url: &str, dir: &str) -> Duration {
    let t = Instant::now();
    run(db, &["sync", url, dir, "--batch", "20"], b"");
    t.elapsed() + Duration::from_millis(5)
}

#[test]
fn crash_loop_sync_pull() {
    let dir = tempfile::tempdir().unwrap();
    let facts = chains("pull", 20, 60);
    let n = facts.len();
    let a = dir.path().join("a.db");
    seeded_db(&a, &facts);
    let server = Server::start(&a);
    let url = server.url.clone();
    let probe = dir.path().join("probe.db");
    run(&probe, &["init"], b"");
    let full = sync_time(&probe, &url, "--pull");

    let mut rng = StdRng::seed_from_u64(0xC0A5_0004);
    let started = Instant::now();
    let (mut kills, mut tries, mut epochs) = (0, 0, 0);
    let mut b = PathBuf::new();
    let mut acked: HashSet<FactHash> = HashSet::new();
    while kills < KILLS && tries < MAX_TRIES {
        if tries == 0 || acked.len() == n {
            epochs += 1;
            b = dir.path().join(format!("pull-{epochs}.db"));
            run(&b, &["init"], b"");
            acked.clear();
        }
        tries += 1;
        let mut c = cmd(&b, &["sync", &url, "--pull", "--batch", "20"]);
        let landed = spawn_and_kill(&mut c, &mut rng, full);
        let released = check_store(&b, &acked);
        let bookmark = Store::open(&b)
            .unwrap()
            .peer(&url)
            .unwrap()
            .map_or(0, |p| p.pull_after);
        assert_prefix_present(&a, bookmark, &b);
        if landed && released.len() < n {
            kills += 1;
        }
        acked = released.iter().map(Fact::hash).collect();
    }
    run(&b, &["sync", &url, "--pull"], b"");
    let released = check_store(&b, &acked);
    assert_eq!(released.len(), n);
    report("sync pull", kills, tries, epochs, started);
}

#[test]
fn crash_loop_sync_push() {
    let dir = tempfile::tempdir().unwrap();
    let facts = chains("push", 20, 60);
    let n = facts.len();
    // Peers are known by URL and the OS may hand a later server the port of an earlier
    // one, so every receiving database gets a pushing database of its own: a bookmark
    // kept for another database behind the same URL must not skip this one's facts.
    let probe = dir.path().join("probe.db");
    run(&probe, &["init"], b"");
    let full = {
        let b = dir.path().join("b-probe.db");
        seeded_db(&b, &facts);
        let s = Server::start(&probe);
        sync_time(&b, &s.url, "--push")
    };

    let mut rng = StdRng::seed_from_u64(0xC0A5_0005);
    let started = Instant::now();
    let (mut kills, mut server_kills, mut tries, mut epochs) = (0, 0, 0, 0);
    let (mut a, mut b) = (PathBuf::new(), PathBuf::new());
    let mut server: Option<Server> = None;
    let mut acked: HashSet<FactHash> = HashSet::new();
    while kills < KILLS && tries < MAX_TRIES {
        if tries == 0 || acked.len() == n {
            epochs += 1;
            server = None;
            a = dir.path().join(format!("push-{epochs}.db"));
            run(&a, &["init"], b"");
            b = dir.path().join(format!("b-{epochs}.db"));
            seeded_db(&b, &facts);
            acked.clear();
        }
        let srv = server.get_or_insert_with(|| Server::start(&a));
        let url = srv.url.clone();
        tries += 1;
        // The receiving server is the writer on a push: every third round it is the one
        // killed (and restarted on a new port), otherwise the pushing client.
        let mut client = quiet(&mut cmd(&b, &["sync", &url, "--push", "--batch", "20"]))
            .spawn()
            .unwrap();
        random_pause(&mut rng, full);
        let landed = if tries % 3 == 0 {
            let landed = client.try_wait().unwrap().is_none() && kill(&mut srv.child);
            let _ = client.wait();
            server = None;
            if landed {
                server_kills += 1;
            }
            landed
        } else {
            kill(&mut client)
        };
        let released = check_store(&a, &acked);
        let push_after = Store::open(&b)
            .unwrap()
            .peer(&url)
            .unwrap()
            .map_or(0, |p| p.push_after);
        assert_prefix_present(&b, push_after, &a);
        if landed && released.len() < n {
            kills += 1;
        }
        acked = released.iter().map(Fact::hash).collect();
    }
    let url = server.get_or_insert_with(|| Server::start(&a)).url.clone();
    run(&b, &["sync", &url, "--push"], b"");
    let released = check_store(&a, &acked);
    assert_eq!(released.len(), n);
    eprintln!("crash loop sync push: {server_kills} of the kills hit the receiving server");
    report("sync push", kills, tries, epochs, started);
}

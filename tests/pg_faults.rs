//! Faults and concurrency on PostgreSQL (docs/scaling.md): two `serve` processes on one
//! database pushed at once, workers in two processes on one queue, SIGKILL crash loops of
//! a writer, of workers and of sync, and PostgreSQL restarted (or its backends
//! terminated) in the middle of a sync and of a worker run.
//!
//! Each test has a fresh database of the binary's shared cluster (tests/common/pg.rs);
//! the restart tests use the private cluster, one at a time, so that a restart lands in
//! no other test's run. Every child process is killed when its guard is dropped.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::bin::{cmd, code, run, stderr};
use common::crash::{
    PENDING, assert_prefix_present, chains, chains_from, check_store, open, queue_db,
    queue_outcomes, seeded_db,
};
use common::pg::{self, PgDb};
use common::process::{Server, kill, quiet, random_pause, spawn_and_kill};
use common::queue::{self, EFFECT};
use precedent::{Fact, FactHash, json};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Kills that must land per crash loop.
const KILLS: usize = 10;
/// Attempts per loop before giving up on reaching `KILLS`.
const MAX_TRIES: usize = 120;

/// A child process, SIGKILLed when dropped.
struct Guard(Option<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            kill(c);
        }
    }
}

impl Guard {
    fn new(c: &mut std::process::Command) -> Guard {
        Guard(Some(c.spawn().unwrap()))
    }

    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("present until waited for")
    }

    fn running(&mut self) -> bool {
        self.child().try_wait().unwrap().is_none()
    }

    /// Waits for the child to end; its output.
    fn output(mut self) -> std::process::Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }
}

fn p(db: &str) -> &Path {
    Path::new(db)
}

fn ok(db: &str, args: &[&str]) {
    let out = run(p(db), args, b"");
    assert_eq!(code(&out), 0, "{args:?} on {db}: {}", stderr(&out));
}

/// `facts` as JSON Lines in `file`.
fn write_jsonl(file: &Path, facts: &[Fact]) {
    let text: String = facts
        .iter()
        .map(|f| json::to_json(f).to_string() + "\n")
        .collect();
    std::fs::write(file, text).unwrap();
}

/// The released hashes of `db` in release order, checked: `verify` clean, release
/// order topological, sequence numbers dense from 1, no hash twice, nothing held.
fn sound(db: &str) -> Vec<FactHash> {
    check_store(p(db), &HashSet::new());
    let store = open(p(db));
    let mut seqs = Vec::new();
    store
        .for_each_released(0, |seq, h, _| {
            seqs.push((seq, h));
            Ok(())
        })
        .unwrap();
    for (i, (seq, h)) in seqs.iter().enumerate() {
        assert_eq!(*seq, i as i64 + 1, "seqs not dense at {h} on {db}");
    }
    let hashes: Vec<FactHash> = seqs.into_iter().map(|(_, h)| h).collect();
    let set: HashSet<FactHash> = hashes.iter().copied().collect();
    assert_eq!(set.len(), hashes.len(), "a fact released twice on {db}");
    assert_eq!(store.held_count().unwrap(), 0, "facts left held on {db}");
    hashes
}

/// On PostgreSQL: each fact stored once, nothing held.
fn stored_once(db: &PgDb) {
    let dup = db.psql("SELECT count(*) - count(DISTINCT hash) FROM fact");
    assert_eq!(dup, "0", "a hash stored twice");
    assert_eq!(db.psql("SELECT count(*) FROM held"), "0");
}

fn set(hashes: &[FactHash]) -> HashSet<FactHash> {
    hashes.iter().copied().collect()
}

/// `got` is `want`; else says how many are missing and how many extra.
fn assert_same(got: &HashSet<FactHash>, want: &HashSet<FactHash>, what: &str) {
    let missing = want.difference(got).count();
    let extra = got.difference(want).count();
    assert!(
        missing == 0 && extra == 0,
        "{what}: {missing} of {} missing, {extra} extra",
        want.len()
    );
}

fn hashes(facts: &[Fact]) -> HashSet<FactHash> {
    facts.iter().map(Fact::hash).collect()
}

/// `POST /v1/facts` of `facts` in the order given (children first pushed this way are
/// held on the server until their ancestors come); returns the status code and the
/// answer's `held` count.
fn raw_push(server: &str, facts: &[Fact]) -> (u16, u64) {
    let (status, answer) = push_answer(server, facts);
    (status, answer["held"].as_u64().unwrap_or(0))
}

/// [`raw_push`], returning the status code and the answer (`Null` when it is not JSON).
fn push_answer(server: &str, facts: &[Fact]) -> (u16, serde_json::Value) {
    let addr = server.trim_start_matches("http://").trim_end_matches('/');
    let body: Vec<u8> = facts
        .iter()
        .flat_map(|f| f.canonical_bytes().to_vec())
        .collect();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST /v1/facts HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/cbor-seq\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(&body).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"));
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or_default())
}

/// A push large enough to be streamed into the fact table and guessed new, whose first
/// half another server on the database stored: the stream meets them stored (at a name
/// the second server had not cached, where its `COPY` ends), rolls back to its savepoint
/// and stores the whole push again, looked up. Each fact once, the new ones released,
/// seqs dense.
#[test]
fn a_streamed_push_of_facts_another_server_stored_is_stored_once() {
    let Some(hub) = pg::db() else { return };
    ok(&hub.url, &["init"]);
    let s1 = Server::start(p(&hub.url));
    let s2 = Server::start(p(&hub.url));
    let facts = chains("streamed", 4, 300);
    let (status, first) = push_answer(&s1.url, &facts[..600]);
    assert_eq!(
        (status, first["inserted"].as_u64()),
        (200, Some(600)),
        "{first}"
    );
    // The second server has not seen them: nothing tells it they are stored.
    let (status, both) = push_answer(&s2.url, &facts);
    assert_eq!(status, 200, "{both}");
    assert_eq!(both["inserted"].as_u64(), Some(600), "{both}");
    assert_eq!(both["duplicates"].as_u64(), Some(600), "{both}");
    assert_eq!(both["seqs"], serde_json::json!([[601, 1200]]), "{both}");
    // And a push after it, on the same server, streams again.
    let more = chains("after", 2, 300);
    let (status, after) = push_answer(&s2.url, &more);
    assert_eq!(
        (status, after["inserted"].as_u64()),
        (200, Some(600)),
        "{after}"
    );
    stored_once(&hub);
    let all: HashSet<FactHash> = hashes(&facts).into_iter().chain(hashes(&more)).collect();
    assert_same(&set(&sound(&hub.url)), &all, "the hub has both pushes");
}

/// Point 1: two servers on one database, pushed at once by two SQLite nodes with
/// overlapping fact sets and by a third peer sending children before their parents; then
/// each node syncs with the other server. Everything converges: one set everywhere,
/// each fact stored once, `verify` clean, seqs dense.
#[test]
fn two_servers_on_one_database_pushed_at_once_converge() {
    let Some(hub) = pg::db() else { return };
    ok(&hub.url, &["init"]);
    let s1 = Server::start(p(&hub.url));
    let s2 = Server::start(p(&hub.url));

    // Shared ancestors in both nodes; each node's own chains grow from their tips, and
    // two of node a's chains are in node b too.
    let shared = chains("shared", 6, 40);
    let tips: Vec<Option<FactHash>> = shared.chunks(40).map(|c| Some(c[39].hash())).collect();
    let mids: Vec<Option<FactHash>> = shared.chunks(40).map(|c| Some(c[20].hash())).collect();
    let a_own = chains_from("a", &tips, 30);
    let b_own = chains_from("b", &tips, 30);
    // Branches off the middle of the shared chains, pushed children first.
    let mut raw = chains_from("raw", &mids, 25);
    raw.reverse();

    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let a_facts: Vec<Fact> = shared.iter().chain(&a_own).cloned().collect();
    let b_facts: Vec<Fact> = shared
        .iter()
        .chain(&b_own)
        .chain(&a_own[..60])
        .cloned()
        .collect();
    seeded_db(p(a), &a_facts);
    seeded_db(p(b), &b_facts);

    let push = |node: &str, url: &str| {
        let mut c = cmd(p(node), &["sync", url, "--push", "--batch", "20"]);
        quiet(&mut c).stderr(Stdio::piped());
        Guard::new(&mut c)
    };
    let pa = push(a, &s1.url);
    let pb = push(b, &s2.url);
    let (u1, u2) = (s1.url.clone(), s2.url.clone());
    let rawer = std::thread::spawn(move || {
        let mut held = 0;
        for (i, chunk) in raw.chunks(15).enumerate() {
            let (status, h) = raw_push(if i % 2 == 0 { &u1 } else { &u2 }, chunk);
            assert_eq!(status, 200, "raw push {i}");
            held += h;
        }
        (raw, held)
    });
    for g in [pa, pb] {
        let out = g.output();
        assert!(out.status.success(), "push: {}", stderr(&out));
    }
    let (raw, held) = rawer.join().unwrap();
    assert!(held > 0, "no raw push was held on the hub");

    // Each node syncs both ways with the server it did not push to.
    ok(a, &["sync", &s2.url]);
    ok(b, &["sync", &s1.url]);
    ok(a, &["sync", &s2.url, "--pull"]);

    let all: HashSet<FactHash> = hashes(&shared)
        .into_iter()
        .chain(hashes(&a_own))
        .chain(hashes(&b_own))
        .chain(hashes(&raw))
        .collect();
    let on_hub = sound(&hub.url);
    assert_same(&set(&on_hub), &all, "the hub has the union");
    assert_same(&set(&sound(a)), &all, "node a converged");
    assert_same(&set(&sound(b)), &all, "node b converged");
    stored_once(&hub);
    assert_eq!(hub.psql("SELECT count(*) FROM fact"), all.len().to_string());
}

/// A handler that writes an `Effect` naming its input, its attempt and the worker process
/// that ran it (the shell's parent).
const EFFECT_BY: &str = r#"printf '{"type":"Effect","fields":{"attempt":%s,"worker":%s},"predecessors":{"input":"%s"}}\n' "$PRECEDENT_ATTEMPT" "$PPID" "$PRECEDENT_INPUT_HASH""#;

fn worker(db: &str, handler: &str) -> Guard {
    let mut c = cmd(
        p(db),
        &[
            "work", "ship", "-j", "2", "--batch", "4", "--poll", "10ms", "--quiet", "--", "sh",
            "-c", handler,
        ],
    );
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    Guard::new(&mut c)
}

fn completed(db: &str) -> u64 {
    queue::stats(p(db))["completed"].as_u64().unwrap()
}

/// Waits (up to `secs`) until `n` inputs are completed, the workers running throughout.
fn wait_completed(db: &str, n: u64, workers: &mut [Guard], secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        for w in workers.iter_mut() {
            if !w.running() {
                let mut err = String::new();
                let status = w.child().try_wait();
                let _ = w.child().stderr.take().unwrap().read_to_string(&mut err);
                panic!("a worker exited: {status:?}: {err}");
            }
        }
        let done = completed(db);
        if done >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{done} of {n} completed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every input of `inputs` completed exactly once with exactly one effect; returns the
/// effects per worker process.
fn each_once(db: &str, inputs: &[FactHash]) -> BTreeMap<i64, usize> {
    let released = check_store(p(db), &HashSet::new());
    let outcomes = queue_outcomes(&released);
    for h in inputs {
        assert_eq!(outcomes.get(h), Some(&(1, 1, 0)), "{h}");
    }
    let mut by = BTreeMap::new();
    for f in &released {
        if f.type_name() == "Effect"
            && let Some(precedent::Value::Integer(w)) = f.fields().get("worker")
        {
            *by.entry(*w as i64).or_default() += 1;
        }
    }
    by
}

/// Point 2: two worker processes on one database claim from one queue of 300 inputs;
/// each input is completed once, with one effect, and both processes did some.
#[test]
fn workers_in_two_processes_complete_each_input_once() {
    let Some(db) = pg::db() else { return };
    let url = db.url.as_str();
    ok(url, &["init"]);
    let facts = queue::orders(300, Some(5));
    queue::import(p(url), &facts);
    queue::declare_ship(p(url), "2s", "100000", "10ms");
    let mut workers = [worker(url, EFFECT_BY), worker(url, EFFECT_BY)];
    wait_completed(url, 300, &mut workers, 90);
    drop(workers);
    let inputs: Vec<FactHash> = facts[1..].iter().map(Fact::hash).collect();
    let by = each_once(url, &inputs);
    assert_eq!(by.len(), 2, "both processes completed inputs: {by:?}");
    assert_eq!(by.values().sum::<usize>(), 300);
}

fn report(path: &str, kills: usize, tries: usize, started: Instant) {
    eprintln!(
        "postgres crash loop {path}: {kills} SIGKILLs landed mid-write ({tries} runs), {:?}",
        started.elapsed()
    );
    assert!(
        kills >= KILLS,
        "{path}: only {kills} of {KILLS} kills landed while the child was writing"
    );
}

/// Point 3, the writer: `precedent import` of chains given children first, committed
/// 40 records at a time (so held facts wait across commits), killed at random moments
/// and run again. Nothing released is lost, nothing half-written, and the last run
/// stores the input exactly.
#[test]
fn crash_loop_import_on_postgres() {
    let Some(mut db) = pg::db() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut facts = chains("import", 4, 100);
    facts.reverse();
    let all = hashes(&facts);
    let file = dir.path().join("facts.jsonl");
    write_jsonl(&file, &facts);
    let import = |url: &str| {
        let mut c = cmd(p(url), &["import", file.to_str().unwrap()]);
        c.env("PRECEDENT_IMPORT_BATCH", "40");
        c
    };
    let Some(probe) = pg::db() else { return };
    ok(&probe.url, &["init"]);
    let t = Instant::now();
    let out = import(&probe.url).output().unwrap();
    assert!(out.status.success());
    let full = t.elapsed() + Duration::from_millis(5);

    ok(&db.url, &["init"]);
    let mut rng = StdRng::seed_from_u64(0x96_0001);
    let started = Instant::now();
    let (mut kills, mut tries) = (0, 0);
    let mut acked: HashSet<FactHash> = HashSet::new();
    let mut seen_held = false;
    while kills < KILLS && tries < MAX_TRIES {
        if acked.len() == all.len() {
            // Everything is in: a fresh database, so kills keep landing mid-write.
            let Some(fresh) = pg::db() else { return };
            db = fresh;
            ok(&db.url, &["init"]);
            acked.clear();
        }
        let url = db.url.as_str();
        tries += 1;
        let landed = spawn_and_kill(&mut import(url), &mut rng, full);
        let released = check_store(p(url), &acked);
        for f in &released {
            assert!(all.contains(&f.hash()), "a fact never imported: {f:?}");
        }
        let held = open(p(url)).held_count().unwrap();
        seen_held |= held > 0;
        assert!(released.len() as u64 + held <= all.len() as u64);
        if landed && released.len() < all.len() {
            kills += 1;
        }
        acked = released.iter().map(Fact::hash).collect();
    }
    let url = db.url.as_str();
    let out = import(url).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let released = check_store(p(url), &acked);
    assert_same(&hashes(&released), &all, "imported");
    assert_eq!(sound(url).len(), all.len());
    stored_once(&db);
    assert!(seen_held, "no kill left facts held between commits");
    report("import + held release", kills, tries, started);
}

/// Point 3, the workers: `precedent work` killed mid-batch again and again, then the
/// queue drained: every input completed once, no effect doubled.
#[test]
fn crash_loop_workers_on_postgres() {
    const INPUTS: u64 = 120;
    let mut rng = StdRng::seed_from_u64(0x96_0002);
    let started = Instant::now();
    let (mut kills, mut tries, mut epochs) = (0, 0, 0);
    let mut acked: HashSet<FactHash> = HashSet::new();
    let mut done = 0;
    let (mut db, mut inputs) = (None, Vec::new());
    while kills < KILLS && tries < MAX_TRIES {
        if tries == 0 || done == INPUTS {
            // Everything is done: a fresh database, so kills keep landing mid-batch.
            let Some(fresh) = pg::db() else { return };
            inputs = queue_db(p(&fresh.url), INPUTS as usize, "100000", true);
            db = Some(fresh);
            (done, epochs) = (0, epochs + 1);
            acked.clear();
        }
        let url = db.as_ref().unwrap().url.as_str();
        tries += 1;
        let mut c = cmd(
            p(url),
            &[
                "work", "ship", "-j", "2", "--batch", "4", "--poll", "10ms", "--quiet", "--", "sh",
                "-c", EFFECT,
            ],
        );
        let landed = spawn_and_kill(&mut c, &mut rng, Duration::from_millis(400));
        let released = check_store(p(url), &acked);
        queue_outcomes(&released);
        let now = completed(url);
        assert!(now >= done, "completions went back: {done} -> {now}");
        done = now;
        if landed && done < INPUTS {
            kills += 1;
        }
        acked = released.iter().map(Fact::hash).collect();
    }
    let url = db.as_ref().unwrap().url.as_str();
    queue::drain(p(url), EFFECT, PENDING, Duration::from_millis(30));
    let released = check_store(p(url), &acked);
    let outcomes = queue_outcomes(&released);
    for h in &inputs {
        assert_eq!(outcomes.get(h), Some(&(1, 1, 0)), "{h}");
    }
    eprintln!("{epochs} fresh databases");
    report("claim/complete", kills, tries, started);
}

/// Point 3, sync: a PostgreSQL node syncing both ways with a server on another
/// PostgreSQL database; the client is killed, or every third time the server (the writer
/// of a push). Bookmarks never run ahead of what is stored, and a last run converges.
#[test]
fn crash_loop_sync_on_postgres() {
    let on_hub = chains("hub", 8, 50);
    let on_node = chains("node", 8, 50);
    let all: HashSet<FactHash> = hashes(&on_hub)
        .into_iter()
        .chain(hashes(&on_node))
        .collect();
    // A hub and a node seeded with their own facts.
    let pair = || -> Option<(PgDb, PgDb)> {
        let (hub, node) = (pg::db()?, pg::db()?);
        seeded_db(p(&hub.url), &on_hub);
        seeded_db(p(&node.url), &on_node);
        Some((hub, node))
    };
    // How long an undisturbed sync takes: kills fall within it.
    let Some((hub, node)) = pair() else { return };
    let full = {
        let s = Server::start(p(&hub.url));
        let t = Instant::now();
        ok(&node.url, &["sync", &s.url, "--batch", "20"]);
        t.elapsed() + Duration::from_millis(5)
    };

    let mut rng = StdRng::seed_from_u64(0x96_0003);
    let started = Instant::now();
    let (mut kills, mut tries, mut epochs) = (0, 0, 0);
    let mut dbs: Option<(PgDb, PgDb)> = None;
    let mut server: Option<Server> = None;
    let (mut acked_hub, mut acked_node) = (HashSet::new(), HashSet::new());
    while kills < KILLS && tries < MAX_TRIES {
        if dbs.is_none() {
            // Peers are known by URL, and a new server may get an old one's port: a new
            // hub comes with a new node.
            server = None;
            dbs = pair();
            epochs += 1;
            acked_hub.clear();
            acked_node.clear();
        }
        let (hub, node) = dbs.as_ref().unwrap();
        let (h, n) = (hub.url.as_str(), node.url.as_str());
        let srv = server.get_or_insert_with(|| Server::start(p(h)));
        let url = srv.url.clone();
        tries += 1;
        let mut client = quiet(&mut cmd(p(n), &["sync", &url, "--batch", "20"]))
            .spawn()
            .unwrap();
        random_pause(&mut rng, full);
        let landed = if tries % 3 == 0 {
            let landed = client.try_wait().unwrap().is_none() && kill(&mut srv.child);
            let _ = client.wait();
            server = None;
            landed
        } else {
            kill(&mut client)
        };
        let released_hub = check_store(p(h), &acked_hub);
        let released_node = check_store(p(n), &acked_node);
        if let Some(peer) = open(p(n)).peer(&url).unwrap() {
            assert_prefix_present(p(h), peer.pull_after, p(n));
            assert_prefix_present(p(n), peer.push_after, p(h));
        }
        let converged = released_hub.len() == all.len() && released_node.len() == all.len();
        if landed && !converged {
            kills += 1;
        }
        acked_hub = hashes(&released_hub);
        acked_node = hashes(&released_node);
        if converged {
            dbs = None;
        }
    }
    let (hub, node) = dbs.get_or_insert_with(|| pair().unwrap());
    let (h, n) = (hub.url.as_str(), node.url.as_str());
    let url = server
        .get_or_insert_with(|| Server::start(p(h)))
        .url
        .clone();
    ok(n, &["sync", &url]);
    assert_same(&set(&sound(h)), &all, h);
    assert_same(&set(&sound(n)), &all, n);
    stored_once(hub);
    stored_once(node);
    eprintln!("{epochs} fresh pairs of databases");
    report("sync", kills, tries, started);
}

/// How a test disturbs PostgreSQL in the middle of a run.
#[derive(Clone, Copy, Debug)]
enum Outage {
    /// Immediate shutdown of the private cluster, then a start again a moment later.
    Restart,
    /// `pg_terminate_backend` of every connection to the database.
    Terminate,
}

impl Outage {
    fn hit(self, db: &PgDb) {
        match self {
            Outage::Restart => {
                db.cluster.stop();
                std::thread::sleep(Duration::from_millis(700));
                db.cluster.start_again();
            }
            Outage::Terminate => {
                db.psql(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                );
            }
        }
    }
}

/// A database for an outage: on the private cluster for a restart (the lock held for the
/// test), else on the shared one.
fn outage_db(outage: Outage) -> Option<(PgDb, Option<std::sync::MutexGuard<'static, ()>>)> {
    match outage {
        Outage::Restart => {
            let cluster = pg::private_cluster()?;
            let lock = pg::private_lock();
            // Running, even if a test that failed mid-outage left it stopped.
            cluster.start_again();
            Some((cluster.db(), Some(lock)))
        }
        Outage::Terminate => Some((pg::db()?, None)),
    }
}

/// Point 4 (b): PostgreSQL restarted, or its backends terminated, twice during a worker
/// run. The worker reconnects and carries on without exiting; every input is completed
/// once, none twice.
fn worker_survives(outage: Outage) {
    let Some((db, _lock)) = outage_db(outage) else {
        return;
    };
    let url = db.url.as_str();
    ok(url, &["init"]);
    let facts = queue::orders(300, Some(5));
    queue::import(p(url), &facts);
    queue::declare_ship(p(url), "1s", "100000", "10ms");
    let mut workers = [worker(url, EFFECT_BY)];
    for n in [60, 150] {
        wait_completed(url, n, &mut workers, 60);
        outage.hit(&db);
    }
    wait_completed(url, 300, &mut workers, 90);
    drop(workers);
    let inputs: Vec<FactHash> = facts[1..].iter().map(Fact::hash).collect();
    each_once(url, &inputs);
    assert_eq!(completed(url), 300);
}

#[test]
fn a_worker_survives_a_postgres_restart() {
    worker_survives(Outage::Restart);
}

#[test]
fn a_worker_survives_terminated_backends() {
    worker_survives(Outage::Terminate);
}

/// Point 4 (a): PostgreSQL restarted, or its backends terminated, in the middle of a
/// one-shot push to a server on it: the push ends at once with a clear error (or
/// finishes, if it was quick), the server keeps running, and a second run converges.
fn push_through_outage(outage: Outage) {
    let Some((db, _lock)) = outage_db(outage) else {
        return;
    };
    let url = db.url.as_str();
    ok(url, &["init"]);
    let server = Server::start(p(url));
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node.db");
    let node = node.to_str().unwrap();
    let facts = chains("push", 20, 100);
    seeded_db(p(node), &facts);
    let mut c = cmd(p(node), &["sync", &server.url, "--push", "--batch", "20"]);
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut push = Guard::new(&mut c);
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.psql("SELECT count(*) FROM fact").parse::<u64>().unwrap() < 100 {
        assert!(Instant::now() < deadline, "the push stored nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(push.running(), "the push ended before the outage");
    outage.hit(&db);
    let out = push.output();
    let err = stderr(&out);
    eprintln!("push through {outage:?}: {}: {}", out.status, err.trim());
    if !out.status.success() {
        assert_eq!(code(&out), 5, "a peer's failure (README): {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.contains("database unavailable"), "{err}");
    }
    let mut server = server;
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "serve exited on the outage"
    );
    ok(node, &["sync", &server.url, "--push"]);
    assert_same(&set(&sound(url)), &hashes(&facts), url);
    stored_once(&db);
}

#[test]
fn a_push_through_a_postgres_restart_fails_clearly_and_converges() {
    push_through_outage(Outage::Restart);
}

#[test]
fn a_push_through_terminated_backends_fails_clearly_and_converges() {
    push_through_outage(Outage::Terminate);
}

/// Point 4 (a), the client side: a node on PostgreSQL pulling from a SQLite server.
/// A one-shot pull through a restart ends with a database error naming the dropped
/// connection (exit 4), nothing half-stored, and a re-run converges; `sync --follow`
/// reconnects and carries on without exiting.
#[test]
fn a_pull_into_postgres_through_a_restart() {
    let Some(cluster) = pg::private_cluster() else {
        return;
    };
    let _lock = pg::private_lock();
    cluster.start_again();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source.db");
    let facts = chains("pull", 20, 100);
    seeded_db(&source, &facts);
    let server = Server::start(&source);

    for follow in [false, true] {
        let db = cluster.db();
        let url = db.url.as_str();
        ok(url, &["init"]);
        let mut args = vec!["sync", server.url.as_str(), "--pull", "--batch", "20"];
        if follow {
            args.push("--follow");
        }
        let mut c = cmd(p(url), &args);
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut pull = Guard::new(&mut c);
        let deadline = Instant::now() + Duration::from_secs(60);
        while db.psql("SELECT count(*) FROM fact").parse::<u64>().unwrap() < 100 {
            assert!(Instant::now() < deadline, "the pull stored nothing");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(pull.running(), "the pull ended before the restart");
        Outage::Restart.hit(&db);
        if follow {
            // It reconnects: everything arrives while it runs on.
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                assert!(pull.running(), "sync --follow exited on the restart");
                let n: usize = db.psql("SELECT count(*) FROM fact").parse().unwrap();
                if n == facts.len() {
                    break;
                }
                assert!(Instant::now() < deadline, "{n} of {} pulled", facts.len());
                std::thread::sleep(Duration::from_millis(100));
            }
            drop(pull);
        } else {
            let out = pull.output();
            let err = stderr(&out);
            eprintln!("pull through a restart: {}: {}", out.status, err.trim());
            if !out.status.success() {
                assert_eq!(code(&out), 4, "a database failure (README): {err}");
                assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
                assert!(
                    err.contains("nothing of this transaction was committed")
                        || err.contains("server down")
                        || err.contains("starting up or shutting down"),
                    "{err}"
                );
            }
            check_store(p(url), &HashSet::new());
            ok(url, &["sync", &server.url, "--pull"]);
        }
        assert_same(&set(&sound(url)), &hashes(&facts), url);
        stored_once(&db);
    }
}

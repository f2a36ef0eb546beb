//! Remote workers over HTTP (`docs/protocol.md`, "Queues over HTTP"): real `precedent
//! serve` processes on 127.0.0.1, workers through the client library
//! ([`RemoteQueue`]) and `precedent work --remote`.

mod common;
mod sync_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::bin::{cmd, run_ok};
use common::queue::{declare, import, orders};
use precedent::sync::client::{ClientOptions, RemoteQueue};
use precedent::{Fact, FactHash};
use serde_json::Value as Json;

/// A `precedent serve` child; killed when dropped.
struct Serve {
    server: common::process::Server,
    url: String,
    addr: SocketAddr,
}

impl Serve {
    /// Serves `db` on `listen` (`127.0.0.1:0` for a port from the OS) with `extra` args.
    fn start(db: &Path, listen: &str, extra: &[&str]) -> Serve {
        let server =
            common::process::Server::start_with(db, &[&["--listen", listen], extra].concat());
        let url = server.url.clone();
        let addr = url.trim_start_matches("http://").parse().unwrap();
        Serve { server, url, addr }
    }
}

/// A database with the `ship` queue over `n` orders (lease `lease`, retries soon).
fn hub(dir: &Path, n: usize, lease: &str) -> (PathBuf, Vec<Fact>) {
    let db = dir.join("hub.db");
    run_ok(&db, &["init"], b"");
    declare(
        &db,
        &[
            "--lease",
            lease,
            "--backoff-base",
            "1ms",
            "--backoff-cap",
            "5ms",
        ],
    );
    let facts = orders(n, None);
    import(&db, &facts);
    (db, facts[1..].to_vec())
}

fn queue(url: &str, token: Option<&str>) -> RemoteQueue {
    let options = ClientOptions {
        token: token.map(str::to_string),
        ..ClientOptions::default()
    };
    RemoteQueue::new(url, "ship", options).unwrap()
}

/// An effect naming the input and carrying who applied it and on which attempt: a second
/// application would be a second, different fact.
fn effect(input: FactHash, by: &str, attempt: u32) -> Fact {
    Fact::builder("Effect")
        .field("by", by)
        .field("attempt", attempt as i64)
        .predecessor("input", input)
        .build()
        .unwrap()
}

/// Claims and completes (with an effect) until `quiet` empty claims in a row; returns the
/// inputs completed. Bounded: at most 2,000 claims.
fn drain(q: &RemoteQueue, by: &str, batch: usize, quiet: usize) -> Vec<FactHash> {
    let mut done = Vec::new();
    let mut empty = 0;
    for _ in 0..2000 {
        let leases = q.claim(batch, Duration::from_millis(200)).unwrap();
        if leases.is_empty() {
            empty += 1;
            if empty >= quiet {
                return done;
            }
            continue;
        }
        empty = 0;
        let items: Vec<(&str, Vec<Fact>)> = leases
            .iter()
            .map(|l| {
                let shipped = l.completion().field("by", by).build().unwrap();
                let e = effect(l.input.hash(), by, l.attempt);
                (l.id.as_str(), vec![e, shipped])
            })
            .collect();
        for (r, l) in q.complete(&items).unwrap().iter().zip(&leases) {
            assert!(r.ok, "{r:?}");
            assert_eq!(r.facts, Some(2));
            done.push(l.input.hash());
        }
    }
    panic!("{by} still claiming after 2,000 rounds");
}

/// For each input: how many `Shop.Shipped` and `Effect` facts name it.
fn applied(db: &str) -> BTreeMap<String, (usize, usize)> {
    let out = run_ok(Path::new(db), &["export"], b"");
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let f: Json = serde_json::from_str(line).unwrap();
        match f["type"].as_str().unwrap() {
            "Shop.Shipped" => {
                let input = f["predecessors"]["order"].as_str().unwrap().to_string();
                counts.entry(input).or_default().0 += 1;
            }
            "Effect" => {
                let input = f["predecessors"]["input"].as_str().unwrap().to_string();
                counts.entry(input).or_default().1 += 1;
            }
            _ => {}
        }
    }
    counts
}

fn assert_each_once(db: &str, inputs: &[Fact]) {
    let counts = applied(db);
    assert_eq!(counts.len(), inputs.len(), "{counts:?}");
    for i in inputs {
        let got = counts.get(&i.hash().to_string()).copied();
        assert_eq!(got, Some((1, 1)), "input {}", i.hash());
    }
}

fn stats(db: &str) -> Json {
    let out = run_ok(Path::new(db), &["--json", "queue", "stats", "ship"], b"");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn two_remote_workers_complete_every_input_exactly_once_with_its_effects() {
    let dir = tempfile::tempdir().unwrap();
    let (db, inputs) = hub(dir.path(), 300, "30s");
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    let workers: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|by| {
            let url = server.url.clone();
            std::thread::spawn(move || drain(&queue(&url, None), by, 7, 3))
        })
        .collect();
    let mut all: Vec<FactHash> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    assert_eq!(all.len(), inputs.len());
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), inputs.len(), "an input was completed twice");
    let db = db.to_str().unwrap();
    assert_each_once(db, &inputs);
    let s = stats(db);
    assert_eq!(
        (s["completed"].as_u64(), s["ready"].as_u64()),
        (Some(300), Some(0)),
        "{s}"
    );
}

#[test]
fn a_dead_workers_leases_are_offered_again_when_they_end() {
    let dir = tempfile::tempdir().unwrap();
    let (db, inputs) = hub(dir.path(), 5, "1s");
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    let q = queue(&server.url, None);
    let first = q.claim(10, Duration::ZERO).unwrap();
    assert_eq!(first.len(), 5);
    assert!(first.iter().all(|l| l.attempt == 1 && l.lease_ms == 1000));
    // The worker goes away without a word; nothing is offered while its leases live...
    assert!(q.claim(10, Duration::ZERO).unwrap().is_empty());
    // ...and a waiting claim gets them all when they end.
    let start = Instant::now();
    let mut again = Vec::new();
    while again.len() < 5 && start.elapsed() < Duration::from_secs(20) {
        again.extend(q.claim(10, Duration::from_secs(5)).unwrap());
    }
    assert_eq!(again.len(), 5);
    assert!(again.iter().all(|l| l.attempt == 2), "{again:?}");
    // The dead worker's late completion is refused, and nothing of it is stored.
    let late: Vec<(&str, Vec<Fact>)> = first
        .iter()
        .map(|l| (l.id.as_str(), vec![l.completion().build().unwrap()]))
        .collect();
    for r in q.complete(&late).unwrap() {
        assert_eq!(
            (r.ok, r.error.as_deref()),
            (false, Some("lease_lost")),
            "{r:?}"
        );
    }
    let db = db.to_str().unwrap();
    assert!(applied(db).is_empty());
    let items: Vec<(&str, Vec<Fact>)> = again
        .iter()
        .map(|l| {
            let facts = vec![
                effect(l.input.hash(), "b", 2),
                l.completion().build().unwrap(),
            ];
            (l.id.as_str(), facts)
        })
        .collect();
    assert!(q.complete(&items).unwrap().iter().all(|r| r.ok));
    assert_each_once(db, &inputs);
}

#[test]
fn a_lease_survives_the_server_restarting() {
    let dir = tempfile::tempdir().unwrap();
    let (db, inputs) = hub(dir.path(), 3, "30s");
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    let addr = server.addr.to_string();
    let q = queue(&server.url, None);
    let leases = q.claim(3, Duration::ZERO).unwrap();
    drop(server);
    let down = q.extend(&[leases[0].id.as_str()]).unwrap_err();
    assert!(matches!(down, precedent::Error::Transport { .. }), "{down}");
    // The same port again: the lease ids, which hold no server state, still work.
    let _again = Serve::start(&db, &addr, &[]);
    let items: Vec<(&str, Vec<Fact>)> = leases
        .iter()
        .map(|l| {
            let facts = vec![
                effect(l.input.hash(), "a", 1),
                l.completion().build().unwrap(),
            ];
            (l.id.as_str(), facts)
        })
        .collect();
    assert!(q.complete(&items).unwrap().iter().all(|r| r.ok));
    assert_each_once(db.to_str().unwrap(), &inputs);
}

const TOKENS: &str = r#"{"tokens": [
  {"name": "alice", "token": "a-secret", "work": ["ship"]},
  {"name": "bob", "token": "b-secret", "work": true},
  {"name": "carol", "token": "c-secret", "read": true, "write": true, "work": ["bill"]}
]}"#;

#[test]
fn a_lease_is_bound_to_its_token_and_work_needs_permission() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = hub(dir.path(), 2, "30s");
    let tokens = dir.path().join("tokens.json");
    std::fs::write(&tokens, TOKENS).unwrap();
    let server = Serve::start(&db, "127.0.0.1:0", &["--tokens", tokens.to_str().unwrap()]);
    let (alice, bob) = (
        queue(&server.url, Some("a-secret")),
        queue(&server.url, Some("b-secret")),
    );
    let lease = alice.claim(1, Duration::ZERO).unwrap().pop().unwrap();
    let items = [(lease.id.as_str(), vec![lease.completion().build().unwrap()])];
    let remote = |e: precedent::Error| match e {
        precedent::Error::Remote { status, code, .. } => (status, code),
        other => panic!("{other}"),
    };
    // Bob may work on every queue, but not with Alice's lease.
    assert_eq!(
        remote(bob.complete(&items).unwrap_err()),
        (403, "lease_not_yours".into())
    );
    assert_eq!(remote(bob.extend(&[&lease.id]).unwrap_err()).0, 403);
    assert_eq!(
        remote(bob.fail(&[(&lease.id, "x")], false).unwrap_err()).0,
        403
    );
    assert_eq!(remote(bob.poison(&[(&lease.id, "x")]).unwrap_err()).0, 403);
    let db = db.to_str().unwrap();
    assert_eq!(stats(db)["leased"], 1, "nothing was changed");
    // Carol reads and writes, and works on another queue only; no token is no access.
    let carol = queue(&server.url, Some("c-secret"));
    assert_eq!(
        remote(carol.claim(1, Duration::ZERO).unwrap_err()),
        (403, "forbidden".into())
    );
    assert_eq!(
        remote(
            queue(&server.url, None)
                .claim(1, Duration::ZERO)
                .unwrap_err()
        )
        .0,
        401
    );
    assert_eq!(stats(db)["leased"], 1);
    // Alice's own completion goes through.
    assert!(alice.complete(&items).unwrap()[0].ok);
    assert_eq!(stats(db)["completed"], 1);
}

/// A raw POST to a queue endpoint: status and JSON body.
fn post(addr: SocketAddr, path: &str, ctype: &str, body: &str) -> (u16, Json) {
    let (status, body) = sync_support::raw_http(addr, "POST", path, ctype, body.as_bytes(), None);
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

#[test]
fn bad_requests_are_refused_with_what_and_where_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = hub(dir.path(), 2, "30s");
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    let q = queue(&server.url, None);
    let leases = q.claim(2, Duration::ZERO).unwrap();
    let db = db.to_str().unwrap();
    let j = "application/json";
    let claim = "/v1/queues/ship/claim";
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        (
            claim,
            j,
            "{\"n\": 0}".into(),
            400,
            "n must be 1 to 10000, not 0",
        ),
        (
            claim,
            j,
            "{\"n\": 1, \"wiat_ms\": 5}".into(),
            400,
            "unknown field `wiat_ms`",
        ),
        (claim, j, "{\"n\": ".into(), 400, "claim body is not"),
        (
            claim,
            "text/plain",
            "{}".into(),
            415,
            "content-type must be application/json",
        ),
        (
            "/v1/queues/nope/claim",
            j,
            "{}".into(),
            404,
            "no queue \"nope\"",
        ),
        (
            "/v1/queues/ship/finish",
            j,
            "{}".into(),
            404,
            "the actions are claim",
        ),
        (
            "/v1/queues/ship/complete",
            j,
            r#"{"leases": [{"lease": "1.2"}]}"#.into(),
            400,
            "leases[0].lease: \"1.2\" is not a lease id",
        ),
        (
            "/v1/queues/ship/complete",
            j,
            format!(
                r#"{{"leases": [{{"lease": "{}", "facts": [{{"type": "Shop.Shipped", "predecessors": {{"order": "{}"}}}}]}},
                               {{"lease": "{}", "facts": [{{"type": "Shop.Shipped", "fields": 3}}]}}]}}"#,
                leases[0].id,
                leases[0].input.hash(),
                leases[1].id
            ),
            400,
            "leases[1].facts[0].fields",
        ),
        (
            "/v1/queues/ship/complete",
            j,
            format!(
                r#"{{"leases": [{{"lease": "{0}"}}, {{"lease": "{0}"}}]}}"#,
                leases[0].id
            ),
            400,
            "leases[1].lease names the input of leases[0] again",
        ),
        (
            "/v1/queues/ship/fail",
            j,
            format!(r#"{{"leases": [{{"lease": "{}"}}]}}"#, leases[0].id),
            400,
            "missing field `reason`",
        ),
    ];
    for (path, ctype, body, status, says) in cases {
        let (got, answer) = post(server.addr, path, ctype, &body);
        let message = answer["message"].as_str().unwrap_or("");
        assert_eq!(got, status, "{path} {body}: {answer}");
        assert!(
            message.contains(says),
            "{path} {body}: {message:?} lacks {says:?}"
        );
        assert!(!message.contains('\n'), "{message:?}");
    }
    // Nothing was written: both leases are still out, nothing completed.
    let s = stats(db);
    assert_eq!(
        (s["leased"].as_u64(), s["completed"].as_u64()),
        (Some(2), Some(0)),
        "{s}"
    );
    assert!(applied(db).is_empty());
    // A completion whose facts do not complete its input is refused for that lease alone.
    let items = [
        (
            leases[0].id.as_str(),
            vec![effect(leases[0].input.hash(), "a", 1)],
        ),
        (
            leases[1].id.as_str(),
            vec![leases[1].completion().build().unwrap()],
        ),
    ];
    let r = q.complete(&items).unwrap();
    assert_eq!(
        (r[0].ok, r[0].error.as_deref()),
        (false, Some("not_completed")),
        "{r:?}"
    );
    assert!(r[1].ok, "{r:?}");
    let counts = applied(db);
    assert_eq!(
        counts.len(),
        1,
        "the refused lease's effect is not stored: {counts:?}"
    );
}

#[test]
fn fail_retries_and_poison_is_final() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = hub(dir.path(), 2, "30s");
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    let q = queue(&server.url, None);
    let leases = q.claim(2, Duration::ZERO).unwrap();
    let failed = q.fail(&[(&leases[0].id, "try later")], false).unwrap();
    assert_eq!(failed[0].outcome.as_deref(), Some("retry"), "{failed:?}");
    let poisoned = q.poison(&[(&leases[1].id, "bad order")]).unwrap();
    assert_eq!(
        poisoned[0].outcome.as_deref(),
        Some("poison"),
        "{poisoned:?}"
    );
    assert!(poisoned[0].entry.as_ref().is_some_and(|e| e.len() == 64));
    // Failing again is refused: the lease ended with the first failure.
    let again = q.fail(&[(&leases[0].id, "again")], false).unwrap();
    assert_eq!(again[0].error.as_deref(), Some("lease_lost"));
    // The failed input comes back after its backoff, on its second attempt; the poison
    // one does not.
    let back = q.claim(2, Duration::from_secs(5)).unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(
        (back[0].input.hash(), back[0].attempt),
        (leases[0].input.hash(), 2)
    );
    let s = stats(db.to_str().unwrap());
    assert_eq!(s["poison"], 1, "{s}");
    let extended = q.extend(&[&back[0].id]).unwrap();
    assert!(extended[0].expires_at_ms.unwrap() >= back[0].expires_at_ms);
}

#[test]
fn remote_workers_on_a_postgres_hub_complete_each_input_once() {
    let Some(pg) = common::pg::db() else { return };
    let url = pg.url.as_str();
    let db = Path::new(url);
    run_ok(db, &["init"], b"");
    declare(db, &["--lease", "30s"]);
    let facts = orders(120, None);
    import(db, &facts);
    let server = Serve::start(db, "127.0.0.1:0", &[]);
    let workers: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|by| {
            let url = server.url.clone();
            std::thread::spawn(move || drain(&queue(&url, None), by, 9, 3))
        })
        .collect();
    let total: usize = workers.into_iter().map(|w| w.join().unwrap().len()).sum();
    assert_eq!(total, 120);
    assert_each_once(url, &facts[1..]);
}

/// `precedent work ship --remote URL ...` with the effect handler, as a child.
fn remote_worker(db: &Path, url: &str, extra: &[&str]) -> Child {
    let mut args = vec!["work", "ship", "--remote", url, "--quiet"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", common::queue::EFFECT]);
    cmd(db, &args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// For each input: how many `Shop.Shipped` facts and distinct `Effect` facts (one per
/// attempt that applied it) name it, from the CLI handler's effects.
fn assert_cli_once(db: &str, inputs: &[Fact]) {
    let counts = applied(db);
    for i in inputs {
        let got = counts.get(&i.hash().to_string()).copied();
        assert_eq!(got, Some((1, 1)), "input {}", i.hash());
    }
}

#[test]
fn two_remote_cli_workers_drain_the_queue_once() {
    let dir = tempfile::tempdir().unwrap();
    let (db, inputs) = hub(dir.path(), 40, "30s");
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    // No database of their own: --db names a file that does not exist.
    let nowhere = dir.path().join("absent.db");
    let workers: Vec<Child> = (0..2)
        .map(|_| {
            remote_worker(
                &nowhere,
                &server.url,
                &["--once", "--batch", "3", "-j", "2"],
            )
        })
        .collect();
    for mut w in workers {
        assert!(w.wait().unwrap().success());
    }
    assert!(!nowhere.exists());
    let db = db.to_str().unwrap();
    assert_cli_once(db, &inputs);
    assert_eq!(stats(db)["completed"], 40);
}

#[test]
fn a_remote_cli_worker_survives_the_server_restarting() {
    let dir = tempfile::tempdir().unwrap();
    let (db, inputs) = hub(dir.path(), 60, "30s");
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    let addr = server.addr.to_string();
    let url = server.url.clone();
    let mut worker = remote_worker(&db, &url, &["--batch", "4", "--poll", "20ms"]);
    let dbs = db.to_str().unwrap().to_string();
    let completed = || stats(&dbs)["completed"].as_u64().unwrap();
    let start = Instant::now();
    while completed() < 10 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(server);
    std::thread::sleep(Duration::from_millis(700));
    assert!(worker.try_wait().unwrap().is_none(), "the worker gave up");
    let _again = Serve::start(&db, &addr, &[]);
    while completed() < 60 && start.elapsed() < Duration::from_secs(90) {
        std::thread::sleep(Duration::from_millis(50));
    }
    common::process::kill(&mut worker);
    assert_cli_once(&dbs, &inputs);
    assert_eq!(completed(), 60);
}

#[test]
fn a_waiting_claim_gets_an_input_that_arrives_while_it_waits() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = hub(dir.path(), 0, "30s");
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    let q = queue(&server.url, None);
    assert!(q.claim(1, Duration::ZERO).unwrap().is_empty());
    let late = Fact::builder("Shop.Order").field("id", 99).build().unwrap();
    let (db2, l2) = (db.clone(), late.clone());
    let adder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        import(&db2, &[l2]);
    });
    // One claim, waiting up to 20 s: it answers with the input that came meanwhile.
    let got = q.claim(1, Duration::from_secs(20)).unwrap();
    adder.join().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].input.hash(), late.hash());
}

/// Whether process `pid` is gone (or a zombie, which runs nothing).
fn handler_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn a_killed_remote_cli_workers_inputs_are_offered_again_when_its_leases_end() {
    let dir = tempfile::tempdir().unwrap();
    let (db, inputs) = hub(dir.path(), 3, "1s");
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    let dbs = db.to_str().unwrap().to_string();
    // A worker whose handler hangs, killed with SIGKILL once it holds every input.
    let pidfile = dir.path().join("handler.pid");
    let mut stuck = cmd(
        &db,
        &[
            "work",
            "ship",
            "--remote",
            &server.url,
            "--batch",
            "3",
            "--",
            "sh",
            "-c",
            r#"echo $$ > "$PIDFILE"; exec sleep 30"#,
        ],
    )
    .env("PIDFILE", &pidfile)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut rounds = 0;
    while stats(&dbs)["leased"] != 3 {
        rounds += 1;
        assert!(rounds < 400, "the worker never claimed: {}", stats(&dbs));
        std::thread::sleep(Duration::from_millis(25));
    }
    let mut rounds = 0;
    while !pidfile.exists() {
        rounds += 1;
        assert!(rounds < 400, "the handler never started");
        std::thread::sleep(Duration::from_millis(25));
    }
    common::process::kill(&mut stuck);
    // Its handler dies with it (PR_SET_PDEATHSIG), not left running.
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut rounds = 0;
    while !handler_gone(pid) {
        rounds += 1;
        assert!(rounds < 400, "handler {pid} outlived its killed worker");
        std::thread::sleep(Duration::from_millis(25));
    }
    // Other workers get the inputs once the leases end, and complete each once.
    let mut rounds = 0;
    while stats(&dbs)["completed"] != 3 {
        rounds += 1;
        assert!(rounds < 60, "still pending: {}", stats(&dbs));
        let mut w = remote_worker(&db, &server.url, &["--once", "--batch", "3"]);
        assert!(w.wait().unwrap().success());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_cli_once(&dbs, &inputs);
    let out = run_ok(&db, &["--json", "queue", "items", "ship"], b"");
    let items = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        inputs
            .iter()
            .all(|i| !items.contains(&i.hash().to_string())),
        "{items}"
    );
}

/// Claims until an input comes, each claim waiting up to 500 ms; at most 20 claims.
fn claim_one(q: &RemoteQueue) -> precedent::sync::client::RemoteLease {
    for _ in 0..20 {
        if let Some(l) = q.claim(1, Duration::from_millis(500)).unwrap().pop() {
            return l;
        }
    }
    panic!("nothing offered within 20 claims");
}

#[test]
fn a_failure_with_a_retry_delay_is_not_offered_again_before_it() {
    let dir = tempfile::tempdir().unwrap();
    // The queue's own backoff is 1 to 5 ms: only the delay asked for holds the input back.
    let (db, inputs) = hub(dir.path(), 1, "30s");
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    let q = queue(&server.url, None);
    let lease = q.claim(1, Duration::ZERO).unwrap().pop().unwrap();
    let failed = q
        .fail_not_before(&[(&lease.id, "busy", Duration::from_millis(600))])
        .unwrap();
    assert_eq!(failed[0].outcome.as_deref(), Some("retry"), "{failed:?}");
    let at = failed[0].retry_at_ms.unwrap();
    // The lease was claimed before the failure, on the hub's clock.
    let claimed_at = lease.expires_at_ms - lease.lease_ms;
    assert!(
        at >= claimed_at + 600,
        "retry at {at}, claimed at {claimed_at}"
    );
    assert!(q.claim(1, Duration::ZERO).unwrap().is_empty());
    let back = claim_one(&q);
    assert_eq!((back.input.hash(), back.attempt), (inputs[0].hash(), 2));
}

#[test]
fn a_remote_cli_handler_exiting_75_gets_the_retry_delay_it_asks_for() {
    let dir = tempfile::tempdir().unwrap();
    let (db, inputs) = hub(dir.path(), 1, "30s");
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    let nowhere = dir.path().join("absent.db");
    // First attempt: ask for 3 s. Without the delay the queue's 1 ms backoff would hand
    // the input out again at once, and --once would run it a second time.
    let handler = r#"cat >/dev/null; echo '{"retry_after": "3s"}'; exit 75"#;
    let out = cmd(
        &nowhere,
        &[
            "work",
            "ship",
            "--remote",
            &server.url,
            "--once",
            "--",
            "sh",
            "-c",
            handler,
        ],
    )
    .stdin(Stdio::null())
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let q = queue(&server.url, None);
    assert!(q.claim(1, Duration::ZERO).unwrap().is_empty());
    let s = stats(db.to_str().unwrap());
    assert_eq!(s["failed"], 1, "{s}");
    let back = claim_one(&q);
    assert_eq!((back.input.hash(), back.attempt), (inputs[0].hash(), 2));
}

/// The threads of process `pid`.
fn threads(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

#[test]
fn long_poll_claims_beyond_the_store_threads_wait_without_a_thread_each() {
    // 24 workers long-polling an empty queue on a server of 2 store threads: each claim's
    // wait would hold a thread of tokio's blocking pool (512 by default); bounded, they
    // take turns on 2, and every one still gets its input once the inputs arrive.
    const WORKERS: usize = 24;
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = hub(dir.path(), 0, "30s");
    let serve = Serve::start(&db, "127.0.0.1:0", &["--store-threads", "2"]);
    let pid = serve.server.child.id();
    // One claim first, so the pool has started a thread.
    assert!(
        queue(&serve.url, None)
            .claim(1, Duration::ZERO)
            .unwrap()
            .is_empty()
    );
    let idle = threads(pid);
    let claimers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let q = queue(&serve.url, None);
            std::thread::spawn(move || q.claim(1, Duration::from_secs(20)).unwrap())
        })
        .collect();
    let mut most = 0;
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        most = most.max(threads(pid));
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        most <= idle + 2,
        "{most} threads while {WORKERS} claims wait (idle: {idle})"
    );
    let facts = orders(WORKERS, None);
    import(&db, &facts);
    let mut got: Vec<FactHash> = claimers
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .map(|l| l.input.hash())
        .collect();
    assert_eq!(got.len(), WORKERS, "every waiting claim got an input");
    got.sort();
    got.dedup();
    assert_eq!(got.len(), WORKERS, "no input claimed twice");
}

/// A hub whose queue `invoice` over `n` orders is done by an invoice or a cancellation
/// naming the order (`--done-by` twice).
fn invoice_hub(dir: &Path, n: usize) -> (PathBuf, Vec<Fact>) {
    let db = dir.join("hub.db");
    run_ok(&db, &["init"], b"");
    run_ok(
        &db,
        &[
            "queue",
            "add",
            "invoice",
            "--input",
            "Shop.Order",
            "--done-by",
            "Shop.Invoice.order",
            "--done-by",
            "Shop.Order.Cancelled.order",
        ],
        b"",
    );
    let facts = orders(n, None);
    import(&db, &facts);
    (db, facts[1..].to_vec())
}

/// `precedent work invoice --once` with `handler`, remote when `url` is given, else on
/// `db` itself; asserts that it succeeded.
fn work_invoices(db: &Path, url: Option<&str>, handler: &str) {
    let mut args = vec!["work", "invoice", "--once", "--quiet"];
    if let Some(url) = url {
        args.extend_from_slice(&["--remote", url]);
    }
    args.extend_from_slice(&["--", "sh", "-c", handler]);
    let out = cmd(db, &args).stdin(Stdio::null()).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// For each input: how many facts of each type name it as `order`.
fn naming_orders(db: &Path) -> BTreeMap<String, BTreeMap<String, usize>> {
    let out = run_ok(db, &["export"], b"");
    let mut counts: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let f: Json = serde_json::from_str(line).unwrap();
        if let Some(order) = f["predecessors"]["order"].as_str() {
            let types = counts.entry(order.to_string()).or_default();
            *types
                .entry(f["type"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
    }
    counts
}

/// Runs `handler` on 3 orders of the `invoice` queue with a local worker and with a
/// remote one, and asserts that both stored, for each input, one fact naming it: one of
/// `kind`, the handler's (no `{"by": "precedent work"}` completion added).
fn assert_completed_alike(handler: &str, kind: &str) {
    let mut stored = Vec::new();
    for remote in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (db, inputs) = invoice_hub(dir.path(), 3);
        if remote {
            let server = Serve::start(&db, "127.0.0.1:0", &[]);
            let nowhere = dir.path().join("absent.db");
            work_invoices(&nowhere, Some(&server.url), handler);
        } else {
            work_invoices(&db, None, handler);
        }
        let counts = naming_orders(&db);
        for i in &inputs {
            let want = BTreeMap::from([(kind.to_string(), 1)]);
            let got = counts.get(&i.hash().to_string());
            assert_eq!(got, Some(&want), "remote {remote}: {counts:?}");
        }
        let out = run_ok(&db, &["--json", "queue", "stats", "invoice"], b"");
        let s: Json = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(s["completed"], 3, "remote {remote}: {s}");
        stored.push(counts);
    }
    assert_eq!(stored[0], stored[1], "local and remote differ");
}

/// A fact that completes the input under the queue's second rule is its completion on a
/// hub as locally: a cancelled order gets no invoice.
#[test]
fn a_remote_cli_worker_completes_under_any_rule_as_a_local_one() {
    let cancel = r#"cat >/dev/null; printf '{"type":"Shop.Order.Cancelled","fields":{"why":"gone"},"predecessors":{"order":"%s"}}\n' "$PRECEDENT_INPUT_HASH""#;
    assert_completed_alike(cancel, "Shop.Order.Cancelled");
}

/// A completing fact that names the input by a hash prefix is its completion on a hub as
/// locally: no second completion is added.
#[test]
fn a_remote_cli_worker_completes_by_a_hash_prefix_as_a_local_one() {
    let invoice = r#"cat >/dev/null; printf '{"type":"Shop.Invoice","fields":{"total":7},"predecessors":{"order":"%.16s"}}\n' "$PRECEDENT_INPUT_HASH""#;
    assert_completed_alike(invoice, "Shop.Invoice");
}

/// A handler that prints nothing still gets the worker's own completing fact from a hub,
/// once, as locally.
#[test]
fn a_remote_cli_worker_adds_its_own_completion_when_the_handler_writes_none() {
    let dir = tempfile::tempdir().unwrap();
    let (db, inputs) = invoice_hub(dir.path(), 2);
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    work_invoices(
        &dir.path().join("absent.db"),
        Some(&server.url),
        "cat >/dev/null",
    );
    let counts = naming_orders(&db);
    for i in &inputs {
        let want = BTreeMap::from([("Shop.Invoice".to_string(), 1)]);
        assert_eq!(counts.get(&i.hash().to_string()), Some(&want), "{counts:?}");
    }
}

#[test]
fn a_released_lease_is_offered_again_at_once_with_its_attempt_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let (db, inputs) = hub(dir.path(), 1, "30s");
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    let q = queue(&server.url, None);
    let lease = q.claim(1, Duration::ZERO).unwrap().pop().unwrap();
    assert_eq!(lease.completions.len(), 1);
    let r = q.release(&[&lease.id]).unwrap();
    assert!(r[0].ok, "{r:?}");
    // Released once: a second release, and a completion, find the lease gone.
    let again = q.release(&[&lease.id]).unwrap();
    assert_eq!(again[0].error.as_deref(), Some("lease_lost"), "{again:?}");
    let back = q.claim(1, Duration::ZERO).unwrap().pop().unwrap();
    assert_eq!((back.input.hash(), back.attempt), (inputs[0].hash(), 1));
    let (status, body) = post(
        server.addr,
        "/v1/queues/ship/release",
        "application/json",
        &format!(r#"{{"leases": [{{"lease": "{}"}}], "extra": 1}}"#, back.id),
    );
    assert_eq!(status, 400, "{body}");
}

/// A remote worker stopped while its first command runs gives back the inputs of its
/// batch it had not started, uncounted, as a local one does: they are offered again at
/// once, not dead-lettered when their leases end (one attempt allowed here).
#[test]
fn a_stopped_remote_cli_worker_gives_back_the_inputs_it_had_not_started() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hub.db");
    run_ok(&db, &["init"], b"");
    declare(&db, &["--lease", "30s", "--max-attempts", "1"]);
    let facts = orders(3, None);
    import(&db, &facts);
    let server = Serve::start(&db, "127.0.0.1:0", &[]);
    let pidfile = dir.path().join("handler.pid");
    let handler = format!(
        r#"echo $$ > "$PIDFILE"; sleep 1; cat >/dev/null; {}"#,
        common::queue::EFFECT
    );
    let mut worker = cmd(
        &dir.path().join("absent.db"),
        &[
            "work",
            "ship",
            "--remote",
            &server.url,
            "--batch",
            "3",
            "--quiet",
            "--",
            "sh",
            "-c",
            &handler,
        ],
    )
    .env("PIDFILE", &pidfile)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut rounds = 0;
    while !pidfile.exists() {
        rounds += 1;
        assert!(rounds < 400, "the handler never started");
        std::thread::sleep(Duration::from_millis(25));
    }
    unsafe { libc::kill(worker.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    let status = loop {
        if let Some(s) = worker.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the worker did not stop"
        );
        std::thread::sleep(Duration::from_millis(25));
    };
    assert!(status.success(), "{status:?}");
    let dbs = db.to_str().unwrap();
    let s = stats(dbs);
    assert_eq!(
        (s["completed"].as_u64(), s["leased"].as_u64()),
        (Some(1), Some(0)),
        "{s}"
    );
    // The two others, offered at once and still on their first attempt.
    let q = queue(&server.url, None);
    let leases = q.claim(3, Duration::ZERO).unwrap();
    let attempts: Vec<u32> = leases.iter().map(|l| l.attempt).collect();
    assert_eq!(attempts, [1, 1], "{}", stats(dbs));
    assert_eq!(stats(dbs)["dead"], 0);
}

//! `precedent work --remote URL --process` (a long-running handler against a hub, no
//! local database) and `--remote --timeout`: real `precedent serve` processes on
//! 127.0.0.1 and real handler processes.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::bin::{cmd, code, run_ok, stderr};
use common::process::{Server, gone};
use common::queue::{DIES_ONCE_AFTER_THREE, declare, import, orders, python, stats};
use precedent::Fact;
use precedent::sync::client::{ClientOptions, RemoteQueue};
use serde_json::Value as Json;

fn ship_py() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/handlers/ship.py")
        .display()
        .to_string()
}

/// A hub database at `db` (a file or a PostgreSQL URL) with the `ship` queue over `n`
/// orders, retried after 1 ms; the orders.
fn hub_at(db: &Path, n: usize, extra: &[&str]) -> Vec<Fact> {
    run_ok(db, &["init"], b"");
    let mut opts = vec!["--backoff-base", "1ms", "--backoff-cap", "1ms"];
    opts.extend_from_slice(extra);
    declare(db, &opts);
    let facts = orders(n, None);
    import(db, &facts);
    facts[1..].to_vec()
}

/// `precedent work ship --remote URL` with `flags`, then the handler; `--db` names a
/// file that does not exist (and must not be made).
fn remote(dir: &Path, url: &str, flags: &[&str], handler: &[&str]) -> std::process::Command {
    let nowhere = dir.join("absent.db");
    let mut args = vec!["work", "ship", "--remote", url];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(handler);
    let mut c = cmd(&nowhere, &args);
    c.stdin(Stdio::null());
    c
}

fn spawn_quiet(mut c: std::process::Command) -> Child {
    c.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Two ship.py workers with `flags` at once; both must exit 0.
fn two_workers(dir: &Path, url: &str, flags: &[&str]) {
    let workers: Vec<Child> = (0..2)
        .map(|_| spawn_quiet(remote(dir, url, flags, &["python3", &ship_py()])))
        .collect();
    for mut w in workers {
        assert!(w.wait().unwrap().success());
    }
}

/// For each order: how many `Shop.Shipped` facts name it.
fn shipped(db: &Path) -> BTreeMap<String, usize> {
    let out = run_ok(db, &["export"], b"");
    let mut counts = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let f: Json = serde_json::from_str(line).unwrap();
        if f["type"] == "Shop.Shipped" {
            let order = f["predecessors"]["order"].as_str().unwrap().to_string();
            *counts.entry(order).or_default() += 1;
        }
    }
    counts
}

/// Every input completed exactly once, by one `Shop.Shipped` naming it.
fn assert_each_once(db: &Path, inputs: &[Fact]) {
    let counts = shipped(db);
    assert_eq!(counts.len(), inputs.len(), "{counts:?}");
    for i in inputs {
        let got = counts.get(&i.hash().to_string()).copied();
        assert_eq!(got, Some(1), "input {}", i.hash());
    }
    let s = stats(db);
    assert_eq!(s["completed"], inputs.len() as u64, "{s}");
}

fn ok(out: &Output) {
    assert_eq!(code(out), 0, "{}", stderr(out));
}

#[test]
fn the_python_example_against_a_hub_completes_every_input_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hub.db");
    let inputs = hub_at(&db, 60, &[]);
    let server = Server::start_with(&db, &["--listen", "127.0.0.1:0"]);
    let out = remote(
        dir.path(),
        &server.url,
        &["--process", "--once", "--in-flight", "16"],
        &["python3", &ship_py()],
    )
    .output()
    .unwrap();
    ok(&out);
    assert!(!dir.path().join("absent.db").exists(), "no local database");
    assert_each_once(&db, &inputs);
    // The handler's facts are the completions: no `{"by": "precedent work"}` of ours.
    let exported = String::from_utf8(run_ok(&db, &["export"], b"").stdout).unwrap();
    assert!(!exported.contains("precedent work"), "{exported}");
    assert!(stderr(&out).contains("ship.py serving queue ship"));
}

/// A TCP proxy on 127.0.0.1 in front of `upstream` that counts, in what clients send,
/// the request lines that start with `line` (each connection's bytes scanned as they
/// pass, so requests kept alive on one connection are each counted).
struct CountingProxy {
    url: String,
    count: Arc<AtomicUsize>,
}

impl CountingProxy {
    fn start(upstream: &str, line: &'static str) -> CountingProxy {
        let upstream = upstream.strip_prefix("http://").unwrap().to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let (mut c_read, mut s_write) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (mut s_read, mut c_write) = (server, client);
                let counted = counted.clone();
                std::thread::spawn(move || {
                    // The tail of the last read, so a request line cut in two is found.
                    let (mut buf, mut tail) = (vec![0u8; 64 * 1024], Vec::new());
                    while let Ok(n) = c_read.read(&mut buf) {
                        if n == 0 || s_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        tail.extend_from_slice(&buf[..n]);
                        let found = tail
                            .windows(line.len())
                            .filter(|w| *w == line.as_bytes())
                            .count();
                        counted.fetch_add(found, Ordering::SeqCst);
                        let keep = tail.len().min(line.len() - 1);
                        tail.drain(..tail.len() - keep);
                    }
                    let _ = s_write.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s_read, &mut c_write);
                    let _ = c_write.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        CountingProxy { url, count }
    }
}

#[test]
fn a_remote_process_worker_completes_its_answers_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hub.db");
    let inputs = hub_at(&db, 200, &[]);
    let server = Server::start_with(&db, &["--listen", "127.0.0.1:0"]);
    let proxy = CountingProxy::start(&server.url, "POST /v1/queues/ship/complete ");
    let out = remote(
        dir.path(),
        &proxy.url,
        &["--process", "--once", "--in-flight", "64"],
        &["python3", &ship_py()],
    )
    .output()
    .unwrap();
    ok(&out);
    assert_each_once(&db, &inputs);
    // 200 answers, up to 64 in flight: a request per round of answers, far fewer than
    // one per input.
    let requests = proxy.count.load(Ordering::SeqCst);
    assert!(
        (1..=50).contains(&requests),
        "{requests} complete requests for {} inputs",
        inputs.len()
    );
}

#[test]
fn two_remote_process_workers_complete_every_input_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hub.db");
    let inputs = hub_at(&db, 120, &["--lease", "30s"]);
    let server = Server::start_with(&db, &["--listen", "127.0.0.1:0"]);
    let flags = ["--process", "--once", "-j", "2", "--in-flight", "8"];
    two_workers(dir.path(), &server.url, &flags);
    assert_each_once(&db, &inputs);
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn a_remote_handler_that_dies_has_its_inputs_retried() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hub.db");
    let inputs = hub_at(&db, 6, &[]);
    let server = Server::start_with(&db, &["--listen", "127.0.0.1:0"]);
    let handler = python(DIES_ONCE_AFTER_THREE);
    let mut c = remote(
        dir.path(),
        &server.url,
        &["--process", "--once", "--in-flight", "3"],
        &args(&handler),
    );
    c.env("MARK", dir.path().join("mark"));
    let out = c.output().unwrap();
    ok(&out);
    assert!(stderr(&out).contains("the handler exited (exit 3)"));
    assert_each_once(&db, &inputs);
    let exported = String::from_utf8(run_ok(&db, &["export"], b"").stdout).unwrap();
    assert_eq!(
        exported.matches(r#""attempt":2"#).count(),
        3,
        "the three inputs it held were retried: {exported}"
    );
    assert_eq!(stats(&db)["failed"], 3);
}

#[test]
fn a_retry_answer_with_retry_after_is_honoured_by_the_hub() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hub.db");
    let inputs = hub_at(&db, 1, &[]);
    let server = Server::start_with(&db, &["--listen", "127.0.0.1:0"]);
    // Without the delay the queue's 1 ms backoff would hand the input out again at once,
    // and --once would complete it on its second attempt.
    let body = r#"
for line in sys.stdin:
    req = json.loads(line)
    if req["attempt"] == 1:
        answer({"lease": req["lease"], "outcome": "retry", "reason": "closed", "retry_after": "3s"})
    else:
        answer(shipped(req))
"#;
    let handler = python(body);
    let out = remote(
        dir.path(),
        &server.url,
        &["--process", "--once"],
        &args(&handler),
    )
    .output()
    .unwrap();
    ok(&out);
    assert!(stderr(&out).contains("retry in"), "{}", stderr(&out));
    let s = stats(&db);
    assert_eq!(
        (s["failed"].as_u64(), s["completed"].as_u64()),
        (Some(1), Some(0)),
        "{s}"
    );
    let q = RemoteQueue::new(&server.url, "ship", ClientOptions::default()).unwrap();
    assert!(
        q.claim(1, Duration::ZERO).unwrap().is_empty(),
        "offered before its delay"
    );
    let back = (0..20)
        .find_map(|_| q.claim(1, Duration::from_millis(500)).unwrap().pop())
        .expect("offered again after the delay");
    assert_eq!((back.input.hash(), back.attempt), (inputs[0].hash(), 2));
}

fn read_pid(path: &PathBuf) -> i32 {
    let text = std::fs::read_to_string(path).expect("the handler wrote its pid");
    text.trim().parse().unwrap()
}

#[test]
fn a_remote_timeout_kills_the_handlers_process_group_and_counts_as_timed_out() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hub.db");
    let inputs = hub_at(&db, 1, &[]);
    let server = Server::start_with(&db, &["--listen", "127.0.0.1:0"]);
    let pidfile = dir.path().join("grandchild.pid");
    // The first attempt starts a grandchild in the handler's group and waits for it; the
    // second completes at once.
    let script = r#"cat >/dev/null; if [ "$PRECEDENT_ATTEMPT" = 1 ]; then sleep 60 >/dev/null 2>&1 & echo $! > "$PIDFILE"; wait; fi"#;
    let mut c = remote(
        dir.path(),
        &server.url,
        &["--once", "--timeout", "300ms"],
        &["sh", "-c", script],
    );
    c.env("PIDFILE", &pidfile);
    let out = c.output().unwrap();
    ok(&out);
    assert!(
        stderr(&out).contains("timed out after 300ms"),
        "{}",
        stderr(&out)
    );
    let pid = read_pid(&pidfile);
    let mut rounds = 0;
    while !gone(pid) {
        rounds += 1;
        assert!(rounds < 200, "grandchild {pid} survived the timeout");
        std::thread::sleep(Duration::from_millis(25));
    }
    let s = stats(&db);
    assert_eq!(s["timed_out"], 1, "counted as a timeout on the hub: {s}");
    assert_eq!(s["failed"], 1, "{s}");
    assert_eq!(s["completed"], 1, "retried and completed: {s}");
    assert_each_once(&db, &inputs);
}

#[test]
fn remote_process_workers_on_a_postgres_hub_complete_each_input_once() {
    let Some(pg) = common::pg::db() else { return };
    let db = Path::new(pg.url.as_str());
    let inputs = hub_at(db, 80, &["--lease", "30s"]);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(db, &["--listen", "127.0.0.1:0"]);
    two_workers(
        dir.path(),
        &server.url,
        &["--process", "--once", "--in-flight", "8"],
    );
    assert_each_once(db, &inputs);
}

#[test]
fn a_remote_process_worker_keeps_its_answers_through_a_hub_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hub.db");
    let inputs = hub_at(&db, 60, &["--lease", "30s"]);
    let server = Server::start_with(&db, &["--listen", "127.0.0.1:0"]);
    let addr = server.url.trim_start_matches("http://").to_string();
    // One claim takes every input; the handler answers one every 50 ms, and after the
    // next claim finds nothing the worker claims again only after --poll: while the hub
    // is away, only answered completions are waiting to be sent.
    let body = r#"
import time
for line in sys.stdin:
    time.sleep(0.05)
    answer(shipped(json.loads(line)))
"#;
    let handler = python(body);
    let flags = ["--process", "--in-flight", "60", "--poll", "20s"];
    let mut worker = spawn_quiet(remote(dir.path(), &server.url, &flags, &args(&handler)));
    let completed = || stats(&db)["completed"].as_u64().unwrap();
    let mut rounds = 0;
    while completed() < 10 {
        rounds += 1;
        assert!(rounds < 1200, "the worker completed nothing");
        std::thread::sleep(Duration::from_millis(25));
    }
    drop(server);
    std::thread::sleep(Duration::from_millis(700));
    assert!(worker.try_wait().unwrap().is_none(), "the worker gave up");
    let _again = Server::start_with(&db, &["--listen", &addr]);
    let mut rounds = 0;
    while completed() < 60 {
        rounds += 1;
        assert!(rounds < 1200, "still pending: {}", stats(&db));
        std::thread::sleep(Duration::from_millis(25));
    }
    common::process::kill(&mut worker);
    // Nothing lost, nothing twice: every answer was sent again until the hub took it.
    assert_each_once(&db, &inputs);
    let s = stats(&db);
    assert_eq!(s["failed"], 0, "{s}");
}

//! `precedent work --process`: long-running handlers over JSON Lines, end to end with
//! real handler processes (the examples in examples/handlers/ and small inline ones).

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::bin::{Db, code, stderr};
use common::queue::{declare, import, orders, stats};

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/handlers")
        .join(name)
        .display()
        .to_string()
}

/// A database with `n` unrelated orders and the `ship` queue over them.
fn shop(n: usize, extra: &[&str]) -> Db {
    let db = Db::new();
    db.ok(&["init"]);
    import(&db.path, &orders(n, None));
    let mut opts = vec!["--unordered"];
    opts.extend_from_slice(extra);
    declare(&db.path, &opts);
    db
}

/// `work ship --process --once` with `flags`, then the handler command.
fn work(db: &Db, flags: &[&str], handler: &[&str]) -> Output {
    let mut args = vec!["work", "ship", "--process", "--once"];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(handler);
    db.run(&args)
}

fn count(db: &Db, type_name: &str) -> u64 {
    db.json(&["stats"])["per_type"][type_name]
        .as_u64()
        .unwrap_or(0)
}

/// A Python handler: `body` is the loop over requests, with `req` (the parsed request),
/// `answer(dict)` (writes one line) and `shipped(req)` (a done answer) at hand.
fn python(body: &str) -> Vec<String> {
    let script = format!(
        r#"
import json, os, sys
def answer(a):
    sys.stdout.write(json.dumps(a) + "\n"); sys.stdout.flush()
def shipped(req):
    return {{"lease": req["lease"], "outcome": "done", "facts": [{{"type": "Shop.Shipped",
        "fields": {{"attempt": req["attempt"]}}, "predecessors": {{"order": req["input"]["hash"]}}}}]}}
hello = json.loads(sys.stdin.readline())
assert hello == {{"precedent": "work", "version": 1, "queue": "ship"}}, hello
{body}
"#
    );
    vec!["python3".into(), "-c".into(), script]
}

fn run_py(db: &Db, flags: &[&str], body: &str) -> Output {
    let cmd = python(body);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    work(db, flags, &cmd)
}

#[test]
fn the_python_example_completes_every_input_with_its_facts() {
    let db = shop(30, &[]);
    let out = work(
        &db,
        &["-j", "2", "--in-flight", "4"],
        &["python3", &example("ship.py")],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(count(&db, "Shop.Shipped"), 30, "{}", stderr(&out));
    let s = stats(&db.path);
    assert_eq!(s["completed"], 30, "{s}");
    assert_eq!(s["ready"], 0, "{s}");
    assert_eq!(stderr(&out).matches(" done (1 facts)").count(), 30);
    assert!(
        stderr(&out).contains("ship.py serving queue ship"),
        "the handler's stderr is in the log: {}",
        stderr(&out)
    );
    // The handler's facts are the completions: no `by: precedent work` of our own.
    assert!(!db.ok(&["export"]).contains("precedent work"));
}

#[test]
fn the_shell_example_completes_every_input() {
    let db = shop(12, &[]);
    let out = work(&db, &["--in-flight", "3"], &["sh", &example("ship.sh")]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(count(&db, "Shop.Shipped"), 12, "{}", stderr(&out));
    assert_eq!(stats(&db.path)["completed"], 12);
}

#[test]
fn answers_may_come_in_any_order_and_several_inputs_are_in_flight() {
    let db = shop(16, &[]);
    // Holds four requests, then answers them last first: only possible with four in
    // flight at once.
    let body = r#"
held = []
for line in sys.stdin:
    held.append(json.loads(line))
    if len(held) == 4:
        for req in reversed(held):
            answer(shipped(req))
        held = []
for req in reversed(held):
    answer(shipped(req))
"#;
    let out = run_py(&db, &["--in-flight", "4"], body);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(count(&db, "Shop.Shipped"), 16, "{}", stderr(&out));
    assert_eq!(stats(&db.path)["completed"], 16);
}

#[test]
fn a_malformed_answer_names_its_line_and_the_input_is_retried() {
    let db = shop(3, &["--backoff-base", "1ms", "--backoff-cap", "1ms"]);
    // The first answer of the first handler is not JSON: an error naming line 1, the
    // handler restarted, and its inputs retried (attempt 2), not lost.
    let body = r#"
n = 0
for line in sys.stdin:
    req = json.loads(line)
    n += 1
    if req["attempt"] == 1 and n == 1 and not os.path.exists(os.environ["MARK"]):
        open(os.environ["MARK"], "w").close()
        print("this is not json", flush=True)
        continue
    answer(shipped(req))
"#;
    let mark = db.path.with_file_name("mark");
    let cmd = python(body);
    let mut c = db.cmd(&["work", "ship", "--process", "--once", "--"]);
    c.args(&cmd).env("MARK", &mark);
    let out = c.output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("handler stdout line 1: not JSON"),
        "names the line: {err}"
    );
    assert!(err.contains("restarting the handler"), "{err}");
    assert_eq!(count(&db, "Shop.Shipped"), 3, "{err}");
    assert_eq!(stats(&db.path)["completed"], 3);
}

#[test]
fn an_answer_for_an_unknown_lease_or_a_bad_outcome_is_an_error() {
    let db = shop(2, &["--backoff-base", "1ms", "--backoff-cap", "1ms"]);
    // First run: each first attempt gets an answer with a known lease but an unknown
    // outcome (that input fails, naming the line), then one for a lease never sent.
    let body = r#"
for line in sys.stdin:
    req = json.loads(line)
    if req["attempt"] == 1:
        answer({"lease": req["lease"], "outcome": "maybe"})
        answer({"lease": 999999, "outcome": "done"})
    else:
        answer(shipped(req))
"#;
    let out = run_py(&db, &["--in-flight", "1"], body);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            r#"handler stdout line 1: "outcome" must be "done", "retry" or "poison", not "maybe""#
        ),
        "{err}"
    );
    assert!(err.contains("no input in flight has lease 999999"), "{err}");
    assert_eq!(count(&db, "Shop.Shipped"), 2, "{err}");
}

#[test]
fn a_handler_that_dies_has_its_inputs_retried_and_is_restarted() {
    let db = shop(6, &["--backoff-base", "1ms", "--backoff-cap", "1ms"]);
    // The first handler reads three requests and exits without answering.
    let body = r#"
first = not os.path.exists(os.environ["MARK"])
open(os.environ["MARK"], "w").close()
got = 0
for line in sys.stdin:
    req = json.loads(line)
    got += 1
    if first:
        if got == 3:
            sys.exit(3)
        continue
    answer(shipped(req))
"#;
    let mark = db.path.with_file_name("mark");
    let cmd = python(body);
    let mut c = db.cmd(&[
        "work",
        "ship",
        "--process",
        "--once",
        "--in-flight",
        "3",
        "--",
    ]);
    c.args(&cmd).env("MARK", &mark);
    let out = c.output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("the handler exited (exit 3)"), "{err}");
    assert_eq!(count(&db, "Shop.Shipped"), 6, "{err}");
    let exported = db.ok(&["export"]);
    assert_eq!(
        exported.matches(r#""attempt":2"#).count(),
        3,
        "the three inputs it held were retried: {exported}"
    );
}

#[test]
fn retry_and_poison_answers_fail_the_input_and_once_exits_1() {
    let db = shop(2, &[]);
    let body = r#"
for line in sys.stdin:
    req = json.loads(line)
    if req["input"]["fields"]["id"] == 0:
        answer({"lease": req["lease"], "outcome": "poison", "reason": "no such product"})
    else:
        answer({"lease": req["lease"], "outcome": "retry", "reason": "warehouse busy", "retry_after": "1h"})
"#;
    let out = run_py(&db, &[], body);
    let err = stderr(&out);
    assert_eq!(code(&out), 1, "a poisoned input in this run: {err}");
    assert!(err.contains("poison as"), "{err}");
    assert!(err.contains("no such product"), "{err}");
    assert!(
        err.contains("1 input(s) dead-lettered or poisoned in this run"),
        "{err}"
    );
    // The handler's delay, not the 1 s backoff: about an hour.
    assert!(
        err.contains("retry in 59m") || err.contains("retry in 1h"),
        "{err}"
    );
    let s = stats(&db.path);
    assert_eq!(s["poison"], 1, "{s}");
    assert_eq!(s["completed"], 0, "{s}");
}

/// Waits, in bounded steps, for `path` to exist.
fn wait_for(path: &PathBuf) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{path:?} never appeared"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn sigterm_drains_the_inputs_in_flight_then_closes_the_handlers_stdin() {
    let db = shop(20, &[]);
    let started = db.path.with_file_name("started");
    let closed = db.path.with_file_name("closed");
    // Takes four inputs, signals that it has them, answers them slowly; on the end of
    // its stdin it leaves a mark.
    let body = r#"
import time
held = []
for line in sys.stdin:
    held.append(json.loads(line))
    if len(held) == 4:
        open(os.environ["STARTED"], "w").close()
        time.sleep(0.5)
        for req in held:
            answer(shipped(req))
        held = []
open(os.environ["CLOSED"], "w").close()
"#;
    let cmd = python(body);
    let mut c = db.cmd(&["work", "ship", "--process", "--in-flight", "4", "--"]);
    c.args(&cmd)
        .env("STARTED", &started)
        .env("CLOSED", &closed)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    wait_for(&started);
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(closed.exists(), "its stdin was closed: {}", stderr(&out));
    let s = stats(&db.path);
    let done = s["completed"].as_u64().unwrap();
    assert!(
        done >= 4 && done.is_multiple_of(4),
        "the four in flight were answered: {s}"
    );
    assert_eq!(s["leased"], 0, "nothing left leased: {s}");
    assert_eq!(count(&db, "Shop.Shipped"), done);
}

//! The `ship` work queue over shop orders, driven through the binary, as the crash tests
//! use it.

use std::path::Path;
use std::time::Duration;

use precedent::{Fact, json};
use serde_json::Value as Json;

use super::bin::run_ok;

/// A handler that prints an `Effect` fact naming its input and carrying the attempt, so
/// that a second application of the same input would be a second, different fact.
pub const EFFECT: &str = r#"printf '{"type":"Effect","fields":{"attempt":%s},"predecessors":{"input":"%s"}}\n' "$PRECEDENT_ATTEMPT" "$PRECEDENT_INPUT_HASH""#;

/// A shop and `n` orders of it. With `chains_of = Some(k)` the orders come in chains of
/// `k`, each after the previous one, so that causal release is crossed as well.
pub fn orders(n: usize, chains_of: Option<usize>) -> Vec<Fact> {
    let shop = Fact::builder("Shop")
        .field("name", "corner")
        .build()
        .unwrap();
    let mut facts = vec![shop.clone()];
    for i in 0..n {
        let mut b = Fact::builder("Shop.Order")
            .field("id", i as i64)
            .predecessor("shop", shop.hash());
        if chains_of.is_some_and(|k| i % k != 0) {
            b = b.predecessor("after", facts[i].hash());
        }
        facts.push(b.build().unwrap());
    }
    facts
}

/// `precedent import -` of `facts` as JSON lines.
pub fn import(db: &Path, facts: &[Fact]) {
    let text: String = facts
        .iter()
        .map(|f| json::to_json(f).to_string() + "\n")
        .collect();
    run_ok(db, &["import", "-"], text.as_bytes());
}

/// Declares `ship` over the orders, done by a `Shop.Shipped` naming its order, with
/// `extra` options of `queue add`.
pub fn declare(db: &Path, extra: &[&str]) {
    let mut args = vec![
        "queue",
        "add",
        "ship",
        "--input",
        "Shop.Order",
        "--done-by",
        "Shop.Shipped.order",
    ];
    args.extend_from_slice(extra);
    run_ok(db, &args, b"");
}

/// Declares `ship` for a crash test. Backoff starts at a millisecond: the crash tests
/// want retries soon, not politely.
pub fn declare_ship(db: &Path, lease: &str, max_attempts: &str, backoff_cap: &str) {
    declare(
        db,
        &[
            "--lease",
            lease,
            "--max-attempts",
            max_attempts,
            "--max-age",
            "1d",
            "--backoff-base",
            "1ms",
            "--backoff-cap",
            backoff_cap,
        ],
    );
}

/// `precedent queue stats ship` as JSON.
pub fn stats(db: &Path) -> Json {
    let out = run_ok(db, &["--json", "queue", "stats", "ship"], b"");
    let lines = super::bin::json_lines(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(lines.len(), 1, "one line for one queue");
    lines[0].clone()
}

/// The sum of the named counts of `stats`.
pub fn sum(stats: &Json, counts: &[&str]) -> u64 {
    counts.iter().map(|k| stats[k].as_u64().unwrap()).sum()
}

/// Runs `work ship --once` with `handler` until none of `counts` is left (leases stranded
/// by a kill expire in the pauses), at most 200 rounds. Returns the rounds it took.
pub fn drain(db: &Path, handler: &str, counts: &[&str], pause: Duration) -> usize {
    let mut rounds = 0;
    loop {
        let s = stats(db);
        if sum(&s, counts) == 0 {
            return rounds;
        }
        rounds += 1;
        assert!(rounds < 200, "still pending after {rounds} rounds: {s}");
        let out = super::bin::run(
            db,
            &[
                "work", "ship", "-j", "2", "--once", "--quiet", "--", "sh", "-c", handler,
            ],
            b"",
        );
        // `--once` exits 1 when it dead-lettered or poisoned inputs, as a failing
        // handler makes it do.
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "work: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(pause);
    }
}

/// A Python handler: `body` is the loop over requests, with `req` (the parsed request),
/// `answer(dict)` (writes one line) and `shipped(req)` (a done answer) at hand.
pub fn python(body: &str) -> Vec<String> {
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

/// A `--process` handler body for [`python`]: the first handler (no file at `$MARK`
/// yet) reads three requests and exits 3 without answering; later ones answer each.
pub const DIES_ONCE_AFTER_THREE: &str = r#"
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

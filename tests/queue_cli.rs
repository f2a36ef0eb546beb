//! End-to-end tests of the queue commands (`queue`, `dlq`, `poison queue`, `work`)
//! against temporary databases.

use std::process::{Output, Stdio};
use std::time::Duration;

mod common;

use common::bin::{Db, code, stderr, stdout};
use common::queue::EFFECT;
use precedent::{Fact, json};
use serde_json::Value as Json;

impl Db {
    /// A new, initialised database.
    fn initialised() -> Db {
        let db = Db::new();
        db.ok(&["init"]);
        db
    }

    fn import(&self, facts: &[Fact]) {
        let text: String = facts
            .iter()
            .map(|f| json::to_json(f).to_string() + "\n")
            .collect();
        let out = self.run_with(&["import", "-"], text.as_bytes());
        assert_eq!(code(&out), 0, "import: {}", stderr(&out));
    }

    /// Released facts per type, from `stats --json`.
    fn count(&self, type_name: &str) -> u64 {
        self.json(&["stats"])["per_type"][type_name]
            .as_u64()
            .unwrap_or(0)
    }

    fn queue_stats(&self, name: &str) -> Json {
        let lines = self.json_lines(&["queue", "stats", name]);
        assert_eq!(lines.len(), 1, "one line for one queue");
        lines[0].clone()
    }
}

/// A shop and `n` orders of it, each order after the previous one when `chained`.
fn orders(n: usize, chained: bool) -> Vec<Fact> {
    common::queue::orders(n, chained.then_some(n))
}

fn declare(db: &Db, extra: &[&str]) {
    common::queue::declare(&db.path, extra);
}

fn work_once(db: &Db, script: &str) -> Output {
    db.run(&["work", "ship", "--once", "--", "sh", "-c", script])
}

#[test]
fn queue_add_list_show_rm_round_trip() {
    let db = Db::initialised();
    db.import(&orders(3, false));
    let added = db.json(&[
        "queue",
        "add",
        "ship",
        "--input",
        "Shop.Order",
        "--done-by",
        "Shop.Shipped.order",
        "--done-by",
        "Shop.Cancelled.order",
        "--max-attempts",
        "4",
        "--max-age",
        "1h",
        "--backoff-base",
        "250ms",
        "--backoff-cap",
        "30s",
        "--lease",
        "2m",
        "--require",
        "id:integer",
        "--alert-dead",
        "2",
        "--alert-poison",
        "3",
        "--alert-ready-age",
        "90s",
        "--unordered",
        "--at-most-once",
    ]);
    assert_eq!(added["stats"]["ready"], 3, "back-filled: {added}");
    let list = db.json_lines(&["queue", "list"]);
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["name"], "ship");
    let show = db.json(&["queue", "show", "ship"]);
    let q = &show["queue"];
    assert_eq!(q["input_type"], "Shop.Order");
    assert_eq!(q["completions"][1]["type_name"], "Shop.Cancelled");
    assert_eq!(q["completions"][1]["role"], "order");
    assert_eq!(q["retry"]["max_attempts"], 4);
    assert_eq!(q["retry"]["max_age_ms"], 3_600_000);
    assert_eq!(q["retry"]["backoff_base_ms"], 250);
    assert_eq!(q["retry"]["backoff_cap_ms"], 30_000);
    assert_eq!(q["lease_ms"], 120_000);
    assert_eq!(q["required_fields"][0]["name"], "id");
    assert_eq!(q["required_fields"][0]["kind"], "integer");
    assert_eq!(q["alerts"]["max_dead"], 2);
    assert_eq!(q["alerts"]["max_poison"], 3);
    assert_eq!(q["alerts"]["max_ready_age_ms"], 90_000);
    assert_eq!(q["ordering"], "none");
    assert_eq!(q["semantics"], "at-most-once");
    assert_eq!(show["stats"]["ready"], 3);
    // The text form shows the declaration too.
    let text = db.ok(&["queue", "show", "ship"]);
    assert!(text.contains("\"Shop.Cancelled\""), "{text}");
    db.ok(&["queue", "rm", "ship"]);
    assert!(db.json_lines(&["queue", "list"]).is_empty());
    let out = db.run(&["queue", "show", "ship"]);
    assert_eq!(code(&out), 3, "unknown queue is not found");
    assert!(
        stderr(&out).contains("no queue named \"ship\""),
        "{}",
        stderr(&out)
    );
    assert_eq!(code(&db.run(&["queue", "rm", "ship"])), 3);
}

#[test]
fn done_by_splits_at_the_last_dot_and_bad_arguments_are_usage_errors() {
    let db = Db::initialised();
    db.ok(&[
        "queue",
        "add",
        "q",
        "--input",
        "A.B",
        "--done-by",
        "A.B.Done.by_x",
    ]);
    let q = db.json(&["queue", "show", "q"]);
    assert_eq!(q["queue"]["completions"][0]["type_name"], "A.B.Done");
    assert_eq!(q["queue"]["completions"][0]["role"], "by_x");
    for bad in [
        vec!["--done-by", "NoDot"],
        vec!["--done-by", "Type."],
        vec!["--done-by", "T.r", "--lease", "5x"],
        vec!["--done-by", "T.r", "--lease", "s"],
        vec!["--done-by", "T.r", "--require", "id:complex"],
        vec!["--done-by", "T.r", "--require", "id"],
    ] {
        let mut args = vec!["queue", "add", "q2", "--input", "T"];
        args.extend(bad.iter().copied());
        let out = db.run(&args);
        assert_eq!(code(&out), 2, "{bad:?} must be a usage error");
    }
    // A policy the library refuses (cap below base) is invalid input.
    let out = db.run(&[
        "queue",
        "add",
        "q3",
        "--input",
        "T",
        "--done-by",
        "T.r",
        "--backoff-base",
        "10s",
        "--backoff-cap",
        "1s",
    ]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
}

#[test]
fn work_stores_stdout_facts_with_the_completion_in_one_transaction() {
    let db = Db::initialised();
    db.import(&orders(3, false));
    declare(&db, &[]);
    // Output that cannot be parsed after a valid fact: nothing of it is stored, and the
    // failure names the line.
    let script = format!("{EFFECT}; echo 'not json'");
    let out = work_once(&db, &script);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("stdout line 2"), "{}", stderr(&out));
    assert_eq!(db.count("Effect"), 0, "a failed completion stores nothing");
    assert_eq!(db.count("Shop.Shipped"), 0);
    db.ok(&["queue", "rm", "ship"]);
    declare(&db, &[]);
    // A fact that fails while it is stored, after the Effect was written in the same
    // transaction (it would be held, and no fact may be held): the Effect is rolled back.
    let orphan = format!(
        r#"{EFFECT}; printf '{{"type":"Orphan","predecessors":{{"parent":"{}"}}}}\n'"#,
        "ab".repeat(32)
    );
    let out = db.run(&[
        "--max-held",
        "0",
        "work",
        "ship",
        "--once",
        "--",
        "sh",
        "-c",
        &orphan,
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("held-fact limit"), "{}", stderr(&out));
    assert_eq!(db.count("Effect"), 0, "rolled back with the completion");
    assert_eq!(db.count("Shop.Shipped"), 0);
    db.ok(&["queue", "rm", "ship"]);
    declare(&db, &[]);
    let out = work_once(&db, EFFECT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stderr(&out).matches(" done ").count(),
        3,
        "{}",
        stderr(&out)
    );
    assert_eq!(db.count("Effect"), 3);
    assert_eq!(db.count("Shop.Shipped"), 3, "a completion per input");
    let s = db.queue_stats("ship");
    assert_eq!(s["completed"], 3);
    assert_eq!(s["ready"], 0);
    // The handler's input and environment are the fact and its hash.
    let order = orders(1, false)[1].clone();
    let got: Json = serde_json::from_str(&db.ok(&["get", &order.hash().to_string()])).unwrap();
    assert_eq!(got, json::to_json(&order));
}

#[test]
fn a_handler_may_write_its_own_completion_and_read_its_input_on_stdin() {
    let db = Db::initialised();
    db.import(&orders(2, false));
    declare(&db, &[]);
    // The completion carries the order id read from stdin.
    let script = r#"id=$(sed 's/.*"id":\([0-9]*\).*/\1/'); printf '{"type":"Shop.Shipped","fields":{"id":%s},"predecessors":{"order":"%s"}}\n' "$id" "$(echo $PRECEDENT_INPUT_HASH | cut -c1-12)""#;
    let out = work_once(&db, script);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(db.count("Shop.Shipped"), 2, "{}", stderr(&out));
    let exported = db.ok(&["export"]);
    assert!(!exported.contains(r#""by":"precedent work""#));
    assert!(
        exported.contains(r#""type":"Shop.Shipped","fields":{"id":1}"#),
        "{exported}"
    );
}

#[test]
fn exit_75_retries_after_backoff_until_it_succeeds() {
    let db = Db::initialised();
    db.import(&orders(1, false));
    declare(&db, &["--backoff-base", "10ms", "--backoff-cap", "20ms"]);
    let script =
        format!(r#"if [ "$PRECEDENT_ATTEMPT" -lt 3 ]; then echo busy >&2; exit 75; fi; {EFFECT}"#);
    let mut rounds = 0;
    while db.queue_stats("ship")["completed"] != 1 {
        rounds += 1;
        assert!(rounds < 500, "not completed after {rounds} rounds");
        let out = work_once(&db, &script);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        std::thread::sleep(Duration::from_millis(5));
    }
    let exported = db.ok(&["export"]);
    assert!(exported.contains(r#""attempt":3"#), "{exported}");
    assert_eq!(db.count("Effect"), 1);
    assert_eq!(db.count("precedent.DeadLetter"), 0);
}

#[test]
fn exit_65_is_poison_listed_shown_and_redriven() {
    let db = Db::initialised();
    let facts = orders(2, false);
    db.import(&facts);
    declare(&db, &[]);
    let out = work_once(&db, "echo 'cannot parse this order' >&2; exit 65");
    // `--once` exits 1 when inputs were poisoned or dead-lettered in its run.
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("2 input(s) dead-lettered or poisoned in this run"),
        "{}",
        stderr(&out)
    );
    let list = db.ok(&["poison", "queue", "list", "ship"]);
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(list.contains("cannot parse this order"), "{list}");
    assert_eq!(db.queue_stats("ship")["poison"], 2);
    let input = facts[1].hash().to_string();
    let shown = db.json(&["poison", "queue", "show", "ship", &input[..10]]);
    assert_eq!(shown["input"]["hash"], input);
    assert_eq!(shown["entry"]["type"], "precedent.Poison");
    assert!(shown["reason"].as_str().unwrap().contains("exit 65"));
    // Not dead-lettered, so dlq does not know it.
    assert_eq!(code(&db.run(&["dlq", "show", "ship", &input])), 3);
    let out = db.run(&["queue", "check", "ship"]);
    assert_eq!(code(&out), 1);
    assert!(stdout(&out).contains("poison is 2"), "{}", stdout(&out));
    db.ok(&["poison", "queue", "redrive", "ship", &input]);
    assert_eq!(db.queue_stats("ship")["poison"], 1);
    let out = work_once(&db, EFFECT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(db.count("Effect"), 1, "the redriven input ran again");
    let other = facts[2].hash().to_string();
    db.ok(&[
        "poison", "queue", "discard", "ship", &other, "--reason", "bad data",
    ]);
    assert_eq!(code(&db.run(&["queue", "check", "ship"])), 0);
    assert_eq!(db.count("precedent.Discard"), 1);
}

#[test]
fn permanent_failures_go_to_the_dlq_and_check_alerts_until_discarded() {
    let db = Db::initialised();
    let facts = orders(2, false);
    db.import(&facts);
    declare(&db, &["--max-attempts", "1", "--unordered"]);
    assert_eq!(code(&db.run(&["queue", "check"])), 0);
    let out = work_once(&db, "echo first >&2; echo 'disk full' >&2; exit 1");
    assert_eq!(code(&out), 1, "dead letters in this run: {}", stderr(&out));
    assert!(stderr(&out).contains("dead-lettered"), "{}", stderr(&out));
    let list = db.ok(&["dlq", "list", "ship"]);
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(list.contains("exit 1: disk full"), "{list}");
    let a = facts[1].hash().to_string();
    let b = facts[2].hash().to_string();
    let shown = db.json(&["dlq", "show", "ship", &a]);
    assert_eq!(shown["attempts"], 1);
    assert_eq!(shown["entry"]["type"], "precedent.DeadLetter");
    assert_eq!(shown["entry"]["fields"]["queue"], "ship");
    assert!(shown["first_attempt_at"].as_i64().is_some());
    assert!(shown["entry_at"].as_i64().is_some());
    // Shown by the dead letter's hash as well.
    let dl = shown["entry"]["hash"].as_str().unwrap().to_string();
    assert_eq!(db.json(&["dlq", "show", "ship", &dl])["input"]["hash"], a);
    let out = db.run(&["queue", "check"]);
    assert_eq!(code(&out), 1);
    assert!(stdout(&out).contains("queue ship: dead is 2, over the threshold of 0"));
    // Redrive one: it runs and completes.
    db.ok(&["dlq", "redrive", "ship", &a]);
    assert_eq!(db.queue_stats("ship")["dead"], 1);
    work_once(&db, EFFECT);
    assert_eq!(db.count("Effect"), 1);
    // Redriving what is not dead-lettered is refused.
    let out = db.run(&["dlq", "redrive", "ship", &a]);
    assert_ne!(code(&out), 0);
    db.ok(&["dlq", "discard", "ship", &b, "--reason", "customer left"]);
    assert_eq!(code(&db.run(&["queue", "check", "ship"])), 0);
    let s = db.queue_stats("ship");
    assert_eq!(s["discarded"], 1);
    assert_eq!(s["dead"], 0);
    assert!(db.ok(&["export"]).contains("customer left"));
    // --all redrives every dead letter.
    db.import(&orders(4, false)[3..]);
    work_once(&db, "exit 1");
    assert_eq!(db.queue_stats("ship")["dead"], 2);
    db.ok(&["dlq", "redrive", "ship", "--all"]);
    assert_eq!(db.queue_stats("ship")["dead"], 0);
    assert_eq!(db.queue_stats("ship")["ready"], 2);
}

#[test]
fn prometheus_output_is_well_formed() {
    let db = Db::initialised();
    db.import(&orders(3, true));
    declare(&db, &["--alert-depth", "2"]);
    db.ok(&[
        "queue",
        "add",
        "other\"q",
        "--input",
        "X",
        "--done-by",
        "Y.x",
    ]);
    let text = db.ok(&["queue", "stats", "--prometheus"]);
    let mut samples = 0;
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        if line.starts_with('#') {
            assert!(
                line.starts_with("# HELP ") || line.starts_with("# TYPE "),
                "{line}"
            );
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("name{labels} value");
        value.parse::<f64>().expect("a number");
        let (name, labels) = series.split_once('{').expect("labels");
        assert!(labels.ends_with('}'), "{line}");
        assert!(labels.starts_with("queue=\""), "{line}");
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
        names.insert(name.to_string());
        samples += 1;
    }
    // 15 metrics for 2 queues, and the depth alert of the one that has it.
    assert_eq!(
        samples, 31,
        "15 metrics for 2 queues and one threshold:\n{text}"
    );
    assert!(
        text.contains("precedent_queue_depth{queue=\"ship\"} 3\n")
            && text.contains("precedent_queue_depth_alert{queue=\"ship\"} 2\n"),
        "{text}"
    );
    let check = db.run(&["queue", "check", "ship"]);
    assert_eq!(code(&check), 1);
    assert!(
        stdout(&check).contains("queue ship: depth is 3, over the threshold of 2"),
        "{}",
        stdout(&check)
    );
    for n in [
        "ready",
        "blocked",
        "dead",
        "oldest_ready_seconds",
        "completed_total",
        "dropped_total",
        "failures_total",
        "retries_total",
        "redeliveries_total",
        "timeouts_total",
        "depth",
    ] {
        assert!(names.contains(&format!("precedent_queue_{n}")), "{n}");
    }
    assert!(
        text.contains("precedent_queue_ready{queue=\"ship\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("precedent_queue_blocked{queue=\"ship\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains(r#"queue="other\"q""#),
        "label escaped: {text}"
    );
    assert!(text.contains("# TYPE precedent_queue_completed_total counter"));
}

#[test]
fn queue_items_shows_causal_blocking_by_a_dead_letter() {
    let db = Db::initialised();
    let facts = orders(2, true);
    db.import(&facts);
    declare(&db, &["--max-attempts", "1"]);
    let first = facts[1].hash().to_string();
    let second = facts[2].hash().to_string();
    let items = db.ok(&["queue", "items", "ship", "--state", "blocked"]);
    assert_eq!(items.lines().count(), 1);
    assert!(items.contains(&format!("blocked by {first}")), "{items}");
    assert!(!items.contains("dead-lettered"));
    // Only the first is offered; it fails permanently.
    let out = work_once(&db, "exit 9");
    assert_eq!(code(&out), 1, "a dead letter in this run: {}", stderr(&out));
    assert_eq!(
        stderr(&out).matches(" dead-lettered as ").count(),
        1,
        "{}",
        stderr(&out)
    );
    let items = db.ok(&["queue", "items", "ship"]);
    assert!(
        items.contains(&format!(
            "{second}\tblocked\tattempts 0\tblocked by {first}, dead-lettered"
        )),
        "{items}"
    );
    let json: Json = serde_json::from_str(
        db.ok(&["--json", "queue", "items", "ship", "--state", "dead"])
            .trim(),
    )
    .unwrap();
    assert_eq!(json["input"], first);
    // Redriven and completed, the blocked one is released and runs.
    db.ok(&["dlq", "redrive", "ship", &first]);
    work_once(&db, EFFECT);
    assert_eq!(db.count("Effect"), 2);
    assert_eq!(db.ok(&["queue", "items", "ship"]), "");
}

#[test]
fn work_on_an_unknown_queue_is_not_found() {
    let db = Db::initialised();
    let out = db.run(&["work", "nope", "--once", "--", "true"]);
    assert_eq!(code(&out), 3);
    assert!(stderr(&out).contains("no queue named \"nope\""));
}

#[test]
fn sigterm_lets_the_running_command_finish_and_releases_the_rest() {
    let db = Db::initialised();
    db.import(&orders(5, false));
    declare(&db, &["--unordered"]);
    let started = db.path.with_file_name("started");
    let script = format!("touch {}; sleep 1; {EFFECT}", started.display());
    let child = db
        .cmd(&["work", "ship", "--batch", "5", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut waited = 0;
    while !started.exists() {
        waited += 1;
        assert!(waited < 1000, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        db.count("Effect"),
        1,
        "the running command finished and completed"
    );
    let s = db.queue_stats("ship");
    assert_eq!(s["completed"], 1);
    assert_eq!(
        s["ready"], 4,
        "claimed but not started: given back now: {s}"
    );
    assert_eq!(s["leased"], 0);
    let items = db.ok(&["queue", "items", "ship"]);
    assert_eq!(
        items.matches("attempts 0").count(),
        4,
        "released without counting: {items}"
    );
}

#[test]
fn concurrent_jobs_complete_every_input_once() {
    let db = Db::initialised();
    db.import(&orders(40, false));
    declare(&db, &["--unordered"]);
    let out = db.run(&[
        "work", "ship", "-j", "4", "--batch", "3", "--once", "--quiet", "--", "sh", "-c", EFFECT,
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "--quiet");
    assert_eq!(db.count("Effect"), 40);
    assert_eq!(db.queue_stats("ship")["completed"], 40);
}

#[test]
fn a_command_that_cannot_start_stops_the_worker_and_gives_the_input_back() {
    let db = Db::initialised();
    db.import(&orders(1, false));
    declare(&db, &[]);
    let out = db.run(&["work", "ship", "--once", "--", "/nonexistent/handler"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot run /nonexistent/handler"),
        "{}",
        stderr(&out)
    );
    let s = db.queue_stats("ship");
    assert_eq!(s["ready"], 1, "{s}");
    assert_eq!(s["leased"], 0);
    let items = db.ok(&["queue", "items", "ship"]);
    assert!(items.contains("attempts 0"), "not counted: {items}");
}

#[test]
fn dlq_show_prints_times_as_rfc3339() {
    let db = Db::initialised();
    let facts = orders(1, false);
    db.import(&facts);
    declare(&db, &["--max-attempts", "1"]);
    let out = work_once(&db, "exit 1");
    // `--once` exits 1 when its run dead-lettered an input.
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let text = db.ok(&["dlq", "show", "ship", &facts[1].hash().to_string()]);
    for label in ["first attempt", "entered at"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label} line:\n{text}"));
        let at = line.split('\t').nth(1).unwrap_or("");
        // 2026-12-01T11:28:28Z, not 1796124508000.
        assert!(
            at.len() == 20 && at.as_bytes()[10] == b'T' && at.ends_with('Z'),
            "{line}"
        );
    }
}

#[test]
fn queue_add_from_now_and_the_control_options() {
    let db = Db::initialised();
    db.import(&orders(2, false));
    declare(
        &db,
        &[
            "--from-now",
            "--priority",
            "rank",
            "--not-before",
            "at",
            "--max-leased",
            "4",
            "--rate",
            "20/s",
        ],
    );
    let stats = db.queue_stats("ship");
    assert_eq!(stats["depth"], 0, "nothing back-filled: {stats}");
    let shown = db.json(&["queue", "show", "ship"]);
    let q = &shown["queue"];
    assert_eq!(q["priority_field"], "rank");
    assert_eq!(q["not_before_field"], "at");
    assert_eq!(q["max_leased"], 4);
    assert_eq!(q["rate"]["count"], 20);
    assert_eq!(q["rate"]["per_ms"], 1000);
    // Stored from now on: an input.
    let later = Fact::builder("Shop.Order").field("id", 99).build().unwrap();
    db.import(&[later]);
    assert_eq!(db.queue_stats("ship")["ready"], 1);
    let out = db.run(&[
        "queue",
        "add",
        "bad",
        "--input",
        "X",
        "--done-by",
        "Y.x",
        "--rate",
        "fast",
    ]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("bad rate \"fast\""),
        "{}",
        stderr(&out)
    );
}

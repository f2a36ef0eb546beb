//! End-to-end tests of the `precedent` binary against temporary databases.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;

use common::bin::{BIN, Db, code, stderr, stdout};
use precedent::{Fact, FactHash, json};
use serde_json::Value as Json;

impl Db {
    /// A file next to the database.
    fn file(&self, name: &str) -> PathBuf {
        self.path.with_file_name(name)
    }

    fn stats(&self) -> Json {
        self.json(&["stats"])
    }
}

/// A small tree: a root, `n` children of it, and a grandchild per child.
fn tree(n: usize) -> Vec<Fact> {
    let root = Fact::builder("Root").field("name", "r").build().unwrap();
    let mut facts = vec![root.clone()];
    for i in 0..n {
        let child = Fact::builder("Child")
            .field("i", i)
            .predecessor("root", root.hash())
            .build()
            .unwrap();
        let grand = Fact::builder("Grandchild")
            .field("i", i)
            .predecessor("child", child.hash())
            .predecessor("root", root.hash())
            .build()
            .unwrap();
        facts.push(child);
        facts.push(grand);
    }
    facts
}

fn jsonl(facts: &[Fact]) -> String {
    facts
        .iter()
        .map(|f| json::to_json(f).to_string() + "\n")
        .collect()
}

fn write(path: &Path, bytes: impl AsRef<[u8]>) {
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn add_and_get_round_trip_by_hash_prefix_and_cbor() {
    let db = Db::new();
    db.ok(&["init"]);
    let shop = db.ok(&["add", r#"{"type":"Shop","fields":{"name":"corner"}}"#]);
    let shop = shop.trim();
    assert_eq!(shop.len(), 64);
    // A child naming its shop by an 8-digit prefix, given on stdin.
    let child = format!(
        r#"{{"type":"Shop.Order","fields":{{"id":7}},"predecessors":{{"shop":"{}"}}}}"#,
        &shop[..8]
    );
    let out = db.run_with(&["--json", "add"], child.as_bytes());
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let added: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(added["outcome"], "inserted");
    let order = added["hash"].as_str().unwrap().to_string();

    let got: Json = serde_json::from_str(&db.ok(&["--json", "get", &order[..10]])).unwrap();
    assert_eq!(got["status"], "released");
    assert_eq!(got["seq"], 2);
    assert_eq!(got["fact"]["hash"], order.as_str());
    assert_eq!(got["fact"]["predecessors"]["shop"], shop);
    assert_eq!(got["fact"]["fields"]["id"], 7);

    // Human output is the JSON form, which reads back as the same fact.
    let pretty = db.ok(&["get", shop]);
    let again = json::parse_standalone(&pretty).unwrap();
    assert_eq!(again.last().unwrap().hash().to_string(), shop);

    let out = db.run(&["get", "--cbor", &order[..8]]);
    assert_eq!(code(&out), 0);
    assert_eq!(FactHash::of_canonical(&out.stdout).to_string(), order);
    let fact = Fact::from_canonical(&out.stdout).unwrap();
    assert_eq!(fact.type_name(), "Shop.Order");
}

#[test]
fn add_reports_held_then_duplicate_and_stores_inline_facts_first() {
    let db = Db::new();
    let parent = Fact::builder("P").field("n", 1).build().unwrap();
    let child = Fact::builder("C")
        .predecessor("p", parent.hash())
        .build()
        .unwrap();
    let text = json::to_json(&child).to_string();
    let held: Json = serde_json::from_str(&db.ok(&["--json", "add", &text])).unwrap();
    assert_eq!(held["outcome"], "held");
    assert_eq!(held["missing"][0], parent.hash().to_string());
    let dup: Json = serde_json::from_str(&db.ok(&["--json", "add", &text])).unwrap();
    assert_eq!(dup["outcome"], "duplicate");

    // An inline predecessor is stored first, in the same transaction.
    let inline = r#"{"type":"C","predecessors":{"p":{"type":"P","fields":{"n":1}}}}"#;
    let out: Json = serde_json::from_str(&db.ok(&["--json", "add", inline])).unwrap();
    assert_eq!(out["hash"], child.hash().to_string());
    assert_eq!(out["outcome"], "duplicate");
    assert_eq!(out["inline"][0]["hash"], parent.hash().to_string());
    assert_eq!(out["inline"][0]["outcome"], "inserted");
    assert_eq!(out["inline"][0]["released"], 2);
    let stats = db.stats();
    assert_eq!(stats["released"], 2);
    assert_eq!(stats["held"], 0);
}

/// `held --limit 0` with facts held says how many, not that none are.
#[test]
fn held_with_limit_zero_counts_what_it_does_not_show() {
    let db = Db::new();
    let parent = Fact::builder("P").field("n", 1).build().unwrap();
    for n in 0..2 {
        let child = Fact::builder("C")
            .field("n", n)
            .predecessor("p", parent.hash())
            .build()
            .unwrap();
        db.ok(&["add", &json::to_json(&child).to_string()]);
    }
    let text = db.ok(&["held", "--limit", "0"]);
    assert!(!text.contains("no held facts"), "{text}");
    assert!(
        text.contains("showing the 0 oldest of 2 held facts"),
        "{text}"
    );
    let text = db.ok(&["held", "--limit", "1"]);
    assert!(
        text.contains("showing the 1 oldest of 2 held facts"),
        "{text}"
    );
}

#[test]
fn unknown_and_short_prefixes_are_clear_errors() {
    let db = Db::new();
    db.ok(&["add", r#"{"type":"T"}"#]);
    let out = db.run(&["get", "00000000"]);
    assert_eq!(code(&out), 3);
    assert_eq!(stderr(&out), "error: no fact matches prefix 00000000\n");

    let full = "0".repeat(64);
    let out = db.run(&["get", &full]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(stderr(&out).contains(&full));

    let out = db.run(&["get", "abc123"]);
    assert_eq!(code(&out), 1);
    let err = stderr(&out);
    assert!(
        err.starts_with("error: ") && err.contains("abc123"),
        "{err}"
    );
    assert!(err.contains("at least 8 hex digits"), "{err}");
    assert_eq!(err.lines().count(), 1);

    // Unknown prefix as a predecessor in `add`: not found, nothing stored.
    let out = db.run(&["add", r#"{"type":"U","predecessors":{"p":"ffffffff"}}"#]);
    assert_eq!(code(&out), 3);
    assert!(stderr(&out).contains("ffffffff"));
    assert_eq!(db.stats()["released"], 1);
}

#[test]
fn bad_json_and_bad_arguments_have_their_exit_codes() {
    let db = Db::new();
    let out = db.run(&["add", r#"{"type":"T","fields":{"x":{"$float":"NaN"}}}"#]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("fields.x"), "{}", stderr(&out));
    let out = db.run(&["frobnicate"]);
    assert_eq!(code(&out), 2);
    let out = db.run(&["export", "--format", "xml"]);
    assert_eq!(code(&out), 2);
}

#[test]
fn read_commands_refuse_a_missing_database() {
    let db = Db::new();
    let out = db.run(&["stats"]);
    assert_eq!(code(&out), 4);
    assert!(stderr(&out).contains("no database at"), "{}", stderr(&out));
    assert!(!db.path.exists());
}

#[test]
fn reversed_jsonl_import_releases_everything() {
    let db = Db::new();
    let mut facts = tree(40);
    facts.reverse();
    let file = db.file("reversed.jsonl");
    write(&file, jsonl(&facts));
    let out = db.run(&["--json", "import", file.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["inserted"], 81);
    assert_eq!(report["released"], 81);
    assert_eq!(report["held"], 0);
    assert_eq!(report["invalid"], 0);
    let stats = db.stats();
    assert_eq!(stats["released"], 81);
    assert_eq!(stats["held"], 0);
    assert_eq!(stats["per_type"]["Grandchild"], 40);
    assert_eq!(db.ok(&["--json", "held"]), "");
    // Importing again changes nothing.
    let again: Json =
        serde_json::from_str(&db.ok(&["--json", "import", file.to_str().unwrap()])).unwrap();
    assert_eq!(again["duplicate"], 81);
    assert_eq!(again["inserted"], 0);
}

#[test]
fn import_resolves_prefixes_to_earlier_records_of_the_same_file() {
    let db = Db::new();
    let root = Fact::builder("Root").build().unwrap();
    let prefix = root.hash().short(10);
    let text = format!(
        "{}\n\n{{\"type\":\"Leaf\",\"predecessors\":{{\"root\":\"{prefix}\"}}}}\n",
        json::to_json(&root)
    );
    let out = db.run_with(&["--json", "import", "-"], text.as_bytes());
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["inserted"], 2);
    assert_eq!(db.stats()["per_type"]["Leaf"], 1);
}

#[test]
fn import_stores_valid_lines_and_names_the_invalid_ones() {
    let db = Db::new();
    let facts = tree(2);
    let mut mismatched = json::to_json(&facts[1]);
    mismatched.insert("hash", facts[0].hash().to_string());
    let lines = [
        json::to_json(&facts[0]).to_string(), // 1
        r#"{"type":"T","fields":{"x":{"$float":"NaN"}}}"#.to_string(), // 2
        json::to_json(&facts[1]).to_string(), // 3
        "not json at all".to_string(),        // 4
        String::new(),                        // 5 blank
        r#"{"type":"T","fields":{"x":18446744073709551616}}"#.to_string(), // 6
        mismatched.to_string(),               // 7
        r#"{"type":"T","predecessors":{"p":"12345678"}}"#.to_string(), // 8
        json::to_json(&facts[2]).to_string(), // 9
    ];
    let file = db.file("mixed.jsonl");
    write(&file, lines.join("\n") + "\n");
    let out = db.run(&["import", file.to_str().unwrap()]);
    assert_eq!(code(&out), 1);
    let err = stderr(&out);
    for n in [2, 4, 6, 7, 8] {
        assert!(
            err.contains(&format!("line {n}: ")),
            "line {n} missing: {err}"
        );
    }
    for n in [1, 3, 5, 9] {
        assert!(
            !err.contains(&format!("line {n}: ")),
            "line {n} listed: {err}"
        );
    }
    assert!(
        err.contains("line 2: ") && err.contains("fields.x"),
        "{err}"
    );
    assert!(err.contains("line 7: hash mismatch"), "{err}");
    assert!(
        err.contains("line 8: no fact matches prefix 12345678"),
        "{err}"
    );
    assert_eq!(db.stats()["released"], 3);
}

/// A JSON Lines file whose first line is bad (a header, a stray `[`), or which starts
/// with a UTF-8 byte order mark, is still read as JSON Lines: the bad line is listed and
/// every valid line stored. (Only a fact's CBOR array head, 0x84, means a CBOR sequence.)
#[test]
fn a_bad_first_line_or_a_byte_order_mark_keeps_json_lines() {
    let good = jsonl(&tree(1));
    for (start, listed) in [
        ("id,type\n", Some("line 1: ")),
        ("[\n", Some("line 1: ")),
        ("\u{feff}", None),
        ("\u{feff}\n  \n", None),
    ] {
        let db = Db::init();
        let file = db.file("first.jsonl");
        write(&file, format!("{start}{good}"));
        let out = db.run(&["import", file.to_str().unwrap()]);
        let err = stderr(&out);
        match listed {
            Some(label) => {
                assert_eq!(code(&out), 1, "{start:?}: {err}");
                assert!(err.contains(label), "{start:?}: {err}");
                assert!(err.contains("1 of 4 records"), "{start:?}: {err}");
            }
            None => assert_eq!(code(&out), 0, "{start:?}: {err}"),
        }
        assert!(!err.contains("cbor"), "{start:?}: {err}");
        assert_eq!(db.stats()["released"], 3, "{start:?}: {err}");
    }
}

#[test]
fn atomic_import_with_a_bad_line_stores_nothing() {
    let db = Db::new();
    let mut text = jsonl(&tree(3));
    text.push_str("{\"type\":\n");
    let file = db.file("atomic.jsonl");
    write(&file, &text);
    let out = db.run(&["import", "--atomic", file.to_str().unwrap()]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("line 8: "), "{}", stderr(&out));
    assert!(stderr(&out).contains("stored nothing"), "{}", stderr(&out));
    assert_eq!(db.stats()["released"], 0);
    // Without the bad line, the same import stores everything.
    write(&file, jsonl(&tree(3)));
    db.ok(&["import", "--atomic", file.to_str().unwrap()]);
    assert_eq!(db.stats()["released"], 7);
}

#[test]
fn cbor_export_reimports_to_an_identical_export() {
    let one = Db::new();
    one.ok(&["demo"]);
    let mut facts = tree(30);
    facts.reverse();
    let file = one.file("tree.jsonl");
    write(&file, jsonl(&facts));
    one.ok(&["import", file.to_str().unwrap()]);
    let cbor = one.run(&["export", "--format", "cbor"]).stdout;
    assert!(!cbor.is_empty());
    let two = Db::new();
    // Sniffed as CBOR on stdin.
    let out = two.run_with(&["--json", "import", "-"], &cbor);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["inserted"], 28 + 61);
    assert_eq!(two.run(&["export", "--format", "cbor"]).stdout, cbor);
    assert_eq!(two.ok(&["export"]), one.ok(&["export"]));
    // --after and -o.
    let tail = two.file("tail.jsonl");
    two.ok(&["export", "--after", "79", "-o", tail.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&tail).unwrap().lines().count(), 10);
}

#[test]
fn bad_cbor_records_are_named_by_record_and_offset() {
    let db = Db::new();
    let facts = tree(1);
    let mut seq = facts[0].canonical_bytes().to_vec();
    let second_at = seq.len();
    // A non-canonical integer head: 0x18 0x05 encodes 5 in two bytes. The record still
    // frames, so the records after it are read.
    let mut bad = facts[1].canonical_bytes().to_vec();
    bad[1] = 0x18;
    bad.insert(2, 0x01);
    seq.extend_from_slice(&bad);
    seq.extend_from_slice(facts[1].canonical_bytes());
    seq.extend_from_slice(facts[2].canonical_bytes());
    let file = db.file("bad.cbor");
    write(&file, &seq);
    let out = db.run(&["import", file.to_str().unwrap()]);
    assert_eq!(code(&out), 1);
    let err = stderr(&out);
    assert!(
        err.contains(&format!("record 2 (byte offset {second_at}): ")),
        "{err}"
    );
    assert_eq!(db.stats()["released"], 3);
}

#[test]
fn held_lists_missing_hashes() {
    let db = Db::new();
    let absent = Fact::builder("Absent").build().unwrap();
    let waiting = Fact::builder("Waiting")
        .predecessor("a", absent.hash())
        .build()
        .unwrap();
    db.ok(&["add", &json::to_json(&waiting).to_string()]);
    let line: Json = serde_json::from_str(db.ok(&["--json", "held"]).trim()).unwrap();
    assert_eq!(line["hash"], waiting.hash().to_string());
    assert_eq!(line["type"], "Waiting");
    assert_eq!(line["missing"][0], absent.hash().to_string());
    let table = db.ok(&["held"]);
    assert!(table.contains(&absent.hash().to_string()), "{table}");
    let got = db.run(&["get", &waiting.hash().short(8)]);
    assert!(stderr(&got).contains("held"), "{}", stderr(&got));
    // Its parent arrives: nothing is held any more.
    db.ok(&["add", &json::to_json(&absent).to_string()]);
    assert_eq!(db.ok(&["--json", "held"]), "");
    assert_eq!(db.stats()["released"], 2);
}

#[test]
fn max_held_refuses_past_the_bound() {
    let db = Db::new();
    let facts: Vec<Fact> = (0..3)
        .map(|i| {
            Fact::builder("W")
                .field("i", i)
                .predecessor("p", FactHash([9; 32]))
                .build()
                .unwrap()
        })
        .collect();
    let file = db.file("w.jsonl");
    write(&file, jsonl(&facts));
    let out = db.run(&[
        "--max-held",
        "2",
        "--json",
        "import",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 1);
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["refused"], 1);
    assert_eq!(report["held"], 2);
    assert!(
        stderr(&out).contains("held-fact limit of 2"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn verify_is_clean_then_names_a_corrupted_row() {
    let db = Db::new();
    db.ok(&["demo"]);
    let out = db.run(&["verify"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("checked 28 released"));
    let first = db.ok(&["export"]);
    let first: Json = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    let other = Fact::builder("Forged").build().unwrap();
    {
        let conn = rusqlite::Connection::open(&db.path).unwrap();
        conn.execute(
            "UPDATE fact SET bytes = ?1 WHERE seq = 1",
            [other.canonical_bytes()],
        )
        .unwrap();
    }
    let out = db.run(&["verify"]);
    assert_eq!(code(&out), 1);
    let err = stderr(&out);
    assert!(err.contains(first["hash"].as_str().unwrap()), "{err}");
    let verdict: Json = serde_json::from_slice(&db.run(&["--json", "verify"]).stdout).unwrap();
    assert_eq!(verdict["clean"], false);
}

#[test]
fn demo_runs_twice_and_reports_duplicates_the_second_time() {
    let db = Db::new();
    let first = db.ok(&["demo"]);
    assert!(first.contains("HELD"), "{first}");
    assert!(first.contains("RELEASED"), "{first}");
    // The queue part: pending work, a completion, a retry, a dead letter, a watch.
    assert!(first.contains("watch: order #4 opened"), "{first}");
    assert!(first.contains("watch: order #4 closed"), "{first}");
    assert!(first.contains("it will be retried"), "{first}");
    assert!(first.contains("out of attempts, dead letter"), "{first}");
    // The sync part: everything pushed, the branch's one new fact pulled back.
    assert!(first.contains("pushed 27, pulled 0"), "{first}");
    assert!(first.contains("of which 1 new here"), "{first}");
    // The branch's server is gone with the demo: it is not left behind as a peer.
    let peers = db.ok(&["peers"]);
    assert!(!peers.contains("127.0.0.1"), "{peers}");
    let stats = db.stats();
    assert_eq!(stats["released"], 28);
    assert_eq!(stats["per_type"]["precedent.DeadLetter"], 1);
    assert_eq!(stats["held"], 0);
    let second = db.ok(&["demo"]);
    assert!(second.contains("already holds the demo facts"), "{second}");
    assert!(second.contains("duplicate"), "{second}");
    assert!(!second.contains("HELD,"), "{second}");
    assert!(
        second.contains("ran when this database was built"),
        "{second}"
    );
    assert_eq!(db.stats(), stats);
}

#[test]
fn stats_json_has_the_counts() {
    let db = Db::new();
    db.ok(&["init"]);
    let empty = db.stats();
    assert_eq!(empty["released"], 0);
    db.ok(&["demo"]);
    let s = db.stats();
    assert_eq!(s["released"], 28);
    assert_eq!(s["per_type"]["Shop.Order.Item"], 9);
    assert!(s["edges"].as_u64().unwrap() > 0);
    assert!(s["db_bytes"].as_u64().unwrap() > 0);
    let table = db.ok(&["stats"]);
    assert!(table.contains("Shop.Order.Item"), "{table}");
}

#[test]
fn export_to_a_closed_reader_is_not_an_error() {
    let db = Db::new();
    let facts: Vec<Fact> = (0..3000)
        .map(|i| {
            Fact::builder("Filler")
                .field("i", i)
                .field("text", "x".repeat(200))
                .build()
                .unwrap()
        })
        .collect();
    let file = db.file("filler.jsonl");
    write(&file, jsonl(&facts));
    db.ok(&["import", file.to_str().unwrap()]);
    let mut child = db
        .cmd(&["export"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 100];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
}

#[test]
fn a_newer_schema_is_refused() {
    let db = Db::new();
    db.ok(&["init"]);
    {
        let conn = rusqlite::Connection::open(&db.path).unwrap();
        conn.pragma_update(None, "user_version", 999).unwrap();
    }
    for args in [&["stats"][..], &["add", r#"{"type":"T"}"#], &["init"]] {
        let out = db.run(args);
        assert_eq!(code(&out), 4, "{args:?}");
        let err = stderr(&out);
        assert!(err.starts_with("error: "), "{err}");
        assert!(err.contains("999") && err.contains("newer"), "{err}");
        assert!(err.contains(db.path.to_str().unwrap()), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn init_prints_the_path_and_honours_the_environment() {
    let db = Db::new();
    let out = Command::new(BIN)
        .arg("init")
        .env("PRECEDENT_DB", &db.path)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0);
    let printed = PathBuf::from(stdout(&out).trim());
    assert_eq!(
        printed.canonicalize().unwrap(),
        db.path.canonicalize().unwrap()
    );
}

/// `--help` does not print `PRECEDENT_DB`'s value, which may hold a password.
#[test]
fn help_does_not_show_the_database_url() {
    for args in [&["--help"][..], &["serve", "--help"]] {
        let out = Command::new(BIN)
            .args(args)
            .env("PRECEDENT_DB", "postgres://app:hunter2@db.example/hub")
            .output()
            .unwrap();
        assert_eq!(code(&out), 0);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("PRECEDENT_DB"), "{text}");
        assert!(!text.contains("hunter2"), "{args:?}: {text}");
    }
}

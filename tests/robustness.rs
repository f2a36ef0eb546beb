//! The bad-input catalogue of `docs/robustness.md`: one test per row, named after it.
//! Each feeds one kind of bad input to the library, the `precedent` binary or the sync
//! server on 127.0.0.1, and asserts the documented answer (error text, exit code or HTTP
//! status) and what is stored afterwards (nothing, unless the row says otherwise).

mod common;
mod sync_support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Output;
use std::time::Duration;

use common::bin::{Db, code, stderr, stdout};
use common::{fact, shop};
use precedent::query::{Arity, FactType, Givens, Query, Ref};
use precedent::{Error, Fact, FactHash, Store, json};
use sync_support::{CBOR, JSON_CT, Node, http, tokens};

const INJECTION: &str = "'; DROP TABLE fact; --";

// ---------------------------------------------------------------------------------------
// Helpers

/// Asserts an exit code and a fragment of stderr.
fn assert_fails(out: &Output, code: i32, fragment: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(fragment), "{fragment:?} not in stderr: {err}");
}

/// A CBOR record refused by the decoder with `fragment`, and by `precedent import` (exit 1,
/// the record reported, nothing stored).
fn cbor_refused(bytes: &[u8], fragment: &str) {
    let err = Fact::from_canonical(bytes).unwrap_err();
    assert!(matches!(err, Error::Decode { .. }), "{err}");
    assert!(
        err.to_string().contains(fragment),
        "{fragment:?} not in {err}"
    );
    let db = Db::init();
    let file = db.path.with_file_name("bad.cbor");
    std::fs::write(&file, bytes).unwrap();
    let out = db.run_with(&["import", "--format", "cbor", file.to_str().unwrap()], b"");
    assert_fails(&out, 1, "record 1 (byte offset 0)");
    assert_eq!(db.counts(), (0, 0));
}

/// A JSON fact refused by the library with `fragment`, and by `precedent add` (exit 1,
/// nothing stored).
fn json_refused(text: &str, fragment: &str) {
    let err = json::parse_standalone(text).unwrap_err();
    assert!(
        err.to_string().contains(fragment),
        "{fragment:?} not in {err}"
    );
    let db = Db::init();
    let out = db.run_with(&["add", "-"], text.as_bytes());
    assert_fails(&out, 1, fragment);
    assert_eq!(db.counts(), (0, 0));
}

fn hex(s: &str) -> Vec<u8> {
    hex::decode(s).unwrap()
}

/// The minimal fact `[1, "T", {}, {}]` is `84 01 61 54 a0 a0`; the rows below bend it.
const MINIMAL: &str = "84016154a0a0";

// ---------------------------------------------------------------------------------------
// Canonical CBOR

#[test]
fn cbor_truncated_record() {
    let cut = hex("840161");
    cbor_refused(&cut, "unexpected end of input");
    let framing = precedent::sync::wire::split_records(&cut);
    assert!(framing[0].as_ref().is_err_and(|e| e.truncated));
}

#[test]
fn cbor_not_a_fact_array() {
    cbor_refused(&hex("05"), "expected a fact array");
}

#[test]
fn cbor_non_shortest_head() {
    cbor_refused(&hex("9804016154a0a0"), "not in its shortest form");
}

#[test]
fn cbor_indefinite_length() {
    cbor_refused(&hex("9f016154a0a0ff"), "indefinite length");
}

#[test]
fn cbor_unsorted_keys() {
    cbor_refused(&hex("84016154a2616201616101a0"), "out of canonical order");
}

#[test]
fn cbor_duplicate_keys() {
    cbor_refused(&hex("84016154a2616101616101a0"), "duplicate map key");
}

#[test]
fn cbor_non_shortest_float() {
    // 1.0 as a double, and 1.5 as a single: both fit in a half.
    cbor_refused(
        &hex("84016154a16176fb3ff0000000000000a0"),
        "shortest exact form",
    );
    cbor_refused(&hex("84016154a16176fa3fc00000a0"), "shortest exact form");
}

#[test]
fn cbor_nan() {
    cbor_refused(&hex("84016154a16176f97e00a0"), "NaN is not allowed");
}

#[test]
fn cbor_tag() {
    cbor_refused(&hex(&format!("c0{MINIMAL}")), "expected a fact array");
    // A tag inside the fields (tag 1 on an integer).
    cbor_refused(&hex("84016154a16176c101a0"), "invalid canonical cbor");
}

#[test]
fn cbor_undefined() {
    cbor_refused(&hex("84016154a16176f7a0"), "undefined is not allowed");
}

#[test]
fn cbor_trailing_bytes() {
    // To the decoder, one record with a byte after the fact.
    let err = Fact::from_canonical(&hex(&format!("{MINIMAL}00"))).unwrap_err();
    assert!(err.to_string().contains("trailing bytes"), "{err}");
    // In a CBOR sequence the trailing byte is a second record, refused; the first is stored.
    let db = Db::init();
    let file = db.path.with_file_name("t.cbor");
    std::fs::write(&file, hex(&format!("{MINIMAL}00"))).unwrap();
    let out = db.run_with(&["import", "--format", "cbor", file.to_str().unwrap()], b"");
    assert_fails(&out, 1, "record 2");
    assert_eq!(db.counts(), (1, 0));
}

#[test]
fn cbor_unsupported_format_version() {
    cbor_refused(&hex("84026154a0a0"), "unsupported format version 2");
}

#[test]
fn cbor_invalid_utf8() {
    cbor_refused(&hex("840162c328a0a0"), "not valid utf-8");
}

#[test]
fn cbor_deep_nesting() {
    // The `depth-limit` hash vector nests 63 arrays in field "deep" (64 levels with the
    // fields map); one more array is one level past the limit.
    let nested = |n: usize| hex(&format!("84016154a16464656570{}f6a0", "81".repeat(n)));
    assert!(Fact::from_canonical(&nested(63)).is_ok());
    cbor_refused(&nested(64), "nesting deeper than 64 levels");
    // Very deep nesting is refused by the framing, without recursion.
    let mut deep = vec![0x84, 0x01, 0x61, 0x54, 0xa1, 0x61, 0x64];
    deep.extend(std::iter::repeat_n(0x81, 100_000));
    assert!(Fact::from_canonical(&deep).is_err());
    assert!(precedent::encoding::item_len(&deep).is_err());
}

#[test]
fn cbor_oversize_fact() {
    // A byte string field of 1 MiB: the record is over the 1 MiB fact limit.
    let mut b = hex("84016154a161765a00100000");
    b.extend(std::iter::repeat_n(0u8, 1 << 20));
    b.push(0xa0);
    cbor_refused(&b, "limit");
}

#[test]
fn cbor_huge_declared_length() {
    // A text head claiming 2^64-1 bytes, with none following.
    let b = hex("84016154a161767bffffffffffffffff");
    cbor_refused(&b, "unexpected end of input");
    let framing = precedent::encoding::item_len(&b).unwrap_err();
    assert!(
        framing.to_string().contains("over the size limit"),
        "{framing}"
    );
}

#[test]
fn cbor_bad_predecessor_hash() {
    // A predecessor hash of 31 bytes.
    let b = hex(&format!("84016154a0a1617081581f{}", "ab".repeat(31)));
    cbor_refused(&b, "a predecessor hash is 32 bytes");
}

#[test]
fn cbor_unsorted_predecessors() {
    // The same hash twice in one role.
    let h = "ab".repeat(32);
    let b = hex(&format!("84016154a0a16170825820{h}5820{h}"));
    cbor_refused(&b, "predecessor hashes not sorted or duplicated");
}

#[test]
fn cbor_empty_predecessor_role() {
    cbor_refused(&hex("84016154a0a1617080"), "empty predecessor role");
}

// ---------------------------------------------------------------------------------------
// The JSON form

#[test]
fn json_malformed() {
    json_refused("{\"type\":", "EOF while parsing");
    json_refused("[1, 2]", "a fact must be a JSON object");
}

#[test]
fn json_unknown_key() {
    json_refused(r#"{"type": "T", "typo": 1}"#, "unknown key");
}

#[test]
fn json_empty_type_name() {
    json_refused(r#"{"type": "", "fields": {}}"#, "type name is empty");
}

#[test]
fn json_integer_out_of_range() {
    json_refused(
        r#"{"type": "T", "fields": {"v": 18446744073709551616}}"#,
        "outside -2^64..2^64-1",
    );
}

#[test]
fn json_nan_float() {
    json_refused(
        r#"{"type": "T", "fields": {"v": {"$float": "NaN"}}}"#,
        "is not allowed",
    );
}

#[test]
fn json_deep_nesting() {
    let nested = |n: usize| {
        format!(
            r#"{{"type": "T", "fields": {{"d": {}{}}}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    assert!(json::parse_standalone(&nested(63)).is_ok());
    json_refused(&nested(64), "nesting deeper than 64 levels");
    // Deeper than the JSON parser recurses: refused, no stack overflow.
    json_refused(&nested(100_000), "recursion limit exceeded");
}

#[test]
fn json_oversize_fact() {
    let text = format!(
        r#"{{"type": "T", "fields": {{"s": "{}"}}}}"#,
        "x".repeat(1 << 20)
    );
    json_refused(&text, "over the limit of 1048576");
}

#[test]
fn json_wrong_hash() {
    let text = r#"{"type": "T", "fields": {"x": 1},
        "hash": "a1c45b0c1d0c390f478cef11945af4dd5a7433cd95295cfb9ab8fb4cf48ff554"}"#;
    let err = json::parse_standalone(text).unwrap_err();
    assert!(matches!(err, Error::HashMismatch { .. }), "{err}");
    json_refused(text, "hash mismatch");
}

/// JSON leaves a repeated key's meaning open (serde_json keeps the last value), so one text
/// could hash as two facts: every level refuses one, naming it and its path.
#[test]
fn json_duplicate_keys() {
    let h = "ab".repeat(32);
    let cases = [
        (
            r#"{"type": "A", "type": "B"}"#.to_string(),
            r#"duplicate key "type" at the top level"#,
        ),
        (
            r#"{"type": "T", "fields": {"a": 1, "a": 2}}"#.to_string(),
            r#"duplicate key "a" at fields"#,
        ),
        (
            format!(r#"{{"type": "T", "predecessors": {{"p": "{h}", "p": "{h}"}}}}"#),
            r#"duplicate key "p" at predecessors"#,
        ),
        (
            r#"{"type": "T", "predecessors": {"p": [{"type": "S", "fields": {"n": 1, "n": 1}}]}}"#
                .to_string(),
            r#"duplicate key "n" at predecessors.p[0].fields"#,
        ),
        (
            r#"{"type": "T", "fields": {"m": {"$bytes": "00", "$bytes": "01"}}}"#.to_string(),
            r#"duplicate key "$bytes" at fields.m"#,
        ),
    ];
    for (text, want) in cases {
        json_refused(&text, want);
    }
}

#[test]
fn json_too_many_predecessors() {
    let hashes: Vec<String> = (0..1025u32).map(|i| format!("{i:064x}")).collect();
    let text = serde_json::json!({"type": "T", "predecessors": {"p": hashes}}).to_string();
    json_refused(&text, "1025 predecessors, over the limit of 1024");
}

#[test]
fn json_type_name_too_long() {
    let text = format!(r#"{{"type": "{}"}}"#, "T".repeat(256));
    json_refused(&text, "type name is 256 bytes, over the limit of 255");
}

#[test]
fn json_import_bad_line() {
    // One bad line among good ones: reported by line, exit 1, the good lines stored.
    let db = Db::init();
    let input = "{\"type\": \"A\"}\n{\"type\": \n{\"type\": \"B\"}\n";
    let out = db.run_with(&["import", "-"], input.as_bytes());
    assert_fails(&out, 1, "line 2");
    assert_eq!(db.counts(), (2, 0));
    // With --atomic, nothing at all.
    let db = Db::init();
    let out = db.run_with(&["import", "--atomic", "-"], input.as_bytes());
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(db.counts(), (0, 0));
}

#[test]
fn json_not_utf8() {
    let db = Db::init();
    let out = db.run_with(
        &["import", "--format", "json", "-"],
        b"{\"type\": \"\xff\"}\n",
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(db.counts(), (0, 0));
}

// ---------------------------------------------------------------------------------------
// Ancestors, held bound, prefixes, types

#[test]
fn missing_ancestors() {
    let store = Store::open_in_memory().unwrap();
    let absent = FactHash([7; 32]);
    let orphan = fact("Orphan", 1, &[absent]);
    assert!(store.insert(&orphan).unwrap().is_held());
    assert_eq!(store.count_and_max_seq().unwrap().0, 0);
    assert_eq!(store.held_count().unwrap(), 1);
    let db = Db::init();
    let out = db.run_with(&["add", "-"], json::to_json(&orphan).to_string().as_bytes());
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("held"));
    assert_eq!(db.counts(), (0, 1));
}

#[test]
fn over_the_held_bound() {
    let db = Db::init();
    let absent = FactHash([7; 32]);
    for (i, want) in [(1, 0), (2, 1)] {
        let text = json::to_json(&fact("Orphan", i, &[absent])).to_string();
        let out = db.run_with(&["--max-held", "1", "add", "-"], text.as_bytes());
        if want == 0 {
            assert_eq!(out.status.code(), Some(0));
        } else {
            assert_fails(&out, 1, "held-fact limit of 1 reached");
        }
    }
    assert_eq!(db.counts(), (0, 1));
}

#[test]
fn unknown_prefix() {
    let db = Db::init();
    db.store().insert(&fact("A", 1, &[])).unwrap();
    let out = db.run_with(&["get", "deadbeef"], b"");
    assert_fails(&out, 3, "no fact matches prefix deadbeef");
    let out = db.run_with(
        &["add", "-"],
        br#"{"type": "B", "predecessors": {"p": "deadbeef"}}"#,
    );
    assert_fails(&out, 3, "no fact matches prefix");
    assert_eq!(db.counts(), (1, 0));
}

#[test]
fn bad_prefix() {
    let db = Db::init();
    assert_fails(
        &db.run_with(&["get", "dead"], b""),
        1,
        "at least 8 hex digits",
    );
    assert_fails(&db.run_with(&["get", "zzzzzzzz"], b""), 1, "bad hash");
}

#[test]
fn ambiguous_prefix() {
    // Two facts whose hashes share their first 8 hex digits, found by a birthday search
    // (about 80,000 facts for even odds; the search is deterministic).
    let mut seen: HashMap<[u8; 4], i64> = HashMap::new();
    let (a, b) = (0..2_000_000)
        .find_map(|n| {
            let f = fact("Amb", n, &[]);
            let key: [u8; 4] = f.hash().0[..4].try_into().unwrap();
            seen.insert(key, n).map(|m| (fact("Amb", m, &[]), f))
        })
        .unwrap();
    let db = Db::init();
    db.store().insert_batch(vec![a.clone(), b.clone()]).unwrap();
    let prefix = &a.hash().to_string()[..8];
    assert_eq!(prefix, &b.hash().to_string()[..8]);
    let out = db.run_with(&["get", prefix], b"");
    assert_fails(&out, 3, "is ambiguous");
    let text = format!(r#"{{"type": "C", "predecessors": {{"p": "{prefix}"}}}}"#);
    assert_fails(
        &db.run_with(&["add", "-"], text.as_bytes()),
        3,
        "is ambiguous",
    );
    assert_eq!(db.counts(), (2, 0));
}

#[derive(serde::Serialize, serde::Deserialize, Debug)]
struct Shop {
    name: String,
}

impl FactType for Shop {
    const TYPE: &'static str = "Shop";
    const PREDECESSORS: &'static [(&'static str, Arity)] = &[];
}

#[test]
fn typed_load_of_another_type() {
    let store = Store::open_in_memory().unwrap();
    let other = fact("Warehouse", 1, &[]);
    store.insert(&other).unwrap();
    let err = store.load(Ref::<Shop>::new(other.hash())).unwrap_err();
    assert!(matches!(err, Error::WrongType { .. }), "{err}");
    assert!(
        err.to_string().contains("is a Warehouse, not a Shop"),
        "{err}"
    );
    // A fact of the right type whose fields do not fit the Rust type.
    let odd = Fact::builder("Shop").field("name", 5).build().unwrap();
    store.insert(&odd).unwrap();
    assert!(store.load(Ref::<Shop>::new(odd.hash())).is_err());
}

#[test]
fn unknown_queue() {
    let db = Db::init();
    assert_fails(
        &db.run_with(&["queue", "show", "nope"], b""),
        3,
        "no queue named \"nope\"",
    );
    assert_fails(
        &db.run_with(&["work", "nope", "--", "true"], b""),
        3,
        "no queue named",
    );
    assert_eq!(db.counts(), (0, 0));
}

// ---------------------------------------------------------------------------------------
// The first hour (issue 16): held leftovers, peers, opening the database, serving

/// A store with one released fact and one fact held behind a mistyped hash.
fn typo_db() -> (Db, Fact, Fact) {
    let db = Db::init();
    let root = fact("Root", 1, &[]);
    let held = fact("A", 1, &[FactHash([7; 32])]);
    let store = db.store();
    store.insert(&root).unwrap();
    store.insert(&held).unwrap();
    (db, root, held)
}

#[test]
fn held_drop_of_a_released_fact() {
    let (db, root, held) = typo_db();
    let (root, held) = (root.hash().to_string(), held.hash().to_string());
    let out = db.run(&["held", "drop", &held, &root]);
    assert_fails(&out, 1, &format!("fact {root} is released, not held"));
    assert_eq!(db.counts(), (1, 1));
    // The held one alone, by prefix: dropped and printed.
    assert_eq!(db.ok(&["held", "drop", &held[..8]]).trim(), held);
    assert_eq!(db.counts(), (1, 0));
    db.assert_clean();
}

#[test]
fn held_drop_of_an_unknown_hash() {
    let (db, _, held) = typo_db();
    let held = held.hash().to_string();
    let out = db.run(&["held", "drop", &held, "deadbeef"]);
    assert_fails(&out, 3, "no fact matches prefix deadbeef");
    let out = db.run(&["held", "drop", "dead"]);
    assert_fails(&out, 1, "at least 8 hex digits");
    let out = db.run(&["held", "drop"]);
    assert_fails(&out, 2, "<HASH>");
    assert_eq!(db.counts(), (1, 1));
}

#[test]
fn held_expire_bad_duration() {
    let (db, _, held) = typo_db();
    for bad in ["1x", "soon", ""] {
        let out = db.run(&["held", "expire", "--older-than", bad]);
        assert_fails(&out, 2, "--older-than");
    }
    let out = db.run(&["held", "expire"]);
    assert_fails(&out, 2, "--older-than");
    assert_eq!(db.counts(), (1, 1));
    // A fact held a moment ago is not an hour old; it is zero seconds old.
    let out = db.run(&["held", "expire", "--older-than", "1h30m"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("no fact has been held for longer than 1h 30m"));
    assert_eq!(db.counts(), (1, 1));
    let out = db.json(&["held", "expire", "--older-than", "0s"]);
    assert_eq!(out["dropped"], serde_json::json!([held.hash().to_string()]));
    assert_eq!(db.counts(), (1, 0));
    // Listing, with and without --limit, is unchanged by the subcommands.
    assert!(db.ok(&["held", "--limit", "1"]).contains("no held facts"));
}

#[test]
fn peers_rm_unknown_url() {
    let db = Db::init();
    // A sync to a mistyped URL fails, and leaves the peer listed with its error.
    let typo = "http://127.0.0.1:1";
    let out = db.run(&["sync", typo]);
    assert_fails(&out, 5, typo);
    assert!(db.ok(&["peers"]).contains(typo));
    let out = db.run(&["peers", "rm", "http://127.0.0.1:2"]);
    assert_fails(&out, 3, "no peer \"http://127.0.0.1:2\"");
    let out = db.run(&["peers", "rm"]);
    assert_fails(&out, 2, "<URL>");
    assert_eq!(db.store().peers().unwrap().len(), 1);
    assert!(db.ok(&["peers", "rm", typo]).contains("forgot peer"));
    assert!(db.store().peers().unwrap().is_empty());
    assert!(db.ok(&["peers"]).contains("no peers"));
}

#[test]
fn open_in_a_missing_directory() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no").join("such");
    let path = missing.join("x.db");
    let want = format!(
        "error: cannot open {}: directory {} does not exist\n",
        path.display(),
        missing.display()
    );
    let add = r#"{"type": "A", "fields": {}}"#;
    for args in [
        &["stats"][..],
        &["init"],
        &["add", add],
        &["--read-only", "stats"],
        &["held"],
    ] {
        let out = common::bin::run(&path, args, b"");
        assert_eq!(code(&out), 4, "{args:?}");
        assert_eq!(stderr(&out), want, "{args:?}");
    }
    assert!(!missing.exists());
}

/// A database whose directory this process cannot write: commands that only read work,
/// a write fails naming the path, `--read-only` refuses writes before opening, and
/// nothing is written. Root ignores directory permissions, so as root the commands run
/// as the user `nobody` (uid 65534).
#[test]
fn open_in_a_read_only_directory() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.db");
    let root = fact("Root", 1, &[]);
    Store::open(&path).unwrap().insert(&root).unwrap();
    let before = std::fs::read(&path).unwrap();
    let mode = |p: &std::path::Path, m| std::fs::set_permissions(p, PermissionsExt::from_mode(m));
    mode(&path, 0o644).unwrap();
    mode(dir.path(), 0o555).unwrap();
    let as_root = unsafe { libc::geteuid() } == 0;
    let run_at = |db: &std::path::Path, args: &[&str]| {
        let mut c = common::bin::cmd(db, args);
        if as_root {
            c.uid(65534).gid(65534);
        }
        c.output().unwrap()
    };
    let run = |args: &[&str]| run_at(&path, args);
    // The premise: this process (or nobody) cannot create a file there.
    let probe = run_at(&dir.path().join("probe.db"), &["init"]);
    assert_eq!(code(&probe), 4, "{}", stderr(&probe));

    let out = run(&["--json", "stats"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("\"released\":1"), "{}", stdout(&out));
    let hash = root.hash().to_string();
    for args in [&["get", &hash[..]][..], &["export"], &["verify"], &["held"]] {
        let out = run(args);
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
    }
    let add = r#"{"type": "A", "fields": {}}"#;
    let out = run(&["add", add]);
    assert_fails(&out, 4, &format!("cannot open {}", path.display()));
    assert!(stderr(&out).contains("not writable"), "{}", stderr(&out));
    let out = run(&["--read-only", "add", add]);
    assert_fails(&out, 2, "--read-only: this command writes to");

    mode(dir.path(), 0o755).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("x.db")]);
}

#[test]
fn read_only_flag_refuses_writes() {
    let (db, root, held) = typo_db();
    let hash = root.hash().to_string();
    let held = held.hash().to_string();
    let add = r#"{"type": "A", "fields": {}}"#;
    for args in [
        &["add", add][..],
        &["init"],
        &["held", "drop", &held],
        &["held", "expire", "--older-than", "0s"],
        &["peers", "rm", "http://x"],
        &["queue", "rm", "q"],
        &["demo"],
    ] {
        let out = db.run(&[&["--read-only"], args].concat());
        assert_fails(&out, 2, "--read-only: this command writes to");
    }
    let out = db.run_with(&["--read-only", "import", "-"], add.as_bytes());
    assert_fails(&out, 2, "--read-only");
    assert_eq!(db.counts(), (1, 1));
    for args in [
        &["stats"][..],
        &["get", &hash],
        &["export"],
        &["held"],
        &["verify"],
        &["peers"],
        &["query", "match a: Root select a"],
        &["queue", "list"],
    ] {
        db.ok(&[&["--read-only"], args].concat());
    }
    // A read-only open creates nothing.
    let missing = db.path.with_file_name("missing.db");
    let out = common::bin::run(&missing, &["--read-only", "stats"], b"");
    assert_fails(&out, 4, "no database at");
    assert!(!missing.exists());
}

#[test]
fn read_only_open_needing_migration() {
    let db = Db::new();
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/schemas/v5.db");
    std::fs::copy(fixture, &db.path).unwrap();
    let before = std::fs::read(&db.path).unwrap();
    let out = db.run(&["--read-only", "stats"]);
    assert_fails(&out, 4, "schema version 5 must first be migrated to");
    assert!(stderr(&out).contains("run `precedent init` once without --read-only"));
    assert_eq!(std::fs::read(&db.path).unwrap(), before);
    let err = Store::open_with(
        &db.path,
        precedent::StoreOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert!(
        matches!(err, Error::NeedsMigration { found: 5, .. }),
        "{err}"
    );
    // A command that only reads, without --read-only, migrates it as it always did.
    db.ok(&["stats"]);
    db.ok(&["--read-only", "stats"]);
}

/// `serve` started with `args`: the stderr lines it wrote up to the one naming its
/// address, and the child, which the caller kills. `None` (with stderr) if it exited.
fn serve_lines(db: &Db, args: &[&str]) -> Result<(Vec<String>, std::process::Child), String> {
    use std::io::BufRead;
    let mut child = db
        .cmd(&[&["serve"], args].concat())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    for line in std::io::BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let done = line.starts_with("listening on ");
        seen.push(line);
        if done {
            return Ok((seen, child));
        }
    }
    let status = child.wait().unwrap();
    Err(format!("{status}: {}", seen.join("\n")))
}

#[test]
fn serve_open_on_a_public_address() {
    let db = Db::init();
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let out = db.run(&["serve", "--listen", listen]);
        assert_fails(&out, 2, "without --tokens");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        for hint in ["\"tokens\": [", "--tokens FILE", "127.0.0.1", "--insecure"] {
            assert!(err.contains(hint), "{hint:?} not in {err}");
        }
    }
    // Loopback needs no tokens; a public address with --insecure or with tokens starts.
    let tokens = db.path.with_file_name("tokens.json");
    std::fs::write(
        &tokens,
        r#"{"tokens": [{"name": "t", "token": "s3cret", "read": true}]}"#,
    )
    .unwrap();
    let tokens = tokens.to_str().unwrap();
    for (args, warning) in [
        (&["--listen", "127.0.0.1:0"][..], None),
        (&["--listen", "0.0.0.0:0", "--insecure"], Some("--insecure")),
        (&["--listen", "0.0.0.0:0", "--tokens", tokens], None),
    ] {
        let (lines, mut child) = serve_lines(&db, args).unwrap();
        common::process::kill(&mut child);
        let warned = lines.iter().any(|l| l.starts_with("warning: --insecure"));
        assert_eq!(warned, warning.is_some(), "{args:?}: {lines:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Query injection

/// A database with a shop and an order whose note is an injection attempt.
fn injection_db() -> (Db, Fact) {
    let db = Db::init();
    let shop = Fact::builder("Shop")
        .field("name", INJECTION)
        .build()
        .unwrap();
    let order = Fact::builder("Shop.Order")
        .field("note", INJECTION)
        .predecessor("shop", shop.hash())
        .build()
        .unwrap();
    db.store().insert_batch(vec![shop.clone(), order]).unwrap();
    (db, shop)
}

fn assert_intact(db: &Db) {
    assert_eq!(db.counts(), (2, 0));
    db.assert_clean();
}

#[test]
fn query_injection_in_query_text() {
    let (db, _) = injection_db();
    for text in [
        INJECTION.to_string(),
        format!("match s: Shop select s {INJECTION}"),
        "match s: Shop; DROP TABLE fact select s".to_string(),
        "match s: Shop select s.name\" OR 1=1 --".to_string(),
    ] {
        assert!(Query::parse(&text).is_err(), "{text}");
        let out = db.run_with(&["query", &text], b"");
        assert_fails(&out, 1, "query at line");
    }
    assert_intact(&db);
}

#[test]
fn query_injection_in_field_values() {
    let (db, shop) = injection_db();
    let q = format!("match s: Shop where s.name = {INJECTION:?} select hash(s)");
    let rows = db
        .store()
        .query(&Query::parse(&q).unwrap(), &Givens::new())
        .unwrap();
    assert_eq!(rows.len(), 1);
    let q = "match s: Shop where s.name = \"x' OR '1'='1\" select s";
    let rows = db
        .store()
        .query(&Query::parse(q).unwrap(), &Givens::new())
        .unwrap();
    assert!(rows.is_empty());
    let out = db.run_with(
        &[
            "--json",
            "query",
            &format!("match s: Shop where s.name = {INJECTION:?} select hash(s)"),
        ],
        b"",
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&shop.hash().to_string()));
    assert_intact(&db);
}

#[test]
fn query_injection_in_names() {
    // Type names, field names and roles are bound as values too: quotes in them match
    // nothing and break nothing.
    let (db, _) = injection_db();
    for q in [
        "match s: Shop where s.`name` = 1 select s",
        "match o: Shop.Order where o.note\" = 1 select o",
    ] {
        assert!(Query::parse(q).is_err(), "{q}");
    }
    let q = "given s: Shop match o: Shop.Order where o->shop = s and o.x = 1 select o";
    let mut givens = Givens::new();
    givens.insert("s".into(), FactHash([1; 32]));
    assert!(
        db.store()
            .query(&Query::parse(q).unwrap(), &givens)
            .unwrap()
            .is_empty()
    );
    assert_intact(&db);
}

#[test]
fn injection_in_stored_names_and_values() {
    // Type name, field name, role name and value all SQL injection attempts: stored and
    // read back verbatim, and nothing else happens.
    let db = Db::init();
    let base = json::to_json(&fact("Base", 1, &[])).to_string();
    assert_eq!(
        db.run_with(&["add", "-"], base.as_bytes()).status.code(),
        Some(0)
    );
    let base_hash = fact("Base", 1, &[]).hash();
    let text = serde_json::json!({
        "type": INJECTION,
        "fields": {INJECTION: INJECTION, "x\"); DELETE FROM fact; --": 1},
        "predecessors": {INJECTION: base_hash.to_string()},
    })
    .to_string();
    let out = db.run_with(&["add", "-"], text.as_bytes());
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let out = db.run_with(&["get", &hash], b"");
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["type"], INJECTION);
    assert_eq!(got["fields"][INJECTION], INJECTION);
    // Quoted, type and field names are a query's too, and bound as values.
    let q = format!("match x: {INJECTION:?} where x.{INJECTION:?} = {INJECTION:?} select hash(x)");
    let rows = db
        .store()
        .query(&Query::parse(&q).unwrap(), &Givens::new())
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(db.counts(), (2, 0));
    db.assert_clean();
}

#[test]
fn injection_in_queue_names() {
    let (db, _) = injection_db();
    assert_fails(
        &db.run_with(&["queue", "show", INJECTION], b""),
        3,
        "no queue named",
    );
    assert_fails(
        &db.run_with(&["dlq", "list", INJECTION], b""),
        3,
        "no queue named",
    );
    assert_intact(&db);
}

#[test]
fn query_givens_unbound_or_unknown() {
    let (db, shop) = injection_db();
    let q = "given s: Shop match o: Shop.Order where o->shop = s select o";
    assert_fails(&db.run_with(&["query", q], b""), 2, "given s is not bound");
    let given = format!("s={}", "ab".repeat(32));
    assert_fails(
        &db.run_with(&["query", q, "--given", &given], b""),
        3,
        "no fact matches prefix",
    );
    let given = format!("t={}", shop.hash());
    assert_fails(
        &db.run_with(&["query", q, "--given", &given], b""),
        1,
        "the query has no given t",
    );
    let given = format!("s={INJECTION}");
    let out = db.run_with(&["query", q, "--given", &given], b"");
    assert_ne!(out.status.code(), Some(0));
    assert_intact(&db);
}

/// Query text nested 10,000 levels deep in each of the three ways the grammar nests:
/// `exists (...)`, record projections `{a: ...}` and collections `[match ... select ...]`.
/// Run through the binary, so that a stack overflow fails this test instead of aborting the
/// test process.
#[test]
fn query_deep_nesting() {
    let (db, _) = injection_db();
    let n = 10_000;
    let texts = [
        format!(
            "match s: Shop where {} s.name = 1 {} select s",
            "exists (match o: Shop.Order where o->shop = s and ".repeat(n),
            ")".repeat(n)
        ),
        format!(
            "match s: Shop select {}s{}",
            "{a: ".repeat(n),
            "}".repeat(n)
        ),
        format!(
            "match s: Shop select {}o{}",
            "[match o: Shop.Order where o->shop = s select ".repeat(n),
            "]".repeat(n)
        ),
    ];
    for text in texts {
        let file = db.path.with_file_name("deep.query");
        std::fs::write(&file, &text).unwrap();
        let out = db.run_with(&["query", "-f", file.to_str().unwrap()], b"");
        assert_fails(&out, 1, "query at line");
    }
    assert_intact(&db);
}

/// The shop of `common::shop::three_orders` (orders with an `id`, role `shop`; a shipment
/// with role `order`), and `query TEXT --given s=SHOP` run on it with and without
/// `--strict`. A name no stored fact has is warned of on stderr and the query runs (exit
/// 0); with `--strict` it is refused with the same text, exit 1 and nothing on stdout.
/// Returns the stdout of the run without `--strict`.
fn query_warned(text: &str, warning: &str) -> String {
    let db = Db::init();
    let (shop, _) = shop::three_orders(&mut db.store());
    let given = format!("s={}", shop.hash());
    let out = db.run(&["--json", "query", text, "--given", &given]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {err}");
    assert!(err.contains("warning: query at line 1, column "), "{err}");
    assert!(err.contains(warning), "{warning:?} not in stderr: {err}");
    let strict = db.run(&["--json", "query", "--strict", text, "--given", &given]);
    assert_fails(&strict, 1, warning);
    assert!(strict.stdout.is_empty(), "{:?}", strict.stdout);
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn query_unknown_type() {
    let out = query_warned(
        "given s: Shop match o: Shop.Ordr where o->shop = s select o.id",
        "column 21: no fact of type Shop.Ordr is stored; did you mean Shop.Order?",
    );
    assert_eq!(out, "");
}

#[test]
fn query_unknown_role() {
    let out = query_warned(
        "given s: Shop match o: Shop.Order where o->shp = s select o.id",
        "no stored fact has the role shp; did you mean shop?",
    );
    assert_eq!(out, "");
}

#[test]
fn query_unknown_field() {
    // The column of nulls a misspelled field gives.
    let out = query_warned(
        "given s: Shop match o: Shop.Order where o->shop = s select o.idd",
        "no stored fact of type Shop.Order has the field idd; did you mean id?",
    );
    assert_eq!(out, "null\nnull\nnull\n");
}

#[test]
fn query_unknown_type_in_not_exists() {
    // Pending orders, with the shipment type misspelled: the `not exists` holds for every
    // order, so the shipped order 2 is among the answers.
    let out = query_warned(
        "given s: Shop match o: Shop.Order where o->shop = s \
         and not exists (match sh: Shop.Shipmnt where sh->order = o) select o.id",
        "column 75: no fact of type Shop.Shipmnt is stored; did you mean Shop.Shipment?",
    );
    assert_eq!(out, "1\n2\n3\n");
}

// ---------------------------------------------------------------------------------------
// The sync server

fn assert_error(got: (u16, serde_json::Value), status: u16, code: &str) {
    assert_eq!(got.0, status, "{}", got.1);
    assert_eq!(got.1["error"], code, "{}", got.1);
}

fn assert_nothing_stored(node: &Node) {
    let s = node.store();
    assert_eq!(s.count_and_max_seq().unwrap().0, 0);
    assert_eq!(s.held_count().unwrap(), 0);
    assert_eq!(s.quarantine_count().unwrap(), 0);
}

#[test]
fn http_missing_bearer_token() {
    let node = Node::new();
    let server = node.serve_with(|c| c.tokens = tokens());
    let body = fact("Shop", 1, &[]).canonical_bytes().to_vec();
    assert_error(
        http(&server, "POST", "/v1/facts", CBOR, &body, None),
        401,
        "unauthorized",
    );
    assert_error(
        http(&server, "GET", "/v1/facts", "", b"", None),
        401,
        "unauthorized",
    );
    assert_nothing_stored(&node);
}

#[test]
fn http_wrong_bearer_token() {
    let node = Node::new();
    let server = node.serve_with(|c| c.tokens = tokens());
    let body = fact("Shop", 1, &[]).canonical_bytes().to_vec();
    // (A trailing space is not a wrong token: HTTP trims it from the header value.)
    for token in ["nope", "W-SECRET", "w-secre", "", INJECTION] {
        let got = http(&server, "POST", "/v1/facts", CBOR, &body, Some(token));
        assert_error(got, 401, "unauthorized");
    }
    assert_nothing_stored(&node);
}

#[test]
fn http_read_only_token_pushes() {
    let node = Node::new();
    let server = node.serve_with(|c| c.tokens = tokens());
    let body = fact("Shop", 1, &[]).canonical_bytes().to_vec();
    let got = http(&server, "POST", "/v1/facts", CBOR, &body, Some("r-secret"));
    assert_error(got, 403, "forbidden");
    assert_nothing_stored(&node);
}

#[test]
fn http_forbidden_fact_type() {
    let node = Node::new();
    let server = node.serve_with(|c| c.tokens = tokens());
    let shop = fact("Shop", 1, &[]);
    let order = fact("Shop.Order", 2, &[shop.hash()]);
    let body = [shop.canonical_bytes(), order.canonical_bytes()].concat();
    let got = http(&server, "POST", "/v1/facts", CBOR, &body, Some("s-secret"));
    assert_error(got, 403, "forbidden_type");
    assert_nothing_stored(&node);
}

#[test]
fn http_oversized_body() {
    let node = Node::new();
    let server = node.serve_with(|c| c.limits.max_body_bytes = 1024);
    let body: Vec<u8> = (0..300)
        .flat_map(|i| fact("F", i, &[]).canonical_bytes().to_vec())
        .collect();
    assert!(body.len() > 1024);
    let got = http(&server, "POST", "/v1/facts", CBOR, &body, None);
    assert_error(got, 413, "body_too_large");
    assert_nothing_stored(&node);
}

#[test]
fn http_too_many_facts_per_request() {
    let node = Node::new();
    let server = node.serve_with(|c| c.limits.max_facts_per_request = 5);
    let body: Vec<u8> = (0..6)
        .flat_map(|i| fact("F", i, &[]).canonical_bytes().to_vec())
        .collect();
    let got = http(&server, "POST", "/v1/facts", CBOR, &body, None);
    assert_error(got, 413, "too_many_facts");
    let hashes: Vec<String> = (0..6).map(|i| FactHash([i; 32]).to_string()).collect();
    let req = serde_json::json!({ "hashes": hashes }).to_string();
    let got = http(&server, "POST", "/v1/fetch", JSON_CT, req.as_bytes(), None);
    assert_error(got, 413, "too_many_facts");
    assert_nothing_stored(&node);
}

#[test]
fn http_over_the_held_bound() {
    let node = Node::new();
    let server = node.serve_with(|c| c.limits.max_held_per_peer = 2);
    let body: Vec<u8> = (0..3)
        .flat_map(|i| {
            fact("Orphan", i, &[FactHash([9; 32])])
                .canonical_bytes()
                .to_vec()
        })
        .collect();
    let got = http(&server, "POST", "/v1/facts", CBOR, &body, None);
    assert_error(got, 429, "held_limit");
    assert_nothing_stored(&node);
}

#[test]
fn http_missing_ancestors_in_push() {
    let node = Node::new();
    let server = node.serve();
    let absent = FactHash([9; 32]);
    let body = fact("Orphan", 1, &[absent]).canonical_bytes().to_vec();
    let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &body, None);
    assert_eq!((status, json["held"].as_u64()), (200, Some(1)), "{json}");
    assert_eq!(json["missing"][0], absent.to_string());
    let s = node.store();
    assert_eq!(
        (s.count_and_max_seq().unwrap().0, s.held_count().unwrap()),
        (0, 1)
    );
}

#[test]
fn http_non_canonical_record_in_push() {
    // A good record, a non-canonical one (unsorted keys), a good one, then a cut record:
    // the bad ones are rejected and quarantined with their bytes, the good ones stored.
    let node = Node::new();
    let server = node.serve();
    let (a, b) = (fact("A", 1, &[]), fact("B", 2, &[]));
    let body = [
        a.canonical_bytes(),
        &hex("84016154a2616201616101a0"),
        b.canonical_bytes(),
        &hex("840161"),
    ]
    .concat();
    let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &body, None);
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["inserted"].as_u64(), Some(2), "{json}");
    let rejected = json["rejected"].as_array().unwrap();
    assert_eq!(rejected.len(), 2, "{json}");
    assert!(
        rejected[0]["reason"]
            .as_str()
            .unwrap()
            .contains("out of canonical order")
    );
    let s = node.store();
    assert_eq!(s.count_and_max_seq().unwrap().0, 2);
    assert_eq!(s.quarantine_count().unwrap(), 2);
}

#[test]
fn http_wrong_content_type() {
    let node = Node::new();
    let server = node.serve();
    let body = fact("A", 1, &[]).canonical_bytes().to_vec();
    // A push is CBOR or, in the JSON API, JSON: any other type is refused unread.
    let got = http(&server, "POST", "/v1/facts", "text/plain", &body, None);
    assert_error(got, 415, "unsupported_media_type");
    // CBOR sent as JSON is read as JSON, and refused as a body that is not a JSON array,
    // saying where.
    let got = http(&server, "POST", "/v1/facts", JSON_CT, &body, None);
    assert!(
        got.1["message"].as_str().unwrap().contains("at byte 0"),
        "{}",
        got.1
    );
    assert_error(got, 400, "bad_request");
    let got = http(
        &server,
        "POST",
        "/v1/fetch",
        CBOR,
        br#"{"hashes":[]}"#,
        None,
    );
    assert_error(got, 415, "unsupported_media_type");
    assert_nothing_stored(&node);
}

#[test]
fn http_malformed_fetch_body() {
    let node = Node::new();
    let server = node.serve();
    for body in [
        &b"not json"[..],
        br#"{"hashes": "abc"}"#,
        br#"{"hashes": ["zz"]}"#,
        br#"{"hashes": ["deadbeef"]}"#,
        &format!(r#"{{"hashes": [{INJECTION:?}]}}"#).into_bytes(),
        &format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes(),
    ] {
        let got = http(&server, "POST", "/v1/fetch", JSON_CT, body, None);
        assert_error(got, 400, "bad_request");
    }
    assert_nothing_stored(&node);
}

#[test]
fn http_injection_in_query_parameters() {
    let node = Node::new();
    node.store().insert(&fact("A", 1, &[])).unwrap();
    let server = node.serve();
    for path in [
        "/v1/facts?after=1;DROP%20TABLE%20fact",
        "/v1/facts?after=0%20OR%201=1",
        "/v1/facts?root='%3B%20DROP%20TABLE%20fact%3B%20--",
        "/v1/facts?limit=1%27",
    ] {
        assert_error(
            http(&server, "GET", path, "", b"", None),
            400,
            "bad_request",
        );
    }
    let s = node.store();
    assert_eq!(s.count_and_max_seq().unwrap().0, 1);
    assert!(s.verify(|_| {}).unwrap().is_clean());
}

#[test]
fn http_slow_request_times_out() {
    let node = Node::new();
    let server = node.serve_with(|c| c.limits.request_timeout = Duration::from_millis(300));
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // Promise a body and never send it.
    write!(
        s,
        "POST /v1/facts HTTP/1.1\r\nhost: x\r\ncontent-type: {CBOR}\r\ncontent-length: 100\r\n\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"timeout\""), "{text}");
    assert_nothing_stored(&node);
}

/// A push answered 408 (past the request timeout) goes on to its commit, holding its body:
/// it keeps the push memory it took until then, so the next large push waits for it (and
/// is told the server is busy) rather than taking memory the first still holds.
#[test]
fn a_push_past_the_timeout_keeps_its_memory_until_it_ends() {
    use std::sync::{Arc, Barrier};
    let node = Node::new();
    let server = node.serve_with(|c| c.limits.request_timeout = Duration::from_millis(1000));
    // Another writer holds the database, so the push's store work waits.
    let (locked, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let holder = {
        let (store, locked, release) = (node.store(), locked.clone(), release.clone());
        std::thread::spawn(move || {
            store
                .write(|w| {
                    w.insert(&fact("Lock", 0, &[]))?;
                    locked.wait();
                    release.wait();
                    Ok(())
                })
                .unwrap();
        })
    };
    locked.wait();
    // A body of the whole push memory (64 MiB): one oversize record, refused and kept in
    // the quarantine, which needs the writer.
    let len = (64u32 << 20) - 5;
    let mut big = vec![0x5a];
    big.extend_from_slice(&len.to_be_bytes());
    big.resize(64 << 20, 0);
    let (first, _) = http(&server, "POST", "/v1/facts", CBOR, &big, None);
    assert_eq!(first, 408);
    let small = fact("Shop", 1, &[]).canonical_bytes().to_vec();
    let (second, body) = http(&server, "POST", "/v1/facts", CBOR, &small, None);
    assert_eq!(second, 503, "{body}");
    assert!(body.to_string().contains("busy"), "{body}");
    release.wait();
    holder.join().unwrap();
}

#[test]
fn http_garbage_request() {
    // Bytes that are not HTTP at all: the connection is answered 400 or closed, and the
    // server keeps serving.
    let node = Node::new();
    let server = node.serve();
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"\x00\xff\x84garbage\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 400"),
        "{text}"
    );
    assert_eq!(http(&server, "GET", "/v1/health", "", b"", None).0, 200);
    assert_nothing_stored(&node);
}

#[test]
fn http_unknown_endpoint_or_method() {
    let node = Node::new();
    let server = node.serve();
    assert_error(
        http(&server, "GET", "/v2/facts", "", b"", None),
        404,
        "not_found",
    );
    assert_error(
        http(&server, "GET", "/v1/facts/../../etc/passwd", "", b"", None),
        404,
        "not_found",
    );
    assert_error(
        http(&server, "DELETE", "/v1/facts", "", b"", None),
        405,
        "method_not_allowed",
    );
    assert_nothing_stored(&node);
}

#[test]
fn http_pull_parameters_out_of_range() {
    let node = Node::new();
    let server = node.serve_with(|c| {
        c.limits.max_facts_per_request = 10;
        c.limits.max_wait = Duration::from_millis(200);
    });
    for path in [
        "/v1/facts?limit=0",
        "/v1/facts?limit=11",
        "/v1/facts?after=-1",
        "/v1/facts?after=99999999999999999999",
        "/v1/facts?wait_ms=x",
    ] {
        assert_error(
            http(&server, "GET", path, "", b"", None),
            400,
            "bad_request",
        );
    }
    // A long-poll wait over the bound is cut to the bound, not refused.
    let start = std::time::Instant::now();
    let (status, _) = http(&server, "GET", "/v1/facts?wait_ms=3600000", "", b"", None);
    assert_eq!(status, 200);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn http_too_many_connections() {
    let node = Node::new();
    let server = node.serve_with(|c| c.limits.max_connections = 1);
    let mut held = TcpStream::connect(server.addr()).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // A complete keep-alive request proves the first connection is being served.
    write!(held, "GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 1024];
    let n = held.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let (status, json) = http(&server, "GET", "/v1/health", "", b"", None);
    assert_eq!(
        (status, json["error"].as_str()),
        (503, Some("too_many_connections"))
    );
    drop(held);
}

#[test]
fn http_duplicate_records_in_push() {
    let node = Node::new();
    let server = node.serve();
    let f = fact("A", 1, &[]);
    let body = [f.canonical_bytes(), f.canonical_bytes()].concat();
    let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &body, None);
    assert_eq!(status, 200, "{json}");
    assert_eq!(
        (json["inserted"].as_u64(), json["duplicates"].as_u64()),
        (Some(1), Some(1))
    );
    let (_, again) = http(&server, "POST", "/v1/facts", CBOR, &body, None);
    assert_eq!(again["duplicates"].as_u64(), Some(2), "{again}");
    assert_eq!(node.store().count_and_max_seq().unwrap().0, 1);
}

// ---------------------------------------------------------------------------------------
// Sync: requests below the routes, oversize records, scopes in a body, and the peer's URL
// (issue 16). Rows in the catalogue under "The sync server" and "Syncing with a peer".

/// Writes `request` on a new connection and reads the answer to its end: (status, JSON).
fn raw_exchange(
    server: &precedent::sync::server::Running,
    request: &[u8],
) -> (u16, serde_json::Value) {
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(request);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    assert!(text.starts_with("HTTP/1.1 "), "{text:?}");
    let status = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or_default())
}

#[test]
fn http_uri_too_long() {
    let node = Node::new();
    let server = node.serve();
    let roots = format!("&root={}", "ab".repeat(32)).repeat(1000);
    let request = format!("GET /v1/facts?after=0{roots} HTTP/1.1\r\nhost: x\r\n\r\n");
    let got = raw_exchange(&server, request.as_bytes());
    assert_error(got.clone(), 414, "uri_too_long");
    assert!(
        got.1["message"].as_str().unwrap().contains("POST /v1/pull"),
        "{}",
        got.1
    );
    assert_eq!(http(&server, "GET", "/v1/health", "", b"", None).0, 200);
    assert_nothing_stored(&node);
}

#[test]
fn http_headers_too_large() {
    let node = Node::new();
    let server = node.serve();
    let request = format!(
        "GET /v1/health HTTP/1.1\r\nhost: x\r\nx-filler: {}\r\n\r\n",
        "a".repeat(600 * 1024)
    );
    assert_error(
        raw_exchange(&server, request.as_bytes()),
        431,
        "headers_too_large",
    );
    assert_nothing_stored(&node);
}

#[test]
fn http_malformed_request_head() {
    let node = Node::new();
    let server = node.serve();
    for request in [
        &b"GET /v1/health HTTP/1.1\r\nhost: x\r\nno colon here\r\n\r\n"[..],
        b"GET /v1/he alth HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /v1/health HTTP/9.9\r\nhost: x\r\n\r\n",
    ] {
        assert_error(raw_exchange(&server, request), 400, "bad_request");
    }
    assert_nothing_stored(&node);
}

#[test]
fn http_request_head_never_finishes() {
    let node = Node::new();
    let server = node.serve_with(|c| c.limits.request_timeout = Duration::from_millis(300));
    let started = std::time::Instant::now();
    let got = raw_exchange(&server, b"POST /v1/facts HTTP/1.1\r\nhost: x\r\ncontent-ty");
    assert_error(got, 408, "timeout");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_nothing_stored(&node);
}

#[test]
fn http_oversize_record_in_push() {
    let node = Node::new();
    let server = node.serve();
    let (a, b) = (fact("A", 1, &[]), fact("B", 2, &[]));
    // A well-framed CBOR byte string of 1 MiB and 16 bytes: too large to be a fact.
    let mut huge = vec![0x5a];
    huge.extend_from_slice(&((1u32 << 20) + 10).to_be_bytes());
    huge.resize(huge.len() + (1 << 20) + 10, 7);
    let body = [a.canonical_bytes(), &huge[..], b.canonical_bytes()].concat();
    let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &body, None);
    assert_eq!(status, 200, "{json}");
    assert_eq!(
        (json["received"].as_u64(), json["inserted"].as_u64()),
        (Some(3), Some(2)),
        "{json}"
    );
    assert_eq!(json["rejected"][0]["index"].as_u64(), Some(1), "{json}");
    assert!(
        json["rejected"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("over the limit"),
        "{json}"
    );
    let s = node.store();
    assert_eq!(s.count_and_max_seq().unwrap().0, 2);
    assert_eq!(s.quarantine_count().unwrap(), 1);
}

#[test]
fn http_scoped_pull_with_many_roots() {
    let node = Node::new();
    let root = fact("Root", 0, &[]);
    let child = fact("Child", 0, &[root.hash()]);
    node.store()
        .insert_batch(vec![root.clone(), child.clone()])
        .unwrap();
    let server = node.serve();
    // 1,024 roots (the documented bound) in a POST /v1/pull body: answered as a pull.
    let mut roots: Vec<String> = (0..1023).map(|i| format!("{:064x}", i + 1)).collect();
    roots.push(root.hash().to_string());
    let body = serde_json::to_vec(&serde_json::json!({"after": 0, "roots": roots})).unwrap();
    let (status, _) =
        sync_support::raw_http(server.addr(), "POST", "/v1/pull", JSON_CT, &body, None);
    assert_eq!(status, 200);
    let client = precedent::sync::client::Client::new(&server.url(), Default::default()).unwrap();
    let hashes: Vec<FactHash> = roots.iter().map(|r| r.parse().unwrap()).collect();
    let page = client.pull_page(0, 100, Duration::ZERO, &hashes).unwrap();
    assert_eq!(page.records.len(), 2);
    // One root more, a bad root, an unknown key: 400.
    roots.push(format!("{:064x}", 5000));
    for bad in [
        serde_json::json!({"roots": roots}),
        serde_json::json!({"roots": ["zz"]}),
        serde_json::json!({"after": 0, "rots": []}),
        serde_json::json!({"limit": 0}),
    ] {
        let body = serde_json::to_vec(&bad).unwrap();
        assert_error(
            http(&server, "POST", "/v1/pull", JSON_CT, &body, None),
            400,
            "bad_request",
        );
    }
}

/// `precedent sync URL` against `server` from a fresh database: its output.
fn sync_cli(url: &str, extra: &[&str]) -> (Output, Db) {
    let db = Db::init();
    let mut args = vec!["sync", url];
    args.extend_from_slice(extra);
    (db.run(&args), db)
}

#[test]
fn sync_https_against_a_plain_server() {
    let node = Node::new();
    node.store().insert(&fact("A", 1, &[])).unwrap();
    let server = node.serve();
    let url = server.url().replace("http://", "https://");
    let (out, db) = sync_cli(&url, &[]);
    assert_fails(
        &out,
        5,
        "speaks plain HTTP, not HTTPS (try http://127.0.0.1:",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim().lines().count(),
        1
    );
    assert_eq!(db.counts(), (0, 0));
}

#[test]
fn sync_url_with_a_path() {
    let node = Node::new();
    node.store().insert(&fact("A", 1, &[])).unwrap();
    let server = node.serve();
    // The protocol prefix is the base URL, with or without a slash.
    for suffix in ["/v1", "/v1/"] {
        let (out, db) = sync_cli(&format!("{}{suffix}", server.url()), &[]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(db.counts().0, 1);
    }
    // Another path: the 404 says what the URL should be.
    let (out, db) = sync_cli(&format!("{}/precedent", server.url()), &[]);
    assert_fails(
        &out,
        5,
        "does not look like the base URL of a precedent server",
    );
    assert_eq!(db.counts(), (0, 0));
}

#[test]
fn sync_with_its_own_server() {
    let node = Node::new();
    node.store().insert(&fact("A", 1, &[])).unwrap();
    let server = node.serve();
    for extra in [&[][..], &["--push"], &["--pull"]] {
        let out = common::bin::run(
            &node.db,
            &[&["sync", &server.url()][..], extra].concat(),
            b"",
        );
        assert_fails(&out, 1, "serves this database itself");
    }
    let s = node.store();
    assert_eq!(s.count_and_max_seq().unwrap(), (1, 1));
    assert!(
        s.peer(&server.url())
            .unwrap()
            .is_none_or(|p| p.pull_after == 0 && p.push_after == 0)
    );
}

#[test]
fn sync_push_with_a_read_only_token() {
    let node = Node::new();
    let server = node.serve_with(|c| c.tokens = tokens());
    let db = Db::init();
    let f = fact("Shop", 1, &[]);
    std::fs::write(db.path.with_file_name("f.cbor"), f.canonical_bytes()).unwrap();
    db.ok(&["import", db.path.with_file_name("f.cbor").to_str().unwrap()]);
    let out = db.run(&["sync", &server.url(), "--token", "r-secret"]);
    assert_fails(&out, 5, "precedent sync --pull");
    assert_nothing_stored(&node);
    // And pulling with it works.
    let out = db.run(&["sync", &server.url(), "--token", "r-secret", "--pull"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An input file named on the command line that cannot be read is the caller's to fix:
/// exit 1 (invalid input, as an unreadable config or token file), one line naming the
/// file, nothing written; not exit 4, which says the database failed.
#[test]
fn an_unreadable_input_file_is_invalid_input_not_a_database_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.db");
    Store::open(&path).unwrap();
    let before = std::fs::read(&path).unwrap();
    let missing = dir.path().join("missing.jsonl");
    let missing = missing.to_str().unwrap();
    let folder = dir.path().to_str().unwrap();
    let nowhere = dir.path().join("no-such-dir").join("out.jsonl");
    let nowhere = nowhere.to_str().unwrap();
    let cases: [(&[&str], String); 5] = [
        (
            &["import", missing],
            format!("cannot open {missing}: no such file"),
        ),
        (
            &["import", folder],
            format!("cannot read {folder}: is a directory"),
        ),
        (
            &["query", "-f", missing],
            format!("cannot read the query from {missing}: no such file"),
        ),
        (
            &["sync", "--ca-cert", missing, "http://127.0.0.1:9"],
            format!("cannot read {missing}: no such file"),
        ),
        (
            &["export", "-o", nowhere],
            format!("cannot create {nowhere}: no such file"),
        ),
    ];
    for (args, want) in cases {
        let out = common::bin::run(&path, args, b"");
        let err = stderr(&out);
        assert_fails(&out, 1, &want);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
    // Standard input that is not UTF-8 text, for the commands that read it as text.
    let stdin_cases: [(&[&str], &[u8], &str); 2] = [
        (
            &["add"],
            b"{\"type\":\"\xff\"}",
            "cannot read the fact from stdin: stream did not contain valid UTF-8",
        ),
        (
            &["query", "-f", "-"],
            b"\xff",
            "cannot read the query from stdin: stream did not contain valid UTF-8",
        ),
    ];
    for (args, input, want) in stdin_cases {
        let out = common::bin::run(&path, args, input);
        let err = stderr(&out);
        assert_fails(&out, 1, want);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

//! `precedent query` and `precedent watch` end to end, as separate processes.

mod common;

use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::shop::{self, order, shipment};
use precedent::{Fact, Store, json};

fn precedent(db: &Path) -> Command {
    common::bin::cmd(db, &[])
}

/// A database file holding the shop of [`shop::three_orders`].
fn shop_db() -> (tempfile::TempDir, PathBuf, Fact) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("q.db");
    let (shop, _) = shop::three_orders(&mut Store::open(&db).unwrap());
    (dir, db, shop)
}

/// `precedent watch TEXT --given s=SHOP` as a child, and its output lines.
fn watch(db: &Path, text: &str, shop: &Fact) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = precedent(db)
        .args(["watch", text, "--given", &format!("s={}", shop.hash())])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// `precedent add` of `fact` in another process; returns the hash it prints.
fn add(db: &Path, fact: &Fact) -> String {
    let out = precedent(db)
        .args(["add", &json::to_json(fact).to_string()])
        .output()
        .unwrap();
    succeeded(out).trim().to_string()
}

/// The stdout of a command that must have succeeded.
fn succeeded(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

const PENDING: &str = "given s: Shop
match o: Shop.Order where o->shop = s
  and not exists (match sh: Shop.Shipment where sh->order = o)
select {id: o.id, order: hash(o)}";

#[test]
fn query_prints_json_lines_and_a_table_with_givens_by_prefix() {
    let (_dir, db, shop) = shop_db();
    let given = format!("s={}", shop.hash().short(10));
    let out = precedent(&db)
        .args(["--json", "query", PENDING, "--given", &given])
        .output()
        .unwrap();
    let lines: Vec<serde_json::Value> = succeeded(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<i64> = lines.iter().map(|l| l["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [1, 3]);
    assert_eq!(lines[0]["order"].as_str().unwrap().len(), 64);

    let file = db.with_file_name("pending.pq");
    std::fs::write(&file, PENDING).unwrap();
    let out = precedent(&db)
        .args(["query", "-f"])
        .arg(&file)
        .args(["--given", &given])
        .output()
        .unwrap();
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = table.lines().collect();
    assert!(
        rows[0].starts_with("id") && rows[0].contains("order"),
        "{table}"
    );
    assert_eq!(rows.len(), 3, "{table}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 results"));
}

#[test]
fn query_errors_have_exit_codes_and_positions() {
    let (_dir, db, shop) = shop_db();
    let given = format!("s={}", shop.hash());
    let out = precedent(&db)
        .args([
            "query",
            "given s: Shop\nmatch o: Shop.Order where o->shop = t select o",
        ])
        .args(["--given", &given])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2, column 37: unknown label t"), "{err}");
    // A given of the wrong type.
    let order_hash = Store::open(&db)
        .unwrap()
        .facts_of_type("Shop.Order")
        .unwrap()[0]
        .hash();
    let out = precedent(&db)
        .args(["query", PENDING, "--given", &format!("s={order_hash}")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a Shop"));
    // An unknown prefix is "not found".
    let out = precedent(&db)
        .args(["query", PENDING, "--given", "s=00000000"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    // A given left unbound is a usage error.
    let out = precedent(&db).args(["query", PENDING]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// `watch` checks names as `query` does: a misspelled type is warned of on stderr and the
/// watch starts; with `--strict` it is refused at once, exit 1, nothing on stdout. A query
/// whose names are all stored prints no warning.
#[test]
fn watch_warns_of_unknown_names_and_strict_refuses_them() {
    let (_dir, db, shop) = shop_db();
    let given = format!("s={}", shop.hash());
    let typo = PENDING.replace("Shop.Shipment", "Shop.Shipmnt");
    let out = precedent(&db)
        .args(["watch", "--strict", &typo, "--given", &given])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no fact of type Shop.Shipmnt is stored; did you mean Shop.Shipment?"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    let mut child = precedent(&db)
        .args(["watch", &typo, "--given", &given])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Every order is "pending" when no shipment type matches: the wrong answer the
    // warning is about.
    for _ in 0..3 {
        assert!(lines.next().unwrap().unwrap().contains("\"added\""));
    }
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("warning: query at line 3, column 25: no fact of type Shop.Shipmnt"),
        "{err}"
    );
    let out = precedent(&db)
        .args(["query", "--strict", PENDING, "--given", &given])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stderr), "2 results\n");
}

#[test]
fn watch_streams_additions_and_removals_from_other_processes() {
    let (_dir, db, shop) = shop_db();
    let (mut child, mut lines) = watch(&db, PENDING, &shop);
    let mut next =
        || -> serde_json::Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    let (a, b) = (next(), next());
    assert_eq!(
        (a["change"].as_str(), b["change"].as_str()),
        (Some("added"), Some("added"))
    );
    // Another process adds an order, then ships it.
    let started = Instant::now();
    let nine = order(&shop, "id", 9);
    let printed = add(&db, &nine);
    assert_eq!(printed, nine.hash().to_string());
    let added = next();
    assert_eq!(added["change"], "added");
    assert_eq!(added["result"]["id"], 9);
    assert_eq!(added["result"]["order"], printed.as_str());
    add(&db, &shipment(&nine));
    let removed = next();
    assert_eq!(removed["change"], "removed");
    assert_eq!(removed["result"]["id"], 9);
    assert!(started.elapsed() < Duration::from_secs(10));
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `order by` and `limit` in a watch: the command keeps exactly the first results, each
/// line saying where in the ordered list it goes (`at`).
#[test]
fn watch_keeps_the_first_results_in_order() {
    let (_dir, db, shop) = shop_db();
    let text = "given s: Shop
match o: Shop.Order where o->shop = s
  and not exists (match sh: Shop.Shipment where sh->order = o)
order by o.id desc
limit 2
select o.id";
    let (mut child, mut lines) = watch(&db, text, &shop);
    let mut next = || -> (String, u64, i64) {
        let v: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        (
            v["change"].as_str().unwrap().to_string(),
            v["at"].as_u64().unwrap(),
            v["result"].as_i64().unwrap(),
        )
    };
    // Pending: orders 1 and 3 (2 is shipped), highest id first.
    assert_eq!(next(), ("added".into(), 0, 3));
    assert_eq!(next(), ("added".into(), 1, 1));
    // Order 9 comes first and pushes order 1 out.
    let nine = order(&shop, "id", 9);
    let printed = add(&db, &nine);
    assert_eq!(printed, nine.hash().to_string());
    assert_eq!(next(), ("added".into(), 0, 9));
    assert_eq!(next(), ("removed".into(), 2, 1));
    // Shipping order 9 lets order 1 back in, at the end.
    add(&db, &shipment(&nine));
    assert_eq!(next(), ("removed".into(), 0, 9));
    assert_eq!(next(), ("added".into(), 1, 1));
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A change inside a child collection of a result reaches `precedent watch` as an
/// `updated` line, at the result's place, with its new value.
#[test]
fn watch_reports_changed_child_collections_as_updates() {
    let (_dir, db, shop) = shop_db();
    let text = "given s: Shop
match o: Shop.Order where o->shop = s
select {id: o.id, notes: [match n: Shop.Note where n->order = o select n.text]}";
    let (mut child, mut lines) = watch(&db, text, &shop);
    let mut next =
        || -> serde_json::Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    let shown: Vec<serde_json::Value> = (0..3).map(|_| next()).collect();
    let order2 = shown[1]["key"].clone();
    let order2_hash = Store::open(&db)
        .unwrap()
        .facts_of_type("Shop.Order")
        .unwrap()[1]
        .hash();
    let out = precedent(&db)
        .args([
            "add",
            &format!(
                r#"{{"type":"Shop.Note","fields":{{"text":"fragile"}},"predecessors":{{"order":"{order2_hash}"}}}}"#
            ),
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let updated = next();
    assert_eq!(updated["change"], "updated");
    assert_eq!(updated["at"], 1);
    assert_eq!(updated["key"], order2);
    assert_eq!(
        updated["result"],
        serde_json::json!({"id": 2, "notes": ["fragile"]})
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

//! `precedent import` on worker threads prints, exits and stores exactly as the
//! single-threaded import does (`PRECEDENT_IMPORT_THREADS=1`), whatever the input order,
//! with invalid records, duplicates, hash prefixes, inline facts, refusals at the held
//! bound and `--atomic` mixed in, and with batches and pieces small enough that a few
//! dozen records cross many of their boundaries.

mod common;

use std::process::Output;

use common::bin::{Db, code, stderr};
use precedent::{Fact, FactHash, json};
use proptest::prelude::*;
use serde_json::Value as Json;

/// How one fact is written as a record.
#[derive(Clone, Copy, Debug)]
enum Form {
    /// Its JSON form with `"hash"`.
    Full,
    /// Predecessors as 10-digit hash prefixes (resolved against the store and the batch).
    Prefixes,
    /// Its first predecessor written inline.
    Inline,
}

/// One record of the input.
#[derive(Clone, Debug)]
enum Line {
    Fact(usize, Form),
    /// Not a fact: broken JSON, a bad field, a wrong `"hash"`, bad UTF-8, or blank.
    Bad(u8),
}

/// A small shop: stores, orders naming a store and maybe an earlier order, lines naming
/// an order. `picks` chooses the predecessors among earlier facts.
fn shop(picks: &[(u8, u16, u16)]) -> Vec<Fact> {
    let mut facts: Vec<Fact> = Vec::new();
    for (i, &(kind, a, b)) in picks.iter().enumerate() {
        let fact = match (kind % 3, facts.len()) {
            (_, 0) | (0, _) => Fact::builder("Shop.Store")
                .field("name", format!("store {i}"))
                .build(),
            (1, n) => {
                let mut f = Fact::builder("Shop.Order")
                    .field("id", i as i64)
                    .field("total", 1.5 * i as f64)
                    .predecessor("store", facts[a as usize % n].hash());
                if b % 2 == 0 {
                    f = f.predecessor("after", facts[b as usize % n].hash());
                }
                f.build()
            }
            (_, n) => Fact::builder("Shop.Line")
                .field("sku", format!("sku-{b}"))
                .field("qty", i64::from(a % 7))
                .predecessor("order", facts[a as usize % n].hash())
                .build(),
        };
        facts.push(fact.unwrap());
    }
    facts
}

fn json_of(fact: &Fact) -> Json {
    serde_json::from_str(&json::to_json(fact).to_string()).unwrap()
}

fn text(facts: &[Fact], line: &Line) -> Vec<u8> {
    let Line::Fact(i, form) = *line else {
        let Line::Bad(k) = *line else { unreachable!() };
        return match k % 5 {
            0 => b"{\"type\": \"Shop.Order\", \"fields\": {".to_vec(),
            1 => br#"{"type":"Shop.Order","fields":{"n":1e999}}"#.to_vec(),
            2 => format!(r#"{{"type":"Shop.Store","hash":"{}"}}"#, FactHash([k; 32])).into_bytes(),
            3 => b"{\"type\":\"Shop.\xff\"}".to_vec(),
            _ => b"   ".to_vec(),
        };
    };
    let fact = &facts[i];
    let mut v = json_of(fact);
    match form {
        Form::Full => {}
        Form::Prefixes => {
            v.as_object_mut().unwrap().remove("hash");
            for (_, p) in v["predecessors"].as_object_mut().unwrap().iter_mut() {
                *p = Json::String(p.as_str().unwrap()[..10].to_string());
            }
        }
        Form::Inline => {
            if let Some((_, p)) = v["predecessors"].as_object_mut().unwrap().iter_mut().next() {
                let h: FactHash = p.as_str().unwrap().parse().unwrap();
                let pred = facts.iter().find(|f| f.hash() == h).unwrap();
                *p = json_of(pred);
            }
        }
    }
    v.to_string().into_bytes()
}

/// The input file: JSON Lines, or a CBOR sequence of the facts' canonical bytes (a bad
/// record there is garbage that ends the sequence, so only the last one is kept).
fn input(facts: &[Fact], lines: &[Line], cbor: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if cbor {
        for line in lines {
            if let Line::Fact(i, _) = line {
                out.extend_from_slice(facts[*i].canonical_bytes());
            }
        }
        if lines.iter().any(|l| matches!(l, Line::Bad(_))) {
            out.extend_from_slice(&[0xa1, 0x61]);
        }
        return out;
    }
    for line in lines {
        out.extend(text(facts, line));
        out.push(b'\n');
    }
    out
}

/// What a run shows: exit code, stdout, stderr, and the stored set (`export`, `held`).
#[derive(Debug, PartialEq)]
struct Seen {
    code: i32,
    stdout: String,
    stderr: String,
    export: String,
    held: String,
}

fn run(
    file: &std::path::Path,
    threads: usize,
    batch: usize,
    piece: usize,
    global: &[&str],
    flags: &[&str],
) -> Seen {
    let db = Db::new();
    let mut all: Vec<&str> = global.to_vec();
    all.extend(["import", file.to_str().unwrap()]);
    all.extend(flags);
    let out: Output = db
        .cmd(&all)
        .env("PRECEDENT_IMPORT_THREADS", threads.to_string())
        .env("PRECEDENT_IMPORT_BATCH", batch.to_string())
        .env("PRECEDENT_IMPORT_PIECE", piece.to_string())
        .output()
        .unwrap();
    let export = if db.path.exists() {
        db.ok(&["export"])
    } else {
        String::new()
    };
    // Held facts without the time they were held at, which differs between runs.
    let held = if db.path.exists() {
        db.json_lines(&["held"])
            .into_iter()
            .map(|mut h| {
                h.as_object_mut().unwrap().remove("held_at_ms");
                h.to_string()
            })
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        String::new()
    };
    Seen {
        code: code(&out),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: stderr(&out),
        export,
        held,
    }
}

fn form() -> impl Strategy<Value = Form> {
    prop_oneof![
        4 => Just(Form::Full),
        1 => Just(Form::Prefixes),
        1 => Just(Form::Inline)
    ]
}

/// The facts and the records: each fact once in a random form, some again (duplicates),
/// some bad records; then in order, reversed or shuffled.
fn case() -> impl Strategy<Value = (Vec<Fact>, Vec<Line>)> {
    (
        prop::collection::vec((any::<u8>(), any::<u16>(), any::<u16>()), 1..30),
        prop::collection::vec(form(), 30),
        prop::collection::vec((any::<u16>(), form()), 0..6),
        prop::collection::vec(any::<u8>(), 0..4),
        0..3u8,
    )
        .prop_flat_map(|(picks, forms, dups, bad, order)| {
            let facts = shop(&picks);
            let mut lines: Vec<Line> = (0..facts.len()).map(|i| Line::Fact(i, forms[i])).collect();
            for (d, f) in dups {
                lines.push(Line::Fact(d as usize % facts.len(), f));
            }
            lines.extend(bad.into_iter().map(Line::Bad));
            let lines = match order {
                0 => Just(lines).boxed(),
                1 => {
                    lines.reverse();
                    Just(lines).boxed()
                }
                _ => Just(lines).prop_shuffle().boxed(),
            };
            (Just(facts), lines)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn threads_import_as_one_thread_does(
        (facts, lines) in case(),
        threads in 2..5usize,
        batch in 1..12usize,
        piece in 1..5usize,
        cbor in any::<bool>(),
        atomic in any::<bool>(),
        json_out in any::<bool>(),
        max_held in prop::option::of(0..6u64),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("input");
        std::fs::write(&file, input(&facts, &lines, cbor)).unwrap();
        let max = max_held.map(|m| m.to_string());
        let mut global = vec![];
        if json_out {
            global.push("--json");
        }
        if let Some(m) = &max {
            global.extend(["--max-held", m.as_str()]);
        }
        let flags: &[&str] = if atomic { &["--atomic"] } else { &[] };
        let one = run(&file, 1, batch, piece, &global, flags);
        let many = run(&file, threads, batch, piece, &global, flags);
        prop_assert_eq!(&one, &many);
        // Both read the whole input: success, or invalid records reported.
        prop_assert!(one.code == 0 || one.code == 1, "{:?}", one);
    }
}

//! What became of each input, read from every database after the drain.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use serde_json::Value as Json;

use super::inputs::Ledger;
use crate::common::bin::run;

/// The inputs and effects of one database, from its export.
#[derive(Default)]
pub struct Contents {
    /// Input id -> the input fact's hash.
    pub inputs: BTreeMap<String, String>,
    /// Input hash -> how many effect facts name it.
    pub effects: BTreeMap<String, usize>,
    /// Dead letters and poison facts.
    pub ended_badly: usize,
    /// Worker name (the effect's `w`) -> effects it wrote.
    pub by_worker: BTreeMap<String, usize>,
}

/// Exports `db` (a file or a PostgreSQL URL); checks `verify` first.
pub fn read(db: &Path) -> Contents {
    let out = run(db, &["--json", "verify"], b"");
    let report: Json = serde_json::from_slice(&out.stdout).unwrap_or(Json::Null);
    assert!(
        out.status.success() && report["clean"] == true,
        "verify of {}: {report} {}",
        db.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(db, &["export"], b"");
    assert!(out.status.success(), "export of {}", db.display());
    let mut c = Contents::default();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let f: Json = serde_json::from_str(line).unwrap();
        let hash = f["hash"].as_str().unwrap().to_string();
        match f["type"].as_str().unwrap() {
            "Q.In" => {
                let id = f["fields"]["id"].as_str().unwrap().to_string();
                c.inputs.insert(id, hash);
            }
            "Q.Effect" => {
                let input = f["predecessors"]["input"].as_str().unwrap().to_string();
                *c.effects.entry(input).or_default() += 1;
                let w = f["fields"]["w"].as_str().unwrap_or("?").to_string();
                *c.by_worker.entry(w).or_default() += 1;
            }
            "precedent.DeadLetter" | "precedent.Poison" => c.ended_badly += 1,
            _ => {}
        }
    }
    c
}

/// The figures of one run.
#[derive(Clone, Copy, Default, Debug)]
pub struct Tally {
    pub attempted: usize,
    pub acknowledged: usize,
    /// Acknowledged, and no effect for it on the hub after the drain.
    pub lost: usize,
    /// Inputs with two or more effects in one database (hub or node).
    pub doubled: usize,
    /// Inputs or effects for inputs never attempted.
    pub unexpected: usize,
    /// Attempted, not acknowledged, yet completed.
    pub recovered: usize,
    /// Attempted, not acknowledged, and nowhere: allowed.
    pub unacknowledged_absent: usize,
    /// Dead letters and poison on the hub.
    pub ended_badly: usize,
}

impl Tally {
    /// Judges the hub's and the nodes' contents against the ledger.
    pub fn judge(ledger: &Ledger, hub: &Contents, nodes: &[Contents]) -> Tally {
        let mut t = Tally {
            attempted: ledger.attempted.len(),
            acknowledged: ledger.acknowledged.len(),
            ended_badly: hub.ended_badly,
            ..Tally::default()
        };
        let done = |id: &String| {
            hub.inputs
                .get(id)
                .is_some_and(|h| hub.effects.contains_key(h))
        };
        t.lost = ledger.acknowledged.iter().filter(|id| !done(id)).count();
        let unacked = ledger.attempted.difference(&ledger.acknowledged);
        for id in unacked {
            if done(id) {
                t.recovered += 1;
            } else if !hub.inputs.contains_key(id) {
                t.unacknowledged_absent += 1;
            }
        }
        let mut doubled = BTreeSet::new();
        for db in std::iter::once(hub).chain(nodes) {
            let known: BTreeSet<&String> = db.inputs.values().collect();
            doubled.extend(
                db.effects
                    .iter()
                    .filter(|(_, n)| **n > 1)
                    .map(|(h, _)| h.clone()),
            );
            t.unexpected += db
                .inputs
                .keys()
                .filter(|id| !ledger.attempted.contains(*id))
                .count();
            t.unexpected += db.effects.keys().filter(|h| !known.contains(h)).count();
        }
        t.doubled = doubled.len();
        t
    }

    pub fn add(&mut self, o: &Tally) {
        self.attempted += o.attempted;
        self.acknowledged += o.acknowledged;
        self.lost += o.lost;
        self.doubled += o.doubled;
        self.unexpected += o.unexpected;
        self.recovered += o.recovered;
        self.unacknowledged_absent += o.unacknowledged_absent;
        self.ended_badly += o.ended_badly;
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "attempted {} acknowledged {} | lost {} doubled {} unexpected {} recovered {} \
             | unacknowledged and absent {} dead or poison {}",
            self.attempted,
            self.acknowledged,
            self.lost,
            self.doubled,
            self.unexpected,
            self.recovered,
            self.unacknowledged_absent,
            self.ended_badly
        )
    }
}

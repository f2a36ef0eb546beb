//! `init`, `add` and `get`: one fact at a time.

use std::io::{self, Read, Write};

use precedent::json::JsonValue;
use precedent::store::{PG_SCHEMA_VERSION, SCHEMA_VERSION};
use precedent::{Error, Fact, FactHash, InsertOutcome, json};
use serde_json::{Map, Value as Json, json};

use super::{Global, Status};

/// `precedent init`.
pub fn init(g: &Global) -> anyhow::Result<Status> {
    let store = g.open(true)?;
    let (shown, version) = match store.path() {
        Some(path) => {
            let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
            (path.display().to_string(), SCHEMA_VERSION)
        }
        // A PostgreSQL database: its URL without the password, and that schema's version.
        None => (g.shown_db(), PG_SCHEMA_VERSION),
    };
    if g.json {
        let out = json!({"path": shown, "schema_version": version});
        say!("{out}");
    } else {
        say!("{shown}");
    }
    Ok(Status::Ok)
}

/// `precedent add [JSON]`.
pub fn add(g: &Global, text: Option<String>) -> anyhow::Result<Status> {
    let text = match text {
        Some(t) if t != "-" => t,
        _ => {
            let mut t = String::new();
            io::stdin()
                .read_to_string(&mut t)
                .map_err(|e| super::unreadable("cannot read the fact from stdin".into(), &e))?;
            t
        }
    };
    let spec = json::parse(&text)?;
    let store = g.open(true)?;
    // Prefixes are resolved and the facts inserted in one transaction, inline
    // predecessors first.
    let (facts, outcomes) = store.write(|w| {
        let facts = json::resolve(&spec, &mut |p| w.resolve_prefix(p))?;
        let mut outcomes = Vec::with_capacity(facts.len());
        for fact in &facts {
            outcomes.push(w.insert(fact)?);
        }
        Ok((facts, outcomes))
    })?;
    let (fact, outcome) = facts
        .last()
        .zip(outcomes.last())
        .expect("resolve returns the fact itself last");
    if g.json {
        let mut out = outcome_json(fact, outcome);
        if facts.len() > 1 {
            let inline = facts
                .iter()
                .zip(&outcomes)
                .take(facts.len() - 1)
                .map(|(f, o)| Json::Object(outcome_json(f, o)))
                .collect();
            out.insert("inline".into(), Json::Array(inline));
        }
        say!("{}", Json::Object(out));
    } else {
        say!("{}", fact.hash());
        if facts.len() > 1 {
            eprintln!("stored {} inline predecessor facts first", facts.len() - 1);
        }
        eprintln!("{}", describe(outcome));
    }
    Ok(Status::Ok)
}

/// An insert outcome as a JSON object: hash, outcome and its details.
pub fn outcome_json(fact: &Fact, outcome: &InsertOutcome) -> Map<String, Json> {
    let mut m = Map::new();
    m.insert("hash".into(), fact.hash().to_string().into());
    match outcome {
        InsertOutcome::Inserted { seq, released } => {
            m.insert("outcome".into(), "inserted".into());
            m.insert("seq".into(), (*seq).into());
            m.insert("released".into(), (*released).into());
        }
        InsertOutcome::Duplicate { seq } => {
            m.insert("outcome".into(), "duplicate".into());
            m.insert("seq".into(), seq.map_or(Json::Null, Json::from));
        }
        InsertOutcome::Held { missing } => {
            m.insert("outcome".into(), "held".into());
            m.insert("missing".into(), hash_list(missing));
        }
        _ => {
            m.insert("outcome".into(), "unknown".into());
        }
    }
    m
}

/// An insert outcome in words, for people.
pub fn describe(outcome: &InsertOutcome) -> String {
    match outcome {
        InsertOutcome::Inserted { seq, released: 1 } => format!("inserted, released as seq {seq}"),
        InsertOutcome::Inserted { seq, released } => format!(
            "inserted, released as seq {seq}; it also released {} held facts waiting for it",
            released - 1
        ),
        InsertOutcome::Duplicate { seq: Some(seq) } => {
            format!("duplicate: already stored and released (seq {seq}); nothing changed")
        }
        InsertOutcome::Duplicate { seq: None } => {
            "duplicate: already stored and held; nothing changed".to_string()
        }
        InsertOutcome::Held { missing } => format!(
            "held: waiting for {} predecessor(s) not yet released: {}",
            missing.len(),
            join_hashes(missing)
        ),
        other => format!("{other:?}"),
    }
}

/// `precedent get HASH-OR-PREFIX [--cbor]`.
pub fn get(g: &Global, text: &str, cbor: bool) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let hash = store.resolve(text)?;
    let stored = store.lookup(&hash)?.ok_or(Error::NotFound { hash })?;
    let fact = &stored.fact;
    let mut out = io::stdout().lock();
    if cbor {
        out.write_all(fact.canonical_bytes())?;
        out.flush()?;
        return Ok(Status::Ok);
    }
    let missing = match stored.seq {
        Some(_) => Vec::new(),
        None => {
            let mut missing = Vec::new();
            for p in fact.predecessor_hashes() {
                if store.seq_of(&p)?.is_none() {
                    missing.push(p);
                }
            }
            missing
        }
    };
    if g.json {
        // Built as the JSON form's own tree: serde_json's `Value` cannot hold every
        // integer a fact may carry.
        let mut obj = JsonValue::object();
        match stored.seq {
            Some(seq) => {
                obj.insert("status", "released");
                obj.insert("seq", seq);
            }
            None => {
                obj.insert("status", "held");
                obj.insert("missing", hash_list(&missing));
            }
        }
        obj.insert("fact", json::to_json(fact));
        writeln!(out, "{obj}")?;
    } else {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&json::to_json(fact))?
        )?;
        match stored.seq {
            Some(seq) => eprintln!("status: released, seq {seq}"),
            None => eprintln!(
                "status: held, waiting for {}",
                if missing.is_empty() {
                    "nothing (run `precedent verify`)".to_string()
                } else {
                    join_hashes(&missing)
                }
            ),
        }
    }
    Ok(Status::Ok)
}

/// Hashes as a JSON array of strings.
pub fn hash_list(hashes: &[FactHash]) -> Json {
    Json::Array(hashes.iter().map(|h| h.to_string().into()).collect())
}

fn join_hashes(hashes: &[FactHash]) -> String {
    hashes
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

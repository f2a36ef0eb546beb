//! `held`, `verify` and `stats`: looking at what the store holds.

use std::io::{self, Write};
use std::time::Duration;

use precedent::store::{Stats, VerifyReport};
use precedent::{FactHash, Store};
use serde_json::json;

use super::facts::hash_list;
use super::{Global, Status, progress};

/// `precedent held [--limit N]`.
pub fn held(g: &Global, limit: usize) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let held = store.held(limit)?;
    let mut out = io::stdout().lock();
    if g.json {
        for h in &held {
            let line = json!({
                "hash": h.fact.hash().to_string(),
                "type": h.fact.type_name(),
                "held_at_ms": h.held_at_ms,
                "missing": hash_list(&h.missing),
            });
            writeln!(out, "{line}")?;
        }
        return Ok(Status::Ok);
    }
    let total = store.held_count()?;
    if held.is_empty() && total == 0 {
        writeln!(out, "no held facts: every stored fact is released")?;
        return Ok(Status::Ok);
    }
    if !held.is_empty() {
        writeln!(out, "{:<64}  {:<24}  waits for", "hash", "type")?;
    }
    for h in &held {
        let mut missing = h.missing.iter();
        let first = missing.next().map(|m| m.to_string()).unwrap_or_default();
        writeln!(
            out,
            "{}  {:<24}  {}",
            h.fact.hash(),
            h.fact.type_name(),
            first
        )?;
        for m in missing {
            writeln!(out, "{:<64}  {:<24}  {m}", "", "")?;
        }
    }
    if (held.len() as u64) < total {
        writeln!(
            out,
            "(showing the {} oldest of {total} held facts; use --limit)",
            held.len()
        )?;
    }
    Ok(Status::Ok)
}

/// `precedent held drop HASH...`: the hashes (or prefixes) are resolved first, so a typo
/// among them drops nothing.
pub fn held_drop(g: &Global, texts: &[String]) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let mut hashes = Vec::with_capacity(texts.len());
    for text in texts {
        let hash = store.resolve(text)?;
        if !hashes.contains(&hash) {
            hashes.push(hash);
        }
    }
    let dropped = store.drop_held(&hashes)?;
    report_dropped(g, &dropped, hashes.len())
}

/// `precedent held expire --older-than DUR`.
pub fn held_expire(g: &Global, older_than: Duration) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let dropped = store.expire_held(older_than)?;
    if dropped.is_empty() && !g.json {
        eprintln!(
            "no fact has been held for longer than {}",
            humantime::format_duration(older_than)
        );
        return Ok(Status::Ok);
    }
    report_dropped(g, &dropped, dropped.len())
}

/// Prints each dropped hash; `asked` of them were named (or old enough), the rest waited
/// for those.
fn report_dropped(g: &Global, dropped: &[FactHash], asked: usize) -> anyhow::Result<Status> {
    if g.json {
        say!("{}", json!({"dropped": hash_list(dropped)}));
        return Ok(Status::Ok);
    }
    for h in dropped {
        say!("{h}");
    }
    let waiting = dropped.len().saturating_sub(asked);
    eprintln!(
        "dropped {} held fact(s){}; released facts are never dropped",
        dropped.len(),
        if waiting > 0 {
            format!(", {waiting} of them held waiting for the others")
        } else {
            String::new()
        }
    );
    Ok(Status::Ok)
}

/// `precedent verify`.
pub fn verify(g: &Global) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let report = run_verify(&store)?;
    if g.json {
        let problems: Vec<_> = report
            .problems
            .iter()
            .map(|p| json!({"hash": p.hash.map(|h| h.to_string()), "reason": p.reason}))
            .collect();
        let out = json!({
            "released": report.released,
            "held": report.held,
            "clean": report.is_clean(),
            "problems": problems,
        });
        say!("{out}");
    } else {
        print_verify(&report)?;
    }
    Ok(if report.is_clean() {
        Status::Ok
    } else {
        Status::Problems
    })
}

/// Runs `Store::verify` with a progress spinner on a terminal.
pub fn run_verify(store: &Store) -> precedent::Result<VerifyReport> {
    let pb = progress(None, "verifying");
    let report = store.verify(|n| pb.set_message(format!("{n} facts checked")));
    pb.finish_and_clear();
    report
}

/// The verify summary on stdout, each problem on its own stderr line.
pub fn print_verify(report: &VerifyReport) -> io::Result<()> {
    say!(
        "checked {} released and {} held facts",
        report.released,
        report.held
    );
    if report.is_clean() {
        say!("ok: every fact re-hashes to its key, edges and held records are consistent");
        return Ok(());
    }
    for p in &report.problems {
        eprintln!("problem: {p}");
    }
    eprintln!(
        "error: verify found {} problem(s){}",
        report.problems.len(),
        if report.problems.len() >= 1000 {
            " (only the first 1000 are listed)"
        } else {
            ""
        }
    );
    Ok(())
}

/// `precedent stats`.
pub fn stats(g: &Global) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let stats = store.stats()?;
    if g.json {
        say!("{}", stats_json(&stats));
    } else {
        print_stats(&stats)?;
    }
    Ok(Status::Ok)
}

fn stats_json(s: &Stats) -> serde_json::Value {
    json!({
        "per_type": s.per_type,
        "released": s.released,
        "held": s.held,
        "edges": s.edges,
        "db_bytes": s.db_bytes,
    })
}

/// The stats as a table for people.
pub fn print_stats(s: &Stats) -> io::Result<()> {
    say!("released   {:>10}", s.released);
    say!("held       {:>10}", s.held);
    say!("edges      {:>10}", s.edges);
    say!(
        "database   {:>10}  ({} bytes)",
        human_bytes(s.db_bytes),
        s.db_bytes
    );
    if s.per_type.is_empty() {
        return Ok(());
    }
    let width = s.per_type.keys().map(|k| k.len()).max().unwrap_or(4).max(4);
    say!();
    say!("{:<width$}  {:>10}", "type", "released");
    for (name, n) in &s.per_type {
        say!("{name:<width$}  {n:>10}");
    }
    Ok(())
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

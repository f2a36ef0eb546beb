//! Soak with 100 clients: one hub, `precedent serve`, and 25 sync nodes, 25 JSON API
//! clients, 25 SSE watchers and 25 remote workers at once, with a producer enqueuing
//! inputs at a steady rate (the harness: `benches/common/soak_clients/mod.rs`).
//!
//! It runs a floor phase first (one client of each kind on the idle hub, 10 s), then the
//! load phase, and prints per kind of request the p50, p99 and max latency, the p50 of
//! the floor and the ratio; the hub's RSS sampled every 5 s (first, middle, last, max,
//! and the slope of a line fitted over the second half); the database size; the counts;
//! and what was lost, which must be nothing: it exits non-zero otherwise, and also when
//! a run of 300 s or more finds the hub's memory growing (see `FLAT`).
//!
//!     cargo bench --bench soak_clients                               # 60 s
//!     PRECEDENT_SOAK_SECONDS=600 cargo bench --bench soak_clients    # the figure run
//!     PRECEDENT_SOAK_DB=postgres://... cargo bench --bench soak_clients
//!     PRECEDENT_SOAK_DB=pg cargo bench --bench soak_clients  # a throwaway cluster
//!
//! Other settings: `PRECEDENT_SOAK_SYNC`, `_API`, `_WATCH`, `_WORKERS` (clients of each
//! kind, 25), `PRECEDENT_SOAK_JOB_RATE` (inputs/s, 40), `PRECEDENT_SOAK_FLOOR_SECONDS`
//! (10). See `docs/robustness.md`, "Soak with 100 clients".

mod common;
#[path = "../tests/common/pg.rs"]
#[allow(dead_code)]
mod pg;
#[path = "common/soak_clients/mod.rs"]
mod soak;

use soak::OPS;

/// The hub's memory is flat when the line fitted over the second half of the run grows by
/// no more than this share of the middle sample plus 4 MiB over that half.
const FLAT: f64 = 0.05;

fn main() {
    // `cargo bench` passes --bench; a filter naming another bench skips this one.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args
        .iter()
        .any(|a| !a.starts_with('-') && !"soak_clients".contains(a.as_str()))
    {
        return;
    }
    let mut config = soak::Config::from_env(60);
    if config.db_url.as_deref() == Some("pg") {
        // A throwaway cluster with initdb's durable settings, room for the hub's pool.
        pg::use_settings(&["max_connections=300"]);
        config.db_url = Some(pg::db().expect("PostgreSQL is installed").url);
    }
    let r = soak::run(&config);
    let (floor, load) = (&r.floor, &r.load);
    println!(
        "\n## soak_clients: {} clients ({} sync nodes, {} JSON API, {} SSE watchers, {} remote \
         workers) for {:.0} s, hub on {}\n",
        config.clients(),
        config.sync_nodes,
        config.api_clients,
        config.watchers,
        config.workers,
        load.seconds,
        r.backend
    );
    println!(
        "load average {:.2} at the start, {:.2} at the end",
        r.load_average.0, r.load_average.1
    );
    println!("\n| request | n | p50 ms | p99 ms | max ms | floor p50 ms | p50 ratio |");
    println!("|---|---|---|---|---|---|---|");
    for op in OPS {
        let (l, f) = (load.latency(op), floor.latency(op));
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |",
            op.name(),
            l.0.len(),
            l.pct(0.5),
            l.pct(0.99),
            l.max(),
            f.pct(0.5),
            l.pct(0.5) / f.pct(0.5)
        );
    }
    let per_s = |n: u64| n as f64 / load.seconds;
    println!("\n| count (load phase) | value |");
    println!("|---|---|");
    for (what, n) in [
        ("sync rounds", load.syncs),
        ("notes written by sync nodes", load.node_facts),
        ("facts pushed by JSON API clients", load.api_facts),
        ("queries", load.queries),
        ("inputs enqueued", load.jobs),
        ("inputs completed", load.completed),
        ("first attempts failed (retried)", load.failed),
        ("completions refused, lease lost", load.lease_lost),
        ("inputs stored, push unanswered (recovered)", load.recovered),
        ("SSE events received", load.events),
        ("SSE reconnections", load.watch_reconnects),
        ("request errors", load.errors),
    ] {
        println!("| {what} | {n} ({:.1}/s) |", per_s(n));
    }
    println!(
        "| facts on the hub at the end | {} (held {}) |",
        load.hub_facts, load.hub_held
    );
    println!("| drain after stop | {:.1} s |", load.drain_seconds);
    // The verdict is on the hub's memory without SQLite's, whose page caches grow with
    // the database up to their bound (64 MiB per connection).
    let mut flat = true;
    for (what, without_sqlite) in [("RSS", false), ("RSS without SQLite's memory", true)] {
        let m = soak::memory(load, without_sqlite);
        let growth = m.slope * load.seconds / 2.0 / 60.0;
        let bound = FLAT * m.mid + 4.0;
        if without_sqlite {
            flat = growth <= bound;
        }
        println!(
            "\nhub {what} (MiB, every 5 s): idle {:.1}; under load first {:.1}, middle {:.1}, \
             last {:.1}, max {:.1}; last/first {:.2}; slope over the second half {:+.2} MiB/min \
             ({growth:+.1} MiB over it; flat if at most {bound:.1}): {}",
            m.idle,
            m.first,
            m.mid,
            m.last,
            m.max,
            m.last / m.first,
            m.slope,
            if growth <= bound { "flat" } else { "GROWING" }
        );
    }
    if let Some(&b) = load.db_bytes.last()
        && b > 0
    {
        println!(
            "hub database (file + WAL): {:.1} MiB at the end, {:.0} bytes per fact",
            b as f64 / 1048576.0,
            b as f64 / load.hub_facts.max(1) as f64
        );
    }
    for (name, p) in [("floor", floor), ("load", load)] {
        println!("{name}: lost {:?} (total {})", p.lost, p.lost.total());
        for e in &p.error_samples {
            println!("  {name} error: {e}");
        }
    }
    if r.lost() > 0 {
        eprintln!("soak_clients: {} lost or wrong", r.lost());
        std::process::exit(1);
    }
    if config.seconds >= 300 && !flat {
        eprintln!("soak_clients: the hub's memory grew");
        std::process::exit(1);
    }
}

//! `queue`, `dlq` and `poison queue`: declaring work queues and operating on them.
//!
//! The commands only parse, call the queue API on [`Store`] and print; what a state or a
//! count means is documented on the library types (`precedent::queue`).

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use precedent::json::JsonValue;
use precedent::queue::{
    Alerts, Completion, FieldKind, FieldRequirement, ItemInfo, ItemState, Ordering, QueueSpec,
    QueueStats, RateLimit, RetryPolicy, Semantics,
};
use precedent::{FactHash, Store, json};
use serde_json::{Value as Json, json};

use super::{Failure, Global, Status, exit};

/// `precedent queue ...`.
#[derive(Subcommand, Debug)]
pub enum QueueCommand {
    /// Declare a queue (or change an existing one's policy); existing inputs are back-filled.
    ///
    /// Example: precedent queue add invoice --input Shop.Order --done-by Shop.Invoice.order
    /// --done-by Shop.Order.Cancelled.order --max-attempts 5 --backoff-base 2s
    Add(Box<AddArgs>),
    /// List the declared queues with their counts.
    List,
    /// Show a queue's declaration (JSON) and its counts.
    Show {
        /// The queue's name.
        name: String,
    },
    /// Remove a queue and its local state (leases, attempts); its facts stay.
    Rm {
        /// The queue's name.
        name: String,
    },
    /// Counts, ages and rates of every queue (or one), as text, JSON or Prometheus metrics.
    Stats {
        /// Only this queue.
        name: Option<String>,
        /// Prometheus text exposition format.
        #[arg(long)]
        prometheus: bool,
    },
    /// Print each breached alert threshold and exit 1 if any (for cron and monitoring).
    Check {
        /// Only this queue.
        name: Option<String>,
    },
    /// List a queue's unfinished inputs with their state, oldest first.
    Items {
        /// The queue's name.
        name: String,
        /// Only inputs in this state.
        #[arg(long, value_enum)]
        state: Option<StateArg>,
        /// Show at most N.
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
    },
}

/// The options of `queue add`.
#[derive(Args, Debug)]
pub struct AddArgs {
    /// The queue's name.
    pub name: String,
    /// The input fact type.
    #[arg(long, value_name = "TYPE")]
    pub input: String,
    /// A completion rule: the input is done once a fact of TYPE names it through ROLE
    /// (split at the last dot: Shop.Shipped.order is type Shop.Shipped, role order).
    #[arg(long = "done-by", value_name = "TYPE.ROLE", required = true, value_parser = parse_done_by)]
    pub done_by: Vec<Completion>,
    /// Only inputs that name this fact (hash or unique prefix) as a direct predecessor.
    #[arg(long, value_name = "HASH")]
    pub scope: Option<String>,
    /// Mark inputs delivered when claimed: never handed out twice, lost if a handler fails.
    #[arg(long)]
    pub at_most_once: bool,
    /// Offer every pending input regardless of ancestry (default: causal order).
    #[arg(long)]
    pub unordered: bool,
    /// Most deliveries of one input before it is dead-lettered (default 10).
    #[arg(long, value_name = "N")]
    pub max_attempts: Option<u32>,
    /// Longest time from the first attempt before a failure dead-letters (default 30m).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub max_age: Option<i64>,
    /// Backoff before the first retry, doubled each attempt, with full jitter (default 1s).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub backoff_base: Option<i64>,
    /// Upper bound of one backoff (default 5m).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub backoff_cap: Option<i64>,
    /// Lease duration (default 30s).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub lease: Option<i64>,
    /// A field every input must carry, else it is poison; KIND is one of any, null, bool,
    /// integer, float, number, text, bytes, array, map.
    #[arg(long, value_name = "FIELD:KIND", value_parser = parse_requirement)]
    pub require: Vec<FieldRequirement>,
    /// Alert when more than N inputs are dead-lettered (default 0).
    #[arg(long, value_name = "N")]
    pub alert_dead: Option<u64>,
    /// Alert when more than N inputs are poison (default 0).
    #[arg(long, value_name = "N")]
    pub alert_poison: Option<u64>,
    /// Alert when the oldest ready input has waited longer than this (default 5m).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub alert_ready_age: Option<i64>,
    /// Alert when more than N inputs wait (ready, delayed, leased or blocked); default none.
    #[arg(long, value_name = "N")]
    pub alert_depth: Option<u64>,
    /// An integer field of the input: higher is handed out first (within causal order).
    #[arg(long, value_name = "FIELD")]
    pub priority: Option<String>,
    /// A field of the input holding a time (RFC 3339 text or integer ms since the epoch)
    /// before which the input is not handed out.
    #[arg(long, value_name = "FIELD")]
    pub not_before: Option<String>,
    /// Most live leases on this queue at once, across all workers and processes.
    #[arg(long, value_name = "N")]
    pub max_leased: Option<u64>,
    /// Most inputs handed out per period across all workers: N/s, N/m, N/h or N/MS.
    #[arg(long, value_name = "N/PERIOD")]
    pub rate: Option<RateLimit>,
    /// Do not back-fill: only facts stored from now on are inputs (in release order; an
    /// older fact that arrives later by sync or import is one).
    #[arg(long)]
    pub from_now: bool,
}

/// `precedent dlq ...` (and, with the poison state, `precedent poison queue ...`).
#[derive(Subcommand, Debug)]
pub enum EntryCommand {
    /// List the entries of a queue, oldest first.
    List {
        /// The queue's name.
        queue: String,
        /// Show at most N.
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
    },
    /// Show one entry: the input fact, the entry fact, attempts, reason and times.
    Show {
        /// The queue's name.
        queue: String,
        /// The input's or the entry's hash (or a unique prefix).
        hash: String,
    },
    /// Send entries back to the queue with a fresh retry budget (stores a redrive fact).
    Redrive {
        /// The queue's name.
        queue: String,
        /// The input's or the entry's hash (or a unique prefix).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        hash: Option<String>,
        /// Every entry of the queue.
        #[arg(long)]
        all: bool,
    },
    /// End an input for good (stores a discard fact with the reason).
    Discard {
        /// The queue's name.
        queue: String,
        /// The input's or the entry's hash (or a unique prefix).
        hash: String,
        /// Why it is given up.
        #[arg(long, value_name = "TEXT")]
        reason: String,
    },
}

/// `precedent poison ...`: queue poison here, the sync quarantine in `cli::sync`.
#[derive(Subcommand, Debug)]
pub enum PoisonGroup {
    /// Poison inputs of a work queue: list, show, redrive, discard.
    #[command(subcommand)]
    Queue(EntryCommand),
    #[command(flatten)]
    Sync(super::sync::PoisonCommand),
}

/// An item state on the command line.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum StateArg {
    /// Claimable (now or after backoff).
    Ready,
    /// Claimed under a lease.
    Leased,
    /// Waiting for an unfinished ancestor input.
    Blocked,
    /// Dead-lettered.
    Dead,
    /// Poison.
    Poison,
}

impl From<StateArg> for ItemState {
    fn from(s: StateArg) -> ItemState {
        match s {
            StateArg::Ready => ItemState::Ready,
            StateArg::Leased => ItemState::Leased,
            StateArg::Blocked => ItemState::Blocked,
            StateArg::Dead => ItemState::Dead,
            StateArg::Poison => ItemState::Poison,
        }
    }
}

/// Parses a duration such as `250ms`, `30s`, `1m30s`, `1h` or `2d` into milliseconds
/// (`humantime`'s syntax, as every command's durations: `super::time`).
pub fn parse_duration(text: &str) -> Result<i64, String> {
    super::time::parse_ms(text)
}

/// Parses `TYPE.ROLE`, splitting at the last dot.
pub fn parse_done_by(text: &str) -> Result<Completion, String> {
    match text.rsplit_once('.') {
        Some((t, r)) if !t.is_empty() && !r.is_empty() => Ok(Completion {
            type_name: t.to_string(),
            role: r.to_string(),
        }),
        _ => Err(format!(
            "bad completion rule {text:?}: expected TYPE.ROLE, e.g. Shop.Shipped.order"
        )),
    }
}

/// Parses `FIELD:KIND`.
pub fn parse_requirement(text: &str) -> Result<FieldRequirement, String> {
    let (name, kind) = text
        .rsplit_once(':')
        .filter(|(n, _)| !n.is_empty())
        .ok_or_else(|| format!("bad requirement {text:?}: expected FIELD:KIND"))?;
    // FieldKind's serde names are the lowercase kind names.
    let kind: FieldKind = serde_json::from_value(Json::String(kind.to_ascii_lowercase()))
        .map_err(|_| {
        format!("bad field kind {kind:?}: one of any, null, bool, integer, float, number, text, bytes, array, map")
    })?;
    Ok(FieldRequirement {
        name: name.to_string(),
        kind,
    })
}

/// Runs `precedent queue ...`.
pub fn queue(g: &Global, c: QueueCommand) -> anyhow::Result<Status> {
    match c {
        QueueCommand::Add(a) => add(g, *a),
        QueueCommand::List => list(g),
        QueueCommand::Show { name } => show(g, &name),
        QueueCommand::Rm { name } => {
            g.open(false)?.drop_queue(&name)?;
            if g.json {
                say!("{}", json!({"removed": name}));
            } else {
                say!("removed queue {name}");
            }
            Ok(Status::Ok)
        }
        QueueCommand::Stats { name, prometheus } => stats(g, name.as_deref(), prometheus),
        QueueCommand::Check { name } => check(g, name.as_deref()),
        QueueCommand::Items { name, state, limit } => items(g, &name, state, limit),
    }
}

fn add(g: &Global, a: AddArgs) -> anyhow::Result<Status> {
    let store = g.open(true)?;
    let mut spec = QueueSpec::new(&a.name, &a.input, a.done_by);
    if let Some(scope) = &a.scope {
        spec.scope = Some(store.resolve(scope).context("scope")?);
    }
    if a.at_most_once {
        spec.semantics = Semantics::AtMostOnce;
    }
    if a.unordered {
        spec.ordering = Ordering::None;
    }
    let d = RetryPolicy::default();
    spec.retry = RetryPolicy {
        max_attempts: a.max_attempts.unwrap_or(d.max_attempts),
        max_age_ms: a.max_age.unwrap_or(d.max_age_ms),
        backoff_base_ms: a.backoff_base.unwrap_or(d.backoff_base_ms),
        backoff_cap_ms: a
            .backoff_cap
            .unwrap_or(d.backoff_cap_ms.max(a.backoff_base.unwrap_or(0))),
    };
    if let Some(l) = a.lease {
        spec.lease_ms = l;
    }
    spec.required_fields = a.require;
    let d = Alerts::default();
    spec.alerts = Alerts {
        max_dead: a.alert_dead.unwrap_or(d.max_dead),
        max_poison: a.alert_poison.unwrap_or(d.max_poison),
        max_ready_age_ms: a.alert_ready_age.unwrap_or(d.max_ready_age_ms),
        max_depth: a.alert_depth,
    };
    spec.priority_field = a.priority;
    spec.not_before_field = a.not_before;
    spec.max_leased = a.max_leased;
    spec.rate = a.rate;
    if a.from_now {
        store.declare_queue_from_now(&spec)?;
    } else {
        store.declare_queue(&spec)?;
    }
    let stats = store.queue_stats(&spec.name)?;
    if g.json {
        say!("{}", json!({"queue": spec, "stats": stats}));
    } else {
        say!(
            "declared queue {}: {} pending ({} ready, {} blocked)",
            spec.name,
            stats.ready + stats.delayed + stats.leased + stats.blocked,
            stats.ready,
            stats.blocked
        );
    }
    Ok(Status::Ok)
}

fn done_by(spec: &QueueSpec) -> String {
    spec.completions
        .iter()
        .map(|c| format!("{}.{}", c.type_name, c.role))
        .collect::<Vec<_>>()
        .join(",")
}

fn list(g: &Global) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let specs = store.queues()?;
    if g.json {
        // A list: JSON Lines, one declaration per line (docs/cli.md, "--json").
        for spec in &specs {
            say!("{}", serde_json::to_string(spec)?);
        }
        return Ok(Status::Ok);
    }
    for spec in specs {
        let s = store.queue_stats(&spec.name)?;
        say!(
            "{}\tinput {}\tdone by {}\tready {}\tleased {}\tdelayed {}\tblocked {}\tdead {}\tpoison {}\tcompleted {}",
            spec.name,
            spec.input_type,
            done_by(&spec),
            s.ready,
            s.leased,
            s.delayed,
            s.blocked,
            s.dead,
            s.poison,
            s.completed
        );
    }
    Ok(Status::Ok)
}

fn spec_of(store: &Store, name: &str) -> anyhow::Result<QueueSpec> {
    store
        .queues()?
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| {
            precedent::Error::UnknownQueue {
                name: name.to_string(),
            }
            .into()
        })
}

fn show(g: &Global, name: &str) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let spec = spec_of(&store, name)?;
    let stats = store.queue_stats(name)?;
    if g.json {
        say!("{}", json!({"queue": spec, "stats": stats}));
    } else {
        say!("{}", serde_json::to_string_pretty(&spec)?);
        print_stats(&stats)?;
    }
    Ok(Status::Ok)
}

fn print_stats(s: &QueueStats) -> anyhow::Result<()> {
    say!(
        "{}: ready {}, leased {}, delayed {}, blocked {}, dead {}, poison {}, completed {}, discarded {}, dropped {}; failed {}, retried {}, redelivered {}, timed out {}; oldest ready {}; last 5 min: {} completed, {} failed",
        s.queue,
        s.ready,
        s.leased,
        s.delayed,
        s.blocked,
        s.dead,
        s.poison,
        s.completed,
        s.discarded,
        s.dropped,
        s.failed,
        s.retried,
        s.redelivered,
        s.timed_out,
        super::time::format_duration_ms(s.oldest_ready_ms),
        s.completed_5m,
        s.failed_5m
    );
    if let Some(max) = s.depth_alert {
        say!("{}: depth {} (alert over {max})", s.queue, s.depth);
    }
    Ok(())
}

fn all_stats(store: &Store, name: Option<&str>) -> anyhow::Result<Vec<QueueStats>> {
    let names: Vec<String> = match name {
        Some(n) => vec![n.to_string()],
        None => store.queues()?.into_iter().map(|s| s.name).collect(),
    };
    names
        .iter()
        .map(|n| store.queue_stats(n).map_err(Into::into))
        .collect()
}

fn stats(g: &Global, name: Option<&str>, prometheus: bool) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let all = all_stats(&store, name)?;
    if prometheus {
        say!("{}", prometheus_text(&all).trim_end());
    } else if g.json {
        // A list (one line per queue, also when one is named): JSON Lines.
        for s in &all {
            say!("{}", serde_json::to_string(s)?);
        }
    } else {
        for s in &all {
            print_stats(s)?;
        }
    }
    Ok(Status::Ok)
}

/// Escapes a Prometheus label value.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The metrics of `all` in the Prometheus text exposition format.
pub fn prometheus_text(all: &[QueueStats]) -> String {
    type Get = fn(&QueueStats) -> f64;
    let metrics: [(&str, &str, &str, Get); 15] = [
        ("ready", "gauge", "Inputs claimable now.", |s| {
            s.ready as f64
        }),
        ("leased", "gauge", "Inputs under a live lease.", |s| {
            s.leased as f64
        }),
        (
            "delayed",
            "gauge",
            "Inputs backing off after a failure.",
            |s| s.delayed as f64,
        ),
        (
            "blocked",
            "gauge",
            "Inputs waiting for an unfinished ancestor input.",
            |s| s.blocked as f64,
        ),
        ("dead", "gauge", "Dead-lettered inputs.", |s| s.dead as f64),
        ("poison", "gauge", "Poison inputs.", |s| s.poison as f64),
        (
            "oldest_ready_seconds",
            "gauge",
            "Age of the oldest claimable input.",
            |s| s.oldest_ready_ms as f64 / 1000.0,
        ),
        (
            "completed_total",
            "counter",
            "Inputs completed since the queue was declared.",
            |s| s.completed as f64,
        ),
        (
            "discarded_total",
            "counter",
            "Inputs discarded since the queue was declared.",
            |s| s.discarded as f64,
        ),
        (
            "dropped_total",
            "counter",
            "At-most-once inputs lost to a failed handler since the queue was declared.",
            |s| s.dropped as f64,
        ),
        (
            "failures_total",
            "counter",
            "Failed attempts of every kind since the queue was declared.",
            |s| s.failed as f64,
        ),
        (
            "retries_total",
            "counter",
            "Failures given another attempt since the queue was declared.",
            |s| s.retried as f64,
        ),
        (
            "redeliveries_total",
            "counter",
            "Claims of an input whose earlier lease expired since the queue was declared.",
            |s| s.redelivered as f64,
        ),
        (
            "timeouts_total",
            "counter",
            "Attempts that timed out since the queue was declared.",
            |s| s.timed_out as f64,
        ),
        (
            "depth",
            "gauge",
            "Inputs waiting: ready, delayed, leased or blocked.",
            |s| s.depth as f64,
        ),
    ];
    let mut out = String::new();
    for (name, kind, help, get) in metrics {
        out.push_str(&format!(
            "# HELP precedent_queue_{name} {help}\n# TYPE precedent_queue_{name} {kind}\n"
        ));
        for s in all {
            out.push_str(&format!(
                "precedent_queue_{name}{{queue=\"{}\"}} {}\n",
                label(&s.queue),
                get(s)
            ));
        }
    }
    // Only the queues with a depth alert have a threshold to show.
    let alerted: Vec<(&QueueStats, u64)> = all
        .iter()
        .filter_map(|s| s.depth_alert.map(|d| (s, d)))
        .collect();
    if !alerted.is_empty() {
        out.push_str(
            "# HELP precedent_queue_depth_alert Depth over which `queue check` alerts.\n# TYPE precedent_queue_depth_alert gauge\n",
        );
        for (s, d) in alerted {
            out.push_str(&format!(
                "precedent_queue_depth_alert{{queue=\"{}\"}} {d}\n",
                label(&s.queue)
            ));
        }
    }
    out
}

fn check(g: &Global, name: Option<&str>) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let breaches = store.queue_check(name)?;
    if g.json {
        // A list: JSON Lines, one breach per line; nothing when all is well.
        for b in &breaches {
            say!("{}", serde_json::to_string(b)?);
        }
    } else {
        for b in &breaches {
            say!("{b}");
        }
    }
    Ok(if breaches.is_empty() {
        Status::Ok
    } else {
        Status::Problems
    })
}

fn item_json(i: &ItemInfo) -> Json {
    let mut v = serde_json::to_value(i).unwrap_or(Json::Null);
    if let Json::Object(m) = &mut v {
        m.insert("describe".into(), i.describe().into());
    }
    v
}

fn items(g: &Global, name: &str, state: Option<StateArg>, limit: usize) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let items = store.queue_items(name, state.map(Into::into), limit)?;
    for i in &items {
        if g.json {
            say!("{}", item_json(i));
        } else {
            say!(
                "{}\t{}\tattempts {}\t{}",
                i.input,
                state_name(i.state),
                i.attempts,
                i.describe()
            );
        }
    }
    Ok(Status::Ok)
}

fn state_name(s: ItemState) -> &'static str {
    match s {
        ItemState::Ready => "ready",
        ItemState::Leased => "leased",
        ItemState::Blocked => "blocked",
        ItemState::Dead => "dead",
        ItemState::Poison => "poison",
    }
}

/// Runs `precedent dlq ...` (`state` dead) or `precedent poison queue ...` (`state` poison).
pub fn entries(g: &Global, c: EntryCommand, state: ItemState) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    match c {
        EntryCommand::List { queue, limit } => {
            for i in store.queue_items(&queue, Some(state), limit)? {
                if g.json {
                    say!("{}", item_json(&i));
                } else {
                    say!(
                        "{}\tattempts {}\t{}",
                        i.input,
                        i.attempts,
                        i.last_error.as_deref().unwrap_or("")
                    );
                }
            }
        }
        EntryCommand::Show { queue, hash } => {
            let info = entry(&store, &queue, &hash, state)?;
            show_entry(g, &store, &info)?;
        }
        EntryCommand::Redrive { queue, hash, all } => {
            let targets: Vec<FactHash> = if all {
                store
                    .queue_items(&queue, Some(state), usize::MAX >> 1)?
                    .into_iter()
                    .map(|i| i.input)
                    .collect()
            } else {
                let hash = hash.expect("clap requires HASH without --all");
                vec![entry(&store, &queue, &hash, state)?.input]
            };
            for input in &targets {
                let redrive = store.redrive(&queue, input)?;
                if g.json {
                    say!(
                        "{}",
                        json!({"input": input.to_string(), "redrive": redrive.to_string()})
                    );
                } else {
                    say!("{input}\tredriven by {redrive}");
                }
            }
            if !g.json {
                eprintln!("redrove {} input(s) of queue {queue}", targets.len());
            }
        }
        EntryCommand::Discard {
            queue,
            hash,
            reason,
        } => {
            let input = entry(&store, &queue, &hash, state)?.input;
            let discard = store.discard(&queue, &input, &reason)?;
            if g.json {
                say!(
                    "{}",
                    json!({"input": input.to_string(), "discard": discard.to_string()})
                );
            } else {
                say!("{input}\tdiscarded by {discard}");
            }
        }
    }
    Ok(Status::Ok)
}

/// The item `text` names (input or entry, full hash or prefix), which must be in `state`.
fn entry(store: &Store, queue: &str, text: &str, state: ItemState) -> anyhow::Result<ItemInfo> {
    let hash = store.resolve(text)?;
    let what = match state {
        ItemState::Poison => "poison",
        _ => "dead-lettered",
    };
    match store.queue_item(queue, &hash)? {
        Some(i) if i.state == state => Ok(i),
        Some(i) => Err(Failure::error(
            exit::NOT_FOUND,
            format!(
                "input {} of queue {queue} is not {what}: it is {}",
                i.input,
                state_name(i.state)
            ),
        )),
        None => Err(Failure::error(
            exit::NOT_FOUND,
            format!("{hash} is not an unfinished input of queue {queue}"),
        )),
    }
}

fn show_entry(g: &Global, store: &Store, info: &ItemInfo) -> anyhow::Result<()> {
    let input = store
        .get(&info.input)?
        .ok_or(precedent::Error::NotFound { hash: info.input })?;
    let entry = match &info.entry {
        Some(h) => store.get(h)?,
        None => None,
    };
    // The JSON form's own tree, as serde_json's `Value` cannot hold every integer a fact
    // may carry.
    let entry_at = entry
        .as_ref()
        .and_then(|e| e.field("dead_at").or_else(|| e.field("at")));
    let out = JsonValue::Object(vec![
        ("input".into(), json::to_json(&input)),
        ("entry".into(), entry.as_ref().map(json::to_json).into()),
        ("attempts".into(), json!(info.attempts).into()),
        ("reason".into(), json!(info.last_error).into()),
        (
            "first_attempt_at".into(),
            json!(info.first_attempt_at_ms).into(),
        ),
        ("entry_at".into(), entry_at.map(json::value_to_json).into()),
    ]);
    if g.json {
        say!("{out}");
        return Ok(());
    }
    // People read times, not epoch milliseconds.
    let at = |ms: Option<i64>| ms.map_or_else(|| "-".to_string(), super::time::format_ms);
    let entry_ms = entry_at.and_then(|v| match v {
        precedent::Value::Integer(n) => i64::try_from(*n).ok(),
        _ => None,
    });
    say!("input\t{}", info.input);
    if let Some(e) = &info.entry {
        say!("entry\t{e}");
    }
    say!("attempts\t{}", info.attempts);
    say!("reason\t{}", info.last_error.as_deref().unwrap_or(""));
    say!("first attempt\t{}", at(info.first_attempt_at_ms));
    say!("entered at\t{}", at(entry_ms));
    say!("input fact\t{}", json::to_json(&input).to_string());
    if let Some(e) = &entry {
        say!("entry fact\t{}", json::to_json(e));
    }
    Ok(())
}

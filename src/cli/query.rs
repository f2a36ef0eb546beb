//! `query` and `watch`: run a query once, or follow its results as facts arrive.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use precedent::json::JsonValue;
use precedent::query::{Change, Givens, Projected, Query, QueryRow};
use precedent::{Error, Store};
use serde_json::json;

use super::{Failure, Global, Status, exit};

/// What `query` and `watch` share: the query and its givens.
#[derive(clap::Args, Debug)]
pub struct QueryArgs {
    /// The query in the text syntax (docs/queries.md); `-` or absent with `-f` reads a file.
    #[arg(value_name = "TEXT", required_unless_present = "file")]
    pub text: Option<String>,
    /// Read the query from FILE (`-` for stdin).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "text"
    )]
    pub file: Option<PathBuf>,
    /// Bind a given: LABEL=HASH, the hash full or a unique prefix of 8+ hex digits.
    #[arg(long = "given", value_name = "LABEL=HASH")]
    pub given: Vec<String>,
}

/// `precedent watch` arguments.
#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    #[command(flatten)]
    pub query: QueryArgs,
    /// How often to look for new facts, in milliseconds (the most a change waits).
    #[arg(long, value_name = "MS", default_value_t = 50)]
    pub interval_ms: u64,
}

fn load(args: &QueryArgs, store: &Store) -> anyhow::Result<(Query, Givens)> {
    let text = match (&args.text, &args.file) {
        (Some(t), None) => t.clone(),
        (_, Some(f)) if f.as_os_str() == "-" => {
            std::io::read_to_string(std::io::stdin()).context("cannot read the query from stdin")?
        }
        (_, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the query from {}", f.display()))?,
        (None, None) => return Err(Failure::error(exit::USAGE, "give the query or -f FILE")),
    };
    let query = Query::parse(&text)?;
    let mut givens = Givens::new();
    for g in &args.given {
        let Some((label, hash)) = g.split_once('=') else {
            return Err(Failure::error(
                exit::USAGE,
                format!("--given {g}: expected LABEL=HASH"),
            ));
        };
        let Some(decl) = query.givens.iter().find(|d| d.label.name == label) else {
            return Err(Failure::error(
                exit::INVALID,
                format!("--given {g}: the query has no given {label}"),
            ));
        };
        let hash = store.resolve(hash)?;
        if let Some(fact) = store.lookup(&hash)?
            && fact.fact.type_name() != decl.type_name
        {
            return Err(Error::WrongType {
                hash,
                expected: decl.type_name.clone(),
                found: fact.fact.type_name().to_string(),
            }
            .into());
        }
        givens.insert(label.to_string(), hash);
    }
    for d in &query.givens {
        if !givens.contains_key(&d.label.name) {
            return Err(Failure::error(
                exit::USAGE,
                format!("given {0} is not bound: add --given {0}=HASH", d.label.name),
            ));
        }
    }
    Ok((query, givens))
}

/// `precedent query`.
pub fn query(g: &Global, args: QueryArgs) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let (query, givens) = load(&args, &store)?;
    let rows = store.query(&query, &givens)?;
    if g.json {
        for row in &rows {
            say!("{}", row.value.to_json());
        }
    } else {
        print_table(&rows)?;
    }
    Ok(Status::Ok)
}

/// `precedent watch`: the current results, then changes, as JSON Lines until interrupted.
/// Each line carries `at`, the result's index in the query's order in the list the lines
/// so far describe (an addition is inserted there, a removal taken from there, an update,
/// whose child collections changed, replaces the result there), so a consumer keeps the
/// ordered results, and with `limit n` exactly the first `n`, by applying the lines in
/// turn.
pub fn watch(g: &Global, args: WatchArgs) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let (query, givens) = load(&args.query, &store)?;
    let mut watch = store.watch(&query, &givens)?;
    watch.interval = Duration::from_millis(args.interval_ms.max(1));
    let mut shown: Vec<QueryRow> = watch.results().into_iter().cloned().collect();
    for (at, row) in shown.iter().enumerate() {
        say!("{}", event("added", at, row));
    }
    loop {
        for change in watch.wait(&store, Duration::from_secs(1))? {
            match change {
                Change::Added(r) => {
                    let at = shown.partition_point(|x| x.cmp_in(&r, &query).is_lt());
                    say!("{}", event("added", at, &r));
                    shown.insert(at, r);
                }
                Change::Removed(r) => {
                    if let Some(at) = shown.iter().position(|x| x.key == r.key) {
                        say!("{}", event("removed", at, &r));
                        shown.remove(at);
                    }
                }
                Change::Updated(r) => {
                    if let Some(at) = shown.iter().position(|x| x.key == r.key) {
                        say!("{}", event("updated", at, &r));
                        shown[at] = r;
                    }
                }
            }
        }
    }
}

/// One line of `watch`, built as the JSON form's own tree: serde_json's `Value` cannot
/// hold every integer a result may carry.
fn event(change: &str, at: usize, row: &QueryRow) -> JsonValue {
    JsonValue::Object(vec![
        ("change".into(), change.into()),
        ("at".into(), json!(at).into()),
        ("key".into(), json!(row.key).into()),
        ("result".into(), row.value.to_json()),
    ])
}

/// A cell for people: facts and hashes shortened, values as JSON.
fn cell(p: &Projected) -> String {
    match p {
        Projected::Fact(f) => format!("{} {}", f.type_name(), f.hash().short(12)),
        Projected::Hash(h) => h.short(12),
        Projected::Collection(items) => format!(
            "[{}]",
            items.iter().map(cell).collect::<Vec<_>>().join(", ")
        ),
        Projected::Record(items) => items
            .iter()
            .map(|(k, v)| format!("{k}={}", cell(v)))
            .collect::<Vec<_>>()
            .join(" "),
        other => other.to_json().to_string(),
    }
}

fn print_table(rows: &[QueryRow]) -> anyhow::Result<()> {
    let header: Vec<String> = match rows.first().map(|r| &r.value) {
        Some(Projected::Record(items)) => items.iter().map(|(k, _)| k.clone()).collect(),
        _ => vec!["result".into()],
    };
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|r| match &r.value {
            Projected::Record(items) => items.iter().map(|(_, v)| cell(v)).collect(),
            v => vec![cell(v)],
        })
        .collect();
    let mut widths: HashMap<usize, usize> = HashMap::new();
    for line in std::iter::once(&header).chain(&lines) {
        for (i, c) in line.iter().enumerate() {
            let w = widths.entry(i).or_default();
            *w = (*w).max(c.chars().count());
        }
    }
    let render = |line: &[String]| {
        line.iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[&i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    say!("{}", render(&header));
    for line in &lines {
        say!("{}", render(line));
    }
    eprintln!(
        "{} result{}",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" }
    );
    Ok(())
}

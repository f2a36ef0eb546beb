//! `query` and `watch`: run a query once, or follow its results as facts arrive.

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use precedent::json::JsonValue;
use precedent::query::{Change, Givens, Projected, Query, QueryCheck, QueryRow};
use precedent::{Error, Store};
use serde_json::json;

use super::{Failure, Global, Status, exit};

/// What `query` and `watch` share: the query and its givens.
#[derive(clap::Args, Debug)]
pub struct QueryArgs {
    /// The query in the text syntax (docs/queries.md); leave it out to read it with `-f`.
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
    /// Refuse (exit 1) a query naming a type, role or field that no stored fact has,
    /// instead of warning on stderr and running it.
    #[arg(long)]
    pub strict: bool,
}

/// `precedent watch` arguments.
#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    #[command(flatten)]
    pub query: QueryArgs,
    /// The longest wait between two looks for new facts, for changes nothing announces
    /// (another process's write to a SQLite file): 50ms, 1s; a bare number is
    /// milliseconds. On PostgreSQL each commit wakes the watch at once.
    #[arg(long = "interval", alias = "interval-ms", value_name = "DUR", default_value = "50ms",
          value_parser = super::time::parse_ms_or_duration)]
    pub interval: Duration,
}

fn load(args: &QueryArgs, store: &Store) -> anyhow::Result<(Query, Givens)> {
    let text = match (&args.text, &args.file) {
        (Some(t), None) => t.clone(),
        (_, Some(f)) if f.as_os_str() == "-" => std::io::read_to_string(std::io::stdin())
            .map_err(|e| super::unreadable("cannot read the query from stdin".into(), &e))?,
        (_, Some(f)) => std::fs::read_to_string(f).map_err(|e| {
            super::unreadable(format!("cannot read the query from {}", f.display()), &e)
        })?,
        (None, None) => return Err(Failure::error(exit::USAGE, "give the query or -f FILE")),
    };
    let query = Query::parse(&text)?;
    // A misspelled name matches nothing, which reads as a true answer: say so first.
    for warning in QueryCheck::new().strict(args.strict).run(store, &query)? {
        eprintln!("warning: {warning}");
    }
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

/// `precedent query`: each result printed as it is read (`--json`: one JSON line each; a
/// table otherwise, its column widths set by the first [`TABLE_PAGE`] results), then the
/// number of results on stderr.
pub fn query(g: &Global, args: QueryArgs) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let (query, givens) = load(&args, &store)?;
    let mut out = Lines::new(std::io::stdout().lock());
    let mut table = Table::default();
    let mut count: u64 = 0;
    store.query_each(&query, &givens, |row| {
        count += 1;
        if g.json {
            serde_json::to_writer(&mut out.sink, &row.value.to_json()).map_err(io::Error::from)?;
            out.end_line()?;
        } else {
            table.push(&row, &mut out)?;
        }
        Ok(())
    })?;
    if !g.json {
        table.finish(&mut out)?;
    }
    out.sink.flush()?;
    eprintln!("{count} result{}", if count == 1 { "" } else { "s" });
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
    // The initial results are printed as the watch reads them. `shown` keeps only each
    // result's place (its key and `order by` values), which is all `at` needs: the
    // values are the watch's to keep.
    let mut shown: Vec<QueryRow> = Vec::new();
    let mut out = Lines::new(std::io::stdout().lock());
    let mut watch = store.watch_each(&query, &givens, |row| {
        serde_json::to_writer(&mut out.sink, &event("added", shown.len(), row))
            .map_err(io::Error::from)?;
        out.end_line()?;
        shown.push(place(row));
        Ok(())
    })?;
    out.sink.flush()?;
    drop(out);
    watch.interval = args.interval.max(Duration::from_millis(1));
    loop {
        // Woken by each commit announced (on PostgreSQL, any process's), else polls
        // every interval.
        let interval = watch.interval;
        for change in watch.wait(&store, interval)? {
            match change {
                Change::Added(r) => {
                    let at = shown.partition_point(|x| x.cmp_in(&r, &query).is_lt());
                    say!("{}", event("added", at, &r));
                    shown.insert(at, place(&r));
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
                    }
                }
            }
        }
    }
}

/// A result's place in the query's order, without its value.
fn place(row: &QueryRow) -> QueryRow {
    QueryRow {
        key: row.key.clone(),
        value: Projected::Seq(0),
        order: row.order.clone(),
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

/// How many results set a table's column widths before any is printed.
const TABLE_PAGE: usize = 1_000;

/// A table printed as its results arrive: the first [`TABLE_PAGE`] rows are held to set
/// the column widths, then printed with the header; later rows are printed at once, a
/// cell wider than its column widening it from that row on.
#[derive(Default)]
struct Table {
    header: Option<Vec<String>>,
    held: Vec<Vec<String>>,
    widths: Vec<usize>,
    started: bool,
}

impl Table {
    fn push(&mut self, row: &QueryRow, out: &mut Lines<impl Write>) -> io::Result<()> {
        let header = self.header.get_or_insert_with(|| match &row.value {
            Projected::Record(items) => items.iter().map(|(k, _)| k.clone()).collect(),
            _ => vec!["result".into()],
        });
        if self.widths.is_empty() {
            self.widths = header.iter().map(|h| h.chars().count()).collect();
        }
        let line: Vec<String> = match &row.value {
            Projected::Record(items) => items.iter().map(|(_, v)| cell(v)).collect(),
            v => vec![cell(v)],
        };
        self.widen(&line);
        if self.started {
            return self.print(&line, out);
        }
        self.held.push(line);
        if self.held.len() >= TABLE_PAGE {
            self.start(out)?;
        }
        Ok(())
    }

    /// Prints what is held (the header alone for no result: "result").
    fn finish(&mut self, out: &mut Lines<impl Write>) -> io::Result<()> {
        if self.header.is_none() {
            self.header = Some(vec!["result".into()]);
            self.widths = vec!["result".len()];
        }
        if !self.started {
            self.start(out)?;
        }
        Ok(())
    }

    fn start(&mut self, out: &mut Lines<impl Write>) -> io::Result<()> {
        self.started = true;
        let header = self.header.clone().unwrap_or_default();
        self.print(&header, out)?;
        for line in std::mem::take(&mut self.held) {
            self.print(&line, out)?;
        }
        Ok(())
    }

    fn widen(&mut self, line: &[String]) {
        for (i, c) in line.iter().enumerate() {
            let n = c.chars().count();
            match self.widths.get_mut(i) {
                Some(w) => *w = (*w).max(n),
                None => self.widths.push(n),
            }
        }
    }

    fn print(&mut self, line: &[String], out: &mut Lines<impl Write>) -> io::Result<()> {
        self.widen(line);
        let text = line
            .iter()
            .zip(&self.widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ");
        out.sink.write_all(text.trim_end().as_bytes())?;
        out.end_line()
    }
}

/// Buffered standard output for many lines that also reaches a reader soon: flushed after
/// the first line and then at least every [`Lines::EVERY`], so that a slow query's
/// results show as they come and a fast one's are not written a line per system call.
struct Lines<W: Write> {
    sink: io::BufWriter<W>,
    flushed: Option<Instant>,
}

impl<W: Write> Lines<W> {
    const EVERY: Duration = Duration::from_millis(100);

    fn new(w: W) -> Lines<W> {
        Lines {
            sink: io::BufWriter::with_capacity(1 << 16, w),
            flushed: None,
        }
    }

    fn end_line(&mut self) -> io::Result<()> {
        self.sink.write_all(b"\n")?;
        if self.flushed.is_none_or(|t| t.elapsed() >= Self::EVERY) {
            self.sink.flush()?;
            self.flushed = Some(Instant::now());
        }
        Ok(())
    }
}

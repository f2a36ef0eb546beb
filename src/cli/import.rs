//! `import`: JSON Lines or a CBOR sequence, streamed in chunks of records, each chunk
//! inserted with one `insert_batch` (and with `--atomic`, all in one transaction).

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use anyhow::Context;
use indicatif::ProgressBar;
use precedent::store::Writer;
use precedent::{Error, Fact, FactHash, HashPrefix, json};
use serde_json::json;

use super::args::Format;
use super::records::{Body, CborSeq, READ_BYTES, Record, Records, sniff};
use super::{Failure, Global, Status, exit, progress, source_name};

/// Records per `insert_batch` call.
const CHUNK_RECORDS: usize = 10_000;
/// Bytes of records per chunk, so that large facts do not pile up in memory.
const CHUNK_BYTES: usize = 64 << 20;

/// What the import did so far.
#[derive(Default)]
struct Tally {
    records: u64,
    inserted: u64,
    duplicate: u64,
    released: u64,
    invalid: u64,
    refused: u64,
    /// Facts of this input that were held after their chunk.
    held: BTreeSet<FactHash>,
}

/// `precedent import FILE|- [--format json|cbor] [--atomic]`.
pub fn import(
    g: &Global,
    path: &Path,
    format: Option<Format>,
    atomic: bool,
) -> anyhow::Result<Status> {
    let name = source_name(path);
    let (input, len): (Box<dyn Read>, Option<u64>) = if path == Path::new("-") {
        (Box::new(io::stdin().lock()), None)
    } else {
        let file = File::open(path).with_context(|| format!("cannot open {name}"))?;
        let len = file.metadata().ok().map(|m| m.len());
        (Box::new(file), len)
    };
    let pb = progress(len, "importing");
    let mut input = BufReader::with_capacity(READ_BYTES, pb.wrap_read(input));
    let (format, skipped, lines) =
        sniff(&mut input, format).with_context(|| format!("cannot read {name}"))?;
    let mut records = match format {
        Format::Json => Records::Lines {
            r: input,
            line: lines,
        },
        Format::Cbor => Records::Cbor(CborSeq::new(input, skipped)),
    };
    let store = g.open(true)?;
    let limit = g.max_held();
    let mut tally = Tally::default();
    let mut rolled_back = false;
    if atomic {
        let result = store.write(|w| {
            while let Some(chunk) = read_chunk(&mut records)? {
                import_chunk(w, chunk, &mut tally, limit, &pb)?;
            }
            if tally.invalid + tally.refused > 0 {
                rolled_back = true;
                return Err(Error::InvalidFact {
                    reason: "atomic import rolled back".into(),
                });
            }
            Ok(())
        });
        if !rolled_back {
            result.with_context(|| format!("import of {name} stored nothing"))?;
        }
    } else {
        while let Some(chunk) = read_chunk(&mut records)? {
            store.write(|w| import_chunk(w, chunk, &mut tally, limit, &pb))?;
        }
    }
    pb.finish_and_clear();
    let mut held = 0;
    if !rolled_back {
        for h in &tally.held {
            if store.seq_of(h)?.is_none() {
                held += 1;
            }
        }
    }
    print_tally(g, &tally, held, rolled_back)?;
    let bad = tally.invalid + tally.refused;
    if rolled_back {
        return Err(Failure::error(
            exit::INVALID,
            format!(
                "{bad} of {} records in {name} were invalid or refused; --atomic import stored nothing",
                tally.records
            ),
        ));
    }
    if bad > 0 {
        eprintln!(
            "error: {bad} of {} records in {name} were invalid or refused (listed above); the valid ones are stored",
            tally.records
        );
        return Ok(Status::Problems);
    }
    Ok(Status::Ok)
}

fn read_chunk<R: BufRead>(records: &mut Records<R>) -> io::Result<Option<Vec<Record>>> {
    let mut chunk = Vec::new();
    let mut bytes = 0;
    while chunk.len() < CHUNK_RECORDS && bytes < CHUNK_BYTES {
        let Some(rec) = records.next()? else { break };
        bytes += match &rec.body {
            Body::Json(t) => t.len(),
            Body::Cbor(b) => b.len(),
            Body::Bad(_) => 0,
        };
        chunk.push(rec);
    }
    Ok((!chunk.is_empty()).then_some(chunk))
}

/// Parses a chunk (prefixes resolve against the store and against earlier records of
/// the chunk), inserts it with one `insert_batch`, and counts.
fn import_chunk(
    w: &mut Writer<'_>,
    chunk: Vec<Record>,
    tally: &mut Tally,
    limit: u64,
    pb: &ProgressBar,
) -> precedent::Result<()> {
    let mut facts = Vec::with_capacity(chunk.len());
    let mut known = BTreeSet::new();
    let mut origin: HashMap<FactHash, String> = HashMap::new();
    for rec in chunk {
        tally.records += 1;
        match parse(w, &rec.body, &known) {
            Ok(parsed) => {
                for fact in parsed {
                    known.insert(fact.hash());
                    origin
                        .entry(fact.hash())
                        .or_insert_with(|| rec.label.clone());
                    facts.push(fact);
                }
            }
            Err(e) if is_fatal(&e) => return Err(e),
            Err(e) => {
                tally.invalid += 1;
                pb.suspend(|| eprintln!("{}: {}", rec.label, record_error(&rec.body, &e)));
            }
        }
    }
    let report = w.insert_batch(facts)?;
    tally.inserted += report.inserted;
    tally.duplicate += report.duplicates;
    tally.released += report.released;
    tally.refused += report.refused.len() as u64;
    for hash in &report.refused {
        let label = origin.get(hash).map_or("record", String::as_str);
        let e = Error::HeldLimit { limit, hash: *hash };
        pb.suspend(|| eprintln!("{label}: {e}"));
    }
    let refused: BTreeSet<_> = report.refused.into_iter().collect();
    for hash in known {
        if !refused.contains(&hash) && w.released_seq(&hash)?.is_none() {
            tally.held.insert(hash);
        }
    }
    pb.set_message(format!("{} records", tally.records));
    Ok(())
}

fn parse(w: &Writer<'_>, body: &Body, chunk: &BTreeSet<FactHash>) -> precedent::Result<Vec<Fact>> {
    match body {
        Body::Json(text) => {
            let spec = json::parse(text)?;
            json::resolve(&spec, &mut |p| resolve(w, chunk, p))
        }
        Body::Cbor(bytes) => Ok(vec![Fact::from_canonical(bytes)?]),
        Body::Bad(reason) => Err(Error::Json {
            reason: reason.clone(),
        }),
    }
}

/// Resolves a prefix against the facts of the current chunk and the store together.
fn resolve(
    w: &Writer<'_>,
    chunk: &BTreeSet<FactHash>,
    p: &HashPrefix,
) -> precedent::Result<FactHash> {
    let in_chunk: Vec<FactHash> = chunk
        .range(FactHash(p.lowest())..=FactHash(p.highest()))
        .take(10)
        .copied()
        .collect();
    match (in_chunk.as_slice(), w.resolve_prefix(p)) {
        ([], stored) => stored,
        ([one], Err(Error::UnknownPrefix { .. })) => Ok(*one),
        ([one], Ok(h)) if h == *one => Ok(h),
        (_, Err(e @ (Error::Backend(_) | Error::Io(_) | Error::Corrupt { .. }))) => Err(e),
        (found, stored) => {
            let mut candidates = found.to_vec();
            match stored {
                Ok(h) => candidates.push(h),
                Err(Error::AmbiguousPrefix { candidates: c, .. }) => candidates.extend(c),
                Err(_) => {}
            }
            candidates.sort();
            candidates.dedup();
            candidates.truncate(10);
            Err(Error::AmbiguousPrefix {
                prefix: p.text(),
                candidates,
            })
        }
    }
}

/// Errors that are about the database, not the record: they stop the import.
fn is_fatal(e: &Error) -> bool {
    matches!(e, Error::Backend(_) | Error::Io(_) | Error::Corrupt { .. })
}

fn record_error(body: &Body, e: &Error) -> String {
    match (body, e) {
        (Body::Bad(reason), _) => reason.clone(),
        _ => e.to_string(),
    }
}

fn print_tally(g: &Global, t: &Tally, held: u64, rolled_back: bool) -> std::io::Result<()> {
    if g.json {
        let out = json!({
            "records": t.records,
            "inserted": if rolled_back { 0 } else { t.inserted },
            "duplicate": if rolled_back { 0 } else { t.duplicate },
            "held": held,
            "released": if rolled_back { 0 } else { t.released },
            "invalid": t.invalid,
            "refused": t.refused,
            "stored": !rolled_back,
        });
        say!("{out}");
        return Ok(());
    }
    if rolled_back {
        say!("records    {:>10}", t.records);
        say!("invalid    {:>10}", t.invalid);
        say!("refused    {:>10}  (held-fact limit reached)", t.refused);
        say!("nothing stored (--atomic)");
        return Ok(());
    }
    say!("records    {:>10}", t.records);
    say!("inserted   {:>10}", t.inserted);
    say!("duplicate  {:>10}", t.duplicate);
    say!("held       {:>10}  (waiting for ancestors)", held);
    say!("released   {:>10}", t.released);
    say!("invalid    {:>10}", t.invalid);
    say!("refused    {:>10}  (held-fact limit reached)", t.refused);
    Ok(())
}

//! `import`: JSON Lines or a CBOR sequence, parsed, encoded and hashed on every core
//! (`pipeline.rs`) and stored by this thread in input order, a batch at a time, each
//! batch with one `insert_batch` (and with `--atomic`, all in one transaction).

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::Context;
use indicatif::ProgressBar;
use precedent::store::Writer;
use precedent::{Error, FactHash, HashPrefix, json};
use serde_json::json;

use super::args::Format;
use super::pipeline::{AHEAD_HELD, AHEAD_RECORDS, Batches, Chunker, Item, PIECE_RECORDS, Parsed};
use super::records::{CborSeq, READ_BYTES, Records, sniff};
use super::{Failure, Global, Status, exit, progress, source_name, unreadable};

/// Records per `insert_batch` call: 50,000 imports faster than 10,000 or 25,000 (fewer
/// commits and checkpoints); docs/performance.md, "Import", has the figures, and the
/// peak memory, which is over its 300 MB bound at a million facts. `PRECEDENT_IMPORT_BATCH`
/// overrides it, for tests and benches.
const CHUNK_RECORDS: usize = 50_000;
/// Bytes of records per batch, so that large facts do not pile up in memory.
const CHUNK_BYTES: usize = 64 << 20;

/// Threads that parse, from `PRECEDENT_IMPORT_THREADS` (1: all in this thread, the
/// reference that tests compare against), else one per core. `serve` and `sync` decode
/// received records on as many (`ServerConfig::decode_threads`,
/// `ClientOptions::decode_threads`).
pub(super) fn threads() -> usize {
    std::env::var("PRECEDENT_IMPORT_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

/// Batch boundaries; `PRECEDENT_IMPORT_BATCH` and `PRECEDENT_IMPORT_PIECE` (records per
/// piece handed to a worker) override the defaults, for tests and benches.
fn chunker(format: Format) -> Chunker {
    let var = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
            .max(1)
    };
    Chunker {
        records: var("PRECEDENT_IMPORT_BATCH", CHUNK_RECORDS),
        bytes: CHUNK_BYTES,
        piece: var("PRECEDENT_IMPORT_PIECE", PIECE_RECORDS),
        ahead: match format {
            Format::Json => AHEAD_RECORDS,
            Format::Cbor => AHEAD_HELD,
        },
    }
}

/// What the import did so far.
#[derive(Default)]
struct Tally {
    records: u64,
    inserted: u64,
    duplicate: u64,
    released: u64,
    invalid: u64,
    refused: u64,
    /// Facts of this input that were held after their batch.
    held: HeldLog,
}

/// The hashes of the facts of this input that were held after their batch (a fact may be
/// there more than once), to count at the end those still held. They go to an unlinked
/// temporary file, 32 bytes each, not to memory: a children-first import of a million
/// facts holds nearly all of them until its last batch, whose facts are in memory then
/// (30 MB of hashes at that peak). They are read back only if the store still holds
/// facts at the end. Without a temporary directory they stay in memory.
#[derive(Default)]
struct HeldLog {
    file: Option<File>,
    memory: Vec<FactHash>,
    logged: u64,
    failed: bool,
}

impl HeldLog {
    fn add(&mut self, hashes: &[FactHash]) -> io::Result<()> {
        if hashes.is_empty() {
            return Ok(());
        }
        self.logged += hashes.len() as u64;
        if self.file.is_none() && !self.failed {
            self.file = temp_file();
            self.failed = self.file.is_none();
        }
        match &mut self.file {
            Some(f) => f.write_all(&hashes.iter().flat_map(|h| h.0).collect::<Vec<u8>>()),
            None => {
                self.memory.extend_from_slice(hashes);
                Ok(())
            }
        }
    }

    /// How many of the logged facts are still held, each counted once.
    fn still_held(mut self, store: &precedent::Store) -> anyhow::Result<u64> {
        if self.logged == 0 || store.held_count()? == 0 {
            return Ok(0);
        }
        let mut all = std::mem::take(&mut self.memory);
        if let Some(mut f) = self.file.take() {
            let mut bytes = Vec::with_capacity(self.logged as usize * 32);
            f.seek(SeekFrom::Start(0))?;
            f.read_to_end(&mut bytes)?;
            all.extend(bytes.chunks_exact(32).filter_map(FactHash::from_slice));
        }
        all.sort_unstable();
        all.dedup();
        let mut held = 0;
        for h in &all {
            if store.seq_of(h)?.is_none() {
                held += 1;
            }
        }
        Ok(held)
    }
}

/// A new temporary file, already unlinked (it goes when it is closed).
fn temp_file() -> Option<File> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let path = std::env::temp_dir().join(format!(
        "precedent-import-held-{}-{nanos}",
        std::process::id()
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .ok()?;
    // Unlinked while open on Unix; elsewhere removal fails while it is open, and the
    // hashes stay in memory.
    if std::fs::remove_file(&path).is_err() {
        drop(file);
        let _ = std::fs::remove_file(&path);
        return None;
    }
    Some(file)
}

/// `precedent import FILE|- [--format json|cbor] [--atomic]`.
pub fn import(
    g: &Global,
    path: &Path,
    format: Option<Format>,
    atomic: bool,
) -> anyhow::Result<Status> {
    let name = source_name(path);
    let (input, len): (Box<dyn Read + Send>, Option<u64>) = if path == Path::new("-") {
        (Box::new(io::stdin()), None)
    } else {
        let file = File::open(path).map_err(|e| unreadable(format!("cannot open {name}"), &e))?;
        let len = file.metadata().ok().map(|m| m.len());
        (Box::new(file), len)
    };
    let pb = progress(len, "importing");
    let mut input = BufReader::with_capacity(READ_BYTES, pb.wrap_read(input));
    let (format, skipped, lines) =
        sniff(&mut input, format).map_err(|e| unreadable(format!("cannot read {name}"), &e))?;
    let input: Box<dyn BufRead + Send> = Box::new(input);
    let records = match format {
        Format::Json => Records::Lines {
            r: input,
            line: lines,
        },
        Format::Cbor => Records::Cbor(CborSeq::new(input, skipped)),
    };
    let store = g.open(true)?;
    let chunker = chunker(format);
    let mut batches =
        Batches::start(records, chunker, threads()).context("cannot start the import threads")?;
    let limit = g.max_held();
    let mut tally = Tally::default();
    let mut rolled_back = false;
    if atomic {
        let result = store.write(|w| {
            while let Some(chunk) = batches.next_batch()? {
                let held = import_chunk(w, chunk, &mut tally, limit, &pb)?;
                batches.stored(held, &chunker);
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
        while let Some(chunk) = batches.next_batch()? {
            let held = store.write(|w| import_chunk(w, chunk, &mut tally, limit, &pb))?;
            batches.stored(held, &chunker);
        }
    }
    pb.finish_and_clear();
    let held_log = std::mem::take(&mut tally.held);
    let held = if rolled_back {
        0
    } else {
        held_log
            .still_held(&store)
            .context("cannot count the held facts")?
    };
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

/// Stores a parsed batch with one `insert_batch` and counts; returns whether it held
/// facts. Records that name a hash prefix resolve here, against the store and against
/// earlier records of the batch.
fn import_chunk(
    w: &mut Writer<'_>,
    chunk: Vec<Item>,
    tally: &mut Tally,
    limit: u64,
    pb: &ProgressBar,
) -> precedent::Result<bool> {
    let mut facts = Vec::with_capacity(chunk.len());
    // Each fact's hash and the index of its record's label; the set of them (for prefix
    // lookups) is built only once a record needs it.
    let mut hashes: Vec<(FactHash, usize)> = Vec::with_capacity(chunk.len());
    let mut known: Option<BTreeSet<FactHash>> = None;
    let mut labels = Vec::with_capacity(chunk.len());
    for item in chunk {
        tally.records += 1;
        let parsed = match item.parsed {
            Parsed::Facts(parsed) => Ok(parsed),
            Parsed::NeedsStore(spec) => {
                let known = known.get_or_insert_with(|| hashes.iter().map(|h| h.0).collect());
                json::resolve(&spec, &mut |p| resolve(w, known, p))
            }
            Parsed::Invalid(reason) => {
                tally.invalid += 1;
                pb.suspend(|| eprintln!("{}: {reason}", item.label));
                continue;
            }
        };
        match parsed {
            Ok(parsed) => {
                for fact in parsed {
                    if let Some(known) = known.as_mut() {
                        known.insert(fact.hash());
                    }
                    hashes.push((fact.hash(), labels.len()));
                    facts.push(fact);
                }
                labels.push(item.label);
            }
            Err(e) if is_fatal(&e) => return Err(e),
            Err(e) => {
                tally.invalid += 1;
                pb.suspend(|| eprintln!("{}: {e}", item.label));
            }
        }
    }
    // The facts are freed on another thread (about fifteen allocations each), not in
    // this one, which stores.
    let report = w.insert_batch(facts.clone())?;
    precedent::ingest::drop_elsewhere(facts);
    let held_any = report.held > 0;
    tally.inserted += report.inserted;
    tally.duplicate += report.duplicates;
    tally.released += report.released;
    tally.refused += report.refused.len() as u64;
    if !report.refused.is_empty() {
        // The first record that gave each fact.
        let mut origin: HashMap<FactHash, usize> = HashMap::with_capacity(hashes.len());
        for &(hash, label) in &hashes {
            origin.entry(hash).or_insert(label);
        }
        for hash in &report.refused {
            let label = origin.get(hash).map_or("record", |&i| labels[i].as_str());
            let e = Error::HeldLimit { limit, hash: *hash };
            pb.suspend(|| eprintln!("{label}: {e}"));
        }
    }
    // With nothing held and nothing a duplicate (of a fact that may be held), every fact
    // of the batch that was not refused is released: no need to look each one up.
    if report.held > 0 || report.duplicates > 0 {
        let refused: BTreeSet<_> = report.refused.into_iter().collect();
        let known = known.unwrap_or_else(|| hashes.iter().map(|h| h.0).collect());
        let mut held = Vec::new();
        for hash in known {
            if !refused.contains(&hash) && w.released_seq(&hash)?.is_none() {
                held.push(hash);
            }
        }
        tally.held.add(&held).map_err(Error::Io)?;
    }
    pb.set_message(format!("{} records", tally.records));
    Ok(held_any)
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

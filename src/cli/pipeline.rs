//! The parsing side of `import`: records are split by one reader thread, parsed, checked,
//! encoded and hashed by worker threads, and handed back to the writer in input order,
//! one batch at a time.
//!
//! ```text
//! reader ──piece i──▶ worker i % n ──parsed piece i──▶ writer (takes piece 0, 1, 2, ...)
//! ```
//!
//! The reader deals pieces (up to [`PIECE_RECORDS`] records) to the workers in turn over
//! one bounded channel each, and the writer takes the parsed pieces back in the same turn,
//! so input order needs no reordering buffer: that part is the library's
//! [`precedent::ingest::Ordered`], which sync's receiving sides use too. Batch boundaries are decided by the reader
//! exactly as a single-threaded import decides them (see [`Chunker`]), and a batch is
//! handed over only once all of it has arrived, so that what the writer prints and
//! stores does not depend on the number of threads.
//!
//! Everything that does not need the store happens in the workers. A JSON record whose
//! hash prefixes must be looked up (see [`Parsed::NeedsStore`]) is parsed there and
//! resolved by the writer, against the store and the batch's earlier records, as before.
//!
//! Memory: while the writer stores a batch, at most [`AHEAD_RECORDS`] records of JSON or
//! [`AHEAD_HELD`] of CBOR (or one batch, if smaller) are dealt to the workers and not yet taken by the writer, parsed or
//! being parsed: the reader waits at a [`Gate`] for the writer to take them. That bound
//! is [`AHEAD_HELD`] while the last batch held facts: such a batch is about to release
//! them, or is children first, and then the held facts, the store's cascade and the batch
//! itself take the memory that parsed records ahead would need, and the speed of parsing
//! matters less. A parsed fact takes about 2.3 KB, so 25,000 of them are about 58 MB.

use std::io::{self, BufRead};
use std::sync::{Arc, Condvar, Mutex};

use precedent::ingest::Ordered;
use precedent::json::{self, FactSpec};
use precedent::{Error, Fact};

use super::records::{Body, Record, Records};

/// Records per piece dealt to a worker: large enough that channel traffic is negligible,
/// small enough that the workers share a batch evenly.
pub const PIECE_RECORDS: usize = precedent::ingest::PIECE;
/// Parsed records that may wait for the writer, in all (see the module's "Memory").
pub const AHEAD_RECORDS: usize = 25_000;
/// Records ahead while the last batch held facts (and before the first batch is stored).
pub const AHEAD_HELD: usize = 10_000;
/// Bytes of records per piece, so that large facts do not pile up in the channels.
const PIECE_BYTES: usize = 1 << 20;

/// One record after the pure steps.
pub enum Parsed {
    /// The facts of the record, inline predecessors first, encoded and hashed.
    Facts(Vec<Fact>),
    /// A JSON record naming a hash prefix that only the store can resolve.
    NeedsStore(FactSpec),
    /// The record is invalid; the message to print after its label.
    Invalid(String),
}

/// A record's label (`line N`, `record N (byte offset B)`) and what parsing made of it.
pub struct Item {
    pub label: String,
    pub parsed: Parsed,
}

/// Parses, checks, encodes and hashes one record as far as it can without the store.
///
/// A JSON record of the common shape (full hashes, no inline facts) is read in one pass
/// by `json::parse_fast`; any other goes through [`parse_json`], which gives its facts
/// or its error.
pub fn parse(body: Body) -> Parsed {
    match body {
        Body::Json(text) => match json::parse_fast(&text) {
            Some(fact) => Parsed::Facts(vec![fact]),
            None => parse_json(&text),
        },
        Body::Cbor(bytes) => match Fact::from_canonical(&bytes) {
            Ok(fact) => Parsed::Facts(vec![fact]),
            Err(e) => Parsed::Invalid(e.to_string()),
        },
        Body::Bad(reason) => Parsed::Invalid(reason),
    }
}

/// A JSON record through the general path: the JSON tree, then resolution.
///
/// The record is resolved with a resolver that answers no prefix; if resolving stopped
/// at a prefix, the record goes to the writer, which repeats the resolution with the
/// store. Resolution is deterministic up to its first prefix lookup, so the outcome is
/// the same as resolving with the store from the start.
fn parse_json(text: &str) -> Parsed {
    match json::parse(text) {
        Err(e) => Parsed::Invalid(e.to_string()),
        Ok(spec) => {
            let mut needs_store = false;
            let resolved = json::resolve(&spec, &mut |p| {
                needs_store = true;
                Err(Error::UnknownPrefix { prefix: p.text() })
            });
            match resolved {
                Ok(facts) => Parsed::Facts(facts),
                Err(_) if needs_store => Parsed::NeedsStore(spec),
                Err(e) => Parsed::Invalid(e.to_string()),
            }
        }
    }
}

/// Where a batch ends: after `records` records or `bytes` bytes of record text; how
/// many records go to a worker at a time (`piece`: [`PIECE_RECORDS`], smaller in tests so
/// that small inputs cross piece boundaries); and how many may be parsed ahead of the
/// writer while the batches hold nothing (`ahead`: [`AHEAD_RECORDS`] for JSON, whose
/// parsing costs as much as storing; [`AHEAD_HELD`] for CBOR, decoded in about a
/// microsecond a record, for which more ahead would only cost memory).
#[derive(Clone, Copy)]
pub struct Chunker {
    pub records: usize,
    pub bytes: usize,
    pub piece: usize,
    pub ahead: usize,
}

impl Chunker {
    fn ends(&self, records: usize, bytes: usize) -> bool {
        records >= self.records || bytes >= self.bytes
    }
}

fn body_len(body: &Body) -> usize {
    match body {
        Body::Json(t) => t.len(),
        Body::Cbor(b) => b.len(),
        Body::Bad(_) => 0,
    }
}

/// Batches of parsed records, in input order.
pub enum Batches {
    /// One thread: read and parse in the caller's thread (`threads` = 1).
    Inline {
        records: Records<Box<dyn BufRead + Send>>,
        chunker: Chunker,
    },
    /// A reader thread and worker threads.
    Piped {
        pieces: Ordered<Piece>,
        gate: GateHandle,
        done: bool,
    },
}

/// What the reader deals to a worker: records, or how the input ended.
enum Job {
    Records {
        records: Vec<Record>,
        ends_batch: bool,
    },
    Failed(io::Error),
    End,
}

/// What a worker hands back: parsed records, or how the input ended.
pub enum Piece {
    Items {
        items: Vec<Item>,
        /// The last piece of its batch.
        ends_batch: bool,
    },
    /// Reading failed here; nothing after this point was read.
    Failed(io::Error),
    /// The input ended.
    End,
}

impl Batches {
    /// Starts reading `records`; with `threads` > 1, on a reader thread and `threads`
    /// workers.
    pub fn start(
        records: Records<Box<dyn BufRead + Send>>,
        chunker: Chunker,
        threads: usize,
    ) -> io::Result<Batches> {
        if threads <= 1 {
            return Ok(Batches::Inline { records, chunker });
        }
        // The channels hold up to the larger bound; the gate keeps to the one in force.
        let ahead =
            (chunker.records.min(chunker.ahead.max(AHEAD_HELD)) / chunker.piece / threads).max(1);
        let gate = Arc::new(Gate {
            state: Mutex::new(GateState {
                dealt: 0,
                limit: chunker.records.min(AHEAD_HELD),
                closed: false,
            }),
            changed: Condvar::new(),
        });
        let reader_gate = gate.clone();
        // Detached threads: the reader may block on standard input after the writer has
        // stopped at an error, which a scope would wait for.
        let pieces = Ordered::start_detached(
            "import-parse",
            threads,
            ahead,
            move |give| {
                read(records, chunker, &mut |job| {
                    if let Job::Records { records, .. } = &job
                        && !reader_gate.deal(records.len())
                    {
                        return false;
                    }
                    give(job)
                })
            },
            work,
        )?;
        Ok(Batches::Piped {
            pieces,
            gate: GateHandle(gate),
            done: false,
        })
    }

    /// The next batch, or `None` at the end of the input. A read error ends the input:
    /// the batch it interrupted is dropped, as a single-threaded import drops it.
    pub fn next_batch(&mut self) -> io::Result<Option<Vec<Item>>> {
        match self {
            Batches::Inline { records, chunker } => {
                let mut batch = Vec::new();
                let mut bytes = 0;
                while !chunker.ends(batch.len(), bytes) {
                    let Some(rec) = records.next()? else { break };
                    bytes += body_len(&rec.body);
                    batch.push(item(rec));
                }
                Ok((!batch.is_empty()).then_some(batch))
            }
            Batches::Piped { pieces, gate, done } => {
                let mut batch = Vec::new();
                while !*done {
                    let piece = pieces.next().ok_or_else(|| {
                        io::Error::other("an import worker thread stopped unexpectedly")
                    })?;
                    if let Piece::Items { items, .. } = &piece {
                        gate.0.taken(items.len());
                    }
                    match piece {
                        Piece::Items { items, ends_batch } => {
                            batch.extend(items);
                            if ends_batch {
                                return Ok(Some(batch));
                            }
                        }
                        Piece::Failed(e) => {
                            *done = true;
                            return Err(e);
                        }
                        Piece::End => *done = true,
                    }
                }
                Ok((!batch.is_empty()).then_some(batch))
            }
        }
    }
}

impl Batches {
    /// Says whether the batch just stored held facts: the reader may then parse only
    /// [`AHEAD_HELD`] records ahead of the writer, else `chunker.ahead`.
    pub fn stored(&self, held: bool, chunker: &Chunker) {
        if let Batches::Piped { gate, .. } = self {
            let ahead = if held { AHEAD_HELD } else { chunker.ahead };
            gate.0.set_limit(chunker.records.min(ahead));
        }
    }
}

/// How many records the reader has dealt that the writer has not taken, and how many it
/// may: the reader waits here while the writer stores.
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

struct GateState {
    dealt: usize,
    limit: usize,
    /// The writer has gone.
    closed: bool,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `n` more records may be dealt (at once if none are out); `false` if the
    /// writer has gone.
    fn deal(&self, n: usize) -> bool {
        let mut s = self.lock();
        while !s.closed && s.dealt > 0 && s.dealt + n > s.limit {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.dealt += n;
        !s.closed
    }

    fn taken(&self, n: usize) {
        let mut s = self.lock();
        s.dealt = s.dealt.saturating_sub(n);
        self.changed.notify_all();
    }

    fn set_limit(&self, limit: usize) {
        self.lock().limit = limit;
        self.changed.notify_all();
    }
}

/// The writer's side of the gate, which lets the reader go when it is dropped.
pub struct GateHandle(Arc<Gate>);

impl Drop for GateHandle {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.changed.notify_all();
    }
}

fn item(rec: Record) -> Item {
    Item {
        label: rec.label,
        parsed: parse(rec.body),
    }
}

/// A worker's job: parses a piece of records, or passes on how the input ended.
fn work(job: Job) -> Piece {
    match job {
        Job::Records {
            records,
            ends_batch,
        } => Piece::Items {
            items: records.into_iter().map(item).collect(),
            ends_batch,
        },
        Job::Failed(e) => Piece::Failed(e),
        Job::End => Piece::End,
    }
}

/// The reader: splits the input into pieces and deals them to the workers in turn, ending
/// with [`Piece::End`] or [`Piece::Failed`]. It stops early if the writer has gone.
fn read(
    mut records: Records<Box<dyn BufRead + Send>>,
    chunker: Chunker,
    send: &mut dyn FnMut(Job) -> bool,
) {
    let (mut in_batch, mut batch_bytes) = (0, 0);
    let mut piece = Vec::new();
    let mut piece_bytes = 0;
    loop {
        let rec = match records.next() {
            Ok(Some(rec)) => rec,
            Ok(None) => break,
            Err(e) => {
                send(Job::Failed(e));
                return;
            }
        };
        let len = body_len(&rec.body);
        in_batch += 1;
        batch_bytes += len;
        piece_bytes += len;
        piece.push(rec);
        let ends_batch = chunker.ends(in_batch, batch_bytes);
        if ends_batch || piece.len() >= chunker.piece || piece_bytes >= PIECE_BYTES {
            let records = std::mem::take(&mut piece);
            if !send(Job::Records {
                records,
                ends_batch,
            }) {
                return;
            }
            piece_bytes = 0;
            if ends_batch {
                (in_batch, batch_bytes) = (0, 0);
            }
        }
    }
    if !piece.is_empty()
        && !send(Job::Records {
            records: piece,
            ends_batch: true,
        })
    {
        return;
    }
    send(Job::End);
}

//! A batch written while it is still being made: the facts of a push are sent to the
//! fact table by one `COPY` as they are decoded, so that PostgreSQL stores the first
//! while the last are decoded, where a batch ([`super::batch`]) starts writing only
//! once it has them all.
//!
//! It is the batch guessed new ([`PgWrite::insert_many`]) with nothing read first: a
//! fact goes into the `COPY` when each predecessor's seq and type is known without a
//! statement (the connection is busy with the `COPY`): released earlier in the stream,
//! taken as released by the caller, or remembered by [`super::recent`]. A fact that
//! `recent` remembers is a duplicate. Any other fact waits (and with it every fact
//! naming it, whose predecessor is then unknown), and the waiting ones are written after
//! the `COPY`s as an ordinary batch, which looks up what they need. Their predecessors
//! in the stream come first in it, so release order holds. A fact whose type or role
//! has no id yet (neither this transaction's nor a committed one cached) ends the
//! `COPY`: the names are made and a new `COPY` goes on from it, up to [`SEGMENTS`].
//!
//! It streams only what would have been guessed new and written at once: at least
//! [`GUESS_FROM`] facts, every hook idle, nothing written ahead, a guess allowed, and no
//! fact held in the store (a fact of the stream could then release held ones, which the
//! `COPY` cannot look up). As for a guess, one fact of the `COPY` stored already fails it
//! on the unique hash; the savepoint is rolled back and the facts, kept as they came,
//! are written again as an ordinary batch, looked up.

use super::batch::{GUESS_FROM, Hooking, Known};
use super::conn::EdgeColumns;
use super::write::PgWrite;
use crate::error::Result;
use crate::fact::Fact;
use crate::store::BatchReport;
use crate::store::backend::HookRunner;

impl PgWrite<'_> {
    /// See [`crate::store::WriteTx::insert_streamed`]; the write lock is taken.
    pub(super) fn insert_stream(
        &mut self,
        facts: &mut dyn Iterator<Item = Fact>,
        hint: usize,
        hooks: &mut HookRunner<'_>,
    ) -> Result<BatchReport> {
        // The savepoint opened with the lock, if it was and nothing ran since: then only
        // the hooks' check (a read) comes between it and the stream.
        let at_lock = self
            .guess_at_lock
            .take()
            .filter(|&(_, statements)| statements == self.tx.statements())
            .map(|(mark, _)| mark);
        let hooking = Hooking::of(hooks, self)?;
        if !self.may_stream(hint) || hooking.hooked() || self.counters().held != 0 {
            return self.insert_many_idle(facts.collect(), hooks, hooking);
        }
        let mark = match at_lock {
            Some(mark) => mark,
            None => self.open_guess()?,
        };
        hooks.savepoint_opened();
        let mut all = Vec::with_capacity(hint);
        match self.stream(facts, &mut all) {
            Ok(Some((mut report, waiting))) => {
                hooks.savepoint_closed(false);
                if !waiting.is_empty() {
                    report.merge(self.insert_many_as(waiting, hooks, Hooking::Idle, false)?);
                }
                // Freeing a push's thousand facts took 0.2 to 0.3 ms of its answer's time.
                crate::ingest::drop_elsewhere(all);
                Ok(report)
            }
            Ok(None) => {
                // A fact of the stream was stored already: written again, looked up,
                // with the facts not taken yet (a `COPY` that ends at a new name before
                // the last fact fails there).
                all.extend(facts);
                self.tx.backend.shared.recent.guess_failed();
                self.back_to_guess(mark)?;
                hooks.savepoint_closed(true);
                self.insert_many_as(all, hooks, Hooking::Idle, false)
            }
            Err(e) => {
                hooks.savepoint_closed(false);
                Err(e)
            }
        }
    }

    /// Whether a stream of about `hint` facts may be guessed new, as far as is known
    /// before the lock: the hooks and the held facts are known after it.
    pub(super) fn may_stream(&self, hint: usize) -> bool {
        hint >= GUESS_FROM
            && !self.tx.ahead.borrow().on
            && self.tx.backend.shared.recent.may_guess()
    }

    /// Sends the facts of `facts` that need no look-up to the fact table by `COPY` as
    /// they come (each with its first edge), then their other edges by another; keeps
    /// every fact in `all`. A fact whose
    /// type or role has no id yet ends the `COPY`: its names are made and a new `COPY`
    /// goes on from it, up to [`SEGMENTS`] of them. Returns the count of what it wrote
    /// and the facts left waiting, or `None` if a fact it wrote was stored already.
    fn stream(
        &mut self,
        facts: &mut dyn Iterator<Item = Fact>,
        all: &mut Vec<Fact>,
    ) -> Result<Option<(BatchReport, Vec<Fact>)>> {
        let mut report = BatchReport::default();
        let mut waiting = Vec::new();
        let mut mine = Known::default();
        let mut edges = EdgeColumns::default();
        let mut seq = self.counters().seq;
        let first = seq;
        // A fact to write first in the next `COPY`, its names made.
        let mut named: Option<Fact> = None;
        // A fact's edges: predecessor seq, role id, predecessor type.
        let mut preds: Vec<(i64, i64, i64)> = Vec::with_capacity(4);
        for segment in 1..=SEGMENTS {
            let shared = &self.tx.backend.shared;
            let (names, assumed) = (&self.names, &self.assumed);
            let mut unnamed = None;
            let written = self.tx.copy_facts_streamed(|sink| {
                loop {
                    let fact = match named.take() {
                        Some(f) => f,
                        None => match facts.next() {
                            Some(f) => {
                                all.push(f.clone());
                                f
                            }
                            None => break,
                        },
                    };
                    let hash = fact.hash();
                    let next = shared.recent.with(|recent| {
                        if mine.contains_key(&hash) || recent(&hash).is_some() {
                            return Next::Duplicate;
                        }
                        preds.clear();
                        let mut have_names = true;
                        for (role, set) in fact.predecessors() {
                            let role = names.known(&shared.names, true, role);
                            have_names &= role.is_some();
                            for p in set {
                                let known = mine.get(p).or_else(|| assumed.get(p)).copied();
                                let Some((pseq, ptype)) = known.or_else(|| recent(p)) else {
                                    return Next::Wait;
                                };
                                preds.push((pseq, role.unwrap_or(0), ptype));
                            }
                        }
                        match names.known(&shared.names, false, fact.type_name()) {
                            Some(type_id) if have_names => Next::Write(type_id),
                            _ => Next::Unnamed,
                        }
                    });
                    let type_id = match next {
                        Next::Duplicate => {
                            report.duplicates += 1;
                            continue;
                        }
                        Next::Unnamed if segment < SEGMENTS => {
                            unnamed = Some(fact);
                            break;
                        }
                        Next::Wait | Next::Unnamed => {
                            waiting.push(fact);
                            continue;
                        }
                        Next::Write(type_id) => type_id,
                    };
                    seq += 1;
                    // The first edge in the fact's row, the others in `edge_more`.
                    sink.row(
                        seq,
                        &hash.0,
                        type_id,
                        fact.canonical_bytes(),
                        preds.first().copied(),
                    );
                    for &pred in preds.iter().skip(1) {
                        edges.push(pred, (seq, type_id, hash));
                    }
                    mine.insert(hash, (seq, type_id));
                }
                Ok(())
            })?;
            if !written {
                return Ok(None);
            }
            let Some(fact) = unnamed else { break };
            // Its names, made now (a round trip or two each, once per name).
            self.names.id(&self.tx, false, fact.type_name())?;
            for role in fact.predecessors().keys() {
                self.names.id(&self.tx, true, role)?;
            }
            named = Some(fact);
        }
        self.tx.copy_edges(&edges)?;
        report.inserted = (seq - first) as u64;
        report.released = report.inserted;
        self.counters().seq = seq;
        self.released.extend(mine);
        Ok(Some((report, waiting)))
    }
}

/// `COPY`s a stream is written by at most: each after the first follows a fact whose
/// names were made. Past it, such facts wait for the batch after the stream.
const SEGMENTS: usize = 16;

/// What a fact of the stream is.
enum Next {
    /// Released before, or earlier in the stream.
    Duplicate,
    /// It needs a look-up: written after the stream, as a batch.
    Wait,
    /// Its type or a role has no id yet: made before it is written.
    Unnamed,
    /// Written now, with this type id.
    Write(i64),
}

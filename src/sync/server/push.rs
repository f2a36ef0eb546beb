//! `POST /v1/facts`: a push, stored in one transaction, with its memory bounded.
//!
//! Memory: a push first takes permits from the server's push budget for its body's
//! length (`App::push_budget`), so the bodies held at once are bounded whatever the
//! number of pushes in flight; one that cannot get them within half the request timeout
//! is answered 503 `busy` with `Retry-After`. The body is read into one buffer of its
//! announced length, split into records once it has the push turn (one push at a
//! time), then decoded and stored in chunks of [`CHUNK`] facts inside the one write
//! transaction: the index of its records and one chunk of decoded facts exist only for
//! the push whose turn it is, beside the bodies that wait.
//!
//! The chunks are given to the store as they are decoded (`Writer::insert_streamed`): on
//! PostgreSQL a chunk of 256 facts or more is written by a `COPY` fed as they come
//! (`store/postgres/stream.rs`), and the records that do not decode are quarantined
//! after the chunk's facts.
//!
//! The body is a CBOR sequence or, in the JSON API, facts in the JSON form
//! (`json_api`): the two differ only in how records are split and decoded.
//!
//! Decoding and re-hashing run on every core (`crate::ingest`, as `import` does), a few
//! pieces of up to 1,000 records ahead of the writer, which takes the facts in body
//! order: the quarantine, the first forbidden type, the chunks and the counts are what a
//! decoding in this one thread gives. A body of 1,000 records is cut into pieces of 250
//! on two cores (`ingest::piece_len`), and the threads start before the transaction
//! begins, so its first round trips overlap the decoding.

use std::collections::HashSet;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;

use super::app::{App, Caller, Failure, Need, authorize};
use super::json_api::{PushForm, decode_json, json_records};
use super::routes::{json_response, too_many};
use crate::error::Error;
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::ingest;
use crate::store::{BatchReport, Writer};
use crate::sync::auth::Grant;
use crate::sync::metrics::inc;
use crate::sync::wire::{self, PushReport, Rejected};

/// Facts decoded and inserted at a time within a push's transaction.
const CHUNK: usize = 10_000;

pub(super) async fn push(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    let caller = authorize(&app, &headers, Need::Write)?;
    let form = PushForm::of(&headers)?;
    inc(&app.metrics.requests_push, 1);
    let (permit, announced) = take_budget(&app, &headers).await?;
    let bytes = read_push_body(&app, body, announced).await?;
    // One push at a time on a blocking thread: they take turns at the store's one writer
    // anyway, and so a push's decoding does not run on a thread (and in an allocator
    // arena) of its own while the others wait, which under many concurrent pushes left
    // each arena holding a push's worth of freed memory.
    let turn = app
        .push_turn
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| Failure::internal("server is shutting down".into()))?;
    let a = app.clone();
    // The turn and the body's memory permits go with the work, not with this request: a
    // request that passes the request timeout is answered 408 while its push goes on to
    // its commit, and until then it still holds the body and the store's writer.
    let report = tokio::task::spawn_blocking(move || {
        let _held = (turn, permit);
        match form {
            PushForm::Cbor => store_push(&a, &caller, &bytes),
            json => {
                let records = json_records(&bytes, json)?;
                store_records(&a, &caller, &records, decode_json)
            }
        }
    })
    .await
    .map_err(|e| Failure::internal(format!("worker failed: {e}")))??;
    let mut r = json_response(&report);
    r.headers_mut()
        .insert(wire::HEADER_STORE, app.store_id.clone());
    Ok(r)
}

/// Waits for the permits of a body of the request's `Content-Length` (the whole body
/// limit when it has none): 413 for a body announced over the limit, 503 `busy` when the
/// budget stays taken for half the request timeout.
async fn take_budget(
    app: &Arc<App>,
    headers: &HeaderMap,
) -> Result<(tokio::sync::OwnedSemaphorePermit, Option<usize>), Failure> {
    let max = app.limits.max_body_bytes;
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = announced
        && n > max as u64
    {
        return Err(Failure::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("request body of {n} bytes is over the limit of {max} bytes"),
        ));
    }
    let bytes = announced
        .map_or(max, |n| n as usize)
        .min(app.push_budget_bytes);
    let kib = u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
    let wait = app.limits.request_timeout / 2;
    match tokio::time::timeout(wait, app.push_budget.clone().acquire_many_owned(kib)).await {
        Ok(Ok(permit)) => Ok((permit, announced.map(|n| n as usize))),
        _ => Err(Failure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            format!(
                "other pushes hold the server's push memory ({} MiB) for over {} s; retry",
                app.push_budget_bytes >> 20,
                wait.as_secs()
            ),
        )
        .retry_after(1)),
    }
}

/// Reads a push body into one buffer, of its announced length when it has one: 413 past
/// the body limit.
async fn read_push_body(
    app: &App,
    mut body: Body,
    announced: Option<usize>,
) -> Result<Vec<u8>, Failure> {
    use http_body_util::BodyExt;
    let max = app.limits.max_body_bytes;
    let mut out = Vec::with_capacity(announced.unwrap_or(0).min(max));
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| super::routes::bad_request(format!("cannot read request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > max {
                return Err(Failure::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!("request body is over the limit of {max} bytes"),
                ));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// Splits, checks and stores one CBOR push body in one transaction.
fn store_push(app: &App, caller: &Caller, bytes: &[u8]) -> Result<PushReport, Failure> {
    let records = wire::split_records(bytes);
    let decode = |r: &Result<&[u8], wire::FramingError>| match r {
        Ok(b) => ingest::decode(b),
        Err(e) => Err((e.reason.clone(), e.bytes.clone())),
    };
    store_records(app, caller, &records, decode)
}

/// Checks and stores the records of one push body in one transaction: the record limit
/// first, then each record decoded by `decode` (on every core, taken in body order),
/// valid facts stored in chunks and refused records quarantined.
fn store_records<T: Sync>(
    app: &App,
    caller: &Caller,
    records: &[T],
    decode: impl Fn(&T) -> ingest::Decoded + Send + Sync,
) -> Result<PushReport, Failure> {
    let max = app.limits.max_facts_per_request;
    if records.len() as u64 > max {
        return Err(too_many(records.len() as u64, max, "records"));
    }
    let mut refusal: Option<Failure> = None;
    // The decoding threads start before the transaction: they decode the first pieces
    // while it begins, and the next ones while the writer stores the first.
    let result = ingest::in_order(records, app.decode_threads, decode, |facts| {
        app.store.write(|w| {
            inc(&app.metrics.facts_received, records.len() as u64);
            let mut push = Push::default();
            let mut hashes = Vec::new();
            let mut quarantined = Vec::new();
            let mut records_left = records.len();
            let mut facts = facts.enumerate();
            loop {
                // The next chunk, stored as it is decoded; refused records are kept for
                // the quarantine, written after it.
                let hint = records_left.min(CHUNK);
                let mut taken = 0;
                // A fact of a type the token may not write ends the stream, to be looked
                // up: one the store has already is a duplicate, which writes nothing (a
                // node sends back what it pulled), and only a new one is refused.
                let mut forbidden: Option<Fact> = None;
                let mut stream = std::iter::from_fn(|| {
                    if taken == CHUNK || forbidden.is_some() {
                        return None;
                    }
                    for (index, fact) in facts.by_ref() {
                        records_left -= 1;
                        match fact {
                            Ok(f) => {
                                if let Some(g) = &caller.grant
                                    && !g.may_write_type(f.type_name())
                                {
                                    forbidden = Some(f);
                                    return None;
                                }
                                hashes.push(f.hash());
                                taken += 1;
                                return Some(f);
                            }
                            Err((reason, b)) => quarantined.push((index, reason, b)),
                        }
                    }
                    None
                });
                push.insert(w, &mut stream, hint)?;
                push.chunks += usize::from(taken > 0);
                for (index, reason, b) in quarantined.drain(..) {
                    w.quarantine(&caller.name, &reason, &b)?;
                    push.rejected.push(Rejected {
                        index: index as u64,
                        reason,
                    });
                }
                if let Some(f) = forbidden {
                    if w.sql().lookup(&f.hash())?.is_none() {
                        if let Some(g) = &caller.grant {
                            refusal = Some(forbidden_type(g, &f));
                        }
                        return Err(Error::SyncConfig {
                            reason: "forbidden type".into(),
                        });
                    }
                    hashes.push(f.hash());
                    push.total.duplicates += 1;
                    continue;
                }
                if taken < CHUNK {
                    break;
                }
            }
            push.hashes = hashes;
            push.finish(w, &caller.name, app.limits.max_held_per_peer, records.len())
        })
    });
    // A refusal decided inside the transaction (which it rolled back).
    if let Some(f) = refusal {
        return Err(f);
    }
    let report = result.map_err(Failure::from)?;
    inc(&app.metrics.rejected, report.rejected.len() as u64);
    Ok(report)
}

fn forbidden_type(g: &Grant, f: &Fact) -> Failure {
    Failure::new(
        StatusCode::FORBIDDEN,
        "forbidden_type",
        format!(
            "token {:?} may not write facts of type {:?} (fact {})",
            g.name,
            f.type_name(),
            f.hash()
        ),
    )
}

/// What a push has done so far inside its transaction.
#[derive(Default)]
struct Push {
    /// The highest `seq` before the push, read (taking the write lock) as it begins to
    /// store its facts, before they are decoded.
    before: Option<i64>,
    /// Every valid fact of the body, in body order.
    hashes: Vec<FactHash>,
    rejected: Vec<Rejected>,
    total: BatchReport,
    chunks: usize,
}

impl Push {
    /// Stores the facts `facts` yields, about `hint` of them, as they come.
    fn insert(
        &mut self,
        w: &mut Writer<'_>,
        facts: &mut dyn Iterator<Item = Fact>,
        hint: usize,
    ) -> crate::Result<()> {
        if hint == 0 {
            return Ok(());
        }
        if self.before.is_none() {
            // Under the write lock, as `max_seq` reads it, made ready for the stream.
            self.before = Some(w.last_seq_before_stream(hint)?);
        }
        let batch = w.insert_streamed(facts, hint)?;
        self.total.merge(batch);
        Ok(())
    }

    /// The per-peer held bound, then the answer: counts, the body's new `seq` ranges, and
    /// what held facts wait for.
    fn finish(
        self,
        w: &mut Writer<'_>,
        peer: &str,
        max_held: u64,
        received: usize,
    ) -> crate::Result<PushReport> {
        let mut total = self.total;
        if total.held > 0 {
            let held = w.note_held_origin(peer, &self.hashes)?;
            if held > max_held {
                return Err(Error::HeldLimit {
                    limit: max_held,
                    hash: self.hashes[0],
                });
            }
        }
        // Nothing stored (every record refused, or none): nothing released.
        let (before, after) = match self.before {
            Some(before) => (before, w.max_seq()?),
            None => (0, 0),
        };
        let new = (after - before) as u64;
        let seqs = if new == total.inserted && total.released == total.inserted {
            // Nothing but the body's own facts was released: one range.
            if new > 0 {
                vec![(before + 1, after)]
            } else {
                Vec::new()
            }
        } else {
            let body: HashSet<FactHash> = self.hashes.iter().copied().collect();
            let (seqs, of_body) = body_ranges(w, before, &body)?;
            if self.chunks > 1 {
                // A fact held by one chunk and released by a later one was new: count it
                // as a single batch would have, released on arrival and not held.
                let new_facts = total.inserted + total.held;
                total.inserted = of_body.min(new_facts);
                total.held = new_facts - total.inserted;
            }
            seqs
        };
        let missing = if total.held > 0 {
            w.absent_ancestors(1000)?
        } else {
            Vec::new()
        };
        Ok(PushReport {
            received: received as u64,
            inserted: total.inserted,
            duplicates: total.duplicates,
            held: total.held,
            released: total.released,
            rejected: self.rejected,
            refused: total.refused.iter().map(|h| h.to_string()).collect(),
            missing: missing.iter().map(|h| h.to_string()).collect(),
            seqs,
            store: None,
        })
    }
}

/// The `seq` ranges, after `before`, of the facts released in this transaction that are
/// in `body`, and how many there are.
fn body_ranges(
    w: &Writer<'_>,
    before: i64,
    body: &HashSet<FactHash>,
) -> crate::Result<(Vec<(i64, i64)>, u64)> {
    let mut ranges: Vec<(i64, i64)> = Vec::new();
    let mut n = 0;
    for (seq, hash) in w.released_after(before)? {
        if !body.contains(&hash) {
            continue;
        }
        n += 1;
        match ranges.last_mut() {
            Some(last) if last.1 + 1 == seq => last.1 = seq,
            _ => ranges.push((seq, seq)),
        }
    }
    Ok((ranges, n))
}

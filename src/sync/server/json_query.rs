//! `POST /v1/query`: a query's results as JSON, streamed as they are read, a page at a
//! time (`docs/protocol.md`, "POST /v1/query").
//!
//! The query runs on a blocking thread, as one statement for a page
//! ([`Store::query_each_after`]) or for an answer of every result whose rows are
//! handed over as they arrive (no child collections), else as pages of [`STREAM_PAGE`]
//! results in one snapshot ([`Store::query_pages`]), and writes its answer into 64 KiB
//! chunks sent through a channel of 8, as a pull does: memory stays bounded by the
//! chunks or the page, whatever the number of results. The status is decided by
//! the first chunk: an error before it (a given of the wrong type, the statement
//! failing) is an error answer; one after it cuts the body short, which a client tells
//! by a body that is not a complete JSON object.
//!
//! Paging is a keyset over the query's order: a page reads one result more than it
//! answers, and when that one exists the answer's `next` is a cursor holding the last
//! answered result's `order by` values and key (and what is left of the query's own
//! `limit`), from which the next page's statement starts.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::app::{App, Failure, Need, authorize};
use super::json_api::full_hash;
use super::routes::{bad_request, read_body, require_content_type, send_within};
use crate::error::Error;
use crate::predicate::{Number, SortKey};
use crate::query::{Givens, Query, QueryRow, reads_collection};
use crate::store::Store;
use crate::sync::wire::{self, QueryRequest};

/// Bytes of answer gathered before a chunk is sent.
const CHUNK_BYTES: usize = 64 * 1024;
/// Results read per statement for an answer of every result.
const STREAM_PAGE: usize = 10_000;

/// A checked request: the parsed query, its givens and where the page starts.
struct Page {
    query: Query,
    givens: Givens,
    /// Most results answered; `None` for all of them.
    size: Option<u64>,
    /// The `order by` values and key of the last result of the previous page.
    after: Option<(Vec<SortKey>, Vec<i64>)>,
    /// What is left of the query's own `limit`.
    left: Option<u64>,
    /// Identifies the query text and givens in a cursor.
    id: String,
}

/// What the blocking thread sends: a chunk of the answer, or why it failed.
enum Msg {
    Chunk(Bytes),
    Fail(Failure),
}

pub(super) async fn query(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    require_content_type(&headers, wire::JSON)?;
    let bytes = read_body(&app, body).await?;
    let page = check(&bytes, &app.limits)?;
    let (tx, mut rx) = mpsc::channel::<Msg>(8);
    let a = app.clone();
    tokio::task::spawn_blocking(move || {
        let mut out = Answer {
            tx,
            buf: Vec::with_capacity(CHUNK_BYTES + 4096),
            limit: a.limits.request_timeout,
        };
        match run(&a.store, &page, &mut out) {
            Ok(()) => {
                let _ = out.flush();
            }
            // Before the first chunk, the error answer; after it, the body is cut (the
            // connection is closed without the chunked body's last chunk).
            Err(e) => {
                send_within(&out.tx, Msg::Fail(failure(e)), out.limit);
            }
        }
    });
    let first = match rx.recv().await {
        Some(Msg::Chunk(c)) => c,
        Some(Msg::Fail(f)) => return Err(f),
        None => {
            return Err(Failure::internal(
                "the query stopped without an answer".into(),
            ));
        }
    };
    let rest = futures_util::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await? {
            Msg::Chunk(c) => Some((Ok::<_, std::io::Error>(c), rx)),
            Msg::Fail(f) => Some((Err(std::io::Error::other(f.message)), rx)),
        }
    });
    let head = futures_util::stream::once(async move { Ok(first) });
    let mut r = Response::new(Body::from_stream(futures_util::StreamExt::chain(
        head, rest,
    )));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(wire::JSON));
    Ok(r)
}

/// The error answer for a query that failed before its first chunk.
pub(super) fn failure(e: Error) -> Failure {
    match e {
        Error::Query(q) => Failure::new(
            axum::http::StatusCode::BAD_REQUEST,
            "bad_query",
            q.to_string(),
        ),
        e @ Error::WrongType { .. } => bad_request(e.to_string()),
        e => Failure::from(e),
    }
}

/// Parses and checks a request body before anything runs: 400 for a body, query, given
/// or cursor that is wrong.
fn check(bytes: &[u8], limits: &super::Limits) -> Result<Page, Failure> {
    let req: QueryRequest = serde_json::from_slice(bytes).map_err(|e| {
        bad_request(format!(
            "query body is not {{\"query\": TEXT, \"givens\": {{...}}, \"page_size\": N, \"after\": CURSOR}}: {e}"
        ))
    })?;
    let query = Query::parse(&req.query).map_err(failure)?;
    let givens = bind_givens(&query, &req.givens, |l| {
        format!("\"{l}\": HASH to \"givens\"")
    })?;
    let max = limits.max_facts_per_request;
    if let Some(n) = req.page_size
        && (n == 0 || n > max)
    {
        return Err(bad_request(format!(
            "page_size must be 1 to {max}, not {n}"
        )));
    }
    let id = query_id(&req);
    let (after, left) = match &req.after {
        None => (None, query.limit),
        Some(text) => {
            let c = Cursor::parse(text, &id, &query)?;
            (Some((c.order(), c.key)), c.left)
        }
    };
    Ok(Page {
        query,
        givens,
        size: req.page_size,
        after,
        left,
        id,
    })
}

/// Binds each given label of `query` to its hash in `given`: 400 for a label the query does
/// not declare, a hash that is not 64 hex digits, or a declared label left unbound (`how`
/// says how to bind it, as the endpoint names givens).
pub(super) fn bind_givens<'a>(
    query: &Query,
    given: impl IntoIterator<Item = (&'a String, &'a String)>,
    how: impl Fn(&str) -> String,
) -> Result<Givens, Failure> {
    let mut givens = Givens::new();
    for (label, hash) in given {
        if !query.givens.iter().any(|g| &g.label.name == label) {
            return Err(bad_request(format!("the query has no given {label}")));
        }
        let h =
            full_hash(hash).map_err(|f| bad_request(format!("given {label}: {}", f.message)))?;
        givens.insert(label.clone(), h);
    }
    if let Some(g) = query
        .givens
        .iter()
        .find(|g| !givens.contains_key(&g.label.name))
    {
        return Err(bad_request(format!(
            "given {0} is not bound: add {1}",
            g.label.name,
            how(&g.label.name)
        )));
    }
    Ok(givens)
}

/// The query text and givens a cursor belongs to, as 16 hex digits.
fn query_id(req: &QueryRequest) -> String {
    let mut h = blake3::Hasher::new();
    h.update(req.query.as_bytes());
    for (label, hash) in &req.givens {
        h.update(b"\0");
        h.update(label.as_bytes());
        h.update(b"=");
        h.update(hash.to_ascii_lowercase().as_bytes());
    }
    h.finalize().to_hex()[..16].to_string()
}

/// Runs one page and writes its answer: `{"results": [...], "count": N, "next": ...}`.
/// The givens' types are checked in the query's own read transaction, when it finds
/// nothing.
fn run(store: &Store, page: &Page, out: &mut Answer) -> crate::Result<()> {
    // One result more than the page, to know whether another page follows.
    let want = match (page.size, page.left) {
        (Some(n), Some(l)) => Some((n + 1).min(l)),
        (Some(n), None) => Some(n + 1),
        (None, l) => l,
    };
    let mut count: u64 = 0;
    let mut last: Option<QueryRow> = None;
    let mut more = false;
    out.buf.extend_from_slice(b"{\"results\":[");
    let mut each = |row: QueryRow| -> crate::Result<()> {
        if page.size.is_some_and(|n| count == n) {
            more = true;
            return Ok(());
        }
        if count > 0 {
            out.buf.push(b',');
        }
        row.value.write_json(&mut out.buf)?;
        count += 1;
        out.maybe_flush()?;
        last = Some(row);
        Ok(())
    };
    match (&page.after, page.size) {
        // Every result in one answer, from one statement whose rows are written as they
        // are read (`Sql::query_streamed`): the chunks bound the memory, and the answer
        // is written while the statement runs.
        (None, None) if !reads_collection(&page.query.select) => {
            store.query_each_after_in(&page.query, &page.givens, true, None, want, each)?;
        }
        // A projection with child collections reads each statement's rows whole: pages
        // of one snapshot keep the rows held at once bounded.
        (None, None) => {
            for row in store.query_pages_in(&page.query, &page.givens, true, STREAM_PAGE)? {
                each(row?)?;
            }
        }
        (after, _) => {
            let after = after.as_ref().map(|(o, k)| (&o[..], &k[..]));
            store.query_each_after_in(&page.query, &page.givens, true, after, want, each)?;
        }
    }
    let next = match last {
        Some(row) if more => Some(
            Cursor {
                q: page.id.clone(),
                key: row.key,
                order: row.order.iter().map(Key::of).collect(),
                left: page.left.map(|l| l - count),
            }
            .text(),
        ),
        _ => None,
    };
    out.buf.extend_from_slice(b"],\"count\":");
    out.buf.extend_from_slice(count.to_string().as_bytes());
    out.buf.extend_from_slice(b",\"next\":");
    serde_json::to_writer(&mut out.buf, &next).map_err(std::io::Error::from)?;
    out.buf.push(b'}');
    Ok(())
}

/// The answer being written: a buffer sent in chunks.
struct Answer {
    tx: mpsc::Sender<Msg>,
    buf: Vec<u8>,
    /// How long a chunk may wait for the client to read (`send_within`).
    limit: std::time::Duration,
}

impl Answer {
    fn maybe_flush(&mut self) -> crate::Result<()> {
        if self.buf.len() >= CHUNK_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Sends what is gathered; a client gone away, or reading nothing for the request
    /// timeout, stops the query.
    fn flush(&mut self) -> crate::Result<()> {
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(CHUNK_BYTES + 4096),
        ));
        if send_within(&self.tx, Msg::Chunk(chunk), self.limit) {
            Ok(())
        } else {
            Err(Error::Io(std::io::ErrorKind::BrokenPipe.into()))
        }
    }
}

/// Where the next page starts, as the client carries it: hex of this JSON.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cursor {
    /// [`query_id`] of the request that made it.
    q: String,
    /// The last result's key (release sequence numbers).
    key: Vec<i64>,
    /// The last result's `order by` values.
    order: Vec<Key>,
    /// What is left of the query's own `limit`.
    left: Option<u64>,
}

/// A [`SortKey`] in a cursor: floats by their bits, so that every one (the infinities
/// too) comes back exactly.
#[derive(Serialize, Deserialize)]
enum Key {
    Null,
    Int(i64),
    Real(u64),
    Text(String),
    Bytes(String),
}

impl Key {
    fn of(k: &SortKey) -> Key {
        match k {
            SortKey::Null => Key::Null,
            SortKey::Number(Number::Int(i)) => Key::Int(*i),
            SortKey::Number(Number::Real(f)) => Key::Real(f.to_bits()),
            SortKey::Text(t) => Key::Text(hex::encode(t)),
            SortKey::Bytes(b) => Key::Bytes(hex::encode(b)),
        }
    }

    fn sort_key(&self) -> Option<SortKey> {
        Some(match self {
            Key::Null => SortKey::Null,
            Key::Int(i) => SortKey::Number(Number::Int(*i)),
            Key::Real(bits) => SortKey::Number(Number::Real(f64::from_bits(*bits))),
            Key::Text(t) => SortKey::Text(hex::decode(t).ok()?),
            Key::Bytes(b) => SortKey::Bytes(hex::decode(b).ok()?),
        })
    }
}

impl Cursor {
    fn text(&self) -> String {
        hex::encode(serde_json::to_vec(self).expect("a cursor serialises"))
    }

    /// Reads a cursor of this query: 400 for one that is not a cursor, or belongs to
    /// another query text or givens.
    fn parse(text: &str, id: &str, query: &Query) -> Result<Cursor, Failure> {
        let bad = || bad_request(format!("after {text:?} is not a cursor of this query"));
        let bytes = hex::decode(text).map_err(|_| bad())?;
        let c: Cursor = serde_json::from_slice(&bytes).map_err(|_| bad())?;
        let sound = c.q == id
            && c.key.len() == query.top_labels().len()
            && c.order.len() == query.order.len()
            && c.order.iter().all(|k| k.sort_key().is_some());
        if !sound {
            return Err(bad());
        }
        Ok(c)
    }

    fn order(&self) -> Vec<SortKey> {
        self.order.iter().filter_map(Key::sort_key).collect()
    }
}

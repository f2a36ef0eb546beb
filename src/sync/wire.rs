//! What travels between nodes: paths, headers, content types, JSON bodies, and the reader
//! that splits a CBOR sequence into records. `docs/protocol.md` is the specification;
//! this module is its single implementation on both sides.

use std::io::Read;

use serde::{Deserialize, Serialize};

use crate::encoding::{ItemScan, item_len, item_len_within};
use crate::error::Error;
use crate::fact::limits::MAX_FACT_BYTES;

/// The protocol version, also the path prefix (`/v1/...`).
pub const PROTOCOL_VERSION: u32 = 1;
/// The default TCP port of `precedent serve`.
pub const DEFAULT_PORT: u16 = 7341;

/// `GET`: liveness (no token needed).
pub const PATH_HEALTH: &str = "/v1/health";
/// `GET`: count, digest and highest sequence of the released fact set.
pub const PATH_INFO: &str = "/v1/info";
/// `GET`: pull a page of facts; `POST`: push facts.
pub const PATH_FACTS: &str = "/v1/facts";
/// `POST`: fetch facts by hash.
pub const PATH_FETCH: &str = "/v1/fetch";
/// `POST`: a pull whose parameters come in a JSON body ([`PullRequest`]), for a scope
/// with more roots than fit in a URL.
pub const PATH_PULL: &str = "/v1/pull";
/// `GET`: one released fact by its full hash, as JSON or canonical CBOR (the route, with
/// the hash as its one parameter).
pub const PATH_FACT: &str = "/v1/facts/{hash}";
/// `POST`: run a query ([`QueryRequest`]), its results streamed as JSON, a page at a time.
pub const PATH_QUERY: &str = "/v1/query";
/// `GET`: a query's results kept current, as Server-Sent Events.
pub const PATH_WATCH: &str = "/v1/watch";
/// `GET`: the store's figures after each commit that released facts, as Server-Sent
/// Events.
pub const PATH_EVENTS: &str = "/v1/events";
/// `GET`: a fact's neighbourhood in the DAG, as SVG, dot or JSON.
pub const PATH_GRAPH: &str = "/v1/graph/{hash}";
/// The most roots one scoped pull may name.
pub const MAX_ROOTS: usize = 1024;
/// `GET`: metrics in the Prometheus text format.
pub const PATH_METRICS: &str = "/metrics";

/// A CBOR sequence (RFC 8742): canonical fact encodings back to back.
pub const CBOR_SEQ: &str = "application/cbor-seq";
/// JSON bodies: push reports, info, fetch requests and every error; a push of facts in
/// the JSON form, as one array.
pub const JSON: &str = "application/json";
/// A push of facts in the JSON form, one per line (JSON Lines).
pub const JSON_LINES: &str = "application/jsonl";
/// The other name of [`JSON_LINES`] that clients send.
pub const NDJSON: &str = "application/x-ndjson";
/// One fact's canonical encoding (`GET /v1/facts/HASH` with `Accept: application/cbor`).
pub const CBOR: &str = "application/cbor";

/// Pull answer: the server sequence of the last fact in the page (the next bookmark).
pub const HEADER_THROUGH: &str = "precedent-through";
/// Pull and fetch answers: how many records the body holds.
pub const HEADER_COUNT: &str = "precedent-count";
/// Pull answer: the server's highest release sequence when the page was cut.
pub const HEADER_MAX_SEQ: &str = "precedent-max-seq";
/// Pull and push answers: the identity of the server's database (32 hex digits), which
/// changes when the database behind the URL is replaced (`Store::store_id`).
pub const HEADER_STORE: &str = "precedent-store";

/// The body of every error answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    /// A stable code (`unauthorized`, `forbidden`, `too_many_facts`, ...).
    pub error: String,
    /// A sentence for people.
    pub message: String,
}

/// The answer to `GET /v1/info`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Info {
    /// The protocol version the server speaks.
    pub protocol: u32,
    /// Released facts.
    pub count: u64,
    /// XOR of the hashes of all released facts, 64 hex digits.
    pub digest: String,
    /// The highest release sequence the digest covers.
    pub max_seq: i64,
    /// Held facts.
    pub held: u64,
    /// The identity of the served database ([`HEADER_STORE`]); absent from servers
    /// before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// The server's limits, which a client fits its requests to; absent from servers
    /// before they were added (a client then assumes the defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ServerLimits>,
}

/// The limits a server applies to each request, as `GET /v1/info` reports them
/// (`docs/protocol.md`, "Limits").
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServerLimits {
    /// Largest request body, in bytes.
    pub max_body_bytes: u64,
    /// Most records in a push, hashes in a fetch, facts in a pull page.
    pub max_facts_per_request: u64,
    /// Most facts pushed by one peer held on the server at once.
    pub max_held_per_peer: u64,
    /// Longest a request may take before its answer starts, in ms.
    pub request_timeout_ms: u64,
    /// Longest long-poll wait a pull gets, in ms.
    pub max_wait_ms: u64,
    /// Most roots in one scoped pull.
    pub max_roots: u64,
}

/// The body of `POST /v1/pull`: the parameters of `GET /v1/facts`, roots included.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// The bookmark: facts with `seq > after`.
    #[serde(default)]
    pub after: i64,
    /// Most facts in the page (default 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Long-poll wait, in ms.
    #[serde(default)]
    pub wait_ms: u64,
    /// A scoped pull's roots, 64 hex digits each (at most [`MAX_ROOTS`]).
    #[serde(default)]
    pub roots: Vec<String>,
}

/// One record of a push that was refused, with its position in the body.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Rejected {
    /// Zero-based index of the record in the pushed sequence.
    pub index: u64,
    /// Why it was refused (it is in the server's quarantine).
    pub reason: String,
}

/// The answer to a push (`POST /v1/facts`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PushReport {
    /// Records in the body.
    pub received: u64,
    /// New facts released on arrival.
    pub inserted: u64,
    /// Facts the server already had (or given twice).
    pub duplicates: u64,
    /// New facts held for missing ancestors.
    pub held: u64,
    /// Facts released by this push, earlier held ones included.
    pub released: u64,
    /// Records that failed decoding or hashing (quarantined, not stored).
    pub rejected: Vec<Rejected>,
    /// Valid facts refused because the server's held-fact bound is reached.
    pub refused: Vec<String>,
    /// The server database's identity, from the answer's [`HEADER_STORE`] header (not
    /// part of the JSON body).
    #[serde(skip)]
    pub store: Option<String>,
    /// Hashes that held facts on the server wait for and that it does not have at all
    /// (at most 1,000).
    pub missing: Vec<String>,
    /// The server sequence numbers this push gave to facts of its body, as inclusive
    /// `[first, last]` ranges in order: facts the pushing client need not pull back.
    /// Held facts of other peers that the push released are not in them. Absent from
    /// servers before it was added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seqs: Vec<(i64, i64)>,
}

/// The body of `POST /v1/query`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    /// The query in the text syntax (`docs/queries.md`).
    pub query: String,
    /// Each given label of the query bound to a fact's full hash.
    #[serde(default)]
    pub givens: std::collections::BTreeMap<String, String>,
    /// Most results in the answer; absent, every result in one answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u64>,
    /// The `next` of the previous page: results after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// The body of `POST /v1/fetch`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FetchRequest {
    /// The hashes wanted, 64 hex digits each.
    pub hashes: Vec<String>,
}

/// The answer to `GET /v1/health`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Health {
    /// Always `ok` when the server answers.
    pub status: String,
    /// The protocol version.
    pub protocol: u32,
    /// The server's limits, as in [`Info::limits`] (no token is needed to read them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ServerLimits>,
}

/// A record that could not be split off a CBOR sequence: the rest of the stream cannot be
/// framed, so it is reported (and quarantined) as one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FramingError {
    /// Why the bytes cannot start a record.
    pub reason: String,
    /// The input ended inside a record (a cut stream), rather than holding bytes that can
    /// never be a record.
    pub truncated: bool,
    /// The bytes from the broken record to the end of the input (at most 1 MiB kept).
    pub bytes: Vec<u8>,
}

/// Most bytes of an unframeable tail kept for the quarantine.
const MAX_KEPT_TAIL: usize = 1 << 20;

/// Splits a CBOR sequence held in memory into its records. A well-framed record over the
/// size limit of a fact comes back as an `Err` of its own and the split goes on after it.
/// A record that cannot be framed ends the split: it and everything after it come back as
/// one `Err`.
pub fn split_records(buf: &[u8]) -> Vec<Result<&[u8], FramingError>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        match item_len(&buf[pos..]) {
            Ok(Some(n)) => {
                out.push(Ok(&buf[pos..pos + n]));
                pos += n;
            }
            Err(_) if oversize_len(&buf[pos..]).is_some() => {
                let n = oversize_len(&buf[pos..]).unwrap_or(0);
                let reason =
                    format!("record of {n} bytes is over the limit of {MAX_FACT_BYTES} bytes");
                out.push(Err(tail(reason, false, &buf[pos..pos + n])));
                pos += n;
            }
            Ok(None) => {
                out.push(Err(tail(
                    "truncated record at end of body".into(),
                    true,
                    &buf[pos..],
                )));
                break;
            }
            Err(e) => {
                out.push(Err(tail(e.to_string(), false, &buf[pos..])));
                break;
            }
        }
    }
    out
}

/// A stream reader reads at most this much of a record too large for a fact to find its
/// end and skip it; beyond that, the rest of the stream is one bad record.
const MAX_OVERSIZE: usize = 64 << 20;

fn oversize_reason(n: usize) -> String {
    format!("record of {n} bytes is over the limit of {MAX_FACT_BYTES} bytes")
}

/// The length of a well-framed record at the start of `buf` that is over the size limit of
/// a fact, if that is what is there.
fn oversize_len(buf: &[u8]) -> Option<usize> {
    match item_len_within(buf, buf.len()) {
        Ok(Some(n)) if n > MAX_FACT_BYTES => Some(n),
        _ => None,
    }
}

fn tail(reason: String, truncated: bool, bytes: &[u8]) -> FramingError {
    FramingError {
        reason,
        truncated,
        bytes: bytes[..bytes.len().min(MAX_KEPT_TAIL)].to_vec(),
    }
}

/// Reads the records of a CBOR sequence from a stream, one at a time, with memory bounded
/// by the largest record (1 MiB) plus a read buffer; a well-framed record over that size
/// (at most 64 MiB read to find its end) comes back as an `Err` of its own and the reading
/// goes on after it.
pub struct RecordReader<R> {
    inner: R,
    buf: Vec<u8>,
    start: usize,
    eof: bool,
    failed: bool,
    /// The walk over a record too large for a fact, being skipped, with the reason
    /// `item_len` gave.
    skipping: Option<(ItemScan, String)>,
}

impl<R: Read> RecordReader<R> {
    /// A reader over `inner`.
    pub fn new(inner: R) -> RecordReader<R> {
        RecordReader {
            inner,
            buf: Vec::with_capacity(64 * 1024),
            start: 0,
            eof: false,
            failed: false,
            skipping: None,
        }
    }

    /// The next record: `Ok(Some(Ok(bytes)))`, `Ok(Some(Err(..)))` for an unframeable
    /// tail (the last item), `Ok(None)` at the end, `Err` for an I/O error.
    ///
    /// # Errors
    /// [`Error::Io`] when the stream breaks.
    pub fn next_record(&mut self) -> Result<Option<Result<Vec<u8>, FramingError>>, Error> {
        if self.failed {
            return Ok(None);
        }
        loop {
            let pending = &self.buf[self.start..];
            if !pending.is_empty() {
                // A record known to be over a fact's size goes on being walked where the
                // last piece ended (`skipping`), not from its start: a record of 64 MiB
                // read 64 KiB at a time was walked a thousand times, minutes of a
                // server's time for one request.
                let framed = match &self.skipping {
                    Some((_, e)) => Err(e.clone()),
                    None => item_len(pending).map_err(|e| e.to_string()),
                };
                match framed {
                    Ok(Some(n)) => {
                        let rec = pending[..n].to_vec();
                        self.start += n;
                        return Ok(Some(Ok(rec)));
                    }
                    Ok(None) if self.eof => {
                        self.failed = true;
                        let reason = "truncated record at end of stream".to_string();
                        return Ok(Some(Err(tail(reason, true, pending))));
                    }
                    Ok(None) => {}
                    Err(e) => match self
                        .skipping
                        .get_or_insert_with(|| (ItemScan::new(), e.clone()))
                        .0
                        .resume(pending, usize::MAX)
                    {
                        // A well-framed record too large for a fact: one bad record, and
                        // the reader goes on after it, as `split_records` does.
                        Ok(Some(n)) => {
                            self.skipping = None;
                            let reason = oversize_reason(n);
                            let bad = tail(reason, false, &pending[..n]);
                            self.start += n;
                            return Ok(Some(Err(bad)));
                        }
                        Ok(None) if !self.eof && pending.len() < MAX_OVERSIZE => {}
                        _ => {
                            self.skipping = None;
                            self.failed = true;
                            return Ok(Some(Err(tail(e, false, pending))));
                        }
                    },
                }
            } else if self.eof {
                return Ok(None);
            }
            self.fill()?;
        }
    }

    fn fill(&mut self) -> Result<(), Error> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let old = self.buf.len();
        self.buf.resize(old + 64 * 1024, 0);
        let n = loop {
            match self.inner.read(&mut self.buf[old..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(Error::Io(e));
                }
            }
        };
        self.buf.truncate(old + n);
        if n == 0 {
            self.eof = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fact;

    #[test]
    fn splits_and_reads_the_same_records() {
        let a = Fact::builder("A").field("n", 1).build().unwrap();
        let b = Fact::builder("B").field("n", 2).build().unwrap();
        let mut body = a.canonical_bytes().to_vec();
        body.extend_from_slice(b.canonical_bytes());
        body.extend_from_slice(&[0xbf, 0x00]);
        let split = split_records(&body);
        assert_eq!(split.len(), 3);
        assert_eq!(split[0].as_ref().unwrap(), &a.canonical_bytes());
        assert!(split[2].is_err());
        let mut reader = RecordReader::new(&body[..]);
        let mut n = 0;
        while let Some(r) = reader.next_record().unwrap() {
            assert_eq!(r.is_ok(), n < 2);
            n += 1;
        }
        assert_eq!(n, 3);
    }

    #[test]
    fn an_oversize_record_is_skipped_by_both() {
        let a = Fact::builder("A").field("n", 1).build().unwrap();
        let mut huge = vec![0x5a];
        huge.extend_from_slice(&((MAX_FACT_BYTES as u32) + 1).to_be_bytes());
        huge.resize(huge.len() + MAX_FACT_BYTES + 1, 0);
        let body = [a.canonical_bytes(), &huge[..], a.canonical_bytes()].concat();
        let split = split_records(&body);
        assert_eq!(split.len(), 3);
        assert!(
            split[1]
                .as_ref()
                .unwrap_err()
                .reason
                .contains("over the limit")
        );
        assert_eq!(split[2].as_ref().unwrap(), &a.canonical_bytes());
        let mut reader = RecordReader::new(&body[..]);
        let mut oks = 0;
        while let Some(r) = reader.next_record().unwrap() {
            oks += usize::from(r.is_ok());
        }
        assert_eq!(oks, 2);
    }

    /// A reader that gives as much as it is asked for (64 KiB a read) and counts its
    /// reads.
    struct Counted<'a> {
        data: &'a [u8],
        reads: usize,
    }

    impl Read for Counted<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            self.reads += 1;
            let n = out.len().min(self.data.len());
            out[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn an_oversize_record_is_skipped_a_read_at_a_time() {
        // An array of 8,000,000 zeros (8 MiB), past a fact's size, then a fact.
        let a = Fact::builder("A").field("n", 1).build().unwrap();
        let mut body = vec![0x9a, 0x00, 0x7a, 0x12, 0x00];
        body.resize(5 + 8_000_000, 0);
        body.extend_from_slice(a.canonical_bytes());
        let mut reader = RecordReader::new(Counted {
            data: &body,
            reads: 0,
        });
        let bad = reader.next_record().unwrap().unwrap().unwrap_err();
        assert!(bad.reason.contains("over the limit"), "{}", bad.reason);
        let next = reader.next_record().unwrap().unwrap().unwrap();
        assert_eq!(next, a.canonical_bytes());
        assert!(reader.next_record().unwrap().is_none());
        // Read a piece at a time (each walked once: `encoding::ItemScan`).
        assert!(reader.inner.reads > 100, "{} reads", reader.inner.reads);
    }
}

//! The console's other lists, each a keyset page over one index: held facts (by id),
//! peers (by URL), the quarantine (newest first, by id), fact search (newest first by
//! seq, or by hash for a prefix) and a fact's successors (by the edge key).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Serialize;

use super::{Params, RawParams, page};
use crate::args;
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::json::{self, JsonValue};
use crate::store::{ReadTx, SqlExt};
use crate::sync::server::app::{App, Failure};
use crate::sync::server::json_api::full_hash;
use crate::sync::server::routes::bad_request;

/// A fact in a list: its release seq (the cursor) and its JSON form.
#[derive(Serialize)]
struct FactRow {
    #[serde(skip)]
    cursor: String,
    seq: i64,
    /// The role through which it names the fact asked about (successors).
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<String>,
    fact: JsonValue,
}

fn decode(hash: &FactHash, bytes: &[u8]) -> crate::Result<Fact> {
    crate::encoding::decode_fact(bytes, Some(*hash))
}

#[derive(Serialize)]
struct HeldRow {
    #[serde(skip)]
    id: i64,
    held_at_ms: i64,
    /// The predecessors not released yet: what it waits for.
    missing: Vec<String>,
    fact: JsonValue,
}

/// `GET /v1/held`: held facts, oldest first, each with what it waits for.
pub(super) async fn held(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    raw: RawParams,
) -> Result<Response, Failure> {
    let p = Params::read(&app, &headers, raw, &[])?;
    let (after, limit) = (p.after_int(0)?, p.limit);
    let rows = app
        .with_store(move |s| {
            s.read(|r| {
                let rows: Vec<(i64, FactHash, Vec<u8>, i64)> = r.query_vec(
                    "SELECT id, hash, bytes, held_at FROM held WHERE id > ?1 ORDER BY id LIMIT ?2",
                    args![after, limit as i64 + 1],
                    |r| Ok((r.get(0)?, r.hash(1)?, r.get(2)?, r.get(3)?)),
                )?;
                rows.into_iter()
                    .map(|(id, hash, bytes, held_at_ms)| held_row(r, id, &hash, &bytes, held_at_ms))
                    .collect::<crate::Result<Vec<_>>>()
            })
        })
        .await?;
    Ok(page(rows, limit, |h| h.id.to_string()))
}

fn held_row(
    r: &dyn ReadTx,
    id: i64,
    hash: &FactHash,
    bytes: &[u8],
    held_at_ms: i64,
) -> crate::Result<HeldRow> {
    let fact = decode(hash, bytes)?;
    let mut missing = Vec::new();
    for p in fact.predecessor_hashes() {
        if r.seq_of(&p)?.is_none() {
            missing.push(p.to_string());
        }
    }
    Ok(HeldRow {
        id,
        held_at_ms,
        missing,
        fact: json::to_json(&fact),
    })
}

#[derive(Serialize)]
struct PeerRow {
    url: String,
    pull_after: i64,
    push_after: i64,
    remote_seq: i64,
    lag: i64,
    last_sync_ms: Option<i64>,
    last_error: Option<String>,
}

/// `GET /v1/peers`: peers by URL with bookmarks, lag and last error. The cursor is the
/// last URL in hex, so that it needs no escaping.
pub(super) async fn peers(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    raw: RawParams,
) -> Result<Response, Failure> {
    let p = Params::read(&app, &headers, raw, &[])?;
    let after = match &p.after {
        None => String::new(),
        Some(a) => hex::decode(a)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| bad_request(format!("after={a:?} is not a cursor of this list")))?,
    };
    let limit = p.limit;
    let rows = app
        .with_store(move |s| {
            s.read(|r| {
                r.query_vec(
                    "SELECT url, pull_after, push_after, remote_seq, last_sync_ms, last_error
                     FROM sync_peer WHERE url > ?1 ORDER BY url LIMIT ?2",
                    args![&after, limit as i64 + 1],
                    |r| {
                        let (pull_after, remote_seq): (i64, i64) = (r.get(1)?, r.get(3)?);
                        Ok(PeerRow {
                            url: r.get(0)?,
                            pull_after,
                            push_after: r.get(2)?,
                            remote_seq,
                            lag: (remote_seq - pull_after).max(0),
                            last_sync_ms: r.get(4)?,
                            last_error: r.get(5)?,
                        })
                    },
                )
            })
        })
        .await?;
    Ok(page(rows, limit, |p| hex::encode(&p.url)))
}

#[derive(Serialize)]
struct QuarantineRow {
    id: i64,
    peer: String,
    received_ms: i64,
    reason: String,
    bytes: usize,
    /// The first bytes as received, in hex.
    head: String,
}

/// `GET /v1/quarantine`: refused records, newest first.
pub(super) async fn quarantine(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    raw: RawParams,
) -> Result<Response, Failure> {
    let p = Params::read(&app, &headers, raw, &[])?;
    let (before, limit) = (p.after_int(i64::MAX)?, p.limit);
    let rows = app
        .with_store(move |s| {
            s.read(|r| {
                r.query_vec(
                    "SELECT id, peer, received_ms, reason, length(bytes), substr(bytes, 1, 32)
                     FROM sync_quarantine WHERE id < ?1 ORDER BY id DESC LIMIT ?2",
                    args![before, limit as i64 + 1],
                    |r| {
                        Ok(QuarantineRow {
                            id: r.get(0)?,
                            peer: r.get(1)?,
                            received_ms: r.get(2)?,
                            reason: r.get(3)?,
                            bytes: r.get::<i64>(4)? as usize,
                            head: hex::encode(r.get::<Vec<u8>>(5)?),
                        })
                    },
                )
            })
        })
        .await?;
    Ok(page(rows, limit, |q| q.id.to_string()))
}

/// The lowest and highest 32-byte hashes that start with `text` (1 to 64 hex digits).
fn prefix_range(text: &str) -> Result<(Vec<u8>, Vec<u8>), Failure> {
    if text.is_empty() || text.len() > 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad_request(format!(
            "prefix={text:?} is not 1 to 64 hex digits"
        )));
    }
    let pad = |c: char| {
        let mut s = text.to_ascii_lowercase();
        s.extend(std::iter::repeat_n(c, 64 - text.len()));
        hex::decode(s).expect("64 hex digits")
    };
    Ok((pad('0'), pad('f')))
}

/// `GET /v1/find?prefix=HEX&type=T`: released facts whose hash starts with the prefix,
/// by hash (the `fact.hash` index), or of the type, newest first (`fact_by_type`); with
/// neither, the newest facts (the primary key).
pub(super) async fn find(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    raw: RawParams,
) -> Result<Response, Failure> {
    let p = Params::read(&app, &headers, raw, &["prefix", "type"])?;
    let prefix = match p.rest.get("prefix").filter(|s| !s.is_empty()) {
        Some(t) => Some(prefix_range(t)?),
        None => None,
    };
    let type_name = p.rest.get("type").filter(|s| !s.is_empty()).cloned();
    let limit = p.limit;
    let after = match (&prefix, &p.after) {
        (Some((lo, _)), None) => Cursor::Hash(lo.clone(), true),
        (Some(_), Some(a)) => Cursor::Hash(
            full_hash(a)
                .map_err(|_| bad_request(format!("after={a:?} is not a cursor of this list")))?
                .0
                .to_vec(),
            false,
        ),
        (None, _) => Cursor::Seq(p.after_int(i64::MAX)?),
    };
    let rows = app
        .with_store(move |s| {
            s.read(|r| {
                let type_id = match &type_name {
                    Some(t) => match r.name_id(false, t)? {
                        Some(id) => Some(id),
                        None => return Ok(Vec::new()),
                    },
                    None => None,
                };
                find_rows(r, prefix.as_ref().map(|p| &p.1), &after, type_id, limit + 1)
            })
        })
        .await?;
    Ok(page(rows, limit, |f| f.cursor.clone()))
}

/// Where a search page starts: after a seq (newest first), or at or after a hash.
enum Cursor {
    Seq(i64),
    /// The bytes, and whether they are included (the first page of a prefix).
    Hash(Vec<u8>, bool),
}

fn find_rows(
    r: &dyn ReadTx,
    highest: Option<&Vec<u8>>,
    after: &Cursor,
    type_id: Option<i64>,
    n: usize,
) -> crate::Result<Vec<FactRow>> {
    let row = |r: &crate::store::Row<'_>| {
        let (seq, hash, bytes): (i64, FactHash, Vec<u8>) = (r.get(0)?, r.hash(1)?, r.get(2)?);
        Ok((seq, hash, bytes))
    };
    let n = n as i64;
    let rows = match (after, highest, type_id) {
        (Cursor::Hash(from, incl), Some(hi), t) => {
            let op = if *incl { ">=" } else { ">" };
            let typed = if t.is_some() {
                "AND type_id = ?4"
            } else {
                "AND CAST(?4 AS BIGINT) IS NULL"
            };
            r.query_vec(
                &format!(
                    "SELECT seq, hash, bytes FROM fact WHERE hash {op} ?1 AND hash <= ?2 {typed}
                     ORDER BY hash LIMIT ?3"
                ),
                args![from, hi, n, t],
                row,
            )?
        }
        (Cursor::Seq(before), _, Some(t)) => r.query_vec(
            "SELECT seq, hash, bytes FROM fact WHERE type_id = ?1 AND seq < ?2
             ORDER BY seq DESC LIMIT ?3",
            args![t, *before, n],
            row,
        )?,
        (Cursor::Seq(before), _, None) => r.query_vec(
            "SELECT seq, hash, bytes FROM fact WHERE seq < ?1 ORDER BY seq DESC LIMIT ?2",
            args![*before, n],
            row,
        )?,
        (Cursor::Hash(..), None, _) => Vec::new(),
    };
    let by_hash = matches!(after, Cursor::Hash(..));
    rows.into_iter()
        .map(|(seq, hash, bytes)| {
            Ok(FactRow {
                cursor: if by_hash {
                    hash.to_string()
                } else {
                    seq.to_string()
                },
                seq,
                role: None,
                fact: json::to_json(&decode(&hash, &bytes)?),
            })
        })
        .collect()
}

/// `GET /v1/facts/HASH/successors`: the facts that name it, in the edge key's order
/// (role, type, seq); the cursor is those three numbers.
pub(super) async fn successors(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(text): Path<String>,
    raw: RawParams,
) -> Result<Response, Failure> {
    let p = Params::read(&app, &headers, raw, &[])?;
    let hash = full_hash(&text)?;
    let after: (i64, i64, i64) = match &p.after {
        None => (-1, -1, -1),
        Some(a) => {
            let parts: Vec<i64> = a.split('.').filter_map(|x| x.parse().ok()).collect();
            match parts[..] {
                [a, b, c] => (a, b, c),
                _ => {
                    return Err(bad_request(format!(
                        "after={a:?} is not a cursor of this list"
                    )));
                }
            }
        }
    };
    let limit = p.limit;
    let rows = app
        .with_store(move |s| {
            s.read(|r| {
                let Some(seq) = r.seq_of(&hash)? else {
                    return Ok(None);
                };
                let rows: Vec<(i64, i64, i64, String, FactHash, Vec<u8>)> = r.query_vec(
                    "SELECT e.role_id, e.successor_type, e.successor, ro.name, f.hash, f.bytes
                     FROM edge e JOIN role ro ON ro.id = e.role_id JOIN fact f ON f.seq = e.successor
                     WHERE e.predecessor = ?1 AND (e.role_id, e.successor_type, e.successor) > (?2, ?3, ?4)
                     ORDER BY e.role_id, e.successor_type, e.successor LIMIT ?5",
                    args![seq, after.0, after.1, after.2, limit as i64 + 1],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.hash(4)?, r.get(5)?)),
                )?;
                rows.into_iter()
                    .map(|(role_id, ty, seq, role, hash, bytes)| {
                        Ok(FactRow {
                            cursor: format!("{role_id}.{ty}.{seq}"),
                            seq,
                            role: Some(role),
                            fact: json::to_json(&decode(&hash, &bytes)?),
                        })
                    })
                    .collect::<crate::Result<Vec<_>>>()
                    .map(Some)
            })
        })
        .await?;
    let Some(rows) = rows else {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no released fact {hash}"),
        ));
    };
    Ok(page(rows, limit, |f| f.cursor.clone()))
}

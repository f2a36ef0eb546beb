//! The queue endpoints: the overview, each queue's counts and rates, its items by state,
//! and redrive and discard (admin), recorded as facts as `precedent dlq` records them.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};

use super::{Params, RawParams, page};
use crate::error::Error;
use crate::hash::FactHash;
use crate::json::{self, JsonValue};
use crate::queue::{
    Breach, ItemFilter, ItemInfo, ItemState, Minute, QueueSpec, QueueStats, breaches,
};
use crate::store::Store;
use crate::sync::server::app::{App, Failure, Need, authorize};
use crate::sync::server::json_api::full_hash;
use crate::sync::server::routes::{bad_request, json_response, read_body, require_content_type};
use crate::sync::wire;

/// Minutes of rates a queue's page shows.
const RATE_MINUTES: i64 = 60;

/// Runs a queue call on the store; an unknown queue is 404 and a refused operation
/// (an input that is not dead-lettered, say) 409, each naming what was wrong.
async fn queue_call<T: Send + 'static>(
    app: &Arc<App>,
    f: impl FnOnce(&Store) -> crate::Result<T> + Send + 'static,
) -> Result<T, Failure> {
    match app.with_store(move |s| Ok(f(s))).await? {
        Ok(v) => Ok(v),
        Err(Error::UnknownQueue { name }) => Err(Failure::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no queue {name:?}"),
        )),
        Err(Error::Queue { queue, reason }) => Err(Failure::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("queue {queue:?}: {reason}"),
        )),
        Err(e) => Err(e.into()),
    }
}

/// One queue as the overview and the queue list show it.
#[derive(Serialize)]
struct QueueRow {
    name: String,
    input_type: String,
    stats: QueueStats,
    breaches: Vec<Breach>,
}

fn queue_rows(store: &Store, specs: Vec<QueueSpec>) -> crate::Result<Vec<QueueRow>> {
    specs
        .into_iter()
        .map(|spec| {
            let stats = store.queue_stats(&spec.name)?;
            Ok(QueueRow {
                breaches: breaches(&spec, &stats),
                stats,
                input_type: spec.input_type,
                name: spec.name,
            })
        })
        .collect()
}

/// `GET /v1/overview`.
pub(super) async fn overview(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    let v = queue_call(&app, |s| {
        let (facts, max_seq) = s.count_and_max_seq()?;
        let peers: Vec<serde_json::Value> = s
            .peers()?
            .iter()
            .map(|p| serde_json::json!({"url": p.url, "lag": p.lag(), "last_error": p.last_error}))
            .collect();
        let queues = queue_rows(s, s.queues()?)?;
        let breached = queues.iter().filter(|q| !q.breaches.is_empty()).count();
        Ok(serde_json::json!({
            "facts": facts,
            "max_seq": max_seq,
            "held": s.held_count()?,
            "quarantined": s.quarantine_count()?,
            "peers": peers,
            "queues": queues,
            "queues_breached": breached,
        }))
    })
    .await?;
    Ok(json_response(&v))
}

/// `GET /v1/queues`: the declared queues by name, paged by name.
pub(super) async fn list(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    raw: RawParams,
) -> Result<Response, Failure> {
    let p = Params::read(&app, &headers, raw, &[])?;
    let (after, limit) = (p.after.clone().unwrap_or_default(), p.limit);
    // Declarations are few and cached in memory (src/queue/index.rs), by name.
    let rows = queue_call(&app, move |s| {
        let mut specs = s.queues()?;
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        specs.retain(|q| q.name > after);
        specs.truncate(limit + 1);
        queue_rows(s, specs)
    })
    .await?;
    Ok(page(rows, limit, |q| q.name.clone()))
}

/// `GET /v1/queues/NAME`: declaration, counts, breaches and the last hour's rates.
pub(super) async fn one(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    let v = queue_call(&app, move |s| {
        let spec = s.queue(&name)?;
        let now = s.options().clock.now_ms();
        let since = now - (RATE_MINUTES - 1) * 60_000;
        let minutes = fill_minutes(&s.queue_minutes(&name, since)?, since, RATE_MINUTES);
        let stats = s.queue_stats(&name)?;
        Ok(serde_json::json!({
            "name": name,
            "breaches": breaches(&spec, &stats),
            "spec": spec,
            "stats": stats,
            "minutes": minutes,
        }))
    })
    .await?;
    Ok(json_response(&v))
}

/// Every one of `n` minutes from `since_ms`'s, with zeros where nothing happened.
fn fill_minutes(got: &[Minute], since_ms: i64, n: i64) -> Vec<Minute> {
    let first = since_ms.div_euclid(60_000);
    (first..first + n)
        .map(|m| {
            got.iter()
                .find(|g| g.minute == m)
                .copied()
                .unwrap_or(Minute {
                    minute: m,
                    completed: 0,
                    failed: 0,
                })
        })
        .collect()
}

/// One item of a queue with its input fact and, for an entry, when it was made.
#[derive(Serialize)]
struct ItemRow {
    #[serde(skip)]
    seq: i64,
    #[serde(flatten)]
    info: ItemInfo,
    entry_at_ms: Option<JsonValue>,
    fact: Option<JsonValue>,
}

fn filter_of(text: &str) -> Result<ItemFilter, Failure> {
    Ok(match text {
        "ready" => ItemFilter::Ready,
        "backoff" => ItemFilter::Backoff,
        "leased" => ItemFilter::State(ItemState::Leased),
        "blocked" => ItemFilter::State(ItemState::Blocked),
        "dead" => ItemFilter::State(ItemState::Dead),
        "poison" => ItemFilter::State(ItemState::Poison),
        other => {
            return Err(bad_request(format!(
                "state={other:?}: one of ready, backoff, leased, blocked, dead, poison"
            )));
        }
    })
}

/// `GET /v1/queues/NAME/items?state=S`: a page of the queue's inputs in one state.
pub(super) async fn items(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    raw: RawParams,
) -> Result<Response, Failure> {
    let p = Params::read(&app, &headers, raw, &["state"])?;
    let state = p.rest.get("state").map(String::as_str).unwrap_or("dead");
    let filter = filter_of(state)?;
    let (after, limit) = (p.after_int(0)?, p.limit);
    let rows = queue_call(&app, move |s| {
        let items = s.queue_items_page(&name, filter, after, limit + 1)?;
        items
            .into_iter()
            .map(|(seq, info)| item_row(s, seq, info))
            .collect::<crate::Result<Vec<_>>>()
    })
    .await?;
    Ok(page(rows, limit, |r| r.seq.to_string()))
}

fn item_row(s: &Store, seq: i64, info: ItemInfo) -> crate::Result<ItemRow> {
    let entry = match &info.entry {
        Some(h) => s.get(h)?,
        None => None,
    };
    let entry_at_ms = entry
        .as_ref()
        .and_then(|e| e.field("dead_at").or_else(|| e.field("at")))
        .map(json::value_to_json);
    Ok(ItemRow {
        seq,
        fact: s.get(&info.input)?.as_ref().map(json::to_json),
        entry_at_ms,
        info,
    })
}

/// The body of redrive and discard.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryRequest {
    input: String,
    #[serde(default)]
    reason: Option<String>,
}

async fn entry_request(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: Body,
) -> Result<(FactHash, Option<String>), Failure> {
    authorize(app, headers, Need::Admin)?;
    require_content_type(headers, wire::JSON)?;
    let bytes = read_body(app, body).await?;
    let req: EntryRequest = serde_json::from_slice(&bytes).map_err(|e| {
        bad_request(format!(
            "body is not {{\"input\": HASH, \"reason\": TEXT}}: {e}"
        ))
    })?;
    Ok((full_hash(&req.input)?, req.reason))
}

/// The input `hash` names in `queue`, which must be dead-lettered or poison, as the
/// command line's `dlq` and `poison queue` require.
fn entry_input(s: &Store, queue: &str, hash: &FactHash) -> crate::Result<FactHash> {
    match s.queue_item(queue, hash)? {
        Some(i) if matches!(i.state, ItemState::Dead | ItemState::Poison) => Ok(i.input),
        Some(i) => Err(Error::Queue {
            queue: queue.to_string(),
            reason: format!(
                "input {} is not dead-lettered or poison: it is {:?}",
                i.input, i.state
            ),
        }),
        None => Err(Error::Queue {
            queue: queue.to_string(),
            reason: format!("{hash} is not an unfinished input of this queue"),
        }),
    }
}

/// `POST /v1/queues/NAME/redrive` (admin): stores a redrive fact.
pub(super) async fn redrive(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, Failure> {
    let (hash, _) = entry_request(&app, &headers, body).await?;
    let (input, fact) = queue_call(&app, move |s| {
        let input = entry_input(s, &name, &hash)?;
        Ok((input, s.redrive(&name, &input)?))
    })
    .await?;
    Ok(json_response(&serde_json::json!({
        "input": input.to_string(),
        "redrive": fact.to_string(),
    })))
}

/// `POST /v1/queues/NAME/discard` (admin): stores a discard fact with the reason.
pub(super) async fn discard(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, Failure> {
    let (hash, reason) = entry_request(&app, &headers, body).await?;
    let reason = reason
        .filter(|r| !r.trim().is_empty())
        .ok_or_else(|| bad_request("a discard needs a non-empty \"reason\""))?;
    let (input, fact) = queue_call(&app, move |s| {
        let input = entry_input(s, &name, &hash)?;
        Ok((input, s.discard(&name, &input, &reason)?))
    })
    .await?;
    Ok(json_response(&serde_json::json!({
        "input": input.to_string(),
        "discard": fact.to_string(),
    })))
}

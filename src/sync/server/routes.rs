//! The routes: health, info, metrics, pull (paged, long-poll, scoped, streamed), push and
//! fetch; one fact by hash and queries, in JSON (`json_api`, `json_query`); work queues
//! for remote workers (`queues`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::sync::mpsc;

use super::Limits;
use crate::error::{Error, Result};
use crate::hash::FactHash;
use crate::sync::metrics::{Gauges, inc};
use crate::sync::wire::{self, FetchRequest, Health, Info};

use super::app::{App, Failure, Need, authorize, error_response};

pub(super) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route(wire::PATH_HEALTH, get(health))
        .route(wire::PATH_INFO, get(info))
        .route(wire::PATH_FACTS, get(pull).post(super::push::push))
        .route(wire::PATH_FACT, get(super::json_api::get_fact))
        .route(wire::PATH_QUERY, post(super::json_query::query))
        .route(wire::PATH_PULL, post(pull_with_body))
        .route(wire::PATH_FETCH, post(fetch))
        .route(wire::PATH_METRICS, get(metrics))
        .route(
            crate::sync::queue_wire::PATH_QUEUE_ACTION,
            post(super::queues::action),
        )
        .merge(super::console::router())
        .route(wire::PATH_WATCH, get(super::sse::watch))
        .route(wire::PATH_EVENTS, get(super::sse::events))
        .route(wire::PATH_GRAPH, get(super::graph::graph))
        .fallback(|| async { Failure::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// Applies the request timeout and counts error answers.
async fn guard(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let limit = app.limits.request_timeout;
    let response = match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => Failure::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            format!("request took longer than {} s", limit.as_secs_f64()),
        )
        .into_response(),
    };
    let mut response = if response.status() == StatusCode::METHOD_NOT_ALLOWED {
        error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed on this endpoint",
        )
    } else {
        response
    };
    if !response.status().is_success() {
        inc(&app.metrics.errors, 1);
    }
    // No answer is to be read as anything but its declared type: a JSON answer holding
    // `<script>` is not HTML to a browser.
    response.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

async fn health(State(app): State<Arc<App>>) -> Response {
    json_response(&Health {
        status: "ok".into(),
        protocol: wire::PROTOCOL_VERSION,
        limits: Some(server_limits(&app.limits)),
    })
}

/// The limits as `info` and `health` report them.
fn server_limits(l: &Limits) -> wire::ServerLimits {
    wire::ServerLimits {
        max_body_bytes: l.max_body_bytes as u64,
        max_facts_per_request: l.max_facts_per_request,
        max_held_per_peer: l.max_held_per_peer,
        request_timeout_ms: l.request_timeout.as_millis() as u64,
        max_wait_ms: l.long_poll_cap().as_millis() as u64,
        max_roots: wire::MAX_ROOTS as u64,
    }
}

pub(super) fn json_response<T: serde::Serialize>(value: &T) -> Response {
    let body = serde_json::to_vec(value).expect("answer serialises");
    ([(header::CONTENT_TYPE, wire::JSON)], body).into_response()
}

async fn info(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    inc(&app.metrics.requests_info, 1);
    let a = app.clone();
    let (digest, held) = app
        .with_store(move |store| {
            let start = *a.digest.lock().unwrap_or_else(|e| e.into_inner());
            let d = store.digest_since(start)?;
            let mut cached = a.digest.lock().unwrap_or_else(|e| e.into_inner());
            if d.through > cached.through {
                *cached = d;
            }
            Ok((d, store.held_count()?))
        })
        .await?;
    Ok(json_response(&Info {
        protocol: wire::PROTOCOL_VERSION,
        count: digest.count,
        digest: digest.xor_hex(),
        max_seq: digest.through,
        held,
        store: app.store_id.to_str().ok().map(str::to_string),
        limits: Some(server_limits(&app.limits)),
    }))
}

async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    let gauges = app
        .with_store(|store| {
            let (facts, max_seq) = store.count_and_max_seq()?;
            Ok(Gauges {
                facts,
                max_seq,
                held: store.held_count()?,
                quarantined: store.quarantine_count()?,
                sqlite_memory: crate::store::sqlite_memory_used(),
            })
        })
        .await?;
    let text = app.metrics.render(&gauges);
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// A pull's query: `after`, `limit`, `wait_ms` and repeated `root`.
struct PullQuery {
    after: i64,
    limit: u64,
    wait: Duration,
    roots: Vec<FactHash>,
}

pub(super) fn bad_request(message: impl Into<String>) -> Failure {
    Failure::new(StatusCode::BAD_REQUEST, "bad_request", message)
}

fn parse_pull_query(q: Option<&str>, limits: &Limits) -> Result<PullQuery, Failure> {
    let mut out = PullQuery {
        after: 0,
        limit: 10_000.min(limits.max_facts_per_request),
        wait: Duration::ZERO,
        roots: Vec::new(),
    };
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| bad_request(format!("{k}={v:?} is not a whole number")))
        };
        match k {
            "after" => {
                out.after =
                    i64::try_from(num(v)?).map_err(|_| bad_request("after is out of range"))?
            }
            "limit" => out.limit = check_limit(num(v)?, limits)?,
            "wait_ms" => out.wait = Duration::from_millis(num(v)?).min(limits.long_poll_cap()),
            "root" => push_root(&mut out.roots, v)?,
            other => return Err(bad_request(format!("unknown parameter {other:?}"))),
        }
    }
    Ok(out)
}

fn check_limit(n: u64, limits: &Limits) -> Result<u64, Failure> {
    if n == 0 || n > limits.max_facts_per_request {
        return Err(bad_request(format!(
            "limit must be 1 to {}, not {n}",
            limits.max_facts_per_request
        )));
    }
    Ok(n)
}

fn push_root(roots: &mut Vec<FactHash>, v: &str) -> Result<(), Failure> {
    let h = crate::hash::HashPrefix::parse(v)
        .ok()
        .and_then(|p| p.full())
        .ok_or_else(|| bad_request(format!("root={v:?} is not a 64-digit hash")))?;
    if roots.len() >= wire::MAX_ROOTS {
        return Err(bad_request(format!("at most {} roots", wire::MAX_ROOTS)));
    }
    roots.push(h);
    Ok(())
}

/// The parameters of `POST /v1/pull`, checked as a query string's are.
fn parse_pull_body(bytes: &[u8], limits: &Limits) -> Result<PullQuery, Failure> {
    let req: wire::PullRequest = serde_json::from_slice(bytes).map_err(|e| {
        bad_request(format!(
            "pull body is not {{\"after\": N, \"limit\": N, \"wait_ms\": N, \"roots\": [...]}}: {e}"
        ))
    })?;
    let after = if req.after < 0 {
        return Err(bad_request("after is out of range"));
    } else {
        req.after
    };
    let limit = match req.limit {
        Some(n) => check_limit(n, limits)?,
        None => 10_000.min(limits.max_facts_per_request),
    };
    let mut roots = Vec::with_capacity(req.roots.len().min(wire::MAX_ROOTS));
    for r in &req.roots {
        push_root(&mut roots, r)?;
    }
    Ok(PullQuery {
        after,
        limit,
        wait: Duration::from_millis(req.wait_ms).min(limits.long_poll_cap()),
        roots,
    })
}

/// One page of a pull, decided before the body starts.
struct Page {
    count: u64,
    through: i64,
    max_seq: i64,
    /// For a scoped pull, the sequence numbers of the page.
    seqs: Option<Vec<i64>>,
}

async fn pull(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Response, Failure> {
    let caller = authorize(&app, &headers, Need::Read)?;
    let q = parse_pull_query(q.as_deref(), &app.limits)?;
    serve_pull(app, caller, q).await
}

/// `POST /v1/pull`: a pull whose parameters, roots included, come as JSON.
async fn pull_with_body(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    let caller = authorize(&app, &headers, Need::Read)?;
    require_content_type(&headers, wire::JSON)?;
    let bytes = read_body(&app, body).await?;
    let q = parse_pull_body(&bytes, &app.limits)?;
    serve_pull(app, caller, q).await
}

async fn serve_pull(
    app: Arc<App>,
    caller: super::app::Caller,
    q: PullQuery,
) -> Result<Response, Failure> {
    let q = Arc::new(q);
    inc(&app.metrics.requests_pull, 1);
    let deadline = Instant::now() + q.wait;
    let mut shutdown = app.shutdown.clone();
    let page = loop {
        let qq = q.clone();
        let (page, mark) = app
            .with_store(move |store| {
                // Taken before the read: a commit after it wakes the wait below at once.
                let mark = store.wake_mark();
                let max_seq = store.max_seq()?;
                let page = if qq.roots.is_empty() {
                    let (count, through) = store.release_page(qq.after, qq.limit)?;
                    Page {
                        count,
                        through,
                        max_seq,
                        seqs: None,
                    }
                } else {
                    let seqs = store.scope_page(&qq.roots, qq.after, max_seq, qq.limit)?;
                    Page {
                        count: seqs.len() as u64,
                        through: seqs.last().copied().unwrap_or(qq.after.max(0)),
                        max_seq,
                        seqs: Some(seqs),
                    }
                };
                Ok((page, mark))
            })
            .await?;
        // A scoped page that found nothing new has still seen everything up to max_seq.
        let page = match page {
            Page {
                count: 0,
                seqs: Some(s),
                max_seq,
                ..
            } if max_seq > q.after => Page {
                count: 0,
                through: max_seq,
                max_seq,
                seqs: Some(s),
            },
            p => p,
        };
        let now = Instant::now();
        if page.count > 0 || page.max_seq > q.after || now >= deadline || *shutdown.borrow() {
            break page;
        }
        // Woken by a commit through the served store (and, on PostgreSQL, by any
        // process's); bounded by the poll interval for what nothing announces.
        let nap = app.poll.min(deadline - now);
        let a = app.clone();
        let waited = tokio::task::spawn_blocking(move || a.store.wait_for_wake(mark, nap));
        tokio::select! {
            _ = waited => {}
            _ = shutdown.changed() => {}
        }
    };
    app.metrics.note_pull(&caller.name, page.through);
    inc(&app.metrics.facts_sent, page.count);
    let body = stream_page(app.clone(), q.after, &page);
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(wire::CBOR_SEQ),
    );
    h.insert(wire::HEADER_THROUGH, HeaderValue::from(page.through));
    h.insert(wire::HEADER_COUNT, HeaderValue::from(page.count));
    h.insert(wire::HEADER_MAX_SEQ, HeaderValue::from(page.max_seq));
    h.insert(wire::HEADER_STORE, app.store_id.clone());
    Ok(r)
}

/// Streams the page's facts from a blocking thread through a small channel, so memory
/// stays bounded by a few 64 KiB chunks whatever the page size.
fn stream_page(app: Arc<App>, after: i64, page: &Page) -> Body {
    if page.count == 0 {
        return Body::empty();
    }
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(8);
    let through = page.through;
    let seqs = page.seqs.clone();
    let limit = app.limits.request_timeout;
    tokio::task::spawn_blocking(move || {
        let store = &app.store;
        let mut buf = Vec::with_capacity(80 * 1024);
        let mut send = |bytes: &[u8]| -> Result<()> {
            buf.extend_from_slice(bytes);
            if buf.len() >= 64 * 1024 {
                let chunk = Bytes::from(std::mem::replace(&mut buf, Vec::with_capacity(80 * 1024)));
                if !send_within(&tx, Ok(chunk), limit) {
                    return Err(Error::Io(std::io::ErrorKind::BrokenPipe.into()));
                }
            }
            Ok(())
        };
        let result = match &seqs {
            None => store.for_each_in_range(after, through, |_, _, b| send(b)),
            Some(s) => store.for_each_at(s, |_, _, b| send(b)),
        };
        match result {
            Ok(()) => {
                if !buf.is_empty() {
                    send_within(&tx, Ok(Bytes::from(buf)), limit);
                }
            }
            Err(e) => {
                send_within(&tx, Err(std::io::Error::other(e.to_string())), limit);
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Body::from_stream(stream)
}

/// Sends `item` from a blocking thread of the runtime, waiting at most `limit` for room;
/// `false` when the receiver is gone or did not take anything for that long. A client
/// that stops reading a streamed answer gives back the thread, and the store read it
/// holds, after `limit` (the request timeout), rather than never: a few such clients
/// would otherwise hold every store thread of the server.
pub(super) fn send_within<T>(tx: &mpsc::Sender<T>, item: T, limit: Duration) -> bool {
    match tx.try_send(item) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Closed(_)) => false,
        Err(mpsc::error::TrySendError::Full(item)) => tokio::runtime::Handle::current()
            .block_on(tokio::time::timeout(limit, tx.send(item)))
            .is_ok_and(|sent| sent.is_ok()),
    }
}

/// Reads a request body, refusing one over the limit.
pub(super) async fn read_body(app: &App, body: Body) -> Result<Bytes, Failure> {
    let max = app.limits.max_body_bytes;
    match http_body_util::Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(Failure::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("request body is over the limit of {max} bytes"),
            ))
        }
        Err(e) => Err(bad_request(format!("cannot read request body: {e}"))),
    }
}

pub(super) fn require_content_type(headers: &HeaderMap, want: &str) -> Result<(), Failure> {
    let given = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let base = given.split(';').next().unwrap_or("").trim();
    if base.eq_ignore_ascii_case(want) {
        Ok(())
    } else {
        Err(Failure::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("content-type must be {want}, not {given:?}"),
        ))
    }
}

pub(super) fn too_many(n: u64, max: u64, what: &str) -> Failure {
    Failure::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_many_facts",
        format!("{n} {what} in one request; the limit is {max}"),
    )
}

async fn fetch(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    require_content_type(&headers, wire::JSON)?;
    inc(&app.metrics.requests_fetch, 1);
    let bytes = read_body(&app, body).await?;
    let req: FetchRequest = serde_json::from_slice(&bytes)
        .map_err(|e| bad_request(format!("fetch body is not {{\"hashes\": [...]}}: {e}")))?;
    let max = app.limits.max_facts_per_request;
    if req.hashes.len() as u64 > max {
        return Err(too_many(req.hashes.len() as u64, max, "hashes"));
    }
    let mut hashes = Vec::with_capacity(req.hashes.len());
    for h in &req.hashes {
        let parsed = crate::hash::HashPrefix::parse(h)
            .ok()
            .and_then(|p| p.full())
            .ok_or_else(|| bad_request(format!("{h:?} is not a 64-digit hash")))?;
        hashes.push(parsed);
    }
    let found = app.with_store(move |s| s.fetch_bytes(&hashes)).await?;
    inc(&app.metrics.facts_sent, found.len() as u64);
    let mut out = Vec::new();
    for (_, b) in &found {
        out.extend_from_slice(b);
    }
    let mut r = Response::new(Body::from(out));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(wire::CBOR_SEQ),
    );
    r.headers_mut()
        .insert(wire::HEADER_COUNT, HeaderValue::from(found.len()));
    Ok(r)
}

//! Server-Sent Events: `GET /v1/watch`, a query's results kept current, and
//! `GET /v1/events`, the store's figures after each commit that released facts
//! (`docs/protocol.md`, "Server-Sent Events").
//!
//! A watch client has a thread of its own, as [`crate::query::Watch::spawn`] does: it
//! runs the query once (the snapshot, sent as `added` events, then `ready`), then polls
//! at each wake-up of the store ([`Store::wait_for_wake`]: a commit through this server
//! and, on PostgreSQL, a commit from any process on the database, by `LISTEN`/`NOTIFY`)
//! and at least every poll interval (another process's write to a SQLite file). Its
//! events go through a channel of [`WATCH_BUFFER`]; the response body takes them as fast
//! as the client reads. A client that reads nothing for [`super::Limits::sse_stall`]
//! while the channel is full is disconnected: its thread ends and the body is cut, so a
//! client that stops reading costs at most the channel, the socket buffers and a while,
//! never memory that grows with what is written.
//!
//! The figures of `/v1/events` are read by one thread for every client, and only while
//! some client listens: at each wake-up it reads the highest release number, and when it
//! moved, the count (the previous count plus the facts after the previous number, an
//! index range) and the held count, and publishes them in a `tokio::sync::watch`. A
//! client keeps only the latest figures, so it is coalesced by construction: after each
//! event it waits [`EVENTS_GAP`] before it looks again, and then sends the figures of
//! that moment.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::app::{App, Failure, Need, authorize};
use super::json_query::{bind_givens, check_given_types, failure};
use super::routes::bad_request;
use crate::error::Error;
use crate::query::{Change, Givens, Query, Stop};
use crate::store::Store;

/// How often a quiet stream sends `: keep-alive`.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Events of a watch waiting for its client to read them.
pub(super) const WATCH_BUFFER: usize = 256;
/// The least time between two `change` events to one client.
const EVENTS_GAP: Duration = Duration::from_millis(100);

/// The figures of a `change` event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub(super) struct Figures {
    /// The highest release number.
    seq: i64,
    /// Released facts.
    facts: u64,
    /// Facts held for missing ancestors.
    held: u64,
}

/// The figures every `/v1/events` client reads, kept by one thread ([`Events::start`]).
pub(super) struct Events {
    latest: Arc<watch::Sender<Figures>>,
}

impl Events {
    /// Starts the thread that reads the figures while some client listens, waking at
    /// each wake-up of `store` and at least every `poll`, until `shutdown`.
    pub(super) fn start(
        store: Arc<Store>,
        poll: Duration,
        shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<Events> {
        let latest = Arc::new(watch::Sender::new(Figures::default()));
        let tx = latest.clone();
        std::thread::Builder::new()
            .name("precedent-events".into())
            .spawn(move || {
                let mut last: Option<Figures> = None;
                while !*shutdown.borrow() {
                    let mark = store.wake_mark();
                    if tx.receiver_count() == 0 {
                        last = None;
                    } else {
                        match read_figures(&store, last) {
                            Ok(f) => {
                                if last.is_none_or(|l| l.seq != f.seq) {
                                    tx.send_replace(f);
                                }
                                last = Some(f);
                            }
                            Err(e) => tracing::warn!("events: cannot read the figures: {e}"),
                        }
                    }
                    store.wait_for_wake(mark, poll);
                }
            })?;
        Ok(Events { latest })
    }
}

/// The figures now, counting from `last` when there is one.
fn read_figures(store: &Store, last: Option<Figures>) -> crate::Result<Figures> {
    let seq = store.max_seq()?;
    let facts = match last {
        Some(l) if l.seq == seq => return Ok(l),
        Some(l) => {
            let (n, _) = store.release_page(l.seq, i64::MAX as u64)?;
            l.facts + n
        }
        None => store.count_and_max_seq()?.0,
    };
    Ok(Figures {
        seq,
        facts,
        held: store.held_count()?,
    })
}

/// `GET /v1/events`.
pub(super) async fn events(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    // Subscribed before the figures are read: a commit after that read moves the
    // figures past it and is announced; one before it is not news to this client.
    let mut rx = app.events.latest.subscribe();
    rx.mark_unchanged();
    let seen = app.with_store(|s| s.max_seq()).await?;
    let client = EventsClient {
        rx,
        seen,
        sent: false,
        shutdown: app.shutdown.clone(),
    };
    let stream = futures_util::stream::unfold(client, |mut c| async move {
        let f = c.next().await?;
        let event = Event::default()
            .event("change")
            .json_data(f)
            .expect("figures serialise");
        Some((Ok::<_, Infallible>(event), c))
    });
    Ok(sse(stream))
}

/// One `/v1/events` client: the figures it has seen, and whether it must wait
/// [`EVENTS_GAP`] before the next event.
struct EventsClient {
    rx: watch::Receiver<Figures>,
    seen: i64,
    sent: bool,
    shutdown: watch::Receiver<bool>,
}

impl EventsClient {
    /// The next figures past what this client has seen; `None` at shutdown.
    async fn next(&mut self) -> Option<Figures> {
        if std::mem::take(&mut self.sent) {
            tokio::time::sleep(EVENTS_GAP).await;
        }
        loop {
            if *self.shutdown.borrow() {
                return None;
            }
            tokio::select! {
                changed = self.rx.changed() => changed.ok()?,
                _ = self.shutdown.changed() => return None,
            }
            let f = *self.rx.borrow_and_update();
            if f.seq > self.seen {
                self.seen = f.seq;
                self.sent = true;
                return Some(f);
            }
        }
    }
}

/// What a watch thread hands to its response body.
enum Msg {
    Event(Event),
    Fail(Failure),
}

/// `GET /v1/watch?query=TEXT&NAME=HASH...`.
pub(super) async fn watch(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    let (query, givens) = parse_watch(uri.query())?;
    let (tx, rx) = mpsc::channel::<Msg>(WATCH_BUFFER);
    let stop = Arc::new(AtomicBool::new(false));
    let stalled = Arc::new(AtomicBool::new(false));
    let job = WatchJob {
        store: app.store.clone(),
        query,
        givens,
        tx,
        stop: stop.clone(),
        stalled: stalled.clone(),
        stall: app.limits.sse_stall,
        poll: app.poll,
        rt: tokio::runtime::Handle::current(),
    };
    std::thread::Builder::new()
        .name("precedent-sse-watch".into())
        .spawn(move || job.run())
        .map_err(|e| Failure::internal(format!("cannot start a watch: {e}")))?;
    // Made first, so that the thread is stopped however this request ends.
    let mut body = WatchBody {
        rx,
        stop,
        stalled,
        shutdown: app.shutdown.clone(),
    };
    // The first event decides the status: an error before it is an error answer.
    let first = match body.rx.recv().await {
        Some(Msg::Event(e)) => e,
        Some(Msg::Fail(f)) => return Err(f),
        None => return Err(Failure::internal("the watch stopped at once".into())),
    };
    let rest = futures_util::stream::unfold(body, |mut b| async move {
        let item = b.next().await?;
        Some((item, b))
    });
    let stream = futures_util::stream::once(async move { Ok(first) }).chain(rest);
    Ok(sse(stream))
}

/// A response of Server-Sent Events with the keep-alive comment.
fn sse<S, E>(stream: S) -> Response
where
    S: futures_util::Stream<Item = Result<Event, E>> + Send + 'static,
    E: Into<axum::BoxError>,
{
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
        .into_response()
}

/// Reads `query=TEXT` and the givens `NAME=HASH` from a query string: 400 naming what is
/// wrong (a query text that does not parse names its line and column).
fn parse_watch(raw: Option<&str>) -> Result<(Query, Givens), Failure> {
    let pairs: Vec<(String, String)> = match raw {
        None => Vec::new(),
        Some(q) => {
            axum::extract::Query::<Vec<(String, String)>>::try_from_uri(
                &format!("/?{q}")
                    .parse::<Uri>()
                    .map_err(|e| bad_request(e.to_string()))?,
            )
            .map_err(|e| bad_request(format!("cannot read the query string: {e}")))?
            .0
        }
    };
    let mut text = None;
    let mut named = BTreeMap::new();
    for (k, v) in pairs {
        let slot = if k == "query" {
            text.replace(v).is_some()
        } else {
            named.insert(k.clone(), v).is_some()
        };
        if slot {
            return Err(bad_request(format!("parameter {k} is given twice")));
        }
    }
    let text = text.ok_or_else(|| {
        bad_request("parameter query is missing: GET /v1/watch?query=TEXT&NAME=HASH")
    })?;
    let query = Query::parse(&text).map_err(failure)?;
    let givens = bind_givens(&query, &named, |l| format!("{l}=HASH to the URL"))?;
    Ok((query, givens))
}

/// A watch's thread: the snapshot, `ready`, then each change.
struct WatchJob {
    store: Arc<Store>,
    query: Query,
    givens: Givens,
    tx: mpsc::Sender<Msg>,
    stop: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
    stall: Duration,
    poll: Duration,
    rt: tokio::runtime::Handle,
}

impl WatchJob {
    fn run(self) {
        if let Err(e) = check_given_types(&self.store, &self.query, &self.givens) {
            self.send(Msg::Fail(failure(e)));
            return;
        }
        let started = self.store.watch_each(&self.query, &self.givens, |row| {
            if self.send(row_event("added", &row.value)) {
                Ok(())
            } else {
                Err(Error::Io(std::io::ErrorKind::BrokenPipe.into()))
            }
        });
        let mut watch = match started {
            Ok(w) => w,
            Err(e) => {
                self.send(Msg::Fail(failure(e)));
                return;
            }
        };
        watch.interval = self.poll;
        if !self.send(Msg::Event(Event::default().event("ready").data("{}"))) {
            return;
        }
        for change in watch.changes(&self.store, Stop::when(self.stop.clone())) {
            let msg = match change {
                Ok(Change::Added(r)) => row_event("added", &r.value),
                Ok(Change::Removed(r)) => row_event("removed", &r.value),
                Ok(Change::Updated(r)) => row_event("updated", &r.value),
                Err(e) => {
                    tracing::warn!("watch: {e}");
                    Msg::Fail(Failure::from(e))
                }
            };
            if !self.send(msg) {
                return;
            }
        }
    }

    /// Hands `msg` to the body; `false` when the client is gone or has read nothing for
    /// the stall limit while the channel was full (then it is marked stalled).
    fn send(&self, msg: Msg) -> bool {
        let msg = match self.tx.try_send(msg) {
            Ok(()) => return true,
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
            Err(mpsc::error::TrySendError::Full(m)) => m,
        };
        // The timer is made inside the runtime: this thread is not one of its own.
        let sent = self
            .rt
            .block_on(async { tokio::time::timeout(self.stall, self.tx.send(msg)).await });
        match sent {
            Ok(r) => r.is_ok(),
            Err(_) => {
                tracing::warn!(
                    "watch: client read nothing for {:?} with {WATCH_BUFFER} events waiting; disconnected",
                    self.stall
                );
                self.stalled.store(true, Ordering::Release);
                false
            }
        }
    }
}

fn row_event(kind: &'static str, value: &crate::query::Projected) -> Msg {
    let data = serde_json::to_string(&value.to_json()).expect("a result serialises");
    Msg::Event(Event::default().event(kind).data(data))
}

/// The body's end of a watch: stops the thread when dropped; cut (an error, so the
/// connection closes without a clean end) when the thread failed or gave up on a stalled
/// client.
struct WatchBody {
    rx: mpsc::Receiver<Msg>,
    stop: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
    shutdown: watch::Receiver<bool>,
}

impl WatchBody {
    async fn next(&mut self) -> Option<Result<Event, std::io::Error>> {
        if *self.shutdown.borrow() {
            return None;
        }
        let msg = tokio::select! {
            m = self.rx.recv() => m,
            _ = self.shutdown.changed() => return None,
        };
        match msg {
            Some(Msg::Event(e)) => Some(Ok(e)),
            Some(Msg::Fail(f)) => Some(Err(std::io::Error::other(f.message))),
            None if self.stalled.swap(false, Ordering::AcqRel) => {
                Some(Err(std::io::Error::other("client too slow: disconnected")))
            }
            None => None,
        }
    }
}

impl Drop for WatchBody {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

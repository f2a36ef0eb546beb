//! Server-Sent Events: `GET /v1/watch`, a query's results kept current, and
//! `GET /v1/events`, the store's figures after each commit that released facts
//! (`docs/protocol.md`, "Server-Sent Events").
//!
//! A watch client joins the shared watch of its query text and givens
//! ([`super::fanout`]): one thread per distinct query runs it once (the snapshot), then
//! polls at each wake-up of the store ([`Store::wait_for_wake`]: a commit through this
//! server and, on PostgreSQL, a commit from any process on the database, by
//! `LISTEN`/`NOTIFY`) and at least every poll interval (another process's write to a
//! SQLite file), no sooner after the last poll than [`super::fanout`]'s least gap (50 ms
//! for one client, longer with more). The changes of a poll are built once into the
//! bytes of their events (an event per run of changes of one kind, holding the array of
//! their results) and queued for every client, whose body writes those bytes as they are;
//! a client joining later takes its snapshot from the shared results. A client that reads
//! nothing for [`super::Limits::sse_stall`] while [`WATCH_BUFFER`] results or more wait
//! for it is disconnected, and so is one more than [`super::fanout::QUEUE_LIMIT`] results
//! behind: its queue is dropped and the body is
//! cut, so a client that stops reading costs at most a bounded queue of pointers to shared
//! events, the socket buffers and a while, never memory that grows with what is written.
//!
//! The figures of `/v1/events` are read by one thread for every client, and only while
//! some client listens (with none, it waits for one to subscribe, not for the store's
//! wake-ups, so that a server no client watches opens no listener on PostgreSQL): at
//! each wake-up it reads the highest release number, and when it
//! moved, the count (the previous count plus the facts after the previous number, an
//! index range) and the held count, and publishes them in a `tokio::sync::watch`. A
//! client keeps only the latest figures, so it is coalesced by construction: after each
//! event it waits [`EVENTS_GAP`] before it looks again, and then sends the figures of
//! that moment.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Uri, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;
use tokio::sync::watch;

use super::app::{App, Failure, Need, authorize};
use super::fanout::{Client, Setup};
use super::json_query::{bind_givens, failure};
use super::routes::bad_request;
use crate::query::{Givens, Query};
use crate::store::Store;

/// How often a quiet stream sends `: keep-alive`.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Results of a watch waiting for its client to read them, past which a client that
/// reads nothing for the stall limit is cut.
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
    /// Set by a client as it subscribes, to wake the thread from its sleep without
    /// clients ([`Arrival::wait`]).
    arrival: Arc<Arrival>,
    /// The thread, joined by [`Events::join`] once the server stops.
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Events {
    /// Starts the thread that reads the figures while some client listens, waking at
    /// each wake-up of `store` and at least every `poll`, until `shutdown`. While no
    /// client listens it waits for one (at most `poll` at a time, to see `shutdown`),
    /// not for the store's wake-ups: on PostgreSQL a wait for those starts the store's
    /// listener, and a server with no client of its own would hold that connection and
    /// be woken by every commit on the database.
    pub(super) fn start(
        store: Arc<Store>,
        poll: Duration,
        shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<Events> {
        let latest = Arc::new(watch::Sender::new(Figures::default()));
        let arrival = Arc::new(Arrival::default());
        let (tx, arrived) = (latest.clone(), arrival.clone());
        let thread = std::thread::Builder::new()
            .name("precedent-events".into())
            .spawn(move || {
                let mut last: Option<Figures> = None;
                while !*shutdown.borrow() {
                    if tx.receiver_count() == 0 {
                        last = None;
                        arrived.wait(poll);
                        continue;
                    }
                    let mark = store.wake_mark();
                    match read_figures(&store, last) {
                        Ok(f) => {
                            if last.is_none_or(|l| l.seq != f.seq) {
                                tx.send_replace(f);
                            }
                            last = Some(f);
                        }
                        Err(e) => tracing::warn!("events: cannot read the figures: {e}"),
                    }
                    store.wait_for_wake(mark, poll);
                }
            })?;
        Ok(Events {
            latest,
            arrival,
            thread: std::sync::Mutex::new(Some(thread)),
        })
    }

    /// Waits for the thread to end (within one `poll` of `shutdown`), and so for its
    /// handle of the store to close: a server that returned from `run` no longer has the
    /// database open.
    pub(super) fn join(&self) {
        // A thread with no client waits for one: told now, it sees the shutdown at once.
        self.arrival.tell();
        let thread = self.thread.lock().map(|mut t| t.take());
        if let Ok(Some(t)) = thread {
            let _ = t.join();
        }
    }
}

/// That a `/v1/events` client subscribed: a flag under a mutex with a condition
/// variable, so that one arriving between the thread's look at the clients and its wait
/// is not slept through.
#[derive(Default)]
struct Arrival {
    came: std::sync::Mutex<bool>,
    cond: std::sync::Condvar,
}

impl Arrival {
    /// Tells the thread a client subscribed.
    fn tell(&self) {
        *self.came.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cond.notify_one();
    }

    /// Waits until a client subscribed since the last wait, or `timeout` passed.
    fn wait(&self, timeout: Duration) {
        let came = self.came.lock().unwrap_or_else(|e| e.into_inner());
        let (mut came, _) = self
            .cond
            .wait_timeout_while(came, timeout, |came| !*came)
            .unwrap_or_else(|e| e.into_inner());
        *came = false;
    }
}

/// The figures now, counting from `last` when there is one. The count and the seq it runs
/// to come from one statement: facts committed between two reads would otherwise be
/// counted now and again next time, and the count would drift above the store's.
fn read_figures(store: &Store, last: Option<Figures>) -> crate::Result<Figures> {
    let (facts, seq) = match last {
        Some(l) if l.seq == store.max_seq()? => return Ok(l),
        Some(l) => {
            let (n, upto) = store.release_page(l.seq, i64::MAX as u64)?;
            (l.facts + n, upto)
        }
        None => store.count_and_max_seq()?,
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
    app.events.arrival.tell();
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

/// `GET /v1/watch?query=TEXT&NAME=HASH...`: joins the shared watch of the query
/// ([`super::fanout`]).
pub(super) async fn watch(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    let (key, query, givens) = parse_watch(uri.query())?;
    let setup = Setup {
        store: app.store.clone(),
        poll: app.poll,
        stall: app.limits.sse_stall,
        shutdown: app.shutdown.clone(),
    };
    let joining = app.clone();
    let client =
        tokio::task::spawn_blocking(move || joining.watches.join(&setup, key, &query, &givens))
            .await
            .map_err(|e| Failure::internal(format!("worker failed: {e}")))??;
    let body = WatchBody {
        client,
        shutdown: app.shutdown.clone(),
    };
    let stream = futures_util::stream::unfold(body, |mut b| async move {
        let item = b.next().await?;
        Some((item, b))
    });
    // The events' bytes are built once for every client: written as they are, not through
    // axum's `Sse` (which would format each event again for each client).
    let mut r = Body::from_stream(stream).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(r)
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
fn parse_watch(raw: Option<&str>) -> Result<(String, Query, Givens), Failure> {
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
    // The shared watch's key: the text as given and the givens in name order.
    let key = format!("{text}\0{:?}", givens.iter().collect::<BTreeMap<_, _>>());
    Ok((key, query, givens))
}

/// The body's end of a watch: leaves the shared watch when dropped; cut (an error, so
/// the connection closes without a clean end) when the watch failed or gave up on a
/// stalled client.
struct WatchBody {
    client: Arc<Client>,
    shutdown: watch::Receiver<bool>,
}

impl WatchBody {
    /// The next bytes to send: an event, or the keep-alive comment after [`KEEP_ALIVE`]
    /// without one.
    async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if *self.shutdown.borrow() {
            return None;
        }
        let got = tokio::select! {
            m = tokio::time::timeout(KEEP_ALIVE, self.client.next()) => match m {
                Ok(m) => m?,
                Err(_) => return Some(Ok(Bytes::from_static(b": keep-alive\n\n"))),
            },
            _ = self.shutdown.changed() => return None,
        };
        Some(match got {
            Ok(item) => Ok(item.bytes),
            Err(why) => Err(std::io::Error::other(why)),
        })
    }
}

impl Drop for WatchBody {
    fn drop(&mut self) {
        self.client.leave();
    }
}

//! One shared watch per distinct query of `GET /v1/watch` (its text and givens): the
//! query is polled once per wake-up of the store whatever the number of its clients, and
//! each change is serialised once and handed to every client as shared text.
//!
//! A shared watch has a thread of its own. It waits for a wake-up ([`Store::wait_for_wake`])
//! or the poll interval, lets at least [`LEAST_GAP`] pass since its last poll (so a burst of
//! commits costs one poll), polls in one read transaction, and appends the events to each
//! client's queue. A client that joins takes its snapshot from the shared watch's current
//! results, under the same lock as the polls: it gets `added` for each, `ready`, then
//! every change after that point, as a client of its own watch would.
//!
//! A client's queue holds pointers to shared events. A client whose queue holds
//! [`WATCH_BUFFER`] events or more and that has read nothing for the stall limit is cut:
//! its queue is dropped and its body ends with an error. A queue never holds more than
//! [`QUEUE_LIMIT`] events: a client so far behind is cut at once. The shared watch ends
//! when its last client leaves.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

use super::app::Failure;
use super::json_query::{check_given_types, failure};
use super::sse::WATCH_BUFFER;
use crate::query::{Change, Givens, Query, Watch};
use crate::store::Store;

/// The least time between two polls of a shared watch.
const LEAST_GAP: Duration = Duration::from_millis(50);
/// The most events a client's queue holds before the client is cut.
pub(super) const QUEUE_LIMIT: usize = 64 * WATCH_BUFFER;

/// An event, serialised once for every client: its name and its data.
pub(super) type Item = Arc<(&'static str, String)>;

/// The shared watches, by query text and givens.
#[derive(Default)]
pub(super) struct Watches {
    map: Arc<Mutex<HashMap<String, Arc<Shared>>>>,
}

struct Shared {
    state: Mutex<State>,
}

struct State {
    watch: Watch,
    clients: Vec<Arc<Client>>,
    /// Set when the thread has left: a client joining then starts a new shared watch.
    ended: bool,
}

/// One client's queue, shared by the thread that fills it and the body that empties it.
pub(super) struct Client {
    queue: Mutex<VecDeque<Item>>,
    notify: Notify,
    /// Milliseconds since `born` at the client's last read.
    last_read: AtomicU64,
    born: Instant,
    /// Set by the body when it is dropped.
    gone: AtomicBool,
    /// Set by the thread when the shared watch ended without a failure.
    closed: AtomicBool,
    /// Set by the thread when it cut the client: the message the body ends with.
    cut: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn item(kind: &'static str, row: &crate::query::QueryRow) -> Item {
    let data = serde_json::to_string(&row.value.to_json()).expect("a result serialises");
    Arc::new((kind, data))
}

impl Client {
    fn new() -> Client {
        Client {
            queue: Mutex::new(VecDeque::new()),
            notify: Notify::new(),
            last_read: AtomicU64::new(0),
            born: Instant::now(),
            gone: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            cut: Mutex::new(None),
        }
    }

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// Appends `items`; `false` when the client is gone or was cut now (too far behind, or
    /// full and silent for `stall`).
    fn push(&self, items: &[Item], stall: Duration) -> bool {
        if self.gone.load(Ordering::Acquire) {
            return false;
        }
        let mut q = lock(&self.queue);
        let silent = self
            .now_ms()
            .saturating_sub(self.last_read.load(Ordering::Acquire));
        let why = if q.len() >= WATCH_BUFFER && silent > stall.as_millis() as u64 {
            Some(format!(
                "client read nothing for {stall:?} with {} events waiting",
                q.len()
            ))
        } else if q.len() + items.len() > QUEUE_LIMIT {
            Some(format!("client more than {QUEUE_LIMIT} events behind"))
        } else {
            None
        };
        if let Some(why) = why {
            tracing::warn!("watch: {why}; disconnected");
            q.clear();
            drop(q);
            self.fail(why);
            return false;
        }
        q.extend(items.iter().cloned());
        drop(q);
        self.notify.notify_one();
        true
    }

    /// Ends the client's body with the error `why`.
    fn fail(&self, why: String) {
        lock(&self.cut).get_or_insert(why);
        self.gone.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    /// Ends the client's body cleanly (the server shuts down).
    fn leave_clean(&self) {
        self.closed.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    /// The next event; `Err` with why the client was cut; `None` at a clean end.
    pub(super) async fn next(&self) -> Option<Result<Item, String>> {
        loop {
            let notified = self.notify.notified();
            if let Some(why) = lock(&self.cut).clone() {
                return Some(Err(why));
            }
            if let Some(i) = lock(&self.queue).pop_front() {
                self.last_read.store(self.now_ms(), Ordering::Release);
                return Some(Ok(i));
            }
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            notified.await;
        }
    }

    /// Called by the body when it is dropped: the thread forgets the client.
    pub(super) fn leave(&self) {
        self.gone.store(true, Ordering::Release);
        lock(&self.queue).clear();
    }
}

/// What a shared watch's thread needs.
#[derive(Clone)]
pub(super) struct Setup {
    pub store: Arc<Store>,
    pub poll: Duration,
    pub stall: Duration,
    pub shutdown: watch::Receiver<bool>,
}

impl Watches {
    /// Joins the shared watch of `key` (starting it, from `query` and `givens`, when there
    /// is none): the client's queue holds the snapshot as `added` events, then `ready`.
    /// Blocks (store reads).
    pub(super) fn join(
        &self,
        setup: &Setup,
        key: String,
        query: &Query,
        givens: &Givens,
    ) -> Result<Arc<Client>, Failure> {
        let client = Arc::new(Client::new());
        let mut map = lock(&self.map);
        if let Some(shared) = map.get(&key) {
            let mut st = lock(&shared.state);
            if !st.ended {
                // Brought up to date first, so the snapshot is the results of now.
                let changes = st.watch.poll(&setup.store).map_err(failure)?;
                offer(&mut st, &changes, setup.stall);
                let mut items: Vec<Item> = st
                    .watch
                    .results()
                    .into_iter()
                    .map(|r| item("added", r))
                    .collect();
                items.push(ready());
                lock(&client.queue).extend(items);
                st.clients.push(client.clone());
                return Ok(client);
            }
        }
        // A new shared watch: the first client's snapshot is read as the watch starts.
        check_given_types(&setup.store, query, givens).map_err(failure)?;
        let mut items = Vec::new();
        let mut watch = setup
            .store
            .watch_each(query, givens, |row| {
                items.push(item("added", row));
                Ok(())
            })
            .map_err(failure)?;
        watch.interval = setup.poll;
        items.push(ready());
        lock(&client.queue).extend(items);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                watch,
                clients: vec![client.clone()],
                ended: false,
            }),
        });
        map.insert(key.clone(), shared.clone());
        drop(map);
        let run = Runner {
            map: self.map.clone(),
            shared,
            key,
            setup: setup.clone(),
        };
        let (map, key) = (run.map.clone(), run.key.clone());
        if let Err(e) = std::thread::Builder::new()
            .name("precedent-sse-watch".into())
            .spawn(move || run.run())
        {
            lock(&map).remove(&key);
            return Err(Failure::internal(format!("cannot start a watch: {e}")));
        }
        Ok(client)
    }
}

/// Serialises `changes` once and offers them to each client (none on a quiet wake-up:
/// that still cuts a client full and silent for the stall limit).
fn offer(st: &mut State, changes: &[Change], stall: Duration) {
    let items: Vec<Item> = changes
        .iter()
        .map(|c| match c {
            Change::Added(r) => item("added", r),
            Change::Removed(r) => item("removed", r),
            Change::Updated(r) => item("updated", r),
        })
        .collect();
    st.clients.retain(|c| c.push(&items, stall));
}

fn ready() -> Item {
    Arc::new(("ready", "{}".to_string()))
}

/// A shared watch's thread.
struct Runner {
    map: Arc<Mutex<HashMap<String, Arc<Shared>>>>,
    shared: Arc<Shared>,
    key: String,
    setup: Setup,
}

impl Runner {
    fn run(self) {
        let Setup {
            store,
            poll,
            stall,
            shutdown,
        } = &self.setup;
        let mut last = Instant::now();
        loop {
            let mark = store.wake_mark();
            store.wait_for_wake(mark, *poll);
            if let Some(rest) = LEAST_GAP.checked_sub(last.elapsed()) {
                std::thread::sleep(rest);
            }
            last = Instant::now();
            if *shutdown.borrow() {
                self.end(None);
                return;
            }
            let mut st = lock(&self.shared.state);
            let changes = match st.watch.poll(store) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("watch: {e}");
                    drop(st);
                    self.end(Some(Failure::from(e).message));
                    return;
                }
            };
            offer(&mut st, &changes, *stall);
            if st.clients.is_empty() {
                drop(st);
                if self.end_if_alone() {
                    return;
                }
            }
        }
    }

    /// Ends the shared watch when no client joined meanwhile; `true` when it ended.
    fn end_if_alone(&self) -> bool {
        let mut map = lock(&self.map);
        let mut st = lock(&self.shared.state);
        if !st.clients.is_empty() {
            return false;
        }
        st.ended = true;
        map.remove(&self.key);
        true
    }

    /// Ends the shared watch now, cutting its clients with `why` (ending them cleanly
    /// without).
    fn end(&self, why: Option<String>) {
        let mut map = lock(&self.map);
        let mut st = lock(&self.shared.state);
        st.ended = true;
        map.remove(&self.key);
        for c in st.clients.drain(..) {
            match &why {
                Some(w) => c.fail(w.clone()),
                None => c.leave_clean(),
            }
        }
    }
}

//! One shared watch per distinct query of `GET /v1/watch` (its text and givens): the
//! query is polled once per wake-up of the store whatever the number of its clients, and
//! the changes of a poll are built once into the bytes of their events (one event per run
//! of changes of one kind, an array of results) and handed to every client as shared
//! bytes: no client does any work per result.
//!
//! A shared watch has a thread of its own. It waits for a wake-up ([`Store::wait_for_wake`])
//! or the poll interval, lets at least [`least_gap`] pass since its last poll (so a burst
//! of commits costs one poll: 50 ms for one client, 2 ms more for each further one, at most
//! 250 ms), polls in one read transaction, and appends the events to each client's queue. A client that joins takes its snapshot from the shared watch's current
//! results, under the same lock as the polls: it gets `added` for each, `ready`, then
//! every change after that point, as a client of its own watch would. A watch whose
//! results can only be added ([`Watch::appends_only`]: no `exists`, no `limit`, no child
//! collection) keeps none of them in memory ([`Watch::forget_results`]), so a feed that
//! grows for days costs the server nothing per result; a client joining it reads its
//! snapshot from the store at the watch's position ([`Watch::snapshot`]).
//!
//! A client's queue holds pointers to shared events. A client whose queue holds
//! [`WATCH_BUFFER`] results or more and that has read nothing for the stall limit is cut:
//! its queue is dropped and its body ends with an error. A queue never holds more than
//! [`QUEUE_LIMIT`] results after the client's snapshot (which holds the results as they
//! were when it joined, however many): a client so far behind is cut at once. The shared watch ends
//! when its last client leaves.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{Notify, watch};

use super::app::Failure;
use super::json_query::failure;
use super::sse::WATCH_BUFFER;
use crate::query::{Change, Givens, Query, QueryRow, Watch};
use crate::store::Store;

/// The least time between two polls of a shared watch of one client.
const LEAST_GAP: Duration = Duration::from_millis(50);
/// What each further client adds to that least time: every poll that finds changes wakes
/// and writes to each client, on the threads that also serve the writers' requests, so
/// the more clients share a watch, the more commits one poll should cover.
const GAP_PER_CLIENT: Duration = Duration::from_millis(2);
/// The most time between two polls of a busy shared watch, whatever its clients: the
/// delay a change may wait before it is sent.
const MOST_GAP: Duration = Duration::from_millis(250);

/// The least time between two polls of a shared watch of `clients` clients.
fn least_gap(clients: usize) -> Duration {
    let more = u32::try_from(clients.saturating_sub(1)).unwrap_or(u32::MAX);
    LEAST_GAP
        .saturating_add(GAP_PER_CLIENT.saturating_mul(more))
        .min(MOST_GAP)
}
/// The most results a client's queue holds before the client is cut.
pub(super) const QUEUE_LIMIT: usize = 64 * WATCH_BUFFER;
/// An event's data grows to about this many bytes, then the next result starts a new
/// event (so a large snapshot is sent as several events, none much larger than this).
const EVENT_BYTES: usize = 64 * 1024;

/// An event, built once for every client: its bytes as sent (`event:`, `data:` and the
/// blank line) and the number of results it holds.
#[derive(Clone)]
pub(super) struct Item {
    pub bytes: Bytes,
    rows: usize,
}

/// A client's events, and the results they hold.
#[derive(Default)]
struct Queue {
    items: VecDeque<Item>,
    rows: usize,
    /// Of `rows`, those of the client's snapshot not read yet (the queue's first ones):
    /// the snapshot may be as large as the results are, and the limit on how far a
    /// client falls behind counts what came after it.
    snapshot: usize,
}

impl Queue {
    fn extend(&mut self, items: &[Item]) {
        self.rows += items.iter().map(|i| i.rows).sum::<usize>();
        self.items.extend(items.iter().cloned());
    }

    /// A joining client's snapshot, queued before anything else.
    fn snapshot(&mut self, items: &[Item]) {
        self.extend(items);
        self.snapshot = self.rows;
    }

    /// The front item, taken by the client's body.
    fn pop(&mut self) -> Option<Item> {
        let i = self.items.pop_front()?;
        self.rows -= i.rows;
        self.snapshot = self.snapshot.saturating_sub(i.rows);
        Some(i)
    }

    /// Results queued after the snapshot.
    fn behind(&self) -> usize {
        self.rows - self.snapshot
    }

    fn clear(&mut self) {
        self.items.clear();
        self.rows = 0;
        self.snapshot = 0;
    }
}

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
    queue: Mutex<Queue>,
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

/// Builds events from changes in their order: one event per run of changes of one kind,
/// its data the array of their results; a new event when the data has reached
/// [`EVENT_BYTES`].
#[derive(Default)]
struct Builder {
    out: Vec<Item>,
    open: Option<(&'static str, Vec<u8>, usize)>,
}

impl Builder {
    fn push(&mut self, kind: &'static str, row: &QueryRow) {
        let fits = self
            .open
            .as_ref()
            .is_some_and(|(k, buf, _)| *k == kind && buf.len() < EVENT_BYTES);
        if !fits {
            self.close();
        }
        let (_, buf, rows) = self.open.get_or_insert_with(|| {
            let mut buf = Vec::with_capacity(256);
            buf.extend_from_slice(format!("event: {kind}\ndata: [").as_bytes());
            (kind, buf, 0)
        });
        if *rows > 0 {
            buf.push(b',');
        }
        // Compact JSON: no line break, so the array is one `data:` line.
        serde_json::to_writer(&mut *buf, &row.value.to_json()).expect("a result serialises");
        *rows += 1;
    }

    fn close(&mut self) {
        if let Some((_, mut buf, rows)) = self.open.take() {
            buf.extend_from_slice(b"]\n\n");
            self.out.push(Item {
                bytes: Bytes::from(buf),
                rows,
            });
        }
    }

    fn finish(mut self) -> Vec<Item> {
        self.close();
        self.out
    }
}

impl Client {
    fn new() -> Client {
        Client {
            queue: Mutex::new(Queue::default()),
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
    /// full and silent for `stall`). Counts results, not events.
    fn push(&self, items: &[Item], stall: Duration) -> bool {
        if self.gone.load(Ordering::Acquire) {
            return false;
        }
        let mut q = lock(&self.queue);
        let silent = self
            .now_ms()
            .saturating_sub(self.last_read.load(Ordering::Acquire));
        let new: usize = items.iter().map(|i| i.rows).sum();
        let why = if q.rows >= WATCH_BUFFER && silent > stall.as_millis() as u64 {
            Some(format!(
                "client read nothing for {stall:?} with {} results waiting",
                q.rows
            ))
        } else if new > 0 && q.behind() + new > QUEUE_LIMIT {
            Some(format!("client more than {QUEUE_LIMIT} results behind"))
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
        q.extend(items);
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
            let popped = lock(&self.queue).pop();
            if let Some(i) = popped {
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
                let mut b = Builder::default();
                st.watch
                    .snapshot(&setup.store, |r| {
                        b.push("added", r);
                        Ok(())
                    })
                    .map_err(failure)?;
                let mut items = b.finish();
                items.push(ready());
                lock(&client.queue).snapshot(&items);
                st.clients.push(client.clone());
                return Ok(client);
            }
        }
        // A new shared watch: the first client's snapshot is read as the watch starts.
        setup
            .store
            .read(|tx| crate::query::check_given_types(tx, query, givens))
            .map_err(failure)?;
        let mut b = Builder::default();
        let mut watch = setup
            .store
            .watch_each(query, givens, |row| {
                b.push("added", row);
                Ok(())
            })
            .map_err(failure)?;
        watch.interval = setup.poll;
        // A watch whose results only grow keeps none of them: its memory stays flat
        // however many it reports, and a client that joins later reads its snapshot.
        watch.forget_results();
        let mut items = b.finish();
        items.push(ready());
        lock(&client.queue).snapshot(&items);
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

/// Builds the events of `changes` once and offers them to each client (none on a quiet
/// wake-up: that still cuts a client full and silent for the stall limit).
fn offer(st: &mut State, changes: &[Change], stall: Duration) {
    let mut b = Builder::default();
    for c in changes {
        match c {
            Change::Added(r) => b.push("added", r),
            Change::Removed(r) => b.push("removed", r),
            Change::Updated(r) => b.push("updated", r),
        }
    }
    let items = b.finish();
    st.clients.retain(|c| c.push(&items, stall));
}

fn ready() -> Item {
    Item {
        bytes: Bytes::from_static(b"event: ready\ndata: {}\n\n"),
        rows: 0,
    }
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
        let mut mark = store.wake_mark();
        loop {
            store.wait_for_wake(mark, *poll);
            let clients = lock(&self.shared.state).clients.len();
            if let Some(rest) = least_gap(clients).checked_sub(last.elapsed()) {
                std::thread::sleep(rest);
            }
            last = Instant::now();
            if *shutdown.borrow() {
                self.end(None);
                return;
            }
            // Taken before the poll, as every waiter takes it: a commit after the poll's
            // snapshot wakes the next wait at once, not a poll interval later.
            mark = store.wake_mark();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_gap_grows_with_the_clients_up_to_its_cap() {
        assert_eq!(least_gap(0), LEAST_GAP);
        assert_eq!(least_gap(1), LEAST_GAP);
        assert_eq!(least_gap(2), Duration::from_millis(52));
        assert_eq!(least_gap(51), Duration::from_millis(150));
        assert_eq!(least_gap(100), Duration::from_millis(248));
        assert_eq!(least_gap(101), MOST_GAP);
        assert_eq!(least_gap(1000), MOST_GAP);
        assert_eq!(least_gap(usize::MAX), MOST_GAP);
    }
}

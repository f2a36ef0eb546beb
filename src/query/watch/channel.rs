//! Delivering a watch's changes to another thread, or to async code.
//!
//! [`Watch::spawn`] moves the watch to a thread of its own, which polls at each wake-up
//! of the store and at least every [`Watch::interval`] (through [`Watch::changes`]) and
//! sends each change into a channel;
//! the [`WatchHandle`] is the receiving end. [`Watch::into_stream`] does the same for async
//! code: the thread sends into a tokio channel and the [`WatchStream`] is a
//! `futures_util::Stream`, so no database call runs on the runtime's worker threads.
//!
//! Why a thread of its own rather than tokio's blocking pool: a watch lives as long as its
//! consumer, while the pool is meant for short calls (and a runtime waits for its blocking
//! tasks when it shuts down).
//!
//! Why a flag beside the channel: a std receiver that is dropped tells its sender nothing
//! until a send fails, and a watch whose query sees no new facts never sends. So the
//! receiving end sets a flag when it is stopped or dropped, and the thread checks it before
//! each poll and every 50 ms while it waits ([`Stop::when`]): it ends within that plus one
//! poll.
//!
//! The channel holds at most [`CHANNEL_CAPACITY`] changes. A consumer that falls behind holds the
//! thread back, not memory: the facts wait in the database, and the next poll takes them
//! all at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{Change, Stop, Watch};
use crate::error::Result;
use crate::store::Store;

/// How many changes a channel holds before the watch thread waits for its consumer.
pub const CHANNEL_CAPACITY: usize = 1024;

/// Starts the thread that polls `watch` on `store` and hands each change to `send`, until
/// `stop` is set or `send` says the receiving end is gone (returns `false`). An error is
/// handed over like a change and ends the thread, which then hands the watch to `end`.
fn start<T: Send + 'static>(
    mut watch: Watch,
    store: Arc<Store>,
    stop: Arc<AtomicBool>,
    mut send: impl FnMut(Result<Change>) -> bool + Send + 'static,
    end: impl FnOnce(Watch) -> T + Send + 'static,
) -> Result<JoinHandle<T>> {
    let thread = std::thread::Builder::new()
        .name("precedent-watch".into())
        .spawn(move || {
            for change in watch.changes(&store, Stop::when(stop)) {
                if !send(change) {
                    break;
                }
            }
            // The store goes before `end` runs: whoever waits for the watch may count on
            // the thread's share of the store being given back.
            drop(store);
            end(watch)
        })?;
    Ok(thread)
}

/// The receiving end of a watch running on a thread of its own ([`Watch::spawn`]).
///
/// Each change arrives once, in the order [`Watch::poll`] finds them. An error from a poll
/// arrives as an `Err` item, and the thread ends after it. Stopping or dropping the handle
/// ends the thread: [`WatchHandle::stop`] gives the watch back, a drop waits for the thread
/// (at most 50 ms plus one poll).
#[must_use = "a watch handle delivers nothing unless it is read"]
pub struct WatchHandle {
    // An `Option` so that stopping can close the channel before it joins the thread: a
    // thread blocked on a full channel then wakes up with a failed send.
    changes: Option<Receiver<Result<Change>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Watch>>,
}

impl std::fmt::Debug for WatchHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchHandle")
            .field("stopped", &self.stop.load(Ordering::Acquire))
            .field("finished", &self.is_finished())
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// Moves the watch to a thread of its own that polls `store` at each of its wake-ups
    /// and at least every [`Watch::interval`], and sends each change to the returned
    /// handle. The current
    /// results stay in [`Watch::results`] (read them before, or get the watch back with
    /// [`WatchHandle::stop`]); the handle brings what changes after them, also facts that
    /// other threads or processes write to the same file.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use precedent::{Fact, Store};
    /// use precedent::query::Change;
    ///
    /// let store = Arc::new(Store::open_in_memory()?);
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// store.insert(&shop)?;
    /// let watch = store
    ///     .prepare("given s: Shop match o: Shop.Order where o->shop = s select o.id")?
    ///     .given("s", &shop)?
    ///     .watch()?;
    /// let orders = watch.spawn(store.clone())?;
    ///
    /// store.insert(&Fact::builder("Shop.Order").field("id", 7).predecessor("shop", shop.hash()).build()?)?;
    /// let change = orders.recv_timeout(Duration::from_secs(5)).expect("a change")?;
    /// assert!(matches!(change, Change::Added(row) if row.value.to_json() == 7));
    /// assert_eq!(orders.stop().results().len(), 1);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::Io`] if the thread cannot be started. Errors of later polls arrive
    /// through the handle.
    pub fn spawn(self, store: Arc<Store>) -> Result<WatchHandle> {
        let (tx, rx) = mpsc::sync_channel(CHANNEL_CAPACITY);
        let stop = Arc::new(AtomicBool::new(false));
        let send = move |c| tx.send(c).is_ok();
        let thread = start(self, store, stop.clone(), send, |watch| watch)?;
        Ok(WatchHandle {
            changes: Some(rx),
            stop,
            thread: Some(thread),
        })
    }
}

impl WatchHandle {
    fn receiver(&self) -> &Receiver<Result<Change>> {
        self.changes.as_ref().expect("present until stopped")
    }

    /// Waits for the next change. `None` once the thread has ended (after an error).
    pub fn recv(&self) -> Option<Result<Change>> {
        self.receiver().recv().ok()
    }

    /// Waits at most `timeout` for the next change.
    ///
    /// # Errors
    /// [`RecvTimeoutError::Timeout`] if none came in time, [`RecvTimeoutError::Disconnected`]
    /// once the thread has ended (after an error).
    pub fn recv_timeout(
        &self,
        timeout: Duration,
    ) -> std::result::Result<Result<Change>, RecvTimeoutError> {
        self.receiver().recv_timeout(timeout)
    }

    /// The next change if one is waiting.
    ///
    /// # Errors
    /// [`TryRecvError::Empty`] if none is, [`TryRecvError::Disconnected`] once the thread
    /// has ended.
    pub fn try_recv(&self) -> std::result::Result<Result<Change>, TryRecvError> {
        self.receiver().try_recv()
    }

    /// The changes as they come, blocking for each; the iteration ends when the thread
    /// does.
    pub fn iter(&self) -> mpsc::Iter<'_, Result<Change>> {
        self.receiver().iter()
    }

    /// Whether the thread has ended (after an error, or once stopped).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Ends the thread and gives the watch back, its results current up to the last poll.
    /// Changes sent but not received are dropped (the results count them).
    ///
    /// # Panics
    /// If the thread panicked, with its panic.
    pub fn stop(mut self) -> Watch {
        match self.finish() {
            Some(Ok(watch)) => watch,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => unreachable!("finished only once, by stop or drop"),
        }
    }

    fn finish(&mut self) -> Option<std::thread::Result<Watch>> {
        self.stop.store(true, Ordering::Release);
        drop(self.changes.take());
        self.thread.take().map(JoinHandle::join)
    }
}

impl<'h> IntoIterator for &'h WatchHandle {
    type Item = Result<Change>;
    type IntoIter = mpsc::Iter<'h, Result<Change>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        // A panic of the thread is dropped with it: re-raising it here could abort.
        let _ = self.finish();
    }
}

#[cfg(feature = "server")]
pub use stream::WatchStream;

#[cfg(feature = "server")]
mod stream {
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Poll};

    use futures_util::Stream;
    use tokio::sync::{mpsc, oneshot};

    use super::{CHANNEL_CAPACITY, start};
    use crate::error::Result;
    use crate::query::watch::{Change, Watch};
    use crate::store::Store;

    /// A watch's changes as an async stream ([`Watch::into_stream`]): the watch polls on a
    /// thread of its own, and the stream yields each change it finds.
    ///
    /// An error from a poll is yielded as an `Err` item, and the stream ends after it.
    /// Dropping the stream ends the thread within 50 ms plus one poll,
    /// without waiting for it; [`WatchStream::stop`] waits and gives the watch back.
    #[must_use = "streams do nothing unless polled"]
    pub struct WatchStream {
        changes: mpsc::Receiver<Result<Change>>,
        stop: Arc<AtomicBool>,
        watch: oneshot::Receiver<Watch>,
    }

    impl std::fmt::Debug for WatchStream {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("WatchStream")
                .field("stopped", &self.stop.load(Ordering::Acquire))
                .finish_non_exhaustive()
        }
    }

    impl Watch {
        /// Moves the watch to a thread of its own that polls `store` at each of its
        /// wake-ups and at least every [`Watch::interval`], and returns the changes as an
        /// async stream. Database calls
        /// stay on that thread, so awaiting the stream never blocks the runtime; it may be
        /// called outside a runtime too.
        ///
        /// ```
        /// use std::sync::Arc;
        /// use futures_util::StreamExt;
        /// use precedent::{Fact, Store};
        /// use precedent::query::Change;
        ///
        /// let store = Arc::new(Store::open_in_memory()?);
        /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
        /// store.insert(&shop)?;
        /// let mut orders = store
        ///     .prepare("given s: Shop match o: Shop.Order where o->shop = s select o.id")?
        ///     .given("s", &shop)?
        ///     .watch()?
        ///     .into_stream(store.clone())?;
        ///
        /// store.insert(&Fact::builder("Shop.Order").field("id", 7).predecessor("shop", shop.hash()).build()?)?;
        /// let runtime = tokio::runtime::Runtime::new()?;
        /// let change = runtime.block_on(orders.next()).expect("a change")?;
        /// assert!(matches!(change, Change::Added(row) if row.value.to_json() == 7));
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        ///
        /// # Errors
        /// [`crate::Error::Io`] if the thread cannot be started. Errors of later polls
        /// are items of the stream.
        pub fn into_stream(self, store: Arc<Store>) -> Result<WatchStream> {
            let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
            let (watch_tx, watch_rx) = oneshot::channel();
            let stop = Arc::new(AtomicBool::new(false));
            // NOTE: blocking_send panics on a runtime's thread; this one is ours.
            let send = move |c| tx.blocking_send(c).is_ok();
            // The watch comes back through a oneshot, since joining the thread would block
            // the runtime; the thread is left detached.
            let end = move |watch| {
                let _ = watch_tx.send(watch);
            };
            start(self, store, stop.clone(), send, end)?;
            Ok(WatchStream {
                changes: rx,
                stop,
                watch: watch_rx,
            })
        }
    }

    impl WatchStream {
        /// Ends the thread and gives the watch back, its results current up to the last
        /// poll. Changes sent but not yet taken from the stream are dropped (the results
        /// count them).
        ///
        /// # Panics
        /// If the watch thread panicked.
        pub async fn stop(mut self) -> Watch {
            self.stop.store(true, Ordering::Release);
            // A thread waiting for room in the channel wakes up with a failed send.
            self.changes.close();
            (&mut self.watch).await.expect("the watch thread panicked")
        }
    }

    impl Stream for WatchStream {
        type Item = Result<Change>;

        fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.get_mut().changes.poll_recv(cx)
        }
    }

    impl Drop for WatchStream {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Release);
        }
    }
}

//! The listener: one thread per open store, started by the first wait for a wake-up,
//! with a connection of its own that `LISTEN`s on [`CHANNEL`] and wakes the store's
//! waiters for each notification.
//!
//! Every write transaction that released facts calls `pg_notify(CHANNEL, last seq)`
//! before its `COMMIT` (`write.rs`): PostgreSQL delivers it at the commit, in commit
//! order, to every session listening on that database, on any host. A transaction that
//! rolls back sends nothing.
//!
//! The thread reads notifications with a timeout of [`SLICE`], so that it sees within
//! that time that the store is closing. When its connection is lost (a server restart,
//! `pg_terminate_backend`) it connects again after a pause that doubles from
//! [`MIN_BACKOFF`] up to [`MAX_BACKOFF`], and once listening again wakes every waiter:
//! what was committed while it was away is found by the read that follows. Meanwhile the
//! waiters read again each time their own poll interval passes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use postgres::Client;
use postgres::fallible_iterator::FallibleIterator as _;

use crate::store::wake::{CHANNEL, Wake};

/// How long the thread blocks for a notification before it checks whether to stop.
const SLICE: Duration = Duration::from_millis(100);
/// The first pause before connecting again.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// The longest pause between two attempts to connect.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A running listener; dropping it stops the thread and waits for it (at most about one
/// [`SLICE`], or one attempt to connect).
pub(crate) struct Listener {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Starts the thread, which connects with `connect` (the store's own way: its URL,
    /// its TLS) and bumps `wake` for each notification.
    pub(crate) fn start(
        connect: impl Fn() -> Result<Client, String> + Send + 'static,
        wake: Arc<Wake>,
    ) -> std::io::Result<Listener> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("precedent-listen".into())
            .spawn(move || run(&connect, &wake, &flag))?;
        Ok(Listener {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connects, listens and reads notifications until `stop`; connects again after each
/// loss.
fn run(connect: &dyn Fn() -> Result<Client, String>, wake: &Wake, stop: &AtomicBool) {
    let mut backoff = MIN_BACKOFF;
    while !stop.load(Ordering::Acquire) {
        let listening = connect().and_then(|mut c| {
            c.batch_execute(&format!("LISTEN {CHANNEL}"))
                .map(|()| c)
                .map_err(|e| e.to_string())
        });
        // A failed attempt has nobody to tell: the waiters poll meanwhile, and the next
        // attempt follows the pause.
        if let Ok(mut client) = listening {
            backoff = MIN_BACKOFF;
            // Listening from now on: a read now finds whatever was committed before.
            wake.wake_all();
            listen(&mut client, wake, stop);
        }
        pause(backoff, stop);
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Reads notifications until the connection is lost or `stop`; one wake-up for all the
/// notifications that arrived together.
fn listen(client: &mut Client, wake: &Wake, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let mut notes = client.notifications();
        let first = notes.timeout_iter(SLICE).next();
        match first {
            Ok(Some(_)) => {
                while let Ok(Some(_)) = notes.iter().next() {}
                wake.wake_all();
            }
            Ok(None) => {}
            Err(_) => return,
        }
        drop(notes);
        // A connection that ended without an error reads as a timeout.
        if client.is_closed() {
            return;
        }
    }
}

/// Sleeps `d`, in slices, returning early on `stop`.
fn pause(d: Duration, stop: &AtomicBool) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(SLICE));
    }
}

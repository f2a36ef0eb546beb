//! Wake-ups: how a thread waiting for new facts (a watch, a long-poll) learns that some
//! may have been released, instead of polling on a timer alone.
//!
//! A [`Store`](super::Store) keeps one [`Wake`], a counter of wake-ups under a mutex with
//! a condition variable. It is bumped
//! - by every write transaction of that `Store` that commits (in this process, at once),
//!   but a claim that found nothing to hand out and wrote nothing (`Store::claim`): a
//!   waiter that claims and then waits would otherwise be woken by its own claim;
//! - on PostgreSQL, by the store's listener: a thread with a connection of its own that
//!   `LISTEN`s on [`CHANNEL`] and bumps the counter for each notification, which every
//!   write transaction that released facts sends (`pg_notify`) before its commit, from
//!   any process on any host; and once after the listener (re)connects, so that a waiter
//!   polls for what was committed while it was away.
//!
//! A waiter takes a [`Wake::mark`] *before* it reads, then waits for a bump after that
//! mark ([`Wake::wait`]): a commit between its read and its wait bumps the counter past
//! the mark, so the wait returns at once and nothing committed is slept through. A
//! wake-up says only "read again": it may find nothing new (a commit that released no
//! fact, a notification for what was read already).
//!
//! Nothing wakes a waiter for a write by another process on SQLite, nor while the
//! PostgreSQL listener is down: waiters bound each wait by their poll interval and read
//! again when it passes, as they did before wake-ups existed.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The PostgreSQL notification channel released facts are announced on. `LISTEN` and
/// `NOTIFY` are per database, so one name serves every store.
pub const CHANNEL: &str = "precedent_released";

/// The wake-ups of one store's waiters (see the module docs).
#[derive(Debug, Default)]
pub struct Wake {
    count: Mutex<u64>,
    bumped: Condvar,
}

/// A point in a store's wake-ups, taken before a read, to wait for the next one after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct WakeMark(u64);

impl Wake {
    /// The wake-ups so far: take it before reading, then [`Wake::wait`] for a later one.
    pub fn mark(&self) -> WakeMark {
        WakeMark(*self.lock())
    }

    /// Wakes every waiter: something may have been released.
    pub fn wake_all(&self) {
        *self.lock() += 1;
        self.bumped.notify_all();
    }

    /// Waits until a wake-up after `mark` or until `timeout` has passed, whichever comes
    /// first; `true` for a wake-up (also one that came before the call).
    pub fn wait(&self, mark: WakeMark, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut count = self.lock();
        while *count == mark.0 {
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return false;
            }
            count = self
                .bumped
                .wait_timeout(count, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.count.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_wake_after_the_mark_ends_the_wait_and_none_lets_it_time_out() {
        let wake = Arc::new(Wake::default());
        let mark = wake.mark();
        assert!(!wake.wait(mark, Duration::from_millis(10)));
        // A wake-up between the mark and the wait is not slept through.
        wake.wake_all();
        assert!(wake.wait(mark, Duration::from_secs(3600)));
        let mark = wake.mark();
        let other = wake.clone();
        let t = std::thread::spawn(move || other.wait(mark, Duration::from_secs(3600)));
        std::thread::sleep(Duration::from_millis(20));
        wake.wake_all();
        assert!(t.join().unwrap());
    }
}

//! Delivering a watch's changes one at a time: an iterator that polls as [`Watch::wait`]
//! does (at each wake-up of the store, at least every [`Watch::interval`]), and a
//! callback form over it, both until a [`Stop`] says so.
//!
//! Both borrow the store for as long as they deliver, so the thread that delivers does not
//! write meanwhile: facts come from other threads' or processes' connections to the same
//! file, from sync, or from writes between two deliveries.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{Change, Watch};
use crate::error::Result;
use crate::store::{Store, WakeMark};

/// How often a delivery waiting for a wake-up looks at its [`Stop`]'s flag.
const FLAG_CHECK: Duration = Duration::from_millis(50);

/// When a delivery of changes ends: never, at a deadline, once a flag is set, or at
/// whichever comes first. It is checked before each poll, and the delivery ends after a
/// poll that finds nothing once it is reached: every change released before then is
/// delivered, and a flag set meanwhile is seen within 50 ms (or one [`Watch::interval`],
/// if shorter), however long the interval.
#[derive(Clone, Debug, Default)]
pub struct Stop {
    deadline: Option<Instant>,
    flag: Option<Arc<AtomicBool>>,
}

impl Stop {
    /// Never: the delivery goes on until the consumer stops taking changes.
    pub fn never() -> Stop {
        Stop::default()
    }

    /// After `timeout` from now.
    pub fn after(timeout: Duration) -> Stop {
        Stop::at(Instant::now() + timeout)
    }

    /// At `deadline`.
    pub fn at(deadline: Instant) -> Stop {
        Stop {
            deadline: Some(deadline),
            flag: None,
        }
    }

    /// Once `flag` is true (set it from another thread, or a signal handler).
    pub fn when(flag: Arc<AtomicBool>) -> Stop {
        Stop::never().or_when(flag)
    }

    /// As this, or once `flag` is true, whichever comes first.
    pub fn or_when(self, flag: Arc<AtomicBool>) -> Stop {
        Stop {
            flag: Some(flag),
            ..self
        }
    }

    fn reached(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
            || self
                .flag
                .as_ref()
                .is_some_and(|f| f.load(Ordering::Acquire))
    }

    /// Waits before the next poll for a wake-up of `store` after `mark`, at most the
    /// interval (less to end on time), looking at the flag every [`FLAG_CHECK`].
    fn nap(&self, store: &Store, mark: WakeMark, interval: Duration) {
        let now = Instant::now();
        let mut left = match self.deadline {
            Some(d) => interval.min(d.saturating_duration_since(now)),
            None => interval,
        };
        let until = now.checked_add(left);
        while !left.is_zero() {
            let slice = match self.flag {
                Some(_) => left.min(FLAG_CHECK),
                None => left,
            };
            if store.wait_for_wake(mark, slice) || self.reached() {
                return;
            }
            left = until.map_or(left, |u| u.saturating_duration_since(Instant::now()));
        }
    }
}

/// The changes of a watch, one at a time, as they are released ([`Watch::changes`]).
///
/// Each call to `next` returns a change found by an earlier poll, or polls (at each
/// wake-up of the store, at least every [`Watch::interval`]) until one is found or the
/// [`Stop`] is reached (then `None`). An error ends the iteration after it is returned.
#[must_use = "an iterator delivers nothing until it is read"]
pub struct Changes<'w, 's> {
    watch: &'w mut Watch,
    store: &'s Store,
    stop: Stop,
    found: VecDeque<Change>,
    failed: bool,
}

impl std::fmt::Debug for Changes<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Changes")
            .field("position", &self.watch.position())
            .field("stop", &self.stop)
            .field("found", &self.found)
            .finish_non_exhaustive()
    }
}

impl Iterator for Changes<'_, '_> {
    type Item = Result<Change>;

    fn next(&mut self) -> Option<Result<Change>> {
        loop {
            if let Some(change) = self.found.pop_front() {
                return Some(Ok(change));
            }
            if self.failed {
                return None;
            }
            // Checked before the poll: what was committed before the stop was seen is
            // delivered, even when the stop came while this thread slept.
            let stopping = self.stop.reached();
            // Taken before the poll: a commit after it ends the nap at once.
            let mark = self.store.wake_mark();
            match self.watch.poll(self.store) {
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
                Ok(changes) if !changes.is_empty() => self.found.extend(changes),
                Ok(_) if stopping => return None,
                Ok(_) => self.stop.nap(self.store, mark, self.watch.interval),
            }
        }
    }
}

impl Watch {
    /// The changes to come, one at a time, until `stop`: an iterator that, while it has
    /// none to give, polls at each wake-up of the store ([`Store::wait_for_wake`]) and at
    /// least every [`Watch::interval`]. The current results are in
    /// [`Watch::results`]; the iterator brings what changes after them.
    ///
    /// ```
    /// use std::time::Duration;
    /// use precedent::{Fact, Store};
    /// use precedent::query::{Change, Givens, Query, Stop};
    ///
    /// let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// store.insert(&shop)?;
    /// let query = Query::parse("given s: Shop match o: Shop.Order where o->shop = s select o.id")?;
    /// let mut watch = store.watch(&query, &Givens::from([("s".to_string(), shop.hash())]))?;
    ///
    /// for id in [1, 2] {
    ///     store.insert(&Fact::builder("Shop.Order").field("id", id).predecessor("shop", shop.hash()).build()?)?;
    /// }
    /// let mut ids = Vec::new();
    /// for change in watch.changes(&store, Stop::after(Duration::from_millis(100))) {
    ///     if let Change::Added(row) = change? {
    ///         ids.push(row.value_as::<i64>()?);
    ///     }
    /// }
    /// assert_eq!(ids, [1, 2]);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// Each item is a change, or an error as [`Watch::poll`] returns it.
    pub fn changes<'w, 's>(&'w mut self, store: &'s Store, stop: Stop) -> Changes<'w, 's> {
        Changes {
            watch: self,
            store,
            stop,
            found: VecDeque::new(),
            failed: false,
        }
    }

    /// Calls `f` with each change to come until `stop`, or until `f` returns
    /// [`ControlFlow::Break`] (the changes found by the same poll after that one are not
    /// delivered; [`Watch::results`] counts them).
    ///
    /// ```
    /// use std::ops::ControlFlow;
    /// use precedent::{Fact, Store};
    /// use precedent::query::{Change, Givens, Query, Stop};
    ///
    /// let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// store.insert(&shop)?;
    /// let query = Query::parse("given s: Shop match o: Shop.Order where o->shop = s select o.id")?;
    /// let mut watch = store.watch(&query, &Givens::from([("s".to_string(), shop.hash())]))?;
    ///
    /// store.insert(&Fact::builder("Shop.Order").field("id", 7).predecessor("shop", shop.hash()).build()?)?;
    /// let mut first = None;
    /// watch.deliver(&store, Stop::never(), |change| {
    ///     first = Some(change);
    ///     ControlFlow::Break(())
    /// })?;
    /// assert!(matches!(first, Some(Change::Added(row)) if row.value.to_json() == 7));
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Watch::poll`]: the first error ends the delivery.
    pub fn deliver(
        &mut self,
        store: &Store,
        stop: Stop,
        mut f: impl FnMut(Change) -> ControlFlow<()>,
    ) -> Result<()> {
        for change in self.changes(store, stop) {
            if f(change?).is_break() {
                break;
            }
        }
        Ok(())
    }
}

//! Completing a claimed batch in one transaction ([`Store::complete_batch`]).
//!
//! A savepoint per lease is what keeps one failing handler from taking the others with it,
//! and it is most of what a batch costs beyond its rows: SQLite copies every page a
//! savepoint touches first into its journal, and the statements that open and release it
//! run once per lease. Handlers rarely fail, so the batch first runs in its transaction
//! with no savepoint at all, and pays for savepoints only when a handler fails: then that
//! transaction is rolled back, and a second one runs the leases before the failing one
//! each in a savepoint of its own and the rest in one savepoint, again until the next
//! failure, so that a failing lease leaves nothing behind and every other lease commits.
//!
//! An error of a lease's own step other than its refusal (a lost lease) fails the whole
//! call: on PostgreSQL it aborted the transaction, which no later statement can use. So
//! a wait past the busy timeout for the write lock, which the first lease's step takes
//! (after the leases' rows, the order every writer of queue rows keeps), fails the call
//! as busy, as SQLite's does at its `BEGIN`.

use crate::error::{Error, Result};
use crate::queue::Lease;
use crate::queue::index::QueueDefs;
use crate::queue::work::LeaseCheck;
use crate::store::{Store, Writer};

/// A handler's failure in the optimistic pass: the lease it failed on and its error.
struct Failed {
    at: usize,
    error: Error,
}

impl Store {
    /// Completes many leased inputs in one transaction (one commit, one fsync), as if each
    /// lease ran [`Store::complete`]: a lease whose handler fails (or that is lost, or whose
    /// handler writes no completion) leaves nothing behind while the others still commit.
    /// Returns one result per lease, in order.
    ///
    /// The handlers run one after another in one transaction. When one fails, the work of
    /// the batch since its start (or since the last failure) is rolled back and the leases
    /// before the failing one run again, each in a savepoint of its own; the failing
    /// lease's error is its result (its handler is not called again), and the batch goes on
    /// after it. After a failure the batch commits in a second transaction. So a handler may run twice in one call, and its writes still commit once:
    /// the same promise as at-least-once delivery, which already asks handlers to tolerate
    /// a second run. A lost lease's handler is never called.
    ///
    /// ```
    /// use precedent::queue::{Completion, QueueSpec};
    /// use precedent::{Error, Fact, Store};
    ///
    /// let store = Store::open_in_memory()?;
    /// let done = Completion { type_name: "Shipped".into(), role: "order".into() };
    /// store.declare_queue(&QueueSpec::new("ship", "Order", vec![done]))?;
    /// for n in 0..3 {
    ///     store.insert(&Fact::builder("Order").field("n", n).build()?)?;
    /// }
    /// let leases = store.claim("ship", 10)?;
    /// let results = store.complete_batch(&leases, |w, lease| {
    ///     if lease.input.field("n") == Some(&precedent::Value::Integer(1)) {
    ///         return Err(Error::InvalidFact { reason: "out of stock".into() });
    ///     }
    ///     w.insert(&lease.completion().build()?)?;
    ///     Ok(())
    /// })?;
    /// assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 2);
    /// // The failed input is still pending, under its lease.
    /// assert_eq!(store.queue_stats("ship")?.leased, 1);
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// The outer error is for the transaction itself ([`Error::Backend`]): among them a
    /// wait for another writer past the busy timeout, which fails the whole batch as busy
    /// ([`Error::is_busy`]) with nothing written, as it does on SQLite, so that the caller
    /// may run it again. Per-lease failures are in the returned list.
    pub fn complete_batch(
        &self,
        leases: &[Lease],
        mut handler: impl FnMut(&mut Writer<'_>, &Lease) -> Result<()>,
    ) -> Result<Vec<Result<()>>> {
        // The common case: every handler succeeds, in the transaction itself; on
        // PostgreSQL the completions' rows are written ahead, together. Should one of
        // them prove stored already, the pass is run again without.
        let (mut first, mut failed, lost) = self.first_pass(leases, &mut handler, true);
        if lost {
            (first, failed, _) = self.first_pass(leases, &mut handler, false);
        }
        let Some(Failed { at, error }) = failed else {
            return first;
        };
        // A handler failed and that transaction is rolled back: again, with savepoints.
        self.write(|w| {
            let defs = w.queue_defs()?;
            let checked = LeaseCheck::new(w, &defs, leases)?;
            let mut results = Vec::with_capacity(leases.len());
            for lease in &leases[..at] {
                results.push(one_by_one(w, &defs, lease, &mut handler)?);
            }
            results.push(Err(error));
            let mut from = at + 1;
            while from < leases.len() {
                let mut failed = None;
                let mut pass = Vec::with_capacity(leases.len() - from);
                let outcome = w.savepoint(|w| {
                    for (at, lease) in leases.iter().enumerate().skip(from) {
                        match optimistic(w, &defs, (&checked, at), lease, &mut handler)? {
                            Ran::Done(result) => pass.push(result),
                            Ran::Failed(error) => {
                                failed = Some(Failed { at, error });
                                return Err(abandoned(lease));
                            }
                        }
                    }
                    Ok(())
                });
                let Some(Failed { at, error }) = failed else {
                    outcome?;
                    results.append(&mut pass);
                    break;
                };
                for lease in &leases[from..at] {
                    results.push(one_by_one(w, &defs, lease, &mut handler)?);
                }
                results.push(Err(error));
                from = at + 1;
            }
            Ok(results)
        })
    }
}

/// How the first pass of a batch ended: the transaction's result, the handler failure
/// that rolled it back, and whether a fact written ahead was stored already (then the
/// transaction was rolled back for that).
type Pass = (Result<Vec<Result<()>>>, Option<Failed>, bool);

impl Store {
    /// Runs every lease of the batch in one transaction, until a handler fails. With
    /// `ahead`, released facts are written ahead ([`crate::store::WriteTx::write_ahead`]).
    fn first_pass(
        &self,
        leases: &[Lease],
        handler: &mut impl FnMut(&mut Writer<'_>, &Lease) -> Result<()>,
        ahead: bool,
    ) -> Pass {
        let mut failed = None;
        let mut lost = false;
        let first = self.write(|w| {
            // The declarations are read once for the batch: none can change inside the
            // transaction (declaring is a transaction of its own).
            let defs = w.queue_defs()?;
            let checked = LeaseCheck::new(w, &defs, leases)?;
            let ahead = ahead && w.write_ahead(true)?;
            let mut results = Vec::with_capacity(leases.len());
            let mut outcome = Ok(());
            for (at, lease) in leases.iter().enumerate() {
                match optimistic(w, &defs, (&checked, at), lease, handler) {
                    Ok(Ran::Done(result)) => results.push(result),
                    Ok(Ran::Failed(error)) => {
                        outcome = Err(Stop::Failed(Failed { at, error }));
                        break;
                    }
                    Err(error) => {
                        outcome = Err(Stop::Broken(error));
                        break;
                    }
                }
            }
            if ahead {
                // What is left written ahead goes now (unless the transaction is broken:
                // it is rolled back with it); any failure of this transaction may have
                // been a fact written ahead that was stored already, not what it seemed
                // to the handler or the lease's step.
                let sent = match outcome {
                    Err(Stop::Broken(_)) => Ok(true),
                    _ => w.write_ahead(false),
                };
                if w.ahead_lost() {
                    lost = true;
                    return Err(abandoned(&leases[0]));
                }
                sent?;
            }
            match outcome {
                Ok(()) => Ok(results),
                Err(Stop::Failed(f)) => {
                    let rolled_back = abandoned(&leases[f.at]);
                    failed = Some(f);
                    Err(rolled_back)
                }
                Err(Stop::Broken(error)) => Err(error),
            }
        });
        (first, failed, lost)
    }
}

/// Why the first pass stopped before its last lease.
enum Stop {
    /// A handler failed: the pass is rolled back and the batch goes on with savepoints.
    Failed(Failed),
    /// The transaction cannot go on (see [`optimistic`]): the batch fails with this.
    Broken(Error),
}

/// How one lease ran in a pass that goes on.
enum Ran {
    /// Its result: done, or refused before its handler ran (unknown queue, lease lost).
    Done(Result<()>),
    /// Its handler failed (or completed nothing): the caller rolls back what it wrote.
    Failed(Error),
}

/// What a pass returns to have its transaction or savepoint rolled back after a handler
/// failed (the handler's own error is kept apart, as that lease's result).
fn abandoned(lease: &Lease) -> Error {
    Error::Corrupt {
        hash: lease.input.hash(),
        reason: "a handler failed".into(),
    }
}

/// Runs one lease in the pass's transaction or savepoint, with no savepoint of its own.
///
/// # Errors
/// An error of the lease's step other than its refusal ([`Error::LeaseLost`]): a
/// statement that failed (a lock waited for past the busy timeout, a lost connection).
/// On PostgreSQL it aborted the transaction, so it is never one lease's result but the
/// batch's.
fn optimistic(
    w: &mut Writer<'_>,
    defs: &QueueDefs,
    checked: (&LeaseCheck, usize),
    lease: &Lease,
    handler: &mut impl FnMut(&mut Writer<'_>, &Lease) -> Result<()>,
) -> Result<Ran> {
    let Some(q) = defs.by_name(&lease.queue) else {
        return Ok(Ran::Done(Err(super::work::unknown(&lease.queue))));
    };
    match w.lease_ready_after(lease, q.spec.semantics, Some(checked)) {
        Ok(()) => {}
        Err(lost @ Error::LeaseLost { .. }) => return Ok(Ran::Done(Err(lost))),
        Err(broken) => return Err(broken),
    }
    Ok(
        match w.run_completion(lease, q.spec.semantics, |w| handler(w, lease)) {
            Ok(()) => Ran::Done(Ok(())),
            Err(error) => Ran::Failed(error),
        },
    )
}

/// Runs one lease in a savepoint of its own, as [`Store::complete`] does; its result.
///
/// # Errors
/// As [`optimistic`]: an error of the lease's step other than its refusal is the batch's.
fn one_by_one(
    w: &mut Writer<'_>,
    defs: &QueueDefs,
    lease: &Lease,
    handler: &mut impl FnMut(&mut Writer<'_>, &Lease) -> Result<()>,
) -> Result<Result<()>> {
    let Some(q) = defs.by_name(&lease.queue) else {
        return Ok(Err(super::work::unknown(&lease.queue)));
    };
    let semantics = q.spec.semantics;
    let mut broken = None;
    let result = w.savepoint(|w| {
        match w.lease_ready(lease, semantics) {
            Ok(()) => {}
            Err(lost @ Error::LeaseLost { .. }) => return Err(lost),
            Err(error) => {
                broken = Some(error);
                return Err(abandoned(lease));
            }
        }
        w.run_completion(lease, semantics, |w| handler(w, lease))
    });
    match broken {
        Some(error) => Err(error),
        None => Ok(result),
    }
}

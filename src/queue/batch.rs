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
    /// The outer error is for the transaction itself ([`Error::Backend`]); per-lease
    /// failures are in the returned list.
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
                results.push(one_by_one(w, &defs, lease, &mut handler));
            }
            results.push(Err(error));
            let mut from = at + 1;
            while from < leases.len() {
                let mut failed = None;
                let mut pass = Vec::with_capacity(leases.len() - from);
                let outcome = w.savepoint(|w| {
                    for (at, lease) in leases.iter().enumerate().skip(from) {
                        match optimistic(w, &defs, (&checked, at), lease, &mut handler) {
                            Ok(result) => pass.push(result),
                            Err(error) => {
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
                    results.push(one_by_one(w, &defs, lease, &mut handler));
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
                    Ok(result) => results.push(result),
                    Err(error) => {
                        outcome = Err((at, error));
                        break;
                    }
                }
            }
            if ahead {
                // What is left written ahead goes now; any failure of this transaction
                // may have been a fact written ahead that was stored already, not what
                // it seemed to the handler.
                let sent = w.write_ahead(false);
                if w.ahead_lost() {
                    lost = true;
                    return Err(abandoned(&leases[0]));
                }
                sent?;
            }
            match outcome {
                Ok(()) => Ok(results),
                Err((at, error)) => {
                    failed = Some(Failed { at, error });
                    Err(abandoned(&leases[at]))
                }
            }
        });
        (first, failed, lost)
    }
}

/// What a pass returns to have its transaction or savepoint rolled back after a handler
/// failed (the handler's own error is kept apart, as that lease's result).
fn abandoned(lease: &Lease) -> Error {
    Error::Corrupt {
        hash: lease.input.hash(),
        reason: "a handler failed".into(),
    }
}

fn optimistic(
    w: &mut Writer<'_>,
    defs: &QueueDefs,
    checked: (&LeaseCheck, usize),
    lease: &Lease,
    handler: &mut impl FnMut(&mut Writer<'_>, &Lease) -> Result<()>,
) -> std::result::Result<Result<()>, Error> {
    let Some(q) = defs.by_name(&lease.queue) else {
        return Ok(Err(super::work::unknown(&lease.queue)));
    };
    if let Err(refused) = w.lease_ready_after(lease, q.spec.semantics, Some(checked)) {
        return Ok(Err(refused));
    }
    w.run_completion(lease, q.spec.semantics, |w| handler(w, lease))
        .map(Ok)
}

/// Runs one lease in a savepoint of its own, as [`Store::complete`] does.
fn one_by_one(
    w: &mut Writer<'_>,
    defs: &QueueDefs,
    lease: &Lease,
    handler: &mut impl FnMut(&mut Writer<'_>, &Lease) -> Result<()>,
) -> Result<()> {
    let Some(q) = defs.by_name(&lease.queue) else {
        return Err(super::work::unknown(&lease.queue));
    };
    w.savepoint(|w| w.complete_in_savepoint(lease, q.spec.semantics, |w| handler(w, lease)))
}

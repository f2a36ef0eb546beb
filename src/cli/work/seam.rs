//! The queue as both ways of running handlers use it: a local database ([`Local`]) or a
//! remote hub (`work_remote::Hub`), behind one small trait, so that the process-per-input
//! job and the `--process` driver are written once.
//!
//! Every call waits out what passes (a locked database, a database server or a hub
//! restarting) inside the implementation; what reaches the driver is final.

use std::collections::HashMap;
use std::time::Duration;

use precedent::json::{self, FactSpec, PredSpec};
use precedent::queue::{FailOutcome, Failure, Lease, QueueSpec};
use precedent::{Error, Fact, FactHash, Store};

use super::patient::patiently;

/// A fact a handler wrote for an input: where it was read (for errors), the fact as
/// parsed, and its JSON text as written (what a remote hub is sent).
pub(in crate::cli) struct Effect {
    pub at: String,
    pub spec: FactSpec,
    pub text: String,
}

impl Effect {
    /// Whether this fact completes `input` under the rule `(type_name, role)`, naming it
    /// by its full hash (as the facts are read, before prefixes and inline predecessors
    /// are resolved: what a worker can tell of a hub that does not resolve them for it).
    pub(in crate::cli) fn completes(&self, input: &Fact, type_name: &str, role: &str) -> bool {
        let hash = input.hash();
        self.spec.type_name == type_name
            && self.spec.predecessors.get(role).is_some_and(|p| {
                p.iter()
                    .any(|p| matches!(p, PredSpec::Hash(h) if *h == hash))
            })
    }
}

/// Reads a handler's stdout as facts, one per non-blank line; `Err` is the reason of a
/// transient failure, naming the line.
pub(in crate::cli) fn effects_of(stdout: &[u8]) -> Result<Vec<Effect>, String> {
    let text = String::from_utf8_lossy(stdout);
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("stdout line {}", i + 1);
        let spec = json::parse(line).map_err(|e| format!("{at}: {e}"))?;
        out.push(Effect {
            at,
            spec,
            text: line.to_string(),
        });
    }
    Ok(out)
}

/// An input claimed from a [`WorkQueue`].
pub(in crate::cli) trait Held: Clone + Send {
    fn input(&self) -> &Fact;
    fn attempt(&self) -> u32;
    fn queue(&self) -> &str;
}

/// What became of one completion.
pub(in crate::cli) enum Completed {
    /// Stored, with this many facts.
    Done(usize),
    /// The lease had ended (another worker may have the input): nothing written.
    LeaseLost,
    /// The facts could not be stored: a transient failure with this reason.
    Refused(String),
}

/// What became of one failure.
pub(in crate::cli) enum Failed {
    /// Offered again at this time (ms since the epoch, the queue's clock).
    Retry(i64),
    /// Dead-lettered as this entry.
    Dead(String),
    /// Poisoned as this entry.
    Poison(String),
    /// At-most-once: the input is gone.
    Dropped,
    /// The lease had ended before the failure was recorded.
    LeaseLost,
}

/// What the drivers need from a queue.
pub(in crate::cli) trait WorkQueue {
    type Lease: Held;

    /// Claims up to `n` inputs; a queue that can (a hub's long poll) waits up to `wait`
    /// for the first when none is ready.
    fn claim(&self, n: usize, wait: Duration) -> anyhow::Result<Vec<Self::Lease>>;

    /// The lease duration of `lease`, in ms: extend it before a third has passed.
    fn lease_ms(&self, lease: &Self::Lease) -> i64;

    /// Extends leases in place; one that cannot be extended is kept as it is (its
    /// completion is refused if it ended meanwhile).
    fn extend(&self, leases: &mut [&mut Self::Lease]) -> anyhow::Result<()>;

    /// Completes leases, each with its handler's facts (a completing fact of our own added
    /// when none of them completes the input), as one batch: one result per lease.
    fn complete(&self, done: &[(Self::Lease, Vec<Effect>)]) -> anyhow::Result<Vec<Completed>>;

    /// Records a failed attempt, retried no sooner than `retry_after_ms` when given.
    fn fail(
        &self,
        lease: &Self::Lease,
        failure: Failure,
        retry_after_ms: Option<i64>,
    ) -> anyhow::Result<Failed>;

    /// Gives an unstarted lease back, uncounted (a hub that predates its `release`
    /// endpoint leaves the lease to end, the attempt counted).
    fn release(&self, lease: Self::Lease);
}

/// [`Held`] for a lease type with public `input`, `attempt` and `queue` fields.
macro_rules! held {
    ($t:ty) => {
        impl Held for $t {
            fn input(&self) -> &Fact {
                &self.input
            }
            fn attempt(&self) -> u32 {
                self.attempt
            }
            fn queue(&self) -> &str {
                &self.queue
            }
        }
    };
}

held!(Lease);
held!(precedent::sync::client::RemoteLease);

/// A queue of the local database, through one job's own [`Store`].
pub(in crate::cli) struct Local {
    pub store: Store,
    pub spec: QueueSpec,
}

impl WorkQueue for Local {
    type Lease = Lease;

    fn claim(&self, n: usize, _wait: Duration) -> anyhow::Result<Vec<Lease>> {
        Ok(patiently("claim", || self.store.claim(&self.spec.name, n))?)
    }

    fn lease_ms(&self, _lease: &Lease) -> i64 {
        self.spec.lease_ms
    }

    fn extend(&self, leases: &mut [&mut Lease]) -> anyhow::Result<()> {
        for lease in leases.iter_mut() {
            match patiently("extend a lease", || self.store.extend(lease)) {
                Ok(l) => **lease = l,
                Err(Error::LeaseLost { .. }) => {}
                Err(e) if e.is_unavailable() => eprintln!("warning: cannot extend a lease: {e}"),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn complete(&self, done: &[(Lease, Vec<Effect>)]) -> anyhow::Result<Vec<Completed>> {
        let leases: Vec<Lease> = done.iter().map(|(l, _)| l.clone()).collect();
        let at: HashMap<FactHash, usize> = (done.iter().enumerate())
            .map(|(i, (l, _))| (l.input.hash(), i))
            .collect();
        let mut counts = vec![0; done.len()];
        let results = patiently("store completions", || {
            self.store.complete_batch(&leases, |w, lease| {
                let i = at[&lease.input.hash()];
                counts[i] = store_output(w, &self.spec, lease, &done[i].1)?;
                Ok(())
            })
        })?;
        let mut out = Vec::with_capacity(results.len());
        for (i, r) in results.into_iter().enumerate() {
            out.push(match r {
                Ok(()) => Completed::Done(counts[i]),
                Err(Error::LeaseLost { .. }) => Completed::LeaseLost,
                Err(e @ (Error::Backend(_) | Error::Io(_) | Error::Corrupt { .. })) => {
                    return Err(e.into());
                }
                Err(e) => Completed::Refused(format!("cannot store the output: {e}")),
            });
        }
        Ok(out)
    }

    fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retry_after_ms: Option<i64>,
    ) -> anyhow::Result<Failed> {
        let result = patiently("record a failure", || match retry_after_ms {
            Some(ms) => self.store.fail_not_before(lease, failure.clone(), ms),
            None => self.store.fail(lease, failure.clone()),
        });
        Ok(match result {
            Ok(FailOutcome::Retry { at_ms }) => Failed::Retry(at_ms),
            Ok(FailOutcome::DeadLettered(h)) => Failed::Dead(h.to_string()),
            Ok(FailOutcome::Poisoned(h)) => Failed::Poison(h.to_string()),
            Ok(FailOutcome::Dropped) => Failed::Dropped,
            Err(Error::LeaseLost { .. }) => Failed::LeaseLost,
            Err(e) => return Err(e.into()),
        })
    }

    fn release(&self, lease: Lease) {
        match patiently("release a lease", || self.store.release(lease.clone())) {
            Ok(()) | Err(Error::LeaseLost { .. }) => {}
            Err(e) => eprintln!("warning: cannot release a lease: {e}"),
        }
    }
}

/// Stores a handler's facts in the transaction completing `lease` and, unless one of them
/// completes the input, a completing fact of our own. Returns the fact count.
fn store_output(
    w: &mut precedent::Writer<'_>,
    spec: &QueueSpec,
    lease: &Lease,
    effects: &[Effect],
) -> Result<usize, Error> {
    let input = lease.input.hash();
    let mut facts: Vec<Fact> = Vec::new();
    for e in effects {
        let resolved =
            json::resolve(&e.spec, &mut |p| w.resolve_prefix(p)).map_err(|err| Error::Json {
                reason: format!("{}: {err}", e.at),
            })?;
        facts.extend(resolved);
    }
    let completes = facts.iter().any(|f| spec.completes(f, &input));
    if !completes {
        // Deterministic per input: a retry after a crash writes the same fact.
        facts.push(lease.completion().field("by", "precedent work").build()?);
    }
    for f in &facts {
        w.insert(f)?;
    }
    Ok(facts.len())
}

//! `precedent work QUEUE --remote URL [--token T] [--process] -- COMMAND`: the worker
//! against a hub's queues over HTTP (`docs/protocol.md`, "Queues over HTTP"), with no
//! local database.
//!
//! The jobs are the local worker's (a command per input, or a long-running handler with
//! `--process`, `--timeout` alike); only the queue differs: [`Hub`], the local worker's
//! [`WorkQueue`] seam over a [`RemoteQueue`]. The handler sees what it sees locally,
//! without `PRECEDENT_DB`. Its facts are sent with the completion and stored with it in
//! one transaction on the hub; a completing fact `{"by": "precedent work"}` goes with
//! them as the completion's `otherwise`, which the hub stores only when none of them
//! completes the input under any of the queue's rules once resolved, as locally. (A hub
//! that predates `otherwise` is sent the fact unless one of the facts as written names
//! the input by its full hash under the first rule.) `--process` sends the completions of
//! a round as one request. Leases not started are given back (`release`), uncounted.
//!
//! The hub going away (connection refused, 503) does not stop the worker: each call is
//! retried with a backoff of 100 ms doubling to 5 s for up to 5 minutes, answered
//! completions included. Lease ids hold no server state, so a completion sent after the
//! hub restarted still counts if the lease lives; one whose lease ended meanwhile is
//! refused (logged as a lost lease) and the input offered again.

use std::time::{Duration, Instant};

use precedent::json;
use precedent::queue::Failure;
use precedent::sync::client::{ClientOptions, RemoteLease, RemoteQueue};
use precedent::sync::queue_wire::LeaseResult;
use precedent::{Error, Result};

use super::work::{Completed, Effect, Failed, WorkArgs, WorkQueue, run_jobs};
use super::{Global, Status};

/// How long a call keeps being retried while the hub is unreachable or unavailable.
const OUTAGE: Duration = Duration::from_secs(300);
/// The first pause after such a failure, doubled per failure up to [`BACKOFF_CAP`].
const BACKOFF: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(5);

/// A hub's queue as a worker uses it: every call but `extend` retried through outages.
pub(super) struct Hub {
    queue: RemoteQueue,
}

/// Whether `e` may pass if tried again: the hub unreachable, restarting or busy.
fn passing(e: &Error) -> bool {
    matches!(e, Error::Transport { .. })
        || matches!(e, Error::Remote { status, .. } if matches!(status, 408 | 502 | 503 | 504))
}

impl Hub {
    fn retrying<T>(&self, what: &str, call: impl FnMut() -> Result<T>) -> Result<T> {
        self.retrying_for(what, OUTAGE, call)
    }

    /// As [`Hub::retrying`], retried for up to `outage`.
    fn retrying_for<T>(
        &self,
        what: &str,
        outage: Duration,
        mut call: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        let since = Instant::now();
        let mut pause = BACKOFF;
        loop {
            match call() {
                Err(e) if passing(&e) && since.elapsed() < outage => {
                    eprintln!("warning: {what}: {e}; retrying in {} ms", pause.as_millis());
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(BACKOFF_CAP);
                }
                r => return r,
            }
        }
    }
}

impl WorkQueue for Hub {
    type Lease = RemoteLease;

    fn claim(&self, n: usize, wait: Duration) -> anyhow::Result<Vec<RemoteLease>> {
        Ok(self.retrying("claim", || self.queue.claim(n, wait))?)
    }

    fn lease_ms(&self, lease: &RemoteLease) -> i64 {
        lease.lease_ms
    }

    /// A failure is only logged: the handler runs on, and its completion is refused if
    /// the lease ended meanwhile.
    fn extend(&self, leases: &mut [&mut RemoteLease]) -> anyhow::Result<()> {
        let ids: Vec<&str> = leases.iter().map(|l| l.id.as_str()).collect();
        let results = match self.queue.extend(&ids) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("warning: cannot extend leases: {e}");
                return Ok(());
            }
        };
        for (lease, r) in leases.iter_mut().zip(results) {
            if let Some(at) = r.expires_at_ms {
                lease.expires_at_ms = at;
            }
        }
        Ok(())
    }

    fn complete(&self, done: &[(RemoteLease, Vec<Effect>)]) -> anyhow::Result<Vec<Completed>> {
        let mut items = Vec::with_capacity(done.len());
        for (lease, effects) in done {
            let (facts, otherwise) = completion_facts(lease, effects)?;
            items.push((lease.id.as_str(), facts, otherwise));
        }
        let results = self.retrying("complete", || self.queue.complete_json_or(&items))?;
        Ok(results.into_iter().map(completed).collect())
    }

    fn fail(
        &self,
        lease: &RemoteLease,
        failure: Failure,
        retry_after_ms: Option<i64>,
    ) -> anyhow::Result<Failed> {
        let items = [(lease.id.as_str(), failure.reason())];
        let mut r = self.retrying("fail", || match (&failure, retry_after_ms) {
            (Failure::Poison(_), _) => self.queue.poison(&items),
            (Failure::Permanent(_), _) => self.queue.fail(&items, true),
            (Failure::TimedOut { .. }, _) => self.queue.fail_timed_out(&items),
            (Failure::Transient(reason), Some(ms)) => {
                let after = Duration::from_millis(ms.max(0) as u64);
                self.queue.fail_not_before(&[(&lease.id, reason, after)])
            }
            (Failure::Transient(_), None) => self.queue.fail(&items, false),
        })?;
        Ok(failed(r.remove(0)))
    }

    /// Retried through an outage only while the lease would live anyway (until its
    /// `expires_at_ms`: a stopping worker with leases long expired exits at once). A hub
    /// that predates `release` (it sends no completion rules), or one that cannot be
    /// reached, leaves the lease to end: the input is offered again then, the attempt
    /// counted.
    fn release(&self, lease: RemoteLease) {
        if lease.completions.is_empty() {
            return;
        }
        let ids = [lease.id.as_str()];
        let now = precedent::clock::Clock::now_ms(&precedent::clock::SystemClock);
        let live = time_left(lease.expires_at_ms, now);
        match self.retrying_for("release", live, || self.queue.release(&ids)) {
            Ok(r)
                if r.first()
                    .is_some_and(|r| r.ok || r.error.as_deref() == Some("lease_lost")) => {}
            Ok(r) => eprintln!("warning: cannot release a lease: {r:?}"),
            Err(e) => eprintln!("warning: cannot release a lease: {e}"),
        }
    }
}

/// How long a lease expiring at `expires_at_ms` still lives at `now_ms`: none once past.
fn time_left(expires_at_ms: i64, now_ms: i64) -> Duration {
    Duration::from_millis(expires_at_ms.saturating_sub(now_ms).max(0) as u64)
}

/// What a hub's answer to one completion says.
fn completed(r: LeaseResult) -> Completed {
    match (r.ok, r.error.as_deref()) {
        (true, _) => Completed::Done(r.facts.unwrap_or(0) as usize),
        (false, Some("lease_lost")) => Completed::LeaseLost,
        (false, _) => Completed::Refused(format!(
            "cannot store the output: {}",
            r.message.unwrap_or_default()
        )),
    }
}

/// What a hub's answer to one failure says.
fn failed(r: LeaseResult) -> Failed {
    let entry = r.entry.unwrap_or_default();
    match (r.ok, r.outcome.as_deref()) {
        (true, Some("retry")) => Failed::Retry(r.retry_at_ms.unwrap_or(0)),
        (true, Some("dead")) => Failed::Dead(entry),
        (true, Some("poison")) => Failed::Poison(entry),
        (true, _) => Failed::Dropped,
        (false, _) => Failed::LeaseLost,
    }
}

/// A handler's facts as sent to the hub, and the completing fact of our own that the hub
/// stores only if none of them completes the input under any of the queue's rules (the
/// hub resolves their prefixes and inline predecessors, as the local worker does).
///
/// A hub that predates `otherwise` (it sends no completion rules) is sent our fact among
/// the handler's, unless one of those names the input by its full hash under the first
/// rule: all that can be told here.
fn completion_facts(
    lease: &RemoteLease,
    effects: &[Effect],
) -> Result<(Vec<String>, Option<String>)> {
    let mut facts: Vec<String> = effects.iter().map(|e| e.text.clone()).collect();
    // Deterministic per input: a retry after a crash writes the same fact.
    let own = lease.completion().field("by", "precedent work").build()?;
    let own = json::to_json(&own).to_string();
    if !lease.completions.is_empty() {
        return Ok((facts, Some(own)));
    }
    let rule = &lease.completion;
    let completes =
        (effects.iter()).any(|e| e.completes(&lease.input, &rule.type_name, &rule.role));
    if !completes {
        facts.push(own);
    }
    Ok((facts, None))
}

/// `precedent work --remote URL`.
pub(super) fn work(_g: &Global, args: WorkArgs, url: &str) -> anyhow::Result<Status> {
    let (url, queue) = (url.to_string(), args.queue.clone());
    let options = ClientOptions {
        token: args.token.clone(),
        ..ClientOptions::default()
    };
    // Checked once before the jobs start: a bad URL is a usage error, not a job's.
    RemoteQueue::new(&url, &queue, options.clone())?;
    run_jobs(args, None, move || {
        let queue = RemoteQueue::new(&url, &queue, options.clone())?;
        Ok(Hub { queue })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_retried_only_while_its_lease_lives() {
        assert_eq!(time_left(10_000, 4_000), Duration::from_secs(6));
        assert_eq!(time_left(10_000, 10_000), Duration::ZERO);
        assert_eq!(time_left(10_000, 3_600_000), Duration::ZERO);
        assert_eq!(time_left(i64::MIN, i64::MAX), Duration::ZERO);
    }
}

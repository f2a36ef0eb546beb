//! A remote worker's side of a hub's queues (`docs/protocol.md`, "Queues over HTTP"):
//! claim with a long-poll wait, extend, complete with effects, release, fail and poison,
//! each a batch in one request.
//!
//! ```no_run
//! use std::time::Duration;
//! use precedent::sync::client::{ClientOptions, RemoteQueue};
//!
//! let ship = RemoteQueue::new("http://127.0.0.1:7341", "ship", ClientOptions::default())?;
//! let leases = ship.claim(100, Duration::from_secs(20))?;
//! let done: Vec<_> = leases
//!     .iter()
//!     .map(|l| Ok((l.id.as_str(), vec![l.completion().field("carrier", "post").build()?])))
//!     .collect::<precedent::Result<_>>()?;
//! for result in ship.complete(&done)? {
//!     assert!(result.ok, "{:?}", result.message);
//! }
//! # Ok::<(), precedent::Error>(())
//! ```

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::{Client, ClientOptions};
use crate::error::{Error, Result};
use crate::fact::{Fact, FactBuilder};
use crate::json;
use crate::queue::Completion;
use crate::sync::queue_wire::{
    Batch, ClaimAnswer, ClaimRequest, CompleteItem, ExtendItem, FailItem, LeaseResult, PoisonItem,
    ReleaseItem, Results,
};
use crate::sync::wire;

/// One queue of a remote hub.
pub struct RemoteQueue {
    client: Client,
    queue: String,
    /// `BASE/v1/queues/NAME/`, the queue's name percent-encoded.
    prefix: String,
}

/// An input claimed from a remote hub. Complete, fail or poison it before
/// [`RemoteLease::expires_at_ms`], or extend it; a lease left alone expires and the input
/// is offered again.
#[derive(Clone, Debug)]
pub struct RemoteLease {
    /// The lease id, valid only with the token that claimed it.
    pub id: String,
    /// The queue.
    pub queue: String,
    /// Which delivery this is, 1 for the first.
    pub attempt: u32,
    /// When the lease ends unless extended, ms since the epoch on the hub's clock.
    pub expires_at_ms: i64,
    /// The queue's lease duration in ms.
    pub lease_ms: i64,
    /// The input fact, its hash checked.
    pub input: Fact,
    /// The queue's first completion rule.
    pub completion: Completion,
    /// Every completion rule of the queue, the first one first; empty from a hub that
    /// predates them, which also has no `otherwise` in a completion
    /// ([`RemoteQueue::complete_json_or`]) and no [`RemoteQueue::release`].
    pub completions: Vec<Completion>,
}

impl RemoteLease {
    /// A builder for a fact that completes this input under the queue's first completion
    /// rule, as [`crate::queue::Lease::completion`].
    pub fn completion(&self) -> FactBuilder {
        Fact::builder(self.completion.type_name.clone())
            .predecessor(self.completion.role.clone(), self.input.hash())
    }
}

impl RemoteQueue {
    /// The queue `queue` of the hub at `url`.
    ///
    /// # Errors
    /// As [`Client::new`].
    pub fn new(url: &str, queue: &str, options: ClientOptions) -> Result<RemoteQueue> {
        let client = Client::new(url, options)?;
        let prefix = format!("{}/v1/queues/{}/", client.base, path_segment(queue));
        Ok(RemoteQueue {
            client,
            queue: queue.to_string(),
            prefix,
        })
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.queue
    }

    fn post<T: Serialize, A: DeserializeOwned>(&self, action: &str, body: &T) -> Result<A> {
        let body = serde_json::to_vec(body).expect("request serialises");
        let req = self
            .client
            .auth(self.client.agent.post(format!("{}{action}", self.prefix)))
            .header("content-type", wire::JSON);
        let resp = self.client.check(req.send(&body[..]))?;
        self.client.read_json(resp)
    }

    /// Claims up to `n` inputs; when none is ready, waits up to `wait` (at most 30 s, and
    /// the hub's long-poll cap) for one. An empty list means nothing came in time.
    ///
    /// # Errors
    /// [`Error::Transport`], [`Error::Remote`] (401, 403, 404 `unknown_queue`, ...),
    /// [`Error::Protocol`] for an answer that is not a claim's, or an input whose hash
    /// does not match its content.
    pub fn claim(&self, n: usize, wait: Duration) -> Result<Vec<RemoteLease>> {
        let req = ClaimRequest {
            n: n as u64,
            wait_ms: wait.as_millis().min(u64::MAX as u128) as u64,
        };
        let answer: ClaimAnswer = self.post("claim", &req)?;
        answer
            .leases
            .into_iter()
            .map(|l| {
                let input = json::parse_standalone(l.input.get())
                    .ok()
                    .and_then(|mut f| f.pop())
                    .ok_or_else(|| {
                        self.client
                            .protocol(format!("lease {}: the input is not one fact", l.lease))
                    })?;
                Ok(RemoteLease {
                    id: l.lease,
                    queue: l.queue,
                    attempt: l.attempt,
                    expires_at_ms: l.expires_at_ms,
                    lease_ms: l.lease_ms,
                    input,
                    completion: Completion {
                        type_name: l.completion.type_name,
                        role: l.completion.role,
                    },
                    completions: (l.completions.into_iter())
                        .map(|c| Completion {
                            type_name: c.type_name,
                            role: c.role,
                        })
                        .collect(),
                })
            })
            .collect()
    }

    /// Completes leases, each with its facts (one of which must complete its input), in
    /// one request and one transaction on the hub: one result per lease, in order. A
    /// lease's facts commit with its completion or not at all.
    ///
    /// # Errors
    /// As [`RemoteQueue::claim`]; 400 for a malformed request, 403 `lease_not_yours` for
    /// a lease taken with another token. Per-lease refusals are in the results.
    pub fn complete(&self, items: &[(&str, Vec<Fact>)]) -> Result<Vec<LeaseResult>> {
        let items: Vec<(&str, Vec<String>)> = items
            .iter()
            .map(|(id, facts)| {
                let facts = facts.iter().map(|f| json::to_json(f).to_string());
                (*id, facts.collect())
            })
            .collect();
        self.complete_json(&items)
    }

    /// As [`RemoteQueue::complete`], with the facts in their JSON form as text (a
    /// predecessor may then be a hash prefix, resolved on the hub).
    ///
    /// # Errors
    /// As [`RemoteQueue::complete`]; [`Error::Json`] for a text that is not JSON.
    pub fn complete_json(&self, items: &[(&str, Vec<String>)]) -> Result<Vec<LeaseResult>> {
        let items: Vec<(&str, Vec<String>, Option<String>)> = (items.iter())
            .map(|(id, facts)| (*id, facts.clone(), None))
            .collect();
        self.complete_json_or(&items)
    }

    /// As [`RemoteQueue::complete_json`], each item `(lease, facts, otherwise)` with a
    /// fact `otherwise` that the hub stores with the facts only when none of them
    /// completes the input under any of the queue's completion rules, prefixes and
    /// inline predecessors resolved (as `precedent work` adds its own completing fact).
    /// Only a hub that lists [`RemoteLease::completions`] accepts an `otherwise`; an
    /// older one refuses the request with 400.
    ///
    /// # Errors
    /// As [`RemoteQueue::complete_json`].
    pub fn complete_json_or(
        &self,
        items: &[(&str, Vec<String>, Option<String>)],
    ) -> Result<Vec<LeaseResult>> {
        let raw = |id: &str, f: &String| {
            RawValue::from_string(f.clone()).map_err(|e| Error::Json {
                reason: format!("a fact of lease {id}: {e}"),
            })
        };
        let mut leases = Vec::with_capacity(items.len());
        for (id, facts, otherwise) in items {
            let facts = (facts.iter()).map(|f| raw(id, f)).collect::<Result<_>>()?;
            let otherwise = otherwise.as_ref().map(|f| raw(id, f)).transpose()?;
            leases.push(CompleteItem {
                lease: id.to_string(),
                facts,
                otherwise,
            });
        }
        self.batch("complete", leases)
    }

    /// Extends leases by the queue's lease duration from now; each result carries the new
    /// `expires_at_ms`, or `lease_lost`.
    ///
    /// # Errors
    /// As [`RemoteQueue::complete`].
    pub fn extend(&self, ids: &[&str]) -> Result<Vec<LeaseResult>> {
        let leases = ids.iter().map(|id| ExtendItem {
            lease: id.to_string(),
        });
        self.batch("extend", leases.collect())
    }

    /// Gives leases back unstarted, their attempts not counted, as
    /// [`crate::Store::release`]: each input is offered again at once. Each result is `ok`
    /// or `lease_lost`. A hub that predates the endpoint answers 404 `not_found`.
    ///
    /// # Errors
    /// As [`RemoteQueue::complete`].
    pub fn release(&self, ids: &[&str]) -> Result<Vec<LeaseResult>> {
        let leases = ids.iter().map(|id| ReleaseItem {
            lease: id.to_string(),
        });
        self.batch("release", leases.collect())
    }

    /// Records failed attempts, `(lease, reason)`: retried after the queue's backoff until
    /// its retry budget runs out, or dead-lettered now when `permanent`.
    ///
    /// # Errors
    /// As [`RemoteQueue::complete`].
    pub fn fail(&self, items: &[(&str, &str)], permanent: bool) -> Result<Vec<LeaseResult>> {
        let leases = items.iter().map(|(id, reason)| FailItem {
            lease: id.to_string(),
            reason: reason.to_string(),
            permanent,
            retry_after_ms: None,
            timed_out: false,
        });
        self.batch("fail", leases.collect())
    }

    /// Records transient failures, `(lease, reason, delay)`, each input offered again no
    /// sooner than its delay from now (or after the queue's backoff, if that is later),
    /// as [`crate::Store::fail_not_before`].
    ///
    /// # Errors
    /// As [`RemoteQueue::complete`].
    pub fn fail_not_before(&self, items: &[(&str, &str, Duration)]) -> Result<Vec<LeaseResult>> {
        let leases = items.iter().map(|(id, reason, delay)| FailItem {
            lease: id.to_string(),
            reason: reason.to_string(),
            permanent: false,
            retry_after_ms: Some(delay.as_millis().min(u64::MAX as u128) as u64),
            timed_out: false,
        });
        self.batch("fail", leases.collect())
    }

    /// Records attempts that ran past the worker's time limit, `(lease, reason)`: transient
    /// failures, retried as [`RemoteQueue::fail`] does, and counted in the queue's
    /// `timed_out` (`queue stats`).
    ///
    /// # Errors
    /// As [`RemoteQueue::complete`].
    pub fn fail_timed_out(&self, items: &[(&str, &str)]) -> Result<Vec<LeaseResult>> {
        let leases = items.iter().map(|(id, reason)| FailItem {
            lease: id.to_string(),
            reason: reason.to_string(),
            permanent: false,
            retry_after_ms: None,
            timed_out: true,
        });
        self.batch("fail", leases.collect())
    }

    /// Declares inputs poison, `(lease, reason)`: never retried until redriven.
    ///
    /// # Errors
    /// As [`RemoteQueue::complete`].
    pub fn poison(&self, items: &[(&str, &str)]) -> Result<Vec<LeaseResult>> {
        let leases = items.iter().map(|(id, reason)| PoisonItem {
            lease: id.to_string(),
            reason: reason.to_string(),
        });
        self.batch("poison", leases.collect())
    }

    fn batch<T: Serialize>(&self, action: &str, leases: Vec<T>) -> Result<Vec<LeaseResult>> {
        let n = leases.len();
        let answer: Results = self.post(action, &Batch { leases })?;
        if answer.results.len() != n {
            return Err(self.client.protocol(format!(
                "{action}: {} results for {n} leases",
                answer.results.len()
            )));
        }
        Ok(answer.results)
    }
}

/// `name` as one path segment: every byte but the unreserved ones percent-encoded.
fn path_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

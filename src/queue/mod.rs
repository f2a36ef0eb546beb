//! Work queues on the fact store: declarations, leases, failures and their outcomes.
//!
//! A queue's pending work is "facts of the input type with no completing successor". The
//! store keeps that set as an index, updated in the transaction that releases each fact,
//! whatever brought it (an insert, an import, a sync, another process). Handling an input
//! means writing a completing fact in the same transaction as the handler's own rows
//! ([`crate::Store::complete`]), so effects inside the database happen exactly once under
//! at-least-once delivery. `docs/semantics.md` states every promise.
//!
//! The queue is a client of the fact core: the index is kept by a release hook
//! (`index.rs`), and claim, complete and the rest (`work.rs`) run their SQL through the
//! store's seam ([`crate::store::Sql`]).
//!
//! Dead letters, poison entries, redrives and discards are facts (types in [`system`]),
//! so their history is auditable, syncs to other nodes, and never changes.

mod batch;
mod controls;
mod index;
// The paged reads of the console's JSON endpoints (src/sync/server/console/).
#[cfg(feature = "server")]
mod pages;
mod typed;
mod work;

pub use controls::{RateLimit, parse_rfc3339_ms};
#[cfg(feature = "server")]
pub(crate) use pages::{ItemFilter, Minute};
pub use typed::{QueueHandle, TypedLease};
#[cfg(feature = "server")]
pub(crate) use work::breaches;

use serde::{Deserialize, Serialize};

use crate::fact::{Fact, FactBuilder, Value};
use crate::hash::FactHash;

/// Fact types the queue machinery writes itself. Each names the input (or the entry) it
/// concerns through a role and carries the queue name in its `queue` field.
pub mod system {
    /// The input was dead-lettered: `input` role; fields `queue`, `reason`, `attempts`,
    /// `first_attempt_at`, `dead_at` (ms since the epoch).
    pub const DEAD_LETTER: &str = "precedent.DeadLetter";
    /// The input is poison (fails the queue's field requirements, or a handler said so):
    /// `input` role; fields `queue`, `reason`, `at`.
    pub const POISON: &str = "precedent.Poison";
    /// A dead letter or poison entry was sent back to the queue with a fresh retry
    /// budget: `entry` role (the DeadLetter or Poison fact); fields `queue`, `at`.
    pub const REDRIVE: &str = "precedent.Redrive";
    /// The input was given up for good: `input` role; fields `queue`, `reason`, `at`.
    pub const DISCARD: &str = "precedent.Discard";
    /// An at-most-once queue handed the input out: `input` role; fields `queue`, `at`.
    pub const DELIVERED: &str = "precedent.Delivered";
    /// The role by which the facts above name the input.
    pub const INPUT_ROLE: &str = "input";
    /// The role by which a redrive names its dead letter or poison entry.
    pub const ENTRY_ROLE: &str = "entry";
}

/// How a queue's inputs are delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Semantics {
    /// Delivered until completed; a crashed handler's input is handed out again once its
    /// lease expires. The default.
    #[default]
    AtLeastOnce,
    /// Marked delivered in the claim transaction: never handed out twice, lost if the
    /// handler fails. For work where loss is acceptable.
    AtMostOnce,
}

/// Which inputs may be handed out at the same time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Ordering {
    /// An input is not offered while one of its ancestors is an unfinished input of the
    /// same queue; unrelated inputs are offered in parallel. The default.
    #[default]
    Causal,
    /// Every pending input is offered, in arrival order, regardless of ancestry.
    None,
}

/// One completion rule: the input is done once a fact of `type_name` names it through
/// `role`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    /// The completing fact's type.
    pub type_name: String,
    /// The role through which it names the input.
    pub role: String,
}

/// Retry policy for transient failures: exponential backoff with full jitter, bounded by
/// attempts and by age.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Most deliveries of one input before it is dead-lettered.
    pub max_attempts: u32,
    /// Longest time from the first attempt after which a failure dead-letters, in ms.
    pub max_age_ms: i64,
    /// Backoff before retry n (1-based) is uniform in [0, min(cap, base * 2^(n-1))], in ms.
    pub backoff_base_ms: i64,
    /// Upper bound of one backoff, in ms.
    pub backoff_cap_ms: i64,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 10,
            max_age_ms: 30 * 60 * 1000,
            backoff_base_ms: 1000,
            backoff_cap_ms: 5 * 60 * 1000,
        }
    }
}

/// Alert thresholds: [`crate::Store::queue_check`] reports each one breached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alerts {
    /// Alert when more than this many inputs are dead-lettered. Default 0: any dead letter.
    pub max_dead: u64,
    /// Alert when more than this many inputs are poison. Default 0.
    pub max_poison: u64,
    /// Alert when the oldest ready input has waited longer than this, in ms. Default 5 min.
    pub max_ready_age_ms: i64,
    /// Alert when more than this many inputs wait (ready, delayed, leased or blocked).
    /// Default: no depth alert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u64>,
}

impl Default for Alerts {
    fn default() -> Alerts {
        Alerts {
            max_dead: 0,
            max_poison: 0,
            max_ready_age_ms: 5 * 60 * 1000,
            max_depth: None,
        }
    }
}

/// The kind a required field's value must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldKind {
    /// Present, any value.
    Any,
    /// null.
    Null,
    /// true or false.
    Bool,
    /// An integer.
    Integer,
    /// A float.
    Float,
    /// An integer or a float.
    Number,
    /// Text.
    Text,
    /// Bytes.
    Bytes,
    /// An array.
    Array,
    /// A map.
    Map,
}

impl FieldKind {
    /// Whether `v` is of this kind.
    pub fn admits(self, v: &Value) -> bool {
        matches!(
            (self, v),
            (FieldKind::Any, _)
                | (FieldKind::Null, Value::Null)
                | (FieldKind::Bool, Value::Bool(_))
                | (FieldKind::Integer, Value::Integer(_))
                | (FieldKind::Float, Value::Float(_))
                | (FieldKind::Number, Value::Integer(_) | Value::Float(_))
                | (FieldKind::Text, Value::Text(_))
                | (FieldKind::Bytes, Value::Bytes(_))
                | (FieldKind::Array, Value::Array(_))
                | (FieldKind::Map, Value::Map(_))
        )
    }
}

/// A field an input must carry, or it is poison.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldRequirement {
    /// The field name.
    pub name: String,
    /// The kind its value must have.
    pub kind: FieldKind,
}

/// A queue declaration, persisted in the database.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSpec {
    /// The queue's name.
    pub name: String,
    /// The input fact type.
    pub input_type: String,
    /// If set, only inputs that name this fact as a direct predecessor (any role).
    #[serde(default)]
    pub scope: Option<FactHash>,
    /// Completion rules; at least one.
    pub completions: Vec<Completion>,
    /// Delivery semantics.
    #[serde(default)]
    pub semantics: Semantics,
    /// Retry policy.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// Lease duration in ms. Default 30 s.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: i64,
    /// Ordering.
    #[serde(default)]
    pub ordering: Ordering,
    /// Fields an input must carry; an input without them is poison.
    #[serde(default)]
    pub required_fields: Vec<FieldRequirement>,
    /// Alert thresholds.
    #[serde(default)]
    pub alerts: Alerts,
    /// An integer field of the input: higher is handed out first among the inputs
    /// claimable at once (causal ordering still holds). Missing: priority 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_field: Option<String>,
    /// A field of the input holding a time (RFC 3339 text or integer ms since the epoch)
    /// before which it is not handed out. Missing: no schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before_field: Option<String>,
    /// Most live leases on this queue at once, across every worker and process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_leased: Option<u64>,
    /// Most inputs handed out per period, across every worker and process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateLimit>,
    /// Only facts released after this release sequence number are inputs: set by
    /// [`crate::Store::declare_queue_from_now`] to the last one released then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_seq: Option<i64>,
}

fn default_lease_ms() -> i64 {
    30_000
}

impl QueueSpec {
    /// Whether `fact` completes `input` under one of the queue's completion rules: it is
    /// of a rule's type and names `input` through the rule's role.
    pub fn completes(&self, fact: &Fact, input: &FactHash) -> bool {
        self.completions.iter().any(|c| {
            fact.type_name() == c.type_name
                && (fact.predecessors())
                    .get(&c.role)
                    .is_some_and(|set| set.contains(input))
        })
    }

    /// A spec with the documented defaults: at-least-once, causal, 30 s lease, 10 attempts
    /// within 30 minutes, backoff from 1 s capped at 5 min with full jitter, alert on any
    /// dead letter or poison and on a ready input older than 5 minutes.
    pub fn new(name: &str, input_type: &str, completions: Vec<Completion>) -> QueueSpec {
        QueueSpec {
            name: name.to_string(),
            input_type: input_type.to_string(),
            scope: None,
            completions,
            semantics: Semantics::default(),
            retry: RetryPolicy::default(),
            lease_ms: default_lease_ms(),
            ordering: Ordering::default(),
            required_fields: Vec::new(),
            alerts: Alerts::default(),
            priority_field: None,
            not_before_field: None,
            max_leased: None,
            rate: None,
            after_seq: None,
        }
    }

    /// Checks the spec: names non-empty, at least one completion rule, positive durations.
    ///
    /// # Errors
    /// A description of the first problem.
    pub fn check(&self) -> Result<(), String> {
        if self.name.is_empty() || self.name.len() > 255 {
            return Err("queue name must be 1 to 255 bytes".into());
        }
        if self.input_type.is_empty() {
            return Err("input type is empty".into());
        }
        if self.completions.is_empty() {
            return Err("a queue needs at least one completion rule (TYPE.ROLE)".into());
        }
        if self
            .completions
            .iter()
            .any(|c| c.type_name.is_empty() || c.role.is_empty())
        {
            return Err("a completion rule needs a type and a role".into());
        }
        if self.lease_ms <= 0 {
            return Err("lease must be positive".into());
        }
        let r = &self.retry;
        if r.max_attempts == 0
            || r.max_age_ms <= 0
            || r.backoff_base_ms < 0
            || r.backoff_cap_ms < r.backoff_base_ms
        {
            return Err(
                "retry policy needs max_attempts >= 1, max_age > 0 and 0 <= base <= cap".into(),
            );
        }
        if self.max_leased == Some(0) {
            return Err("max leased must be at least 1".into());
        }
        if self.max_leased.is_some() && self.semantics == Semantics::AtMostOnce {
            // An at-most-once input ends when it is handed out (its delivery fact is
            // written in the claim's transaction), so no live lease is left to count:
            // the limit would let any number of handlers run at once.
            return Err(
                "max leased cannot limit an at-most-once queue: its inputs end when they are \
                 handed out, so no lease is left to count (a rate limit can pace it)"
                    .into(),
            );
        }
        if self.rate.is_some_and(|r| r.count == 0 || r.per_ms <= 0) {
            return Err("a rate limit needs at least 1 per a positive period".into());
        }
        Ok(())
    }

    /// Whether `fact` is an input of this queue (type and scope; requirements aside).
    pub fn is_input(&self, fact: &Fact) -> bool {
        fact.type_name() == self.input_type
            && self
                .scope
                .is_none_or(|s| fact.predecessors().values().any(|set| set.contains(&s)))
    }

    /// The first unmet field requirement of `fact`, as a poison reason.
    pub fn unmet_requirement(&self, fact: &Fact) -> Option<String> {
        self.required_fields
            .iter()
            .find_map(|r| match fact.field(&r.name) {
                None => Some(format!("missing required field {:?}", r.name)),
                Some(v) if !r.kind.admits(v) => {
                    Some(format!("field {:?} is not of kind {:?}", r.name, r.kind))
                }
                Some(_) => None,
            })
    }

    /// The backoff before the next attempt after `attempts` deliveries, given a uniform
    /// random number in [0, 1): full jitter over min(cap, base * 2^(attempts-1)).
    pub fn backoff_ms(&self, attempts: u32, unit: f64) -> i64 {
        let exp = attempts.saturating_sub(1).min(40);
        let ceiling = (self.retry.backoff_base_ms as f64 * 2f64.powi(exp as i32))
            .min(self.retry.backoff_cap_ms as f64);
        (ceiling * unit.clamp(0.0, 1.0)) as i64
    }
}

/// Where an input stands in its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ItemState {
    /// Can be claimed now (or after its backoff: see [`ItemInfo::available_at_ms`]).
    Ready,
    /// Claimed under a live lease. An input whose lease expired is shown as
    /// [`ItemState::Ready`] (by [`crate::Store::queue_items`], [`crate::Store::queue_item`]
    /// and [`QueueStats::ready`] alike): a claim takes it again.
    Leased,
    /// Waiting for an unfinished ancestor input of the same queue.
    Blocked,
    /// Dead-lettered: out of retries, or failed permanently.
    Dead,
    /// Poison: never retried until redriven.
    Poison,
}

/// The stored code of an item state as a string literal, for SQL written with `concat!`
/// (so statements stay static text, prepared once): `state_code!(Leased)` is `"1"`. It
/// mirrors [`ItemState::code`]; a test holds the two equal.
macro_rules! state_code {
    (Ready) => {
        "0"
    };
    (Leased) => {
        "1"
    };
    (Blocked) => {
        "2"
    };
    (Dead) => {
        "3"
    };
    (Poison) => {
        "4"
    };
}
pub(crate) use state_code;

impl ItemState {
    /// The code stored in `queue_item.state` (see `schema/002_queues.sql`).
    pub(crate) fn code(self) -> i64 {
        match self {
            ItemState::Ready => 0,
            ItemState::Leased => 1,
            ItemState::Blocked => 2,
            ItemState::Dead => 3,
            ItemState::Poison => 4,
        }
    }

    pub(crate) fn from_code(code: i64) -> Option<ItemState> {
        Some(match code {
            0 => ItemState::Ready,
            1 => ItemState::Leased,
            2 => ItemState::Blocked,
            3 => ItemState::Dead,
            4 => ItemState::Poison,
            _ => return None,
        })
    }
}

/// One unfinished input of a queue, for listing and inspection.
#[derive(Clone, Debug, Serialize)]
pub struct ItemInfo {
    /// The input fact's hash.
    pub input: FactHash,
    /// Its state.
    pub state: ItemState,
    /// Deliveries so far.
    pub attempts: u32,
    /// When it was first delivered, ms since the epoch.
    pub first_attempt_at_ms: Option<i64>,
    /// When it can next be claimed (ready: after backoff; leased: when the lease expires).
    pub available_at_ms: Option<i64>,
    /// The last failure reason (or the dead-letter / poison reason).
    pub last_error: Option<String>,
    /// The dead letter or poison fact, for dead and poison inputs.
    pub entry: Option<FactHash>,
    /// The unfinished ancestor inputs it waits for, with their state (blocked inputs).
    pub blocked_by: Vec<(FactHash, ItemState)>,
}

impl ItemInfo {
    /// A one-line human description, e.g. `blocked by 3f9a…, dead-lettered`.
    pub fn describe(&self) -> String {
        match self.state {
            ItemState::Blocked => {
                let parts: Vec<String> = self
                    .blocked_by
                    .iter()
                    .map(|(h, s)| match s {
                        ItemState::Dead => format!("blocked by {h}, dead-lettered"),
                        ItemState::Poison => format!("blocked by {h}, poison"),
                        _ => format!("blocked by {h}"),
                    })
                    .collect();
                parts.join("; ")
            }
            ItemState::Dead => format!(
                "dead-lettered: {}",
                self.last_error.as_deref().unwrap_or("")
            ),
            ItemState::Poison => format!("poison: {}", self.last_error.as_deref().unwrap_or("")),
            ItemState::Leased => "leased".into(),
            ItemState::Ready => "ready".into(),
        }
    }
}

/// A claimed input. It must be completed ([`crate::Store::complete`]), failed
/// ([`crate::Store::fail`]) or given back ([`crate::Store::release`]); if it is simply
/// dropped, the lease expires and the input is handed out again with the attempt counted.
#[must_use = "a lease must be completed, failed or released"]
#[derive(Clone, Debug)]
pub struct Lease {
    /// The queue's name.
    pub queue: String,
    /// The input fact.
    pub input: Fact,
    /// Which delivery this is (1 for the first).
    pub attempt: u32,
    /// When the lease expires unless extended, ms since the epoch.
    pub expires_at_ms: i64,
    pub(crate) queue_id: i64,
    pub(crate) seq: i64,
    /// The input as claimed, which `input` (public, so changeable) may no longer be: what
    /// the store is told is released as `seq`.
    pub(crate) claimed: Fact,
    pub(crate) token: i64,
    /// Shared by the leases of one claim.
    pub(crate) completion: std::sync::Arc<Completion>,
}

impl Lease {
    /// A lease as a claim handed it out, rebuilt from its parts (a remote worker's lease
    /// id, `sync::server`). It is only as good as `token`: every use of it checks that the
    /// item row still carries that token, so a stale or made-up one is refused as lost.
    #[cfg(feature = "server")]
    pub(crate) fn rebuilt(
        queue: &str,
        (queue_id, seq, token): (i64, i64, i64),
        input: Fact,
        completion: Completion,
    ) -> Lease {
        Lease {
            queue: queue.to_string(),
            claimed: input.clone(),
            input,
            attempt: 0,
            expires_at_ms: 0,
            queue_id,
            seq,
            token,
            completion: std::sync::Arc::new(completion),
        }
    }

    /// The parts [`Lease::rebuilt`] takes back: queue id, input seq and lease token.
    #[cfg(feature = "server")]
    pub(crate) fn parts(&self) -> (i64, i64, i64) {
        (self.queue_id, self.seq, self.token)
    }

    /// A builder for a fact that completes this input under the queue's first completion
    /// rule: its type, with the input under its role. Add fields and build it.
    pub fn completion(&self) -> FactBuilder {
        Fact::builder(self.completion.type_name.clone())
            .predecessor(self.completion.role.clone(), self.input.hash())
    }
}

/// How a handler failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Might work later: retry after backoff, until the budget runs out.
    Transient(String),
    /// Will not work: dead-letter now.
    Permanent(String),
    /// The input itself is bad: poison, never retried until redriven.
    Poison(String),
    /// The handler ran past its time limit: retried as a transient failure, and counted
    /// as a timeout.
    TimedOut {
        /// What ran out, e.g. `timed out after 30s`.
        reason: String,
    },
}

impl Failure {
    /// The reason given, whatever the kind.
    pub fn reason(&self) -> &str {
        match self {
            Failure::Transient(r) | Failure::Permanent(r) | Failure::Poison(r) => r,
            Failure::TimedOut { reason } => reason,
        }
    }
}

/// What [`crate::Store::fail`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailOutcome {
    /// The input will be offered again at this time (ms since the epoch).
    Retry {
        /// When it becomes claimable again.
        at_ms: i64,
    },
    /// The input was dead-lettered; the dead-letter fact.
    DeadLettered(FactHash),
    /// The input was put on the poison list; the poison fact.
    Poisoned(FactHash),
    /// At-most-once queue: the input was already marked delivered; nothing to do.
    Dropped,
}

/// Counts and ages for one queue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueStats {
    /// The queue's name.
    pub queue: String,
    /// Claimable now (expired leases included, as [`crate::Store::queue_items`] shows them).
    pub ready: u64,
    /// Claimed under a live lease.
    pub leased: u64,
    /// Not claimable yet: backing off after a failure, or scheduled for later.
    pub delayed: u64,
    /// Waiting for an unfinished ancestor input.
    pub blocked: u64,
    /// Dead-lettered.
    pub dead: u64,
    /// Poison.
    pub poison: u64,
    /// Completed since the queue was declared.
    pub completed: u64,
    /// Discarded since the queue was declared.
    pub discarded: u64,
    /// At-most-once inputs whose handler failed after delivery, since the queue was
    /// declared: lost, and not counted as completed.
    pub dropped: u64,
    /// Failed attempts (every kind) since the queue was declared.
    pub failed: u64,
    /// Transient failures and timeouts given another attempt since the queue was declared.
    pub retried: u64,
    /// Claims of an input whose earlier lease had expired, since the queue was declared.
    pub redelivered: u64,
    /// Attempts that timed out ([`Failure::TimedOut`]) since the queue was declared.
    pub timed_out: u64,
    /// Inputs waiting: ready, delayed, leased and blocked.
    pub depth: u64,
    /// The depth alert threshold ([`Alerts::max_depth`]), if set.
    pub depth_alert: Option<u64>,
    /// Age of the oldest claimable input in ms (0 when none).
    pub oldest_ready_ms: i64,
    /// Completions in the last 5 minutes.
    pub completed_5m: u64,
    /// Failures (transient, permanent, poison) in the last 5 minutes.
    pub failed_5m: u64,
}

/// A breached alert threshold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Breach {
    /// The queue.
    pub queue: String,
    /// Which alert: `dead`, `poison`, `ready-age` or `depth`.
    pub alert: &'static str,
    /// The measured value.
    pub value: i64,
    /// The threshold it exceeded.
    pub threshold: i64,
}

impl std::fmt::Display for Breach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "queue {}: {} is {}, over the threshold of {}",
            self.queue, self.alert, self.value, self.threshold
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_the_cap_and_jitters_below_it() {
        let spec = QueueSpec::new("q", "T", vec![]);
        assert_eq!(spec.backoff_ms(1, 0.999_999), 999);
        assert_eq!(spec.backoff_ms(3, 0.5), 2000);
        assert_eq!(spec.backoff_ms(30, 1.0), 5 * 60 * 1000);
        assert_eq!(spec.backoff_ms(30, 0.0), 0);
    }

    #[test]
    fn state_codes_in_sql_are_the_stored_codes() {
        let in_sql = [
            (ItemState::Ready, state_code!(Ready)),
            (ItemState::Leased, state_code!(Leased)),
            (ItemState::Blocked, state_code!(Blocked)),
            (ItemState::Dead, state_code!(Dead)),
            (ItemState::Poison, state_code!(Poison)),
        ];
        for (state, text) in in_sql {
            assert_eq!(text.parse::<i64>().unwrap(), state.code(), "{state:?}");
            assert_eq!(ItemState::from_code(state.code()), Some(state));
        }
    }

    #[test]
    fn requirements_name_the_field() {
        let mut spec = QueueSpec::new("q", "T", vec![]);
        spec.required_fields.push(FieldRequirement {
            name: "id".into(),
            kind: FieldKind::Integer,
        });
        let bad = Fact::builder("T").field("id", "x").build().unwrap();
        let good = Fact::builder("T").field("id", 1).build().unwrap();
        assert!(spec.unmet_requirement(&bad).unwrap().contains("\"id\""));
        assert!(spec.unmet_requirement(&good).is_none());
        assert!(
            spec.unmet_requirement(&Fact::builder("T").build().unwrap())
                .unwrap()
                .contains("missing")
        );
    }
}

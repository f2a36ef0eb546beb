//! The JSON bodies of the queue endpoints (`docs/protocol.md`, "Queues over HTTP"), shared
//! by the server and the client.
//!
//! Every endpoint but `claim` takes a batch, `{"leases": [ITEM, ...]}`, and answers one
//! [`LeaseResult`] per item, in order, in `{"results": [...]}`. Facts travel in the JSON
//! export form (`crate::json`), kept as raw JSON text here so that their numbers are read
//! by the fact parser and never rounded by a generic one.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The path prefix of a queue's endpoints: `/v1/queues/NAME/ACTION`.
pub const PATH_QUEUE_ACTION: &str = "/v1/queues/{queue}/{action}";

/// The longest a claim may wait for work, in ms, whatever it asks (the server's long-poll
/// cap applies too).
pub const MAX_CLAIM_WAIT_MS: u64 = 30_000;

/// The most inputs one claim hands out.
pub const MAX_CLAIM: u64 = 10_000;

/// The body of `POST /v1/queues/NAME/claim`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// Most inputs to claim, 1 to [`MAX_CLAIM`]. Default 1.
    #[serde(default = "one")]
    pub n: u64,
    /// How long to wait for a first input when none is ready, in ms. Default 0.
    #[serde(default)]
    pub wait_ms: u64,
}

fn one() -> u64 {
    1
}

/// The answer to a claim.
#[derive(Debug, Serialize, Deserialize)]
pub struct ClaimAnswer {
    /// The leases taken, oldest input first; empty when nothing was ready in time.
    pub leases: Vec<LeaseBody>,
}

/// The rule by which a fact completes an input: a fact of `type` naming the input under
/// `role`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CompletionRule {
    /// The completing fact's type.
    #[serde(rename = "type")]
    pub type_name: String,
    /// The role through which it names the input.
    pub role: String,
}

/// One lease handed out by a claim.
#[derive(Debug, Serialize, Deserialize)]
pub struct LeaseBody {
    /// The lease id: opaque text, valid only with the token that claimed it.
    pub lease: String,
    /// The queue.
    pub queue: String,
    /// Which delivery this is, 1 for the first.
    pub attempt: u32,
    /// When the lease ends unless extended, ms since the epoch (the server's clock).
    pub expires_at_ms: i64,
    /// The queue's lease duration in ms: extend before it has passed.
    pub lease_ms: i64,
    /// The input fact in the JSON export form, with its `"hash"`.
    pub input: Box<RawValue>,
    /// The queue's first completion rule.
    pub completion: CompletionRule,
    /// Every completion rule of the queue, the first one first. A hub that sends them
    /// accepts [`CompleteItem::otherwise`] and `release`; one that predates them sends
    /// none (read as empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub completions: Vec<CompletionRule>,
}

/// A batch of lease items: the body of `complete`, `extend`, `release`, `fail` and
/// `poison`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batch<T> {
    /// The items, each naming its lease.
    pub leases: Vec<T>,
}

/// One completion: the lease and the facts stored with it, one of which must complete the
/// input.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteItem {
    /// The lease id.
    pub lease: String,
    /// Facts in the JSON form; a predecessor may be a hash prefix of a stored fact or an
    /// inline fact, as in `precedent insert`.
    #[serde(default)]
    pub facts: Vec<Box<RawValue>>,
    /// A fact stored with them only when none of them completes the input under any of
    /// the queue's completion rules (prefixes and inline predecessors resolved), as the
    /// local worker adds its own completing fact. Not sent when absent, so that a hub
    /// that predates the field accepts every other completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otherwise: Option<Box<RawValue>>,
}

/// One lease to extend.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtendItem {
    /// The lease id.
    pub lease: String,
}

/// One lease to give back unstarted, its attempt not counted.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseItem {
    /// The lease id.
    pub lease: String,
}

/// One failed attempt.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailItem {
    /// The lease id.
    pub lease: String,
    /// Why, for the item's `last_error` and a dead letter.
    pub reason: String,
    /// Dead-letter now instead of retrying after the queue's backoff. Default false.
    #[serde(default)]
    pub permanent: bool,
    /// A transient failure: offer the input again no sooner than this many ms from now
    /// (or after the queue's backoff, if that is later). Default none: the backoff alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The attempt ran past the worker's time limit: a transient failure, counted in the
    /// queue's `timed_out`. Default false (and not sent when false, so that a hub that
    /// predates the field accepts every other failure).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
}

/// One input declared poison.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoisonItem {
    /// The lease id.
    pub lease: String,
    /// Why the input is bad.
    pub reason: String,
}

/// The answer to a batch: one result per item, in the order of the request.
#[derive(Debug, Serialize, Deserialize)]
pub struct Results {
    /// The results.
    pub results: Vec<LeaseResult>,
}

/// What became of one item of a batch.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LeaseResult {
    /// The lease id, as sent.
    pub lease: String,
    /// Whether the item took effect.
    pub ok: bool,
    /// When it did not: `lease_lost`, `not_completed` or `refused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it did not: a sentence for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `extend`: the lease's new end, ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    /// `fail` and `poison`: `retry`, `dead`, `poison` or `dropped`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// `fail` with outcome `retry`: when the input is offered again, ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at_ms: Option<i64>,
    /// `fail` and `poison` with outcome `dead` or `poison`: the dead letter or poison fact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
    /// `complete`: how many facts were stored with the completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<u64>,
}

impl LeaseResult {
    /// A result that took effect.
    pub fn ok(lease: &str) -> LeaseResult {
        LeaseResult {
            lease: lease.to_string(),
            ok: true,
            ..LeaseResult::default()
        }
    }

    /// A result that did not.
    pub fn refused(lease: &str, error: &str, message: String) -> LeaseResult {
        LeaseResult {
            lease: lease.to_string(),
            ok: false,
            error: Some(error.to_string()),
            message: Some(message),
            ..LeaseResult::default()
        }
    }
}

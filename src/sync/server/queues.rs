//! `POST /v1/queues/NAME/ACTION`: work queues for workers with no database of their own
//! (`docs/protocol.md`, "Queues over HTTP").
//!
//! Each action is the library's own call on the served store: `claim` is
//! [`Store::claim`] (with a long-poll wait, woken by the store's wake seam), `complete`
//! is [`Store::complete_batch`] with the worker's facts stored by each lease's handler, so
//! a completion and its effects commit together or not at all, exactly as locally (a
//! completing fact of the worker's own, `otherwise`, is added only when none of its
//! facts completes the input under any of the queue's rules, as the local worker does);
//! `extend` is [`Store::extend`], `release` is [`crate::store::Writer::release`] and
//! `fail` and `poison` are [`crate::store::Writer::fail`], each for the whole batch in one
//! transaction.
//!
//! A lease id is stateless: the item's queue id, input seq and lease token, and a MAC of
//! them keyed by the bearer token that claimed it (`LeaseKey`). So it survives a server
//! restart, and any other token's use of it is refused 403 before the store is touched.
//! The lease token, random and checked against the item row by every call, is what makes
//! it live.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::app::{App, Failure};
use super::routes::{bad_request, json_response, read_body, require_content_type, too_many};
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::json::{self, FactSpec, JsonValue};
use crate::queue::{Completion, FailOutcome, Failure as Attempt, Lease};
use crate::store::Store;
use crate::sync::auth::Access;
use crate::sync::queue_wire::{
    Batch, ClaimAnswer, ClaimRequest, CompleteItem, CompletionRule, ExtendItem, FailItem,
    LeaseBody, LeaseResult, MAX_CLAIM, MAX_CLAIM_WAIT_MS, PoisonItem, ReleaseItem, Results,
};
use crate::sync::wire;

/// The actions, in the order the 404 for an unknown one lists them.
const ACTIONS: [&str; 6] = ["claim", "complete", "extend", "release", "fail", "poison"];

pub(super) async fn action(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path((queue, action)): Path<(String, String)>,
    body: Body,
) -> Result<Response, Failure> {
    if !ACTIONS.contains(&action.as_str()) {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "no queue action {action:?}; the actions are {}",
                ACTIONS.join(", ")
            ),
        ));
    }
    let key = authorize_work(&app, &headers, &queue)?;
    require_content_type(&headers, wire::JSON)?;
    let bytes = read_body(&app, body).await?;
    let results = match action.as_str() {
        "claim" => return claim(app, queue, key, &bytes).await,
        "complete" => complete(&app, queue, &key, &bytes).await?,
        "extend" => extend(&app, queue, &key, &bytes).await?,
        "release" => release(&app, queue, &key, &bytes).await?,
        "fail" => {
            let b: Batch<FailItem> = parse(&bytes, "fail", FAIL_SHAPE)?;
            let items = b.leases.into_iter().map(|i| {
                let f = if i.permanent {
                    Attempt::Permanent(i.reason)
                } else if i.timed_out {
                    Attempt::TimedOut { reason: i.reason }
                } else {
                    Attempt::Transient(i.reason)
                };
                let after = i.retry_after_ms.map(|ms| ms.min(i64::MAX as u64) as i64);
                (i.lease, f, after)
            });
            fail(&app, queue, &key, items.collect()).await?
        }
        _ => {
            let b: Batch<PoisonItem> = parse(&bytes, "poison", POISON_SHAPE)?;
            let items = b.leases.into_iter();
            let items = items.map(|i| (i.lease, Attempt::Poison(i.reason), None));
            fail(&app, queue, &key, items.collect()).await?
        }
    };
    Ok(json_response(&Results { results }))
}

const CLAIM_SHAPE: &str = r#"{"n": N, "wait_ms": MS}"#;
const COMPLETE_SHAPE: &str =
    r#"{"leases": [{"lease": ID, "facts": [FACT, ...], "otherwise": FACT}, ...]}"#;
const EXTEND_SHAPE: &str = r#"{"leases": [{"lease": ID}, ...]}"#;
const RELEASE_SHAPE: &str = r#"{"leases": [{"lease": ID}, ...]}"#;
const FAIL_SHAPE: &str = r#"{"leases": [{"lease": ID, "reason": TEXT, "permanent": BOOL, "retry_after_ms": MS, "timed_out": BOOL}, ...]}"#;
const POISON_SHAPE: &str = r#"{"leases": [{"lease": ID, "reason": TEXT}, ...]}"#;

/// Parses a body, or 400 saying what shape it should have and where it went wrong.
fn parse<T: DeserializeOwned>(bytes: &[u8], what: &str, shape: &str) -> Result<T, Failure> {
    serde_json::from_slice(bytes)
        .map_err(|e| bad_request(format!("{what} body is not {shape}: {e}")))
}

/// The key that binds leases to the caller's token, if the caller may work on `queue`.
fn authorize_work(app: &App, headers: &HeaderMap, queue: &str) -> Result<LeaseKey, Failure> {
    let auth = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    match app.tokens.check(auth) {
        Access::Open => Ok(LeaseKey::new(b"")),
        Access::Unauthorized => Err(Failure::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or unknown bearer token",
        )),
        Access::Granted(g) if g.may_work(queue) => Ok(LeaseKey::new(g.token.as_bytes())),
        Access::Granted(g) => Err(Failure::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("token {:?} may not work on queue {queue:?}", g.name),
        )),
    }
}

/// The item a lease id names: queue id, input seq, lease token.
type Parts = (i64, i64, i64);

/// Signs and checks lease ids for one bearer token.
struct LeaseKey([u8; 32]);

impl LeaseKey {
    fn new(secret: &[u8]) -> LeaseKey {
        LeaseKey(blake3::derive_key("precedent 1 remote lease id", secret))
    }

    fn mac(&self, queue: &str, (q, seq, token): Parts) -> [u8; 16] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(queue.as_bytes()).update(&[0]);
        for n in [q, seq, token] {
            h.update(&n.to_le_bytes());
        }
        let mut out = [0; 16];
        out.copy_from_slice(&h.finalize().as_bytes()[..16]);
        out
    }

    /// `QUEUE_ID.SEQ.TOKEN.MAC`: three hex numbers and 32 hex digits.
    fn id(&self, queue: &str, parts: Parts) -> String {
        let (q, seq, token) = parts;
        let mac = hex::encode(self.mac(queue, parts));
        format!("{q:x}.{seq:x}.{:x}.{mac}", token as u64)
    }

    /// The parts of a lease id `at` (a JSON path, for the message): 400 for text that is
    /// not a lease id, 403 for one signed for another token (or another queue).
    fn open(&self, queue: &str, id: &str, at: &str) -> Result<Parts, Failure> {
        let bad = || bad_request(format!("{at}: {id:?} is not a lease id"));
        let mut it = id.split('.');
        let mut num = || -> Option<u64> { u64::from_str_radix(it.next()?, 16).ok() };
        let (q, seq, token) = (num(), num(), num());
        let (Some(q), Some(seq), Some(token)) = (q, seq, token) else {
            return Err(bad());
        };
        let mut mac = [0u8; 16];
        match it.next().map(|m| hex::decode_to_slice(m, &mut mac)) {
            Some(Ok(())) if it.next().is_none() => {}
            _ => return Err(bad()),
        }
        let q = i64::try_from(q).map_err(|_| bad())?;
        let seq = i64::try_from(seq).map_err(|_| bad())?;
        let parts = (q, seq, token as i64);
        let want = self.mac(queue, parts);
        // In constant time, so that a guess learns nothing from how long a refusal took.
        if want.iter().zip(&mac).fold(0, |acc, (a, b)| acc | (a ^ b)) != 0 {
            return Err(Failure::new(
                StatusCode::FORBIDDEN,
                "lease_not_yours",
                format!("{at}: lease {id:?} was not taken on queue {queue:?} with this token"),
            ));
        }
        Ok(parts)
    }
}

async fn claim(
    app: Arc<App>,
    queue: String,
    key: LeaseKey,
    bytes: &[u8],
) -> Result<Response, Failure> {
    let req: ClaimRequest = parse(bytes, "claim", CLAIM_SHAPE)?;
    if req.n == 0 || req.n > MAX_CLAIM {
        return Err(bad_request(format!(
            "n must be 1 to {MAX_CLAIM}, not {}",
            req.n
        )));
    }
    let wait = Duration::from_millis(req.wait_ms.min(MAX_CLAIM_WAIT_MS));
    let deadline = Instant::now() + wait.min(app.limits.long_poll_cap());
    let mut shutdown = app.shutdown.clone();
    let queue = Arc::new(queue);
    loop {
        let (q, n) = (queue.clone(), req.n as usize);
        let (leases, mark, lease_ms, rules) = app
            .with_store(move |s| {
                // Taken before the claim: a release after it wakes the wait below.
                let mark = s.wake_mark();
                let spec = s.queue(&q)?;
                let leases = s.claim(&q, n)?;
                Ok((leases, mark, spec.lease_ms, spec.completions))
            })
            .await?;
        let now = Instant::now();
        if !leases.is_empty() || now >= deadline || *shutdown.borrow() {
            let leases = leases
                .iter()
                .map(|l| lease_body(&key, l, lease_ms, &rules))
                .collect();
            return Ok(json_response(&ClaimAnswer { leases }));
        }
        // Woken by a commit through the served store (and, on PostgreSQL, by any
        // process's); bounded by the poll interval for other processes' SQLite commits.
        let nap = app.poll.min(deadline - now);
        let a = app.clone();
        let waited = tokio::task::spawn_blocking(move || a.store.wait_for_wake(mark, nap));
        tokio::select! {
            _ = waited => {}
            _ = shutdown.changed() => {}
        }
    }
}

fn lease_body(key: &LeaseKey, l: &Lease, lease_ms: i64, rules: &[Completion]) -> LeaseBody {
    let input = json::to_json(&l.input).to_string();
    let wire = |c: &Completion| CompletionRule {
        type_name: c.type_name.clone(),
        role: c.role.clone(),
    };
    LeaseBody {
        lease: key.id(&l.queue, l.parts()),
        queue: l.queue.clone(),
        attempt: l.attempt,
        expires_at_ms: l.expires_at_ms,
        lease_ms,
        input: RawValue::from_string(input).expect("the JSON form is JSON"),
        completion: wire(&rules[0]),
        completions: rules.iter().map(wire).collect(),
    }
}

/// Checks a batch's size and opens its lease ids, refusing a lease named twice.
fn open_all<'a>(
    app: &App,
    queue: &str,
    key: &LeaseKey,
    ids: impl ExactSizeIterator<Item = &'a str>,
) -> Result<Vec<Parts>, Failure> {
    let max = app.limits.max_facts_per_request;
    if ids.len() as u64 > max {
        return Err(too_many(ids.len() as u64, max, "leases"));
    }
    let mut seen = HashMap::new();
    let mut out = Vec::with_capacity(ids.len());
    for (i, id) in ids.enumerate() {
        let parts = key.open(queue, id, &format!("leases[{i}].lease"))?;
        if let Some(first) = seen.insert(parts.1, i) {
            return Err(bad_request(format!(
                "leases[{i}].lease names the input of leases[{first}] again"
            )));
        }
        out.push(parts);
    }
    Ok(out)
}

/// The leases of a batch, rebuilt: each with its input read back by seq, or `None` for
/// one whose input is not a released fact here (a lease of another database).
fn rebuild(store: &Store, queue: &str, parts: &[Parts]) -> Result<Vec<Option<Lease>>> {
    let rule = store.queue(queue)?.completions[0].clone();
    let seqs: Vec<i64> = parts.iter().map(|p| p.1).collect();
    let mut inputs = HashMap::with_capacity(seqs.len());
    store.for_each_at(&seqs, |seq, _, bytes| {
        inputs.insert(seq, Fact::from_canonical(bytes)?);
        Ok(())
    })?;
    Ok(parts
        .iter()
        .map(|&p| {
            let input = inputs.remove(&p.1)?;
            Some(Lease::rebuilt(queue, p, input, rule.clone()))
        })
        .collect())
}

fn lost(id: &str) -> LeaseResult {
    LeaseResult::refused(
        id,
        "lease_lost",
        "the lease is lost: it expired and the input was claimed again, or it ended".into(),
    )
}

/// A lease's refusal in a batch.
fn refusal(id: &str, e: &Error) -> LeaseResult {
    let code = match e {
        Error::LeaseLost { .. } => "lease_lost",
        Error::NotCompleted { .. } => "not_completed",
        _ => "refused",
    };
    LeaseResult::refused(id, code, e.to_string())
}

async fn complete(
    app: &Arc<App>,
    queue: String,
    key: &LeaseKey,
    bytes: &[u8],
) -> Result<Vec<LeaseResult>, Failure> {
    let batch: Batch<CompleteItem> = parse(bytes, "complete", COMPLETE_SHAPE)?;
    let ids: Vec<String> = batch.leases.iter().map(|i| i.lease.clone()).collect();
    let parts = open_all(app, &queue, key, ids.iter().map(String::as_str))?;
    let mut specs = Vec::with_capacity(batch.leases.len());
    let mut otherwise = Vec::with_capacity(batch.leases.len());
    let mut total = 0u64;
    for (i, item) in batch.leases.iter().enumerate() {
        specs.push(fact_specs(i, &item.facts)?);
        let own = item.otherwise.as_ref();
        let path = format!("leases[{i}].otherwise");
        otherwise.push(own.map(|raw| fact_spec(raw, &path)).transpose()?);
        total += item.facts.len() as u64 + u64::from(own.is_some());
    }
    let max = app.limits.max_facts_per_request;
    if total > max {
        return Err(too_many(total, max, "facts"));
    }
    app.with_store(move |s| {
        let spec = s.queue(&queue)?;
        let leases = rebuild(s, &queue, &parts)?;
        let mut results: Vec<Option<LeaseResult>> = vec![None; ids.len()];
        let mut present = Vec::with_capacity(leases.len());
        let mut at = HashMap::with_capacity(leases.len());
        for (i, l) in leases.into_iter().enumerate() {
            match l {
                Some(l) => {
                    at.insert(l.parts().1, i);
                    present.push(l);
                }
                None => results[i] = Some(lost(&ids[i])),
            }
        }
        let mut stored = vec![0u64; ids.len()];
        let done = s.complete_batch(&present, |w, lease| {
            let i = at[&lease.parts().1];
            let input = lease.input.hash();
            stored[i] = 0;
            let mut completes = false;
            for fact_spec in &specs[i] {
                for fact in json::resolve(fact_spec, &mut |p| w.resolve_prefix(p))? {
                    completes |= spec.completes(&fact, &input);
                    w.insert(&fact)?;
                    stored[i] += 1;
                }
            }
            if let Some(own) = otherwise[i].as_ref().filter(|_| !completes) {
                for fact in json::resolve(own, &mut |p| w.resolve_prefix(p))? {
                    w.insert(&fact)?;
                    stored[i] += 1;
                }
            }
            Ok(())
        })?;
        for (lease, r) in present.iter().zip(done) {
            let i = at[&lease.parts().1];
            results[i] = Some(match r {
                Ok(()) => LeaseResult {
                    facts: Some(stored[i]),
                    ..LeaseResult::ok(&ids[i])
                },
                Err(e) => refusal(&ids[i], &e),
            });
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every lease has a result"))
            .collect())
    })
    .await
}

/// The facts of completion `i`, parsed: 400 naming the first bad one by its JSON path.
fn fact_specs(i: usize, facts: &[Box<RawValue>]) -> Result<Vec<FactSpec>, Failure> {
    let mut out = Vec::with_capacity(facts.len());
    for (j, raw) in facts.iter().enumerate() {
        out.push(fact_spec(raw, &format!("leases[{i}].facts[{j}]"))?);
    }
    Ok(out)
}

/// One fact of a body at `path`, parsed: 400 naming where it is bad.
fn fact_spec(raw: &RawValue, path: &str) -> Result<FactSpec, Failure> {
    let value = JsonValue::parse(raw.get()).map_err(|e| bad_request(format!("{path}: {e}")))?;
    json::spec_from_json(&value, path).map_err(|e| bad_request(e.to_string()))
}

async fn extend(
    app: &Arc<App>,
    queue: String,
    key: &LeaseKey,
    bytes: &[u8],
) -> Result<Vec<LeaseResult>, Failure> {
    let batch: Batch<ExtendItem> = parse(bytes, "extend", EXTEND_SHAPE)?;
    let ids: Vec<String> = batch.leases.into_iter().map(|i| i.lease).collect();
    let parts = open_all(app, &queue, key, ids.iter().map(String::as_str))?;
    app.with_store(move |s| {
        let leases = rebuild(s, &queue, &parts)?;
        let mut out = Vec::with_capacity(ids.len());
        for (id, lease) in ids.iter().zip(leases) {
            let Some(lease) = lease else {
                out.push(lost(id));
                continue;
            };
            out.push(match s.extend(&lease) {
                Ok(l) => LeaseResult {
                    expires_at_ms: Some(l.expires_at_ms),
                    ..LeaseResult::ok(id)
                },
                Err(e @ Error::LeaseLost { .. }) => refusal(id, &e),
                Err(e) => return Err(e),
            });
        }
        Ok(out)
    })
    .await
}

/// Gives the leases of a batch back in one transaction, their attempts not counted, as
/// [`Store::release`] does.
async fn release(
    app: &Arc<App>,
    queue: String,
    key: &LeaseKey,
    bytes: &[u8],
) -> Result<Vec<LeaseResult>, Failure> {
    let batch: Batch<ReleaseItem> = parse(bytes, "release", RELEASE_SHAPE)?;
    let ids: Vec<String> = batch.leases.into_iter().map(|i| i.lease).collect();
    let parts = open_all(app, &queue, key, ids.iter().map(String::as_str))?;
    app.with_store(move |s| {
        let leases = rebuild(s, &queue, &parts)?;
        s.write(|w| {
            let mut out = Vec::with_capacity(ids.len());
            for (id, lease) in ids.iter().zip(&leases) {
                let Some(lease) = lease else {
                    out.push(lost(id));
                    continue;
                };
                out.push(match w.release(lease) {
                    Ok(()) => LeaseResult::ok(id),
                    // Found before anything was written for this lease.
                    Err(e @ Error::LeaseLost { .. }) => refusal(id, &e),
                    Err(e) => return Err(e),
                });
            }
            Ok(out)
        })
    })
    .await
}

/// Fails or poisons the leases of a batch in one transaction, a transient failure with a
/// retry delay offered again no sooner than that.
async fn fail(
    app: &Arc<App>,
    queue: String,
    key: &LeaseKey,
    items: Vec<(String, Attempt, Option<i64>)>,
) -> Result<Vec<LeaseResult>, Failure> {
    let parts = open_all(app, &queue, key, items.iter().map(|i| i.0.as_str()))?;
    app.with_store(move |s| {
        let leases = rebuild(s, &queue, &parts)?;
        s.write(|w| {
            let mut out = Vec::with_capacity(items.len());
            for ((id, failure, after), lease) in items.iter().zip(&leases) {
                let Some(lease) = lease else {
                    out.push(lost(id));
                    continue;
                };
                let mut r = LeaseResult::ok(id);
                let outcome = match after {
                    Some(ms) => w.fail_not_before(lease, failure, *ms),
                    None => w.fail(lease, failure),
                };
                match outcome {
                    Ok(FailOutcome::Retry { at_ms }) => {
                        r.outcome = Some("retry".into());
                        r.retry_at_ms = Some(at_ms);
                    }
                    Ok(FailOutcome::DeadLettered(h)) => {
                        r.outcome = Some("dead".into());
                        r.entry = Some(h.to_string());
                    }
                    Ok(FailOutcome::Poisoned(h)) => {
                        r.outcome = Some("poison".into());
                        r.entry = Some(h.to_string());
                    }
                    Ok(FailOutcome::Dropped) => r.outcome = Some("dropped".into()),
                    // Found before anything was written for this lease.
                    Err(e @ Error::LeaseLost { .. }) => r = refusal(id, &e),
                    Err(e) => return Err(e),
                }
                out.push(r);
            }
            Ok(out)
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_open_only_with_their_token_and_queue() {
        let (mine, theirs) = (LeaseKey::new(b"a"), LeaseKey::new(b"b"));
        let parts = (3, 1 << 40, -5);
        let id = mine.id("ship", parts);
        assert_eq!(mine.open("ship", &id, "x").unwrap(), parts);
        assert_eq!(theirs.open("ship", &id, "x").unwrap_err().status, 403);
        assert_eq!(mine.open("bill", &id, "x").unwrap_err().status, 403);
        let tampered = id.replacen("3.", "4.", 1);
        assert_eq!(mine.open("ship", &tampered, "x").unwrap_err().status, 403);
        for bad in ["", "1.2.3", "1.2.3.zz", &format!("{id}.0"), "x.2.3.00"] {
            let e = mine.open("ship", bad, "leases[0].lease").unwrap_err();
            assert_eq!(e.status, 400, "{bad:?}");
            assert!(e.message.starts_with("leases[0].lease: "), "{}", e.message);
        }
    }
}

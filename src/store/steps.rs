//! The steps of an insert that every backend takes the same way, over lookups the backend
//! does in its own SQL: splitting a fact's predecessors into released and missing ones,
//! the predecessors of a held fact being released, a batch's order and its report.

use std::collections::HashMap;

use crate::dag::{self, BuildFactHasher};
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::FactHash;

use super::{BatchReport, InsertOutcome};

/// A released predecessor of a fact: role, hash, seq, type id (what its edge records).
pub(crate) type Pred<'f> = (&'f str, FactHash, i64, i64);

/// A predecessor a fact waits for, with its `held` row id when it is held in this batch.
pub(crate) type Missing = (FactHash, Option<i64>);

/// During a batch, its facts that are held (and not released since), with their `held`
/// row ids.
pub(crate) type BatchHeld = HashMap<FactHash, i64, BuildFactHasher>;

/// Facts the caller said are released ([`super::WriteTx::assume_released`]), as (seq,
/// type id).
pub(crate) type Assumed = HashMap<FactHash, (i64, i64), BuildFactHasher>;

/// The seq and type id of a released fact, by hash.
pub(crate) type Released<'a> = dyn FnMut(&FactHash) -> Result<Option<(i64, i64)>> + 'a;

/// Splits `fact`'s predecessors into released ones and missing ones (sorted, each once).
/// A predecessor held in this batch (`batch_held`) is missing without a lookup; one the
/// caller said is released (`assumed`) is released without one.
pub(crate) fn split_predecessors<'f>(
    fact: &'f Fact,
    batch_held: Option<&BatchHeld>,
    assumed: &Assumed,
    released: &mut Released<'_>,
) -> Result<(Vec<Pred<'f>>, Vec<Missing>)> {
    let mut preds = Vec::with_capacity(4);
    let mut missing = Vec::new();
    for (role, set) in fact.predecessors() {
        for hash in set {
            if let Some(&id) = batch_held.and_then(|b| b.get(hash)) {
                missing.push((*hash, Some(id)));
                continue;
            }
            let found = match assumed.get(hash) {
                Some(&known) => Some(known),
                None => released(hash)?,
            };
            match found {
                Some((seq, type_id)) => preds.push((role.as_str(), *hash, seq, type_id)),
                None => missing.push((*hash, None)),
            }
        }
    }
    missing.sort_unstable();
    missing.dedup_by_key(|(m, _)| *m);
    Ok((preds, missing))
}

/// A held fact's bytes, decoded and checked against its hash.
pub(crate) fn held_fact(hash: &FactHash, bytes: &[u8]) -> Result<Fact> {
    crate::encoding::decode_fact(bytes, Some(*hash)).map_err(|e| Error::Corrupt {
        hash: *hash,
        reason: format!("held bytes do not decode: {e}"),
    })
}

/// The predecessors of a held fact whose release `arrived` (hash, (seq, type id))
/// completed: that one as given, every other looked up, and all must be released.
pub(crate) fn released_predecessors<'f>(
    hash: &FactHash,
    fact: &'f Fact,
    arrived: (FactHash, (i64, i64)),
    released: &mut Released<'_>,
) -> Result<Vec<Pred<'f>>> {
    let mut preds = Vec::new();
    for (role, set) in fact.predecessors() {
        for p in set {
            let (seq, type_id) = if *p == arrived.0 {
                arrived.1
            } else {
                released(p)?.ok_or_else(|| Error::Corrupt {
                    hash: *hash,
                    reason: format!("released while predecessor {p} is absent"),
                })?
            };
            preds.push((role.as_str(), *p, seq, type_id));
        }
    }
    Ok(preds)
}

/// How many leading facts of a batch are looked up to tell a re-delivered batch from a
/// new one.
const PROBE: usize = 8;

/// A batch in parent-before-child order, each fact once, with the duplicates it dropped
/// counted in `report`. A batch that starts with released facts is probably a
/// re-delivery: its released facts are dropped first, a lookup each, so it costs no
/// ordering and no predecessor lookups. Otherwise facts go straight on, where the unique
/// hash of the fact table tells a duplicate apart without a lookup of its own.
pub(crate) fn batch_order(
    facts: Vec<Fact>,
    report: &mut BatchReport,
    is_released: &mut dyn FnMut(&FactHash) -> Result<bool>,
) -> Result<Vec<Fact>> {
    let mut redelivered = false;
    for fact in facts.iter().take(PROBE) {
        if is_released(&fact.hash())? {
            redelivered = true;
            break;
        }
    }
    let fresh = if redelivered {
        let mut fresh = Vec::with_capacity(facts.len());
        for fact in facts {
            if is_released(&fact.hash())? {
                report.duplicates += 1;
            } else {
                fresh.push(fact);
            }
        }
        fresh
    } else {
        facts
    };
    let given = fresh.len() as u64;
    let ordered = if dag::is_release_ordered(&fresh) {
        fresh
    } else {
        dag::release_order(fresh)
    };
    report.duplicates += given - ordered.len() as u64;
    Ok(ordered)
}

/// Corrects `report` at the end of a batch whose facts still held are `still_held`: a
/// fact held at its turn and released later in the same batch (its missing ancestor a
/// fact held before the batch, released by a later fact's cascade) was new and is
/// released, so it counts as inserted, as if it had been released on arrival.
pub(crate) fn settle_held(report: &mut BatchReport, still_held: &BatchHeld) {
    let still = still_held.len() as u64;
    if report.held > still {
        report.inserted += report.held - still;
        report.held = still;
    }
}

/// Adds the outcome of one fact of a parents-first batch to `report`: a fact refused by
/// the held bound is listed, not an error; any other error ends the batch.
pub(crate) fn tally(report: &mut BatchReport, outcome: Result<InsertOutcome>) -> Result<()> {
    match outcome {
        Ok(InsertOutcome::Inserted { released, .. }) => {
            report.inserted += 1;
            report.released += released;
        }
        Ok(InsertOutcome::Duplicate { .. }) => report.duplicates += 1,
        // Its missing ancestors are outside the batch, but one may be a fact held before
        // it that a later fact releases: [`settle_held`] counts that at the end.
        Ok(InsertOutcome::Held { .. }) => report.held += 1,
        Err(Error::HeldLimit { hash, .. }) => report.refused.push(hash),
        Err(e) => return Err(e),
    }
    Ok(())
}

//! The values the fact core hands out, the same for every backend.

use std::collections::BTreeMap;

use crate::fact::Fact;
use crate::hash::FactHash;

/// What became of one inserted fact.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InsertOutcome {
    /// The fact was new and is released with sequence number `seq`. `released` counts it
    /// and every held fact its arrival released (cascading), so it is at least 1.
    Inserted {
        /// The fact's release sequence number.
        seq: i64,
        /// Facts released by this insert, the fact itself included.
        released: u64,
    },
    /// The fact was already stored; nothing changed. `seq` is `None` when it is held.
    Duplicate {
        /// Its release sequence number, if it is released.
        seq: Option<i64>,
    },
    /// The fact is new but some ancestors are absent: it is held, durably, until they arrive.
    Held {
        /// The predecessors that are not released yet.
        missing: Vec<FactHash>,
    },
}

impl InsertOutcome {
    /// Whether the fact is now held.
    pub fn is_held(&self) -> bool {
        matches!(self, InsertOutcome::Held { .. })
    }

    /// Whether the fact was already stored.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, InsertOutcome::Duplicate { .. })
    }

    /// How many facts this insert released (the fact itself and any it unblocked).
    pub fn released(&self) -> u64 {
        match self {
            InsertOutcome::Inserted { released, .. } => *released,
            _ => 0,
        }
    }
}

/// Counts for a batch of inserts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Facts in the batch that were new and released on arrival.
    pub inserted: u64,
    /// Facts already stored (released or held), or given twice in the batch.
    pub duplicates: u64,
    /// New facts now held for missing ancestors (at the end of the batch).
    pub held: u64,
    /// Facts released, counting new facts released on arrival and held facts (from this
    /// batch or earlier ones) that the batch released.
    pub released: u64,
    /// Facts refused because the held-fact bound was reached; nothing else of them stored.
    pub refused: Vec<FactHash>,
}

impl BatchReport {
    /// Adds another report's counts to this one.
    pub fn merge(&mut self, other: BatchReport) {
        self.inserted += other.inserted;
        self.duplicates += other.duplicates;
        self.held += other.held;
        self.released += other.released;
        self.refused.extend(other.refused);
    }
}

/// A stored fact and where it stands.
#[derive(Clone, Debug)]
pub struct StoredFact {
    /// The fact.
    pub fact: Fact,
    /// Its release sequence number, or `None` while it is held.
    pub seq: Option<i64>,
}

/// A held fact and the ancestors it waits for.
#[derive(Clone, Debug)]
pub struct HeldFact {
    /// The fact.
    pub fact: Fact,
    /// Its predecessors that are not released yet.
    pub missing: Vec<FactHash>,
    /// When it was first held, in milliseconds since the Unix epoch.
    pub held_at_ms: i64,
}

/// Store-wide counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Released facts per type name.
    pub per_type: BTreeMap<String, u64>,
    /// Released facts in all.
    pub released: u64,
    /// Held facts.
    pub held: u64,
    /// Predecessor edges between released facts.
    pub edges: u64,
    /// Database size in bytes (pages in use times page size).
    pub db_bytes: u64,
}

/// One thing found wrong by [`super::Store::verify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The fact concerned, when there is one.
    pub hash: Option<FactHash>,
    /// What is wrong.
    pub reason: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.hash {
            Some(h) => write!(f, "fact {h}: {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

/// What [`super::Store::verify`] checked and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Released facts checked.
    pub released: u64,
    /// Held facts checked.
    pub held: u64,
    /// Everything found wrong (empty when the store is intact). At most 1,000 are kept.
    pub problems: Vec<Problem>,
}

const MAX_PROBLEMS: usize = 1000;

impl VerifyReport {
    /// Whether nothing was found wrong.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    pub(crate) fn problem(&mut self, hash: Option<FactHash>, reason: impl Into<String>) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(Problem {
                hash,
                reason: reason.into(),
            });
        }
    }
}

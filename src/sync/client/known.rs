//! What one sync knows the peer has, so that it neither pushes back what came from the
//! peer nor pulls back what it pushed (`docs/protocol.md`, "A sync, step by step").
//!
//! Both are kept in memory for the length of one sync: local `seq` ranges of the facts
//! that came from the peer ([`Known`]), and the peer's `seq` ranges of the facts this
//! sync pushed ([`Ranges`], from each push answer's `seqs`). Across syncs the bookmarks
//! carry the same knowledge: a sync that ends in step moves both past everything.

use std::collections::HashSet;

use crate::hash::FactHash;

/// A set of sequence numbers as sorted, disjoint, inclusive ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Ranges(Vec<(i64, i64)>);

impl Ranges {
    /// Adds `first..=last`.
    pub(super) fn add(&mut self, first: i64, last: i64) {
        if first > last {
            return;
        }
        // The common case: appending after the last range, or extending it.
        if let Some(end) = self.0.last_mut() {
            if first >= end.0 && first <= end.1 + 1 {
                end.1 = end.1.max(last);
                return;
            }
            if first > end.1 {
                self.0.push((first, last));
                return;
            }
        } else {
            self.0.push((first, last));
            return;
        }
        self.0.push((first, last));
        self.0.sort_unstable();
        let mut merged: Vec<(i64, i64)> = Vec::with_capacity(self.0.len());
        for (a, b) in self.0.drain(..) {
            match merged.last_mut() {
                Some(m) if a <= m.1 + 1 => m.1 = m.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.0 = merged;
    }

    /// Whether `seq` is in the set.
    pub(super) fn contains(&self, seq: i64) -> bool {
        let i = self.0.partition_point(|r| r.1 < seq);
        self.0.get(i).is_some_and(|r| r.0 <= seq)
    }

    /// `after` moved past every range that starts right after it: the bookmark that
    /// covers the same facts once the set's members are known to be stored.
    pub(super) fn advance(&self, mut after: i64) -> i64 {
        for &(a, b) in &self.0 {
            if a <= after + 1 && b > after {
                after = b;
            }
        }
        after
    }

    /// The first member above `after`, if any.
    pub(super) fn next_after(&self, after: i64) -> Option<i64> {
        let i = self.0.partition_point(|r| r.1 <= after);
        self.0.get(i).map(|r| r.0.max(after + 1))
    }

    /// The gaps of the set within `after < seq <= through`, as `(after, through)` pairs
    /// in the same sense (each gap is `after < seq <= through`).
    pub(super) fn gaps(&self, after: i64, through: i64) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        let mut at = after;
        for &(a, b) in &self.0 {
            if b <= at {
                continue;
            }
            if a > through {
                break;
            }
            if a - 1 > at {
                out.push((at, a - 1));
            }
            at = b;
        }
        if at < through {
            out.push((at, through));
        }
        out
    }
}

/// The local facts one sync has seen come from the peer (pulled or fetched): by local
/// `seq` once released here, and by hash for those held here or already stored.
#[derive(Debug, Default)]
pub(super) struct Known {
    pub(super) seqs: Ranges,
    pub(super) hashes: HashSet<FactHash>,
}

impl Known {
    /// Whether the peer has the local fact at `seq` with `hash`.
    pub(super) fn has(&self, seq: i64, hash: &FactHash) -> bool {
        self.seqs.contains(seq) || self.hashes.contains(hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_advance_and_leave_gaps() {
        let mut r = Ranges::default();
        r.add(5, 7);
        r.add(8, 9);
        r.add(1, 2);
        r.add(12, 12);
        assert_eq!(r.0, vec![(1, 2), (5, 9), (12, 12)]);
        assert!(r.contains(6) && r.contains(12) && !r.contains(3) && !r.contains(13));
        assert_eq!(r.advance(0), 2);
        assert_eq!(r.advance(4), 9);
        assert_eq!(r.advance(10), 10);
        assert_eq!(r.next_after(2), Some(5));
        assert_eq!(r.next_after(6), Some(7));
        assert_eq!(r.next_after(12), None);
        assert_eq!(r.gaps(0, 14), vec![(2, 4), (9, 11), (12, 14)]);
        assert_eq!(r.gaps(5, 9), vec![]);
        r.add(3, 4);
        assert_eq!(r.0, vec![(1, 9), (12, 12)]);
    }
}

//! Released facts this process has seen lately, as (seq, type id), and when a batch may be
//! written as new without looking up its own hashes.
//!
//! A released fact is never removed and never renumbered, so what a committed
//! transaction released, or a statement read as released, stays true for as long as the
//! database does: a batch's look-up ([`super::batch`]) asks the database only for the
//! hashes this does not hold. A hash it does not hold says nothing (another process may
//! have released it). It keeps two generations of [`GENERATION`] facts: when the newer
//! is full, the older is dropped, so it holds the last `GENERATION` to `2 * GENERATION`
//! facts it was given, a few MB at most.
//!
//! A database put back under a running store (a restore of an older backup) would make
//! that untrue; it shows as a `seq` counter, read at every write lock, below the highest
//! `seq` held here, and then everything held is forgotten ([`Recent::database_at`]).
//!
//! A large batch is first written on the guess that the facts it does not know of are
//! new (`PgWrite::insert_many`), under a savepoint; if one was released after all, the
//! write fails on the unique hash, the savepoint is rolled back, the batch is written
//! again the careful way, and the next [`SKIP_AFTER_CONFLICT`] large batches of this
//! store are not guessed at.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::dag::BuildFactHasher;
use crate::hash::FactHash;

/// Facts per generation.
pub(super) const GENERATION: usize = 32_768;

/// Large batches written the careful way after a guess that failed.
pub(super) const SKIP_AFTER_CONFLICT: u32 = 16;

type Map = HashMap<FactHash, (i64, i64), BuildFactHasher>;

#[derive(Default)]
struct Generations {
    new: Map,
    old: Map,
    /// The highest seq ever added.
    highest: i64,
}

#[derive(Default)]
pub(crate) struct Recent {
    generations: Mutex<Generations>,
    /// Large batches still to write the careful way.
    skip: AtomicU32,
}

impl Recent {
    /// Puts into `known` each of `hashes` this holds; returns the others.
    pub(super) fn lookup<'h>(
        &self,
        hashes: impl Iterator<Item = &'h FactHash>,
        known: &mut Map,
    ) -> Vec<FactHash> {
        let g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        let mut misses = Vec::new();
        for h in hashes {
            match g.new.get(h).or_else(|| g.old.get(h)) {
                Some(&at) => {
                    known.insert(*h, at);
                }
                None => misses.push(*h),
            }
        }
        misses
    }

    /// Calls `f` with a look-up in what this holds, under one lock.
    pub(super) fn with<T>(
        &self,
        f: impl FnOnce(&dyn Fn(&FactHash) -> Option<(i64, i64)>) -> T,
    ) -> T {
        let g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        f(&|h| g.new.get(h).or_else(|| g.old.get(h)).copied())
    }

    /// Remembers released facts: committed ones only.
    pub(super) fn add(&self, facts: impl IntoIterator<Item = (FactHash, (i64, i64))>) {
        let mut g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        for (hash, at) in facts {
            if g.new.len() >= GENERATION {
                g.old = std::mem::take(&mut g.new);
            }
            g.new.insert(hash, at);
            g.highest = g.highest.max(at.0);
        }
    }

    /// The database's `seq` counter reads `seq` under the write lock: below a seq held
    /// here, the database was put back under this store, and everything is forgotten;
    /// returns whether it was (the caller forgets what else it cached of the database).
    pub(super) fn database_at(&self, seq: i64) -> bool {
        let mut g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        let put_back = seq < g.highest;
        if put_back {
            *g = Generations::default();
        }
        put_back
    }

    /// Whether the next large batch may be written on the guess that its facts are new.
    pub(super) fn may_guess(&self) -> bool {
        self.skip
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_err()
    }

    /// A guess failed: the next large batches are written the careful way.
    pub(super) fn guess_failed(&self) {
        self.skip.store(SKIP_AFTER_CONFLICT, Ordering::Relaxed);
    }

    /// How many facts this holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        let g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        g.new.len() + g.old.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(i: usize) -> FactHash {
        let mut h = [0u8; 32];
        h[..8].copy_from_slice(&(i as u64).to_le_bytes());
        FactHash(h)
    }

    #[test]
    fn holds_the_last_generation_to_two_and_no_more() {
        let r = Recent::default();
        let n = 3 * GENERATION + 5;
        r.add((0..n).map(|i| (hash(i), (i as i64, 7))));
        assert!(r.len() <= 2 * GENERATION, "{}", r.len());
        let mut known = Map::default();
        let recent: Vec<FactHash> = (n - GENERATION..n).map(hash).collect();
        assert!(r.lookup(recent.iter(), &mut known).is_empty());
        assert_eq!(known[&hash(n - 1)], ((n - 1) as i64, 7));
        let old = [hash(0), hash(GENERATION)];
        assert_eq!(r.lookup(old.iter(), &mut known), old.to_vec());
    }

    #[test]
    fn a_failed_guess_skips_the_next_batches() {
        let r = Recent::default();
        assert!(r.may_guess());
        r.guess_failed();
        for _ in 0..SKIP_AFTER_CONFLICT {
            assert!(!r.may_guess());
        }
        assert!(r.may_guess());
    }

    #[test]
    fn a_counter_below_what_it_holds_empties_it() {
        let r = Recent::default();
        r.add((1..=10).map(|i| (hash(i), (i as i64, 1))));
        r.database_at(10);
        assert_eq!(r.len(), 10);
        r.database_at(9);
        assert_eq!(r.len(), 0);
        let mut known = Map::default();
        assert_eq!(r.lookup([hash(3)].iter(), &mut known), vec![hash(3)]);
        r.add([(hash(3), (2, 1))]);
        r.database_at(2);
        assert_eq!(r.len(), 1);
    }
}

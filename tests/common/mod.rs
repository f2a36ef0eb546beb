//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod backend;
#[cfg(feature = "cli")]
pub mod bin;
#[cfg(feature = "cli")]
pub mod crash;
pub mod db;
pub mod pg;
#[cfg(feature = "cli")]
pub mod process;
#[cfg(feature = "cli")]
pub mod queue;
pub mod shop;

use precedent::{Fact, FactHash, Store};

/// A fact of type `t` with an `n` field and the given predecessors under role `p`.
pub fn fact(t: &str, n: i64, preds: &[FactHash]) -> Fact {
    let mut b = Fact::builder(t).field("n", n);
    for p in preds {
        b = b.predecessor("p", *p);
    }
    b.build().unwrap()
}

/// A chain of `len` facts, each naming the previous one.
pub fn chain(len: usize) -> Vec<Fact> {
    let mut out: Vec<Fact> = Vec::with_capacity(len);
    for i in 0..len {
        let preds: Vec<FactHash> = out.last().map(|f| vec![f.hash()]).unwrap_or_default();
        out.push(fact("Link", i as i64, &preds));
    }
    out
}

/// Asserts that every released fact comes after all its predecessors.
pub fn assert_topological(store: &Store) {
    let mut seqs = std::collections::HashMap::new();
    store
        .for_each_released(0, |seq, hash, bytes| {
            let f = Fact::from_canonical(bytes).unwrap();
            assert_eq!(f.hash(), hash);
            for p in f.predecessor_hashes() {
                let ps = seqs.get(&p).copied();
                assert!(
                    ps.is_some_and(|ps: i64| ps < seq),
                    "{hash} released before {p}"
                );
            }
            seqs.insert(hash, seq);
            Ok(())
        })
        .unwrap();
}

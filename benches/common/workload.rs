//! The ingest benchmarks' workload (`benches/ingest.rs`, `benches/pg_ingest.rs`): facts
//! of chains under a few roots, with fan-in, from a fixed seed. See `docs/performance.md`.

use std::collections::BTreeSet;

use precedent::{Fact, FactHash};

const SEED: u64 = 0x005E_ED0F_FAC7_2024;
/// Root facts, first in release order.
const ROOTS: u64 = 10;
/// Chains growing at the same time; a finished chain is replaced by a new one.
const ACTIVE_CHAINS: usize = 64;
/// Fan-in predecessors are drawn from this many most recent facts.
const RECENT: usize = 1 << 16;

const WORDS: &[&str] = &[
    "order", "shipped", "from", "north", "depot", "after", "review", "by", "the", "night", "shift",
    "pending", "invoice", "customer", "asked", "for", "partial", "delivery", "of", "spare",
    "parts", "priority", "raised", "route", "changed", "due", "to", "weather", "held", "at",
    "customs", "signed", "received", "damaged", "crate", "replaced",
];

/// SplitMix64: small, fast, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy, Default)]
struct Chain {
    id: u64,
    root: Option<FactHash>,
    head: Option<FactHash>,
    step: u64,
    left: u64,
}

/// The benchmark's facts in release order (every fact after its predecessors), generated
/// on the fly from a fixed seed: the same facts in the same order on every run, with only
/// the chain heads and a window of recent hashes in memory.
pub struct Workload {
    rng: Rng,
    made: u64,
    total: u64,
    roots: Vec<FactHash>,
    chains: Vec<Chain>,
    next_chain: u64,
    recent: Vec<FactHash>,
}

impl Workload {
    pub fn new(total: u64) -> Workload {
        Workload {
            rng: Rng(SEED),
            made: 0,
            total,
            roots: Vec::new(),
            chains: vec![Chain::default(); ACTIVE_CHAINS],
            next_chain: 0,
            recent: Vec::with_capacity(RECENT),
        }
    }

    /// The next `n` facts (fewer at the end).
    pub fn chunk(&mut self, n: usize) -> Vec<Fact> {
        self.by_ref().take(n).collect()
    }

    fn note(&mut self) -> String {
        let target = 40 + self.rng.below(41) as usize;
        let mut s = String::with_capacity(target + 12);
        while s.len() < target {
            if !s.is_empty() {
                s.push(' ');
            }
            s.push_str(WORDS[self.rng.below(WORDS.len() as u64) as usize]);
        }
        s
    }

    fn root(&mut self, i: u64) -> Fact {
        Fact::builder("Bench.Root")
            .field("name", format!("region-{i}"))
            .field("region", i)
            .field("opened", 1_700_000_000_000u64 + i)
            .build()
            .expect("valid root")
    }

    fn event(&mut self, i: u64) -> Fact {
        let slot = self.rng.below(ACTIVE_CHAINS as u64) as usize;
        if self.chains[slot].left == 0 {
            let root = self.roots[self.rng.below(ROOTS) as usize];
            self.chains[slot] = Chain {
                id: self.next_chain,
                root: Some(root),
                head: None,
                step: 0,
                left: 500 + self.rng.below(10_000),
            };
            self.next_chain += 1;
        }
        let chain = self.chains[slot];
        let (type_name, role, prev) = match chain.head {
            Some(head) => ("Bench.Event", "prev", head),
            None => ("Bench.Open", "root", chain.root.expect("chain root")),
        };
        // One fact in four also names one or two recent facts, mostly of other chains.
        let mut refs = BTreeSet::new();
        if !self.recent.is_empty() && self.rng.below(4) == 0 {
            let k = 1 + self.rng.below(2);
            for _ in 0..k {
                let r = self.recent[self.rng.below(self.recent.len() as u64) as usize];
                if r != prev {
                    refs.insert(r);
                }
            }
        }
        let type_name = if refs.is_empty() {
            type_name
        } else {
            "Bench.Merge"
        };
        let note = self.note();
        let mut builder = Fact::builder(type_name)
            .field("chain", chain.id)
            .field("step", chain.step)
            .field("at", 1_700_000_000_000u64 + i * 37 + self.rng.below(1000))
            .field("amount", self.rng.below(10_000_000) as f64 / 100.0)
            .field("qty", self.rng.below(500))
            .field("kind", self.rng.below(8))
            .field("actor", format!("user-{:05}", self.rng.below(50_000)))
            .field("note", note)
            .predecessor(role, prev);
        for r in refs {
            builder = builder.predecessor("ref", r);
        }
        let fact = builder.build().expect("valid event");
        let c = &mut self.chains[slot];
        c.head = Some(fact.hash());
        c.step += 1;
        c.left -= 1;
        fact
    }
}

impl Iterator for Workload {
    type Item = Fact;

    fn next(&mut self) -> Option<Fact> {
        if self.made >= self.total {
            return None;
        }
        let i = self.made;
        let fact = if i < ROOTS {
            let f = self.root(i);
            self.roots.push(f.hash());
            f
        } else {
            self.event(i)
        };
        if self.recent.len() < RECENT {
            self.recent.push(fact.hash());
        } else {
            self.recent[(i as usize) % RECENT] = fact.hash();
        }
        self.made += 1;
        Some(fact)
    }
}

//! Ordering a batch of facts so that every fact comes after those of its predecessors that
//! are in the same batch.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use petgraph::Direction;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::fact::Fact;
use crate::hash::FactHash;

/// Returns the batch with duplicates (by hash) removed and the rest in an order where each
/// fact follows its in-batch predecessors.
///
/// The order is stable: among the facts whose in-batch predecessors are already placed,
/// the one given first comes first. So a batch that is already parent-before-child (an
/// export, say) keeps its order exactly, and a reversed batch comes out in the original
/// order. Cost: O(n log n + edges).
pub fn release_order(batch: Vec<Fact>) -> Vec<Fact> {
    let mut index: HashMap<FactHash, NodeIndex, BuildFactHasher> =
        HashMap::with_capacity_and_hasher(batch.len(), BuildFactHasher);
    let mut graph: DiGraph<Option<Fact>, ()> = DiGraph::with_capacity(batch.len(), batch.len());
    for fact in batch {
        index
            .entry(fact.hash())
            .or_insert_with(|| graph.add_node(Some(fact)));
    }
    let mut edges = Vec::new();
    for node in graph.node_indices() {
        let fact = graph[node].as_ref().expect("every node holds its fact");
        for set in fact.predecessors().values() {
            for p in set {
                if let Some(&parent) = index.get(p) {
                    edges.push((parent, node));
                }
            }
        }
    }
    if edges.is_empty() {
        return graph
            .into_nodes_edges()
            .0
            .into_iter()
            .filter_map(|n| n.weight)
            .collect();
    }
    for (parent, child) in edges {
        // A role set holds each hash once, but a hash may appear under two roles.
        graph.update_edge(parent, child, ());
    }
    // Kahn's algorithm, always taking the earliest-given ready fact. Node indices follow
    // input order, so the heap key is the index itself.
    let mut waiting: Vec<usize> = graph
        .node_indices()
        .map(|n| graph.neighbors_directed(n, Direction::Incoming).count())
        .collect();
    let mut ready: BinaryHeap<Reverse<usize>> = waiting
        .iter()
        .enumerate()
        .filter(|(_, w)| **w == 0)
        .map(|(i, _)| Reverse(i))
        .collect();
    let mut out = Vec::with_capacity(waiting.len());
    while let Some(Reverse(i)) = ready.pop() {
        let node = NodeIndex::new(i);
        let children: Vec<NodeIndex> = graph
            .neighbors_directed(node, Direction::Outgoing)
            .collect();
        for child in children {
            waiting[child.index()] -= 1;
            if waiting[child.index()] == 0 {
                ready.push(Reverse(child.index()));
            }
        }
        out.push(graph[node].take().expect("each node is placed once"));
    }
    // Content addressing makes a cycle impossible (a fact cannot name a hash computed over
    // itself), so every node was placed.
    debug_assert_eq!(out.len(), graph.node_count());
    out
}

/// Whether a batch is already duplicate-free and parent-before-child, so that
/// [`release_order`] would return it unchanged. One pass over the batch.
pub fn is_release_ordered(batch: &[Fact]) -> bool {
    let mut position: HashMap<FactHash, usize, BuildFactHasher> =
        HashMap::with_capacity_and_hasher(batch.len(), BuildFactHasher);
    for (i, fact) in batch.iter().enumerate() {
        if position.insert(fact.hash(), i).is_some() {
            return false;
        }
    }
    batch.iter().enumerate().all(|(i, fact)| {
        fact.predecessors()
            .values()
            .flatten()
            .all(|p| position.get(p).is_none_or(|&at| at < i))
    })
}

/// Hashes a [`FactHash`] by its first 8 bytes: they are already uniformly distributed, so
/// running SipHash over all 32 would only cost time.
#[derive(Clone, Copy, Default)]
pub(crate) struct BuildFactHasher;

#[derive(Default)]
pub(crate) struct FactHasher(u64);

impl std::hash::BuildHasher for BuildFactHasher {
    type Hasher = FactHasher;
    fn build_hasher(&self) -> FactHasher {
        FactHasher(0)
    }
}

impl std::hash::Hasher for FactHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8).take(1) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(name: &str, n: usize) -> Vec<Fact> {
        let mut out: Vec<Fact> = Vec::new();
        for i in 0..n {
            let mut b = Fact::builder(name).field("i", i);
            if let Some(prev) = out.last() {
                b = b.predecessor("prev", prev.hash());
            }
            out.push(b.build().unwrap());
        }
        out
    }

    #[test]
    fn children_given_first_come_out_last_and_duplicates_go() {
        let a = Fact::builder("A").build().unwrap();
        let b = Fact::builder("B")
            .predecessor("a", a.hash())
            .build()
            .unwrap();
        let c = Fact::builder("C")
            .predecessor("b", b.hash())
            .predecessor("a", a.hash())
            .predecessor("also", a.hash())
            .build()
            .unwrap();
        let out = release_order(vec![c.clone(), b.clone(), c.clone(), a.clone(), b.clone()]);
        let hashes: Vec<_> = out.iter().map(Fact::hash).collect();
        assert_eq!(hashes, vec![a.hash(), b.hash(), c.hash()]);
    }

    #[test]
    fn an_ordered_batch_keeps_its_order_and_unrelated_facts_keep_theirs() {
        let (x, y) = (chain("X", 5), chain("Y", 3));
        let mut mixed = Vec::new();
        for i in 0..5 {
            mixed.push(x[i].clone());
            if i < 3 {
                mixed.push(y[i].clone());
            }
        }
        let out: Vec<_> = release_order(mixed.clone())
            .iter()
            .map(Fact::hash)
            .collect();
        assert_eq!(out, mixed.iter().map(Fact::hash).collect::<Vec<_>>());
        let mut reversed = x.clone();
        reversed.reverse();
        assert!(!is_release_ordered(&reversed));
        assert!(!is_release_ordered(&[x[0].clone(), x[0].clone()]));
        let out: Vec<_> = release_order(reversed).iter().map(Fact::hash).collect();
        assert_eq!(out, x.iter().map(Fact::hash).collect::<Vec<_>>());
    }
}

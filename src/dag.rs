//! Ordering a batch of facts so that every fact comes after those of its predecessors that
//! are in the same batch.

use std::collections::HashMap;

use petgraph::graph::DiGraph;

use crate::fact::Fact;
use crate::hash::FactHash;

/// Returns the batch with duplicates (by hash) removed and the rest in an order where each
/// fact follows its in-batch predecessors. Facts whose predecessors are outside the batch
/// keep their relative input order. The order is deterministic for a given input.
pub fn release_order(batch: Vec<Fact>) -> Vec<Fact> {
    let mut index: HashMap<FactHash, petgraph::graph::NodeIndex> =
        HashMap::with_capacity(batch.len());
    let mut graph: DiGraph<Fact, ()> = DiGraph::with_capacity(batch.len(), batch.len());
    for fact in batch {
        index
            .entry(fact.hash())
            .or_insert_with(|| graph.add_node(fact));
    }
    let mut edges = Vec::new();
    for node in graph.node_indices() {
        for p in graph[node].predecessor_hashes() {
            if let Some(&parent) = index.get(&p) {
                edges.push((parent, node));
            }
        }
    }
    if edges.is_empty() {
        let (nodes, _) = graph.into_nodes_edges();
        return nodes.into_iter().map(|n| n.weight).collect();
    }
    for (a, b) in edges {
        graph.add_edge(a, b, ());
    }
    // Content addressing makes a cycle impossible (a fact cannot name a hash computed over
    // itself), so the sort cannot fail on real facts.
    let order = petgraph::algo::toposort(&graph, None).expect("fact graphs are acyclic");
    let mut slots: Vec<Option<Fact>> = graph
        .into_nodes_edges()
        .0
        .into_iter()
        .map(|n| Some(n.weight))
        .collect();
    order
        .into_iter()
        .map(|i| slots[i.index()].take().expect("each node once"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
            .build()
            .unwrap();
        let out = release_order(vec![c.clone(), b.clone(), c.clone(), a.clone(), b.clone()]);
        let hashes: Vec<_> = out.iter().map(Fact::hash).collect();
        assert_eq!(hashes, vec![a.hash(), b.hash(), c.hash()]);
    }
}

//! A fact's neighbourhood in the DAG: its ancestors up to some depth above it, its
//! descendants up to that depth below it, and the predecessor edges between them;
//! rendered as Graphviz dot, as SVG laid out in layers, or as JSON (`precedent graph`,
//! `GET /v1/graph/HASH`).
//!
//! The walk is breadth first, up through predecessors and down through successors, and
//! stops at [`Neighbourhood::MAX_NODES`] nodes (`truncated` then says so), so that a fact
//! with a million successors costs a bounded answer. The nodes are the fact itself, the
//! ancestors and the descendants found; the edges are every predecessor edge whose two
//! ends are nodes (so also an edge between two ancestors, or between a descendant and an
//! ancestor).
//!
//! The SVG layout is our own and small: one row per level (the most distant ancestors
//! on top, the fact in the middle row, the most distant descendants at the bottom), the
//! nodes of a row sorted by type and hash, straight edges from a successor up to its
//! predecessor. Every text is escaped for XML, and the document holds no script, no
//! event attribute and no link: it is safe to show inline in a page.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;

use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::store::Store;

mod svg;

/// One fact of a neighbourhood.
#[derive(Clone, Debug)]
pub struct Node {
    /// The fact.
    pub fact: Fact,
    /// Its row: negative for ancestors (-1 a predecessor), 0 for the fact itself,
    /// positive for descendants (1 a successor).
    pub level: i32,
}

/// A predecessor edge: `from` names `to` as a predecessor in `role`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    /// The successor.
    pub from: FactHash,
    /// The predecessor.
    pub to: FactHash,
    /// The role.
    pub role: String,
}

/// A fact's neighbourhood ([`Neighbourhood::walk`]).
#[derive(Clone, Debug)]
pub struct Neighbourhood {
    /// The fact at the centre.
    pub center: FactHash,
    /// The nodes, by level, then type, then hash.
    pub nodes: Vec<Node>,
    /// The edges between nodes, sorted.
    pub edges: Vec<Edge>,
    /// Whether the walk stopped at [`Neighbourhood::MAX_NODES`].
    pub truncated: bool,
}

/// Fields shown in a node's label, and characters of each value.
const LABEL_FIELDS: usize = 3;
const LABEL_VALUE_CHARS: usize = 40;

impl Neighbourhood {
    /// The most nodes a walk gathers.
    pub const MAX_NODES: usize = 500;

    /// Walks `depth` levels up and down from the released fact `center`.
    ///
    /// # Errors
    /// [`Error::NotFound`] if `center` is not a released fact; store errors.
    pub fn walk(store: &Store, center: &FactHash, depth: u32) -> Result<Neighbourhood> {
        Self::walk_at_most(store, center, depth, Self::MAX_NODES)
    }

    /// As [`Neighbourhood::walk`], with at most `max_nodes` nodes (at least 1).
    ///
    /// # Errors
    /// As [`Neighbourhood::walk`].
    pub fn walk_at_most(
        store: &Store,
        center: &FactHash,
        depth: u32,
        max_nodes: usize,
    ) -> Result<Neighbourhood> {
        let fact = match store.seq_of(center)? {
            Some(_) => store.get(center)?,
            None => None,
        };
        let fact = fact.ok_or(Error::NotFound { hash: *center })?;
        let mut w = Walk {
            found: BTreeMap::from([(*center, Node { fact, level: 0 })]),
            max: max_nodes.max(1),
            truncated: false,
        };
        w.spread(store, *center, depth, true)?;
        w.spread(store, *center, depth, false)?;
        let mut edges = Vec::new();
        for (h, n) in &w.found {
            for (role, preds) in n.fact.predecessors() {
                for p in preds.iter().filter(|p| w.found.contains_key(p)) {
                    edges.push(Edge {
                        from: *h,
                        to: *p,
                        role: role.clone(),
                    });
                }
            }
        }
        edges.sort();
        let mut nodes: Vec<Node> = w.found.into_values().collect();
        nodes.sort_by(|a, b| {
            (a.level, a.fact.type_name(), a.fact.hash()).cmp(&(
                b.level,
                b.fact.type_name(),
                b.fact.hash(),
            ))
        });
        Ok(Neighbourhood {
            center: *center,
            nodes,
            edges,
            truncated: w.truncated,
        })
    }

    /// Graphviz dot: `rankdir=BT` with edges from successor to predecessor, so that
    /// ancestors are drawn above; every label is a quoted, escaped string.
    pub fn to_dot(&self) -> String {
        let mut s = String::from(
            "digraph neighbourhood {\n  rankdir=BT;\n  node [shape=box, fontname=\"monospace\"];\n",
        );
        for n in &self.nodes {
            let h = n.fact.hash();
            let style = if n.level == 0 { ", style=bold" } else { "" };
            let _ = writeln!(
                s,
                "  \"{h}\" [label={}{style}];",
                dot_quote(&label_lines(&n.fact).join("\n"))
            );
        }
        for e in &self.edges {
            let _ = writeln!(
                s,
                "  \"{}\" -> \"{}\" [label={}];",
                e.from,
                e.to,
                dot_quote(&e.role)
            );
        }
        s.push_str("}\n");
        s
    }

    /// JSON: `{"center", "nodes": [{"hash", "type", "level", "label"}], "edges":
    /// [{"from", "to", "role"}], "truncated"}`.
    pub fn to_json(&self) -> serde_json::Value {
        let nodes: Vec<_> = self
            .nodes
            .iter()
            .map(|n| {
                serde_json::json!({
                    "hash": n.fact.hash().to_string(),
                    "type": n.fact.type_name(),
                    "level": n.level,
                    "label": label_lines(&n.fact),
                })
            })
            .collect();
        let edges: Vec<_> = self
            .edges
            .iter()
            .map(|e| {
                serde_json::json!({
                    "from": e.from.to_string(), "to": e.to.to_string(), "role": e.role,
                })
            })
            .collect();
        serde_json::json!({
            "center": self.center.to_string(),
            "nodes": nodes,
            "edges": edges,
            "truncated": self.truncated,
        })
    }

    /// SVG laid out in rows by level (see the module docs).
    pub fn to_svg(&self) -> String {
        svg::render(self)
    }
}

/// The walk's state: the nodes found so far and the cap.
struct Walk {
    found: BTreeMap<FactHash, Node>,
    max: usize,
    truncated: bool,
}

impl Walk {
    /// Breadth first from `start`, `depth` levels up (predecessors) or down
    /// (successors).
    fn spread(&mut self, store: &Store, start: FactHash, depth: u32, up: bool) -> Result<()> {
        let mut queue = VecDeque::from([(start, 0u32)]);
        let mut seen = BTreeSet::from([start]);
        while let Some((h, d)) = queue.pop_front() {
            if d == depth {
                continue;
            }
            let next: Vec<Fact> = if up {
                let f = &self.found[&h].fact;
                let mut v = Vec::new();
                for p in f.predecessor_hashes() {
                    if let Some(pf) = store.get(&p)? {
                        v.push(pf);
                    }
                }
                v
            } else {
                store.successors(&h, None, None)?
            };
            for f in next {
                let fh = f.hash();
                if !seen.insert(fh) {
                    continue;
                }
                if !self.found.contains_key(&fh) {
                    if self.found.len() >= self.max {
                        self.truncated = true;
                        return Ok(());
                    }
                    let level = if up { -(d as i32 + 1) } else { d as i32 + 1 };
                    self.found.insert(fh, Node { fact: f, level });
                }
                queue.push_back((fh, d + 1));
            }
        }
        Ok(())
    }
}

/// A node's label: its type and short hash, then a few fields as `name = value`, each
/// cut to a few characters.
pub(crate) fn label_lines(f: &Fact) -> Vec<String> {
    let mut lines = vec![format!("{} {}", f.type_name(), f.hash().short(8))];
    for (k, v) in f.fields().iter().take(LABEL_FIELDS) {
        let text = crate::json::value_to_json(v).to_string();
        let mut cut: String = text.chars().take(LABEL_VALUE_CHARS).collect();
        if cut.len() < text.len() {
            cut.push('…');
        }
        lines.push(format!("{k} = {cut}"));
    }
    if f.fields().len() > LABEL_FIELDS {
        lines.push(format!("(+{} more)", f.fields().len() - LABEL_FIELDS));
    }
    lines
}

/// A dot quoted string: `"` and `\` escaped, a line break as `\n` (so no text of a
/// label can end the string or be read as one of dot's escapes such as `\N`).
fn dot_quote(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => {}
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

//! The statements a watch runs, compiled once when it starts: one per place a fact type
//! occurs in the query (its *inverse* there), and the check of one result.

use std::collections::HashMap;

use super::super::run::Reader;
use crate::error::Result;
use crate::query::model::*;
use crate::query::run::{Givens, top_nodes, top_plan};
use crate::query::sql::{self, Bind, Node, Param, Plan, Shape};
use crate::store::{Dialect, SqlValue as Sql};

/// Where a fact type occurs in the query.
#[derive(Clone, Debug)]
enum Occurrence {
    /// A top-level match.
    Top { label: String },
    /// Inside exists conditions: the matches of each exists block on the path, outermost
    /// first, and the pinned label.
    Inner {
        blocks: Vec<Vec<Match>>,
        label: String,
    },
}

/// A statement a poll runs, compiled once when the watch starts. Its per-poll values
/// (the new facts' range, a result key) are slots: `Param::Int(SLOT + k)` stands for the
/// `k`th value, replaced when the statement runs.
#[derive(Clone, Debug)]
pub(super) struct Compiled {
    pub(super) plan: Plan,
}

/// The first slot value. Compiled statements hold no other integer this low: the other
/// integers they bind are operator codes and limits.
const SLOT: i64 = i64::MIN;

impl Compiled {
    /// The parameters with each slot `k` replaced by `values[k]`.
    fn params(&self, values: &[i64]) -> Vec<Param> {
        self.plan
            .params
            .iter()
            .map(|p| match p {
                Param::Int(i) if (*i as i128 - SLOT as i128) < values.len() as i128 => {
                    Param::Int(values[(*i as i128 - SLOT as i128) as usize])
                }
                p => p.clone(),
            })
            .collect()
    }

    /// The parameters with the slots filled, bound.
    pub(super) fn bind(&self, store: &Reader<'_>, values: &[i64]) -> Result<Vec<Sql>> {
        store.bind(&self.params(values))
    }
}

/// What the rows of an occurrence's statement are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Finds {
    /// Results containing a new fact (a top-level match).
    Results,
    /// Keys of results whose membership the new facts may change (inside exists).
    Members,
    /// Keys of results whose child collections the new facts may change (inside a child
    /// collection of the projection, or an exists within one).
    Children,
}

/// One place a fact type occurs in the query, with its statement: the query pinned to the
/// new facts (top level), or the top-level results connected to them (elsewhere).
#[derive(Clone, Debug)]
pub(super) struct Inverse {
    pub(super) type_name: String,
    pub(super) finds: Finds,
    pub(super) compiled: Compiled,
}

/// The statement of every place a fact type occurs in `query`: its top-level matches,
/// inside its exists conditions, and in the child collections of its projection.
pub(super) fn inverses(dialect: Dialect, query: &Query, givens: &Givens) -> Result<Vec<Inverse>> {
    let mut occurrences = Vec::new();
    for m in &query.matches {
        occurrences.push((
            Occurrence::Top {
                label: m.label.name.clone(),
            },
            m.type_name.clone(),
        ));
        collect_inner(&m.conditions, &mut Vec::new(), &mut occurrences);
    }
    let mut children = Vec::new();
    collect_children(&query.select, &mut Vec::new(), &mut children);
    let mut inverses = Vec::new();
    let all = occurrences
        .into_iter()
        .map(|o| (o, false))
        .chain(children.into_iter().map(|o| (o, true)));
    for ((occ, type_name), child) in all {
        let finds = match occ {
            _ if child => Finds::Children,
            Occurrence::Top { .. } => Finds::Results,
            Occurrence::Inner { .. } => Finds::Members,
        };
        inverses.push(Inverse {
            type_name,
            finds,
            compiled: inverse_plan(dialect, query, givens, &occ)?,
        });
    }
    Ok(inverses)
}

/// The statement of one occurrence, its slots the new facts' range `(after, upto]`.
fn inverse_plan(
    dialect: Dialect,
    query: &Query,
    givens: &Givens,
    occ: &Occurrence,
) -> Result<Compiled> {
    let range = Bind::Range(SLOT, SLOT + 1);
    let plan = match occ {
        Occurrence::Top { label } => {
            let pins = HashMap::from([(label.clone(), range)]);
            let unordered = Query {
                order: Vec::new(),
                ..query.clone()
            };
            top_plan(dialect, &unordered, givens, Some(&pins))?
        }
        Occurrence::Inner { blocks, label } => {
            let mut nodes = top_nodes(query, givens, None)?;
            let mut conds: Vec<&Condition> = Vec::new();
            without_exists(&query.matches, &mut conds);
            for block in blocks {
                without_exists(block, &mut conds);
                nodes.extend(sql::free_nodes(block));
            }
            for n in &mut nodes {
                if &n.label == label {
                    n.bind = range;
                }
            }
            let output: Vec<String> = query.top_labels().iter().map(|s| s.to_string()).collect();
            sql::compile(
                &nodes,
                &conds,
                &Shape {
                    output,
                    order: &[],
                    limit: None,
                    distinct: false,
                    dialect,
                    bytes: None,
                },
            )?
        }
    };
    Ok(Compiled {
        plan: steady(unordered(plan)),
    })
}

/// The statement evaluating the query for one result key (slots: the key).
pub(super) fn recheck_plan(dialect: Dialect, query: &Query, givens: &Givens) -> Result<Compiled> {
    let labels = query.top_labels();
    let pins: HashMap<String, Bind> = labels
        .iter()
        .enumerate()
        .map(|(k, l)| (l.to_string(), Bind::Seq(SLOT + k as i64)))
        .collect();
    let nodes: Vec<Node> = top_nodes(query, givens, Some(&pins))?;
    let conds: Vec<&Condition> = query
        .matches
        .iter()
        .flat_map(|m| m.conditions.iter())
        .collect();
    let output = labels.iter().map(|s| s.to_string()).collect();
    let plan = sql::compile(
        &nodes,
        &conds,
        &Shape {
            output,
            order: &[],
            limit: Some(1),
            distinct: false,
            dialect,
            bytes: None,
        },
    )?;
    Ok(Compiled { plan: steady(plan) })
}

/// A plan whose parameters SQLite's planner does not see: `?3` becomes `+?3`, so the
/// statement stays prepared from one poll to the next.
///
/// SQLite marks a parameter that its planner looked at (the right side of an `=`, `LIMIT
/// ?`) so that binding it again, or clearing the bindings, expires the statement, and
/// the SQLite backend's statement cache clears the bindings of every statement it takes
/// back: each poll
/// prepared every statement again (about 0.1 ms each; `Store::query_reprepares` counted
/// one per statement per poll). Behind a unary `+`, a no-op on any value, the planner sees
/// an expression and marks nothing. The plan does not change: compiled statements fix
/// their join order (`CROSS JOIN`) and their indexes themselves, and the SQL compiler puts
/// no literal text in a statement, so every `?` is a parameter.
pub(super) fn steady(mut plan: Plan) -> Plan {
    let mut out = String::with_capacity(plan.sql.len() + 2 * plan.params.len());
    let mut prev = ' ';
    for c in plan.sql.chars() {
        if c == '?' && prev != '+' {
            out.push('+');
        }
        out.push(c);
        prev = c;
    }
    plan.sql = out;
    plan
}

/// A plan without its final `ORDER BY`: a poll needs the rows, not their order, and
/// sorting them takes a temporary B-tree per statement. For plans without `LIMIT` whose
/// order binds no parameter (a plan ordered by fields keeps its order).
fn unordered(mut plan: Plan) -> Plan {
    if let Some(i) = plan.sql.rfind(" ORDER BY ")
        && !plan.sql[i..].contains(['?', ')'])
    {
        plan.sql.truncate(i);
    }
    plan
}

/// The conditions of `matches` other than exists conditions.
fn without_exists<'a>(matches: &'a [Match], conds: &mut Vec<&'a Condition>) {
    for m in matches {
        conds.extend(
            m.conditions
                .iter()
                .filter(|c| !matches!(c, Condition::Exists { .. })),
        );
    }
}

fn collect_inner(
    conds: &[Condition],
    path: &mut Vec<Vec<Match>>,
    out: &mut Vec<(Occurrence, String)>,
) {
    for c in conds {
        if let Condition::Exists { matches, .. } = c {
            path.push(matches.clone());
            for m in matches {
                out.push((
                    Occurrence::Inner {
                        blocks: path.clone(),
                        label: m.label.name.clone(),
                    },
                    m.type_name.clone(),
                ));
                collect_inner(&m.conditions, path, out);
            }
            path.pop();
        }
    }
}

/// The places fact types occur in the child collections of a projection: each match of a
/// collection, and inside its exists conditions, with the blocks of the collections (and
/// exists) on the way, as inner occurrences.
fn collect_children(
    p: &Projection,
    path: &mut Vec<Vec<Match>>,
    out: &mut Vec<(Occurrence, String)>,
) {
    match p {
        Projection::Record(items) => {
            for (_, item) in items {
                collect_children(item, path, out);
            }
        }
        Projection::Collection(sub) => {
            path.push(sub.matches.clone());
            for m in &sub.matches {
                out.push((
                    Occurrence::Inner {
                        blocks: path.clone(),
                        label: m.label.name.clone(),
                    },
                    m.type_name.clone(),
                ));
                collect_inner(&m.conditions, path, out);
            }
            collect_children(&sub.select, path, out);
            path.pop();
        }
        _ => {}
    }
}

//! Compiles a query to one SQL statement over `fact` and `edge`, with every value bound
//! as a parameter.
//!
//! Facts are joined in an order the compiler chooses and SQLite keeps (`CROSS JOIN`):
//! bound facts first (givens by hash through the unique index, pinned facts by `seq`),
//! then each match reached from a known fact through its join. Every edge carries the
//! types of both its facts, so the step that reaches a match also checks its type, in the
//! same index range: toward a successor the edge primary key `(predecessor, role_id,
//! successor_type, successor)`, toward a predecessor `edge_by_successor (successor,
//! role_id, predecessor_type, predecessor)`. A match is then known by the `seq` column of
//! that edge; its `fact` row is joined (by `seq`) only when the statement reads its hash
//! or bytes: a result, a field predicate, an ordering by field. Only a match joined to
//! nothing (a query without givens) scans, and then through `fact_by_type`. So the cost
//! follows the facts a query touches, not the size of the store.
//!
//! Field predicates call `pq_test(bytes, field, op, values)` and field ordering
//! `pq_field(bytes, field)` (the names come from the backend's [`Dialect`]; the rules are
//! [`crate::predicate`]'s); `exists` becomes a correlated
//! `EXISTS (SELECT 1 ...)`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::QueryError;
use super::model::*;
use crate::fact::{Fact, Value};
use crate::hash::FactHash;
use crate::predicate::Number;
use crate::store::{Dialect, SqlValue};

/// A parameter, bound when the statement runs. Type and role names are looked up then
/// (an unknown name binds NULL, which matches nothing).
#[derive(Clone, Debug)]
pub(crate) enum Param {
    Hash(FactHash),
    Type(String),
    Role(String),
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// How a fact label is bound in a block.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Bind {
    /// A given: the fact with this hash.
    Given(FactHash),
    /// The fact with this release sequence number.
    Seq(i64),
    /// Any fact released in `(after, upto]`.
    Range(i64, i64),
    /// Reached through a join.
    Free,
}

/// A fact label of a block with its type and binding.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub label: String,
    pub type_name: String,
    pub bind: Bind,
}

/// A compiled statement. Columns: `seq, hash, bytes` for each of `labels`, in order.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub sql: String,
    pub params: Vec<Param>,
    /// Shared, so that each row read binds its labels without copying their names.
    pub labels: Vec<Arc<str>>,
    /// The fact type of each of `labels`.
    pub types: Vec<Arc<str>>,
    /// The hash of each of `labels` that the statement selects as NULL because it is
    /// known here (see `Known::fixed`).
    pub fixed: Vec<Option<FactHash>>,
}

/// What follows a PostgreSQL parameter (`$N`) that binds a type or role id: a comment,
/// so the text is valid SQL as it is, which [`literal_ids`] replaces with the id.
pub(crate) const ID_MARK: &str = "/*id*/";

/// A compiled PostgreSQL statement with its type and role ids ([`ID_MARK`]) written into
/// its text as literals (`NULL` for a name no fact uses), and the other parameters
/// numbered again in their order; `None` when it has none.
///
/// A step of a walk reads the `edge` view, which is a fact's first edge in its own row
/// and its other edges in `edge_more`, a table partitioned by role with a partition only
/// for a role that has such an edge (schema version 7). With the role in the text, the
/// planner leaves out the partitioned branch of a role that has none, so the step reads
/// the fact rows alone, as fast as today's edge table (`docs/performance.md`, "The gate,
/// measured"); bound as a parameter, a generic plan keeps an `Append` per step, about
/// 10% slower. Which partitions exist is read by the planner from the catalog, so the
/// plan never misses a partition made since: making one invalidates the cached plans
/// that read the table.
pub(crate) fn literal_ids(sql: &str, params: &[SqlValue]) -> Option<(String, Vec<SqlValue>)> {
    if !sql.contains(ID_MARK) {
        return None;
    }
    // Each `$N`: whether it is an id, in one pass over the text.
    let bytes = sql.as_bytes();
    let mut marked = vec![false; params.len()];
    let mut at = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' {
            let end = (i + 1..bytes.len())
                .find(|&k| !bytes[k].is_ascii_digit())
                .unwrap_or(bytes.len());
            if end > i + 1 {
                let n: usize = sql[i + 1..end].parse().ok()?;
                let id = sql[end..].starts_with(ID_MARK);
                if id {
                    *marked.get_mut(n.checked_sub(1)?)? = true;
                }
                at.push((i, end, n, id));
                i = end;
                continue;
            }
        }
        i += 1;
    }
    let mut renumber = vec![0; params.len()];
    let mut kept = Vec::new();
    for (k, p) in params.iter().enumerate() {
        if !marked[k] {
            kept.push(p.clone());
            renumber[k] = kept.len();
        }
    }
    let mut out = String::with_capacity(sql.len());
    let mut last = 0;
    for (start, end, n, id) in at {
        out.push_str(&sql[last..start]);
        if id {
            match params.get(n - 1)? {
                SqlValue::Int(v) => out.push_str(&v.to_string()),
                SqlValue::Null => out.push_str("NULL"),
                _ => return None,
            }
            last = end + ID_MARK.len();
        } else {
            out.push_str(&format!("${}", renumber.get(n - 1)?));
            last = end;
        }
    }
    out.push_str(&sql[last..]);
    Some((out, kept))
}

struct Compiler {
    /// The backend's dialect: how parameters and the field functions are written.
    dialect: Dialect,
    params: Vec<Param>,
    aliases: usize,
    /// Labels whose `fact` row the statement reads (hash or bytes).
    rows: HashSet<String>,
    /// On PostgreSQL, the labels whose row only the results read (no field predicate or
    /// ordering reads it): reached through an edge, their rows are joined after the rest
    /// of the statement has run (see [`compile_keyset`]).
    late: HashSet<String>,
    /// The late labels reached, whose rows the statement joins outside.
    deferred: Vec<String>,
    /// On PostgreSQL, the late labels whose bytes no result reads (`select hash(o)`):
    /// one reached through an edge toward its successors takes its hash from that edge
    /// (`successor_hash`, PostgreSQL schema version 5) and joins no `fact` row at all.
    hash_only: HashSet<String>,
}

/// A label known in a block: the SQL expression of its `seq`, and the alias of its `fact`
/// row when that row is joined.
#[derive(Clone, Debug)]
struct Known {
    seq: String,
    fact: Option<String>,
    /// The expression of its hash when no `fact` row is joined for it: the
    /// `successor_hash` of the edge that reached it.
    hash: Option<String>,
    /// Its hash, known when the statement is compiled (a given bound by its `seq`): the
    /// statement selects NULL for it and the reader fills it in ([`Plan::fixed`]).
    fixed: Option<FactHash>,
}

impl Known {
    fn row(f: String) -> Known {
        Known {
            seq: format!("{f}.seq"),
            fact: Some(f),
            hash: None,
            fixed: None,
        }
    }

    /// The alias of the label's `fact` row: joined for every label in
    /// [`Compiler::rows`], which holds every label whose hash or bytes are read.
    fn fact(&self) -> &str {
        self.fact
            .as_deref()
            .expect("the fact row of a label read is joined (Compiler::rows)")
    }
}

/// Adds to `out` the labels whose fact bytes `conds` read (field predicates, at any depth).
fn labels_with_fields(conds: &[&Condition], out: &mut HashSet<String>) {
    for c in conds {
        match c {
            Condition::Field { label, .. } => {
                out.insert(label.name.clone());
            }
            Condition::Exists { matches, .. } => {
                let inner: Vec<&Condition> =
                    matches.iter().flat_map(|m| m.conditions.iter()).collect();
                labels_with_fields(&inner, out);
            }
            Condition::Join { .. } => {}
        }
    }
}

impl Compiler {
    /// Adds a parameter; returns how the statement names it: `+?N`, behind a unary plus
    /// (a no-op on any value), so that SQLite's planner does not mark the parameter as
    /// one it looked at. A marked parameter expires the statement when its bindings are
    /// cleared, which the SQLite backend's statement cache does each time it takes a
    /// statement back, so
    /// every run would prepare the statement again (see `steady` in `watch/inverse.rs`).
    /// Compiled statements fix their join order and indexes themselves, so the plan is
    /// the same.
    ///
    /// On PostgreSQL a type or role id is marked ([`ID_MARK`]) to be written into the
    /// statement's text when it runs ([`literal_ids`]): the planner then reads only the
    /// `edge_more` partitions of the roles that have one (schema version 7).
    fn param(&mut self, p: Param) -> String {
        let id = matches!(p, Param::Type(_) | Param::Role(_));
        self.params.push(p);
        let text = self.dialect.steady_param(self.params.len());
        match self.dialect {
            Dialect::Postgres if id => format!("{text}{ID_MARK}"),
            _ => text,
        }
    }

    fn alias(&mut self, prefix: &str) -> String {
        self.aliases += 1;
        format!("{prefix}{}", self.aliases)
    }

    /// Walks from the fact whose seq is `start` up through `roles` to a predecessor;
    /// returns the expression of the seq reached. With `last_type`, the last edge keeps
    /// only predecessors of that type (`edge_by_successor` holds the predecessor's type).
    fn walk_up(
        &mut self,
        start: String,
        roles: &[String],
        last_type: Option<&str>,
        from: &mut Vec<String>,
        wh: &mut Vec<String>,
    ) -> String {
        let step = ("successor", "predecessor", "predecessor_type");
        self.walk(start, roles.iter(), step, last_type, from, wh)
    }

    /// Walks from `start` down to successors through `roles` taken last to first. With
    /// `last_type`, the last edge keeps only successors of that type (the edge primary
    /// key holds the successor's type).
    fn walk_down(
        &mut self,
        start: String,
        roles: &[String],
        last_type: Option<&str>,
        from: &mut Vec<String>,
        wh: &mut Vec<String>,
    ) -> String {
        let step = ("predecessor", "successor", "successor_type");
        self.walk(start, roles.iter().rev(), step, last_type, from, wh)
    }

    /// One edge per role, each joined at its `step.0` column to the seq reached so far
    /// and reaching its `step.1` column; the last edge checks `step.2` against
    /// `last_type`.
    fn walk<'r>(
        &mut self,
        start: String,
        roles: impl ExactSizeIterator<Item = &'r String>,
        step: (&str, &str, &str),
        last_type: Option<&str>,
        from: &mut Vec<String>,
        wh: &mut Vec<String>,
    ) -> String {
        let (joined, reached, type_col) = step;
        let last = roles.len();
        let mut cur = start;
        for (i, role) in roles.enumerate() {
            let e = self.alias("e");
            let r = self.param(Param::Role(role.clone()));
            from.push(format!("edge {e}"));
            let mut term = format!("{e}.{joined} = {cur} AND {e}.role_id = {r}");
            if let Some(t) = last_type.filter(|_| i + 1 == last) {
                term.push_str(&format!(" AND {e}.{type_col} = {t}"));
            }
            wh.push(term);
            cur = format!("{e}.{reached}");
        }
        cur
    }

    /// Reaches the new label `n` from the known path `known` through `new`'s roles and
    /// checks its type in the last edge crossed; returns how `n` is known. Its `fact` row
    /// is joined only if the statement reads it.
    fn reach(
        &mut self,
        n: &Node,
        known: (&str, &[String]),
        new: &[String],
        from: &mut Vec<String>,
        wh: &mut Vec<String>,
    ) -> Known {
        let ty = self.param(Param::Type(n.type_name.clone()));
        let (down, up) = (!new.is_empty(), new.is_empty() && !known.1.is_empty());
        let meet = self.walk_up(known.0.to_string(), known.1, up.then_some(&ty), from, wh);
        let end = self.walk_down(meet, new, down.then_some(&ty), from, wh);
        if !down && !up {
            // No edge between them (`o = p`): the type is checked in `fact_by_type (type_id,
            // seq)`, whose pages stay cached; SQLite reads the row only if a column needs it.
            let f = self.alias("f");
            from.push(match self.dialect {
                Dialect::Sqlite => format!("fact {f} INDEXED BY fact_by_type"),
                _ => format!("fact {f}"),
            });
            wh.push(format!("{f}.seq = {end} AND {f}.type_id = {ty}"));
            return Known::row(f);
        }
        if !self.rows.contains(&n.label) {
            return Known {
                seq: end,
                fact: None,
                hash: None,
                fixed: None,
            };
        }
        if down && self.hash_only.contains(&n.label) {
            // Reached as the successor of the last edge crossed, which carries its hash.
            let hash = format!("{end}_hash");
            return Known {
                seq: end,
                fact: None,
                hash: Some(hash),
                fixed: None,
            };
        }
        if self.late.contains(&n.label) {
            self.deferred.push(n.label.clone());
            return Known {
                seq: end,
                fact: None,
                hash: None,
                fixed: None,
            };
        }
        // Conditions that read only the edges are evaluated before this join, so only the
        // facts that pass them are looked up.
        let f = self.alias("f");
        from.push(format!("fact {f}"));
        wh.push(format!("{f}.seq = {end}"));
        Known {
            seq: end,
            fact: Some(f),
            hash: None,
            fixed: None,
        }
    }

    /// Joins the nodes of a block in a connected order and adds its conditions. `scope`
    /// holds the labels already known (outer blocks). Returns whether a
    /// driving join took more than one step (so a result may be reached twice).
    fn block(
        &mut self,
        nodes: &[Node],
        conds: &[&Condition],
        scope: &mut HashMap<String, Known>,
        from: &mut Vec<String>,
        wh: &mut Vec<String>,
    ) -> Result<bool, QueryError> {
        let mut multi = false;
        let mut used = vec![false; conds.len()];
        let mut pending: Vec<&Node> = Vec::new();
        // How selective each known fact is: 0 pinned to new facts, 1 a given or outside
        // this block, 2 reached from a fact read by type.
        let mut rank: HashMap<String, u8> = scope.keys().map(|l| (l.clone(), 1)).collect();
        let reaches = nodes.iter().any(|n| matches!(n.bind, Bind::Free));
        for n in nodes {
            let f = self.alias("f");
            if let Bind::Free = n.bind {
                // Its type is bound where it is reached: a parameter here would be unused,
                // which PostgreSQL refuses (it cannot tell its type).
                pending.push(n);
                continue;
            }
            if let Bind::Given(h) = n.bind
                && self.dialect == Dialect::Postgres
                && reaches
                && (!self.rows.contains(&n.label) || self.hash_only.contains(&n.label))
            {
                // A given whose row nothing reads but its hash: its seq is a scalar
                // subquery (by hash and type: NULL, matching nothing, for a fact not
                // released or of another type, as the join did), which PostgreSQL runs
                // once, before the rest, and treats as a constant. The edges reached from
                // it then have a constant first key, so PostgreSQL reads them in index
                // order and sorts no results by it; no `fact` row is joined.
                rank.insert(n.label.clone(), 1);
                let ty = self.param(Param::Type(n.type_name.clone()));
                let hash = self.param(Param::Hash(h));
                scope.insert(
                    n.label.clone(),
                    Known {
                        seq: format!(
                            "(SELECT seq FROM fact WHERE hash = {hash} AND type_id = {ty})"
                        ),
                        fact: None,
                        hash: None,
                        fixed: Some(h),
                    },
                );
                continue;
            }
            let ty = self.param(Param::Type(n.type_name.clone()));
            match n.bind {
                Bind::Free => unreachable!("free nodes are pending"),
                Bind::Given(h) => {
                    rank.insert(n.label.clone(), 1);
                    let p = self.param(Param::Hash(h));
                    wh.push(format!("{f}.hash = {p}"));
                }
                Bind::Seq(s) => {
                    rank.insert(n.label.clone(), 0);
                    let p = self.param(Param::Int(s));
                    wh.push(format!("{f}.seq = {p}"));
                }
                Bind::Range(lo, hi) => {
                    rank.insert(n.label.clone(), 0);
                    let (a, b) = (self.param(Param::Int(lo)), self.param(Param::Int(hi)));
                    wh.push(format!("{f}.seq > {a} AND {f}.seq <= {b}"));
                }
            }
            from.push(format!("fact {f}"));
            wh.push(format!("{f}.type_id = {ty}"));
            scope.insert(n.label.clone(), Known::row(f));
        }
        while !pending.is_empty() {
            // The next join: from the most selective known fact (one pinned to new facts
            // before a given, a given before the rest), then in the order written.
            let mut best: Option<(u8, usize, usize, bool)> = None;
            for (pi, n) in pending.iter().enumerate() {
                for (ci, c) in conds.iter().enumerate() {
                    let Condition::Join { left, right } = c else {
                        continue;
                    };
                    if used[ci] {
                        continue;
                    }
                    let (known, forward) = if left.label.name == n.label
                        && scope.contains_key(&right.label.name)
                    {
                        (&right.label.name, false)
                    } else if right.label.name == n.label && scope.contains_key(&left.label.name) {
                        (&left.label.name, true)
                    } else {
                        continue;
                    };
                    let r = rank.get(known).copied().unwrap_or(2);
                    if best.is_none_or(|b| r < b.0) {
                        best = Some((r, pi, ci, forward));
                    }
                }
            }
            let mut placed = None;
            if let Some((r, pi, ci, forward)) = best {
                let n = pending[pi];
                let Condition::Join { left, right } = conds[ci] else {
                    unreachable!()
                };
                let (known, new) = if forward {
                    (left, right)
                } else {
                    (right, left)
                };
                used[ci] = true;
                multi |= known.roles.len() + new.roles.len() > 1;
                let start = scope[&known.label.name].seq.clone();
                let reached = self.reach(n, (&start, &known.roles), &new.roles, from, wh);
                scope.insert(n.label.clone(), reached);
                rank.insert(n.label.clone(), r);
                placed = Some(pi);
            }
            match placed {
                Some(pi) => {
                    pending.remove(pi);
                }
                None if scope.is_empty() => {
                    // A query without givens: its first match is read by type.
                    let n = pending.remove(0);
                    let f = self.alias("f");
                    let ty = self.param(Param::Type(n.type_name.clone()));
                    from.push(format!("fact {f}"));
                    wh.push(format!("{f}.type_id = {ty}"));
                    scope.insert(n.label.clone(), Known::row(f));
                }
                None => {
                    let n = pending[0];
                    return Err(QueryError {
                        line: 0,
                        column: 0,
                        message: format!("match {} is not joined to any known fact", n.label),
                    });
                }
            }
        }
        for (ci, c) in conds.iter().enumerate() {
            if !used[ci] {
                let cond = self.condition(c, scope)?;
                wh.push(cond);
            }
        }
        Ok(multi)
    }

    /// A condition whose labels are all known, as an SQL boolean expression.
    fn condition(
        &mut self,
        c: &Condition,
        scope: &HashMap<String, Known>,
    ) -> Result<String, QueryError> {
        Ok(match c {
            Condition::Join { left, right } => {
                let (mut from, mut wh) = (Vec::new(), Vec::new());
                let l = scope[&left.label.name].seq.clone();
                let r = scope[&right.label.name].seq.clone();
                let l = self.walk_up(l, &left.roles, None, &mut from, &mut wh);
                let r = self.walk_up(r, &right.roles, None, &mut from, &mut wh);
                wh.push(format!("{l} = {r}"));
                if from.is_empty() {
                    wh.join(" AND ")
                } else {
                    format!(
                        "EXISTS (SELECT 1 FROM {} WHERE {})",
                        from.join(" CROSS JOIN "),
                        wh.join(" AND ")
                    )
                }
            }
            Condition::Field {
                label, field, test, ..
            } => {
                let (op, values) = match test {
                    Test::Compare(op, v) => (op.code(), vec![v.clone()]),
                    Test::In(vs) => (crate::predicate::IN, vs.clone()),
                };
                let f = self.param(Param::Text(field.clone()));
                let o = self.param(Param::Int(op));
                let v = self.param(Param::Blob(encode_values(values)));
                let row = scope[&label.name].fact();
                format!("{}({row}.bytes, {f}, {o}, {v})", self.dialect.field_test())
            }
            Condition::Exists {
                negated, matches, ..
            } => {
                let nodes = free_nodes(matches);
                let conds: Vec<&Condition> =
                    matches.iter().flat_map(|m| m.conditions.iter()).collect();
                let mut inner = scope.clone();
                let (mut from, mut wh) = (Vec::new(), Vec::new());
                self.block(&nodes, &conds, &mut inner, &mut from, &mut wh)?;
                format!(
                    "{}EXISTS (SELECT 1 FROM {}{}{})",
                    if *negated { "NOT " } else { "" },
                    from.join(" CROSS JOIN "),
                    if wh.is_empty() { "" } else { " WHERE " },
                    wh.join(" AND ")
                )
            }
        })
    }
}

/// Encodes predicate values as the canonical bytes of a carrier fact `{"v": [values]}`,
/// so the SQL function reads them with the strict decoder.
pub(crate) fn encode_values(values: Vec<Value>) -> Vec<u8> {
    Fact::builder("q")
        .field("v", Value::Array(values))
        .build()
        .map(|f| f.canonical_bytes().to_vec())
        .unwrap_or_default()
}

/// The matches of a block as free nodes.
pub(crate) fn free_nodes(matches: &[Match]) -> Vec<Node> {
    matches
        .iter()
        .map(|m| Node {
            label: m.label.name.clone(),
            type_name: m.type_name.clone(),
            bind: Bind::Free,
        })
        .collect()
}

/// What a compiled statement selects and in what order.
pub(crate) struct Shape<'a> {
    /// Labels whose `seq, hash, bytes` are selected.
    pub output: Vec<String>,
    pub order: &'a [OrderKey],
    pub limit: Option<u64>,
    /// Force DISTINCT (watch candidate queries).
    pub distinct: bool,
    /// The dialect the backend that runs the statement speaks.
    pub dialect: Dialect,
    /// The output labels whose bytes the caller reads (it decodes their facts); `None`:
    /// all of them. On PostgreSQL the others may come with their hash and no bytes.
    pub bytes: Option<&'a HashSet<String>>,
}

/// Compiles a block (nodes and their conditions) with `outer` labels pinned by seq.
pub(crate) fn compile(
    nodes: &[Node],
    conds: &[&Condition],
    shape: &Shape<'_>,
) -> Result<Plan, QueryError> {
    compile_keyset(nodes, conds, shape, None)
}

/// One key of a keyset: where a row must sort after.
#[derive(Clone, Debug)]
pub(crate) enum After {
    /// SQL NULL (a missing or unorderable field), which sorts first.
    Null,
    /// A value, bound as this parameter.
    Value(Param),
}

/// As [`compile`], keeping only the rows that sort after a given row (a keyset: the next
/// rows of an ordered query without reading the ones before it). `after` holds one value
/// per key of `shape.order`, then the seq of each output label, as the statement orders
/// them. NULL sorts before every value, as in SQLite's `ORDER BY` (on PostgreSQL the
/// statement says `NULLS FIRST` / `NULLS LAST`).
pub(crate) fn compile_after(
    nodes: &[Node],
    conds: &[&Condition],
    shape: &Shape<'_>,
    after: &[After],
) -> Result<Plan, QueryError> {
    compile_keyset(nodes, conds, shape, Some(after))
}

/// [`compile`], and with `after` [`compile_after`].
fn compile_keyset(
    nodes: &[Node],
    conds: &[&Condition],
    shape: &Shape<'_>,
    after: Option<&[After]>,
) -> Result<Plan, QueryError> {
    let mut c = Compiler {
        dialect: shape.dialect,
        params: Vec::new(),
        aliases: 0,
        rows: HashSet::new(),
        late: HashSet::new(),
        deferred: Vec::new(),
        hash_only: HashSet::new(),
    };
    for k in shape.order {
        if let SortBy::Field(l, _) = &k.by {
            c.rows.insert(l.name.clone());
        }
    }
    labels_with_fields(conds, &mut c.rows);
    if c.dialect == Dialect::Postgres {
        c.late = shape
            .output
            .iter()
            .filter(|l| !c.rows.contains(*l))
            .cloned()
            .collect();
        if let Some(bytes) = shape.bytes {
            c.hash_only = c
                .late
                .iter()
                .filter(|l| !bytes.contains(*l))
                .cloned()
                .collect();
        }
    }
    c.rows.extend(shape.output.iter().cloned());
    let (mut from, mut wh) = (Vec::new(), Vec::new());
    let mut scope = HashMap::new();
    let multi = c.block(nodes, conds, &mut scope, &mut from, &mut wh)?;
    let late: HashSet<String> = c.deferred.drain(..).collect();
    // A late label's result columns are its seq (already known) here, completed with its
    // hash and bytes outside (see below).
    let cols: Vec<String> = shape
        .output
        .iter()
        .map(|l| {
            if late.contains(l) {
                return scope[l].seq.clone();
            }
            if scope[l].fixed.is_some() {
                // The same hash in every row: the reader fills it in.
                return format!("{}, NULL::bytea, NULL::bytea", scope[l].seq);
            }
            if let Some(hash) = &scope[l].hash {
                // Its bytes are not read (`Shape::bytes`).
                return format!("{}, {hash}, NULL::bytea", scope[l].seq);
            }
            let f = scope[l].fact();
            if c.dialect == Dialect::Postgres && shape.bytes.is_some_and(|b| !b.contains(l)) {
                // Nor are these (a given's, in every row): they would widen every row
                // the statement sorts.
                return format!("{f}.seq, {f}.hash, NULL::bytea");
            }
            format!("{f}.seq, {f}.hash, {f}.bytes")
        })
        .collect();
    // (expression, descending, a field's sort key) of each ordering key, then each
    // output label's seq.
    let mut keys: Vec<(String, bool, bool)> = Vec::new();
    for k in shape.order {
        match &k.by {
            SortBy::Field(l, field) => {
                let p = c.param(Param::Text(field.clone()));
                keys.push((
                    format!(
                        "{}({}.bytes, {p})",
                        c.dialect.field_value(),
                        scope[&l.name].fact()
                    ),
                    k.descending,
                    true,
                ));
            }
            SortBy::Seq(l) => keys.push((scope[&l.name].seq.clone(), k.descending, false)),
        }
    }
    keys.extend(
        shape
            .output
            .iter()
            .map(|l| (scope[l].seq.clone(), false, false)),
    );
    if let Some(after) = after {
        // (k1 after v1) OR (k1 IS v1 AND ((k2 after v2) OR (k2 IS v2 AND ...))).
        let mut cond = "FALSE".to_string();
        for ((e, desc, field), a) in keys.iter().zip(after).rev() {
            let (later, same) = match a {
                After::Null if *desc => ("FALSE".to_string(), format!("{e} IS NULL")),
                After::Null => (format!("{e} IS NOT NULL"), format!("{e} IS NULL")),
                After::Value(v) => {
                    // PostgreSQL's pq_field returns a bytea sort key: the bound is one too.
                    let v = match (c.dialect, field) {
                        (Dialect::Postgres, true) => Param::Blob(pg_sort_key(v)),
                        _ => v.clone(),
                    };
                    let p = c.param(v);
                    if *desc {
                        (format!("({e} < {p} OR {e} IS NULL)"), format!("{e} = {p}"))
                    } else {
                        (format!("{e} > {p}"), format!("{e} = {p}"))
                    }
                }
            };
            cond = format!("({later} OR ({same} AND {cond}))");
        }
        wh.push(cond);
    }
    let distinct = multi || shape.distinct;
    let mut cols = cols;
    if (distinct && c.dialect == Dialect::Postgres) || !late.is_empty() {
        // PostgreSQL orders a DISTINCT only by what it selects: the keys come after the
        // label columns (a function of them, so the rows stay as distinct), unread. The
        // outer statement of late rows orders by them too.
        cols.extend(keys.iter().map(|(e, _, _)| e.clone()));
    }
    let mut sql = format!(
        "SELECT {}{} FROM {}",
        if distinct { "DISTINCT " } else { "" },
        cols.join(", "),
        from.join(" CROSS JOIN ")
    );
    if !wh.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&wh.join(" AND "));
    }
    if !keys.is_empty() {
        let order: Vec<String> = keys
            .iter()
            .map(|(e, desc, field)| {
                // SQL NULL (a missing or unorderable field) sorts first, as in SQLite,
                // where PostgreSQL would put it last.
                let nulls = match (c.dialect, field, desc) {
                    (Dialect::Postgres, true, false) => " NULLS FIRST",
                    (Dialect::Postgres, true, true) => " NULLS LAST",
                    _ => "",
                };
                format!("{e}{}{nulls}", if *desc { " DESC" } else { "" })
            })
            .collect();
        sql.push_str(" ORDER BY ");
        sql.push_str(&order.join(", "));
    }
    if let Some(n) = shape.limit {
        let p = c.param(Param::Int(n.min(i64::MAX as u64) as i64));
        sql.push_str(&format!(" LIMIT {p}"));
    }
    if !late.is_empty() {
        sql = with_late_rows(
            sql,
            &shape.output,
            &late,
            &keys,
            shape.limit.is_some(),
            &mut c,
        );
    }
    let fixed = shape.output.iter().map(|l| scope[l].fixed).collect();
    Ok(Plan {
        sql,
        fixed,
        params: c.params,
        labels: shape.output.iter().map(|l| Arc::from(l.as_str())).collect(),
        types: shape
            .output
            .iter()
            .map(|l| {
                nodes
                    .iter()
                    .find(|n| &n.label == l)
                    .map_or_else(|| Arc::from(""), |n| Arc::from(n.type_name.as_str()))
            })
            .collect(),
    })
}

/// Wraps `inner` (a statement whose columns are, per output label, `seq, hash, bytes` or,
/// for a late one, its `seq` alone, then the ordering keys) in one that joins the late
/// labels' `fact` rows to its results and keeps its order.
///
/// PostgreSQL chooses the join order itself, from estimates: for "the orders of a shop
/// with no shipment" it joined every order's row before testing for a shipment (it
/// expected 9 orders a shop where there were 530), reading a page per order rather than
/// per result. The inner statement cannot be flattened into the outer one (it has a
/// `LIMIT`, else `OFFSET 0`), so every `NOT EXISTS` and edge-only condition runs before
/// any late row is read. SQLite keeps the order the compiler wrote and needs none of it.
fn with_late_rows(
    inner: String,
    output: &[String],
    late: &HashSet<String>,
    keys: &[(String, bool, bool)],
    limited: bool,
    c: &mut Compiler,
) -> String {
    let (mut cols, mut from, mut wh) = (Vec::new(), Vec::new(), Vec::new());
    let mut at = 0;
    for l in output {
        if late.contains(l) {
            let f = c.alias("f");
            cols.push(format!("{f}.seq, {f}.hash, {f}.bytes"));
            from.push(format!("fact {f}"));
            wh.push(format!("{f}.seq = q.c{at}"));
            at += 1;
        } else {
            cols.push(format!("q.c{}, q.c{}, q.c{}", at, at + 1, at + 2));
            at += 3;
        }
    }
    let order: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(i, (_, desc, field))| {
            let nulls = match (field, desc) {
                (true, false) => " NULLS FIRST",
                (true, true) => " NULLS LAST",
                _ => "",
            };
            format!("q.c{}{}{nulls}", at + i, if *desc { " DESC" } else { "" })
        })
        .collect();
    let names: Vec<String> = (0..at + keys.len()).map(|i| format!("c{i}")).collect();
    format!(
        "SELECT {} FROM ({inner}{}) AS q({}) CROSS JOIN {} WHERE {}{}",
        cols.join(", "),
        if limited { "" } else { " OFFSET 0" },
        names.join(", "),
        from.join(" CROSS JOIN "),
        wh.join(" AND "),
        if order.is_empty() {
            String::new()
        } else {
            format!(" ORDER BY {}", order.join(", "))
        }
    )
}

/// The sort key PostgreSQL's `pq_field` returns for a value bound as `p`
/// (`schema/postgres/002_query_functions.sql`): tag 01 and a number's key, 02 and text,
/// 03 and bytes; they compare bytewise as [`crate::predicate::SortKey`] orders.
pub(crate) fn pg_sort_key(p: &Param) -> Vec<u8> {
    match p {
        Param::Int(i) => pg_number_key(Number::Int(*i)),
        Param::Real(f) => pg_number_key(Number::Real(*f)),
        Param::Text(t) => [&[2u8][..], t.as_bytes()].concat(),
        Param::Blob(b) => [&[3u8][..], b].concat(),
        Param::Hash(h) => [&[3u8][..], &h.0[..]].concat(),
        Param::Type(_) | Param::Role(_) => Vec::new(),
    }
}

/// A number's sort key: the binary64 `d` nearest to it, its bits flipped so that bytes
/// order as numbers do (-0.0 as 0.0), then what is left (`n - d`, within 2^10 for a
/// 64-bit integer) plus 32768 in two bytes. Nearest rounding never reorders, and a tie
/// on `d` is settled by the rest, so the order is exact across integers and floats.
pub(crate) fn pg_number_key(n: Number) -> Vec<u8> {
    let (d, rest) = match n {
        Number::Int(i) => {
            let d = i as f64;
            // |d| <= 2^63, so d as i128 is exact.
            (d, (i128::from(i) - d as i128) as i32)
        }
        Number::Real(f) => (f, 0),
    };
    let d = if d == 0.0 { 0.0 } else { d };
    let bits = d.to_bits();
    let key = if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    };
    let mut out = Vec::with_capacity(11);
    out.push(1);
    out.extend_from_slice(&key.to_be_bytes());
    out.extend_from_slice(&((rest + 32768) as u16).to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_ids_writes_ids_into_the_text_and_numbers_the_rest_again() {
        let sql = format!(
            "SELECT $1 FROM edge e WHERE e.role_id = $2{ID_MARK} AND e.successor_type = \
             $3{ID_MARK} AND e.predecessor = $4 AND $2{ID_MARK} > 0 AND x = $10 AND t = $11{ID_MARK}"
        );
        let mut params = vec![
            SqlValue::Blob(vec![1]),
            SqlValue::Int(7),
            SqlValue::Null,
            SqlValue::Int(40),
        ];
        params.extend((5..=10).map(SqlValue::Int));
        params.push(SqlValue::Int(12));
        let (text, kept) = literal_ids(&sql, &params).unwrap();
        assert_eq!(
            text,
            "SELECT $1 FROM edge e WHERE e.role_id = 7 AND e.successor_type = NULL AND \
             e.predecessor = $2 AND 7 > 0 AND x = $8 AND t = 12"
        );
        let mut want = vec![SqlValue::Blob(vec![1]), SqlValue::Int(40)];
        want.extend((5..=10).map(SqlValue::Int));
        assert_eq!(kept, want);
        // No id: nothing to do; an id bound to something else than an integer: left as
        // it is (the text is valid SQL with its marks).
        assert!(literal_ids("SELECT $1", &[SqlValue::Int(1)]).is_none());
        let text = format!("SELECT $1{ID_MARK}");
        assert!(literal_ids(&text, &[SqlValue::Text("x".into())]).is_none());
    }
}

//! The query model: givens, matches, conditions, ordering, limit and projection, and
//! the checks every query passes before it runs (labels, connectivity, predicate types).
//!
//! The text parser ([`super::parse`]) and the builder ([`QueryBuilder`]) both produce a
//! [`Query`] and both run [`Query::check`], so the two ways in accept the same queries.

use std::collections::BTreeSet;

use super::QueryError;
use super::value::{self, Op};
use crate::fact::Value;

/// A position in the query text (1-based). Queries built in Rust have `line == 0`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pos {
    /// Line, from 1; 0 when the query was not parsed from text.
    pub line: usize,
    /// Column in characters, from 1.
    pub column: usize,
}

/// A fact label used somewhere in a query, with where it was written.
#[derive(Clone, Debug)]
pub struct Label {
    /// The name.
    pub name: String,
    /// Where it was written.
    pub pos: Pos,
}

impl From<&str> for Label {
    fn from(name: &str) -> Label {
        Label {
            name: name.to_string(),
            pos: Pos::default(),
        }
    }
}

/// A starting fact, bound by hash when the query runs.
#[derive(Clone, Debug)]
pub struct Given {
    /// Its label.
    pub label: Label,
    /// Its fact type.
    pub type_name: String,
}

/// A match: a new fact of a type, joined to the facts before it by its conditions.
#[derive(Clone, Debug)]
pub struct Match {
    /// Its label.
    pub label: Label,
    /// Its fact type.
    pub type_name: String,
    /// Conditions (all must hold).
    pub conditions: Vec<Condition>,
}

/// A fact reached from a label through zero or more predecessor roles: `o->store`.
#[derive(Clone, Debug)]
pub struct RolePath {
    /// Where the path starts.
    pub label: Label,
    /// Roles followed, in order, from successor to predecessor.
    pub roles: Vec<String>,
}

/// One condition of a match.
#[derive(Clone, Debug)]
pub enum Condition {
    /// Both paths reach the same fact: `o->store = s`, `sh->order->store = s`.
    Join {
        /// Left side.
        left: RolePath,
        /// Right side.
        right: RolePath,
    },
    /// A field predicate: `o.total >= 10`, `o.state in ["new", "open"]`.
    Field {
        /// The fact.
        label: Label,
        /// The field name.
        field: String,
        /// The test.
        test: Test,
        /// Where the operator was written.
        pos: Pos,
    },
    /// `exists (match ...)` or `not exists (match ...)`.
    Exists {
        /// `not exists`.
        negated: bool,
        /// The matches inside; they join to the labels outside.
        matches: Vec<Match>,
        /// Where `exists` was written.
        pos: Pos,
    },
}

/// What a field predicate tests.
#[derive(Clone, Debug)]
pub enum Test {
    /// A comparison with one value.
    Compare(Op, Value),
    /// Equality with one of several values.
    In(Vec<Value>),
}

impl Test {
    /// Whether a field value (absent: `None`) passes.
    pub fn passes(&self, field: Option<&Value>) -> bool {
        match self {
            Test::Compare(op, v) => value::test(field, *op, v),
            Test::In(vs) => value::test_in(field, vs),
        }
    }
}

/// What results are ordered by.
#[derive(Clone, Debug)]
pub enum SortBy {
    /// A field of a fact (see [`value::sort_key`]).
    Field(Label, String),
    /// The release sequence number of a fact: `seq(o)`.
    Seq(Label),
}

/// One ordering key.
#[derive(Clone, Debug)]
pub struct OrderKey {
    /// What to sort by.
    pub by: SortBy,
    /// Descending.
    pub descending: bool,
}

/// What each result is.
#[derive(Clone, Debug)]
pub enum Projection {
    /// The fact itself.
    Fact(Label),
    /// Its hash: `hash(o)`.
    Hash(Label),
    /// Its release sequence number: `seq(o)`.
    Seq(Label),
    /// One field (null when absent): `o.total`.
    Field(Label, String),
    /// A record of named projections: `{order: o, total: o.total}`.
    Record(Vec<(String, Projection)>),
    /// A nested collection: `[match sh: Shipment where sh->order = o select sh]`.
    Collection(Box<SubQuery>),
}

/// A nested query for a child collection, run once per result of the outer query.
#[derive(Clone, Debug)]
pub struct SubQuery {
    /// Matches joined to the outer labels.
    pub matches: Vec<Match>,
    /// Ordering.
    pub order: Vec<OrderKey>,
    /// Limit.
    pub limit: Option<u64>,
    /// Projection of each child.
    pub select: Projection,
}

/// A query: givens, matches, ordering, limit, projection.
#[derive(Clone, Debug)]
pub struct Query {
    /// Starting facts, bound by hash when run.
    pub givens: Vec<Given>,
    /// Matches, each joined to facts before it.
    pub matches: Vec<Match>,
    /// Ordering keys; results are then in release order of their facts.
    pub order: Vec<OrderKey>,
    /// Most results returned.
    pub limit: Option<u64>,
    /// What each result is.
    pub select: Projection,
}

fn err(pos: Pos, message: impl Into<String>) -> QueryError {
    QueryError {
        line: pos.line,
        column: pos.column,
        message: message.into(),
    }
}

impl Query {
    /// Parses the text syntax (see `docs/queries.md`).
    ///
    /// # Errors
    /// [`crate::Error::Query`] with the line and column of the first problem.
    pub fn parse(text: &str) -> crate::Result<Query> {
        Ok(super::parse::parse(text)?)
    }

    /// Starts a builder.
    pub fn builder() -> QueryBuilder {
        QueryBuilder {
            givens: Vec::new(),
            matches: Vec::new(),
            order: Vec::new(),
            limit: None,
        }
    }

    /// The labels whose facts make a result's identity: givens, then matches.
    pub fn top_labels(&self) -> Vec<&str> {
        self.givens
            .iter()
            .map(|g| g.label.name.as_str())
            .chain(self.matches.iter().map(|m| m.label.name.as_str()))
            .collect()
    }

    /// Checks labels, connectivity and predicate types.
    ///
    /// # Errors
    /// The first problem, with its position when the query was parsed.
    pub fn check(&self) -> Result<(), QueryError> {
        self.check_depth()?;
        let mut all = BTreeSet::new();
        let mut scope: Vec<String> = Vec::new();
        for g in &self.givens {
            define(&mut all, &g.label)?;
            scope.push(g.label.name.clone());
        }
        check_block(&self.matches, &mut scope, &mut all, true)?;
        check_order(&self.order, &scope)?;
        check_projection(&self.select, &scope, &mut all)
    }
}

/// A part of a query still to visit when measuring its depth.
enum Part<'q> {
    Matches(&'q [Match]),
    Conditions(&'q [Condition]),
    Projection(&'q Projection),
}

impl Query {
    /// Checks that `exists`, records and child collections nest at most
    /// [`MAX_NESTING`](super::parse::MAX_NESTING) levels deep, as the text parser does. A
    /// query built in Rust can be nested any depth, and the checks, the SQL compiler and
    /// the projection recurse once per level; so this walk does not recurse, and
    /// [`Query::check`] and every compilation of a query run it first.
    ///
    /// # Errors
    /// A query nested deeper, without a position (`line == 0`).
    pub fn check_depth(&self) -> Result<(), QueryError> {
        let max = super::parse::MAX_NESTING;
        // The level inside an `exists`, record or collection found at `depth`.
        let inside = |depth: usize| {
            if depth < max {
                Ok(depth + 1)
            } else {
                Err(err(
                    Pos::default(),
                    format!("nesting deeper than {max} levels of exists, records and collections"),
                ))
            }
        };
        let mut todo = vec![
            (Part::Matches(&self.matches), 0),
            (Part::Projection(&self.select), 0),
        ];
        while let Some((part, depth)) = todo.pop() {
            match part {
                Part::Matches(ms) => {
                    todo.extend(ms.iter().map(|m| (Part::Conditions(&m.conditions), depth)));
                }
                Part::Conditions(cs) => {
                    for c in cs {
                        if let Condition::Exists { matches, .. } = c {
                            todo.push((Part::Matches(matches), inside(depth)?));
                        }
                    }
                }
                Part::Projection(Projection::Record(items)) => {
                    let d = inside(depth)?;
                    todo.extend(items.iter().map(|(_, p)| (Part::Projection(p), d)));
                }
                Part::Projection(Projection::Collection(sub)) => {
                    let d = inside(depth)?;
                    todo.push((Part::Matches(&sub.matches), d));
                    todo.push((Part::Projection(&sub.select), d));
                }
                Part::Projection(_) => {}
            }
        }
        Ok(())
    }
}

fn define(all: &mut BTreeSet<String>, label: &Label) -> Result<(), QueryError> {
    if matches!(label.name.as_str(), "hash" | "seq") || !all.insert(label.name.clone()) {
        return Err(err(
            label.pos,
            format!("label {} is already used in this query", label.name),
        ));
    }
    Ok(())
}

fn known(scope: &[String], label: &Label) -> Result<(), QueryError> {
    if scope.contains(&label.name) {
        return Ok(());
    }
    Err(err(
        label.pos,
        format!(
            "unknown label {} (known here: {})",
            label.name,
            if scope.is_empty() {
                "none".to_string()
            } else {
                scope.join(", ")
            }
        ),
    ))
}

/// Checks a block of matches. `top`: the top level of a query, which may have no matches,
/// and whose first match may stand alone when there are no givens.
fn check_block(
    matches: &[Match],
    scope: &mut Vec<String>,
    all: &mut BTreeSet<String>,
    top: bool,
) -> Result<(), QueryError> {
    let may_root = top && scope.is_empty();
    if matches.is_empty() && !top {
        return Err(err(
            Pos::default(),
            "exists and child collections need at least one match",
        ));
    }
    for (i, m) in matches.iter().enumerate() {
        define(all, &m.label)?;
        let before = scope.clone();
        scope.push(m.label.name.clone());
        let mut connected = i == 0 && may_root && before.is_empty();
        for c in &m.conditions {
            match c {
                Condition::Join { left, right } => {
                    known(scope, &left.label)?;
                    known(scope, &right.label)?;
                    let (l, r) = (&left.label.name, &right.label.name);
                    if (l == &m.label.name && before.contains(r))
                        || (r == &m.label.name && before.contains(l))
                    {
                        connected = true;
                    }
                }
                Condition::Field {
                    label, test, pos, ..
                } => {
                    known(scope, label)?;
                    check_test(test, *pos)?;
                }
                Condition::Exists { matches, .. } => {
                    let mut inner = scope.clone();
                    check_block(matches, &mut inner, all, false)?;
                }
            }
        }
        if !connected {
            return Err(err(
                m.label.pos,
                format!(
                    "match {} is not joined to {}: add a condition such as {}->role = {}",
                    m.label.name,
                    if before.is_empty() {
                        "anything".to_string()
                    } else {
                        before.join(", ")
                    },
                    m.label.name,
                    before.last().map(String::as_str).unwrap_or("x"),
                ),
            ));
        }
    }
    Ok(())
}

fn check_test(test: &Test, pos: Pos) -> Result<(), QueryError> {
    match test {
        Test::Compare(op, v) if op.orders() && !value::orderable(v) => Err(err(
            pos,
            format!(
                "type mismatch: {} compares numbers, text or bytes, not {}",
                op.text(),
                kind_name(v)
            ),
        )),
        Test::In(vs) if vs.is_empty() => Err(err(pos, "in needs at least one value")),
        _ => Ok(()),
    }
}

/// The name of a value's kind, for messages.
pub(crate) fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Text(_) => "text",
        Value::Bytes(_) => "bytes",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
    }
}

fn check_order(order: &[OrderKey], scope: &[String]) -> Result<(), QueryError> {
    for k in order {
        match &k.by {
            SortBy::Field(l, _) | SortBy::Seq(l) => known(scope, l)?,
        }
    }
    Ok(())
}

fn check_projection(
    p: &Projection,
    scope: &[String],
    all: &mut BTreeSet<String>,
) -> Result<(), QueryError> {
    match p {
        Projection::Fact(l)
        | Projection::Hash(l)
        | Projection::Seq(l)
        | Projection::Field(l, _) => known(scope, l),
        Projection::Record(items) => {
            let mut names = BTreeSet::new();
            for (name, item) in items {
                if !names.insert(name) {
                    return Err(err(Pos::default(), format!("record key {name} repeated")));
                }
                check_projection(item, scope, all)?;
            }
            Ok(())
        }
        Projection::Collection(sub) => {
            let mut inner = scope.to_vec();
            check_block(&sub.matches, &mut inner, all, false)?;
            check_order(&sub.order, &inner)?;
            check_projection(&sub.select, &inner, all)
        }
    }
}

/// Builds a [`Query`] in Rust; [`QueryBuilder::select`] checks it as the parser does.
///
/// ```
/// use precedent::query::{Cond, Query, Projection};
///
/// let q = Query::builder()
///     .given("s", "Shop")
///     .matching("o", "Shop.Order", [
///         Cond::join("o", &["shop"], "s", &[]),
///         Cond::not_exists([("sh", "Shop.Shipment", vec![Cond::join("sh", &["order"], "o", &[])])]),
///     ])
///     .select(Projection::Fact("o".into()))?;
/// assert_eq!(q.top_labels(), ["s", "o"]);
/// # Ok::<(), precedent::query::QueryError>(())
/// ```
#[derive(Clone, Debug)]
pub struct QueryBuilder {
    givens: Vec<Given>,
    matches: Vec<Match>,
    order: Vec<OrderKey>,
    limit: Option<u64>,
}

/// Shorthands for building conditions.
pub struct Cond;

impl Cond {
    /// `left->roles.. = right->roles..`
    pub fn join(left: &str, left_roles: &[&str], right: &str, right_roles: &[&str]) -> Condition {
        let path = |l: &str, r: &[&str]| RolePath {
            label: l.into(),
            roles: r.iter().map(|s| s.to_string()).collect(),
        };
        Condition::Join {
            left: path(left, left_roles),
            right: path(right, right_roles),
        }
    }

    /// `label.field OP value`
    pub fn field(label: &str, field: &str, op: Op, value: impl Into<Value>) -> Condition {
        Condition::Field {
            label: label.into(),
            field: field.to_string(),
            test: Test::Compare(op, value.into()),
            pos: Pos::default(),
        }
    }

    /// `label.field in [values]`
    pub fn field_in(label: &str, field: &str, values: Vec<Value>) -> Condition {
        Condition::Field {
            label: label.into(),
            field: field.to_string(),
            test: Test::In(values),
            pos: Pos::default(),
        }
    }

    /// `exists (match ...)`, matches given as (label, type, conditions).
    pub fn exists<'a>(
        matches: impl IntoIterator<Item = (&'a str, &'a str, Vec<Condition>)>,
    ) -> Condition {
        Cond::exists_(false, matches)
    }

    /// `not exists (match ...)`.
    pub fn not_exists<'a>(
        matches: impl IntoIterator<Item = (&'a str, &'a str, Vec<Condition>)>,
    ) -> Condition {
        Cond::exists_(true, matches)
    }

    fn exists_<'a>(
        negated: bool,
        matches: impl IntoIterator<Item = (&'a str, &'a str, Vec<Condition>)>,
    ) -> Condition {
        Condition::Exists {
            negated,
            matches: matches
                .into_iter()
                .map(|(l, t, c)| Match {
                    label: l.into(),
                    type_name: t.to_string(),
                    conditions: c,
                })
                .collect(),
            pos: Pos::default(),
        }
    }
}

impl QueryBuilder {
    /// Adds a given.
    pub fn given(mut self, label: &str, type_name: &str) -> QueryBuilder {
        self.givens.push(Given {
            label: label.into(),
            type_name: type_name.to_string(),
        });
        self
    }

    /// Adds a match with its conditions.
    pub fn matching(
        mut self,
        label: &str,
        type_name: &str,
        conditions: impl IntoIterator<Item = Condition>,
    ) -> QueryBuilder {
        self.matches.push(Match {
            label: label.into(),
            type_name: type_name.to_string(),
            conditions: conditions.into_iter().collect(),
        });
        self
    }

    /// Orders by a field.
    pub fn order_by_field(mut self, label: &str, field: &str, descending: bool) -> QueryBuilder {
        self.order.push(OrderKey {
            by: SortBy::Field(label.into(), field.to_string()),
            descending,
        });
        self
    }

    /// Orders by release sequence.
    pub fn order_by_seq(mut self, label: &str, descending: bool) -> QueryBuilder {
        self.order.push(OrderKey {
            by: SortBy::Seq(label.into()),
            descending,
        });
        self
    }

    /// Limits the number of results.
    pub fn limit(mut self, n: u64) -> QueryBuilder {
        self.limit = Some(n);
        self
    }

    /// Sets the projection and checks the query.
    ///
    /// # Errors
    /// As [`Query::check`].
    pub fn select(self, select: Projection) -> Result<Query, QueryError> {
        let q = Query {
            givens: self.givens,
            matches: self.matches,
            order: self.order,
            limit: self.limit,
            select,
        };
        q.check()?;
        Ok(q)
    }
}

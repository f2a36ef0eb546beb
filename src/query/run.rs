//! Running a query: binding givens, compiling, reading rows through the store, and
//! building each result's projection (child collections run once per result).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::QueryError;
use super::model::*;
use super::sql::{self, After, Bind, Node, Param, Plan, Shape, literal_ids};
use super::value::{Number, SortKey, sort_key};
use crate::error::Result;
use crate::fact::{Fact, Value};
use crate::hash::FactHash;
use crate::json::JsonValue;
use crate::store::{Arg, Dialect, ReadTx, Row, SqlValue as Sql, Store, ValueRef};

/// The facts a query starts from: given label to hash.
pub type Givens = HashMap<String, FactHash>;

/// One result's value, as the query's `select` describes it.
#[derive(Clone, Debug, PartialEq)]
pub enum Projected {
    /// A fact.
    Fact(Fact),
    /// A fact's hash.
    Hash(FactHash),
    /// A fact's release sequence number.
    Seq(i64),
    /// A field value; `None` when the fact has no such field.
    Field(Option<Value>),
    /// A record.
    Record(Vec<(String, Projected)>),
    /// A child collection.
    Collection(Vec<Projected>),
}

impl Projected {
    /// The JSON form: a fact as `json::to_json`, a hash as hex text, a missing field as
    /// null, a record as an object, a collection as an array.
    pub fn to_json(&self) -> JsonValue {
        match self {
            Projected::Fact(f) => crate::json::to_json(f),
            Projected::Hash(h) => JsonValue::String(h.to_string()),
            Projected::Seq(s) => JsonValue::from(*s),
            Projected::Field(v) => v
                .as_ref()
                .map_or(JsonValue::Null, crate::json::value_to_json),
            Projected::Record(items) => JsonValue::Object(
                items
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
            Projected::Collection(items) => {
                JsonValue::Array(items.iter().map(|p| p.to_json()).collect())
            }
        }
    }

    /// Writes the JSON form ([`Projected::to_json`]) to `out`, byte for byte as
    /// `serde_json::to_writer` of it would: a hash or a sequence number directly, the
    /// rest through [`Projected::to_json`].
    ///
    /// # Errors
    /// Those of `out`.
    pub fn write_json(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        match self {
            Projected::Hash(h) => {
                out.write_all(b"\"")?;
                out.write_all(&h.hex_digits())?;
                out.write_all(b"\"")
            }
            Projected::Seq(s) => write!(out, "{s}"),
            p => serde_json::to_writer(out, &p.to_json()).map_err(std::io::Error::from),
        }
    }
}

/// One result of a query.
#[derive(Clone, Debug, PartialEq)]
pub struct QueryRow {
    /// The release sequence numbers of the result's facts, one per given and top-level
    /// match in the order written: the result's identity.
    pub key: Vec<i64>,
    /// The projection.
    pub value: Projected,
    /// The values of the query's `order by` keys for this result, one per key (a field's
    /// [`SortKey`], a `seq(..)` as a number); empty without `order by`. Results are in the
    /// order of these keys (each reversed when `desc`), then of `key`: see
    /// [`QueryRow::cmp_in`].
    pub order: Vec<SortKey>,
}

impl QueryRow {
    /// Where this result sorts against `other` in `query`'s order: its `order by` keys,
    /// then `key` (release order), as the compiled SQL orders them.
    pub fn cmp_in(&self, other: &QueryRow, query: &Query) -> std::cmp::Ordering {
        for ((a, b), k) in self.order.iter().zip(&other.order).zip(&query.order) {
            let o = a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal);
            let o = if k.descending { o.reverse() } else { o };
            if o.is_ne() {
                return o;
            }
        }
        self.key.cmp(&other.key)
    }
}

/// A fact bound to a label in one result row. Its bytes are decoded (and their hash
/// checked) only when the projection reads the fact or a field.
#[derive(Clone, Debug)]
pub(crate) struct Bound {
    pub seq: i64,
    pub hash: FactHash,
    pub type_name: Arc<str>,
    pub fact: Option<Fact>,
}

/// The facts bound to the labels of one result row (the label names shared with the
/// plan that read it), in the plan's order: a row has a few labels, so a look-up walks
/// them, which costs less than hashing the name (one `Env` is built per result).
pub(crate) struct Env(Vec<(Arc<str>, Bound)>);

impl Env {
    fn with_capacity(n: usize) -> Env {
        Env(Vec::with_capacity(n))
    }

    /// Binds `label`, which a plan's labels hold once each.
    fn insert(&mut self, label: Arc<str>, bound: Bound) {
        self.0.push((label, bound));
    }

    fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Bound)> {
        self.0.iter().map(|(l, b)| (l, b))
    }
}

impl std::ops::Index<&str> for Env {
    type Output = Bound;

    fn index(&self, label: &str) -> &Bound {
        self.0
            .iter()
            .find(|(l, _)| &**l == label)
            .map(|(_, b)| b)
            .unwrap_or_else(|| panic!("label {label} is bound in every row of its plan"))
    }
}

/// One result row as read, in its plan's label order: each label's sequence number, hash
/// and, for a label the projection reads, the fact's bytes, not yet decoded.
pub(crate) struct RawRow(Vec<(i64, FactHash, Option<Vec<u8>>)>);

impl RawRow {
    /// The row's facts bound to the labels of `plan` (the plan that read it), the bytes
    /// read decoded and their hashes checked.
    pub(crate) fn env(self, plan: &Plan) -> Result<Env> {
        let mut env = Env::with_capacity(self.0.len());
        for (i, (seq, hash, bytes)) in self.0.into_iter().enumerate() {
            let label = &plan.labels[i];
            let fact = match bytes {
                Some(bytes) => Some(crate::encoding::decode_fact(&bytes, Some(hash)).map_err(
                    |e| crate::Error::Corrupt {
                        hash,
                        reason: e.to_string(),
                    },
                )?),
                None => None,
            };
            let bound = Bound {
                seq,
                hash,
                type_name: plan.types[i].clone(),
                fact,
            };
            env.insert(label.clone(), bound);
        }
        Ok(env)
    }
}

/// Labels whose facts a projection reads (the fact itself or a field), at this level.
pub(crate) fn labels_read(p: &Projection, out: &mut HashSet<String>) {
    match p {
        Projection::Fact(l) | Projection::Field(l, _) => {
            out.insert(l.name.clone());
        }
        Projection::Record(items) => items.iter().for_each(|(_, v)| labels_read(v, out)),
        Projection::Hash(_) | Projection::Seq(_) | Projection::Collection(_) => {}
    }
}

impl Store {
    /// Runs a query with its givens bound by hash. A given that is not released yields no
    /// results. Every result is read from one snapshot. All results are held at once:
    /// [`Store::query_each`] and [`Store::query_iter`] hand them out as they are read.
    ///
    /// # Errors
    /// [`crate::Error::Query`] if a given label is not bound; [`crate::Error::Corrupt`],
    /// [`crate::Error::Backend`].
    pub fn query(&self, query: &Query, givens: &Givens) -> Result<Vec<QueryRow>> {
        let mut out = Vec::new();
        self.query_each(query, givens, |row| {
            out.push(row);
            Ok(())
        })?;
        Ok(out)
    }

    /// Parses and runs a query in the text syntax.
    ///
    /// # Errors
    /// As [`Query::parse`] and [`Store::query`].
    pub fn query_text(&self, text: &str, givens: &Givens) -> Result<Vec<QueryRow>> {
        self.query(&Query::parse(text)?, givens)
    }

    /// `EXPLAIN QUERY PLAN` of the statement a query compiles to (top level only; child
    /// collections are separate statements), one line per step.
    ///
    /// # Errors
    /// As [`Store::query`].
    pub fn explain(&self, query: &Query, givens: &Givens) -> Result<Vec<String>> {
        let plan = top_plan(self.dialect(), query, givens, None)?;
        self.read(|r| {
            let r = Reader(r);
            r.query_plan(&plan.sql, &r.bind(&plan.params)?)
        })
    }

    /// The SQL a query compiles to, with its parameters in order (for tests and tools).
    ///
    /// # Errors
    /// As [`Store::query`].
    pub fn compiled_sql(&self, query: &Query, givens: &Givens) -> Result<(String, Vec<String>)> {
        let plan = top_plan(self.dialect(), query, givens, None)?;
        let params = self
            .read(|r| Reader(r).bind(&plan.params))?
            .iter()
            .map(|v| format!("{v:?}"))
            .collect();
        Ok((plan.sql, params))
    }
}

/// The query layer's view of one read transaction: compiled statements run through the
/// store's seam, with the values they bind and read kept backend-neutral.
pub(crate) struct Reader<'a>(pub(crate) &'a dyn ReadTx);

#[cfg(test)]
thread_local! {
    /// Makes the next [`Reader::rows_bound`] on this thread fail (a statement's error part
    /// way through a watch's poll).
    pub(crate) static FAIL_NEXT_ROWS_BOUND: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

impl Reader<'_> {
    /// Runs a query in this transaction, handing each result to `f` as its row is read:
    /// one statement, stepped once, with each result's child collections read while it
    /// is at that row (see [`Store::query_each`]).
    pub(crate) fn query_each(
        &self,
        query: &Query,
        givens: &Givens,
        f: &mut dyn FnMut(QueryRow) -> Result<()>,
    ) -> Result<()> {
        let plan = top_plan(self.dialect(), query, givens, None)?;
        let decode = decode_top(query);
        let streamed = !reads_collection(&query.select);
        self.each_row(
            &plan,
            &self.bind(&plan.params)?,
            &decode,
            streamed,
            &mut |env| f(self.row(query, &env)?),
        )
    }

    /// Runs a compiled read-only statement, calling `f` for each row; `streamed`: as
    /// each row arrives, when `f` runs no statement of its own ([`Sql::query_streamed`]).
    pub(crate) fn run_query(
        &self,
        sql: &str,
        params: &[Sql],
        streamed: bool,
        mut f: impl FnMut(&Row<'_>) -> Result<()>,
    ) -> Result<()> {
        let literal = literal_ids(sql, params);
        let (sql, params) = literal.as_ref().map_or((sql, params), |(s, p)| (s, p));
        let args: Vec<Arg<'_>> = params.iter().map(Arg::from).collect();
        if streamed {
            self.0.query_streamed(sql, &args, &mut f)
        } else {
            self.0.query(sql, &args, &mut f)
        }
    }

    /// The plan the database chooses for a compiled statement, one line per step.
    pub(crate) fn query_plan(&self, sql: &str, params: &[Sql]) -> Result<Vec<String>> {
        let literal = literal_ids(sql, params);
        let (sql, params) = literal.as_ref().map_or((sql, params), |(s, p)| (s, p));
        let args: Vec<Arg<'_>> = params.iter().map(Arg::from).collect();
        self.0.plan(sql, &args)
    }

    /// The dialect of the backend the statements run on.
    pub(crate) fn dialect(&self) -> Dialect {
        self.0.dialect()
    }

    /// The id of a fact type (`role == false`) or role name, if any fact uses it.
    pub(crate) fn name_id(&self, role: bool, name: &str) -> Result<Option<i64>> {
        self.0.name_id(role, name)
    }

    /// The release sequence number of a fact, if released.
    pub(crate) fn seq_of(&self, hash: &FactHash) -> Result<Option<i64>> {
        self.0.seq_of(hash)
    }

    /// The sequence number and type id of each fact released after `after`.
    pub(crate) fn released_types(&self, after: i64) -> Result<Vec<(i64, i64)>> {
        self.0.released_types(after)
    }

    /// The highest release sequence number.
    pub(crate) fn last_seq(&self) -> Result<i64> {
        self.0.last_seq()
    }

    pub(crate) fn bind(&self, params: &[Param]) -> Result<Vec<Sql>> {
        params
            .iter()
            .map(|p| {
                Ok(match p {
                    Param::Hash(h) => Sql::Blob(h.0.to_vec()),
                    Param::Type(t) => self.name_id(false, t)?.map_or(Sql::Null, Sql::Int),
                    Param::Role(r) => self.name_id(true, r)?.map_or(Sql::Null, Sql::Int),
                    Param::Int(i) => Sql::Int(*i),
                    Param::Real(r) => Sql::Real(*r),
                    Param::Text(t) => Sql::Text(t.clone()),
                    Param::Blob(b) => Sql::Blob(b.clone()),
                })
            })
            .collect()
    }

    /// Runs a plan; each row as label to its bound fact, decoding only `decode`.
    pub(crate) fn rows(&self, plan: &Plan, decode: &HashSet<String>) -> Result<Vec<Env>> {
        self.rows_bound(plan, &self.bind(&plan.params)?, decode)
    }

    /// As [`Reader::rows`], with the parameters already bound (a watch binds its own).
    pub(crate) fn rows_bound(
        &self,
        plan: &Plan,
        params: &[Sql],
        decode: &HashSet<String>,
    ) -> Result<Vec<Env>> {
        #[cfg(test)]
        if FAIL_NEXT_ROWS_BOUND.with(|f| f.replace(false)) {
            return Err(crate::Error::Backend(crate::error::BackendError::new(
                crate::error::BackendErrorKind::Unavailable,
                "a failure injected by a test",
            )));
        }
        self.raw_rows_bound(plan, params, decode)?
            .into_iter()
            .map(|raw| raw.env(plan))
            .collect()
    }

    /// Runs a plan, calling `f` with each row as it is read (see [`Reader::rows`]);
    /// `streamed` as in [`Reader::run_query`].
    pub(crate) fn each_row(
        &self,
        plan: &Plan,
        params: &[Sql],
        decode: &HashSet<String>,
        streamed: bool,
        f: &mut dyn FnMut(Env) -> Result<()>,
    ) -> Result<()> {
        self.each_raw(plan, params, decode, streamed, &mut |raw| f(raw.env(plan)?))
    }

    /// As [`Reader::rows_bound`], each row as read, its bytes not yet decoded: the work
    /// left to do outside the read transaction ([`RawRow::env`]).
    pub(crate) fn raw_rows_bound(
        &self,
        plan: &Plan,
        params: &[Sql],
        decode: &HashSet<String>,
    ) -> Result<Vec<RawRow>> {
        let mut out = Vec::new();
        self.each_raw(plan, params, decode, true, &mut |raw| {
            out.push(raw);
            Ok(())
        })?;
        Ok(out)
    }

    fn each_raw(
        &self,
        plan: &Plan,
        params: &[Sql],
        decode: &HashSet<String>,
        streamed: bool,
        f: &mut dyn FnMut(RawRow) -> Result<()>,
    ) -> Result<()> {
        // Which labels' bytes are read, looked up once for the statement, not per row.
        let wanted: Vec<bool> = plan.labels.iter().map(|l| decode.contains(&**l)).collect();
        self.run_query(&plan.sql, params, streamed, |r| {
            let mut row = Vec::with_capacity(plan.labels.len());
            for (i, &want) in wanted.iter().enumerate() {
                let seq: i64 = r.get(i * 3)?;
                let hash = match plan.fixed[i] {
                    Some(h) => h,
                    None => r.hash(i * 3 + 1)?,
                };
                let bytes = if want {
                    let ValueRef::Blob(bytes) = r.value(i * 3 + 2)? else {
                        return Err(crate::Error::Corrupt {
                            hash,
                            reason: "stored bytes are not a blob".into(),
                        });
                    };
                    Some(bytes.to_vec())
                } else {
                    None
                };
                row.push((seq, hash, bytes));
            }
            f(RawRow(row))
        })
    }

    /// Builds the result for one row.
    pub(crate) fn row(&self, query: &Query, env: &Env) -> Result<QueryRow> {
        row_in(Some(self), query, env)
    }
}

/// Builds the result for one row of a query whose projection reads no collection
/// ([`reads_collection`]), outside any transaction.
pub(crate) fn row_plain(query: &Query, env: &Env) -> Result<QueryRow> {
    row_in(None, query, env)
}

/// Whether a projection reads a child collection, which takes a query of its own.
pub(crate) fn reads_collection(p: &Projection) -> bool {
    match p {
        Projection::Collection(_) => true,
        Projection::Record(items) => items.iter().any(|(_, v)| reads_collection(v)),
        Projection::Fact(_) | Projection::Hash(_) | Projection::Seq(_) | Projection::Field(..) => {
            false
        }
    }
}

fn row_in(reader: Option<&Reader<'_>>, query: &Query, env: &Env) -> Result<QueryRow> {
    let order = query
        .order
        .iter()
        .map(|k| match &k.by {
            SortBy::Field(l, f) => sort_key(decoded(env, &l.name).field(f)),
            SortBy::Seq(l) => SortKey::Number(Number::Int(env[l.name.as_str()].seq)),
        })
        .collect();
    Ok(QueryRow {
        key: query.top_labels().iter().map(|l| env[*l].seq).collect(),
        value: project_in(reader, &query.select, env)?,
        order,
    })
}

/// A projection of one row; `reader` runs the queries of its child collections (given
/// whenever [`reads_collection`]).
fn project_in(reader: Option<&Reader<'_>>, p: &Projection, env: &Env) -> Result<Projected> {
    Ok(match p {
        Projection::Fact(l) => Projected::Fact(decoded(env, &l.name).clone()),
        Projection::Hash(l) => Projected::Hash(env[l.name.as_str()].hash),
        Projection::Seq(l) => Projected::Seq(env[l.name.as_str()].seq),
        Projection::Field(l, f) => Projected::Field(decoded(env, &l.name).field(f).cloned()),
        Projection::Record(items) => Projected::Record(
            items
                .iter()
                .map(|(k, v)| Ok((k.clone(), project_in(reader, v, env)?)))
                .collect::<Result<_>>()?,
        ),
        Projection::Collection(sub) => {
            let reader = reader.expect("a projection reading a collection is given a reader");
            let mut nodes: Vec<Node> = env
                .iter()
                .map(|(label, b)| Node {
                    label: label.to_string(),
                    type_name: b.type_name.to_string(),
                    bind: Bind::Seq(b.seq),
                })
                .collect();
            nodes.sort_by_key(|n| n.label.clone());
            nodes.extend(sql::free_nodes(&sub.matches));
            let conds: Vec<&Condition> = sub
                .matches
                .iter()
                .flat_map(|m| m.conditions.iter())
                .collect();
            let output = nodes.iter().map(|n| n.label.clone()).collect();
            let plan = sql::compile(
                &nodes,
                &conds,
                &Shape {
                    output,
                    order: &sub.order,
                    limit: sub.limit,
                    distinct: false,
                    dialect: reader.dialect(),
                    bytes: None,
                },
            )?;
            let mut items = Vec::new();
            for child in reader.rows(&plan, &decode_set(&sub.select))? {
                items.push(project_in(Some(reader), &sub.select, &child)?);
            }
            Projected::Collection(items)
        }
    })
}

/// The labels a query's results need decoded: its projection's, and those it orders by a
/// field.
pub(crate) fn decode_top(query: &Query) -> HashSet<String> {
    let mut out = decode_set(&query.select);
    for k in &query.order {
        if let SortBy::Field(l, _) = &k.by {
            out.insert(l.name.clone());
        }
    }
    out
}

/// The labels a projection needs decoded.
pub(crate) fn decode_set(p: &Projection) -> HashSet<String> {
    let mut out = HashSet::new();
    labels_read(p, &mut out);
    out
}

/// The fact of a label that [`decode_set`] asked to be decoded.
fn decoded<'e>(env: &'e Env, label: &str) -> &'e Fact {
    env[label]
        .fact
        .as_ref()
        .expect("the projection's labels are decoded")
}

/// The top-level nodes: givens bound by hash, then matches (free, or pinned by `pins`).
pub(crate) fn top_nodes(
    query: &Query,
    givens: &Givens,
    pins: Option<&HashMap<String, Bind>>,
) -> Result<Vec<Node>, QueryError> {
    // A query may be built without `Query::check` (its fields are public).
    query.check_depth()?;
    let mut nodes = Vec::new();
    for g in &query.givens {
        let Some(h) = givens.get(&g.label.name) else {
            return Err(QueryError {
                line: g.label.pos.line,
                column: g.label.pos.column,
                message: format!("given {} is not bound to a fact", g.label.name),
            });
        };
        nodes.push(Node {
            label: g.label.name.clone(),
            type_name: g.type_name.clone(),
            bind: Bind::Given(*h),
        });
    }
    nodes.extend(sql::free_nodes(&query.matches));
    if let Some(pins) = pins {
        for n in &mut nodes {
            if let Some(b) = pins.get(&n.label) {
                n.bind = *b;
            }
        }
        // Pinned facts first: the walk starts from them.
        nodes.sort_by_key(|n| matches!(n.bind, Bind::Free | Bind::Given(_)));
    }
    Ok(nodes)
}

/// The top-level statement, optionally with some labels pinned.
pub(crate) fn top_plan(
    dialect: Dialect,
    query: &Query,
    givens: &Givens,
    pins: Option<&HashMap<String, Bind>>,
) -> Result<Plan, QueryError> {
    let nodes = top_nodes(query, givens, pins)?;
    let conds: Vec<&Condition> = query
        .matches
        .iter()
        .flat_map(|m| m.conditions.iter())
        .collect();
    let output = query.top_labels().iter().map(|s| s.to_string()).collect();
    // Every caller of an unpinned plan decodes `decode_top(query)` of its rows.
    let decode = decode_top(query);
    sql::compile(
        &nodes,
        &conds,
        &Shape {
            output,
            order: &query.order,
            limit: if pins.is_some() { None } else { query.limit },
            distinct: false,
            dialect,
            bytes: pins.is_none().then_some(&decode),
        },
    )
}

/// The top-level statement for the first `limit` results that sort after `row`, in order
/// (a keyset over the query's order).
pub(crate) fn top_plan_after(
    dialect: Dialect,
    query: &Query,
    givens: &Givens,
    row: &QueryRow,
    limit: u64,
) -> Result<Plan, QueryError> {
    top_plan_after_key(dialect, query, givens, (&row.order, &row.key), limit)
}

/// As [`top_plan_after`], after the result with these `order by` values and key.
pub(crate) fn top_plan_after_key(
    dialect: Dialect,
    query: &Query,
    givens: &Givens,
    (order, key): (&[SortKey], &[i64]),
    limit: u64,
) -> Result<Plan, QueryError> {
    let nodes = top_nodes(query, givens, None)?;
    let conds: Vec<&Condition> = query
        .matches
        .iter()
        .flat_map(|m| m.conditions.iter())
        .collect();
    let mut after: Vec<After> = order
        .iter()
        .map(|k| match k {
            SortKey::Null => After::Null,
            SortKey::Number(Number::Int(n)) => After::Value(Param::Int(*n)),
            SortKey::Number(Number::Real(n)) => After::Value(Param::Real(*n)),
            SortKey::Text(t) => After::Value(Param::Text(String::from_utf8_lossy(t).into())),
            SortKey::Bytes(b) => After::Value(Param::Blob(b.clone())),
        })
        .collect();
    after.extend(key.iter().map(|s| After::Value(Param::Int(*s))));
    let output = query.top_labels().iter().map(|s| s.to_string()).collect();
    sql::compile_after(
        &nodes,
        &conds,
        &Shape {
            output,
            order: &query.order,
            limit: Some(limit),
            distinct: false,
            dialect,
            bytes: None,
        },
        &after,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of projection, nested.
    fn projections() -> Vec<Projected> {
        let f = Fact::builder("Shop")
            .field("name", "a \"quoted\"\nname")
            .field("n", 7)
            .build()
            .unwrap();
        let h = f.hash();
        let leaves = vec![
            Projected::Hash(h),
            Projected::Seq(0),
            Projected::Seq(-42),
            Projected::Seq(i64::MAX),
            Projected::Field(None),
            Projected::Field(f.field("name").cloned()),
            Projected::Fact(f.clone()),
        ];
        let mut all = leaves.clone();
        all.push(Projected::Record(vec![
            ("z".into(), Projected::Hash(h)),
            ("a".into(), Projected::Seq(3)),
            ("m".into(), Projected::Record(vec![])),
        ]));
        all.push(Projected::Collection(leaves));
        all.push(Projected::Collection(vec![]));
        all
    }

    #[test]
    fn written_json_is_serde_json_of_the_json_form() {
        for p in projections() {
            let mut direct = Vec::new();
            p.write_json(&mut direct).unwrap();
            assert_eq!(
                String::from_utf8(direct).unwrap(),
                serde_json::to_string(&p.to_json()).unwrap(),
                "{p:?}"
            );
        }
    }
}

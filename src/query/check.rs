//! Names a query uses that the store has never seen.
//!
//! A query names fact types, roles and fields as text, and a misspelled one is no error to
//! the compiler: it matches nothing. So `match o: Shop.Ordr` gives no result, `o.totl` a
//! column of nulls, and `not exists (match sh: Shop.Shipmnt ...)` holds for every order.
//! [`QueryCheck`] looks each name up in what the store knows and reports the ones that no
//! stored fact has, with the nearest known names:
//!
//! - a type is known if a released fact has it (the store's table of type names), a
//!   declared queue names it, or a [`FactType`] registered with [`QueryCheck::fact_type`]
//!   is of it;
//! - a role likewise: a released fact names a predecessor through it, a queue's completion
//!   or system facts use it, or a registered type has it;
//! - a field of a type is known if a registered type or a queue's required fields name it,
//!   or a stored fact of the type has it. Fields are not interned, so this reads the
//!   type's facts, newest first, a page at a time, until every field the query names is
//!   found: one page for fields that recent facts carry, the whole type for a field that
//!   no fact has. A type no fact has yet gets no field warnings unless it is registered.
//!
//! Facts of a type may legitimately not exist yet, so an unknown name is a
//! [`QueryWarning`]; [`QueryCheck::strict`] makes it an error.
//!
//! ```
//! use precedent::{Fact, Store};
//! use precedent::query::{Query, QueryCheck};
//!
//! let store = Store::open_in_memory()?;
//! store.insert(&Fact::builder("Shop.Order").field("total", 5).build()?)?;
//! let q = Query::parse("match o: Shop.Ordr select o.totl")?;
//! let warnings = store.check_query(&q)?;
//! assert_eq!(
//!     warnings[0].to_string(),
//!     "query at line 1, column 7: no fact of type Shop.Ordr is stored; did you mean Shop.Order?"
//! );
//! assert!(QueryCheck::new().strict(true).run(&store, &q).is_err());
//! # Ok::<(), precedent::Error>(())
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{Deserializer, Error as _, Visitor};
use serde::forward_to_deserialize_any;

use super::QueryError;
use super::model::{Condition, Match, Pos, Projection, Query, SortBy};
use super::nearest::nearest;
use super::typed::FactType;
use crate::args;
use crate::error::Result;
use crate::queue::system;
use crate::store::{ReadTx, Row, Store};

/// Facts read per statement while looking for a query's fields.
const FIELD_PAGE: i64 = 256;

/// Distinct field names kept from the facts read, to suggest from.
const MAX_SEEN_FIELDS: usize = 10_000;

/// What a query names that no stored fact has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unknown {
    /// A fact type.
    Type(String),
    /// A predecessor role.
    Role(String),
    /// A field of a fact type.
    Field {
        /// The type of the fact the field is read from.
        type_name: String,
        /// The field.
        field: String,
    },
}

/// A name of a query that no stored fact, declared queue or registered type has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryWarning {
    /// Where the name is used first (the label it belongs to); line 0 for a query built in
    /// Rust.
    pub pos: Pos,
    /// The name.
    pub unknown: Unknown,
    /// The nearest known names, nearest first (at most three; none when nothing is near).
    pub suggestions: Vec<String>,
}

impl QueryWarning {
    /// The warning as a query error at its position, for a strict check.
    pub fn to_error(&self) -> QueryError {
        let mut message = match &self.unknown {
            Unknown::Type(t) => format!("no fact of type {t} is stored"),
            Unknown::Role(r) => format!("no stored fact has the role {r}"),
            Unknown::Field { type_name, field } => {
                format!("no stored fact of type {type_name} has the field {field}")
            }
        };
        if !self.suggestions.is_empty() {
            message.push_str(&format!(
                "; did you mean {}?",
                self.suggestions.join(" or ")
            ));
        }
        QueryError {
            line: self.pos.line,
            column: self.pos.column,
            message,
        }
    }
}

impl fmt::Display for QueryWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.to_error().fmt(f)
    }
}

/// The names registered types and declared queues make known.
#[derive(Clone, Debug, Default)]
struct Declared {
    types: BTreeSet<String>,
    roles: BTreeSet<String>,
    /// Fields known by type.
    fields: BTreeMap<String, BTreeSet<String>>,
    /// Types whose every field is in `fields`: registered ones read as structs. A queue's
    /// required fields need not be all of its input's.
    complete: BTreeSet<String>,
}

/// How a query's names are checked against the store ([`Store::check_query`] runs the
/// default one).
#[derive(Clone, Debug, Default)]
pub struct QueryCheck {
    strict: bool,
    registered: Declared,
}

impl QueryCheck {
    /// A check that knows what the store and its declared queues know.
    pub fn new() -> QueryCheck {
        QueryCheck::default()
    }

    /// With `strict`, an unknown name is an error ([`crate::Error::Query`] at the first
    /// one's position) instead of a warning.
    pub fn strict(mut self, strict: bool) -> QueryCheck {
        self.strict = strict;
        self
    }

    /// Makes a typed fact's type, roles and serialised fields known, so a query may name
    /// them before any such fact is stored. The fields are those serde's derived
    /// `Deserialize` lists for a struct; a type read otherwise (a flattened map) adds its
    /// roles only.
    pub fn fact_type<T: FactType>(mut self) -> QueryCheck {
        let r = &mut self.registered;
        r.types.insert(T::TYPE.to_string());
        let roles: BTreeSet<String> = T::PREDECESSORS.iter().map(|(n, _)| n.to_string()).collect();
        let names = serde_fields::<T>();
        if !names.is_empty() {
            r.complete.insert(T::TYPE.to_string());
        }
        let fields = r.fields.entry(T::TYPE.to_string()).or_default();
        let not_roles = names.into_iter().filter(|f| !roles.contains(*f));
        fields.extend(not_roles.map(String::from));
        r.roles.extend(roles);
        self
    }

    /// The query's unknown names, each once, in the order the query uses them: types,
    /// then roles, then fields.
    ///
    /// # Errors
    /// [`crate::Error::Backend`]; [`crate::Error::Query`] for a query nested too deep
    /// ([`Query::check_depth`]) and, with [`QueryCheck::strict`], for the first unknown
    /// name (the message counts the others).
    pub fn run(&self, store: &Store, query: &Query) -> Result<Vec<QueryWarning>> {
        // The walk below recurses once per level, as the compiler does.
        query.check_depth()?;
        let mut known = self.registered.clone();
        add_queues(&mut known, store)?;
        let uses = Uses::of(query);
        let warnings = store.read(|r| check(r, &uses, &known))?;
        match warnings.first() {
            Some(first) if self.strict => {
                let mut e = first.to_error();
                match warnings.len() - 1 {
                    0 => {}
                    1 => e.message.push_str(" (and 1 more unknown name)"),
                    n => e
                        .message
                        .push_str(&format!(" (and {n} more unknown names)")),
                }
                Err(e.into())
            }
            _ => Ok(warnings),
        }
    }
}

impl Store {
    /// The names `query` uses that no stored fact and no declared queue has, with the
    /// nearest known names ([`QueryCheck`]; `QueryCheck::new().run(store, query)`).
    ///
    /// # Errors
    /// [`crate::Error::Backend`].
    pub fn check_query(&self, query: &Query) -> Result<Vec<QueryWarning>> {
        QueryCheck::new().run(self, query)
    }
}

/// Adds the names declared queues use: input and completion types and roles, required
/// fields, and the system facts a queue writes.
fn add_queues(known: &mut Declared, store: &Store) -> Result<()> {
    let queues = store.queues()?;
    if queues.is_empty() {
        return Ok(());
    }
    for spec in queues {
        known.types.insert(spec.input_type.clone());
        for c in &spec.completions {
            known.types.insert(c.type_name.clone());
            known.roles.insert(c.role.clone());
        }
        let fields = known.fields.entry(spec.input_type).or_default();
        fields.extend(spec.required_fields.into_iter().map(|f| f.name));
    }
    let systems = [
        system::DEAD_LETTER,
        system::POISON,
        system::REDRIVE,
        system::DISCARD,
        system::DELIVERED,
    ];
    known.types.extend(systems.map(String::from));
    known
        .roles
        .extend([system::INPUT_ROLE, system::ENTRY_ROLE].map(String::from));
    Ok(())
}

/// Every name a query uses, with where it is first used.
#[derive(Default)]
struct Uses {
    types: Vec<(String, Pos)>,
    roles: Vec<(String, Pos)>,
    /// Label, field, where.
    fields: Vec<(String, String, Pos)>,
    /// The type of each label (labels are unique in a query).
    label_types: BTreeMap<String, String>,
}

impl Uses {
    fn of(query: &Query) -> Uses {
        let mut u = Uses::default();
        for g in &query.givens {
            u.typed(&g.label.name, &g.type_name, g.label.pos);
        }
        u.matches(&query.matches);
        for k in &query.order {
            if let SortBy::Field(label, field) = &k.by {
                u.field(&label.name, field, label.pos);
            }
        }
        u.projection(&query.select);
        u
    }

    fn typed(&mut self, label: &str, type_name: &str, pos: Pos) {
        self.label_types
            .insert(label.to_string(), type_name.to_string());
        if !self.types.iter().any(|(t, _)| t == type_name) {
            self.types.push((type_name.to_string(), pos));
        }
    }

    fn field(&mut self, label: &str, field: &str, pos: Pos) {
        if !self.fields.iter().any(|(l, f, _)| l == label && f == field) {
            self.fields
                .push((label.to_string(), field.to_string(), pos));
        }
    }

    fn matches(&mut self, matches: &[Match]) {
        for m in matches {
            self.typed(&m.label.name, &m.type_name, m.label.pos);
            for c in &m.conditions {
                self.condition(c);
            }
        }
    }

    fn condition(&mut self, c: &Condition) {
        match c {
            Condition::Join { left, right } => {
                for path in [left, right] {
                    for role in &path.roles {
                        if !self.roles.iter().any(|(r, _)| r == role) {
                            self.roles.push((role.clone(), path.label.pos));
                        }
                    }
                }
            }
            Condition::Field { label, field, .. } => self.field(&label.name, field, label.pos),
            Condition::Exists { matches, .. } => self.matches(matches),
        }
    }

    fn projection(&mut self, p: &Projection) {
        match p {
            Projection::Field(label, field) => self.field(&label.name, field, label.pos),
            Projection::Record(items) => items.iter().for_each(|(_, p)| self.projection(p)),
            Projection::Collection(sub) => {
                self.matches(&sub.matches);
                for k in &sub.order {
                    if let SortBy::Field(label, field) = &k.by {
                        self.field(&label.name, field, label.pos);
                    }
                }
                self.projection(&sub.select);
            }
            Projection::Fact(_) | Projection::Hash(_) | Projection::Seq(_) => {}
        }
    }
}

/// The warnings for `uses`, read in one snapshot.
fn check(r: &dyn ReadTx, uses: &Uses, known: &Declared) -> Result<Vec<QueryWarning>> {
    let mut out = Vec::new();
    for (role, names) in [(false, &uses.types), (true, &uses.roles)] {
        let declared = if role { &known.roles } else { &known.types };
        let mut all: BTreeSet<String> = r.names(role)?.into_iter().collect();
        all.extend(declared.iter().cloned());
        for (name, pos) in names {
            if !all.contains(name) {
                let unknown = if role {
                    Unknown::Role(name.clone())
                } else {
                    Unknown::Type(name.clone())
                };
                out.push(warning(*pos, unknown, name, &all));
            }
        }
    }
    out.extend(check_fields(r, uses, known)?);
    Ok(out)
}

fn warning(pos: Pos, unknown: Unknown, name: &str, known: &BTreeSet<String>) -> QueryWarning {
    QueryWarning {
        pos,
        unknown,
        suggestions: nearest(name, known.iter().map(String::as_str)),
    }
}

/// The warnings for fields, one type at a time.
fn check_fields(r: &dyn ReadTx, uses: &Uses, known: &Declared) -> Result<Vec<QueryWarning>> {
    let mut by_type: BTreeMap<&str, Vec<(&str, Pos)>> = BTreeMap::new();
    for (label, field, pos) in &uses.fields {
        if let Some(t) = uses.label_types.get(label) {
            by_type.entry(t).or_default().push((field, *pos));
        }
    }
    let none = BTreeSet::new();
    let mut out = Vec::new();
    for (type_name, fields) in by_type {
        let declared = known.fields.get(type_name).unwrap_or(&none);
        let wanted: BTreeSet<&str> = fields
            .iter()
            .map(|(f, _)| *f)
            .filter(|f| !declared.contains(*f))
            .collect();
        if wanted.is_empty() {
            continue;
        }
        let Some(type_id) = r.name_id(false, type_name)? else {
            // No fact of the type: only a type whose fields are all known can be judged.
            if known.complete.contains(type_name) {
                out.extend(field_warnings(type_name, &fields, &wanted, declared));
            }
            continue;
        };
        let mut seen = stored_fields(r, type_id, &wanted)?;
        let missing: BTreeSet<&str> = wanted
            .iter()
            .copied()
            .filter(|f| !seen.contains(*f))
            .collect();
        seen.extend(declared.iter().cloned());
        out.extend(field_warnings(type_name, &fields, &missing, &seen));
    }
    Ok(out)
}

fn field_warnings(
    type_name: &str,
    fields: &[(&str, Pos)],
    missing: &BTreeSet<&str>,
    seen: &BTreeSet<String>,
) -> Vec<QueryWarning> {
    fields
        .iter()
        .filter(|(f, _)| missing.contains(f))
        .map(|(f, pos)| {
            let unknown = Unknown::Field {
                type_name: type_name.to_string(),
                field: f.to_string(),
            };
            warning(*pos, unknown, f, seen)
        })
        .collect()
}

/// The field names of the stored facts of a type, read newest first a page at a time
/// until every name in `wanted` is among them (or the facts run out); at most
/// [`MAX_SEEN_FIELDS`] names are kept besides the wanted ones.
fn stored_fields(
    r: &dyn ReadTx,
    type_id: i64,
    wanted: &BTreeSet<&str>,
) -> Result<BTreeSet<String>> {
    let mut seen = BTreeSet::new();
    let mut before = i64::MAX;
    loop {
        let mut read = 0;
        r.query(
            "SELECT seq, bytes FROM fact WHERE type_id = ?1 AND seq < ?2 ORDER BY seq DESC LIMIT ?3",
            args![type_id, before, FIELD_PAGE],
            &mut |row: &Row<'_>| {
                read += 1;
                before = row.get(0)?;
                let bytes: Vec<u8> = row.get(1)?;
                for name in crate::predicate::fields_of(&bytes).unwrap_or_default().into_keys() {
                    if seen.len() < MAX_SEEN_FIELDS || wanted.contains(name.as_str()) {
                        seen.insert(name);
                    }
                }
                Ok(())
            },
        )?;
        let all_found = wanted.iter().all(|w| seen.contains(*w));
        if all_found || read < FIELD_PAGE {
            return Ok(seen);
        }
    }
}

/// The field names serde's derived `Deserialize` asks for when `T` is read as a struct.
fn serde_fields<T: FactType>() -> Vec<&'static str> {
    let mut names = Vec::new();
    // The deserializer records the names and refuses, so nothing is built.
    let _ = T::deserialize(FieldNames(&mut names));
    names
}

/// A deserializer that only records the field names a struct asks for.
struct FieldNames<'a>(&'a mut Vec<&'static str>);

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = serde::de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> std::result::Result<V::Value, Self::Error> {
        Err(Self::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> std::result::Result<V::Value, Self::Error> {
        self.0.extend_from_slice(fields);
        Err(Self::Error::custom("field names read"))
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

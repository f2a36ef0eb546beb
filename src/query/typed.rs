//! Typed facts: a Rust type with serde that stands for a fact type.
//!
//! The type names its fact type and which of its serialised fields are predecessor roles;
//! every other field is a fact field, converted through the JSON form (so an `f64` is a
//! float and an integer type an integer, as `docs/format.md` says). Roles are [`Ref`]s
//! (`Arity::One`), `Option<Ref>` (`Arity::Optional`) or `Vec<Ref>` (`Arity::Many`).
//!
//! ```
//! use precedent::Store;
//! use precedent::query::{Arity, FactType, Ref};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, Debug, PartialEq)]
//! struct Shop { name: String }
//! impl FactType for Shop {
//!     const TYPE: &'static str = "Shop";
//!     const PREDECESSORS: &'static [(&'static str, Arity)] = &[];
//! }
//!
//! #[derive(Serialize, Deserialize, Debug, PartialEq)]
//! struct Order { shop: Ref<Shop>, id: u64 }
//! impl FactType for Order {
//!     const TYPE: &'static str = "Shop.Order";
//!     const PREDECESSORS: &'static [(&'static str, Arity)] = &[("shop", Arity::One)];
//! }
//!
//! let store = Store::open_in_memory()?;
//! let shop = store.save(&Shop { name: "corner".into() })?;
//! let order = store.save(&Order { shop, id: 7 })?;
//! assert_eq!(store.load(order)?, Order { shop, id: 7 });
//! # Ok::<(), precedent::Error>(())
//! ```
//!
//! The same with the derive macro. A field whose type holds [`Ref`]s is a role named after
//! the field, with the arity its type says (`Ref` one, `Option<Ref>` optional, a `Vec`,
//! `BTreeSet` or `HashSet` of `Ref` many); `#[fact(role = "name")]` renames it,
//! `#[fact(field)]` keeps it a fact field. The order below is stored with an edge to its
//! shop, which queries walk:
//!
//! ```
//! use precedent::Store;
//! use precedent::query::{FactType, Ref};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, FactType, Debug, PartialEq)]
//! #[fact(type = "Shop")]
//! struct Shop { name: String }
//!
//! #[derive(Serialize, Deserialize, FactType, Debug, PartialEq)]
//! #[fact(type = "Shop.Order")]
//! struct Order {
//!     shop: Ref<Shop>,
//!     id: u64,
//! }
//!
//! let store = Store::open_in_memory()?;
//! let shop = store.save(&Shop { name: "corner".into() })?;
//! let order = store.save(&Order { shop, id: 7 })?;
//! assert_eq!(store.load(order)?, Order { shop, id: 7 });
//! let fact = store.get(&order.hash())?.unwrap();
//! assert!(fact.predecessors()["shop"].contains(&shop.hash()));
//! assert!(fact.field("shop").is_none());
//! # Ok::<(), precedent::Error>(())
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::run::Givens;
use super::{Projected, Query};
use crate::error::{Error, Result};
use crate::fact::{Fact, Predecessors};
use crate::hash::FactHash;
use crate::json::JsonValue;
use crate::store::{Store, Writer};

/// How many facts a predecessor role of a typed fact holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    /// Exactly one: a [`Ref`].
    One,
    /// None or one: an `Option<Ref>`.
    Optional,
    /// Any number: a `Vec<Ref>` (stored as a set: order and repeats do not count).
    Many,
}

/// A Rust type standing for a fact type.
pub trait FactType: Serialize + DeserializeOwned {
    /// The fact type name.
    const TYPE: &'static str;
    /// The serialised fields that are predecessor roles, with their arity.
    const PREDECESSORS: &'static [(&'static str, Arity)];
}

/// A typed reference to a fact: its hash, serialised as 64 hex digits.
pub struct Ref<T> {
    hash: FactHash,
    _type: PhantomData<fn() -> T>,
}

impl<T> Ref<T> {
    /// A reference to the fact with this hash (its type is not checked until loaded).
    pub fn new(hash: FactHash) -> Ref<T> {
        Ref {
            hash,
            _type: PhantomData,
        }
    }

    /// The fact's hash.
    pub fn hash(&self) -> FactHash {
        self.hash
    }
}

impl<T> Clone for Ref<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Ref<T> {}
impl<T> PartialEq for Ref<T> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
    }
}
impl<T> Eq for Ref<T> {}
// By hash, so that a `BTreeSet<Ref<T>>` or `HashSet<Ref<T>>` can hold a role of many.
impl<T> PartialOrd for Ref<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Ref<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.hash.cmp(&other.hash)
    }
}
impl<T> std::hash::Hash for Ref<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.hash.hash(state);
    }
}
impl<T> fmt::Debug for Ref<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ref({})", self.hash)
    }
}
impl<T> Serialize for Ref<T> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.hash.to_string())
    }
}
impl<'de, T> Deserialize<'de> for Ref<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<FactHash>()
            .map(Ref::new)
            .map_err(serde::de::Error::custom)
    }
}

fn bad<T: FactType>(reason: impl fmt::Display) -> Error {
    Error::InvalidFact {
        reason: format!("{}: {reason}", T::TYPE),
    }
}

fn hash_of<T: FactType>(v: &JsonValue) -> Result<FactHash> {
    v.as_str()
        .and_then(|s| s.parse::<FactHash>().ok())
        .ok_or_else(|| bad::<T>("a predecessor role must serialise as a 64-digit hash"))
}

/// The fact a typed value stands for.
///
/// # Errors
/// [`Error::InvalidFact`] if the value does not serialise to an object with its roles as
/// hashes (a role of [`Arity::One`] present), or breaks the fact model.
pub fn to_fact<T: FactType>(value: &T) -> Result<Fact> {
    // Through JSON text rather than serde_json's `Value`, which cannot hold integers
    // below i64::MIN: an i128 field keeps its whole range.
    let mut obj = JsonValue::of(value).map_err(bad::<T>)?;
    if obj.as_object().is_none() {
        return Err(bad::<T>("a typed fact must serialise as an object"));
    }
    let mut preds = Predecessors::new();
    for (role, arity) in T::PREDECESSORS {
        let set: BTreeSet<FactHash> = match obj.remove(role) {
            // A role serialised under another name would otherwise be stored as a text
            // field, with no edge.
            None if *arity == Arity::One => {
                return Err(bad::<T>(format!(
                    "role {role} is not in the serialised form (a #[serde(rename)] needs \
                     the same #[fact(role = ..)])"
                )));
            }
            None | Some(JsonValue::Null) => BTreeSet::new(),
            Some(JsonValue::Array(items)) => {
                items.iter().map(hash_of::<T>).collect::<Result<_>>()?
            }
            Some(v) => BTreeSet::from([hash_of::<T>(&v)?]),
        };
        preds.insert(role.to_string(), set);
    }
    let json = JsonValue::Object(vec![
        ("type".into(), T::TYPE.into()),
        ("fields".into(), obj),
    ]);
    let spec = crate::json::spec_from_json(&json, "")?;
    Fact::new(spec.type_name, spec.fields, preds)
}

/// The typed value of a fact.
///
/// # Errors
/// [`Error::WrongType`] for a fact of another type; [`Error::InvalidFact`] if its fields
/// and roles do not deserialise into `T`.
pub fn from_fact<T: FactType>(fact: &Fact) -> Result<T> {
    if fact.type_name() != T::TYPE {
        return Err(Error::WrongType {
            hash: fact.hash(),
            expected: T::TYPE.to_string(),
            found: fact.type_name().to_string(),
        });
    }
    let mut obj = JsonValue::object();
    for (name, v) in fact.fields() {
        obj.insert(name, crate::json::value_to_json(v));
    }
    for (role, arity) in T::PREDECESSORS {
        let hashes: Vec<JsonValue> = fact
            .predecessors()
            .get(*role)
            .into_iter()
            .flatten()
            .map(|h| JsonValue::String(h.to_string()))
            .collect();
        let v = match (arity, hashes.len()) {
            (Arity::Many, _) => JsonValue::Array(hashes),
            (Arity::One | Arity::Optional, 1) => hashes[0].clone(),
            (Arity::Optional, 0) => JsonValue::Null,
            (_, n) => {
                return Err(bad::<T>(format!(
                    "role {role} holds {n} facts, expected one"
                )));
            }
        };
        obj.insert(role, v);
    }
    T::deserialize(obj).map_err(bad::<T>)
}

impl Store {
    /// Stores a typed fact (held until its predecessors arrive, like any fact).
    ///
    /// # Errors
    /// As [`to_fact`] and [`Store::insert`].
    pub fn save<T: FactType>(&self, value: &T) -> Result<Ref<T>> {
        let fact = to_fact(value)?;
        self.insert(&fact)?;
        Ok(Ref::new(fact.hash()))
    }

    /// Loads a released typed fact.
    ///
    /// # Errors
    /// [`Error::NotFound`] if it is not released; as [`from_fact`].
    pub fn load<T: FactType>(&self, r: Ref<T>) -> Result<T> {
        let fact = self
            .get(&r.hash())?
            .ok_or(Error::NotFound { hash: r.hash() })?;
        from_fact(&fact)
    }

    /// Runs a query that selects facts (`select o`) and reads each as a `T`.
    ///
    /// # Errors
    /// As [`Store::query`]; [`Error::WrongType`] if a result is not a `T`;
    /// [`Error::Query`] if the query does not select facts.
    pub fn query_as<T: FactType>(
        &self,
        query: &Query,
        givens: &Givens,
    ) -> Result<Vec<(Ref<T>, T)>> {
        let mut out = Vec::new();
        for row in self.query(query, givens)? {
            let Projected::Fact(f) = row.value else {
                return Err(super::QueryError {
                    line: 0,
                    column: 0,
                    message: "a typed query must select a fact (select label)".into(),
                }
                .into());
            };
            out.push((Ref::new(f.hash()), from_fact(&f)?));
        }
        Ok(out)
    }
}

impl Writer<'_> {
    /// Stores a typed fact in this write transaction, as [`Store::save`] does on its own.
    ///
    /// ```
    /// use precedent::Store;
    /// use precedent::query::{FactType, Ref};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize, FactType, Debug, PartialEq)]
    /// #[fact(type = "Shop")]
    /// struct Shop { name: String }
    ///
    /// #[derive(Serialize, Deserialize, FactType, Debug, PartialEq)]
    /// #[fact(type = "Shop.Order")]
    /// struct Order { shop: Ref<Shop>, id: u64 }
    ///
    /// let store = Store::open_in_memory()?;
    /// // The shop and its order commit together, or not at all.
    /// let (shop, order) = store.write(|w| {
    ///     let shop = w.save(&Shop { name: "corner".into() })?;
    ///     Ok((shop, w.save(&Order { shop, id: 7 })?))
    /// })?;
    /// assert_eq!(store.load(order)?, Order { shop, id: 7 });
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`to_fact`] and [`Writer::insert`].
    pub fn save<T: FactType>(&mut self, value: &T) -> Result<Ref<T>> {
        let fact = to_fact(value)?;
        self.insert(&fact)?;
        Ok(Ref::new(fact.hash()))
    }
}

//! Facts: a type name, fields and named predecessor sets. Plain data, no I/O.
//!
//! A [`Fact`] can only be built through [`Fact::new`] or [`FactBuilder`], which check the
//! fact model and compute the canonical bytes and hash once. So every `Fact` in memory is
//! valid, and its hash is its identity: two facts are equal exactly when their hashes are.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::encoding;
use crate::error::{Error, Result};
use crate::hash::FactHash;

/// Documented limits of the fact model (see `docs/format.md`).
pub mod limits {
    /// Longest fact type name, in UTF-8 bytes.
    pub const MAX_TYPE_NAME_BYTES: usize = 255;
    /// Longest predecessor role name, in UTF-8 bytes.
    pub const MAX_ROLE_NAME_BYTES: usize = 255;
    /// Most predecessor hashes one fact may name, over all roles.
    pub const MAX_PREDECESSORS: usize = 1024;
    /// Deepest nesting of arrays and maps in the fields; the fields map is level 1.
    pub const MAX_DEPTH: usize = 64;
    /// Largest canonical encoding of one fact, in bytes.
    pub const MAX_FACT_BYTES: usize = 1 << 20;
    /// Smallest integer value: -2^64.
    pub const MIN_INT: i128 = -(1i128 << 64);
    /// Largest integer value: 2^64 - 1.
    pub const MAX_INT: i128 = (1i128 << 64) - 1;
}

/// A field value: the CBOR data model without tags.
///
/// Integers hold the full CBOR range, -2^64 ..= 2^64-1 (checked when a fact is built).
/// Floats are kept as `f64`; NaN is refused. Integers and floats are different values:
/// `1` and `1.0` make different facts.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// CBOR null.
    Null,
    /// CBOR true / false.
    Bool(bool),
    /// An integer in -2^64 ..= 2^64-1.
    Integer(i128),
    /// A float, never NaN. -0.0 and the infinities are values of their own.
    Float(f64),
    /// UTF-8 text, kept exactly as given (no Unicode normalisation).
    Text(String),
    /// A byte string.
    Bytes(Vec<u8>),
    /// An array.
    Array(Vec<Value>),
    /// A map with text keys.
    Map(BTreeMap<String, Value>),
}

macro_rules! value_from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value { Value::Integer(v as i128) }
        }
    )*};
}
value_from_int!(i8, i16, i32, i64, u8, u16, u32, u64, usize, isize);

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_string())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Value {
        Value::Bytes(v)
    }
}

/// Fields of a fact, by name.
pub type Fields = BTreeMap<String, Value>;

/// Predecessors of a fact: role name to a non-empty set of hashes.
pub type Predecessors = BTreeMap<String, BTreeSet<FactHash>>;

/// An immutable, valid fact with its canonical bytes and hash.
///
/// Cloning is cheap: the parts are shared.
#[derive(Clone)]
pub struct Fact {
    inner: Arc<Inner>,
}

struct Inner {
    type_name: String,
    fields: Fields,
    predecessors: Predecessors,
    bytes: Vec<u8>,
    hash: FactHash,
}

impl Fact {
    /// Builds a fact, checking the fact model and computing its canonical bytes.
    ///
    /// Empty predecessor roles are dropped: a role holds a set, and the empty set is the
    /// same as no role at all (see `docs/format.md`).
    ///
    /// # Errors
    /// [`Error::InvalidFact`] for an empty or over-long type or role name, NaN, an integer
    /// outside -2^64..2^64-1, nesting deeper than [`limits::MAX_DEPTH`], more than
    /// [`limits::MAX_PREDECESSORS`] predecessors, or an encoding over
    /// [`limits::MAX_FACT_BYTES`].
    pub fn new(
        type_name: impl Into<String>,
        fields: Fields,
        mut predecessors: Predecessors,
    ) -> Result<Fact> {
        let type_name = type_name.into();
        predecessors.retain(|_, set| !set.is_empty());
        check_model(&type_name, &fields, &predecessors)?;
        let bytes = encoding::encode(&type_name, &fields, &predecessors);
        if bytes.len() > limits::MAX_FACT_BYTES {
            return Err(invalid(format!(
                "canonical encoding is {} bytes, over the limit of {}",
                bytes.len(),
                limits::MAX_FACT_BYTES
            )));
        }
        let hash = FactHash::of_canonical(&bytes);
        Ok(Fact::from_parts(
            type_name,
            fields,
            predecessors,
            bytes,
            hash,
        ))
    }

    /// Starts a builder for a fact of `type_name`.
    pub fn builder(type_name: impl Into<String>) -> FactBuilder {
        FactBuilder {
            type_name: type_name.into(),
            fields: Fields::new(),
            predecessors: Predecessors::new(),
        }
    }

    /// Decodes canonical bytes strictly (see [`encoding::decode`]).
    ///
    /// # Errors
    /// [`Error::Decode`] for bytes that are not exactly one canonical fact.
    pub fn from_canonical(bytes: &[u8]) -> Result<Fact> {
        let (type_name, fields, predecessors) = encoding::decode(bytes)?;
        let hash = FactHash::of_canonical(bytes);
        Ok(Fact::from_parts(
            type_name,
            fields,
            predecessors,
            bytes.to_vec(),
            hash,
        ))
    }

    pub(crate) fn from_parts(
        type_name: String,
        fields: Fields,
        predecessors: Predecessors,
        bytes: Vec<u8>,
        hash: FactHash,
    ) -> Fact {
        Fact {
            inner: Arc::new(Inner {
                type_name,
                fields,
                predecessors,
                bytes,
                hash,
            }),
        }
    }

    /// The fact type name, e.g. `Shop.Order`.
    pub fn type_name(&self) -> &str {
        &self.inner.type_name
    }

    /// The fields.
    pub fn fields(&self) -> &Fields {
        &self.inner.fields
    }

    /// One field by name.
    pub fn field(&self, name: &str) -> Option<&Value> {
        self.inner.fields.get(name)
    }

    /// Predecessor roles and their hash sets (no role is empty).
    pub fn predecessors(&self) -> &Predecessors {
        &self.inner.predecessors
    }

    /// Every predecessor hash over all roles, each once, in hash order.
    pub fn predecessor_hashes(&self) -> BTreeSet<FactHash> {
        self.inner
            .predecessors
            .values()
            .flatten()
            .copied()
            .collect()
    }

    /// The canonical CBOR bytes.
    pub fn canonical_bytes(&self) -> &[u8] {
        &self.inner.bytes
    }

    /// The fact's identity.
    pub fn hash(&self) -> FactHash {
        self.inner.hash
    }
}

impl PartialEq for Fact {
    fn eq(&self, other: &Fact) -> bool {
        self.inner.hash == other.inner.hash
    }
}
impl Eq for Fact {}

impl std::fmt::Debug for Fact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fact")
            .field("hash", &self.inner.hash)
            .field("type", &self.inner.type_name)
            .field("fields", &self.inner.fields)
            .field("predecessors", &self.inner.predecessors)
            .finish()
    }
}

/// Builds a [`Fact`] field by field.
#[derive(Clone, Debug)]
pub struct FactBuilder {
    type_name: String,
    fields: Fields,
    predecessors: Predecessors,
}

impl FactBuilder {
    /// Sets a field.
    pub fn field(mut self, name: impl Into<String>, value: impl Into<Value>) -> FactBuilder {
        self.fields.insert(name.into(), value.into());
        self
    }

    /// Adds `hash` to the set of role `role`.
    pub fn predecessor(mut self, role: impl Into<String>, hash: FactHash) -> FactBuilder {
        self.predecessors
            .entry(role.into())
            .or_default()
            .insert(hash);
        self
    }

    /// Checks and encodes the fact.
    ///
    /// # Errors
    /// As [`Fact::new`].
    pub fn build(self) -> Result<Fact> {
        Fact::new(self.type_name, self.fields, self.predecessors)
    }
}

fn invalid(reason: String) -> Error {
    Error::InvalidFact { reason }
}

/// Checks a name against the type/role rules.
pub(crate) fn check_name(what: &str, name: &str, max: usize) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("{what} name is empty"));
    }
    if name.len() > max {
        return Err(format!(
            "{what} name is {} bytes, over the limit of {max}",
            name.len()
        ));
    }
    Ok(())
}

fn check_model(type_name: &str, fields: &Fields, predecessors: &Predecessors) -> Result<()> {
    check_name("type", type_name, limits::MAX_TYPE_NAME_BYTES).map_err(invalid)?;
    let mut count = 0;
    for (role, set) in predecessors {
        check_name("role", role, limits::MAX_ROLE_NAME_BYTES)
            .map_err(|r| invalid(format!("{r} (role {role:?})")))?;
        count += set.len();
    }
    if count > limits::MAX_PREDECESSORS {
        return Err(invalid(format!(
            "{count} predecessors, over the limit of {}",
            limits::MAX_PREDECESSORS
        )));
    }
    // One buffer for the paths of all fields (it is read only when a value is refused).
    let mut path = String::new();
    for (name, value) in fields {
        path.clear();
        path.push_str("fields.");
        path.push_str(name);
        check_value(value, 2, &mut path)?;
    }
    Ok(())
}

/// Checks one value at nesting `depth` (the fields map is depth 1). `path` names it.
fn check_value(value: &Value, depth: usize, path: &mut String) -> Result<()> {
    match value {
        Value::Integer(i) if !(limits::MIN_INT..=limits::MAX_INT).contains(i) => Err(invalid(
            format!("{path}: integer {i} is outside -2^64..2^64-1"),
        )),
        Value::Float(f) if f.is_nan() => Err(invalid(format!("{path}: NaN is not allowed"))),
        Value::Array(items) => {
            check_depth(depth, path)?;
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                check_value(item, depth + 1, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        Value::Map(map) => {
            check_depth(depth, path)?;
            for (key, item) in map {
                let len = path.len();
                path.push('.');
                path.push_str(key);
                check_value(item, depth + 1, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn check_depth(depth: usize, path: &str) -> Result<()> {
    if depth > limits::MAX_DEPTH {
        return Err(invalid(format!(
            "{path}: nesting deeper than {} levels",
            limits::MAX_DEPTH
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u8) -> FactHash {
        FactHash([n; 32])
    }

    #[test]
    fn same_content_is_same_fact() {
        let a = Fact::builder("T")
            .field("x", 1)
            .predecessor("p", h(1))
            .build()
            .unwrap();
        let b = Fact::builder("T")
            .predecessor("p", h(1))
            .field("x", 1)
            .build()
            .unwrap();
        assert_eq!(a.hash(), b.hash());
        assert_eq!(a.canonical_bytes(), b.canonical_bytes());
    }

    #[test]
    fn integer_and_float_differ() {
        let a = Fact::builder("T").field("x", 1).build().unwrap();
        let b = Fact::builder("T").field("x", 1.0).build().unwrap();
        assert_ne!(a.hash(), b.hash());
    }

    #[test]
    fn empty_roles_are_dropped() {
        let mut preds = Predecessors::new();
        preds.insert("items".into(), BTreeSet::new());
        let a = Fact::new("T", Fields::new(), preds).unwrap();
        let b = Fact::new("T", Fields::new(), Predecessors::new()).unwrap();
        assert_eq!(a.hash(), b.hash());
        assert!(a.predecessors().is_empty());
    }

    #[test]
    fn model_violations_are_refused_with_their_path() {
        let nan = Fact::builder("T").field("price", f64::NAN).build();
        assert!(
            matches!(&nan, Err(Error::InvalidFact { reason }) if reason.contains("fields.price"))
        );
        let big = Fact::builder("T")
            .field("n", Value::Integer(limits::MAX_INT + 1))
            .build();
        assert!(matches!(big, Err(Error::InvalidFact { .. })));
        let small = Fact::builder("T")
            .field("n", Value::Integer(limits::MIN_INT))
            .build();
        assert!(small.is_ok());
        assert!(matches!(
            Fact::builder("").build(),
            Err(Error::InvalidFact { .. })
        ));
        let long = "t".repeat(limits::MAX_TYPE_NAME_BYTES + 1);
        assert!(matches!(
            Fact::builder(long).build(),
            Err(Error::InvalidFact { .. })
        ));
        assert!(matches!(
            Fact::builder("T").predecessor("", h(1)).build(),
            Err(Error::InvalidFact { .. })
        ));
    }

    #[test]
    fn nesting_limit_is_exact() {
        // The fields map is level 1, so MAX_DEPTH - 1 nested arrays fit.
        let nest = |levels: usize| {
            let mut v = Value::Null;
            for _ in 0..levels {
                v = Value::Array(vec![v]);
            }
            Fact::builder("T").field("deep", v).build()
        };
        assert!(nest(limits::MAX_DEPTH - 1).is_ok());
        assert!(matches!(
            nest(limits::MAX_DEPTH),
            Err(Error::InvalidFact { .. })
        ));
    }

    #[test]
    fn oversize_fact_is_refused() {
        let blob = vec![0u8; limits::MAX_FACT_BYTES];
        let r = Fact::builder("T").field("blob", blob).build();
        assert!(
            matches!(r, Err(Error::InvalidFact { reason }) if reason.contains("over the limit"))
        );
    }
}

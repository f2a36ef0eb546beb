//! [`JsonValue`]: a JSON tree that holds every integer of the fact model exactly and keeps
//! object keys in the order they were written or inserted.
//!
//! serde_json's own `Value` holds integers only within `i64` and `u64`, and its
//! `arbitrary_precision` feature, which would lift that, changes how serde_json reads
//! numbers for every crate in the build (untagged enums and flattened maps stop seeing
//! them). The fact model's integers run from -2^64 to 2^64-1, so the JSON form has this
//! small tree of its own: numbers are read from their text (serde_json's `RawValue`), and
//! written back as that text.

use std::collections::HashSet;
use std::fmt;
use std::ops::Index;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde::ser::{Error as _, Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::value::RawValue;

/// A JSON value. Objects keep their keys in order: as written when parsed, as inserted
/// when built, so the text a value prints is deterministic.
#[derive(Clone, Debug, PartialEq)]
pub enum JsonValue {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, as its text.
    Number(JsonNumber),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<JsonValue>),
    /// An object: keys and values in order. Parsing refuses a key written twice in one
    /// object.
    Object(Vec<(String, JsonValue)>),
}

/// A JSON number, kept as the text it was written as (so `1` and `1.0` differ, and no
/// integer is rounded).
#[derive(Clone, Debug, PartialEq)]
pub struct JsonNumber(String);

impl JsonNumber {
    /// The number's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True if written with a `.` or an exponent.
    pub fn is_float(&self) -> bool {
        self.0.contains(['.', 'e', 'E'])
    }

    /// The integer, if this is one and fits.
    pub fn as_i128(&self) -> Option<i128> {
        if self.is_float() {
            None
        } else {
            self.0.parse().ok()
        }
    }

    /// A finite float as the shortest text that reads back as the same float (`.0` added
    /// where it would otherwise read as an integer); `None` for infinities and NaN.
    pub fn from_f64(f: f64) -> Option<JsonNumber> {
        if !f.is_finite() {
            return None;
        }
        let mut s = format!("{f:?}");
        if !s.contains(['.', 'e', 'E']) {
            s.push_str(".0");
        }
        Some(JsonNumber(s))
    }
}

impl From<i128> for JsonNumber {
    fn from(i: i128) -> JsonNumber {
        JsonNumber(i.to_string())
    }
}

impl JsonValue {
    /// Parses one JSON text.
    ///
    /// A key written twice in one object is refused (`duplicate key "a" at fields`), at
    /// any depth: JSON leaves its meaning open (serde_json keeps the last value, other
    /// readers the first), and two readers of one fact text must not build two facts.
    ///
    /// # Errors
    /// serde_json's error for text that is not JSON or repeats a key.
    pub fn parse(text: &str) -> serde_json::Result<JsonValue> {
        from_raw(serde_json::from_str(text)?, &Place::Top, 0)
    }

    /// The JSON form of any serialisable value, integers of any width kept exactly (the
    /// value is written as text and read back).
    ///
    /// # Errors
    /// serde_json's error if the value cannot be serialised (a map with non-string keys).
    pub fn of<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<JsonValue> {
        JsonValue::parse(&serde_json::to_string(value)?)
    }

    /// An empty object.
    pub fn object() -> JsonValue {
        JsonValue::Object(Vec::new())
    }

    /// The value under `key` of an object.
    pub fn get(&self, key: &str) -> Option<&JsonValue> {
        let JsonValue::Object(entries) = self else {
            return None;
        };
        entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Sets `key` of an object: in place if present, else appended. Does nothing to a
    /// value that is not an object.
    pub fn insert(&mut self, key: &str, value: impl Into<JsonValue>) {
        let JsonValue::Object(entries) = self else {
            return;
        };
        let value = value.into();
        match entries.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => entries.push((key.to_string(), value)),
        }
    }

    /// Takes `key` out of an object.
    pub fn remove(&mut self, key: &str) -> Option<JsonValue> {
        let JsonValue::Object(entries) = self else {
            return None;
        };
        let at = entries.iter().position(|(k, _)| k == key)?;
        Some(entries.remove(at).1)
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            JsonValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The items, if this is an array.
    pub fn as_array(&self) -> Option<&[JsonValue]> {
        match self {
            JsonValue::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The entries, if this is an object.
    pub fn as_object(&self) -> Option<&[(String, JsonValue)]> {
        match self {
            JsonValue::Object(entries) => Some(entries),
            _ => None,
        }
    }

    /// The integer, if this is an integer that fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            JsonValue::Number(n) => n.as_i128()?.try_into().ok(),
            _ => None,
        }
    }
}

/// How deep [`JsonValue::parse`] follows arrays and objects: serde_json's own limit for
/// its `Value`. Reading a raw value does not recurse (so has no limit), building the tree
/// does.
const MAX_NESTING: usize = 128;

/// Where a value sits in the text being parsed: the keys and indexes from the top, written
/// out (`fields.a`, `predecessors.items[1]`, as the JSON form's errors name a place) only
/// when a message needs it.
#[derive(Clone, Copy)]
enum Place<'a> {
    Top,
    Key(&'a Place<'a>, &'a str),
    Index(&'a Place<'a>, usize),
}

impl fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Top => f.write_str("the top level"),
            Place::Key(Place::Top, k) => f.write_str(k),
            Place::Key(up, k) => write!(f, "{up}.{k}"),
            Place::Index(Place::Top, i) => write!(f, "[{i}]"),
            Place::Index(up, i) => write!(f, "{up}[{i}]"),
        }
    }
}

/// An error from reading one raw value again on its own: serde_json's position counts
/// from the start of that value, not of the text, so it is dropped and the place named
/// instead (the text's own position follows, from the parse of the whole).
fn within(e: serde_json::Error, at: &Place<'_>) -> serde_json::Error {
    let text = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    let reason = text.strip_suffix(&position).unwrap_or(&text);
    serde::de::Error::custom(format!("{reason} in {at}"))
}

/// Builds the tree under one raw value found at `at`, at nesting level `depth`. Each
/// object and array is read once more for its members, which is cheap at the nesting
/// depths facts allow.
fn from_raw(raw: &RawValue, at: &Place<'_>, depth: usize) -> serde_json::Result<JsonValue> {
    let text = raw.get();
    if depth >= MAX_NESTING && text.starts_with(['{', '[']) {
        return Err(serde::de::Error::custom("recursion limit exceeded"));
    }
    Ok(match text.as_bytes().first() {
        Some(b'{') => {
            let Entries(raw_entries) = serde_json::from_str(text).map_err(|e| within(e, at))?;
            check_unique(&raw_entries, at)?;
            let mut out = Vec::with_capacity(raw_entries.len());
            for (k, v) in raw_entries {
                let value = from_raw(v, &Place::Key(at, &k), depth + 1)?;
                out.push((k, value));
            }
            JsonValue::Object(out)
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text).map_err(|e| within(e, at))?;
            let mut out = Vec::with_capacity(items.len());
            for (i, v) in items.into_iter().enumerate() {
                out.push(from_raw(v, &Place::Index(at, i), depth + 1)?);
            }
            JsonValue::Array(out)
        }
        Some(b'"') => JsonValue::String(serde_json::from_str(text).map_err(|e| within(e, at))?),
        Some(b'-' | b'0'..=b'9') => JsonValue::Number(JsonNumber(text.to_string())),
        _ => match serde_json::from_str(text).map_err(|e| within(e, at))? {
            serde_json::Value::Bool(b) => JsonValue::Bool(b),
            _ => JsonValue::Null,
        },
    })
}

/// Refuses an object that names a key twice, naming the first key repeated and where.
fn check_unique(entries: &[(String, &RawValue)], at: &Place<'_>) -> serde_json::Result<()> {
    let mut seen = HashSet::with_capacity(entries.len());
    match entries.iter().find(|(k, _)| !seen.insert(k.as_str())) {
        Some((k, _)) => Err(serde::de::Error::custom(format!(
            "duplicate key {k:?} at {at}"
        ))),
        None => Ok(()),
    }
}

/// An object's members as raw values, in the order written.
struct Entries<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Entries<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(EntriesVisitor)
    }
}

impl Serialize for JsonValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            JsonValue::Null => s.serialize_unit(),
            JsonValue::Bool(b) => s.serialize_bool(*b),
            // Integers go through `serialize_i128`, which serde_json writes exactly; a
            // float keeps its text, which a serialiser would otherwise re-format.
            JsonValue::Number(n) => match n.as_i128() {
                Some(i) => s.serialize_i128(i),
                None => RawValue::from_string(n.0.clone())
                    .map_err(S::Error::custom)?
                    .serialize(s),
            },
            JsonValue::String(text) => s.serialize_str(text),
            JsonValue::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            JsonValue::Object(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

/// Compact JSON text.
impl fmt::Display for JsonValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_json::to_string(self).map_err(|_| fmt::Error)?)
    }
}

static NULL: JsonValue = JsonValue::Null;

/// `value["key"]`: the member, or null when absent (as serde_json's `Value` does).
impl Index<&str> for JsonValue {
    type Output = JsonValue;
    fn index(&self, key: &str) -> &JsonValue {
        self.get(key).unwrap_or(&NULL)
    }
}

/// `value[i]`: the item, or null when absent.
impl Index<usize> for JsonValue {
    type Output = JsonValue;
    fn index(&self, i: usize) -> &JsonValue {
        self.as_array().and_then(|a| a.get(i)).unwrap_or(&NULL)
    }
}

impl From<&str> for JsonValue {
    fn from(s: &str) -> JsonValue {
        JsonValue::String(s.to_string())
    }
}

impl From<String> for JsonValue {
    fn from(s: String) -> JsonValue {
        JsonValue::String(s)
    }
}

impl<T: Into<JsonValue>> From<Option<T>> for JsonValue {
    fn from(v: Option<T>) -> JsonValue {
        v.map_or(JsonValue::Null, Into::into)
    }
}

impl From<i64> for JsonValue {
    fn from(i: i64) -> JsonValue {
        JsonValue::Number(JsonNumber::from(i128::from(i)))
    }
}

/// serde_json's numbers are all representable here, so this loses nothing.
impl From<serde_json::Value> for JsonValue {
    fn from(v: serde_json::Value) -> JsonValue {
        use serde_json::Value as J;
        match v {
            J::Null => JsonValue::Null,
            J::Bool(b) => JsonValue::Bool(b),
            J::Number(n) => JsonValue::Number(JsonNumber(n.to_string())),
            J::String(s) => JsonValue::String(s),
            J::Array(items) => JsonValue::Array(items.into_iter().map(Into::into).collect()),
            J::Object(m) => JsonValue::Object(m.into_iter().map(|(k, v)| (k, v.into())).collect()),
        }
    }
}

/// Equal as serde_json compares: numbers by value as serde_json reads them, objects
/// whatever their key order.
impl PartialEq<serde_json::Value> for JsonValue {
    fn eq(&self, other: &serde_json::Value) -> bool {
        use serde_json::Value as J;
        match (self, other) {
            (JsonValue::Null, J::Null) => true,
            (JsonValue::Bool(a), J::Bool(b)) => a == b,
            (JsonValue::Number(a), J::Number(b)) => {
                serde_json::from_str::<serde_json::Number>(&a.0).is_ok_and(|a| a == *b)
            }
            (JsonValue::String(a), J::String(b)) => a == b,
            (JsonValue::Array(a), J::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
            }
            (JsonValue::Object(a), J::Object(b)) => {
                a.len() == b.len() && b.iter().all(|(k, v)| self.get(k).is_some_and(|x| x == v))
            }
            _ => false,
        }
    }
}

impl PartialEq<JsonValue> for serde_json::Value {
    fn eq(&self, other: &JsonValue) -> bool {
        other == self
    }
}

macro_rules! eq_integer {
    ($($t:ty),*) => {$(
        impl PartialEq<$t> for JsonValue {
            fn eq(&self, other: &$t) -> bool {
                matches!(self, JsonValue::Number(n) if n.as_i128() == Some(i128::from(*other)))
            }
        }
    )*};
}
eq_integer!(i32, i64, u32, u64);

impl PartialEq<&str> for JsonValue {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == Some(*other)
    }
}

impl PartialEq<str> for JsonValue {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == Some(other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_beyond_i64_and_u64_keep_their_digits() {
        let text = r#"{"lo":-18446744073709551616,"hi":18446744073709551615,"f":1.0}"#;
        let v = JsonValue::parse(text).unwrap();
        let JsonValue::Number(lo) = &v["lo"] else {
            panic!("{v:?}")
        };
        assert_eq!(lo.as_i128(), Some(-(1i128 << 64)));
        assert_eq!(v.to_string(), text);
        assert_eq!(serde_json::to_string_pretty(&v).unwrap().lines().count(), 5);
    }

    #[test]
    fn keys_keep_the_order_written() {
        let v = JsonValue::parse(r#"{"b":1,"a":[true,null,"x"]}"#).unwrap();
        assert_eq!(v.to_string(), r#"{"b":1,"a":[true,null,"x"]}"#);
        assert_eq!(v, serde_json::json!({"a": [true, null, "x"], "b": 1}));
        assert!(JsonValue::parse("{\"a\":1").is_err());
    }

    /// serde_json would keep the last of two values and another reader the first, so one
    /// text could stand for two facts: a repeated key is refused, with where it is.
    #[test]
    fn a_repeated_key_is_refused_with_its_path() {
        let cases = [
            (
                r#"{"b":1,"a":2,"b":2}"#,
                r#"duplicate key "b" at the top level"#,
            ),
            (r#"{"f":{"a":1,"a":1}}"#, r#"duplicate key "a" at f"#),
            (
                r#"{"f":[0,{"x":{"a":1,"a":2}}]}"#,
                r#"duplicate key "a" at f[1].x"#,
            ),
            (
                r#"{"a":{"b":1},"a":{"b":1}}"#,
                r#"duplicate key "a" at the top level"#,
            ),
        ];
        for (text, want) in cases {
            let e = JsonValue::parse(text).unwrap_err().to_string();
            assert_eq!(e, want, "{text}");
        }
        // The same key in two different objects is no repetition.
        assert!(JsonValue::parse(r#"{"a":{"a":1},"b":{"a":1}}"#).is_ok());
    }

    /// serde_json's `arbitrary_precision` feature (which this crate once turned on) makes
    /// serde_json hand a float to serde as a private map, so that an untagged enum with a
    /// float variant no longer deserialises inside a flattened map (integers that fit a
    /// u64 still do, so the number here is a float). Cargo unifies
    /// features across the build, so this fails if any crate in it turns the feature on.
    #[test]
    fn serde_json_reads_untagged_numbers_in_flattened_maps() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        #[serde(untagged)]
        enum Setting {
            Number(f64),
            Text(String),
        }
        #[derive(serde::Deserialize, Debug)]
        struct Config {
            name: String,
            #[serde(flatten)]
            rest: std::collections::BTreeMap<String, Setting>,
        }
        let c: Config = serde_json::from_str(r#"{"name":"n","ratio":1.5,"mode":"fast"}"#)
            .expect("an untagged number inside a flattened map deserialises");
        assert_eq!(c.name, "n");
        assert_eq!(c.rest["ratio"], Setting::Number(1.5));
        assert_eq!(c.rest["mode"], Setting::Text("fast".into()));
    }
}

//! The JSON form of facts, for people and the command line (`docs/format.md`).
//!
//! ```json
//! {"type": "Shop.Order", "fields": {"id": 7},
//!  "predecessors": {"store": "0f3c2a9b", "items": [PRED, PRED]}}
//! ```
//!
//! A predecessor (PRED) is a full hash, a unique hash prefix of at least 8 hex digits, or
//! an inline fact object, which is stored before the fact that names it.
//!
//! Values map to JSON one to one, with three rules that keep the mapping unambiguous:
//! - a number written with a `.` or an exponent is a float, any other number an integer
//!   (so `1` and `1.0` differ, as they do in the canonical form);
//! - an object with exactly one key that starts with `$` is a special form:
//!   `{"$bytes": "hex"}` is a byte string, `{"$float": "Infinity"}` / `"-Infinity"` an
//!   infinite float, `{"$map": {...}}` a map written literally (needed only for a map whose
//!   single key starts with `$`);
//! - every other object is a map.

use std::collections::{BTreeMap, BTreeSet};

mod de;
mod fast;
mod value;

pub use value::{JsonNumber, JsonValue};

use crate::error::{Error, Result};
use crate::fact::{Fact, Fields, Predecessors, Value, limits};
use crate::hash::{FactHash, HashPrefix};

/// A fact as written in JSON, before its predecessor prefixes are resolved.
#[derive(Clone, Debug)]
pub struct FactSpec {
    /// The fact type name.
    pub type_name: String,
    /// The fields, already converted to values.
    pub fields: Fields,
    /// Predecessors by role, as written.
    pub predecessors: BTreeMap<String, Vec<PredSpec>>,
    /// The `"hash"` the object carried, if any; checked against the content.
    pub claimed_hash: Option<FactHash>,
}

/// One predecessor reference as written.
#[derive(Clone, Debug)]
pub enum PredSpec {
    /// A full 64-digit hash.
    Hash(FactHash),
    /// A prefix of 8 to 63 hex digits, to be resolved against a store.
    Prefix(HashPrefix),
    /// A nested fact, stored first.
    Inline(Box<FactSpec>),
}

fn err(path: &str, reason: impl std::fmt::Display) -> Error {
    Error::Json {
        reason: if path.is_empty() {
            reason.to_string()
        } else {
            format!("{path}: {reason}")
        },
    }
}

/// Parses one JSON text into a [`FactSpec`].
///
/// # Errors
/// [`Error::Json`] naming the JSON path of the first problem.
pub fn parse(text: &str) -> Result<FactSpec> {
    let json = JsonValue::parse(text).map_err(|e| err("", position_in(text, &e)))?;
    spec_from_json(&json, "")
}

/// serde_json's message for `e`, its position as a column only when `text` is one line
/// (a JSON Lines record, whose line number the caller gives: "line 1" would contradict it).
fn position_in(text: &str, e: &serde_json::Error) -> String {
    let message = e.to_string();
    if e.line() != 1 || text.trim_end().contains('\n') {
        return message;
    }
    let at = format!(" at line 1 column {}", e.column());
    match message.strip_suffix(&at) {
        Some(reason) => format!("{reason} at column {}", e.column()),
        None => message,
    }
}

/// Converts a parsed JSON value into a [`FactSpec`]; `path` prefixes error messages.
///
/// # Errors
/// [`Error::Json`] naming the JSON path of the first problem.
pub fn spec_from_json(json: &JsonValue, path: &str) -> Result<FactSpec> {
    let obj = json
        .as_object()
        .ok_or_else(|| err(path, "a fact must be a JSON object"))?;
    let mut type_name = None;
    let mut fields = Fields::new();
    let mut predecessors = BTreeMap::new();
    let mut claimed_hash = None;
    for (key, v) in obj {
        let here = join(path, key);
        match key.as_str() {
            "type" => {
                let t = v.as_str().ok_or_else(|| err(&here, "must be a string"))?;
                type_name = Some(t.to_string());
            }
            "fields" => fields = fields_from_json(v, &here)?,
            "predecessors" => predecessors = preds_from_json(v, &here)?,
            "hash" => {
                let s = v.as_str().ok_or_else(|| err(&here, "must be a string"))?;
                claimed_hash = Some(s.parse::<FactHash>().map_err(|e| err(&here, e))?);
            }
            _ => {
                return Err(err(
                    &here,
                    "unknown key (expected type, fields, predecessors, hash)",
                ));
            }
        }
    }
    let type_name = type_name.ok_or_else(|| err(path, "missing \"type\""))?;
    Ok(FactSpec {
        type_name,
        fields,
        predecessors,
        claimed_hash,
    })
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn fields_from_json(v: &JsonValue, path: &str) -> Result<Fields> {
    let obj = v
        .as_object()
        .ok_or_else(|| err(path, "must be an object"))?;
    obj.iter()
        .map(|(k, v)| Ok((k.clone(), value_from_json(v, &join(path, k), 2)?)))
        .collect()
}

fn preds_from_json(v: &JsonValue, path: &str) -> Result<BTreeMap<String, Vec<PredSpec>>> {
    let obj = v
        .as_object()
        .ok_or_else(|| err(path, "must be an object"))?;
    let mut out = BTreeMap::new();
    for (role, v) in obj {
        let here = join(path, role);
        let list = match v {
            JsonValue::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| pred_from_json(item, &format!("{here}[{i}]")))
                .collect::<Result<Vec<_>>>()?,
            _ => vec![pred_from_json(v, &here)?],
        };
        out.insert(role.clone(), list);
    }
    Ok(out)
}

fn pred_from_json(v: &JsonValue, path: &str) -> Result<PredSpec> {
    match v {
        JsonValue::String(s) => {
            let p = HashPrefix::parse(s).map_err(|e| err(path, e))?;
            Ok(match p.full() {
                Some(h) => PredSpec::Hash(h),
                None => PredSpec::Prefix(p),
            })
        }
        JsonValue::Object(_) => Ok(PredSpec::Inline(Box::new(spec_from_json(v, path)?))),
        _ => Err(err(
            path,
            "a predecessor is a hash, a hash prefix or an inline fact object",
        )),
    }
}

/// Converts a JSON value into a field value. `depth` is the nesting level of `v` (the
/// fields map is level 1), so that over-deep input is refused before recursing further.
fn value_from_json(v: &JsonValue, path: &str, depth: usize) -> Result<Value> {
    Ok(match v {
        JsonValue::Null => Value::Null,
        JsonValue::Bool(b) => Value::Bool(*b),
        JsonValue::Number(n) => number_from_json(n, path)?,
        JsonValue::String(s) => Value::Text(s.clone()),
        JsonValue::Array(items) => {
            check_depth(depth, path)?;
            Value::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| value_from_json(item, &format!("{path}[{i}]"), depth + 1))
                    .collect::<Result<_>>()?,
            )
        }
        // `$bytes` and `$float` stand for scalars, so only maps count as a nesting level.
        JsonValue::Object(obj) => match special_form(obj) {
            Some((key, inner)) => special_from_json(key, inner, path, depth)?,
            None => {
                check_depth(depth, path)?;
                Value::Map(map_from_json(obj, path, depth)?)
            }
        },
    })
}

fn check_depth(depth: usize, path: &str) -> Result<()> {
    if depth > limits::MAX_DEPTH {
        return Err(err(
            path,
            format!("nesting deeper than {} levels", limits::MAX_DEPTH),
        ));
    }
    Ok(())
}

fn map_from_json(
    obj: &[(String, JsonValue)],
    path: &str,
    depth: usize,
) -> Result<BTreeMap<String, Value>> {
    obj.iter()
        .map(|(k, v)| Ok((k.clone(), value_from_json(v, &join(path, k), depth + 1)?)))
        .collect()
}

/// An object with exactly one key starting with `$` is a special form.
fn special_form(obj: &[(String, JsonValue)]) -> Option<(&str, &JsonValue)> {
    match obj {
        [(k, v)] if k.starts_with('$') => Some((k.as_str(), v)),
        _ => None,
    }
}

fn special_from_json(key: &str, inner: &JsonValue, path: &str, depth: usize) -> Result<Value> {
    let here = join(path, key);
    match key {
        "$bytes" => {
            let s = inner
                .as_str()
                .ok_or_else(|| err(&here, "must be a hex string"))?;
            hex::decode(s)
                .map(Value::Bytes)
                .map_err(|e| err(&here, format!("not hex: {e}")))
        }
        "$float" => match inner.as_str() {
            Some("Infinity") => Ok(Value::Float(f64::INFINITY)),
            Some("-Infinity") => Ok(Value::Float(f64::NEG_INFINITY)),
            Some("NaN") => Err(err(&here, "NaN is not allowed")),
            _ => Err(err(&here, "must be \"Infinity\" or \"-Infinity\"")),
        },
        "$map" => {
            check_depth(depth, path)?;
            let obj = inner
                .as_object()
                .ok_or_else(|| err(&here, "must be an object"))?;
            Ok(Value::Map(map_from_json(obj, &here, depth)?))
        }
        _ => Err(err(
            path,
            format!(
                "unknown special form {key:?} (known: $bytes, $float, $map; write a map whose only key starts with $ as {{\"$map\": {{...}}}})"
            ),
        )),
    }
}

fn number_from_json(n: &JsonNumber, path: &str) -> Result<Value> {
    let text = n.as_str();
    if n.is_float() {
        let f: f64 = text
            .parse()
            .map_err(|_| err(path, format!("bad float {text}")))?;
        if f.is_infinite() {
            return Err(err(
                path,
                format!(
                    "float {text} is out of range; write {{\"$float\": \"Infinity\"}} for infinity"
                ),
            ));
        }
        return Ok(Value::Float(f));
    }
    let i: i128 = text
        .parse()
        .map_err(|_| err(path, format!("integer {text} is outside -2^64..2^64-1")))?;
    if !(limits::MIN_INT..=limits::MAX_INT).contains(&i) {
        return Err(err(
            path,
            format!("integer {text} is outside -2^64..2^64-1"),
        ));
    }
    Ok(Value::Integer(i))
}

/// Resolves a spec into facts: inline predecessors first (depth first, in the order
/// written), the fact itself last. `resolve_prefix` turns a prefix into a stored hash;
/// prefixes may also name a fact defined inline earlier in the same object.
///
/// # Errors
/// [`Error::Json`] or [`Error::InvalidFact`] naming the problem, [`Error::HashMismatch`]
/// when a `"hash"` does not match the content, and whatever `resolve_prefix` returns.
pub fn resolve(
    spec: &FactSpec,
    resolve_prefix: &mut dyn FnMut(&HashPrefix) -> Result<FactHash>,
) -> Result<Vec<Fact>> {
    let mut out = Vec::new();
    resolve_into(spec, resolve_prefix, &mut out)?;
    Ok(out)
}

fn resolve_into(
    spec: &FactSpec,
    resolve_prefix: &mut dyn FnMut(&HashPrefix) -> Result<FactHash>,
    out: &mut Vec<Fact>,
) -> Result<FactHash> {
    let mut preds = Predecessors::new();
    for (role, list) in &spec.predecessors {
        let mut set = BTreeSet::new();
        for p in list {
            let h = match p {
                PredSpec::Hash(h) => *h,
                PredSpec::Prefix(prefix) => {
                    // One fact written inline twice is one fact: counted once.
                    let inline: BTreeSet<FactHash> = out
                        .iter()
                        .map(Fact::hash)
                        .filter(|h| prefix.matches(h))
                        .collect();
                    let inline: Vec<FactHash> = inline.into_iter().collect();
                    match inline.as_slice() {
                        [one] => *one,
                        _ => resolve_prefix(prefix)?,
                    }
                }
                PredSpec::Inline(inner) => resolve_into(inner, resolve_prefix, out)?,
            };
            set.insert(h);
        }
        preds.insert(role.clone(), set);
    }
    let fact = Fact::new(spec.type_name.clone(), spec.fields.clone(), preds)?;
    if let Some(claimed) = spec.claimed_hash
        && claimed != fact.hash()
    {
        return Err(Error::HashMismatch {
            claimed,
            actual: fact.hash(),
        });
    }
    let h = fact.hash();
    out.push(fact);
    Ok(h)
}

/// Parses a fact whose predecessors are all full hashes or inline facts.
///
/// # Errors
/// As [`parse`] and [`resolve`]; a prefix is an error here since there is no store.
pub fn parse_standalone(text: &str) -> Result<Vec<Fact>> {
    let spec = parse(text)?;
    resolve(&spec, &mut |p| {
        Err(Error::UnknownPrefix { prefix: p.text() })
    })
}

/// The fact of one JSON-form text of the common shape (predecessors by full hash, no
/// inline facts), read in one pass without the JSON tree; `None` when the text is not of
/// that shape or not valid. It accepts nothing that [`parse`] and [`resolve`] refuse and
/// builds the same fact as they do, so a caller that gets `None` takes that path, which
/// gives the fact or the error (`src/json/fast.rs` lists what is left to it).
pub fn parse_fast(text: &str) -> Option<Fact> {
    fast::fact(text)
}

/// The JSON form of a fact, with its `"hash"`. Keys come in a fixed order: `hash`,
/// `type`, `fields`, `predecessors`; fields, roles and maps sorted by key.
pub fn to_json(fact: &Fact) -> JsonValue {
    let fields = fact
        .fields()
        .iter()
        .map(|(k, v)| (k.clone(), value_to_json(v)))
        .collect();
    let preds = fact
        .predecessors()
        .iter()
        .map(|(role, set)| {
            let v = match set.len() {
                1 => JsonValue::String(set.iter().next().unwrap().to_string()),
                _ => JsonValue::Array(
                    set.iter()
                        .map(|h| JsonValue::String(h.to_string()))
                        .collect(),
                ),
            };
            (role.clone(), v)
        })
        .collect();
    JsonValue::Object(vec![
        ("hash".into(), fact.hash().to_string().into()),
        ("type".into(), fact.type_name().into()),
        ("fields".into(), JsonValue::Object(fields)),
        ("predecessors".into(), JsonValue::Object(preds)),
    ])
}

/// The JSON form of one value; a map's keys sorted.
pub fn value_to_json(v: &Value) -> JsonValue {
    match v {
        Value::Null => JsonValue::Null,
        Value::Bool(b) => JsonValue::Bool(*b),
        Value::Integer(i) => JsonValue::Number(JsonNumber::from(*i)),
        Value::Float(f) => match JsonNumber::from_f64(*f) {
            Some(n) => JsonValue::Number(n),
            // NaN never gets into a fact; what is left is the infinities.
            None => {
                let s = if *f > 0.0 { "Infinity" } else { "-Infinity" };
                single("$float", s.into())
            }
        },
        Value::Text(s) => JsonValue::String(s.clone()),
        Value::Bytes(b) => single("$bytes", hex::encode(b).into()),
        Value::Array(items) => JsonValue::Array(items.iter().map(value_to_json).collect()),
        Value::Map(m) => {
            let obj: Vec<(String, JsonValue)> = m
                .iter()
                .map(|(k, v)| (k.clone(), value_to_json(v)))
                .collect();
            if special_form(&obj).is_some() {
                single("$map", JsonValue::Object(obj))
            } else {
                JsonValue::Object(obj)
            }
        }
    }
}

fn single(key: &str, v: JsonValue) -> JsonValue {
    JsonValue::Object(vec![(key.to_string(), v)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Fact {
        let mut facts = parse_standalone(text).unwrap();
        assert_eq!(facts.len(), 1);
        facts.pop().unwrap()
    }

    #[test]
    fn integers_and_floats_are_told_apart() {
        let a = one(r#"{"type":"T","fields":{"x":1}}"#);
        let b = one(r#"{"type":"T","fields":{"x":1.0}}"#);
        let c = one(r#"{"type":"T","fields":{"x":1e0}}"#);
        assert_eq!(a.field("x"), Some(&Value::Integer(1)));
        assert_eq!(b.field("x"), Some(&Value::Float(1.0)));
        assert_eq!(b.hash(), c.hash());
    }

    #[test]
    fn full_integer_range_is_accepted_and_no_further() {
        let min = one(r#"{"type":"T","fields":{"x":-18446744073709551616}}"#);
        assert_eq!(min.field("x"), Some(&Value::Integer(limits::MIN_INT)));
        let max = one(r#"{"type":"T","fields":{"x":18446744073709551615}}"#);
        assert_eq!(max.field("x"), Some(&Value::Integer(limits::MAX_INT)));
        for bad in ["18446744073709551616", "-18446744073709551617", "1e999"] {
            let r = parse_standalone(&format!(r#"{{"type":"T","fields":{{"x":{bad}}}}}"#));
            assert!(
                matches!(&r, Err(Error::Json { reason }) if reason.starts_with("fields.x")),
                "{bad}: {r:?}"
            );
        }
    }

    #[test]
    fn special_forms_round_trip() {
        let text = r#"{"type":"T","fields":{"b":{"$bytes":"00ff"},"i":{"$float":"-Infinity"},"m":{"$map":{"$x":1}},"z":-0.0}}"#;
        let f = one(text);
        assert_eq!(f.field("b"), Some(&Value::Bytes(vec![0, 255])));
        assert_eq!(f.field("i"), Some(&Value::Float(f64::NEG_INFINITY)));
        assert!(matches!(f.field("z"), Some(Value::Float(z)) if z.is_sign_negative()));
        let back = to_json(&f);
        let again = one(&back.to_string());
        assert_eq!(again.hash(), f.hash());
        assert_eq!(back["fields"]["m"], serde_json::json!({"$map": {"$x": 1}}));
    }

    #[test]
    fn bad_input_names_its_path() {
        let cases = [
            (r#"{"fields":{}}"#, "missing \"type\""),
            (
                r#"{"type":"T","fields":{"a":{"b":{"$nope":1}}}}"#,
                "fields.a.b: unknown special form",
            ),
            (
                r#"{"type":"T","fields":{"b":{"$bytes":"zz"}}}"#,
                "fields.b.$bytes: not hex",
            ),
            (r#"{"type":"T","extra":1}"#, "extra: unknown key"),
            (
                r#"{"type":"T","predecessors":{"p":"abc"}}"#,
                "predecessors.p",
            ),
            (
                r#"{"type":"T","predecessors":{"p":[5]}}"#,
                "predecessors.p[0]",
            ),
        ];
        for (text, want) in cases {
            match parse_standalone(text) {
                Err(Error::Json { reason }) => assert!(reason.contains(want), "{text}: {reason}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    /// A problem inside a value is placed by its path, not by a position counted from the
    /// start of that value; a one-line text's syntax error gives its column alone.
    #[test]
    fn errors_name_where_they_are_in_the_whole_text() {
        let cases = [
            (
                "{\"type\":\"A\",\n\"fields\":{\n\"s\":\"\\ud800\"}}",
                "in fields.s",
                "line 1",
            ),
            (
                r#"{"type":"A","fields":{"\ud800x":1}}"#,
                "in fields",
                "line 1",
            ),
            (
                r#"{"type":"A","fields":{"a":[1,2,}}"#,
                "at column 32",
                "line",
            ),
        ];
        for (text, want, not) in cases {
            match parse(text) {
                Err(Error::Json { reason }) => {
                    assert!(reason.contains(want), "{text}: {reason}");
                    assert!(!reason.contains(not), "{text}: {reason}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn inline_predecessors_come_first_and_hash_is_checked() {
        let facts = parse_standalone(
            r#"{"type":"Order","predecessors":{"store":{"type":"Store","fields":{"n":1}}}}"#,
        )
        .unwrap();
        assert_eq!(facts.len(), 2);
        assert_eq!(facts[0].type_name(), "Store");
        assert!(facts[1].predecessor_hashes().contains(&facts[0].hash()));
        let mut json = to_json(&facts[1]);
        json.insert("hash", facts[0].hash().to_string());
        let r = parse_standalone(&json.to_string());
        assert!(matches!(r, Err(Error::HashMismatch { .. })));
    }
}

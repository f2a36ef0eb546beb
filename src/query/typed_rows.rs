//! Query results read into Rust types through serde: a projection's JSON form
//! ([`Projected::to_json`]) deserialised into the type asked for, and, when it does not
//! fit, an error naming the result and the field.

use serde::de::DeserializeOwned;

#[cfg(doc)]
use super::run::Projected;
use super::run::QueryRow;
use crate::error::{Error, Result};
use crate::json::JsonValue;

impl QueryRow {
    /// The result's value deserialised into `T` from its JSON form (the form
    /// `precedent query --json` prints): a record into a struct with the same field
    /// names, a field into its Rust value, a child collection into a `Vec`.
    ///
    /// ```
    /// use precedent::{Fact, Store};
    /// use precedent::query::Givens;
    /// use serde::Deserialize;
    ///
    /// #[derive(Deserialize, Debug, PartialEq)]
    /// struct OrderView { id: u64, total: f64 }
    ///
    /// let store = Store::open_in_memory()?;
    /// let shop = Fact::builder("Shop").field("name", "corner").build()?;
    /// let order = Fact::builder("Shop.Order")
    ///     .field("id", 7).field("total", 2.5).predecessor("shop", shop.hash()).build()?;
    /// store.insert_batch(vec![shop.clone(), order])?;
    ///
    /// let rows = store.query_text(
    ///     "given s: Shop match o: Shop.Order where o->shop = s select {id: o.id, total: o.total}",
    ///     &Givens::from([("s".to_string(), shop.hash())]),
    /// )?;
    /// assert_eq!(rows[0].value_as::<OrderView>()?, OrderView { id: 7, total: 2.5 });
    /// # Ok::<(), precedent::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::ResultType`] with the result's key, the type's name and, where it can be
    /// told, the field that did not fit.
    pub fn value_as<T: DeserializeOwned>(&self) -> Result<T> {
        let json = self.value.to_json();
        T::deserialize(json.clone()).map_err(|e| Error::ResultType {
            key: self.key.clone(),
            type_name: std::any::type_name::<T>(),
            field: field_at_fault::<T>(&json),
            reason: e.to_string(),
        })
    }
}

/// Every result's value as a `T`, in order.
pub(crate) fn rows_as<T: DeserializeOwned>(rows: &[QueryRow]) -> Result<Vec<T>> {
    rows.iter().map(QueryRow::value_as).collect()
}

/// The path of object keys (`shop.name`) to where `T` fails to deserialise from `json`.
///
/// serde_json's errors from a `Value` carry no position. The same document printed one
/// key per line and parsed as text fails at a line, and the keys opening the objects
/// around that line, read upward by decreasing indentation, are the path. (A child
/// collection's element has no key: the path names the collection.)
fn field_at_fault<T: DeserializeOwned>(json: &JsonValue) -> Option<String> {
    let text = serde_json::to_string_pretty(json).ok()?;
    let line = serde_json::from_str::<T>(&text).err()?.line();
    let lines: Vec<&str> = text.lines().take(line).collect();
    let mut path = Vec::new();
    // Only lines indented less than this one are around it; the line at fault counts.
    let mut within = indent(lines.last()?) + 1;
    for l in lines.iter().rev() {
        let depth = indent(l);
        if depth >= within {
            continue;
        }
        within = depth;
        if let Some(key) = key_of(l) {
            path.push(key);
        }
        if depth == 0 {
            break;
        }
    }
    path.reverse();
    (!path.is_empty()).then(|| path.join("."))
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The key a pretty-printed line opens with (`"total": 2.5`), read as the JSON string it
/// is (so an escaped quote does not end it).
fn key_of(line: &str) -> Option<String> {
    let rest = line.trim_start();
    if !rest.starts_with('"') {
        return None;
    }
    let mut strings = serde_json::Deserializer::from_str(rest).into_iter::<String>();
    let key = strings.next()?.ok()?;
    rest[strings.byte_offset()..]
        .starts_with(':')
        .then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Shop {
        name: String,
    }

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct View {
        id: u64,
        shop: Shop,
        tags: Vec<String>,
    }

    #[test]
    fn the_field_at_fault_is_named_by_its_path() {
        let bad_id = json!({"id": "seven", "shop": {"name": "corner"}, "tags": []});
        assert_eq!(
            field_at_fault::<View>(&JsonValue::from(bad_id)).as_deref(),
            Some("id")
        );
        let bad_name = json!({"id": 7, "shop": {"name": 3}, "tags": []});
        assert_eq!(
            field_at_fault::<View>(&JsonValue::from(bad_name)).as_deref(),
            Some("shop.name")
        );
        let bad_tag = json!({"id": 7, "shop": {"name": "corner"}, "tags": ["a", 1]});
        assert_eq!(
            field_at_fault::<View>(&JsonValue::from(bad_tag)).as_deref(),
            Some("tags")
        );
        let nested_missing = json!({"id": 7, "shop": {}, "tags": []});
        assert_eq!(
            field_at_fault::<View>(&JsonValue::from(nested_missing)).as_deref(),
            Some("shop")
        );
        // A missing top-level field is named by serde's own message.
        assert_eq!(
            field_at_fault::<View>(&JsonValue::from(json!({"id": 7}))),
            None
        );
    }

    #[test]
    fn a_key_with_an_escaped_quote_is_read_whole() {
        assert_eq!(key_of(r#"  "a\"b": 1"#).as_deref(), Some("a\"b"));
        assert_eq!(key_of(r#"  "just a string""#), None);
    }
}

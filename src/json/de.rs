//! Reading Rust types out of a [`JsonValue`], as serde_json's `from_value` does for its
//! own `Value`.
//!
//! Typed facts are read this way rather than from JSON text: serde_json's text parser
//! rounds some floats (it parses them exactly only with its `float_roundtrip` feature,
//! which would change float parsing for every crate of an application), while a float
//! here is parsed from its text by Rust's own exact parser.

use serde::de::value::{MapAccessDeserializer, MapDeserializer, SeqDeserializer};
use serde::de::{Deserializer, Error as _, IntoDeserializer, Visitor};
use serde::forward_to_deserialize_any;

use super::value::JsonValue;

impl<'de> Deserializer<'de> for JsonValue {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            JsonValue::Null => visitor.visit_unit(),
            JsonValue::Bool(b) => visitor.visit_bool(b),
            JsonValue::Number(n) if n.is_float() => {
                let f: f64 = n.as_str().parse().map_err(Self::Error::custom)?;
                visitor.visit_f64(f)
            }
            // The narrowest form first: most visitors take u64 and i64, fewer i128.
            JsonValue::Number(n) => {
                let i: i128 = n.as_str().parse().map_err(Self::Error::custom)?;
                if let Ok(u) = u64::try_from(i) {
                    visitor.visit_u64(u)
                } else if let Ok(s) = i64::try_from(i) {
                    visitor.visit_i64(s)
                } else {
                    visitor.visit_i128(i)
                }
            }
            JsonValue::String(s) => visitor.visit_string(s),
            JsonValue::Array(items) => {
                let mut seq = SeqDeserializer::new(items.into_iter());
                let v = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(v)
            }
            JsonValue::Object(entries) => {
                let mut map = MapDeserializer::new(entries.into_iter());
                let v = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(v)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            JsonValue::Null => visitor.visit_none(),
            other => visitor.visit_some(other),
        }
    }

    /// A unit variant is a string, any other variant an object with one key, as serde_json
    /// writes them.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self {
            JsonValue::String(s) => visitor.visit_enum(s.into_deserializer()),
            JsonValue::Object(entries) if entries.len() == 1 => visitor.visit_enum(
                MapAccessDeserializer::new(MapDeserializer::new(entries.into_iter())),
            ),
            _ => Err(Self::Error::custom(
                "an enum is a string or an object with one key",
            )),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

impl IntoDeserializer<'_, serde_json::Error> for JsonValue {
    type Deserializer = JsonValue;

    fn into_deserializer(self) -> JsonValue {
        self
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Deserialize, Debug, PartialEq)]
    enum Shape {
        Dot,
        Circle { r: f64 },
    }

    #[derive(Deserialize, Debug, PartialEq)]
    struct All {
        big: i128,
        small: i8,
        f: f64,
        note: Option<String>,
        none: Option<u64>,
        list: Vec<Shape>,
    }

    #[test]
    fn reads_structs_enums_options_and_exact_numbers() {
        let text = r#"{"big":-18446744073709551616,"small":-3,"f":5.568829397862048e260,
            "note":"n","none":null,"list":["Dot",{"Circle":{"r":0.5}}]}"#;
        let all = All::deserialize(JsonValue::parse(text).unwrap()).unwrap();
        let want = All {
            big: -(1i128 << 64),
            small: -3,
            f: 5.568829397862048e260,
            note: Some("n".into()),
            none: None,
            list: vec![Shape::Dot, Shape::Circle { r: 0.5 }],
        };
        assert_eq!(all, want);
        let extra = JsonValue::parse(r#"[1, 2]"#).unwrap();
        assert!(<(u8,)>::deserialize(extra).is_err());
    }
}

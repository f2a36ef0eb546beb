//! A fast path from the JSON form's text straight to a [`Fact`], for the shape that
//! pushes and imports carry: `type`, `fields`, `predecessors` by full hash, and `hash`.
//!
//! The general path builds a JSON tree ([`JsonValue`](super::JsonValue)), then a
//! [`FactSpec`](super::FactSpec), then resolves it, which costs several allocations per
//! value and a copy of the fields. This reader makes one pass over the bytes and builds
//! the fields, predecessors and type name that [`Fact::new`] takes, and nothing else.
//!
//! It decides nothing on its own: for any text it is not certain of it answers `None`
//! ("not handled"), and the caller takes the general path, which gives the fact or the
//! error. So its rule is: whatever it accepts, the general path accepts too and builds
//! the same fact from (same bytes, same hash); every refusal, and every message, is the
//! general path's. It hands back `None` for:
//!
//! - anything that is not JSON, or is JSON that the general path refuses: a key written
//!   twice, an unknown key, a missing `type`, a bad or mismatched `hash`, an integer out
//!   of range, a float that rounds to infinity, a model violation from [`Fact::new`];
//! - what it leaves to the general path although it may be valid: a predecessor by
//!   prefix or inline, an object in the fields whose first key starts with `$` but has
//!   more keys, a `\u` escape of a lone surrogate, nesting deeper than
//!   [`limits::MAX_DEPTH`] JSON levels (which also keeps the general path's limits,
//!   [`limits::MAX_DEPTH`] model levels and its 128 JSON levels, out of reach).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use crate::fact::{Fact, Predecessors, Value, limits};
use crate::hash::{FactHash, HashPrefix};

/// The fact of `text`, if it has the common shape and is valid; `None` otherwise.
pub(super) fn fact(text: &str) -> Option<Fact> {
    let mut r = Reader { text, pos: 0 };
    let mut type_name = None;
    let mut fields = None;
    let mut predecessors = None;
    let mut claimed = None;
    // Each slot is filled once: a key written twice finds it full and stops the reader.
    r.object(|r, key| match &*key {
        "type" if type_name.is_none() => {
            type_name = Some(r.string()?.into_owned());
            Some(())
        }
        "fields" if fields.is_none() => {
            fields = Some(r.map(1)?);
            Some(())
        }
        "predecessors" if predecessors.is_none() => {
            predecessors = Some(r.predecessors()?);
            Some(())
        }
        "hash" if claimed.is_none() => {
            claimed = Some(r.string()?.parse::<FactHash>().ok()?);
            Some(())
        }
        _ => None,
    })?;
    r.skip_ws();
    if r.pos != text.len() {
        return None;
    }
    let fact = Fact::new(
        type_name?,
        fields.unwrap_or_default(),
        predecessors.unwrap_or_default(),
    )
    .ok()?;
    match claimed {
        Some(h) if h != fact.hash() => None,
        _ => Some(fact),
    }
}

struct Reader<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    /// JSON's whitespace, as serde_json reads it.
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// Skips whitespace, then takes `byte`.
    fn eat(&mut self, byte: u8) -> Option<()> {
        self.skip_ws();
        (self.peek()? == byte).then(|| self.pos += 1)
    }

    /// Takes `word` (`true`, `false`, `null`) where the reader stands.
    fn word(&mut self, word: &str) -> Option<()> {
        let rest = &self.text.as_bytes()[self.pos..];
        rest.starts_with(word.as_bytes())
            .then(|| self.pos += word.len())
    }

    /// Reads an object, handing each key to `member`, which reads its value.
    fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, Cow<'a, str>) -> Option<()>,
    ) -> Option<()> {
        self.items(b'{', b'}', |r| {
            let key = r.string()?;
            r.eat(b':')?;
            member(r, key)
        })
    }

    /// Reads an array, calling `item` for each element.
    fn array(&mut self, item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.items(b'[', b']', item)
    }

    /// Reads `open`, then `item` after item separated by commas, then `close`.
    fn items(
        &mut self,
        open: u8,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        self.eat(open)?;
        self.skip_ws();
        if self.peek()? == close {
            self.pos += 1;
            return Some(());
        }
        loop {
            item(self)?;
            self.skip_ws();
            match self.peek()? {
                b',' => self.pos += 1,
                c if c == close => {
                    self.pos += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string, borrowed from the text unless it has escapes.
    fn string(&mut self) -> Option<Cow<'a, str>> {
        self.eat(b'"')?;
        let start = self.pos;
        loop {
            match self.peek()? {
                b'"' => {
                    let s = self.text.get(start..self.pos)?;
                    self.pos += 1;
                    return Some(Cow::Borrowed(s));
                }
                b'\\' => break,
                0..0x20 => return None,
                _ => self.pos += 1,
            }
        }
        let mut out = String::from(self.text.get(start..self.pos)?);
        loop {
            match self.peek()? {
                b'"' => {
                    self.pos += 1;
                    return Some(Cow::Owned(out));
                }
                b'\\' => {
                    self.pos += 1;
                    out.push(self.escape()?);
                }
                0..0x20 => return None,
                _ => {
                    let run = self.pos;
                    while let Some(b) = self.peek()
                        && b != b'"'
                        && b != b'\\'
                        && b >= 0x20
                    {
                        self.pos += 1;
                    }
                    out.push_str(self.text.get(run..self.pos)?);
                }
            }
        }
    }

    /// The character of the escape after a `\`: a lone surrogate is left to serde_json.
    fn escape(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += 1;
        Some(match c {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let unit = self.hex4()?;
                let code = match unit {
                    0xd800..0xdc00 => {
                        self.word("\\u")?;
                        let low = self.hex4()?;
                        if !(0xdc00..0xe000).contains(&low) {
                            return None;
                        }
                        0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00)
                    }
                    _ => unit,
                };
                char::from_u32(code)?
            }
            _ => return None,
        })
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.text.get(self.pos..self.pos + 4)?;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        self.pos += 4;
        u32::from_str_radix(digits, 16).ok()
    }

    /// An object read as a map; `level` is its JSON nesting (the fact object is 0).
    fn map(&mut self, level: usize) -> Option<BTreeMap<String, Value>> {
        if level > limits::MAX_DEPTH {
            return None;
        }
        let mut map = BTreeMap::new();
        self.object(|r, key| {
            let v = r.value(level + 1)?;
            map.insert(key.into_owned(), v).is_none().then_some(())
        })?;
        Some(map)
    }

    /// A field value at JSON nesting `level`.
    fn value(&mut self, level: usize) -> Option<Value> {
        self.skip_ws();
        Some(match self.peek()? {
            b'"' => Value::Text(self.string()?.into_owned()),
            b'{' => self.object_value(level)?,
            b'[' => {
                if level > limits::MAX_DEPTH {
                    return None;
                }
                let mut items = Vec::new();
                self.array(|r| {
                    items.push(r.value(level + 1)?);
                    Some(())
                })?;
                Value::Array(items)
            }
            b't' => self.word("true").map(|()| Value::Bool(true))?,
            b'f' => self.word("false").map(|()| Value::Bool(false))?,
            b'n' => self.word("null").map(|()| Value::Null)?,
            _ => self.number()?,
        })
    }

    /// An object among the fields: a map, or a special form when its only key starts
    /// with `$` (`$bytes`, `$float`, `$map`).
    fn object_value(&mut self, level: usize) -> Option<Value> {
        if level > limits::MAX_DEPTH {
            return None;
        }
        let start = self.pos;
        self.pos += 1;
        self.skip_ws();
        let first = match self.peek()? {
            b'"' => self.string()?,
            _ => Cow::Borrowed(""),
        };
        if !first.starts_with('$') {
            self.pos = start;
            return self.map(level).map(Value::Map);
        }
        self.eat(b':')?;
        let v = match &*first {
            "$bytes" => Value::Bytes(hex::decode(&*self.string()?).ok()?),
            "$float" => match &*self.string()? {
                "Infinity" => Value::Float(f64::INFINITY),
                "-Infinity" => Value::Float(f64::NEG_INFINITY),
                _ => return None,
            },
            "$map" => Value::Map(self.map(level + 1)?),
            _ => return None,
        };
        // A second key would make this object a map, or a repeated special form: left
        // to the general path.
        self.eat(b'}')?;
        Some(v)
    }

    /// A number in JSON's grammar: an integer unless written with `.` or an exponent.
    fn number(&mut self) -> Option<Value> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek()? {
            b'0' => self.pos += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.some_digits()?;
            float = true;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.some_digits()?;
            float = true;
        }
        let text = &self.text[start..self.pos];
        if float {
            // Rust's exact parser, as the general path reads a float.
            let f: f64 = text.parse().ok()?;
            return f.is_finite().then_some(Value::Float(f));
        }
        let i: i128 = text.parse().ok()?;
        (limits::MIN_INT..=limits::MAX_INT)
            .contains(&i)
            .then_some(Value::Integer(i))
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.pos;
        self.digits();
        (self.pos > start).then_some(())
    }

    /// Roles, each one full hash or an array of them; a prefix or an inline fact is left
    /// to the general path.
    fn predecessors(&mut self) -> Option<Predecessors> {
        let mut roles = Predecessors::new();
        self.object(|r, role| {
            let mut set = BTreeSet::new();
            r.skip_ws();
            if r.peek()? == b'[' {
                r.array(|r| {
                    set.insert(r.full_hash()?);
                    Some(())
                })?;
            } else {
                set.insert(r.full_hash()?);
            }
            roles.insert(role.into_owned(), set).is_none().then_some(())
        })?;
        Some(roles)
    }

    fn full_hash(&mut self) -> Option<FactHash> {
        HashPrefix::parse(&self.string()?).ok()?.full()
    }
}

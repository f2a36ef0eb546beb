//! The canonical encoding: the only module that writes or reads fact bytes.
//!
//! A fact is encoded as deterministic CBOR (RFC 8949 section 4.2.1):
//!
//! ```text
//! [ 1, type, { field: value, ... }, { role: [ hash, ... ], ... } ]
//! ```
//!
//! an array of four: the format version (unsigned 1), the type name (text), the fields
//! (a map with text keys) and the predecessors (a map from role name to a non-empty,
//! sorted, duplicate-free array of 32-byte byte strings). Every head is in its shortest
//! form, lengths are definite, map keys are ordered by their encoded bytes, floats take
//! the shortest of half, single or double precision that keeps the exact value, and no
//! tags are used. `docs/format.md` gives the byte-level rules.
//!
//! The decoder is strict: any byte sequence other than the one encoding of a valid fact
//! is refused with the offset of the first offending byte.

use std::collections::{BTreeMap, BTreeSet};

use half::f16;

use crate::error::{Error, Result};
use crate::fact::{Fields, Predecessors, Value, check_name, limits};
use crate::hash::FactHash;

/// The format version written as the first element of every fact.
pub const FORMAT_VERSION: u64 = 1;

const MAJOR_UNSIGNED: u8 = 0;
const MAJOR_NEGATIVE: u8 = 1;
const MAJOR_BYTES: u8 = 2;
const MAJOR_TEXT: u8 = 3;
const MAJOR_ARRAY: u8 = 4;
const MAJOR_MAP: u8 = 5;
const MAJOR_TAG: u8 = 6;
const MAJOR_SIMPLE: u8 = 7;

/// Encodes a fact's parts canonically. The parts must already satisfy the fact model.
pub(crate) fn encode(type_name: &str, fields: &Fields, predecessors: &Predecessors) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + type_name.len() + 48 * predecessors.len());
    head(&mut out, MAJOR_ARRAY, 4);
    head(&mut out, MAJOR_UNSIGNED, FORMAT_VERSION);
    text(&mut out, type_name);
    map(&mut out, fields);
    head(&mut out, MAJOR_MAP, predecessors.len() as u64);
    for role in sorted_keys(predecessors) {
        text(&mut out, role);
        let set = &predecessors[role];
        head(&mut out, MAJOR_ARRAY, set.len() as u64);
        for hash in set {
            head(&mut out, MAJOR_BYTES, 32);
            out.extend_from_slice(hash.as_bytes());
        }
    }
    out
}

/// Writes a head in its shortest form.
fn head(out: &mut Vec<u8>, major: u8, arg: u64) {
    let m = major << 5;
    if arg < 24 {
        out.push(m | arg as u8);
    } else if arg <= u8::MAX as u64 {
        out.extend_from_slice(&[m | 24, arg as u8]);
    } else if arg <= u16::MAX as u64 {
        out.push(m | 25);
        out.extend_from_slice(&(arg as u16).to_be_bytes());
    } else if arg <= u32::MAX as u64 {
        out.push(m | 26);
        out.extend_from_slice(&(arg as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&arg.to_be_bytes());
    }
}

fn text(out: &mut Vec<u8>, s: &str) {
    head(out, MAJOR_TEXT, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Text keys in the order of their encoded form: shorter first, then bytewise.
fn sorted_keys<V>(map: &BTreeMap<String, V>) -> Vec<&String> {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort_by(|a, b| encoded_key_order(a, b));
    keys
}

/// The order of two text keys' encoded bytes. For text of one major type the head grows
/// with the length, so this is length first, then the UTF-8 bytes: `"b"` < `"aa"`.
pub(crate) fn encoded_key_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.len()
        .cmp(&b.len())
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

fn map(out: &mut Vec<u8>, m: &BTreeMap<String, Value>) {
    head(out, MAJOR_MAP, m.len() as u64);
    for key in sorted_keys(m) {
        text(out, key);
        value(out, &m[key]);
    }
}

fn value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.push(0xf6),
        Value::Bool(false) => out.push(0xf4),
        Value::Bool(true) => out.push(0xf5),
        Value::Integer(i) if *i >= 0 => head(out, MAJOR_UNSIGNED, *i as u64),
        Value::Integer(i) => head(out, MAJOR_NEGATIVE, (-1 - *i) as u64),
        Value::Float(f) => float(out, *f),
        Value::Text(s) => text(out, s),
        Value::Bytes(b) => {
            head(out, MAJOR_BYTES, b.len() as u64);
            out.extend_from_slice(b);
        }
        Value::Array(items) => {
            head(out, MAJOR_ARRAY, items.len() as u64);
            for item in items {
                value(out, item);
            }
        }
        Value::Map(m) => map(out, m),
    }
}

/// Writes a float in the shortest of half, single or double precision that keeps its
/// exact value (sign of zero and infinities included).
fn float(out: &mut Vec<u8>, f: f64) {
    let half = f16::from_f64(f);
    if half.to_f64().to_bits() == f.to_bits() {
        out.push(0xf9);
        out.extend_from_slice(&half.to_bits().to_be_bytes());
        return;
    }
    let single = f as f32;
    if (single as f64).to_bits() == f.to_bits() {
        out.push(0xfa);
        out.extend_from_slice(&single.to_bits().to_be_bytes());
        return;
    }
    out.push(0xfb);
    out.extend_from_slice(&f.to_bits().to_be_bytes());
}

/// Decodes canonical fact bytes, refusing anything but the one canonical encoding of a
/// valid fact: non-shortest heads, indefinite lengths, tags, unordered or duplicate keys,
/// non-shortest floats, NaN, invalid UTF-8, nesting deeper than [`limits::MAX_DEPTH`],
/// more than [`limits::MAX_FACT_BYTES`] bytes, and trailing bytes.
///
/// # Errors
/// [`Error::Decode`] with the offset of the first byte that breaks a rule.
pub fn decode(bytes: &[u8]) -> Result<(String, Fields, Predecessors)> {
    if bytes.len() > limits::MAX_FACT_BYTES {
        return Err(Error::Decode {
            offset: limits::MAX_FACT_BYTES,
            reason: format!(
                "fact is {} bytes, over the limit of {}",
                bytes.len(),
                limits::MAX_FACT_BYTES
            ),
        });
    }
    let mut r = Reader { bytes, pos: 0 };
    let at = r.pos;
    if r.head_of(MAJOR_ARRAY, "a fact array")? != 4 {
        return Err(r.error_at(at, "a fact is an array of 4 items"));
    }
    let at = r.pos;
    let version = r.head_of(MAJOR_UNSIGNED, "the format version")?;
    if version != FORMAT_VERSION {
        return Err(r.error_at(at, &format!("unsupported format version {version}")));
    }
    let at = r.pos;
    let type_name = r.text()?;
    check_name("type", &type_name, limits::MAX_TYPE_NAME_BYTES).map_err(|e| r.error_at(at, &e))?;
    let at = r.pos;
    let fields = match r.value(1)? {
        Value::Map(m) => m,
        _ => return Err(r.error_at(at, "fields must be a map")),
    };
    let predecessors = r.predecessors()?;
    if r.pos != bytes.len() {
        return Err(r.error_at(r.pos, "trailing bytes after the fact"));
    }
    Ok((type_name, fields, predecessors))
}

/// Decodes and hashes, checking the hash if one is expected.
///
/// # Errors
/// [`Error::Decode`], or [`Error::HashMismatch`] when `expected` differs from the hash.
pub fn decode_fact(bytes: &[u8], expected: Option<FactHash>) -> Result<crate::Fact> {
    let fact = crate::Fact::from_canonical(bytes)?;
    match expected {
        Some(claimed) if claimed != fact.hash() => Err(Error::HashMismatch {
            claimed,
            actual: fact.hash(),
        }),
        _ => Ok(fact),
    }
}

/// The length of the first CBOR data item in `buf`, for splitting a CBOR sequence
/// (RFC 8742) into records: `Ok(None)` if `buf` ends inside the item (read more bytes and
/// ask again), `Err` if the bytes cannot start a fact record (indefinite lengths, nesting
/// past the limit, an item over [`limits::MAX_FACT_BYTES`]). It checks only the framing;
/// [`decode`] checks the rest.
///
/// # Errors
/// [`Error::Decode`] with the offset of the offending byte.
pub fn item_len(buf: &[u8]) -> Result<Option<usize>> {
    item_len_within(buf, limits::MAX_FACT_BYTES)
}

/// [`item_len`] with another size limit in place of [`limits::MAX_FACT_BYTES`]: with a
/// limit as large as `buf`, it frames a record that is too large to be a fact, so that a
/// reader can skip it and go on to the next one.
///
/// # Errors
/// As [`item_len`].
pub fn item_len_within(buf: &[u8], max_bytes: usize) -> Result<Option<usize>> {
    ItemScan::new().resume(buf, max_bytes)
}

/// A walk over the framing of one CBOR item ([`item_len_within`]) that stops where the
/// bytes run out and goes on from there when given more: a reader skipping a record of
/// many megabytes, read a piece at a time, walks each byte once, where asking
/// [`item_len_within`] again after each piece walks the record from its start each time.
#[derive(Clone, Debug)]
pub struct ItemScan {
    /// Where the next head starts, from the item's start.
    pos: usize,
    /// Items still to read at each open nesting level.
    pending: Vec<u64>,
    /// Heads read so far.
    heads: u64,
}

impl Default for ItemScan {
    fn default() -> Self {
        ItemScan::new()
    }
}

impl ItemScan {
    /// A walk at the start of an item.
    pub fn new() -> ItemScan {
        ItemScan {
            pos: 0,
            pending: vec![1],
            heads: 0,
        }
    }

    /// How many heads the walk has read: each byte of the item is walked once however
    /// it is given (for tests and measurements).
    pub fn heads(&self) -> u64 {
        self.heads
    }

    /// Goes on over `buf`, the item's bytes from its start (those of the last call and
    /// more): as [`item_len_within`], and `Ok(None)` leaves the walk where the bytes
    /// ran out, for the next call.
    ///
    /// # Errors
    /// As [`item_len`].
    pub fn resume(&mut self, buf: &[u8], max_bytes: usize) -> Result<Option<usize>> {
        while let Some(&left) = self.pending.last() {
            if left == 0 {
                self.pending.pop();
                continue;
            }
            let pos = self.pos;
            if pos > max_bytes {
                return Err(Error::Decode {
                    offset: pos,
                    reason: format!("record over the limit of {max_bytes} bytes"),
                });
            }
            let Some(&first) = buf.get(pos) else {
                return Ok(None);
            };
            let (major, info) = (first >> 5, first & 0x1f);
            let extra = match info {
                0..=23 => 0,
                24 => 1,
                25 => 2,
                26 => 4,
                27 => 8,
                _ => {
                    return Err(Error::Decode {
                        offset: pos,
                        reason: "indefinite length or reserved head".into(),
                    });
                }
            };
            if buf.len() < pos + 1 + extra {
                return Ok(None);
            }
            let mut arg = if extra == 0 { info as u64 } else { 0 };
            for &b in &buf[pos + 1..pos + 1 + extra] {
                arg = (arg << 8) | b as u64;
            }
            // The head is whole: the walk moves past it.
            let mut next = pos + 1 + extra;
            self.heads += 1;
            if let Some(left) = self.pending.last_mut() {
                *left -= 1;
            }
            match major {
                MAJOR_BYTES | MAJOR_TEXT => {
                    if arg > max_bytes as u64 {
                        return Err(Error::Decode {
                            offset: next,
                            reason: format!(
                                "string of {arg} bytes in a record over the size limit"
                            ),
                        });
                    }
                    // Saturating: with no size limit, a length near 2^64 claims more
                    // bytes than any buffer has (incomplete), instead of wrapping around.
                    next = next.saturating_add(usize::try_from(arg).unwrap_or(usize::MAX));
                }
                MAJOR_ARRAY | MAJOR_MAP => {
                    if self.pending.len() > limits::MAX_DEPTH + 2 {
                        return Err(Error::Decode {
                            offset: next,
                            reason: format!("nesting deeper than {} levels", limits::MAX_DEPTH),
                        });
                    }
                    let items = if major == MAJOR_MAP {
                        arg.saturating_mul(2)
                    } else {
                        arg
                    };
                    self.pending.push(items);
                }
                MAJOR_TAG => self.pending.push(1),
                _ => {}
            }
            self.pos = next;
        }
        Ok((self.pos <= buf.len()).then_some(self.pos))
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn error_at(&self, offset: usize, reason: &str) -> Error {
        Error::Decode {
            offset,
            reason: reason.to_string(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() - self.pos < n {
            return Err(self.error_at(self.bytes.len(), "unexpected end of input"));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Reads a head: (major type, argument). Refuses indefinite lengths, reserved
    /// additional information and non-shortest arguments. Float and simple heads are
    /// returned with their raw additional information as the argument.
    fn head(&mut self) -> Result<(u8, u64)> {
        let at = self.pos;
        let first = self.take(1)?[0];
        let (major, info) = (first >> 5, first & 0x1f);
        if major == MAJOR_SIMPLE {
            return Ok((major, info as u64));
        }
        let arg = match info {
            0..=23 => return Ok((major, info as u64)),
            24 => self.take(1)?[0] as u64,
            25 => u16::from_be_bytes(self.take(2)?.try_into().unwrap()) as u64,
            26 => u32::from_be_bytes(self.take(4)?.try_into().unwrap()) as u64,
            27 => u64::from_be_bytes(self.take(8)?.try_into().unwrap()),
            31 => return Err(self.error_at(at, "indefinite length is not allowed")),
            _ => return Err(self.error_at(at, "reserved additional information")),
        };
        let shortest = match info {
            24 => arg >= 24,
            25 => arg > u8::MAX as u64,
            26 => arg > u16::MAX as u64,
            _ => arg > u32::MAX as u64,
        };
        if !shortest {
            return Err(self.error_at(at, "integer or length not in its shortest form"));
        }
        Ok((major, arg))
    }

    fn head_of(&mut self, major: u8, what: &str) -> Result<u64> {
        let at = self.pos;
        let (m, arg) = self.head()?;
        if m != major {
            return Err(self.error_at(at, &format!("expected {what}")));
        }
        Ok(arg)
    }

    fn len(&mut self, arg: u64) -> Result<usize> {
        let left = (self.bytes.len() - self.pos) as u64;
        if arg > left {
            return Err(self.error_at(self.bytes.len(), "unexpected end of input"));
        }
        Ok(arg as usize)
    }

    fn text_body(&mut self, arg: u64) -> Result<String> {
        self.text_body_ref(arg).map(str::to_string)
    }

    fn text_body_ref(&mut self, arg: u64) -> Result<&'a str> {
        let at = self.pos;
        let n = self.len(arg)?;
        let raw = self.take(n)?;
        std::str::from_utf8(raw).map_err(|_| self.error_at(at, "text is not valid utf-8"))
    }

    fn text(&mut self) -> Result<String> {
        let arg = self.head_of(MAJOR_TEXT, "text")?;
        self.text_body(arg)
    }

    /// Text, borrowed from the input: a map key is compared with the next one before it
    /// is copied into the map.
    fn text_ref(&mut self) -> Result<&'a str> {
        let arg = self.head_of(MAJOR_TEXT, "text")?;
        self.text_body_ref(arg)
    }

    fn value(&mut self, depth: usize) -> Result<Value> {
        let at = self.pos;
        let (major, arg) = self.head()?;
        Ok(match major {
            MAJOR_UNSIGNED => Value::Integer(arg as i128),
            MAJOR_NEGATIVE => Value::Integer(-1 - arg as i128),
            MAJOR_BYTES => {
                let n = self.len(arg)?;
                Value::Bytes(self.take(n)?.to_vec())
            }
            MAJOR_TEXT => Value::Text(self.text_body(arg)?),
            MAJOR_ARRAY => {
                self.check_depth(at, depth)?;
                let n = self.len(arg)?; // every item takes at least one byte
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(depth + 1)?);
                }
                Value::Array(items)
            }
            MAJOR_MAP => {
                self.check_depth(at, depth)?;
                let n = self.len(arg)?;
                let mut m = BTreeMap::new();
                let mut previous = None;
                for _ in 0..n {
                    let key = self.map_key(previous)?;
                    let v = self.value(depth + 1)?;
                    m.insert(key.to_string(), v);
                    previous = Some(key);
                }
                Value::Map(m)
            }
            MAJOR_TAG => return Err(self.error_at(at, "tags are not allowed")),
            _ => self.simple(at, arg)?,
        })
    }

    fn check_depth(&self, at: usize, depth: usize) -> Result<()> {
        if depth > limits::MAX_DEPTH {
            return Err(self.error_at(
                at,
                &format!("nesting deeper than {} levels", limits::MAX_DEPTH),
            ));
        }
        Ok(())
    }

    /// Reads a text map key that must sort strictly after `previous` in encoded order.
    fn map_key(&mut self, previous: Option<&str>) -> Result<&'a str> {
        let at = self.pos;
        let key = self.text_ref().map_err(|e| match e {
            Error::Decode { reason, .. } if reason == "expected text" => {
                self.error_at(at, "map keys must be text")
            }
            e => e,
        })?;
        if let Some(p) = previous {
            match encoded_key_order(p, key) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => {
                    return Err(self.error_at(at, &format!("duplicate map key {key:?}")));
                }
                std::cmp::Ordering::Greater => {
                    return Err(
                        self.error_at(at, &format!("map key {key:?} out of canonical order"))
                    );
                }
            }
        }
        Ok(key)
    }

    fn simple(&mut self, at: usize, info: u64) -> Result<Value> {
        let (f, fits_shorter) = match info {
            20 => return Ok(Value::Bool(false)),
            21 => return Ok(Value::Bool(true)),
            22 => return Ok(Value::Null),
            25 => {
                let bits = u16::from_be_bytes(self.take(2)?.try_into().unwrap());
                (f16::from_bits(bits).to_f64(), false)
            }
            26 => {
                let bits = u32::from_be_bytes(self.take(4)?.try_into().unwrap());
                let f = f32::from_bits(bits) as f64;
                (f, f16::from_f64(f).to_f64().to_bits() == f.to_bits())
            }
            27 => {
                let f = f64::from_bits(u64::from_be_bytes(self.take(8)?.try_into().unwrap()));
                (f, ((f as f32) as f64).to_bits() == f.to_bits())
            }
            23 => return Err(self.error_at(at, "undefined is not allowed")),
            31 => return Err(self.error_at(at, "unexpected break")),
            _ => {
                return Err(self.error_at(
                    at,
                    "simple values other than false, true and null are not allowed",
                ));
            }
        };
        if f.is_nan() {
            return Err(self.error_at(at, "NaN is not allowed"));
        }
        if fits_shorter {
            return Err(self.error_at(at, "float not in its shortest exact form"));
        }
        Ok(Value::Float(f))
    }

    fn predecessors(&mut self) -> Result<Predecessors> {
        let n = self.head_of(MAJOR_MAP, "a predecessor map")?;
        let n = self.len(n)?;
        let mut out = Predecessors::new();
        let mut previous = None;
        let mut total = 0usize;
        for _ in 0..n {
            let at = self.pos;
            let role = self.map_key(previous)?;
            check_name("role", role, limits::MAX_ROLE_NAME_BYTES)
                .map_err(|e| self.error_at(at, &e))?;
            let at = self.pos;
            let count = self.head_of(MAJOR_ARRAY, "an array of predecessor hashes")?;
            if count == 0 {
                return Err(self.error_at(at, "empty predecessor role (empty roles are dropped)"));
            }
            total = total.saturating_add(count as usize);
            if total > limits::MAX_PREDECESSORS {
                return Err(self.error_at(
                    at,
                    &format!("more than {} predecessors", limits::MAX_PREDECESSORS),
                ));
            }
            let mut set = BTreeSet::new();
            let mut last: Option<FactHash> = None;
            for _ in 0..count {
                let at = self.pos;
                if self.head_of(MAJOR_BYTES, "a 32-byte predecessor hash")? != 32 {
                    return Err(self.error_at(at, "a predecessor hash is 32 bytes"));
                }
                let hash = FactHash::from_slice(self.take(32)?).expect("32 bytes");
                if last.is_some_and(|l| l >= hash) {
                    return Err(self.error_at(at, "predecessor hashes not sorted or duplicated"));
                }
                last = Some(hash);
                set.insert(hash);
            }
            out.insert(role.to_string(), set);
            previous = Some(role);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_item_walked_a_piece_at_a_time_walks_each_head_once() {
        // An array of 200,000 zeros given in pieces of 1,000 bytes, then a byte more.
        let mut item = vec![0x1a_u8 | 0x80, 0x00, 0x03, 0x0d, 0x40];
        item.resize(5 + 200_000, 0);
        let mut scan = ItemScan::new();
        let mut end = 1_000;
        let found = loop {
            match scan
                .resume(&item[..end.min(item.len())], usize::MAX)
                .unwrap()
            {
                Some(n) => break n,
                None => end += 1_000,
            }
        };
        assert_eq!(found, item.len());
        assert_eq!(Some(found), item_len_within(&item, usize::MAX).unwrap());
        // The array's head and its items' once each, where asking `item_len_within`
        // after each piece would have walked about 20 million.
        assert_eq!(scan.heads(), 200_001);
        // A string that runs past the bytes given, then ends in the next piece.
        let mut text = vec![0x79, 0x01, 0x00];
        text.resize(3 + 256, b'a');
        let mut scan = ItemScan::new();
        assert_eq!(scan.resume(&text[..100], usize::MAX).unwrap(), None);
        assert_eq!(scan.resume(&text, usize::MAX).unwrap(), Some(text.len()));
        // A head cut in two: the walk waits at its start.
        let mut scan = ItemScan::new();
        assert_eq!(scan.resume(&[0x19], usize::MAX).unwrap(), None);
        assert_eq!(
            scan.resume(&[0x19, 0x01, 0x00], usize::MAX).unwrap(),
            Some(3)
        );
        assert_eq!(scan.heads(), 1);
    }

    use super::*;
    use crate::Fact;

    fn one_field(v: Value) -> Vec<u8> {
        Fact::builder("T")
            .field("v", v)
            .build()
            .unwrap()
            .canonical_bytes()
            .to_vec()
    }

    /// The encoding of the single field value, cut out of the fact.
    fn value_bytes(v: Value) -> String {
        let b = one_field(v);
        // 84 01 61 54 a1 61 76 <value> a0
        hex::encode(&b[7..b.len() - 1])
    }

    #[test]
    fn integers_take_their_shortest_head() {
        let cases: &[(i128, &str)] = &[
            (0, "00"),
            (23, "17"),
            (24, "1818"),
            (255, "18ff"),
            (256, "190100"),
            (65535, "19ffff"),
            (65536, "1a00010000"),
            (1 << 32, "1b0000000100000000"),
            (-1, "20"),
            (-24, "37"),
            (-25, "3818"),
            (i64::MIN as i128, "3b7fffffffffffffff"),
            (u64::MAX as i128, "1bffffffffffffffff"),
            (limits::MIN_INT, "3bffffffffffffffff"),
        ];
        for (i, want) in cases {
            assert_eq!(value_bytes(Value::Integer(*i)), *want, "{i}");
        }
    }

    #[test]
    fn floats_take_the_shortest_exact_width() {
        let cases: &[(f64, &str)] = &[
            (0.0, "f90000"),
            (-0.0, "f98000"),
            (1.5, "f93e00"),
            (f64::INFINITY, "f97c00"),
            (f64::NEG_INFINITY, "f9fc00"),
            (100000.0, "fa47c35000"),
            (1.1, "fb3ff199999999999a"),
            (5.960464477539063e-8, "f90001"),
        ];
        for (f, want) in cases {
            assert_eq!(value_bytes(Value::Float(*f)), *want, "{f}");
        }
    }

    #[test]
    fn keys_sort_by_encoded_bytes() {
        let f = Fact::builder("T")
            .field("aa", 1)
            .field("b", 2)
            .build()
            .unwrap();
        let hex = hex::encode(f.canonical_bytes());
        assert!(
            hex.find("6162").unwrap() < hex.find("626161").unwrap(),
            "{hex}"
        );
    }

    #[test]
    fn every_fact_decodes_to_itself() {
        let f = Fact::builder("Shop.Order")
            .field("n", -7)
            .field("f", 0.5)
            .field("t", "é")
            .field("b", vec![1u8, 2])
            .field("a", Value::Array(vec![Value::Null, Value::Bool(true)]))
            .predecessor("store", FactHash([9; 32]))
            .predecessor("items", FactHash([2; 32]))
            .predecessor("items", FactHash([1; 32]))
            .build()
            .unwrap();
        let back = Fact::from_canonical(f.canonical_bytes()).unwrap();
        assert_eq!(back.hash(), f.hash());
        assert_eq!(back.fields(), f.fields());
        assert_eq!(back.predecessors(), f.predecessors());
        // ciborium, an independent decoder, reads the same bytes as well-formed CBOR.
        #[allow(clippy::disallowed_methods)] // an independent decoder, as a cross-check
        let v: ciborium::Value = ciborium::from_reader(f.canonical_bytes()).unwrap();
        assert!(v.is_array());
    }

    fn decode_err(hex_bytes: &str) -> String {
        match decode(&hex::decode(hex_bytes).unwrap()) {
            Err(Error::Decode { reason, .. }) => reason,
            other => panic!("{hex_bytes} decoded: {other:?}"),
        }
    }

    #[test]
    fn non_canonical_bytes_are_refused() {
        // Base: 84 01 61 54 a0 a0 = [1, "T", {}, {}]
        assert!(decode(&hex::decode("84016154a0a0").unwrap()).is_ok());
        assert!(decode_err("8401615418a0a0").contains("fields must be a map"));
        assert!(decode_err("84016154a0a000").contains("trailing"));
        assert!(decode_err("9f016154a0a0ff").contains("indefinite"));
        assert!(decode_err("8418016154a0a0").contains("shortest")); // version 1 in two bytes
        assert!(decode_err("8402615400a0").contains("version"));
        assert!(decode_err("84016154a2616101616101a0").contains("duplicate"));
        assert!(
            decode_err("84016154a2626161016162 02a0".replace(' ', "").as_str()).contains("order")
        );
        assert!(decode_err("84016154a16176f97e00a0").contains("NaN"));
        assert!(decode_err("84016154a16176fa3fc00000a0").contains("shortest")); // 1.5 as f32
        assert!(decode_err("84016154a16176c100a0").contains("tags"));
        assert!(decode_err("84016154a16176f7a0").contains("undefined"));
        assert!(decode_err("84016154a16176f0a0").contains("simple"));
        assert!(decode_err("84016154a1617662ff00a0").contains("utf-8"));
        assert!(decode_err("84016154a0a1617080").contains("empty predecessor role"));
        assert!(
            decode_err("84016054a0a0").contains("empty")
                || decode_err("84016054a0a0").contains("expected")
        );
    }

    #[test]
    fn unsorted_or_duplicate_predecessors_are_refused() {
        let mut b = hex::decode("84016154a0a161708258200").unwrap_or_default();
        b.clear();
        b.extend(hex::decode("84016154a0a16170825820").unwrap());
        b.extend([2u8; 32]);
        b.extend(hex::decode("5820").unwrap());
        b.extend([1u8; 32]);
        assert!(
            matches!(decode(&b), Err(Error::Decode { reason, .. }) if reason.contains("sorted"))
        );
    }

    #[test]
    fn nesting_beyond_the_limit_is_refused_by_the_decoder() {
        let mut b = hex::decode("84016154a16176").unwrap();
        b.extend(std::iter::repeat_n(0x81u8, limits::MAX_DEPTH));
        b.push(0xf6);
        b.push(0xa0);
        assert!(
            matches!(decode(&b), Err(Error::Decode { reason, .. }) if reason.contains("nesting"))
        );
        let mut ok = hex::decode("84016154a16176").unwrap();
        ok.extend(std::iter::repeat_n(0x81u8, limits::MAX_DEPTH - 1));
        ok.push(0xf6);
        ok.push(0xa0);
        assert!(decode(&ok).is_ok());
    }

    #[test]
    fn item_len_splits_a_sequence() {
        let a = Fact::builder("A")
            .field("s", "x".repeat(300))
            .build()
            .unwrap();
        let b = Fact::builder("B")
            .predecessor("a", a.hash())
            .build()
            .unwrap();
        let mut seq = a.canonical_bytes().to_vec();
        seq.extend_from_slice(b.canonical_bytes());
        let first = item_len(&seq).unwrap().unwrap();
        assert_eq!(first, a.canonical_bytes().len());
        assert_eq!(
            item_len(&seq[first..]).unwrap(),
            Some(b.canonical_bytes().len())
        );
        for cut in 0..a.canonical_bytes().len() {
            assert_eq!(item_len(&seq[..cut]).unwrap(), None, "cut {cut}");
        }
        assert!(item_len(&[0x9f]).is_err());
    }

    #[test]
    fn truncated_input_is_refused_at_every_cut() {
        let f = Fact::builder("T")
            .field("x", "hello")
            .predecessor("p", FactHash([3; 32]))
            .build()
            .unwrap();
        let b = f.canonical_bytes();
        for cut in 0..b.len() {
            assert!(decode(&b[..cut]).is_err(), "cut at {cut}");
        }
    }
}

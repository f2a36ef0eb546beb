//! `FactHash`: the identity of a fact, and prefixes of it.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// The BLAKE3 hash of a fact's canonical bytes (see `docs/format.md`).
///
/// Its text form is 64 lowercase hex digits. Ordering is bytewise, which is also the
/// order of the text form and the order predecessor sets are encoded in.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FactHash(pub [u8; 32]);

impl FactHash {
    /// Hashes canonical fact bytes. The caller is responsible for the bytes being canonical.
    pub fn of_canonical(bytes: &[u8]) -> FactHash {
        FactHash(*blake3::hash(bytes).as_bytes())
    }

    /// Checks that stored bytes hash to this key, without decoding them: what every path
    /// that hands raw stored bytes to the outside (export, sync) runs, so that damage is
    /// reported, never passed on.
    ///
    /// # Errors
    /// [`crate::Error::Corrupt`] naming this hash and what the bytes hash to.
    pub(crate) fn check_stored(&self, bytes: &[u8]) -> crate::Result<()> {
        let actual = FactHash::of_canonical(bytes);
        if actual != *self {
            return Err(crate::Error::Corrupt {
                hash: *self,
                reason: format!("stored bytes hash to {actual}"),
            });
        }
        Ok(())
    }

    /// A hash read back from the database. One that is not 32 bytes is damage:
    /// [`crate::Error::Corrupt`], keyed by the BLAKE3 hash of the bad value (the row has
    /// no other name), never a made-up hash.
    ///
    /// # Errors
    /// [`crate::Error::Corrupt`].
    pub(crate) fn from_stored(bytes: &[u8]) -> crate::Result<FactHash> {
        FactHash::from_slice(bytes).ok_or_else(|| crate::Error::Corrupt {
            hash: FactHash::of_canonical(bytes),
            reason: format!("stored hash has {} bytes, not 32", bytes.len()),
        })
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Builds a hash from a 32-byte slice; `None` if the length is wrong.
    pub fn from_slice(bytes: &[u8]) -> Option<FactHash> {
        <[u8; 32]>::try_from(bytes).ok().map(FactHash)
    }

    /// The first `n` hex digits, for messages and tables.
    pub fn short(&self, n: usize) -> String {
        let mut s = self.to_string();
        s.truncate(n.min(64));
        s
    }
}

impl FactHash {
    /// The 64 lowercase hex digits of the text form, written without allocating: the
    /// text form is written once per result by answers of many thousand hashes.
    pub(crate) fn hex_digits(&self) -> [u8; 64] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (i, b) in self.0.iter().enumerate() {
            out[2 * i] = DIGITS[usize::from(b >> 4)];
            out[2 * i + 1] = DIGITS[usize::from(b & 0x0f)];
        }
        out
    }
}

impl fmt::Display for FactHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.hex_digits();
        f.write_str(std::str::from_utf8(&digits).expect("hex digits are ASCII"))
    }
}

impl fmt::Debug for FactHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FactHash({})", self.short(12))
    }
}

impl FromStr for FactHash {
    type Err = Error;

    /// Parses exactly 64 hex digits (either case).
    fn from_str(s: &str) -> Result<FactHash, Error> {
        match HashPrefix::parse(s)? {
            HashPrefix { nibbles: 64, bytes } => Ok(FactHash(bytes)),
            _ => Err(Error::BadHash {
                prefix: s.to_string(),
                reason: "a full hash has 64 hex digits",
            }),
        }
    }
}

impl serde::Serialize for FactHash {
    /// As the 64-digit lowercase hex text form.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let digits = self.hex_digits();
        s.serialize_str(std::str::from_utf8(&digits).expect("hex digits are ASCII"))
    }
}

impl<'de> serde::Deserialize<'de> for FactHash {
    /// From the 64-digit hex text form.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FactHash, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The shortest prefix the command line accepts, as git does.
pub const MIN_PREFIX_DIGITS: usize = 8;

/// A hash or a prefix of one: 8 to 64 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct HashPrefix {
    /// The prefix bytes, zero-padded to 32.
    bytes: [u8; 32],
    /// How many hex digits were given (8..=64).
    nibbles: usize,
}

/// What [`HEX_DIGIT`] holds for a byte that is not a hex digit: a digit's value has none
/// of these bits, so `(hi | lo) & NOT_HEX` shows either not being one.
const NOT_HEX: u8 = 0xF0;

/// The value of each ASCII hex digit (either case), [`NOT_HEX`] for any other byte.
const HEX_DIGIT: [u8; 256] = {
    let mut t = [NOT_HEX; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

impl HashPrefix {
    /// Parses 8 to 64 hex digits.
    ///
    /// # Errors
    /// [`Error::BadHash`] for other lengths or characters.
    pub fn parse(s: &str) -> Result<HashPrefix, Error> {
        let bad = |reason| Error::BadHash {
            prefix: s.to_string(),
            reason,
        };
        if s.len() < MIN_PREFIX_DIGITS {
            return Err(bad("a hash prefix needs at least 8 hex digits"));
        }
        if s.len() > 64 {
            return Err(bad("a hash has at most 64 hex digits"));
        }
        let mut bytes = [0u8; 32];
        // Two digits at a time through a table (every pushed fact parses one or two
        // hashes, so this is on the ingest path).
        let digits = s.as_bytes();
        let mut pairs = digits.chunks_exact(2);
        for (b, pair) in bytes.iter_mut().zip(&mut pairs) {
            let (hi, lo) = (HEX_DIGIT[pair[0] as usize], HEX_DIGIT[pair[1] as usize]);
            if (hi | lo) & NOT_HEX != 0 {
                return Err(bad("not a hex digit"));
            }
            *b = hi << 4 | lo;
        }
        if let [last] = pairs.remainder() {
            let v = HEX_DIGIT[*last as usize];
            if v & NOT_HEX != 0 {
                return Err(bad("not a hex digit"));
            }
            bytes[digits.len() / 2] = v << 4;
        }
        Ok(HashPrefix {
            bytes,
            nibbles: s.len(),
        })
    }

    /// The full hash, if all 64 digits were given.
    pub fn full(&self) -> Option<FactHash> {
        (self.nibbles == 64).then_some(FactHash(self.bytes))
    }

    /// Whether `hash` starts with this prefix.
    pub fn matches(&self, hash: &FactHash) -> bool {
        let whole = self.nibbles / 2;
        if hash.0[..whole] != self.bytes[..whole] {
            return false;
        }
        self.nibbles.is_multiple_of(2) || hash.0[whole] >> 4 == self.bytes[whole] >> 4
    }

    /// The smallest hash with this prefix.
    pub fn lowest(&self) -> [u8; 32] {
        self.bytes
    }

    /// The largest hash with this prefix.
    pub fn highest(&self) -> [u8; 32] {
        let mut b = self.bytes;
        let whole = self.nibbles / 2;
        if !self.nibbles.is_multiple_of(2) {
            b[whole] |= 0x0f;
            b[whole + 1..].fill(0xff);
        } else {
            b[whole..].fill(0xff);
        }
        b
    }

    /// The text form as given, lowercased.
    pub fn text(&self) -> String {
        let mut s = hex::encode(self.bytes);
        s.truncate(self.nibbles);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip_is_lowercase() {
        let h = FactHash::of_canonical(b"x");
        let s = h.to_string();
        assert_eq!(s.len(), 64);
        assert_eq!(s, s.to_lowercase());
        assert_eq!(s.parse::<FactHash>().unwrap(), h);
        assert_eq!(s.to_uppercase().parse::<FactHash>().unwrap(), h);
    }

    #[test]
    fn text_form_is_the_hex_of_every_byte() {
        for seed in 0..256u32 {
            let h = FactHash::of_canonical(&seed.to_le_bytes());
            assert_eq!(h.to_string(), hex::encode(h.0));
            assert_eq!(
                serde_json::to_string(&h).unwrap(),
                format!("\"{}\"", hex::encode(h.0))
            );
        }
        assert_eq!(FactHash([0xff; 32]).to_string(), "f".repeat(64));
        assert_eq!(FactHash([0; 32]).to_string(), "0".repeat(64));
    }

    #[test]
    fn prefix_bounds_cover_exactly_the_matching_hashes() {
        let h = FactHash::of_canonical(b"y");
        for n in [8, 9, 15, 33, 63, 64] {
            let p = HashPrefix::parse(&h.to_string()[..n]).unwrap();
            assert!(p.matches(&h), "{n}");
            assert!(p.lowest() <= h.0 && h.0 <= p.highest(), "{n}");
            let mut other = h.0;
            other[(n - 1) / 2] ^= if n % 2 == 1 { 0x10 } else { 0x01 };
            assert!(!p.matches(&FactHash(other)), "{n}");
        }
    }

    #[test]
    fn every_byte_in_every_kind_of_place_is_a_digit_or_refused() {
        let h = FactHash::of_canonical(b"z").to_string();
        // The high and low digit of a pair, the last of a whole hash, and the odd last
        // digit of a prefix.
        for (text, at) in [(&h[..], 0), (&h[..], 1), (&h[..], 63), (&h[..9], 8)] {
            for b in 0..=255u8 {
                let mut t = text.as_bytes().to_vec();
                t[at] = b;
                let Ok(t) = String::from_utf8(t) else {
                    continue;
                };
                let digit = (b as char).to_digit(16);
                match (HashPrefix::parse(&t), digit) {
                    (Ok(p), Some(v)) => {
                        let byte = p.bytes[at / 2];
                        let got = if at % 2 == 0 { byte >> 4 } else { byte & 0x0f };
                        assert_eq!(u32::from(got), v, "{t}");
                        assert_eq!(p.nibbles, t.len());
                    }
                    (Err(Error::BadHash { .. }), None) => {}
                    (other, _) => panic!("{t:?} at {at}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn short_or_non_hex_prefixes_are_refused() {
        assert!(matches!(
            HashPrefix::parse("abc1234"),
            Err(Error::BadHash { .. })
        ));
        assert!(matches!(
            HashPrefix::parse("abcdefgh"),
            Err(Error::BadHash { .. })
        ));
        assert!(matches!(
            HashPrefix::parse(&"a".repeat(65)),
            Err(Error::BadHash { .. })
        ));
        assert!(matches!(
            "abcdef12".parse::<FactHash>(),
            Err(Error::BadHash { .. })
        ));
    }
}

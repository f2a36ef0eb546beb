//! Canonical CBOR: `Fact::from_canonical`, `encoding::decode`, `encoding::decode_fact` and
//! `encoding::item_len` on arbitrary bytes.
//!
//! Properties: no panic; the three decoders agree; a fact that decodes re-encodes to exactly
//! the input bytes (a fact has one encoding) and hashes to the BLAKE3 of them; `item_len`
//! frames any accepted fact as one item of its full length and never claims more bytes
//! than it was given.

#![no_main]

use libfuzzer_sys::fuzz_target;
use precedent::{Fact, FactHash, encoding};

fuzz_target!(|data: &[u8]| {
    let framed = encoding::item_len(data);
    if let Ok(Some(n)) = framed {
        assert!(
            n > 0 && n <= data.len(),
            "item_len {n} of {} bytes",
            data.len()
        );
    }
    let decoded = encoding::decode(data);
    let fact = Fact::from_canonical(data);
    assert_eq!(
        decoded.is_ok(),
        fact.is_ok(),
        "decode and from_canonical disagree"
    );
    let Ok(fact) = fact else { return };
    let (type_name, fields, predecessors) = decoded.unwrap();
    assert_eq!(fact.canonical_bytes(), data);
    assert_eq!(fact.hash(), FactHash::of_canonical(data));
    // Rebuilt from its parts, the fact encodes to the same bytes.
    let rebuilt = Fact::new(type_name, fields, predecessors).expect("accepted parts rebuild");
    assert_eq!(rebuilt.canonical_bytes(), data, "one fact, two encodings");
    // A sequence splitter sees the whole fact as one record.
    assert_eq!(
        framed.ok().flatten(),
        Some(data.len()),
        "item_len of an accepted fact"
    );
    let checked = encoding::decode_fact(data, Some(fact.hash())).expect("own hash accepted");
    assert_eq!(checked.hash(), fact.hash());
    // The JSON form carries the same fact.
    let json = serde_json::to_string(&precedent::json::to_json(&fact)).unwrap();
    let back = precedent::json::parse_standalone(&json).expect("JSON form of a fact parses");
    assert_eq!(
        back.last().map(Fact::hash),
        Some(fact.hash()),
        "JSON round trip: {json}"
    );
});

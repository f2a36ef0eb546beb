//! The hash vectors of `fixtures/hash-vectors.json`, produced by the independent Python
//! reference `fixtures/reference/canonical.py` from `docs/format.md`, checked against
//! the Rust encoder, decoder and JSON form.

use std::collections::BTreeMap;

use precedent::Fact;
use precedent::json::{parse_standalone, to_json};
// The fixtures hold integers down to -2^64, beyond what serde_json's `Value` keeps.
use precedent::json::JsonValue as Json;

const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/hash-vectors.json");

fn load() -> Json {
    let text = std::fs::read_to_string(VECTORS).expect("read fixtures/hash-vectors.json");
    Json::parse(&text).expect("fixtures/hash-vectors.json is JSON")
}

fn string<'a>(v: &'a Json, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} is a string in {v}"))
}

/// Checks one vector; returns the first disagreement.
fn check_vector(v: &Json) -> Result<(), String> {
    let (want_cbor, want_hash) = (string(v, "cbor"), string(v, "hash"));
    let facts = parse_standalone(&v["json"].to_string()).map_err(|e| format!("parse: {e}"))?;
    let fact = facts.last().ok_or("parse returned no fact")?;
    let cbor = hex::encode(fact.canonical_bytes());
    if cbor != want_cbor {
        return Err(format!("cbor\n  got  {cbor}\n  want {want_cbor}"));
    }
    if fact.hash().to_string() != want_hash {
        return Err(format!("hash: got {}, want {want_hash}", fact.hash()));
    }

    let bytes = hex::decode(want_cbor).map_err(|e| format!("cbor is not hex: {e}"))?;
    let decoded = Fact::from_canonical(&bytes).map_err(|e| format!("decode: {e}"))?;
    if decoded.hash().to_string() != want_hash {
        return Err(format!("decoded hash: got {}", decoded.hash()));
    }
    if decoded.canonical_bytes() != bytes.as_slice() {
        return Err("decoded bytes differ".into());
    }

    let exported = to_json(&decoded);
    if exported["hash"].as_str() != Some(want_hash) {
        return Err(format!("exported hash field: {}", exported["hash"]));
    }
    let again = parse_standalone(&exported.to_string())
        .map_err(|e| format!("re-import of {exported}: {e}"))?;
    let last = again.last().ok_or("re-import returned no fact")?;
    if last.hash().to_string() != want_hash {
        return Err(format!("re-imported hash: got {}", last.hash()));
    }
    Ok(())
}

#[test]
fn hash_vectors_match_the_reference() {
    let doc = load();
    assert_eq!(doc["format_version"], 1);
    let vectors = doc["vectors"].as_array().expect("vectors is an array");
    assert!(vectors.len() >= 20, "only {} vectors", vectors.len());

    let mut failures = Vec::new();
    for v in vectors {
        if let Err(e) = check_vector(v) {
            failures.push(format!("{}: {e}", string(v, "name")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} vectors disagree:\n{}",
        failures.len(),
        vectors.len(),
        failures.join("\n")
    );
}

#[test]
fn vector_names_are_unambiguous() {
    let doc = load();
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for v in doc["vectors"].as_array().expect("vectors is an array") {
        let (name, hash) = (string(v, "name"), string(v, "hash"));
        if let Some(other) = seen.insert(name, hash) {
            assert_eq!(
                other, hash,
                "vector name {name} used for two different facts"
            );
        }
    }
}

#[test]
fn invalid_inputs_are_refused_with_their_reason() {
    let doc = load();
    let invalid = doc["invalid"].as_array().expect("invalid is an array");
    assert!(!invalid.is_empty());
    for v in invalid {
        let (name, fragment) = (string(v, "name"), string(v, "error"));
        match parse_standalone(&v["json"].to_string()) {
            Ok(facts) => panic!("{name}: accepted as {}", facts.last().unwrap().hash()),
            Err(e) => {
                let message = e.to_string();
                assert!(
                    message.contains(fragment),
                    "{name}: error {message:?} lacks {fragment:?}"
                );
            }
        }
    }
}

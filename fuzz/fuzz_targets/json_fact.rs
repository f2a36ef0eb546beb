//! The JSON form, as `precedent add` and `precedent import` read it: `json::parse` then
//! `json::resolve` with a prefix resolver that always fails (no store), and
//! `json::parse_standalone`.
//!
//! Properties: no panic; every fact produced decodes from its canonical bytes to itself;
//! its JSON form (`json::to_json`) parses back to the same hash; a `"hash"` that was
//! accepted equals the content's hash. The fast path (`json::parse_fast`, what pushes
//! and imports read first) accepts only what the general path accepts, as the same fact
//! (same bytes), and takes the JSON form of every fact the general path gives, but for
//! special forms (`$bytes`, `$float`, `$map`) and deep nesting, which it may leave.

#![no_main]

use libfuzzer_sys::fuzz_target;
use precedent::{Error, Fact, json};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let standalone = json::parse_standalone(text);
    if let Some(fast) = json::parse_fast(text) {
        let general = standalone
            .as_ref()
            .expect("what the fast path takes, the general path takes");
        assert_eq!(general.len(), 1, "the fast path gives one fact");
        assert_eq!(general[0].canonical_bytes(), fast.canonical_bytes());
    }
    let Ok(spec) = json::parse(text) else {
        assert!(standalone.is_err());
        return;
    };
    let resolved = json::resolve(&spec, &mut |p| {
        Err(Error::UnknownPrefix { prefix: p.text() })
    });
    assert_eq!(resolved.is_ok(), standalone.is_ok());
    let Ok(facts) = resolved else { return };
    assert!(!facts.is_empty());
    if let Some(claimed) = spec.claimed_hash {
        assert_eq!(facts.last().unwrap().hash(), claimed);
    }
    for fact in &facts {
        let back = Fact::from_canonical(fact.canonical_bytes()).expect("own bytes decode");
        assert_eq!(back.canonical_bytes(), fact.canonical_bytes());
        let text = serde_json::to_string(&json::to_json(fact)).unwrap();
        let again = json::parse_standalone(&text).expect("JSON form parses");
        assert_eq!(again.last().map(Fact::hash), Some(fact.hash()), "{text}");
        // Special forms and deep nesting it leaves to the general path; brackets bound
        // the depth from above.
        let brackets = text.bytes().filter(|b| matches!(b, b'[' | b'{')).count();
        if !text.contains("\"$") && brackets <= 32 {
            let fast = json::parse_fast(&text).expect("the fast path takes a plain JSON form");
            assert_eq!(fast.canonical_bytes(), fact.canonical_bytes(), "{text}");
        }
    }
});

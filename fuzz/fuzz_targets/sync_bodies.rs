//! Sync request bodies and headers, decoded the way the server decodes them
//! (`src/sync/server/routes.rs`): a push body (`application/cbor-seq`) split with
//! `wire::split_records`, each record decoded with `Fact::from_canonical`, the facts
//! inserted in a write transaction that is then rolled back; a fetch body
//! (`{"hashes": [...]}`) parsed as `wire::FetchRequest` with each hash parsed as a full
//! hash; and an `Authorization` header checked against a token list.
//!
//! The first input byte chooses the decoder. Properties: no panic; the store is unchanged
//! after each rolled-back push; a fetch hash that parses is 64 hex digits.

#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use precedent::sync::auth::{Access, Grant, Tokens};
use precedent::sync::wire::{FetchRequest, split_records};
use precedent::{Error, Fact, HashPrefix, Store};

thread_local! {
    static STORE: RefCell<Store> = RefCell::new(seeded_store());
    static TOKENS: Tokens = Tokens::new(vec![Grant {
        name: "writer".into(),
        token: "s3cret".into(),
        read: true,
        write: true,
        types: Some(vec!["Shop.Order".into()]),
        work: Default::default(),
        admin: false,
    }])
    .unwrap();
}

fn seeded_store() -> Store {
    let store = Store::open_in_memory().unwrap();
    let shop = Fact::builder("Shop")
        .field("name", "corner")
        .build()
        .unwrap();
    store.insert(&shop).unwrap();
    store
}

fn push(body: &[u8]) {
    let mut facts = Vec::new();
    for record in split_records(body).into_iter().flatten() {
        if let Ok(f) = Fact::from_canonical(record) {
            assert_eq!(f.canonical_bytes(), record);
            facts.push(f);
        }
    }
    if facts.is_empty() {
        return;
    }
    STORE.with(|cell| {
        let store = &mut *cell.borrow_mut();
        let before = store.count_and_max_seq().unwrap();
        let n = facts.len() as u64;
        let result: Result<(), Error> = store.write(|w| {
            let report = w.insert_batch(facts)?;
            assert!(report.inserted + report.duplicates + report.refused.len() as u64 <= n);
            Err(Error::InvalidFact {
                reason: "rolled back".into(),
            })
        });
        assert!(result.is_err());
        assert_eq!(
            store.count_and_max_seq().unwrap(),
            before,
            "rollback kept facts"
        );
    });
}

fn fetch(body: &[u8]) {
    let Ok(req) = serde_json::from_slice::<FetchRequest>(body) else {
        return;
    };
    for h in &req.hashes {
        if let Some(full) = HashPrefix::parse(h).ok().and_then(|p| p.full()) {
            assert_eq!(h.len(), 64);
            assert_eq!(full.to_string(), h.to_ascii_lowercase());
        }
    }
}

fn authorization(header: &[u8]) {
    TOKENS.with(|t| {
        let access = t.check(Some(header));
        if let Access::Granted(g) = access {
            assert_eq!(
                header, b"Bearer s3cret",
                "granted for {header:?} ({})",
                g.name
            );
        }
    });
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => push(rest),
        1 => fetch(rest),
        _ => authorization(rest),
    }
});

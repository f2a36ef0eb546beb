//! Sync's receiving sides decode and re-hash on several threads (`precedent::ingest`): a
//! push on the server and pulled pages on the client give the same stored sets, in the
//! same release order, and the same answers with one decoding thread and with several;
//! and a bad record in a large push still gets its error, with every valid record kept.

mod common;
mod sync_support;

use common::{assert_topological, fact};
use precedent::sync::client::{Client, ClientOptions, Direction, SyncOptions};
use precedent::{Fact, FactHash, Store};
use sync_support::*;

/// Every released fact in release order, and the held ones.
fn stored(store: &Store) -> (Vec<(i64, FactHash)>, u64) {
    let mut out = Vec::new();
    store
        .for_each_released(0, |seq, h, _| {
            out.push((seq, h));
            Ok(())
        })
        .unwrap();
    (out, store.held_count().unwrap())
}

/// A few thousand facts (several pieces of 1,000), children before parents in places: a
/// root, a tree below it, and each fourth fact of the tree moved ahead of the root.
fn workload(name: &str, n: usize) -> Vec<Fact> {
    let root = fact(name, -1, &[]);
    let mut facts = tree(name, &root, n);
    let early: Vec<Fact> = facts.iter().step_by(4).cloned().collect();
    facts.retain(|f| !early.iter().any(|e| e.hash() == f.hash()));
    let mut out = early;
    out.push(root);
    out.extend(facts);
    out
}

/// A CBOR sequence of `facts`.
fn body(facts: &[Fact]) -> Vec<u8> {
    facts
        .iter()
        .flat_map(|f| f.canonical_bytes().to_vec())
        .collect()
}

#[test]
fn pushes_and_pulls_store_the_same_with_one_and_several_decoding_threads() {
    let facts = workload("Push", 4_500);
    let pulled = workload("Pull", 3_700);
    let mut outcomes = Vec::new();
    for threads in [1, 2, 4] {
        // A push of one body of 4,500 records (with a duplicate and a bad record).
        let server_node = Node::new();
        server_node.store().insert_batch(pulled.clone()).unwrap();
        let server = server_node.serve_with(|c| c.decode_threads = threads);
        let mut pushed = body(&facts);
        pushed.extend_from_slice(facts[2_000].canonical_bytes());
        pushed.extend_from_slice(&[0x82, 0x01, 0x02]);
        let (status, answer) = http(&server, "POST", "/v1/facts", CBOR, &pushed, None);
        assert_eq!(status, 200, "{answer}");
        // A pull of every fact of the server in pages of 1,500 (two pieces each).
        let client_node = Node::new();
        let client = Client::new(
            &server.url(),
            ClientOptions {
                batch: 3_000,
                decode_threads: threads,
                ..ClientOptions::default()
            },
        )
        .unwrap();
        let pull = SyncOptions {
            direction: Direction::Pull,
            ..SyncOptions::default()
        };
        let report = client
            .sync(&client_node.store(), &pull, &mut |_| {})
            .unwrap();
        let (server_store, client_store) = (server_node.store(), client_node.store());
        assert_topological(&server_store);
        assert_topological(&client_store);
        assert_eq!(client_store.held_count().unwrap(), 0);
        assert_eq!(
            hashes(&server_store),
            hashes(&client_store),
            "{threads} threads"
        );
        outcomes.push((
            threads,
            answer,
            report,
            stored(&server_store),
            stored(&client_store),
            server_store.quarantine(10).unwrap().len(),
        ));
    }
    let (_, answer, report, server_set, client_set, quarantined) = &outcomes[0];
    // 4,501 facts, one of them again, and a bad record.
    assert_eq!(answer["received"], 4_503);
    assert_eq!(answer["duplicates"], 1);
    assert_eq!(answer["held"], 0);
    assert_eq!(answer["inserted"], 4_501);
    assert_eq!(answer["rejected"][0]["index"], 4_502);
    assert_eq!(*quarantined, 1);
    assert_eq!(report.pulled, 4_501 + 3_701);
    for (threads, a, r, s, c, q) in &outcomes[1..] {
        assert_eq!(a, answer, "push answer with {threads} threads");
        assert_eq!(r, report, "pull report with {threads} threads");
        assert_eq!(s, server_set, "server's stored set with {threads} threads");
        assert_eq!(c, client_set, "client's stored set with {threads} threads");
        assert_eq!(q, quarantined);
    }
}

#[test]
fn bad_records_in_a_large_push_get_their_errors_and_every_valid_record_is_kept() {
    let facts = workload("Mixed", 3_500);
    let bad_at = [10usize, 1_500, 2_999];
    let mut pushed = Vec::new();
    let mut index = Vec::new();
    for (i, f) in facts.iter().enumerate() {
        if bad_at.contains(&i) {
            index.push(i as u64);
            pushed.extend_from_slice(&[0x83, 0x01, 0x02, 0x03]); // an array, not a fact
        }
        pushed.extend_from_slice(f.canonical_bytes());
    }
    // Last, an integer head cut short: unframeable to the end.
    let mut answers = Vec::new();
    for threads in [1, 3] {
        let node = Node::new();
        let server = node.serve_with(|c| c.decode_threads = threads);
        let mut with_tail = pushed.clone();
        with_tail.push(0x1b);
        let (status, answer) = http(&server, "POST", "/v1/facts", CBOR, &with_tail, None);
        assert_eq!(status, 200, "{answer}");
        let rejected: Vec<u64> = answer["rejected"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["index"].as_u64().unwrap())
            .collect();
        // Each bad record's index counts the records before it, bad ones included.
        let expected: Vec<u64> = index
            .iter()
            .enumerate()
            .map(|(k, i)| i + k as u64)
            .chain([facts.len() as u64 + index.len() as u64])
            .collect();
        assert_eq!(rejected, expected, "{threads} threads");
        for r in answer["rejected"].as_array().unwrap() {
            assert!(!r["reason"].as_str().unwrap().is_empty(), "{r}");
        }
        assert_eq!(
            answer["received"],
            facts.len() as u64 + index.len() as u64 + 1
        );
        let s = node.store();
        assert_eq!(s.held_count().unwrap(), 0);
        assert_eq!(s.max_seq().unwrap(), facts.len() as i64);
        for f in &facts {
            assert!(s.get(&f.hash()).unwrap().is_some());
        }
        let q = s.quarantine(10).unwrap();
        assert_eq!(q.len(), 4);
        let arrays = q.iter().filter(|e| e.bytes == [0x83, 0x01, 0x02, 0x03]);
        assert_eq!(arrays.count(), 3);
        assert!(s.verify(|_| {}).unwrap().is_clean());
        answers.push((answer, stored(&s)));
    }
    assert_eq!(answers[0], answers[1]);
}

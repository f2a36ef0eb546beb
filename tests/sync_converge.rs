//! One `sync` converges both sides and sends only what the other side lacks (issue 16,
//! item 2): held facts on either side, a small store against a large server, no echo of
//! what was just pushed or pulled, a server with small limits, and a property test over
//! random splits of a DAG between two nodes. Servers run on 127.0.0.1.

mod common;
mod sync_support;

use std::collections::{BTreeSet, HashMap};

use common::{chain, fact};
use precedent::sync::client::{Client, ClientOptions, SyncOptions, SyncReport};
use precedent::{Fact, FactHash};
use proptest::prelude::*;
use sync_support::*;

fn sync_once(node: &Node, url: &str) -> SyncReport {
    Client::new(url, ClientOptions::default())
        .unwrap()
        .sync(&node.store(), &SyncOptions::default(), &mut |_| {})
        .unwrap()
}

fn size(facts: &[&Fact]) -> u64 {
    facts.iter().map(|f| f.canonical_bytes().len() as u64).sum()
}

/// The server holds a fact whose parent only the client has; the client holds one whose
/// parent only the server has. One sync releases both everywhere: before, the facts the
/// push released on the server came to the client only on a second sync.
#[test]
fn one_sync_releases_what_was_held_on_either_side() {
    let (server_node, client_node) = (Node::new(), Node::new());
    let shared = chain(5);
    let client_only = fact("Mine", 0, &[shared[4].hash()]);
    let held_on_server = fact("Theirs", 0, &[client_only.hash()]);
    let server_only = fact("Theirs", 1, &[shared[4].hash()]);
    let held_on_client = fact("Mine", 1, &[server_only.hash()]);
    let below_held = fact("Theirs", 2, &[held_on_server.hash()]);
    let s = server_node.store();
    s.insert_batch(shared.clone()).unwrap();
    s.insert_batch(vec![
        held_on_server.clone(),
        server_only.clone(),
        below_held.clone(),
    ])
    .unwrap();
    assert_eq!(s.held_count().unwrap(), 2);
    let c = client_node.store();
    c.insert_batch(shared.clone()).unwrap();
    c.insert_batch(vec![client_only.clone(), held_on_client.clone()])
        .unwrap();
    assert_eq!(c.held_count().unwrap(), 1);

    let server = server_node.serve();
    let first = sync_once(&client_node, &server.url());
    assert_converged(&[&server_node, &client_node]);
    // Pushed: the client's two own facts; pulled: the server's three and, this first
    // time, the shared history (nothing tells the server the client has it), none twice.
    assert_eq!(first.pushed, 2, "{first:?}");
    assert_eq!(
        first.bytes_pushed,
        size(&[&client_only, &held_on_client]),
        "{first:?}"
    );
    assert_eq!(
        first.bytes_pulled,
        size(&[&server_only, &held_on_server, &below_held])
            + size(&shared.iter().collect::<Vec<_>>()),
        "{first:?}"
    );
    let second = sync_once(&client_node, &server.url());
    assert_eq!((second.pulled, second.pushed), (0, 0), "{second:?}");
}

/// The first sync of a store of 1 fact against a server of 2,001: before, it pushed back
/// all 2,002 it then had, and the next sync pulled its own fact back.
#[test]
fn a_small_store_pushes_only_its_own_fact_to_a_large_server() {
    let (server_node, client_node) = (Node::new(), Node::new());
    server_node.store().insert_batch(chain(2001)).unwrap();
    let mine = fact("Mine", 0, &[]);
    client_node.store().insert(&mine).unwrap();
    let server = server_node.serve();
    let first = sync_once(&client_node, &server.url());
    assert_eq!((first.pulled, first.pushed), (2001, 1), "{first:?}");
    assert_eq!(first.bytes_pushed, size(&[&mine]));
    assert_converged(&[&server_node, &client_node]);
    for _ in 0..2 {
        let again = sync_once(&client_node, &server.url());
        assert_eq!((again.pulled, again.pushed), (0, 0), "{again:?}");
    }
}

/// What a sync pushed is not pulled back by the next one, and what another node pushed
/// meanwhile still is.
#[test]
fn a_push_is_not_pulled_back() {
    let (server_node, a, b) = (Node::new(), Node::new(), Node::new());
    a.store().insert_batch(chain(300)).unwrap();
    let server = server_node.serve();
    let first = sync_once(&a, &server.url());
    assert_eq!((first.pulled, first.pushed), (0, 300), "{first:?}");
    let root = fact("B", 0, &[]);
    let mut theirs = vec![root.clone()];
    theirs.extend(tree("B", &root, 40));
    b.store().insert_batch(theirs).unwrap();
    let from_b = sync_once(&b, &server.url());
    assert_eq!((from_b.pulled, from_b.pushed), (300, 41), "{from_b:?}");
    let second = sync_once(&a, &server.url());
    assert_eq!((second.pulled, second.pushed), (41, 0), "{second:?}");
    assert_converged(&[&server_node, &a, &b]);
}

/// A server with `--max-facts-per-request 50` (pages, pushes and fetches of at most 50):
/// the client fits its batch to the limit the server reports.
#[test]
fn sync_fits_its_requests_to_the_servers_limits() {
    let (server_node, client_node) = (Node::new(), Node::new());
    server_node.store().insert_batch(chain(260)).unwrap();
    let root = fact("Mine", 0, &[]);
    let mut mine = vec![root.clone()];
    mine.extend(tree("Mine", &root, 170));
    client_node.store().insert_batch(mine).unwrap();
    let server = server_node.serve_with(|c| c.limits.max_facts_per_request = 50);
    let r = sync_once(&client_node, &server.url());
    assert_eq!((r.pulled, r.pushed), (260, 171), "{r:?}");
    assert_converged(&[&server_node, &client_node]);
}

/// A random DAG and, for each fact, which of the two nodes has it: the server, the client,
/// or both. A node that has a fact without one of its parents holds it.
fn split(seed: u64) -> (Vec<Fact>, Vec<u8>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let n = rng.usize(1..40);
    let mut facts: Vec<Fact> = Vec::with_capacity(n);
    for i in 0..n {
        let mut preds = BTreeSet::new();
        if i > 0 {
            for _ in 0..rng.usize(0..3) {
                preds.insert(facts[rng.usize(0..i)].hash());
            }
        }
        let preds: Vec<FactHash> = preds.into_iter().collect();
        facts.push(fact("Node", i as i64, &preds));
    }
    // 1: server, 2: client, 3: both.
    let owners = (0..n).map(|_| rng.u8(1..4)).collect();
    (facts, owners)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// After one sync both nodes hold the same released set, nothing held, `verify`
    /// clean; the client pushed only facts the server did not have released, each once;
    /// it pulled each of the server's facts at most once, plus at most once more a fact
    /// held on the server that it fetched and the push then released there; and the next
    /// sync moves nothing.
    #[test]
    fn one_sync_converges_any_split_and_sends_only_what_is_missing(seed in any::<u64>()) {
        let (facts, owners) = split(seed);
        let (server_node, client_node) = (Node::new(), Node::new());
        let on = |bit: u8| -> Vec<Fact> {
            facts.iter().zip(&owners).filter(|(_, o)| *o & bit != 0).map(|(f, _)| f.clone()).collect()
        };
        let (on_server, on_client) = (on(1), on(2));
        let (s, c) = (server_node.store(), client_node.store());
        // Given children first, so nothing in a node's own batch decides what is held.
        s.insert_batch(on_server.iter().rev().cloned().collect()).unwrap();
        c.insert_batch(on_client.iter().rev().cloned().collect()).unwrap();
        let released = |node: &Node| -> BTreeSet<FactHash> { hashes(&node.store()) };
        let (server_released, client_released) = (released(&server_node), released(&client_node));
        let server_has: BTreeSet<FactHash> = on_server.iter().map(Fact::hash).collect();
        let by_hash: HashMap<FactHash, &Fact> = facts.iter().map(|f| (f.hash(), f)).collect();
        let bytes_of = |set: &mut dyn Iterator<Item = &FactHash>| -> u64 {
            set.map(|h| by_hash[h].canonical_bytes().len() as u64).sum()
        };
        let lacked_by_server = bytes_of(&mut on_client.iter().map(Fact::hash).collect::<Vec<_>>().iter()
            .filter(|h| !server_released.contains(h)));
        let on_server_bytes = bytes_of(&mut server_has.iter());
        let held_on_server = bytes_of(&mut server_has.iter()
            .filter(|h| !server_released.contains(h) && !client_released.contains(h)));

        let server = server_node.serve();
        let report = sync_once(&client_node, &server.url());
        assert_converged(&[&server_node, &client_node]);
        prop_assert_eq!(hashes(&client_node.store()).len(), facts.len());
        prop_assert!(report.bytes_pushed * 10 <= lacked_by_server * 11, "{:?}, lacked {}", report, lacked_by_server);
        prop_assert!(
            report.bytes_pulled <= on_server_bytes + held_on_server,
            "{:?}, on the server {} held there {}", report, on_server_bytes, held_on_server
        );
        let again = sync_once(&client_node, &server.url());
        prop_assert_eq!((again.pulled, again.pushed, again.fetched), (0, 0, 0), "{:?}", again);
    }
}

/// A long poll asking for more than the request timeout allows is cut below it: the
/// answer is an empty page, not 408.
#[test]
fn a_long_poll_answers_before_the_request_timeout() {
    let node = Node::new();
    let server = node.serve_with(|c| c.limits.request_timeout = std::time::Duration::from_secs(2));
    let (status, body) = raw_http(
        server.addr(),
        "GET",
        "/v1/facts?wait_ms=30000",
        "",
        b"",
        None,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(body.is_empty());
}

/// A waiting pull is woken by a commit through the server, as `--poll-interval` says, not
/// at its next look a poll interval later: with an interval of a minute, a fact pushed
/// while a pull waits is in that pull's answer at once.
#[test]
fn a_waiting_pull_is_woken_by_a_push() {
    let node = Node::new();
    let server = node.serve_with(|c| {
        c.poll_interval = std::time::Duration::from_secs(60);
        c.limits.request_timeout = std::time::Duration::from_secs(120);
    });
    let started = std::time::Instant::now();
    let (status, body) = std::thread::scope(|s| {
        let pull = s.spawn(|| {
            raw_http(
                server.addr(),
                "GET",
                "/v1/facts?wait_ms=90000",
                "",
                b"",
                None,
            )
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        let shop = fact("Shop", 1, &[]).canonical_bytes().to_vec();
        assert_eq!(http(&server, "POST", "/v1/facts", CBOR, &shop, None).0, 200);
        pull.join().unwrap()
    });
    assert_eq!(status, 200);
    assert!(!body.is_empty(), "the pushed fact");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "answered after {:?}, at the poll interval, not at the push",
        started.elapsed()
    );
}

/// `/v1/health` (no token) and `/v1/info` report the server's limits; `info` also the
/// database's identity.
#[test]
fn health_and_info_report_the_limits_and_the_store() {
    let node = Node::new();
    let server = node.serve_with(|c| {
        c.limits.max_facts_per_request = 50;
        c.limits.request_timeout = std::time::Duration::from_secs(10);
    });
    let client = Client::new(&server.url(), ClientOptions::default()).unwrap();
    let health = client.health().unwrap();
    let limits = health.limits.unwrap();
    assert_eq!(limits.max_facts_per_request, 50);
    assert_eq!(
        (limits.request_timeout_ms, limits.max_wait_ms),
        (10_000, 9_000)
    );
    assert_eq!(limits.max_roots, 1024);
    let info = client.info().unwrap();
    assert_eq!(info.limits, Some(limits));
    assert_eq!(info.store, Some(node.store().store_id().unwrap()));
}

/// A push that cannot get its share of the server's push memory within half the request
/// timeout is answered 503 `busy` with `Retry-After`, and stores nothing; the push that
/// held the memory is not disturbed by it.
#[test]
fn a_push_over_the_memory_budget_waits_then_gets_503() {
    use std::io::{Read, Write};
    let node = Node::new();
    let server = node.serve_with(|c| c.limits.request_timeout = std::time::Duration::from_secs(2));
    // Announce a body of the whole budget (64 MiB) and send none of it: its push holds
    // the budget until its request times out.
    let mut hog = std::net::TcpStream::connect(server.addr()).unwrap();
    write!(
        hog,
        "POST /v1/facts HTTP/1.1\r\nhost: x\r\ncontent-type: {CBOR}\r\ncontent-length: {}\r\n\r\n",
        64 << 20
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let f = fact("A", 1, &[]);
    let mut s = std::net::TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let body = f.canonical_bytes();
    write!(
        s,
        "POST /v1/facts HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: {CBOR}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(answer.contains("\"busy\""), "{answer}");
    assert_eq!(node.store().count_and_max_seq().unwrap().0, 0);
    drop(hog);
    // Once the budget is free, the same push is stored.
    let (status, _) = raw_http(server.addr(), "POST", "/v1/facts", CBOR, body, None);
    assert_eq!(status, 200);
}

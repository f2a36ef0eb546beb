//! Sync between nodes on 127.0.0.1: convergence with two and three nodes, scoped sync,
//! poison at the door, tokens, limits, TLS, a fault-injecting proxy, follow mode, and
//! random topologies. Every convergence test ends with the same fact set everywhere,
//! nothing held, `verify` clean and release order topological.

mod common;
mod sync_support;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{assert_topological, chain, fact};
use precedent::sync::auth::{Grant, Tokens};
use precedent::sync::client::{Client, ClientOptions, Direction, SyncOptions};
use precedent::sync::server::Limits;
use precedent::{Error, FactHash, Store};
use sync_support::*;

conformance_sync! {
    fn two_nodes_converge_both_ways(server: Backend, client: Backend) {
        let a = Node::on(server);
        let b = Node::on(client);
        let shared = chain(50);
        let sa = a.store();
        sa.insert_batch(shared.clone()).unwrap();
        sa.insert_batch(tree("A", &shared[49], 300)).unwrap();
        let sb = b.store();
        sb.insert_batch(shared[..20].to_vec()).unwrap();
        sb.insert_batch(tree("B", &shared[10], 200)).unwrap();
        let server = a.serve();
        let client = Client::new(&server.url(), ClientOptions::default()).unwrap();
        let report = client
            .sync(&sb, &SyncOptions::default(), &mut |_| {})
            .unwrap();
        assert_eq!(report.held, 0);
        assert!(report.pushed >= 200, "{report:?}");
        assert_converged(&[&a, &b]);
        // The facts B pushed come back once as duplicates (A released them after B's pull
        // bookmark); after that a sync moves nothing.
        let again = client
            .sync(&sb, &SyncOptions::default(), &mut |_| {})
            .unwrap();
        assert_eq!((again.inserted, again.pushed), (0, 0), "{again:?}");
        assert!(again.pulled <= report.pushed, "{again:?}");
        let third = client
            .sync(&sb, &SyncOptions::default(), &mut |_| {})
            .unwrap();
        assert_eq!((third.pulled, third.pushed), (0, 0), "{third:?}");
        let peer = sb.peer(&server.url()).unwrap().unwrap();
        assert_eq!(peer.lag(), 0);
        assert!(peer.last_sync_ms.is_some() && peer.last_error.is_none());
    }
}

conformance_sync! {
    /// The database behind a URL is replaced by another (a server reset, or another server on
    /// the same port): the client notices by the store identity the server reports, its
    /// bookmarks start again from 0, and both sides end with everything. Without the identity
    /// the stale bookmarks would skip the new database's first facts and never push again.
    fn a_replaced_database_behind_the_same_url_is_synced_from_the_start(server: Backend, client: Backend) {
        let (old, new, client_node) = (Node::on(server), Node::on(server), Node::on(client));
        old.store().insert_batch(chain(40)).unwrap();
        let root = fact("Mine", 0, &[]);
        let mut mine = vec![root.clone()];
        mine.extend(tree("Mine", &root, 30));
        client_node.store().insert_batch(mine).unwrap();
        let fresh = fact("Fresh", 0, &[]);
        let mut theirs = vec![fresh.clone()];
        theirs.extend(tree("Fresh", &fresh, 10));
        new.store().insert_batch(theirs).unwrap();

        let server = old.serve();
        let (url, addr) = (server.url(), server.addr());
        let client = Client::new(&url, ClientOptions::default()).unwrap();
        let cs = client_node.store();
        let first = client
            .sync(&cs, &SyncOptions::default(), &mut |_| {})
            .unwrap();
        assert!(!first.replaced);
        assert_converged(&[&old, &client_node]);
        let before = cs.peer(&url).unwrap().unwrap();
        assert!(
            before.pull_after > 11 && before.push_after > 0,
            "{before:?}"
        );
        server.stop().unwrap();

        // The new database, served at the same address.
        let server = new.serve_with(|c| c.listen = addr);
        assert_eq!(server.url(), url);
        let second = client
            .sync(&cs, &SyncOptions::default(), &mut |_| {})
            .unwrap();
        assert!(second.replaced, "{second:?}");
        assert_eq!(second.inserted, 11, "{second:?}");
        assert_converged(&[&new, &client_node]);
        // And from then on the bookmarks are those of the new database.
        let third = client
            .sync(&cs, &SyncOptions::default(), &mut |_| {})
            .unwrap();
        assert!(!third.replaced);
        assert_eq!((third.inserted, third.pushed), (0, 0), "{third:?}");
    }
}

conformance_sync! {
    /// Push alone notices a replaced database too: the first answer's identity differs, the
    /// push bookmark goes back to 0, and everything is pushed to the new database.
    fn a_push_to_a_replaced_database_pushes_everything_again(server: Backend, client: Backend) {
        let (old, new, client_node) = (Node::on(server), Node::on(server), Node::on(client));
        let cs = client_node.store();
        cs.insert_batch(chain(25)).unwrap();
        let server = old.serve();
        let (url, addr) = (server.url(), server.addr());
        let client = Client::new(&url, ClientOptions::default()).unwrap();
        let push = SyncOptions {
            direction: Direction::Push,
            ..SyncOptions::default()
        };
        assert_eq!(client.sync(&cs, &push, &mut |_| {}).unwrap().pushed, 25);
        cs.insert_batch(vec![fact("Later", 1, &[])]).unwrap();
        server.stop().unwrap();
        let server = new.serve_with(|c| c.listen = addr);
        assert_eq!(server.url(), url);
        let r = client.sync(&cs, &push, &mut |_| {}).unwrap();
        assert!(r.replaced, "{r:?}");
        assert_converged(&[&new, &client_node]);
    }
}

conformance_sync! {
    fn three_nodes_in_a_line_converge(server: Backend, client: Backend) {
        let nodes = [Node::on(client), Node::on(server), Node::on(client)];
        for (i, n) in nodes.iter().enumerate() {
            let root = fact("Root", i as i64, &[]);
            let s = n.store();
            s.insert(&root).unwrap();
            s.insert_batch(tree(&format!("N{i}"), &root, 150)).unwrap();
        }
        let servers: Vec<_> = nodes.iter().map(|n| n.serve()).collect();
        // 0 <-> 1 <-> 2, twice round so facts from 2 reach 0 and back.
        for _ in 0..2 {
            sync_pair(&nodes[0], &servers[1].url());
            sync_pair(&nodes[2], &servers[1].url());
        }
        let refs: Vec<&Node> = nodes.iter().collect();
        assert_converged(&refs);
    }
}

conformance_sync! {
    fn pull_and_push_only_move_one_way(server: Backend, client: Backend) {
        let a = Node::on(server);
        let b = Node::on(client);
        a.store().insert_batch(chain(30)).unwrap();
        let mine = fact("Mine", 1, &[]);
        b.store().insert(&mine).unwrap();
        let server = a.serve();
        let client = Client::new(&server.url(), ClientOptions::default()).unwrap();
        let pull = SyncOptions {
            direction: Direction::Pull,
            ..SyncOptions::default()
        };
        client.sync(&b.store(), &pull, &mut |_| {}).unwrap();
        assert!(a.store().get(&mine.hash()).unwrap().is_none());
        assert_eq!(hashes(&b.store()).len(), 31);
        let push = SyncOptions {
            direction: Direction::Push,
            ..SyncOptions::default()
        };
        client.sync(&b.store(), &push, &mut |_| {}).unwrap();
        assert!(a.store().get(&mine.hash()).unwrap().is_some());
    }
}

conformance_sync! {
    /// A node whose held facts wait for more hashes than one fetch asks for, the lowest of
    /// them hashes no one has, still gets an ancestor the server has: the fetch pages
    /// through every absent hash instead of asking for the lowest page again.
    fn a_fetch_reaches_past_a_page_of_hashes_no_one_has(server: Backend, client: Backend) {
        let a = Node::on(server);
        let world = fact("World", 0, &[]);
        let shop = fact("Shop", 1, &[world.hash()]);
        let other = fact("Other", 3, &[]);
        let sa = a.store();
        sa.insert_batch(vec![world.clone(), shop.clone(), other.clone()])
            .unwrap();
        let server = a.serve();
        let c = Node::on(client);
        let sc = c.store();
        let client = Client::new(&server.url(), ClientOptions::default()).unwrap();
        let scoped = SyncOptions {
            direction: Direction::Pull,
            roots: vec![shop.hash()],
        };
        client.sync(&sc, &scoped, &mut |_| {}).unwrap();
        // 1,000 held facts (a fetch's page) waiting for hashes below any real one.
        let orphans: Vec<precedent::Fact> = (0..1000u16)
            .map(|i| {
                let mut low = [0u8; 32];
                low[2..4].copy_from_slice(&i.to_be_bytes());
                fact("Orphan", i64::from(i), &[FactHash(low)])
            })
            .collect();
        assert_eq!(sc.insert_batch(orphans).unwrap().held, 1000);
        // A fact below the root that names one outside the scope: it arrives held, and
        // its ancestor, the one absent hash the server has, sorts after the 1,000.
        let join = fact("Join", 9, &[shop.hash(), other.hash()]);
        sa.insert(&join).unwrap();
        let r = client.sync(&sc, &scoped, &mut |_| {}).unwrap();
        assert!(r.fetched >= 1, "{r:?}");
        assert!(sc.get(&other.hash()).unwrap().is_some(), "{r:?}");
        assert!(sc.get(&join.hash()).unwrap().is_some());
        assert_eq!(sc.held_count().unwrap(), 1000);
    }
}

conformance_sync! {
    fn scoped_sync_takes_the_slice_below_its_roots_and_their_ancestors(server: Backend, client: Backend) {
        let a = Node::on(server);
        let world = fact("World", 0, &[]);
        let shop1 = fact("Shop", 1, &[world.hash()]);
        let shop2 = fact("Shop", 2, &[world.hash()]);
        let other = fact("Other", 3, &[]);
        let sa = a.store();
        sa.insert_batch(vec![
            world.clone(),
            shop1.clone(),
            shop2.clone(),
            other.clone(),
        ])
        .unwrap();
        sa.insert_batch(tree("S1", &shop1, 100)).unwrap();
        sa.insert_batch(tree("S2", &shop2, 100)).unwrap();
        let server = a.serve();
        let c = Node::on(client);
        let sc = c.store();
        let client = Client::new(
            &server.url(),
            ClientOptions {
                batch: 17,
                ..ClientOptions::default()
            },
        )
        .unwrap();
        let scoped = SyncOptions {
            direction: Direction::Pull,
            roots: vec![shop1.hash()],
        };
        client.sync(&sc, &scoped, &mut |_| {}).unwrap();
        let want: BTreeSet<FactHash> = std::iter::once(shop1.hash())
            .chain(std::iter::once(world.hash()))
            .chain(sa.descendants(&shop1.hash()).unwrap())
            .collect();
        assert_eq!(hashes(&sc), want);
        // A new fact below the root that also names a fact outside the scope: it arrives
        // held, and its missing ancestor is fetched.
        let join = fact("Join", 9, &[shop1.hash(), other.hash()]);
        sa.insert(&join).unwrap();
        let r = client.sync(&sc, &scoped, &mut |_| {}).unwrap();
        assert!(r.fetched >= 1, "{r:?}");
        assert!(sc.get(&join.hash()).unwrap().is_some());
        assert!(sc.get(&other.hash()).unwrap().is_some());
        assert!(sc.get(&shop2.hash()).unwrap().is_none());
        assert_eq!(sc.held_count().unwrap(), 0);
        assert!(sc.verify(|_| {}).unwrap().is_clean());
        assert_topological(&sc);
    }
}

conformance! {
    fn pushed_poison_is_quarantined_and_the_rest_stored(b: Backend) {
        let a = Node::on(b);
        let server = a.serve();
        let good = fact("Good", 1, &[]);
        let child = fact("Good", 2, &[good.hash()]);
        let mut body = child.canonical_bytes().to_vec();
        body.extend_from_slice(&[0x83, 0x01, 0x02, 0x03]); // an array, not a fact
        body.extend_from_slice(good.canonical_bytes());
        body.extend_from_slice(&[0x1b]); // an integer head cut short: unframeable to the end
        let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &body, None);
        assert_eq!(status, 200, "{json}");
        assert_eq!(json["received"], 4);
        assert_eq!(json["inserted"], 2);
        let rejected: Vec<u64> = json["rejected"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["index"].as_u64().unwrap())
            .collect();
        assert_eq!(rejected, vec![1, 3]);
        let s = a.store();
        assert!(s.get(&child.hash()).unwrap().is_some());
        let q = s.quarantine(10).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q[1].bytes, vec![0x83, 0x01, 0x02, 0x03]);
        assert_eq!(q[1].peer, "anonymous");
        assert!(s.verify(|_| {}).unwrap().is_clean());
        let metrics = get_text(&server, "/metrics", None);
        assert!(
            metrics.contains("precedent_sync_rejects_total 2"),
            "{metrics}"
        );
        assert!(metrics.contains("precedent_quarantined 2"), "{metrics}");
        // SQLite's own memory: a served SQLite store has its page cache in use.
        let sqlite: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("precedent_sqlite_memory_bytes "))
            .and_then(|v| v.parse().ok())
            .expect("precedent_sqlite_memory_bytes");
        if b == crate::common::backend::Backend::Sqlite {
            assert!(sqlite > 0, "{metrics}");
        }
    }
}

conformance! {
    fn pulled_poison_is_quarantined_and_the_page_still_committed(backend: Backend) {
        let good = fact("Good", 1, &[]);
        let mut body = good.canonical_bytes().to_vec();
        body.extend_from_slice(&[0x82, 0x01, 0x02]);
        let fake = FakeServer::start(move |_req| {
            let mut r = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/cbor-seq\r\nprecedent-through: 2\r\n\
                 precedent-count: 2\r\nprecedent-max-seq: 2\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            r.extend_from_slice(&body);
            r
        });
        let b = Node::on(backend);
        let sb = b.store();
        let client = Client::new(&fake.url(), ClientOptions::default()).unwrap();
        let pull = SyncOptions {
            direction: Direction::Pull,
            ..SyncOptions::default()
        };
        let r = client.sync(&sb, &pull, &mut |_| {}).unwrap();
        assert_eq!(r.quarantined, 1);
        assert!(sb.get(&good.hash()).unwrap().is_some());
        assert_eq!(sb.quarantine(10).unwrap()[0].peer, fake.url());
        assert_eq!(sb.peer(&fake.url()).unwrap().unwrap().pull_after, 2);
    }
}

conformance! {
    fn a_short_pull_stream_is_an_error_and_moves_no_bookmark(backend: Backend) {
        let good = fact("Good", 1, &[]);
        let body = good.canonical_bytes().to_vec();
        let fake = FakeServer::start(move |req| {
            // Announces three records (at most the `limit` asked for), sends one fewer,
            // then closes cleanly: a page cut short, asked for again smaller, down to one.
            let limit = req
                .split(['?', '&', ' '])
                .find_map(|p| p.strip_prefix("limit=")?.parse().ok())
                .unwrap_or(3usize);
            let n = limit.min(3);
            let mut r = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/cbor-seq\r\nprecedent-through: {n}\r\n\
                 precedent-count: {n}\r\nprecedent-max-seq: 3\r\nconnection: close\r\n\r\n"
            )
            .into_bytes();
            if n > 1 {
                r.extend_from_slice(&body);
            }
            r
        });
        let b = Node::on(backend);
        let sb = b.store();
        let client = Client::new(&fake.url(), ClientOptions::default()).unwrap();
        let err = client
            .sync(&sb, &SyncOptions::default(), &mut |_| {})
            .unwrap_err();
        assert!(matches!(err, Error::Transport { .. }), "{err}");
        let peer = sb.peer(&fake.url()).unwrap().unwrap();
        assert_eq!(peer.pull_after, 0);
        assert!(peer.last_error.is_some());
        assert_eq!(sb.max_seq().unwrap(), 0);
    }
}

conformance! {
    fn a_fetched_fact_that_was_not_asked_for_is_quarantined(backend: Backend) {
        let held = fact("Child", 1, &[FactHash([7; 32])]);
        let stranger = fact("Stranger", 2, &[]);
        let bytes = stranger.canonical_bytes().to_vec();
        let held_bytes = held.canonical_bytes().to_vec();
        let fake = FakeServer::start(move |req| {
            let (ctype, body, extra) = if req.starts_with("POST /v1/fetch") {
                (
                    "application/cbor-seq",
                    bytes.clone(),
                    "precedent-count: 1\r\n",
                )
            } else {
                (
                    "application/cbor-seq",
                    held_bytes.clone(),
                    "precedent-through: 1\r\nprecedent-count: 1\r\nprecedent-max-seq: 1\r\n",
                )
            };
            let mut r = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            r.extend_from_slice(&body);
            r
        });
        let b = Node::on(backend);
        let sb = b.store();
        let client = Client::new(&fake.url(), ClientOptions::default()).unwrap();
        let pull = SyncOptions {
            direction: Direction::Pull,
            ..SyncOptions::default()
        };
        let r = client.sync(&sb, &pull, &mut |_| {}).unwrap();
        assert_eq!(r.quarantined, 1, "{r:?}");
        assert!(sb.lookup(&stranger.hash()).unwrap().is_none());
        assert_eq!(sb.held_count().unwrap(), 1);
    }
}

conformance_sync! {
    fn tokens_decide_who_reads_and_writes_and_refusals_store_nothing(server: Backend, client: Backend) {
        let a = Node::on(server);
        let server = a.serve_with(|c| c.tokens = tokens());
        let shop = fact("Shop", 1, &[]);
        let order = fact("Order", 2, &[shop.hash()]);
        let body = [shop.canonical_bytes(), order.canonical_bytes()].concat();
        // No token, a wrong token: 401, with WWW-Authenticate.
        for token in [None, Some("nope")] {
            for (m, p, ct, b) in [
                ("GET", "/v1/facts", "", &b""[..]),
                ("POST", "/v1/facts", CBOR, &body[..]),
                ("GET", "/v1/info", "", &b""[..]),
                ("GET", "/metrics", "", &b""[..]),
                ("POST", "/v1/fetch", JSON_CT, &b"{\"hashes\":[]}"[..]),
            ] {
                let (status, json) = http(&server, m, p, ct, b, token);
                assert_eq!(status, 401, "{m} {p}: {json}");
                assert_eq!(json["error"], "unauthorized");
            }
        }
        // Health needs no token.
        assert_eq!(http(&server, "GET", "/v1/health", "", b"", None).0, 200);
        // A read-only token may pull but not push.
        assert_eq!(
            http(&server, "GET", "/v1/facts", "", b"", Some("r-secret")).0,
            200
        );
        let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &body, Some("r-secret"));
        assert_eq!((status, json["error"].as_str()), (403, Some("forbidden")));
        // A write-only token may not pull.
        let (status, _) = http(&server, "GET", "/v1/facts", "", b"", Some("s-secret"));
        assert_eq!(status, 403);
        // A token limited to Shop may not push an Order: 403 and nothing of the batch stored.
        let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &body, Some("s-secret"));
        assert_eq!(
            (status, json["error"].as_str()),
            (403, Some("forbidden_type"))
        );
        assert_eq!(a.store().max_seq().unwrap(), 0);
        // ... but may push a Shop.
        let (status, _) = http(
            &server,
            "POST",
            "/v1/facts",
            CBOR,
            shop.canonical_bytes(),
            Some("s-secret"),
        );
        assert_eq!(status, 200);
        // The client library carries the token.
        let b = Node::on(client);
        b.store().insert(&order).unwrap();
        let client = Client::new(
            &server.url(),
            ClientOptions {
                token: Some("w-secret".into()),
                ..ClientOptions::default()
            },
        )
        .unwrap();
        client
            .sync(&b.store(), &SyncOptions::default(), &mut |_| {})
            .unwrap();
        assert_converged(&[&a, &b]);
        let anonymous = Client::new(&server.url(), ClientOptions::default()).unwrap();
        let err = anonymous
            .sync(&b.store(), &SyncOptions::default(), &mut |_| {})
            .unwrap_err();
        assert!(matches!(err, Error::Remote { status: 401, .. }), "{err}");
        assert!(
            b.store()
                .peer(&server.url())
                .unwrap()
                .unwrap()
                .last_error
                .is_some()
        );
    }
}

conformance_sync! {
    /// A token limited to some types may send back facts of other types the server has
    /// already (a node pushes what it pulled, when a pull committed and the push did not
    /// follow): a duplicate writes nothing, so only a new fact of such a type is refused.
    fn a_type_limited_token_may_send_back_facts_the_server_has(server: Backend, client: Backend) {
        let a = Node::on(server);
        let server = a.serve_with(|c| {
            c.tokens = Tokens::new(vec![Grant {
                name: "till".into(),
                token: "t-secret".into(),
                read: true,
                write: true,
                types: Some(vec!["Order".into()]),
                work: Default::default(),
                admin: false,
            }])
            .unwrap()
        });
        let shop = fact("Shop", 1, &[]);
        a.store().insert(&shop).unwrap();
        let b = Node::on(client);
        let till = Client::new(
            &server.url(),
            ClientOptions {
                token: Some("t-secret".into()),
                ..ClientOptions::default()
            },
        )
        .unwrap();
        till.sync(&b.store(), &SyncOptions::default(), &mut |_| {}).unwrap();
        // The till writes an order; the server gets a note; the till pulls the note alone,
        // so its push bookmark stays before both.
        let order = fact("Order", 2, &[shop.hash()]);
        b.store().insert(&order).unwrap();
        let note = fact("Note", 3, &[shop.hash()]);
        a.store().insert(&note).unwrap();
        let pull = SyncOptions {
            direction: Direction::Pull,
            ..SyncOptions::default()
        };
        till.sync(&b.store(), &pull, &mut |_| {}).unwrap();
        // The next sync pushes the order and the note back: the order is stored.
        till.sync(&b.store(), &SyncOptions::default(), &mut |_| {})
            .unwrap();
        assert!(a.store().get(&order.hash()).unwrap().is_some());
        assert_converged(&[&a, &b]);
        // By hand: a known Shop with a new Order is stored, the Shop counted a duplicate;
        // a new Shop is refused and nothing of its body stored.
        let order2 = fact("Order", 4, &[shop.hash()]);
        let body = [shop.canonical_bytes(), order2.canonical_bytes()].concat();
        let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &body, Some("t-secret"));
        assert_eq!(status, 200, "{json}");
        assert_eq!((json["inserted"].as_u64(), json["duplicates"].as_u64()), (Some(1), Some(1)), "{json}");
        let shop2 = fact("Shop", 5, &[]);
        let order3 = fact("Order", 6, &[shop.hash()]);
        let body = [order3.canonical_bytes(), shop2.canonical_bytes()].concat();
        let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &body, Some("t-secret"));
        assert_eq!((status, json["error"].as_str()), (403, Some("forbidden_type")), "{json}");
        assert!(a.store().lookup(&order3.hash()).unwrap().is_none());
        assert!(a.store().lookup(&shop2.hash()).unwrap().is_none());
    }
}

/// Clients that ask for a large page and stop reading do not keep the server's store
/// threads: a streamed answer waits at most the request timeout for its reader, then
/// gives the thread (and its store read) back, so the server goes on answering.
#[test]
fn readers_that_stop_reading_give_back_the_store_threads() {
    let a = Node::on(common::backend::Backend::Sqlite);
    // 20,000 facts of about 1 KiB: a page far past the channel and the socket buffers.
    let pad = "x".repeat(1024);
    let facts: Vec<precedent::Fact> = (0..20_000)
        .map(|i| {
            precedent::Fact::builder("Big")
                .field("i", i)
                .field("pad", pad.as_str())
                .build()
                .unwrap()
        })
        .collect();
    a.store().insert_batch(facts).unwrap();
    let server = a.serve_with(|c| {
        c.store_threads = 2;
        c.limits.request_timeout = Duration::from_secs(2);
    });
    let stalled: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(server.addr()).unwrap();
            s.write_all(b"GET /v1/facts?after=0&limit=20000 HTTP/1.1\r\nhost: x\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // A bound against hanging: the threads come back about 2 s after they stalled.
    let answered = (0..8).any(|_| {
        let ok = http(&server, "GET", "/v1/info", "", b"", None).0 == 200;
        if !ok {
            std::thread::sleep(Duration::from_millis(500));
        }
        ok
    });
    assert!(
        answered,
        "the server's store threads stayed with readers that stopped"
    );
    drop(stalled);
}

conformance! {
    fn limits_answer_with_clear_errors_and_store_nothing(b: Backend) {
        let a = Node::on(b);
        let server = a.serve_with(|c| {
            c.limits = Limits {
                max_body_bytes: 4096,
                max_facts_per_request: 10,
                max_held_per_peer: 3,
                ..Limits::default()
            }
        });
        // Body over the byte limit.
        let big: Vec<u8> = chain(400)
            .iter()
            .flat_map(|f| f.canonical_bytes().to_vec())
            .collect();
        assert!(big.len() > 4096);
        let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &big, None);
        assert_eq!(
            (status, json["error"].as_str()),
            (413, Some("body_too_large"))
        );
        // Too many records.
        let eleven: Vec<u8> = (0..11)
            .flat_map(|i| fact("F", i, &[]).canonical_bytes().to_vec())
            .collect();
        assert!(eleven.len() <= 4096);
        let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &eleven, None);
        assert_eq!(
            (status, json["error"].as_str()),
            (413, Some("too_many_facts"))
        );
        // Too many held for one peer: the whole push is refused.
        let orphans: Vec<u8> = (0..4)
            .flat_map(|i| {
                fact("Orphan", i, &[FactHash([9; 32])])
                    .canonical_bytes()
                    .to_vec()
            })
            .collect();
        let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &orphans, None);
        assert_eq!((status, json["error"].as_str()), (429, Some("held_limit")));
        let three: Vec<u8> = (0..3)
            .flat_map(|i| {
                fact("Orphan", i, &[FactHash([9; 32])])
                    .canonical_bytes()
                    .to_vec()
            })
            .collect();
        let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &three, None);
        assert_eq!(status, 200, "{json}");
        assert_eq!(json["missing"][0], FactHash([9; 32]).to_string());
        // Too many hashes in a fetch; a page larger than allowed.
        let hashes: Vec<String> = (0..11).map(|i| FactHash([i; 32]).to_string()).collect();
        let req = serde_json::json!({ "hashes": hashes }).to_string();
        let (status, json) = http(&server, "POST", "/v1/fetch", JSON_CT, req.as_bytes(), None);
        assert_eq!(
            (status, json["error"].as_str()),
            (413, Some("too_many_facts"))
        );
        let (status, _) = http(&server, "GET", "/v1/facts?limit=11", "", b"", None);
        assert_eq!(status, 400);
        let s = a.store();
        assert_eq!(s.max_seq().unwrap(), 0);
        assert_eq!(s.held_count().unwrap(), 3);
        assert_eq!(s.quarantine_count().unwrap(), 0);
    }
}

conformance! {
    fn every_malformed_request_gets_a_json_error(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve();
        // (method, path, content type, body, status, error code)
        type Case<'a> = (&'a str, &'a str, &'a str, &'a [u8], u16, &'a str);
        let cases: &[Case] = &[
            ("GET", "/v1/facts?after=x", "", b"", 400, "bad_request"),
            ("GET", "/v1/facts?after=-1", "", b"", 400, "bad_request"),
            ("GET", "/v1/facts?limit=0", "", b"", 400, "bad_request"),
            ("GET", "/v1/facts?color=red", "", b"", 400, "bad_request"),
            ("GET", "/v1/facts?root=abc", "", b"", 400, "bad_request"),
            (
                "POST",
                "/v1/facts",
                "text/plain",
                b"x",
                415,
                "unsupported_media_type",
            ),
            (
                "POST",
                "/v1/fetch",
                CBOR,
                b"{}",
                415,
                "unsupported_media_type",
            ),
            (
                "POST",
                "/v1/fetch",
                JSON_CT,
                b"not json",
                400,
                "bad_request",
            ),
            (
                "POST",
                "/v1/fetch",
                JSON_CT,
                br#"{"hashes":["zz"]}"#,
                400,
                "bad_request",
            ),
            ("GET", "/v2/facts", "", b"", 404, "not_found"),
            ("DELETE", "/v1/facts", "", b"", 405, "method_not_allowed"),
        ];
        for (m, p, ct, body, want, code) in cases {
            let (status, json) = http(&server, m, p, ct, body, None);
            assert_eq!(status, *want, "{m} {p}: {json}");
            assert_eq!(json["error"], *code, "{m} {p}: {json}");
            assert!(json["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
        // An empty push is fine and changes nothing.
        let (status, json) = http(&server, "POST", "/v1/facts", CBOR, b"", None);
        assert_eq!((status, json["received"].as_u64()), (200, Some(0)));
    }
}

conformance! {
    fn a_slow_request_times_out_with_408(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve_with(|c| c.limits.request_timeout = Duration::from_millis(300));
        let mut s = TcpStream::connect(server.addr()).unwrap();
        // Promise a body and never send it.
        write!(
            s,
            "POST /v1/facts HTTP/1.1\r\nhost: x\r\ncontent-type: application/cbor-seq\r\ncontent-length: 100\r\n\r\n"
        )
        .unwrap();
        let (status, json) = read_response(&mut s);
        assert_eq!((status, json["error"].as_str()), (408, Some("timeout")));
    }
}

conformance! {
    fn connections_over_the_limit_get_503(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve_with(|c| c.limits.max_connections = 2);
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(server.addr()).unwrap();
            // A complete request keeps the connection open (keep-alive) and proves it is served.
            write!(s, "GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
            let (status, _) = read_response(&mut s);
            assert_eq!(status, 200);
            held.push(s);
        }
        let mut extra = TcpStream::connect(server.addr()).unwrap();
        write!(extra, "GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let (status, json) = read_response(&mut extra);
        assert_eq!(
            (status, json["error"].as_str()),
            (503, Some("too_many_connections"))
        );
        drop(held);
    }
}

conformance_sync! {
    fn tls_with_a_self_signed_certificate(server: Backend, client: Backend) {
        let a = Node::on(server);
        a.store().insert_batch(chain(25)).unwrap();
        let cert =
            rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
        let cert_pem = cert.cert.pem();
        let cert_path = a.dir.path().join("cert.pem");
        let key_path = a.dir.path().join("key.pem");
        std::fs::write(&cert_path, &cert_pem).unwrap();
        std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
        let server = a.serve_with(|c| c.tls = Some((cert_path.clone(), key_path.clone())));
        let url = format!("https://localhost:{}", server.addr().port());
        let b = Node::on(client);
        let trusting = Client::new(
            &url,
            ClientOptions {
                ca_cert_pem: Some(cert_pem.into_bytes()),
                ..ClientOptions::default()
            },
        )
        .unwrap();
        trusting
            .sync(&b.store(), &SyncOptions::default(), &mut |_| {})
            .unwrap();
        assert_converged(&[&a, &b]);
        let untrusting = Client::new(&url, ClientOptions::default()).unwrap();
        let err = untrusting.health().unwrap_err();
        assert!(matches!(err, Error::Transport { .. }), "{err}");
        // Plain HTTP to the TLS port does not get an answer it could mistake for facts.
        let plain = Client::new(&server.url(), ClientOptions::default()).unwrap();
        assert!(plain.health().is_err());
    }
}

conformance_sync! {
    fn sync_through_a_proxy_that_cuts_delays_and_duplicates(server: Backend, client: Backend) {
        let a = Node::on(server);
        let b = Node::on(client);
        let base = chain(40);
        a.store().insert_batch(base.clone()).unwrap();
        a.store().insert_batch(tree("A", &base[39], 1500)).unwrap();
        b.store().insert_batch(base[..10].to_vec()).unwrap();
        b.store().insert_batch(tree("B", &base[5], 800)).unwrap();
        let server = a.serve();
        let proxy = FaultyProxy::start(server.addr(), 0xC0FFEE);
        let client = Client::new(
            &format!("http://{}", proxy.addr()),
            ClientOptions {
                batch: 97,
                timeout: Duration::from_secs(10),
                ..ClientOptions::default()
            },
        )
        .unwrap();
        let sb = b.store();
        let mut failures = 0;
        loop {
            match client.sync(&sb, &SyncOptions::default(), &mut |_| {}) {
                Ok(r) if r.held == 0 => break,
                Ok(_) => {}
                Err(Error::Transport { .. } | Error::Protocol { .. }) => failures += 1,
                Err(e) => panic!("unexpected error: {e}"),
            }
            assert!(failures < 500, "the proxy never let a sync finish");
            // A store that was mid-sync is always consistent.
            assert_topological(&sb);
        }
        // A request or answer cut short is sent again, smaller, within the sync
        // (`docs/protocol.md`, "Requests fitted to the link"), so the faults are counted where
        // they are made: streams the proxy cut with bytes still to pass.
        assert!(proxy.cuts() > 0, "the proxy injected no fault");
        // Requests are replayed when their connection closes: close the client's.
        drop(client);
        wait_until(|| proxy.duplicated() > 0);
        drop(sb);
        assert_converged(&[&a, &b]);
    }
}

conformance_sync! {
    fn a_follower_receives_new_facts_without_asking_again(server: Backend, client: Backend) {
        let a = Node::on(server);
        let server = a.serve();
        let b = Node::on(client);
        let stop = Arc::new(AtomicBool::new(false));
        let url = server.url();
        let db = b.db.clone();
        let stop2 = stop.clone();
        let follower = std::thread::spawn(move || {
            let store = Store::open(&db).unwrap();
            let client = Client::new(&url, ClientOptions::default()).unwrap();
            client
                .follow(
                    &store,
                    &SyncOptions::default(),
                    Duration::from_secs(2),
                    &stop2,
                    &mut |_| {},
                )
                .unwrap();
        });
        let f = fact("Live", 1, &[]);
        a.store().insert(&f).unwrap();
        let sb = b.store();
        wait_until(|| sb.get(&f.hash()).unwrap().is_some());
        // And the other way: a fact written on the follower reaches the server.
        let g = fact("Back", 2, &[f.hash()]);
        b.store().insert(&g).unwrap();
        let sa = a.store();
        wait_until(|| sa.get(&g.hash()).unwrap().is_some());
        stop.store(true, Ordering::Relaxed);
        follower.join().unwrap();
        assert_converged(&[&a, &b]);
    }
}

conformance_sync! {
    /// A push-only follower waits for new facts here between rounds (it has nothing to
    /// long-poll the server for): a few rounds a second at most, and a fact written here,
    /// by this process or another, is pushed soon after.
    fn a_push_only_follower_waits_for_local_facts(server: Backend, client: Backend) {
        let a = Node::on(server);
        let server = a.serve();
        let b = Node::on(client);
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (url, db, stop2, rounds2) = (server.url(), b.db.clone(), stop.clone(), rounds.clone());
        let follower = std::thread::spawn(move || {
            let store = Store::open(&db).unwrap();
            let client = Client::new(&url, ClientOptions::default()).unwrap();
            let push = SyncOptions {
                direction: Direction::Push,
                ..SyncOptions::default()
            };
            client
                .follow(&store, &push, Duration::from_secs(30), &stop2, &mut |r| {
                    assert!(r.is_ok(), "{r:?}");
                    rounds2.fetch_add(1, Ordering::Relaxed);
                })
                .unwrap();
        });
        wait_until(|| rounds.load(Ordering::Relaxed) > 0);
        let first = rounds.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(1500));
        let idle = rounds.load(Ordering::Relaxed) - first;
        assert!(idle <= 2, "{idle} more rounds in 1.5 s with nothing to push");
        // Written through another store on the same database, as another process would.
        let f = fact("Out", 1, &[]);
        b.store().insert(&f).unwrap();
        let sa = a.store();
        wait_until(|| sa.get(&f.hash()).unwrap().is_some());
        stop.store(true, Ordering::Relaxed);
        follower.join().unwrap();
        assert_converged(&[&a, &b]);
    }
}

conformance_sync! {
    fn info_digest_is_order_independent(server: Backend, client: Backend) {
        let a = Node::on(server);
        let b = Node::on(client);
        let facts = chain(20);
        a.store().insert_batch(facts.clone()).unwrap();
        let mut rev = facts.clone();
        rev.reverse();
        for f in &rev {
            b.store().insert(f).unwrap();
        }
        let (sa, sb) = (a.serve(), b.serve());
        let ia = Client::new(&sa.url(), ClientOptions::default())
            .unwrap()
            .info()
            .unwrap();
        let ib = Client::new(&sb.url(), ClientOptions::default())
            .unwrap()
            .info()
            .unwrap();
        assert_eq!((ia.count, &ia.digest), (ib.count, &ib.digest));
        a.store().insert(&fact("More", 1, &[])).unwrap();
        let ia2 = Client::new(&sa.url(), ClientOptions::default())
            .unwrap()
            .info()
            .unwrap();
        assert_eq!(ia2.count, 21);
        assert_ne!(ia2.digest, ia.digest);
    }
}

conformance! {
    fn a_pull_page_is_exactly_the_release_order_after_the_bookmark(b: Backend) {
        let a = Node::on(b);
        let facts = chain(30);
        a.store().insert_batch(facts.clone()).unwrap();
        let server = a.serve();
        let client = Client::new(&server.url(), ClientOptions::default()).unwrap();
        let page = client.pull_page(10, 5, Duration::ZERO, &[]).unwrap();
        assert_eq!((page.through, page.max_seq), (15, 30));
        let got: Vec<Vec<u8>> = page.records.into_iter().map(|r| r.unwrap()).collect();
        let want: Vec<Vec<u8>> = facts[10..15]
            .iter()
            .map(|f| f.canonical_bytes().to_vec())
            .collect();
        assert_eq!(got, want);
        let empty = client
            .pull_page(30, 5, Duration::from_millis(100), &[])
            .unwrap();
        assert_eq!((empty.through, empty.records.len()), (30, 0));
    }
}

fn wait_until(mut ok: impl FnMut() -> bool) {
    // A bound against hanging, not a timing assertion.
    for _ in 0..600 {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("condition never became true");
}

fn read_response(s: &mut TcpStream) -> (u16, serde_json::Value) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).unwrap_or(0);
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let status = head[9..12].parse().unwrap();
                let body = &buf[end + 4..end + 4 + len];
                return (status, serde_json::from_slice(body).unwrap_or_default());
            }
        }
    }
    panic!("no complete response: {:?}", String::from_utf8_lossy(&buf));
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// SQLite only: the lock is SQLite's (another connection's write transaction).
#[test]
fn a_locked_database_answers_503_busy_and_stores_nothing() {
    let a = Node::new();
    let server = a.serve_with(|c| c.store_options.busy_timeout = Duration::from_millis(100));
    // Another process holds the write lock past the server's busy timeout.
    let lock = rusqlite::Connection::open(&a.db).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let body = fact("F", 1, &[]).canonical_bytes().to_vec();
    let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &body, None);
    assert_eq!(
        (status, json["error"].as_str()),
        (503, Some("busy")),
        "{json}"
    );
    lock.execute_batch("ROLLBACK").unwrap();
    assert_eq!(a.store().max_seq().unwrap(), 0);
    // Once the lock is gone the same push is stored.
    let (status, json) = http(&server, "POST", "/v1/facts", CBOR, &body, None);
    assert_eq!(status, 200, "{json}");
    assert_eq!(a.store().max_seq().unwrap(), 1);
}

/// SQLite only: the row is damaged with SQLite alone.
#[test]
fn a_corrupt_row_answers_500_internal_with_a_json_message() {
    let a = Node::new();
    let good = fact("F", 1, &[]);
    a.store().insert(&good).unwrap();
    let other = fact("F", 2, &[]);
    let raw = rusqlite::Connection::open(&a.db).unwrap();
    raw.execute(
        "UPDATE fact SET bytes = ?1 WHERE seq = 1",
        [other.canonical_bytes()],
    )
    .unwrap();
    drop(raw);
    let server = a.serve();
    let req = serde_json::json!({ "hashes": [good.hash().to_string()] }).to_string();
    let (status, json) = http(&server, "POST", "/v1/fetch", JSON_CT, req.as_bytes(), None);
    assert_eq!(
        (status, json["error"].as_str()),
        (500, Some("internal")),
        "{json}"
    );
    assert!(
        json["message"]
            .as_str()
            .unwrap_or("")
            .contains(&good.hash().to_string()),
        "{json}"
    );
}

/// `n` facts of type `t` of about 540 bytes each, naming `root`.
fn padded(t: &str, root: &precedent::Fact, n: i64) -> Vec<precedent::Fact> {
    let pad = "x".repeat(480);
    (0..n)
        .map(|i| {
            precedent::Fact::builder(t)
                .field("n", i)
                .field("pad", pad.as_str())
                .predecessor("root", root.hash())
                .build()
                .unwrap()
        })
        .collect()
}

/// A proxy that closes idle connections (as load balancers and NAT gateways do, here
/// after 1.2 s) cuts every long poll of a follower with nothing to pull. Such a cut says
/// nothing of what the link carries: the follower asks again at once without waiting,
/// at the same page size, and its rounds succeed. Before, each cut halved the page, down
/// to one fact, and then failed the round.
#[test]
fn a_follower_behind_a_proxy_that_cuts_idle_connections_keeps_its_page_size() {
    let a = Node::on(common::backend::Backend::Sqlite);
    let b = Node::on(common::backend::Backend::Sqlite);
    let root = fact("Root", 0, &[]);
    a.store().insert(&root).unwrap();
    let server = a.serve();
    let proxy = IdleCutProxy::start(server.addr(), Duration::from_millis(1200));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (url, db, stop2, errors2) = (proxy.url(), b.db.clone(), stop.clone(), errors.clone());
    let follower = std::thread::spawn(move || {
        let store = Store::open(&db).unwrap();
        let client = Client::new(&url, ClientOptions::default()).unwrap();
        let mut on_round = |r: &precedent::Result<precedent::sync::client::SyncReport>| {
            if let Err(e) = r {
                errors2.lock().unwrap().push(e.to_string());
            }
        };
        client
            .follow(
                &store,
                &SyncOptions::default(),
                Duration::from_secs(5),
                &stop2,
                &mut on_round,
            )
            .unwrap();
    });
    // Idle long polls, each cut by the proxy.
    wait_until(|| proxy.cuts() >= 4);
    let f = fact("Live", 1, &[root.hash()]);
    a.store().insert(&f).unwrap();
    let sb = b.store();
    wait_until(|| sb.get(&f.hash()).unwrap().is_some());
    stop.store(true, Ordering::Relaxed);
    follower.join().unwrap();
    let limits = proxy.limits();
    assert!(limits.len() > 4, "{limits:?}");
    assert!(
        limits.iter().all(|&l| l == limits[0]),
        "the pull size shrank: {limits:?}"
    );
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:?}",
        errors.lock().unwrap()
    );
}

/// A server with a request timeout of 2 s, and a client with a timeout of 2 s that
/// reaches it through a link of `up` and `down` bytes a second.
fn slow_link(
    a: &Node,
    up: u64,
    down: u64,
) -> (precedent::sync::server::Running, SlowProxy, Client) {
    let server = a.serve_with(|c| {
        c.limits = Limits {
            request_timeout: Duration::from_secs(2),
            ..Limits::default()
        }
    });
    let proxy = SlowProxy::start(server.addr(), up, down);
    let client = Client::new(
        &proxy.url(),
        ClientOptions {
            timeout: Duration::from_secs(2),
            ..ClientOptions::default()
        },
    )
    .unwrap();
    (server, proxy, client)
}

/// A link too slow to carry a default-sized pull page or push request in the time
/// allowed still syncs: a request that times out or is cut short is sent again at half
/// its size, down to one fact, so the bookmarks move and the nodes converge in a bounded
/// number of syncs (before, the same oversized page was asked for again and again, and
/// the pull bookmark stayed at 0).
#[test]
fn a_link_too_slow_for_a_full_request_still_syncs() {
    let a = Node::on(common::backend::Backend::Sqlite);
    let b = Node::on(common::backend::Backend::Sqlite);
    let root = fact("Root", 0, &[]);
    // About 1 MB to pull and 0.5 MB to push.
    a.store().insert_batch(vec![root.clone()]).unwrap();
    a.store().insert_batch(padded("A", &root, 2000)).unwrap();
    b.store().insert_batch(vec![root.clone()]).unwrap();
    b.store().insert_batch(padded("B", &root, 1000)).unwrap();
    // 200 KB/s each way, and 2 s for a request: A's facts in one default page take 5 s,
    // B's in one default push 2.5 s.
    let (_server, proxy, client) = slow_link(&a, 200_000, 200_000);
    let sb = b.store();
    let (mut failures, mut done) = (Vec::new(), false);
    for _ in 0..3 {
        match client.sync(&sb, &SyncOptions::default(), &mut |_| {}) {
            Ok(r) => {
                assert_eq!((r.quarantined, r.held), (0, 0), "{r:?}");
                done = true;
                break;
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    let peer = sb.peer(&proxy.url()).unwrap().unwrap();
    assert!(
        peer.pull_after > 0,
        "the pull bookmark never moved: {failures:?}"
    );
    assert!(done, "no sync of three finished: {failures:?}");
    drop(sb);
    assert_converged(&[&a, &b]);
}

/// The ancestors that held facts wait for, fetched over a link too slow for a full fetch
/// (1,000 hashes) in the time allowed: a fetch cut short is sent again for half its
/// hashes, so the held facts are released (before, the same fetch failed the sync every
/// time).
#[test]
fn a_fetch_too_large_for_a_slow_link_goes_in_smaller_requests() {
    let a = Node::on(common::backend::Backend::Sqlite);
    let b = Node::on(common::backend::Backend::Sqlite);
    let root = fact("Root", 0, &[]);
    let elsewhere = fact("Elsewhere", 0, &[]);
    a.store()
        .insert_batch(vec![root.clone(), elsewhere.clone()])
        .unwrap();
    // About 0.5 MB of A's facts, which B's held facts wait for.
    let parents = padded("A", &root, 1000);
    a.store().insert_batch(parents.clone()).unwrap();
    b.store().insert_batch(vec![root.clone()]).unwrap();
    let children: Vec<_> = parents
        .iter()
        .enumerate()
        .map(|(i, p)| fact("Child", i as i64, &[p.hash()]))
        .collect();
    b.store().insert_batch(children).unwrap();
    assert_eq!(b.store().held_count().unwrap(), 1000);
    // 200 KB/s, and 2 s for a request: one fetch of the 1,000 takes 2.5 s. The pull is
    // scoped to a root with nothing under it, so that the parents come only by fetch.
    let (_server, _proxy, client) = slow_link(&a, 200_000, 200_000);
    let sb = b.store();
    let options = SyncOptions {
        direction: Direction::Pull,
        roots: vec![elsewhere.hash()],
    };
    let (mut failures, mut fetched) = (Vec::new(), None);
    for _ in 0..3 {
        match client.sync(&sb, &options, &mut |_| {}) {
            Ok(r) => {
                fetched = Some(r.fetched);
                break;
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert_eq!(fetched, Some(1000), "{failures:?}");
    assert_eq!(sb.held_count().unwrap(), 0, "{failures:?}");
}

/// A push request too large for a slow uplink in the server's request timeout (408) is
/// sent again in halves, so a push-only sync moves its bookmark (before, the same
/// request was sent again and again).
#[test]
fn a_push_too_large_for_a_slow_uplink_goes_in_smaller_requests() {
    let a = Node::on(common::backend::Backend::Sqlite);
    let b = Node::on(common::backend::Backend::Sqlite);
    let root = fact("Root", 0, &[]);
    a.store().insert_batch(vec![root.clone()]).unwrap();
    b.store().insert_batch(vec![root.clone()]).unwrap();
    b.store().insert_batch(padded("B", &root, 1000)).unwrap();
    // 0.5 MB over 200 KB/s: 2.5 s in one request, and 2 s are allowed.
    let (_server, proxy, client) = slow_link(&a, 200_000, 10_000_000);
    let sb = b.store();
    let options = SyncOptions {
        direction: Direction::Push,
        ..SyncOptions::default()
    };
    let (mut failures, mut pushed) = (Vec::new(), 0);
    for _ in 0..3 {
        match client.sync(&sb, &options, &mut |_| {}) {
            Ok(r) => {
                pushed += r.pushed;
                break;
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    let peer = sb.peer(&proxy.url()).unwrap().unwrap();
    assert_eq!(
        peer.push_after,
        sb.max_seq().unwrap(),
        "the push bookmark did not reach the end: {failures:?}"
    );
    // B's facts, and the root (a push-only sync does not know the server has it).
    assert_eq!(pushed, 1001, "{failures:?}");
    drop(sb);
    assert_converged(&[&a, &b]);
}

//! The remote-worker endpoints as the hub parses them: `POST /v1/queues/NAME/ACTION`
//! through HTTP to a sync server running in this process (`sync::server::Running` on
//! 127.0.0.1 port 0, open access, 100 items per request) whose database has one queue,
//! `ship` (inputs `Shop.Order`, completed by a `Shop.Shipped` naming it as `order`, one-hour
//! leases, three attempts). Before each run the target keeps a stock of inputs (writing new
//! ones, redriving dead letters) and of live leases it claimed through
//! `sync::client::RemoteQueue`, the client `precedent work --remote` uses. The first byte
//! picks the action (claim, complete, extend, fail, poison, or one that does not exist) and
//! the queue (`ship`, or one not declared); the rest is the body, in which `@0` to `@7`
//! stand for the stock's lease ids and `@h` for the hash of a ready input, so that the
//! fuzzer reaches the code behind the lease check.
//!
//! Properties besides "no panic": every answer is HTTP/1.1 and never a 500; an error
//! answer is a JSON object with an `error` code and a one-line `message`; a request refused
//! as a whole changes nothing (no fact stored, the queue's counts unchanged); a batch
//! answered 200 has one result per item, in order; no input is lost or completed twice:
//! after every request the inputs written equal the queue's unfinished ones (ready,
//! leased, delayed, blocked, dead, poison) plus the completed ones, and the completed count
//! grew by exactly the completions answered `ok`; every 1,024 requests the database passes
//! `verify`.

#![no_main]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use precedent::queue::{Completion, ItemState, QueueSpec, QueueStats};
use precedent::sync::client::{ClientOptions, RemoteQueue};
use precedent::sync::server::Running;
use precedent::{Fact, Store};
use serde_json::Value;

#[path = "common/server.rs"]
mod common;

const QUEUE: &str = "ship";

struct State {
    store: Store,
    client: RemoteQueue,
    leases: Vec<String>,
    /// Inputs written so far.
    inputs: u64,
    shop: Fact,
}

struct Target {
    server: Running,
    state: Mutex<State>,
}

static TARGET: OnceLock<Target> = OnceLock::new();
static RUNS: AtomicU64 = AtomicU64::new(0);

fn start() -> Target {
    let db = common::fresh_db("queue");
    let store = Store::open(&db).unwrap();
    let mut spec = QueueSpec::new(
        QUEUE,
        "Shop.Order",
        vec![Completion {
            type_name: "Shop.Shipped".into(),
            role: "order".into(),
        }],
    );
    spec.lease_ms = 3_600_000;
    spec.retry.max_attempts = 3;
    store.declare_queue(&spec).unwrap();
    let shop = Fact::builder("Shop").field("id", 1).build().unwrap();
    store.insert(&shop).unwrap();
    let server = Running::start(common::config(&db)).unwrap();
    let client = RemoteQueue::new(&server.url(), QUEUE, ClientOptions::default()).unwrap();
    Target {
        server,
        state: Mutex::new(State {
            store,
            client,
            leases: Vec::new(),
            inputs: 0,
            shop,
        }),
    }
}

impl State {
    fn stats(&self) -> QueueStats {
        self.store.queue_stats(QUEUE).unwrap()
    }

    /// Inputs to claim and live leases to send.
    fn restock(&mut self) {
        for item in self
            .store
            .queue_items(QUEUE, Some(ItemState::Dead), 10)
            .unwrap()
        {
            self.store.redrive(QUEUE, &item.input).unwrap();
        }
        for item in self
            .store
            .queue_items(QUEUE, Some(ItemState::Poison), 10)
            .unwrap()
        {
            self.store.redrive(QUEUE, &item.input).unwrap();
        }
        if self.stats().ready < 4 {
            let orders: Vec<Fact> = (0..8)
                .map(|_| {
                    self.inputs += 1;
                    Fact::builder("Shop.Order")
                        .field("id", self.inputs as i64)
                        .predecessor("shop", self.shop.hash())
                        .build()
                        .unwrap()
                })
                .collect();
            self.store.insert_batch(orders).unwrap();
        }
        if self.leases.len() < 8 {
            let got = self.client.claim(4, Duration::ZERO).unwrap();
            self.leases.extend(got.into_iter().map(|l| l.id));
        }
        let n = self.leases.len();
        if n > 8 {
            self.leases.drain(..n - 8);
        }
    }

    /// The body with `@0`..`@7` and `@h` put in.
    fn body(&self, rest: &[u8]) -> Vec<u8> {
        let ready = self
            .store
            .queue_items(QUEUE, Some(ItemState::Ready), 1)
            .unwrap();
        let hash = ready
            .first()
            .map(|i| i.input.to_string())
            .unwrap_or_default();
        let mut out = Vec::with_capacity(rest.len() + 64);
        let mut i = 0;
        while i < rest.len() {
            if rest[i] == b'@' && i + 1 < rest.len() {
                let c = rest[i + 1];
                if c.is_ascii_digit() && ((c - b'0') as usize) < self.leases.len() {
                    out.extend_from_slice(self.leases[(c - b'0') as usize].as_bytes());
                    i += 2;
                    continue;
                }
                if c == b'h' {
                    out.extend_from_slice(hash.as_bytes());
                    i += 2;
                    continue;
                }
            }
            out.push(rest[i]);
            i += 1;
        }
        out
    }
}

fn unfinished(s: &QueueStats) -> u64 {
    s.ready + s.leased + s.delayed + s.blocked + s.dead + s.poison
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let t = TARGET.get_or_init(start);
    let mut st = t.state.lock().unwrap();
    st.restock();
    let actions = ["claim", "complete", "extend", "fail", "poison", "redrive"];
    let action = actions[(pick % 6) as usize];
    let queue = if pick & 0x80 == 0 { QUEUE } else { "nope" };
    let body = st.body(rest);
    let items = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("leases").and_then(Value::as_array).map(Vec::len));
    let mut req = format!(
        "POST /v1/queues/{queue}/{action} HTTP/1.1\r\nhost: fuzz\r\nconnection: close\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    let before = st.stats();
    let seq_before = st.store.max_seq().unwrap();
    let mut s = TcpStream::connect(t.server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(&req);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    drop(s);
    let (status, head, body_out) = common::answer(&raw);
    let body_out = body_out.expect("a whole answer");
    let shown = || {
        format!(
            "{:?} -> {:?}",
            String::from_utf8_lossy(&req),
            String::from_utf8_lossy(&raw)
        )
    };
    assert!(status != 500, "500: {}", shown());
    let after = st.stats();
    assert_eq!(
        st.inputs,
        unfinished(&after) + after.completed,
        "inputs lost or completed twice: {after:?}; {}",
        shown()
    );
    assert!(after.completed >= before.completed, "{}", shown());
    if status != 200 {
        common::check_error(&head, &body_out);
        assert_eq!(
            st.store.max_seq().unwrap(),
            seq_before,
            "refused, yet stored: {}",
            shown()
        );
        assert_eq!(
            (
                after.completed,
                after.failed,
                unfinished(&after),
                after.dead,
                after.poison
            ),
            (
                before.completed,
                before.failed,
                unfinished(&before),
                before.dead,
                before.poison
            ),
            "refused, yet the queue changed: {}",
            shown()
        );
    } else {
        let v: Value = serde_json::from_slice(&body_out).expect("a JSON answer");
        if action == "claim" {
            let leases = v["leases"].as_array().expect("leases");
            assert_eq!(
                after.leased,
                before.leased + leases.len() as u64,
                "{}",
                shown()
            );
        } else {
            let results = v["results"].as_array().expect("results");
            assert_eq!(Some(results.len()), items, "{}", shown());
            let ok = results
                .iter()
                .filter(|r| r["ok"] == Value::Bool(true))
                .count() as u64;
            if action == "complete" {
                assert_eq!(after.completed, before.completed + ok, "{}", shown());
            } else {
                assert_eq!(after.completed, before.completed, "{}", shown());
            }
        }
    }
    drop(st);
    if RUNS.fetch_add(1, Ordering::Relaxed) % 1024 == 1023 {
        let st = t.state.lock().unwrap();
        let report = st.store.verify(|_| {}).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
    }
});

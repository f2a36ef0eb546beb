//! The JSON API as the server parses it, through HTTP to a sync server running in this
//! process (`sync::server::Running` on 127.0.0.1 port 0, open access, a 64 KiB body limit,
//! 100 facts per request, a few facts stored at start). The first byte picks the request;
//! the rest is its body or its parameters:
//!
//! | first byte % 5 | request |
//! | --- | --- |
//! | 0 | `POST /v1/facts`, `Content-Type: application/json` (a JSON array push) |
//! | 1 | `POST /v1/facts`, `Content-Type: application/jsonl` (JSON Lines push) |
//! | 2 | `POST /v1/query` with the body |
//! | 3 | `GET /v1/watch?` and the rest as the query string (bytes a request line cannot carry percent-encoded) |
//! | 4 | `GET /v1/facts/` and the rest as the path (percent-encoded likewise), JSON or CBOR by the byte's next bit |
//!
//! Properties besides "no panic": every answer is HTTP/1.1 and never a 500; an error
//! answer is a JSON object with an `error` code and a one-line `message`; a push answered
//! 200 counts as `received` exactly its records (the non-blank lines, or the elements of a
//! body that is a JSON array) and the store grew by exactly the facts it says it
//! `released`; a body a JSON parser reads as an array is never refused 400 as a whole; a query answered 200 is one complete JSON object whose `count` is the
//! length of its `results`; a watch answered 200 is an event stream; every 1,024 requests
//! the database passes `verify`.

#![no_main]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use precedent::sync::server::Running;
use precedent::{Fact, Store};
use serde_json::Value;

#[path = "common/server.rs"]
mod common;

use common::answer;

struct Target {
    server: Running,
    store: Mutex<Store>,
}

static TARGET: OnceLock<Target> = OnceLock::new();
static RUNS: AtomicU64 = AtomicU64::new(0);

fn start() -> Target {
    let db = common::fresh_db("json");
    let store = Store::open(&db).unwrap();
    let shop = Fact::builder("Shop").field("id", 1).build().unwrap();
    let order = Fact::builder("Shop.Order")
        .field("id", 7)
        .predecessor("shop", shop.hash())
        .build()
        .unwrap();
    store.insert_batch(vec![shop, order]).unwrap();
    Target {
        server: Running::start(common::config(&db)).unwrap(),
        store: Mutex::new(store),
    }
}

/// Percent-encodes the bytes a request target cannot carry as they are.
fn target_text(bytes: &[u8]) -> String {
    let mut out = String::new();
    for &b in bytes {
        if b.is_ascii_graphic() && b != b'#' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn request(method: &str, target: &str, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "{method} {target} HTTP/1.1\r\nhost: fuzz\r\nconnection: close\r\n{headers}content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

fn json(body: &[u8], what: &str) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!(
            "{what}: not JSON ({e}): {:?}",
            String::from_utf8_lossy(body)
        )
    })
}

fn max_seq(t: &Target) -> i64 {
    t.store.lock().unwrap().max_seq().unwrap()
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let t = TARGET.get_or_init(start);
    let req = match pick % 5 {
        0 => request(
            "POST",
            "/v1/facts",
            "content-type: application/json\r\n",
            rest,
        ),
        1 => request(
            "POST",
            "/v1/facts",
            "content-type: application/jsonl\r\n",
            rest,
        ),
        2 => request(
            "POST",
            "/v1/query",
            "content-type: application/json\r\n",
            rest,
        ),
        3 => request("GET", &format!("/v1/watch?{}", target_text(rest)), "", b""),
        _ => {
            let accept = if pick & 8 == 0 {
                "application/json"
            } else {
                "application/cbor"
            };
            let target = format!("/v1/facts/{}", target_text(rest));
            request("GET", &target, &format!("accept: {accept}\r\n"), b"")
        }
    };
    let before = max_seq(t);
    let mut s = TcpStream::connect(t.server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(&req);
    let mut raw = Vec::new();
    if pick % 5 == 3 {
        // An event stream does not end: read its head, and the first event when it is one.
        let mut buf = [0u8; 4096];
        while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
        }
    } else {
        let _ = s.read_to_end(&mut raw);
    }
    drop(s);
    let (status, head, body) = answer(&raw);
    assert!(
        status != 500,
        "500 for {:?}: {:?}",
        String::from_utf8_lossy(&req),
        String::from_utf8_lossy(&raw)
    );
    if status >= 400 && pick % 5 != 3 {
        common::check_error(&head, &body.clone().expect("an error answer is whole"));
    }
    match (pick % 5, status) {
        (0 | 1, 200) => {
            let v = json(&body.expect("a push answer is whole"), "a push answer");
            let received = v["received"].as_u64().unwrap();
            let records = if pick % 5 == 1 {
                rest.split(|b| *b == b'\n')
                    .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
                    .count()
            } else {
                match serde_json::from_slice::<Vec<serde_json::value::Value>>(rest) {
                    Ok(items) => items.len(),
                    Err(_) => received as usize,
                }
            };
            assert_eq!(received as usize, records, "{v}");
            let released = v["released"].as_u64().unwrap() as i64;
            assert_eq!(max_seq(t) - before, released, "{v}");
        }
        (0, 400) => {
            if let Ok(items) = serde_json::from_slice::<Vec<Value>>(rest) {
                panic!("a JSON array of {} facts refused as a whole", items.len());
            }
        }
        (0 | 1, _) => assert_eq!(
            max_seq(t),
            before,
            "a push refused with {status} stored facts"
        ),
        (2, 200) => {
            let body = body.expect("a query answer is whole");
            let v = json(&body, "a query answer");
            let results = v["results"].as_array().expect("results");
            assert_eq!(v["count"].as_u64(), Some(results.len() as u64), "{v}");
            assert!(v["next"].is_null() || v["next"].is_string(), "{v}");
        }
        (3, 200) => assert!(head.contains("content-type: text/event-stream"), "{head}"),
        _ => {}
    }
    if RUNS.fetch_add(1, Ordering::Relaxed) % 1024 == 1023 {
        let store = t.store.lock().unwrap();
        let report = store.verify(|_| {}).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
    }
});

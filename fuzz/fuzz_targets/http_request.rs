//! Whole HTTP requests, as bytes on a TCP connection, to a sync server running in this
//! process (`sync::server::Running` on 127.0.0.1 port 0, with a token file and small
//! limits): hyper's request parsing, routing, tokens, limits, push, fetch and pull with
//! their bodies and query parameters.
//!
//! Properties: no panic anywhere in the server (a panic aborts the fuzzer); every answer is
//! an HTTP/1.x response; the server keeps answering; every 1,024 requests the database
//! passes `verify`.

#![no_main]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use precedent::Store;
use precedent::sync::auth::{Grant, Tokens};
use precedent::sync::server::Running;

#[path = "common/server.rs"]
#[allow(dead_code)]
mod common;

struct Target {
    server: Running,
    db: PathBuf,
}

static TARGET: OnceLock<Target> = OnceLock::new();
static RUNS: AtomicU64 = AtomicU64::new(0);

fn start() -> Target {
    let db = common::fresh_db("http");
    let mut config = common::config(&db);
    config.tokens = Tokens::new(vec![
        Grant {
            name: "writer".into(),
            token: "w-secret".into(),
            read: true,
            write: true,
            types: None,
            work: Default::default(),
            admin: false,
        },
        Grant {
            name: "shops".into(),
            token: "s-secret".into(),
            read: false,
            write: true,
            types: Some(vec!["Shop".into()]),
            work: Default::default(),
            admin: false,
        },
    ])
    .unwrap();
    Target {
        server: Running::start(config).unwrap(),
        db,
    }
}

fuzz_target!(|data: &[u8]| {
    let t = TARGET.get_or_init(start);
    let mut s = TcpStream::connect(t.server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The server may answer and close before reading everything: ignore write errors.
    let _ = s.write_all(data);
    let _ = s.shutdown(Shutdown::Write);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert!(
        answer.is_empty() || answer.starts_with(b"HTTP/1."),
        "not an HTTP answer: {:?}",
        String::from_utf8_lossy(&answer[..answer.len().min(200)])
    );
    if RUNS.fetch_add(1, Ordering::Relaxed) % 1024 == 1023 {
        let store = Store::open(&t.db).unwrap();
        let report = store.verify(|_| {}).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
    }
});

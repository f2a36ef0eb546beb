//! What the targets that talk to a server in their own process share: a fresh database
//! path, the small limits they serve with, and reading an answer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use precedent::sync::server::{Limits, ServerConfig};

/// A fresh database path for the target `name`: under `/dev/shm` where there is one (a
/// tmpfs, where the commits' fsyncs cost nothing and thousands of them a second do not
/// wait on a disk), else under the temporary folder. The store is opened as it always is
/// (`Durability::Full`): only the medium differs.
pub fn fresh_db(name: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("precedent-fuzz-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("fuzz.db")
}

/// Serving `db` on 127.0.0.1 port 0: 64 KiB bodies, 100 facts per request, a 500 ms
/// request timeout, 2 ms waits, 64 connections, a 5 ms poll. A long-poll wait (a pull's
/// `wait_ms`, a claim's) is capped at 2 ms: the waiting code runs as it does for 30 s,
/// and an input that asks for a wait does not cost ten others.
pub fn config(db: &PathBuf) -> ServerConfig {
    let mut config = ServerConfig::new(db);
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.limits = Limits {
        max_body_bytes: 64 << 10,
        max_facts_per_request: 100,
        max_held_per_peer: 1_000,
        request_timeout: Duration::from_millis(500),
        max_wait: Duration::from_millis(2),
        max_connections: 64,
        ..Limits::default()
    };
    config.poll_interval = Duration::from_millis(5);
    config
}

/// Status, head (lower-cased) and body of an HTTP/1.1 answer; a chunked body is decoded,
/// `None` when it is cut short.
pub fn answer(raw: &[u8]) -> (u16, String, Option<Vec<u8>>) {
    let text = String::from_utf8_lossy(raw);
    assert!(
        text.starts_with("HTTP/1.1 "),
        "not an HTTP answer: {:?}",
        &text[..text.len().min(200)]
    );
    let status: u16 = text[9..12].parse().expect("a status code");
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("the end of the head")
        + 4;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let mut body = &raw[end..];
    if !head.contains("transfer-encoding: chunked") {
        return (status, head, Some(body.to_vec()));
    }
    let mut out = Vec::new();
    loop {
        let Some(eol) = body.windows(2).position(|w| w == b"\r\n") else {
            return (status, head, None);
        };
        let size = std::str::from_utf8(&body[..eol]).ok();
        let size = size.and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok());
        let Some(size) = size else {
            return (status, head, None);
        };
        body = &body[eol + 2..];
        if size == 0 {
            return (status, head, Some(out));
        }
        if body.len() < size + 2 {
            return (status, head, None);
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

/// An error answer in JSON is an object with an `error` code and a one-line `message`.
pub fn check_error(head: &str, body: &[u8]) {
    if head.contains("content-type: application/json") {
        let v: serde_json::Value = serde_json::from_slice(body).expect("a JSON error answer");
        assert!(v["error"].is_string(), "{v}");
        let message = v["message"].as_str().expect("a message");
        assert!(
            !message.contains('\n'),
            "a message of two lines: {message:?}"
        );
    }
}

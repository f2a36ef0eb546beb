//! Inputs the fuzz targets (`fuzz/`, `docs/robustness.md`, "Fuzzing") found wrong, with
//! their bytes inline, each run against what the target checks.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use precedent::sync::server::{Running, ServerConfig};

/// Sends `body` to `path` of a server on a fresh database; the answer's status and body.
fn post(path: &str, body: &[u8]) -> (u16, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(dir.path().join("fuzz.db"));
    config.listen = "127.0.0.1:0".parse().unwrap();
    let server = Running::start(config).unwrap();
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8(raw).unwrap();
    let status = text[9..12].parse().unwrap();
    let (_, body) = text.split_once("\r\n\r\n").unwrap();
    (status, serde_json::from_str(body).unwrap())
}

/// json_http, crash-8ee1fe9a: a query body with an unknown key holding `\n` (JSON escapes
/// in the key): serde's message quotes the key, and the 400's message had three lines.
#[test]
fn query_body_with_a_line_break_in_an_unknown_key_is_a_one_line_error() {
    let body = br#"{"qxits( smatch sh: Shop.Shipment where sh->order = o)\norder by seq(o) desc\nselOrd o.id\n"}"#;
    let (status, v) = post("/v1/query", body);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"], "bad_request", "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains("unknown field"), "{message}");
    assert!(
        !message.contains('\n'),
        "a message of more than one line: {message:?}"
    );
    assert!(message.contains("o)\\norder by"), "{message:?}");
}

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

/// cbor_seq, crash-4d181ebd: a sequence read 2 bytes at a time whose bad record, framed
/// again without a size limit, has a string length near 2^64: the framing added it to its
/// position and overflowed (a panic in a debug build, a wrapped position in release).
#[test]
fn record_with_a_string_length_near_two_to_the_64_frames_without_overflow() {
    const HEX: &[&str] = &[
        "0184016154a0a0846444656d6fa30784016154a0a084016154a0a084016444656d6fa36166f4616ef66174f5",
        "a0840161026262610162626204a084016154a5617a0362616202627a7a0562c3a90163e282ac04a084016154",
        "a361610061621761631818a084016154a2616118ff6162190100a084016154a2616119ffff61621a00010000",
        "a084016154a261611affffffff61621b0000000100000000a084016154a561612061623761633818616438ff",
        "6165390100a084016154a161763b7fffffffffffffffa084016154a161761bffffffffffffffffa084016154",
        "a161763bffffffffffffffffa084016154a1617601a084016154a16176f93c00a084016154a16176f93e00a0",
        "84016154a16176f97bffa084016154a16176f90001a084016154a16176fa47c35000a084016154a16176fa47",
        "7ff000a084016154a16176fb3ff199998999999aa084016154a26176fb7e37e43c8800759c6177fb80002e05",
        "5c9a3f6ca084016154a16176f90000a084016154a16176f98000a084016154a2616ef9fc006170f97c00a084",
        "016154a16176626869a0840161546154a0a084016154a0a084016444656d6fa36166f4616ef66174f5a08401",
        "61026262610162626204a084016154a5617a0362616202627a7a0562c3a90163e282ac04a084016154a36161",
        "0061621761631818a084016154a2616118ff6162190100a084016154a2616119ffff61621a00010000a08401",
        "6154a261611affffffff61621b0000000100000000a084016154a561612061623761633818616438ff616539",
        "0100a084016154a161763b7fffffffffffffffa084016154a161761bffffffffffffffffa084016154a16176",
        "7bffffffffffffffffa084016154a1617601a084016154a16176f93c00a084016154a16176f93e00a0840161",
        "54a16176f97bffa084016154a16176f90001a084016154a16176fa47c35000a084016154a16176fa477ff000",
        "a084016154a16176fb3ff199998999999aa084016154a26176fb7e37e43c8800759c6177fb80002e055c9a3f",
        "6ca084016154a16176f90000a084016154a16176f98000a084016154a2616ef9fc006170f97c00a084016154",
        "a16176626869a084016154a161667171717171a084016171a161667171717171a0840161716176426869a084",
        "016154a2616540616c590100ababababababababab71f4d0d0d0d0d0d0abababd0d0d0d0d0ab",
    ];
    let bytes = hex::decode(HEX.concat()).unwrap();
    let data = &bytes[1..]; // the first byte is the target's read size: 2 bytes a call
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = 2.min(buf.len()).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }
    let split = precedent::sync::wire::split_records(data);
    let mut reader = precedent::sync::wire::RecordReader::new(Trickle(data));
    let mut read = Vec::new();
    while let Some(r) = reader.next_record().unwrap() {
        read.push(r.is_ok());
    }
    let split: Vec<bool> = split.iter().map(Result::is_ok).collect();
    assert_eq!(read, split);
}

//! Server-Sent Events from a real `precedent serve`: `GET /v1/watch` (the snapshot as
//! `added` events, `ready`, then added, removed and updated results after a push and after
//! `precedent add`, each event an array of results, none lost, repeated or reordered), `GET /v1/events` (change figures as `/v1/info` reports them), tokens,
//! bad requests, a client that stops reading, and on PostgreSQL a push to another server
//! on the same database, and a server that listens only once a client watches.
//!
//! The event streams are read over a plain HTTP/1.0 connection (so the body ends when the
//! server closes it), each read bounded by [`BOUND`].

mod common;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::bin::run_ok;
use common::db::Db;
use common::process::Server;
use precedent::{Fact, Store};
use serde_json::{Value as Json, json};

/// The longest any one event may take on a loaded machine.
const BOUND: Duration = Duration::from_secs(30);

const QUERY: &str = "given s: Shop match o: Shop.Order where o->shop = s \
    and not exists (match c: Shop.Cancel where c->order = o) \
    select {id: o.id, carriers: [match sh: Shop.Shipment where sh->order = o select sh.carrier]}";

/// What a read of an event stream gave.
#[derive(Debug, PartialEq)]
enum Read1 {
    Event(String, Json),
    Timeout,
    /// The end of the body: `true` for a clean end (the last chunk), `false` for a cut
    /// connection.
    End(bool),
}

/// A response body read through HTTP/1.1's chunked transfer coding (or as it comes,
/// when not chunked), telling a clean end from a cut one.
struct Body {
    tcp: TcpStream,
    chunked: bool,
    /// Where the chunked coding is. Kept across reads, so that a read that times out
    /// (the socket's read timeout) anywhere in the framing resumes where it stopped.
    at: Chunk,
    /// The part of a framing line read so far.
    line: Vec<u8>,
}

/// The place in a chunked body.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Chunk {
    /// Before a chunk's size line.
    Size,
    /// Inside a chunk, with this many bytes left.
    Data(usize),
    /// After a chunk's bytes, before the CRLF that ends it.
    End,
    /// After the last chunk (size 0): the body ended cleanly.
    Clean,
}

impl Body {
    fn new(tcp: TcpStream) -> Body {
        Body {
            tcp,
            chunked: false,
            at: Chunk::Size,
            line: Vec::new(),
        }
    }

    /// A line of the chunked coding (size or the CRLF after a chunk); `None` at EOF. A
    /// timeout keeps what was read of the line for the next call.
    fn line(&mut self) -> std::io::Result<Option<String>> {
        loop {
            let mut b = [0u8];
            if self.tcp.read(&mut b)? == 0 {
                return Ok(None);
            }
            if b[0] == b'\n' {
                let l = String::from_utf8_lossy(&self.line).trim().to_string();
                self.line.clear();
                return Ok(Some(l));
            }
            self.line.push(b[0]);
        }
    }
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.chunked {
            return self.tcp.read(buf);
        }
        loop {
            match self.at {
                Chunk::Clean => return Ok(0),
                Chunk::End => {
                    if self.line()?.is_none() {
                        return Ok(0);
                    }
                    self.at = Chunk::Size;
                }
                Chunk::Size => {
                    let Some(size) = self.line()? else {
                        return Ok(0);
                    };
                    let n = usize::from_str_radix(&size, 16)
                        .unwrap_or_else(|_| panic!("chunk size {size:?}"));
                    self.at = if n == 0 { Chunk::Clean } else { Chunk::Data(n) };
                }
                Chunk::Data(left) => {
                    let take = left.min(buf.len());
                    let got = self.tcp.read(&mut buf[..take])?;
                    if got == 0 {
                        return Ok(0);
                    }
                    self.at = if got == left {
                        Chunk::End
                    } else {
                        Chunk::Data(left - got)
                    };
                    return Ok(got);
                }
            }
        }
    }
}

/// An open `text/event-stream` response, or an error answer.
struct Stream {
    status: u16,
    headers: Vec<(String, String)>,
    reader: BufReader<Body>,
    /// The results of a watch's last event not yet taken, with its kind.
    pending: VecDeque<(String, Json)>,
    /// The events read so far.
    events: usize,
    /// The event being read: its kind, its data and the part of its current line read
    /// so far, kept when a read times out so that the next call goes on from there.
    kind: Option<String>,
    data: String,
    line: String,
}

fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn watch_path(query: &str, givens: &[(&str, String)]) -> String {
    let mut p = format!("/v1/watch?query={}", encode(query));
    for (k, v) in givens {
        p.push_str(&format!("&{}={}", encode(k), encode(v)));
    }
    p
}

impl Stream {
    fn open(url: &str, path: &str, token: Option<&str>) -> Stream {
        let addr = url.strip_prefix("http://").unwrap();
        let mut tcp = TcpStream::connect(addr).unwrap();
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        write!(
            tcp,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}\r\n"
        )
        .unwrap();
        tcp.set_read_timeout(Some(BOUND)).unwrap();
        let mut reader = BufReader::with_capacity(1, Body::new(tcp));
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut headers = Vec::new();
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap();
            headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
        }
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
        let body = reader.into_inner();
        let reader = BufReader::new(Body { chunked, ..body });
        Stream {
            status,
            headers,
            reader,
            pending: VecDeque::new(),
            events: 0,
            kind: None,
            data: String::new(),
            line: String::new(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The whole body of an error answer, as JSON.
    fn error(mut self) -> Json {
        let mut body = String::new();
        self.reader.read_to_string(&mut body).unwrap();
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    /// The next result within `within`, as `(kind, result)`: a watch's `added`, `removed`
    /// and `updated` events each hold a non-empty array of results, taken one at a time;
    /// any other event (`ready`, `change`) as it is.
    fn next(&mut self, within: Duration) -> Read1 {
        if let Some((k, v)) = self.pending.pop_front() {
            return Read1::Event(k, v);
        }
        match self.next_event(within) {
            Read1::Event(k, v) if ["added", "removed", "updated"].contains(&k.as_str()) => {
                let rows = v
                    .as_array()
                    .unwrap_or_else(|| panic!("a {k} event's data is not an array: {v}"));
                assert!(!rows.is_empty(), "a {k} event without results");
                self.pending
                    .extend(rows.iter().map(|r| (k.clone(), r.clone())));
                let (k, v) = self.pending.pop_front().unwrap();
                Read1::Event(k, v)
            }
            other => other,
        }
    }

    /// The next event within `within`, skipping comments.
    fn next_event(&mut self, within: Duration) -> Read1 {
        let until = Instant::now() + within;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Read1::Timeout;
            }
            self.reader
                .get_ref()
                .tcp
                .set_read_timeout(Some(left))
                .unwrap();
            // A line cut by a timeout is kept (`read_line` appends what it read before
            // an error) and finished by the next read.
            match self.reader.read_line(&mut self.line) {
                Ok(0) => return Read1::End(self.reader.get_ref().at == Chunk::Clean),
                Ok(_) if !self.line.ends_with('\n') => continue,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Read1::Timeout;
                }
                // A cut connection.
                Err(_) => return Read1::End(false),
            }
            let line = std::mem::take(&mut self.line);
            let l = line.trim_end_matches(['\r', '\n']);
            if l.is_empty() {
                if let Some(k) = self.kind.take() {
                    let data = std::mem::take(&mut self.data);
                    let value =
                        serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}"));
                    self.events += 1;
                    return Read1::Event(k, value);
                }
                self.data.clear();
            } else if let Some(v) = l.strip_prefix("event:") {
                self.kind = Some(v.trim().to_string());
            } else if let Some(v) = l.strip_prefix("data:") {
                self.data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
    }

    /// The next result (or other event), which must come within [`BOUND`].
    fn expect(&mut self) -> (String, Json) {
        match self.next(BOUND) {
            Read1::Event(k, v) => (k, v),
            other => panic!("expected an event within {BOUND:?}, got {other:?}"),
        }
    }

    /// The `added` events of the snapshot, up to `ready`.
    fn snapshot(&mut self) -> Vec<Json> {
        let mut rows = Vec::new();
        loop {
            match self.expect() {
                (k, v) if k == "added" => rows.push(v),
                (k, v) if k == "ready" => {
                    assert_eq!(v, json!({}));
                    return rows;
                }
                other => panic!("unexpected {other:?} before ready"),
            }
        }
    }
}

fn agent(token: Option<&str>) -> (ureq::Agent, Option<String>) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    (agent, token.map(|t| format!("Bearer {t}")))
}

fn post_json(url: &str, path: &str, body: &Json, token: Option<&str>) -> Json {
    let (agent, auth) = agent(token);
    let mut req = agent
        .post(format!("{url}{path}"))
        .header("content-type", "application/json");
    if let Some(a) = &auth {
        req = req.header("authorization", a);
    }
    let mut r = req.send(body.to_string()).unwrap();
    assert_eq!(r.status(), 200, "{path}");
    serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
}

fn info(url: &str, token: Option<&str>) -> Json {
    let (agent, auth) = agent(token);
    let mut req = agent.get(format!("{url}/v1/info"));
    if let Some(a) = &auth {
        req = req.header("authorization", a);
    }
    let mut r = req.call().unwrap();
    serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
}

/// The query's results as `POST /v1/query` answers them.
fn query_results(url: &str, shop: &Fact, token: Option<&str>) -> Vec<Json> {
    let body = json!({"query": QUERY, "givens": {"s": shop.hash().to_string()}});
    let answer = post_json(url, "/v1/query", &body, token);
    answer["results"].as_array().unwrap().clone()
}

fn fact_json(f: &Fact) -> Json {
    serde_json::from_str(&precedent::json::to_json(f).to_string()).unwrap()
}

fn shipment(order: &Fact, carrier: &str) -> Fact {
    Fact::builder("Shop.Shipment")
        .field("carrier", carrier)
        .predecessor("order", order.hash())
        .build()
        .unwrap()
}

fn cancel(order: &Fact) -> Fact {
    Fact::builder("Shop.Cancel")
        .predecessor("order", order.hash())
        .build()
        .unwrap()
}

/// The next `change` event whose `seq` is at least `seq`, checked against `/v1/info`
/// read after it.
fn change_through(events: &mut Stream, url: &str, seq: i64) -> Json {
    loop {
        let (k, v) = events.expect();
        assert_eq!(k, "change", "{v}");
        if v["seq"].as_i64().unwrap() >= seq {
            let i = info(url, None);
            assert_eq!(
                (&v["seq"], &v["facts"], &v["held"]),
                (&i["max_seq"], &i["count"], &i["held"]),
                "the change event's figures are /v1/info's"
            );
            return v;
        }
    }
}

#[test]
fn a_watch_streams_its_snapshot_then_additions_updates_and_removals() {
    let db = Db::init();
    let shop = common::shop::shop("corner");
    let orders: Vec<Fact> = (1..=3)
        .map(|id| common::shop::order(&shop, "id", id))
        .collect();
    db.store()
        .insert_batch(vec![shop.clone(), orders[0].clone(), orders[1].clone()])
        .unwrap();
    let server = Server::start(&db.path);
    let url = server.url.clone();
    let s = shop.hash().to_string();

    let mut watch = Stream::open(&url, &watch_path(QUERY, &[("s", s.clone())]), None);
    assert_eq!(watch.status, 200);
    assert_eq!(watch.header("content-type"), Some("text/event-stream"));
    let mut events = Stream::open(&url, "/v1/events", None);
    assert_eq!(events.status, 200);
    // The snapshot is the query's results, in its order.
    let before = query_results(&url, &shop, None);
    assert_eq!(before.len(), 2);
    assert_eq!(watch.snapshot(), before);

    // A push over HTTP: an addition.
    let pushed = post_json(&url, "/v1/facts", &json!([fact_json(&orders[2])]), None);
    assert_eq!(pushed["released"], 1, "{pushed}");
    let (k, v) = watch.expect();
    assert_eq!(
        (k.as_str(), &v),
        ("added", &json!({"id": 3, "carriers": []}))
    );
    let seq = info(&url, None)["max_seq"].as_i64().unwrap();
    change_through(&mut events, &url, seq);

    // `precedent add` in another process: an update (text that looks like HTML stays
    // text in the JSON of the event), then a removal.
    let carrier = "<script>alert(\"x\")</script>";
    let added = shipment(&orders[0], carrier);
    run_ok(&db.path, &["add", &fact_json(&added).to_string()], b"");
    let (k, v) = watch.expect();
    assert_eq!(
        (k.as_str(), &v),
        ("updated", &json!({"id": 1, "carriers": [carrier]}))
    );
    let seq2 = info(&url, None)["max_seq"].as_i64().unwrap();
    assert!(seq2 > seq);
    change_through(&mut events, &url, seq2);

    run_ok(
        &db.path,
        &["add", &fact_json(&cancel(&orders[1])).to_string()],
        b"",
    );
    let (k, v) = watch.expect();
    assert_eq!(
        (k.as_str(), &v),
        ("removed", &json!({"id": 2, "carriers": []}))
    );
    // What the watch shows is what the query answers now.
    assert_eq!(
        query_results(&url, &shop, None),
        vec![
            json!({"id": 1, "carriers": [carrier]}),
            json!({"id": 3, "carriers": []})
        ]
    );
    // Nothing else was sent.
    assert_eq!(watch.next(Duration::from_millis(300)), Read1::Timeout);
}

#[test]
fn clients_of_one_query_share_its_events_and_a_late_client_gets_the_results_of_then() {
    let db = Db::init();
    let shop = common::shop::shop("corner");
    let orders: Vec<Fact> = (1..=4)
        .map(|id| common::shop::order(&shop, "id", id))
        .collect();
    db.store()
        .insert_batch(vec![shop.clone(), orders[0].clone()])
        .unwrap();
    let server = Server::start(&db.path);
    let url = server.url.clone();
    let path = watch_path(QUERY, &[("s", shop.hash().to_string())]);
    let mut a = Stream::open(&url, &path, None);
    let mut b = Stream::open(&url, &path, None);
    let first = vec![json!({"id": 1, "carriers": []})];
    assert_eq!(a.snapshot(), first);
    assert_eq!(b.snapshot(), first);
    post_json(&url, "/v1/facts", &json!([fact_json(&orders[1])]), None);
    let added = ("added".to_string(), json!({"id": 2, "carriers": []}));
    assert_eq!(a.expect(), added);
    assert_eq!(b.expect(), added);
    let carrier = "north";
    post_json(
        &url,
        "/v1/facts",
        &json!([
            fact_json(&shipment(&orders[0], carrier)),
            fact_json(&cancel(&orders[1]))
        ]),
        None,
    );
    // A client joining now sees the results of now, then what changes after.
    let mut late = Stream::open(&url, &path, None);
    let now = late.snapshot();
    assert_eq!(now, query_results(&url, &shop, None));
    assert_eq!(now, vec![json!({"id": 1, "carriers": [carrier]})]);
    let changes: Vec<(String, Json)> = vec![a.expect(), a.expect()];
    assert_eq!(vec![b.expect(), b.expect()], changes);
    post_json(&url, "/v1/facts", &json!([fact_json(&orders[2])]), None);
    let added = ("added".to_string(), json!({"id": 3, "carriers": []}));
    for s in [&mut a, &mut b, &mut late] {
        assert_eq!(s.expect(), added);
    }
    // When every client has left, a new one still gets the results.
    drop((a, b, late));
    std::thread::sleep(Duration::from_millis(300));
    post_json(&url, "/v1/facts", &json!([fact_json(&orders[3])]), None);
    let mut again = Stream::open(&url, &path, None);
    let now = again.snapshot();
    assert_eq!(now, query_results(&url, &shop, None));
    assert_eq!(now.len(), 3);
}

/// The ids of a watch's snapshot (results that are ids), sorted.
fn snapshot_ids(s: &mut Stream) -> Vec<u64> {
    let mut ids: Vec<u64> = s.snapshot().iter().map(|v| v.as_u64().unwrap()).collect();
    ids.sort_unstable();
    ids
}

/// Reads a client that joined while `all` (ids, in release order) were being written:
/// its snapshot must be the ones written when it joined, then each later one comes once,
/// in order. Returns how many the snapshot held.
fn joined_then_each_once(s: &mut Stream, all: &[u64]) -> usize {
    let snapshot = snapshot_ids(s);
    let k = snapshot.len();
    assert_eq!(snapshot, all[..k], "the results of when it joined");
    let rest: Vec<(String, Json)> = (k..all.len()).map(|_| s.expect()).collect();
    assert_eq!(added_ids(&rest), all[k..], "then each later one once");
    k
}

/// The ids of `rows`, each `added`.
fn added_ids(rows: &[(String, Json)]) -> Vec<u64> {
    rows.iter()
        .map(|(k, v)| {
            assert_eq!(k, "added", "{v}");
            v.as_u64().unwrap()
        })
        .collect()
}

#[test]
fn batched_events_carry_every_result_once_and_in_order() {
    const PUSHES: u64 = 10;
    const PER_PUSH: u64 = 200;
    let db = Db::init();
    let shop = common::shop::shop("corner");
    db.store().insert(&shop).unwrap();
    let server = Server::start(&db.path);
    let url = server.url.clone();
    let query = "given s: Shop match o: Shop.Order where o->shop = s \
        and not exists (match c: Shop.Cancel where c->order = o) select o.id";
    let path = watch_path(query, &[("s", shop.hash().to_string())]);
    let orders: Vec<Fact> = (0..PUSHES * PER_PUSH + PER_PUSH)
        .map(|id| common::shop::order(&shop, "id", id as i64))
        .collect();
    let push = |facts: &[Fact]| {
        let body: Vec<Json> = facts.iter().map(fact_json).collect();
        let pushed = post_json(&url, "/v1/facts", &json!(body), None);
        assert_eq!(pushed["released"], facts.len(), "{pushed}");
    };
    let mut early = Stream::open(&url, &path, None);
    assert_eq!(early.snapshot(), Vec::<Json>::new());
    let events_before = early.events;
    // Pushes one after the other, without waiting for the watch; a client joins halfway.
    let mut late = None;
    for (i, chunk) in orders[..(PUSHES * PER_PUSH) as usize]
        .chunks(PER_PUSH as usize)
        .enumerate()
    {
        push(chunk);
        if i as u64 == PUSHES / 2 {
            late = Some(Stream::open(&url, &path, None));
        }
    }
    let all: Vec<u64> = (0..PUSHES * PER_PUSH).collect();
    let got: Vec<(String, Json)> = (0..all.len()).map(|_| early.expect()).collect();
    assert_eq!(added_ids(&got), all, "every result once, in release order");
    // A push commits at once and a poll reads whole commits, so a push's results come in
    // one event at most: the changes of a poll are one event, not one per result.
    let events = early.events - events_before;
    assert!(
        (1..=PUSHES as usize).contains(&events),
        "{} results came in {events} events",
        all.len()
    );
    // The late client: the results of when it joined, then each later one once, in order.
    let mut late = late.unwrap();
    let k = joined_then_each_once(&mut late, &all);
    assert!(
        k as u64 >= (PUSHES / 2 + 1) * PER_PUSH,
        "{k} results in the snapshot"
    );

    // One push that cancels 50 orders and adds 50: a `removed` event and an `added` event,
    // each result once.
    let mut mixed: Vec<Fact> = orders[..50].iter().map(cancel).collect();
    let fresh = &orders[(PUSHES * PER_PUSH) as usize..][..50];
    mixed.extend(fresh.iter().cloned());
    push(&mixed);
    for s in [&mut early, &mut late] {
        let before = s.events;
        let mut got: Vec<(String, u64)> = (0..100)
            .map(|_| {
                let (k, v) = s.expect();
                (k, v.as_u64().unwrap())
            })
            .collect();
        assert_eq!(s.events - before, 2, "{got:?}");
        got.sort();
        let mut want: Vec<(String, u64)> = (0..50)
            .map(|i| ("removed".to_string(), i))
            .chain((0..50).map(|i| ("added".to_string(), PUSHES * PER_PUSH + i)))
            .collect();
        want.sort();
        assert_eq!(got, want);
        // Nothing else: no result sent twice.
        assert_eq!(s.next(Duration::from_millis(300)), Read1::Timeout);
    }
}

#[test]
fn a_feed_keeps_no_results_yet_late_clients_get_each_result_once() {
    // No exists, no limit, no collection: results are only added, so the shared watch
    // keeps none of them and a client joining reads its snapshot from the database.
    const PUSHES: u64 = 10;
    const PER_PUSH: u64 = 100;
    let db = Db::init();
    let shop = common::shop::shop("corner");
    let orders: Vec<Fact> = (0..PUSHES * PER_PUSH)
        .map(|id| common::shop::order(&shop, "id", id as i64))
        .collect();
    db.store()
        .insert_batch(vec![shop.clone(), orders[0].clone()])
        .unwrap();
    let server = Server::start(&db.path);
    let url = server.url.clone();
    let query = "given s: Shop match o: Shop.Order where o->shop = s select o.id";
    let path = watch_path(query, &[("s", shop.hash().to_string())]);
    let mut early = Stream::open(&url, &path, None);
    assert_eq!(early.snapshot(), vec![json!(0)]);
    // Clients join between pushes that the watch has not polled yet.
    let mut late = Vec::new();
    for (i, chunk) in orders[1..].chunks(PER_PUSH as usize).enumerate() {
        let body: Vec<Json> = chunk.iter().map(fact_json).collect();
        let pushed = post_json(&url, "/v1/facts", &json!(body), None);
        assert_eq!(pushed["released"], chunk.len(), "{pushed}");
        if i % 3 == 1 {
            late.push(Stream::open(&url, &path, None));
        }
    }
    let all: Vec<u64> = (0..PUSHES * PER_PUSH).collect();
    let got: Vec<(String, Json)> = (1..all.len()).map(|_| early.expect()).collect();
    assert_eq!(
        added_ids(&got),
        all[1..],
        "every result once, in release order"
    );
    assert!(late.len() >= 3);
    for s in &mut late {
        let k = joined_then_each_once(s, &all);
        assert!(k > 1, "{k} results in the snapshot");
    }
    // Written by another process (the command line), seen by every client once.
    let extra = common::shop::order(&shop, "id", 5_000);
    run_ok(&db.path, &["add"], fact_json(&extra).to_string().as_bytes());
    let mut again = Stream::open(&url, &path, None);
    // Joining polls first: the snapshot is of now, the fact included.
    let want: Vec<u64> = all.iter().copied().chain([5_000]).collect();
    assert_eq!(snapshot_ids(&mut again), want);
    // Next for every client, so no earlier result was sent twice; then nothing else.
    for s in std::iter::once(&mut early).chain(&mut late) {
        assert_eq!(s.expect(), ("added".to_string(), json!(5_000)));
        assert_eq!(s.next(Duration::from_millis(300)), Read1::Timeout);
    }
}

#[test]
fn watch_and_events_need_read_and_bad_requests_are_400_naming_what() {
    let db = Db::init();
    let shop = common::shop::shop("corner");
    db.store().insert(&shop).unwrap();
    let tokens = db.path.with_extension("tokens.json");
    std::fs::write(
        &tokens,
        json!({"tokens": [
            {"name": "reader", "token": "r-secret", "read": true},
            {"name": "writer", "token": "w-secret", "write": true},
        ]})
        .to_string(),
    )
    .unwrap();
    let server = Server::start_with(
        &db.path,
        &[
            "--listen",
            "127.0.0.1:0",
            "--tokens",
            tokens.to_str().unwrap(),
        ],
    );
    let url = server.url.clone();
    let good = watch_path(QUERY, &[("s", shop.hash().to_string())]);
    for path in [good.as_str(), "/v1/events"] {
        let none = Stream::open(&url, path, None);
        assert_eq!(none.status, 401, "{path}");
        assert_eq!(none.error()["error"], "unauthorized");
        let writer = Stream::open(&url, path, Some("w-secret"));
        assert_eq!(writer.status, 403, "{path}");
        assert_eq!(writer.error()["error"], "forbidden");
        let reader = Stream::open(&url, path, Some("r-secret"));
        assert_eq!(reader.status, 200, "{path}");
    }
    let mut reader = Stream::open(&url, &good, Some("r-secret"));
    assert_eq!(reader.snapshot(), Vec::<Json>::new());

    let bad = |path: String| {
        let s = Stream::open(&url, &path, Some("r-secret"));
        assert_eq!(s.status, 400, "{path}");
        s.error()
    };
    let e = bad(watch_path("match o: Shop.Order\nselec o", &[]));
    assert_eq!(e["error"], "bad_query", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("line 2, column"),
        "{e}"
    );
    let e = bad(watch_path(QUERY, &[]));
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("given s is not bound"),
        "{e}"
    );
    let e = bad(watch_path(QUERY, &[("s", "abc".into())]));
    assert!(e["message"].as_str().unwrap().contains("given s"), "{e}");
    let e = bad(watch_path(
        QUERY,
        &[
            ("s", shop.hash().to_string()),
            ("t", shop.hash().to_string()),
        ],
    ));
    assert!(e["message"].as_str().unwrap().contains("no given t"), "{e}");
    let e = bad("/v1/watch".into());
    assert!(
        e["message"].as_str().unwrap().contains("query is missing"),
        "{e}"
    );
    // A given of another type than the query declares.
    let order = common::shop::order(&shop, "id", 1);
    db.store().insert(&order).unwrap();
    let e = bad(watch_path(QUERY, &[("s", order.hash().to_string())]));
    assert!(e["message"].as_str().unwrap().contains("Shop"), "{e}");
}

#[test]
fn a_watch_client_that_stops_reading_is_disconnected_and_others_get_everything() {
    const FACTS: usize = 3000;
    let db = Db::init();
    let shop = common::shop::shop("corner");
    db.store().insert(&shop).unwrap();
    let server = Server::start_with(&db.path, &["--listen", "127.0.0.1:0", "--sse-stall", "1s"]);
    let url = server.url.clone();
    let query = "given s: Shop match o: Shop.Order where o->shop = s select {id: o.id, pad: o.pad}";
    let path = watch_path(query, &[("s", shop.hash().to_string())]);
    let mut slow = Stream::open(&url, &path, None);
    let mut reader = Stream::open(&url, &path, None);
    assert_eq!(reader.snapshot(), Vec::<Json>::new());
    // The reader reads as the facts come.
    let reading = std::thread::spawn(move || {
        for i in 0..FACTS {
            let (k, v) = reader.expect();
            assert_eq!((k.as_str(), v["id"].as_u64()), ("added", Some(i as u64)));
        }
    });
    // About 24 MB of events, far more than the socket buffers and the watch's channel.
    let pad = "p".repeat(8000);
    for chunk in (0..FACTS).collect::<Vec<_>>().chunks(500) {
        let facts: Vec<Json> = chunk
            .iter()
            .map(|&i| {
                let f = Fact::builder("Shop.Order")
                    .field("id", i as i64)
                    .field("pad", pad.as_str())
                    .predecessor("shop", shop.hash())
                    .build()
                    .unwrap();
                fact_json(&f)
            })
            .collect();
        post_json(&url, "/v1/facts", &json!(facts), None);
    }
    reading.join().unwrap();
    // Long past the stall limit, the slow client reads what was buffered for it, then the
    // connection ends: the server stopped writing to it rather than keep its events.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(slow.snapshot(), Vec::<Json>::new());
    let mut got = 0;
    let until = Instant::now() + BOUND;
    loop {
        match slow.next(BOUND) {
            Read1::Event(k, _) => {
                assert_eq!(k, "added");
                got += 1;
            }
            Read1::End(clean) => {
                assert!(!clean, "the stalled client's stream ended as if complete");
                break;
            }
            Read1::Timeout => panic!("the stalled client was not disconnected ({got} results)"),
        }
        assert!(
            Instant::now() < until,
            "reading the stalled client's events took too long"
        );
    }
    assert!(got < FACTS, "the stalled client got all {got} results");
    // The server goes on serving: a new watch gets every result.
    let mut again = Stream::open(&url, &path, None);
    assert_eq!(again.snapshot().len(), FACTS);
}

/// A snapshot larger than the limit on how far a client may fall behind (16,384 results)
/// is not counted against it: a client that joins and reads it at its own pace gets all
/// of it, then the changes.
#[test]
fn a_watch_snapshot_over_the_behind_limit_is_read_in_full() {
    const ORDERS: i64 = 20_000;
    let db = Db::init();
    let shop = common::shop::shop("corner");
    // About 40 MB of results: more than the socket buffers take while the client waits.
    let pad = "p".repeat(2000);
    let order = |id: i64| {
        Fact::builder("Shop.Order")
            .field("id", id)
            .field("pad", pad.as_str())
            .predecessor("shop", shop.hash())
            .build()
            .unwrap()
    };
    let mut facts = vec![shop.clone()];
    facts.extend((0..ORDERS).map(order));
    db.store().insert_batch(facts).unwrap();
    let server = Server::start(&db.path);
    let url = server.url.clone();
    let query = "given s: Shop match o: Shop.Order where o->shop = s select {id: o.id, pad: o.pad}";
    let mut watch = Stream::open(
        &url,
        &watch_path(query, &[("s", shop.hash().to_string())]),
        None,
    );
    assert_eq!(watch.status, 200);
    // The shared watch polls every 50 ms while the client has not read yet.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(watch.snapshot().len(), ORDERS as usize);
    post_json(&url, "/v1/facts", &json!([fact_json(&order(ORDERS))]), None);
    let (k, v) = watch.expect();
    assert_eq!((k.as_str(), v["id"].as_i64()), ("added", Some(ORDERS)));
}

#[test]
fn on_postgres_a_push_to_another_server_reaches_this_server_s_watchers() {
    let Some(pg) = common::pg::db() else { return };
    let url_db = Path::new(&pg.url);
    let shop = common::shop::shop("corner");
    let order = common::shop::order(&shop, "id", 1);
    Store::open(&pg.url).unwrap().insert(&shop).unwrap();
    // Server a looks for new facts only when woken: within the bound, only the
    // notification of server b's commit can wake it.
    let a = Server::start_with(
        url_db,
        &["--listen", "127.0.0.1:0", "--poll-interval", "1h"],
    );
    let b = Server::start(url_db);
    let mut watch = Stream::open(
        &a.url,
        &watch_path(QUERY, &[("s", shop.hash().to_string())]),
        None,
    );
    let mut events = Stream::open(&a.url, "/v1/events", None);
    assert_eq!(watch.snapshot(), Vec::<Json>::new());
    // A moment for server a's listener to be listening: a push before that is still
    // found, by the poll, and the test proves less.
    std::thread::sleep(Duration::from_millis(500));
    post_json(&b.url, "/v1/facts", &json!([fact_json(&order)]), None);
    let (k, v) = watch.expect();
    assert_eq!(
        (k.as_str(), &v),
        ("added", &json!({"id": 1, "carriers": []}))
    );
    let seq = info(&b.url, None)["max_seq"].as_i64().unwrap();
    change_through(&mut events, &a.url, seq);
}

/// On PostgreSQL a server that no client watches opens no listener, so that the commits
/// of every process on the database do not wake it; its first `/v1/events` client starts
/// one, and is told of a commit made through another server (the server polls hourly, so
/// only the notification can tell it).
#[test]
fn on_postgres_a_server_listens_only_once_a_client_watches() {
    let Some(pg) = common::pg::db() else { return };
    let url_db = Path::new(&pg.url);
    let a = Server::start_with(
        url_db,
        &["--listen", "127.0.0.1:0", "--poll-interval", "1h"],
    );
    let b = Server::start(url_db);
    let listeners = || {
        pg.psql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND query = 'LISTEN precedent_released'",
        )
        .trim()
        .to_string()
    };
    let shop = common::shop::shop("corner");
    post_json(&a.url, "/v1/facts", &json!([fact_json(&shop)]), None);
    let first = common::shop::order(&shop, "id", 1);
    post_json(&b.url, "/v1/facts", &json!([fact_json(&first)]), None);
    // A second of commits through both, and no listener from either.
    for _ in 0..10 {
        assert_eq!(listeners(), "0", "a server with no client listens");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut events = Stream::open(&a.url, "/v1/events", None);
    assert_eq!(events.status, 200);
    let deadline = Instant::now() + BOUND;
    while listeners() != "1" {
        assert!(
            Instant::now() < deadline,
            "server a did not listen for its client"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = common::shop::order(&shop, "id", 2);
    post_json(&b.url, "/v1/facts", &json!([fact_json(&second)]), None);
    let seq = info(&b.url, None)["max_seq"].as_i64().unwrap();
    change_through(&mut events, &a.url, seq);
}

/// The test's own reader resumes after a read that timed out anywhere in the framing:
/// inside a chunk's size line, between a chunk's bytes and its CRLF, and inside an event
/// line. A server writes one event in pieces with pauses longer than the read timeout.
#[test]
fn the_event_reader_resumes_after_timeouts_anywhere_in_the_framing() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let event = "event: added\ndata: [{\"n\": 1}]\n\n";
    let (a, b) = event.split_at(12); // inside "data: ..."
    let pieces: Vec<Vec<u8>> = vec![
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec(),
        format!("{:x}", a.len()).into_bytes()[..1].to_vec(), // half of the size line
        format!("{:x}", a.len()).into_bytes()[1..].to_vec(),
        format!("\r\n{a}").into_bytes(), // the chunk's bytes, not its CRLF
        format!("\r\n{:x}\r\n{b}\r\n", b.len()).into_bytes(),
        b"0\r\n\r\n".to_vec(),
    ];
    let server = std::thread::spawn(move || {
        let (mut tcp, _) = listener.accept().unwrap();
        let mut request = [0u8; 1024];
        let _ = tcp.read(&mut request).unwrap();
        for p in pieces {
            tcp.write_all(&p).unwrap();
            tcp.flush().unwrap();
            std::thread::sleep(Duration::from_millis(150));
        }
    });
    let mut s = Stream::open(&url, "/v1/watch", None);
    assert_eq!(s.status, 200);
    let mut timeouts = 0;
    let got = loop {
        match s.next(Duration::from_millis(40)) {
            Read1::Timeout if timeouts < 100 => timeouts += 1,
            other => break other,
        }
    };
    assert!(
        timeouts >= 3,
        "the reads should have timed out between pieces: {timeouts}"
    );
    match got {
        Read1::Event(k, v) => assert_eq!((k.as_str(), v), ("added", json!({"n": 1}))),
        other => panic!("expected the event, got {other:?}"),
    }
    assert!(matches!(s.next(BOUND), Read1::End(true)));
    server.join().unwrap();
}

//! Helpers for the sync tests: nodes with a database and a server, fact trees, raw HTTP,
//! a fake server, and a fault-injecting TCP proxy.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use precedent::sync::auth::{Grant, Tokens};
use precedent::sync::client::{Client, ClientOptions, SyncOptions};
use precedent::sync::server::{Running, ServerConfig};
use precedent::{Fact, FactHash, Store};

use crate::common::backend::{Backend, TestDb};

pub const CBOR: &str = "application/cbor-seq";
pub const JSON_CT: &str = "application/json";

/// A node: a database file in a temporary directory, or a PostgreSQL database (then the
/// directory holds only what a test puts there, such as certificates).
pub struct Node {
    pub dir: tempfile::TempDir,
    /// The SQLite file's path or the PostgreSQL URL.
    pub db: PathBuf,
    _pg: Option<TestDb>,
}

impl Node {
    /// A node on SQLite.
    pub fn new() -> Node {
        Node::on(Backend::Sqlite)
    }

    /// A node on backend `b`, its database created.
    pub fn on(b: Backend) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let (db, pg) = match b {
            Backend::Sqlite => (dir.path().join("node.db"), None),
            Backend::Postgres => {
                let pg = b.db();
                (pg.location.clone(), Some(pg))
            }
        };
        Store::open(&db).unwrap();
        Node { dir, db, _pg: pg }
    }

    pub fn store(&self) -> Store {
        Store::open(&self.db).unwrap()
    }

    pub fn serve(&self) -> Running {
        self.serve_with(|_| {})
    }

    pub fn serve_with(&self, tweak: impl FnOnce(&mut ServerConfig)) -> Running {
        let mut c = ServerConfig::new(&self.db);
        c.listen = "127.0.0.1:0".parse().unwrap();
        tweak(&mut c);
        Running::start(c).unwrap()
    }
}

/// `n` facts of type `t` below `root`: each names the root or an earlier one of them.
pub fn tree(t: &str, root: &Fact, n: usize) -> Vec<Fact> {
    let mut out: Vec<Fact> = Vec::with_capacity(n);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ n as u64 ^ t.len() as u64;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut preds = vec![root.hash()];
        if i > 0 {
            preds.push(out[(x as usize) % i].hash());
        }
        if i > 1 && x.is_multiple_of(3) {
            preds.push(out[(x as usize >> 8) % i].hash());
        }
        let mut b = Fact::builder(t).field("n", i as i64);
        for (k, p) in preds.iter().enumerate() {
            b = b.predecessor(if k == 0 { "root" } else { "prev" }, *p);
        }
        out.push(b.build().unwrap());
    }
    out
}

pub fn hashes(store: &Store) -> BTreeSet<FactHash> {
    let mut out = BTreeSet::new();
    store
        .for_each_released(0, |_, h, _| {
            out.insert(h);
            Ok(())
        })
        .unwrap();
    out
}

/// Same released set everywhere, nothing held, verify clean, topological release order.
pub fn assert_converged(nodes: &[&Node]) {
    let first = hashes(&nodes[0].store());
    for (i, n) in nodes.iter().enumerate() {
        let s = n.store();
        assert_eq!(hashes(&s), first, "node {i} differs from node 0");
        assert_eq!(s.held_count().unwrap(), 0, "node {i} holds facts");
        let v = s.verify(|_| {}).unwrap();
        assert!(v.is_clean(), "node {i}: {:?}", v.problems);
        crate::common::assert_topological(&s);
    }
}

/// One full sync (pull, fetch, push) of `node` with the server at `url`.
pub fn sync_pair(node: &Node, url: &str) {
    let client = Client::new(url, ClientOptions::default()).unwrap();
    let r = client
        .sync(&node.store(), &SyncOptions::default(), &mut |_| {})
        .unwrap();
    assert_eq!(r.quarantined, 0);
}

/// One raw HTTP/1.1 request; the status and the body as JSON (Null if not JSON).
pub fn http(
    server: &Running,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    let (status, body) = raw_http(server.addr(), method, path, content_type, body, token);
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

pub fn get_text(server: &Running, path: &str, token: Option<&str>) -> String {
    let (status, body) = raw_http(server.addr(), "GET", path, "", b"", token);
    assert_eq!(status, 200);
    String::from_utf8(body).unwrap()
}

pub fn raw_http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
    token: Option<&str>,
) -> (u16, Vec<u8>) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = Vec::new();
    if !content_type.is_empty() {
        headers.push(("content-type", content_type));
    }
    if let Some(a) = &auth {
        headers.push(("authorization", a.as_str()));
    }
    let (status, _, body) = raw_http_with(addr, method, path, &headers, body);
    (status, body)
}

/// One raw HTTP/1.1 request with the given headers: the status, the response head
/// (lowercased) and the body (de-chunked).
pub fn raw_http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    s.write_all(head.as_bytes()).unwrap();
    // The server may answer (413) before reading a large body; ignore a reset while sending.
    let _ = s.write_all(body);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head: {:?}", String::from_utf8_lossy(&buf)));
    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
    let status = head[9..12].parse().unwrap();
    let mut body = buf[end + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    (status, head, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

/// A server that answers every request with bytes of the test's choosing.
pub struct FakeServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl FakeServer {
    pub fn start(answer: impl Fn(&str) -> Vec<u8> + Send + 'static) -> FakeServer {
        let (addr, stop) = accept_each(move |mut conn| {
            let req = read_request(&mut conn);
            let _ = conn.write_all(&answer(&req));
            let _ = conn.shutdown(Shutdown::Both);
        });
        FakeServer { addr, stop }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Reads a request head and its content-length body; returns the head as text.
fn read_request(conn: &mut TcpStream) -> String {
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = conn.read(&mut chunk).unwrap_or(0);
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len: usize = head
                .to_lowercase()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = conn.read(&mut chunk).unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return head;
        }
    }
    String::new()
}

/// A TCP proxy that, per connection and at random: cuts the stream in either direction
/// after some bytes, delays chunks, and replays the client's bytes to the server on a
/// second connection after the first ends (duplicated requests).
///
/// [`FaultyProxy::partition`] cuts the link whole until [`FaultyProxy::heal`]: every open
/// connection is shut down and new ones are closed as soon as they are accepted.
pub struct FaultyProxy {
    addr: SocketAddr,
    duplicated: Arc<AtomicU64>,
    cuts: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    links: Arc<Links>,
}

/// The proxy's open client connections (by number), and whether the link is cut.
#[derive(Default)]
struct Links {
    cut: AtomicBool,
    open: std::sync::Mutex<std::collections::HashMap<u64, TcpStream>>,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

impl FaultyProxy {
    pub fn start(upstream: SocketAddr, seed: u64) -> FaultyProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let duplicated = Arc::new(AtomicU64::new(0));
        let cuts = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let links = Arc::new(Links::default());
        let (dup, stop2, links2) = (duplicated.clone(), stop.clone(), links.clone());
        let cuts2 = cuts.clone();
        std::thread::spawn(move || {
            let mut rng = Rng(seed | 1);
            for (n, conn) in listener.incoming().enumerate() {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = conn else { continue };
                if links2.cut.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let n = n as u64;
                if let Ok(c) = client.try_clone() {
                    links2.open.lock().unwrap().insert(n, c);
                }
                // Fault plan for this connection.
                let cut_down = (rng.below(2) == 0).then(|| rng.below(30_000));
                let cut_up = (rng.below(8) == 0).then(|| rng.below(4_000));
                let delay = rng.below(4) == 0;
                let duplicate = rng.below(2) == 0;
                let seed = rng.next();
                let (dup, links, cuts) = (dup.clone(), links2.clone(), cuts2.clone());
                std::thread::spawn(move || {
                    let faults = Faults {
                        cut_up,
                        cut_down,
                        delay,
                        duplicate,
                        seed,
                    };
                    relay(client, server, upstream, faults, &dup, &cuts);
                    links.open.lock().unwrap().remove(&n);
                });
            }
        });
        FaultyProxy {
            addr,
            duplicated,
            cuts,
            stop,
            links,
        }
    }

    /// Cuts the link: open connections are shut down, new ones closed at once.
    pub fn partition(&self) {
        self.links.cut.store(true, Ordering::SeqCst);
        for (_, c) in self.links.open.lock().unwrap().drain() {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Ends a [`FaultyProxy::partition`]: connections are relayed (with faults) again.
    pub fn heal(&self) {
        self.links.cut.store(false, Ordering::SeqCst);
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn duplicated(&self) -> u64 {
        self.duplicated.load(Ordering::Relaxed)
    }

    /// Streams cut with bytes still to pass: requests or answers that ended early.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::Relaxed)
    }
}

impl Drop for FaultyProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// The fault plan of one connection of a [`FaultyProxy`].
struct Faults {
    cut_up: Option<u64>,
    cut_down: Option<u64>,
    delay: bool,
    duplicate: bool,
    seed: u64,
}

fn relay(
    client: TcpStream,
    server: TcpStream,
    upstream: SocketAddr,
    f: Faults,
    dup: &AtomicU64,
    cuts: &Arc<AtomicU64>,
) {
    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let (seed, cut_up, cuts2) = (f.seed, f.cut_up, cuts.clone());
    let up = std::thread::spawn(move || pump(c2, s2, cut_up, false, seed, true, &cuts2));
    pump(
        server,
        client,
        f.cut_down,
        f.delay,
        f.seed ^ 0xFF,
        false,
        cuts,
    );
    let sent = up.join().unwrap_or_default();
    if f.duplicate
        && !sent.is_empty()
        && let Ok(mut again) = TcpStream::connect(upstream)
    {
        {
            dup.fetch_add(1, Ordering::Relaxed);
            let _ = again.write_all(&sent);
            let _ = again.shutdown(Shutdown::Write);
            let _ = again.set_read_timeout(Some(Duration::from_secs(10)));
            let mut sink = Vec::new();
            let _ = again.read_to_end(&mut sink);
        }
    }
}

/// Copies `from` to `to` until either side closes or `cut` bytes have passed (counted in
/// `cuts` when bytes were left); returns what was copied when `record` is set.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    cut: Option<u64>,
    delay: bool,
    seed: u64,
    record: bool,
    cuts: &AtomicU64,
) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let mut seen = Vec::new();
    let mut passed = 0u64;
    let mut buf = [0u8; 8192];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut n = n as u64;
        if let Some(c) = cut
            && passed + n > c
        {
            n = c - passed;
            let _ = to.write_all(&buf[..n as usize]);
            cuts.fetch_add(1, Ordering::Relaxed);
            break;
        }
        if delay && rng.below(4) == 0 {
            std::thread::sleep(Duration::from_millis(rng.below(5)));
        }
        if to.write_all(&buf[..n as usize]).is_err() {
            break;
        }
        if record {
            seen.extend_from_slice(&buf[..n as usize]);
        }
        passed += n;
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
    seen
}

/// Three grants: `writer` (w-secret) reads and writes, `reader` (r-secret) only reads,
/// `shops-only` (s-secret) writes facts of type Shop and reads nothing.
pub fn tokens() -> Tokens {
    Tokens::new(vec![
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
            name: "reader".into(),
            token: "r-secret".into(),
            read: true,
            write: false,
            types: None,
            work: Default::default(),
            admin: false,
        },
        Grant {
            name: "shops-only".into(),
            token: "s-secret".into(),
            read: false,
            write: true,
            types: Some(vec!["Shop".into()]),
            work: Default::default(),
            admin: false,
        },
    ])
    .unwrap()
}

/// A TCP proxy that is a slow link: it carries at most `up` bytes a second from the
/// clients to the server and `down` bytes a second back, over all its connections
/// together, and otherwise relays faithfully.
pub struct SlowProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

/// One direction of a [`SlowProxy`]: its rate, and when the link is next free.
struct Pipe {
    rate: u64,
    free_at: std::sync::Mutex<std::time::Instant>,
}

impl Pipe {
    fn new(rate: u64) -> Arc<Pipe> {
        Arc::new(Pipe {
            rate: rate.max(1),
            free_at: std::sync::Mutex::new(std::time::Instant::now()),
        })
    }

    /// Waits until `n` more bytes have crossed the link.
    fn carry(&self, n: usize) {
        let done = {
            let mut free = self.free_at.lock().unwrap();
            let start = (*free).max(std::time::Instant::now());
            *free = start + Duration::from_secs_f64(n as f64 / self.rate as f64);
            *free
        };
        std::thread::sleep(done.saturating_duration_since(std::time::Instant::now()));
    }
}

impl SlowProxy {
    pub fn start(upstream: SocketAddr, up: u64, down: u64) -> SlowProxy {
        let (up, down) = (Pipe::new(up), Pipe::new(down));
        let (addr, stop) = accept_pairs(upstream, move |client, server| {
            let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (up, down) = (up.clone(), down.clone());
            std::thread::spawn(move || slow_pump(c2, s2, &up));
            std::thread::spawn(move || slow_pump(server, client, &down));
        });
        SlowProxy { addr, stop }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A listener on 127.0.0.1 that hands each connection to `handle`, until the flag it
/// returns is set (and a connection wakes it).
fn accept_each(handle: impl Fn(TcpStream) + Send + 'static) -> (SocketAddr, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if stop2.load(Ordering::Relaxed) {
                return;
            }
            if let Ok(conn) = conn {
                handle(conn);
            }
        }
    });
    (addr, stop)
}

/// [`accept_each`], each client connected to `upstream` and both streams handed to `pair`.
fn accept_pairs(
    upstream: SocketAddr,
    pair: impl Fn(TcpStream, TcpStream) + Send + 'static,
) -> (SocketAddr, Arc<AtomicBool>) {
    accept_each(move |client| {
        if let Ok(server) = TcpStream::connect(upstream) {
            pair(client, server);
        }
    })
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies `from` to `to` at the pace of `pipe`, in small pieces, until either side closes.
fn slow_pump(mut from: TcpStream, mut to: TcpStream, pipe: &Pipe) {
    let mut buf = [0u8; 4096];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pipe.carry(n);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// A TCP proxy that closes a connection on which no byte has passed either way for
/// `idle`, as load balancers and NAT gateways do, and otherwise relays faithfully. It
/// keeps the `limit` of every pull it relays (`GET /v1/facts?...&limit=N`).
pub struct IdleCutProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    cuts: Arc<AtomicU64>,
    limits: Arc<std::sync::Mutex<Vec<u64>>>,
}

impl IdleCutProxy {
    pub fn start(upstream: SocketAddr, idle: Duration) -> IdleCutProxy {
        let cuts = Arc::new(AtomicU64::new(0));
        let limits = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (cuts2, limits2) = (cuts.clone(), limits.clone());
        let (addr, stop) = accept_pairs(upstream, move |client, server| {
            let last = Arc::new(std::sync::Mutex::new(std::time::Instant::now()));
            let closed = Arc::new(AtomicBool::new(false));
            let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let up = (
                last.clone(),
                closed.clone(),
                cuts2.clone(),
                Some(limits2.clone()),
            );
            let down = (last, closed, cuts2.clone(), None);
            std::thread::spawn(move || idle_pump(c2, s2, idle, up));
            std::thread::spawn(move || idle_pump(server, client, idle, down));
        });
        IdleCutProxy {
            addr,
            stop,
            cuts,
            limits,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Connections closed for being idle.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::Relaxed)
    }

    /// The `limit` of each pull relayed, in order.
    pub fn limits(&self) -> Vec<u64> {
        self.limits.lock().unwrap().clone()
    }
}

impl Drop for IdleCutProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// One direction of an [`IdleCutProxy`] connection: the time of the last byte either
/// way, whether the connection is closed, the proxy's cut count, and (client to server)
/// where to keep the pulls' limits.
type IdleSide = (
    Arc<std::sync::Mutex<std::time::Instant>>,
    Arc<AtomicBool>,
    Arc<AtomicU64>,
    Option<Arc<std::sync::Mutex<Vec<u64>>>>,
);

fn idle_pump(mut from: TcpStream, mut to: TcpStream, idle: Duration, side: IdleSide) {
    let (last, closed, cuts, limits) = side;
    from.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let mut buf = [0u8; 8192];
    while !closed.load(Ordering::Relaxed) {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                *last.lock().unwrap() = std::time::Instant::now();
                if let Some(limits) = &limits {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    for line in text.lines().filter(|l| l.starts_with("GET /v1/facts?")) {
                        let limit = line
                            .split(['?', '&', ' '])
                            .find_map(|p| p.strip_prefix("limit="))
                            .and_then(|v| v.parse::<u64>().ok());
                        limits.lock().unwrap().extend(limit);
                    }
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if last.lock().unwrap().elapsed() >= idle {
                    if !closed.swap(true, Ordering::Relaxed) {
                        cuts.fetch_add(1, Ordering::Relaxed);
                    }
                    break;
                }
            }
            Err(_) => break,
        }
    }
    closed.store(true, Ordering::Relaxed);
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

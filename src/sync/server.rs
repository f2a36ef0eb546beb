//! The sync server: axum routes on hyper connections, optional rustls, limits, metrics
//! and graceful shutdown.
//!
//! The server shares its database file with every other process: each request borrows a
//! [`Store`] from a small pool on a blocking thread (`spawn_blocking`), and no write
//! transaction is ever held across an `.await` (a push is decoded, stored and committed
//! inside one blocking call).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, watch};

use super::auth::{Access, Grant, Tokens};
use super::metrics::{Gauges, Metrics, inc};
use super::wire::{self, ErrorBody, FetchRequest, Health, Info, PushReport, Rejected};
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::store::{SetDigest, Store, StoreOptions};

/// Bounds on what one peer can make the server do. Each breach is answered with a JSON
/// error and changes nothing (`docs/protocol.md`, "Limits").
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request body, in bytes (413 `body_too_large`). Default 64 MiB.
    pub max_body_bytes: usize,
    /// Most records in one push or hashes in one fetch (413 `too_many_facts`); also the
    /// largest pull page. Default 100,000.
    pub max_facts_per_request: u64,
    /// Most facts pushed by one peer that may be held on the server at once (429
    /// `held_limit`). Default 100,000.
    pub max_held_per_peer: u64,
    /// Longest a request may take before its answer starts (408 `timeout`); a long-poll
    /// wait counts. Default 60 s.
    pub request_timeout: Duration,
    /// Longest long-poll wait a pull may ask for. Default 30 s.
    pub max_wait: Duration,
    /// Most connections open at once; one more is answered 503 `too_many_connections`
    /// and closed. Default 256.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_body_bytes: 64 << 20,
            max_facts_per_request: 100_000,
            max_held_per_peer: 100_000,
            request_timeout: Duration::from_secs(60),
            max_wait: Duration::from_secs(30),
            max_connections: 256,
        }
    }
}

/// Everything `precedent serve` needs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The database file served.
    pub db: PathBuf,
    /// How each request opens it.
    pub store_options: StoreOptions,
    /// Where to listen. Default `127.0.0.1:7341`.
    pub listen: SocketAddr,
    /// Accepted tokens; [`Tokens::open`] lets everyone in.
    pub tokens: Tokens,
    /// PEM certificate chain and private key files: serve HTTPS with rustls.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Limits.
    pub limits: Limits,
    /// How often a waiting pull looks for new facts. Default 50 ms.
    pub poll_interval: Duration,
}

impl ServerConfig {
    /// A configuration serving `db` with the defaults.
    pub fn new(db: impl Into<PathBuf>) -> ServerConfig {
        ServerConfig {
            db: db.into(),
            store_options: StoreOptions::default(),
            listen: SocketAddr::from(([127, 0, 0, 1], wire::DEFAULT_PORT)),
            tokens: Tokens::open(),
            tls: None,
            limits: Limits::default(),
            poll_interval: Duration::from_millis(50),
        }
    }
}

/// Stores kept open between requests, so a request does not pay for opening the file.
struct Pool {
    db: PathBuf,
    options: StoreOptions,
    idle: Mutex<Vec<Store>>,
}

impl Pool {
    fn take(&self) -> Result<Store> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(s) => Ok(s),
            None => Store::open_with(&self.db, self.options.clone()),
        }
    }

    fn give(&self, store: Store) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < 8 {
            idle.push(store);
        }
    }
}

struct App {
    pool: Pool,
    tokens: Tokens,
    limits: Limits,
    poll: Duration,
    metrics: Metrics,
    /// The digest of the released set, brought up to date incrementally.
    digest: Mutex<SetDigest>,
    shutdown: watch::Receiver<bool>,
}

impl App {
    /// Runs `f` with a pooled store on a blocking thread.
    async fn with_store<T: Send + 'static>(
        self: &Arc<App>,
        f: impl FnOnce(&mut Store) -> Result<T> + Send + 'static,
    ) -> Result<T, Failure> {
        let app = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut store = app.pool.take()?;
            let out = f(&mut store);
            app.pool.give(store);
            out
        })
        .await
        .map_err(|e| Failure::internal(format!("worker failed: {e}")))?
        .map_err(Failure::from)
    }
}

/// An error answer: status, code and message, sent as JSON.
#[derive(Debug)]
struct Failure {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Failure {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            status,
            code,
            message: message.into(),
        }
    }

    fn internal(message: String) -> Failure {
        Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        match e {
            Error::HeldLimit { limit, .. } => Failure::new(
                StatusCode::TOO_MANY_REQUESTS,
                "held_limit",
                format!(
                    "this peer already has {limit} facts held here, the most allowed; send their ancestors first"
                ),
            ),
            Error::Sqlite(rusqlite::Error::SqliteFailure(f, _))
                if f.code == rusqlite::ErrorCode::DatabaseBusy =>
            {
                Failure::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "busy",
                    "database is busy; retry",
                )
            }
            other => Failure::internal(other.to_string()),
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        error_response(self.status, self.code, &self.message)
    }
}

fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::to_vec(&ErrorBody {
        error: code.into(),
        message: message.into(),
    })
    .expect("error body serialises");
    let mut r = (status, body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(wire::JSON));
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

/// Who is asking and what they may do.
struct Caller {
    name: String,
    grant: Option<Grant>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Need {
    Read,
    Write,
}

fn authorize(app: &App, headers: &HeaderMap, need: Need) -> Result<Caller, Failure> {
    let auth = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    match app.tokens.check(auth) {
        Access::Open => Ok(Caller {
            name: "anonymous".into(),
            grant: None,
        }),
        Access::Unauthorized => Err(Failure::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or unknown bearer token",
        )),
        Access::Granted(g) => {
            let ok = match need {
                Need::Read => g.read,
                Need::Write => g.write,
            };
            if !ok {
                let what = if need == Need::Read { "read" } else { "write" };
                return Err(Failure::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    format!("token {:?} may not {what}", g.name),
                ));
            }
            Ok(Caller {
                name: g.name.clone(),
                grant: Some(g.clone()),
            })
        }
    }
}

/// A bound, not yet running server.
pub struct Server {
    listener: TcpListener,
    config: ServerConfig,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Server {
    /// Binds the listening socket (port 0 picks a free port) and checks the database opens
    /// and the TLS files load. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// [`Error::Io`] if the address cannot be bound; [`Error::SyncConfig`] for bad TLS
    /// files; store errors from opening the database.
    pub async fn bind(config: ServerConfig) -> Result<Server> {
        drop(Store::open_with(&config.db, config.store_options.clone())?);
        let tls = match &config.tls {
            Some((cert, key)) => Some(tls_acceptor(cert, key)?),
            None => None,
        };
        let listener = TcpListener::bind(config.listen).await?;
        Ok(Server {
            listener,
            config,
            tls,
        })
    }

    /// The address actually bound.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `shutdown` completes, then stops accepting, lets requests in flight
    /// finish (waiting pulls answer at once) for up to 10 s, and returns.
    ///
    /// # Errors
    /// None in practice: accept errors are retried.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let app = Arc::new(App {
            pool: Pool {
                db: self.config.db.clone(),
                options: self.config.store_options.clone(),
                idle: Mutex::new(Vec::new()),
            },
            tokens: self.config.tokens.clone(),
            limits: self.config.limits.clone(),
            poll: self.config.poll_interval,
            metrics: Metrics::default(),
            digest: Mutex::new(SetDigest::default()),
            shutdown: stop_rx,
        });
        let router = router(app.clone());
        let connections = Arc::new(Semaphore::new(self.config.limits.max_connections));
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let header_timeout = self.config.limits.request_timeout;
        tokio::pin!(shutdown);
        loop {
            let (tcp, _addr) = tokio::select! {
                _ = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(_) => {
                        // Out of file descriptors and the like: wait rather than spin.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let Ok(permit) = connections.clone().try_acquire_owned() else {
                tokio::spawn(refuse_connection(tcp, self.tls.clone()));
                continue;
            };
            let service = hyper_util::service::TowerToHyperService::new(router.clone());
            let watcher = graceful.watcher();
            let tls = self.tls.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let mut http = hyper::server::conn::http1::Builder::new();
                http.timer(TokioTimer::new())
                    .header_read_timeout(header_timeout);
                match tls {
                    None => {
                        let conn = http.serve_connection(TokioIo::new(tcp), service);
                        let _ = watcher.watch(conn).await;
                    }
                    Some(acceptor) => {
                        let hs = tokio::time::timeout(header_timeout, acceptor.accept(tcp));
                        if let Ok(Ok(stream)) = hs.await {
                            let conn = http.serve_connection(TokioIo::new(stream), service);
                            let _ = watcher.watch(conn).await;
                        }
                    }
                }
            });
        }
        drop(self.listener);
        let _ = stop_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await;
        Ok(())
    }
}

/// Answers a connection over the limit with a 503 and closes it.
async fn refuse_connection(tcp: tokio::net::TcpStream, tls: Option<tokio_rustls::TlsAcceptor>) {
    use tokio::io::AsyncWriteExt;
    let body = r#"{"error":"too_many_connections","message":"too many connections; retry later"}"#;
    let text = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        match tls {
            None => {
                let mut tcp = tcp;
                let _ = tcp.write_all(text.as_bytes()).await;
                let _ = tcp.shutdown().await;
            }
            Some(a) => {
                if let Ok(mut s) = a.accept(tcp).await {
                    let _ = s.write_all(text.as_bytes()).await;
                    let _ = s.shutdown().await;
                }
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), write).await;
}

fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |what: &str, path: &Path, e: &dyn std::fmt::Display| Error::SyncConfig {
        reason: format!("{what} {}: {e}", path.display()),
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad("certificate file", cert, &e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad("certificate file", cert, &e))?;
    if certs.is_empty() {
        return Err(bad("certificate file", cert, &"no certificate in it"));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| bad("key file", key, &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("tls", cert, &e))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| bad("certificate and key", cert, &e))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route(wire::PATH_HEALTH, get(health))
        .route(wire::PATH_INFO, get(info))
        .route(wire::PATH_FACTS, get(pull).post(push))
        .route(wire::PATH_FETCH, post(fetch))
        .route(wire::PATH_METRICS, get(metrics))
        .fallback(|| async { Failure::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// Applies the request timeout and counts error answers.
async fn guard(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let limit = app.limits.request_timeout;
    let response = match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => Failure::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            format!("request took longer than {} s", limit.as_secs_f64()),
        )
        .into_response(),
    };
    if response.status() == StatusCode::METHOD_NOT_ALLOWED {
        inc(&app.metrics.errors, 1);
        return error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed on this endpoint",
        );
    }
    if !response.status().is_success() {
        inc(&app.metrics.errors, 1);
    }
    response
}

async fn health() -> Response {
    json_response(&Health {
        status: "ok".into(),
        protocol: wire::PROTOCOL_VERSION,
    })
}

fn json_response<T: serde::Serialize>(value: &T) -> Response {
    let body = serde_json::to_vec(value).expect("answer serialises");
    ([(header::CONTENT_TYPE, wire::JSON)], body).into_response()
}

async fn info(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    inc(&app.metrics.requests_info, 1);
    let a = app.clone();
    let (digest, held) = app
        .with_store(move |store| {
            let start = *a.digest.lock().unwrap_or_else(|e| e.into_inner());
            let d = store.digest_since(start)?;
            let mut cached = a.digest.lock().unwrap_or_else(|e| e.into_inner());
            if d.through > cached.through {
                *cached = d;
            }
            Ok((d, store.held_count()?))
        })
        .await?;
    Ok(json_response(&Info {
        protocol: wire::PROTOCOL_VERSION,
        count: digest.count,
        digest: digest.xor_hex(),
        max_seq: digest.through,
        held,
    }))
}

async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    let gauges = app
        .with_store(|store| {
            let (facts, max_seq) = store.count_and_max_seq()?;
            Ok(Gauges {
                facts,
                max_seq,
                held: store.held_count()?,
                quarantined: store.quarantine_count()?,
            })
        })
        .await?;
    let text = app.metrics.render(&gauges);
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// A pull's query: `after`, `limit`, `wait_ms` and repeated `root`.
struct PullQuery {
    after: i64,
    limit: u64,
    wait: Duration,
    roots: Vec<FactHash>,
}

fn bad_request(message: impl Into<String>) -> Failure {
    Failure::new(StatusCode::BAD_REQUEST, "bad_request", message)
}

fn parse_pull_query(q: Option<&str>, limits: &Limits) -> Result<PullQuery, Failure> {
    let mut out = PullQuery {
        after: 0,
        limit: 10_000.min(limits.max_facts_per_request),
        wait: Duration::ZERO,
        roots: Vec::new(),
    };
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| bad_request(format!("{k}={v:?} is not a whole number")))
        };
        match k {
            "after" => {
                out.after =
                    i64::try_from(num(v)?).map_err(|_| bad_request("after is out of range"))?
            }
            "limit" => {
                let n = num(v)?;
                if n == 0 || n > limits.max_facts_per_request {
                    return Err(Failure::new(
                        StatusCode::BAD_REQUEST,
                        "bad_request",
                        format!(
                            "limit must be 1 to {}, not {n}",
                            limits.max_facts_per_request
                        ),
                    ));
                }
                out.limit = n;
            }
            "wait_ms" => out.wait = Duration::from_millis(num(v)?).min(limits.max_wait),
            "root" => {
                let h = crate::hash::HashPrefix::parse(v)
                    .ok()
                    .and_then(|p| p.full())
                    .ok_or_else(|| bad_request(format!("root={v:?} is not a 64-digit hash")))?;
                if out.roots.len() >= 1024 {
                    return Err(bad_request("at most 1024 roots"));
                }
                out.roots.push(h);
            }
            other => return Err(bad_request(format!("unknown parameter {other:?}"))),
        }
    }
    Ok(out)
}

/// One page of a pull, decided before the body starts.
struct Page {
    count: u64,
    through: i64,
    max_seq: i64,
    /// For a scoped pull, the sequence numbers of the page.
    seqs: Option<Vec<i64>>,
}

async fn pull(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Response, Failure> {
    let caller = authorize(&app, &headers, Need::Read)?;
    let q = Arc::new(parse_pull_query(q.as_deref(), &app.limits)?);
    inc(&app.metrics.requests_pull, 1);
    let deadline = Instant::now() + q.wait;
    let mut shutdown = app.shutdown.clone();
    let page = loop {
        let qq = q.clone();
        let page = app
            .with_store(move |store| {
                let max_seq = store.max_seq()?;
                if qq.roots.is_empty() {
                    let (count, through) = store.release_page(qq.after, qq.limit)?;
                    Ok(Page {
                        count,
                        through,
                        max_seq,
                        seqs: None,
                    })
                } else {
                    let seqs = store.scope_page(&qq.roots, qq.after, max_seq, qq.limit)?;
                    Ok(Page {
                        count: seqs.len() as u64,
                        through: seqs.last().copied().unwrap_or(qq.after.max(0)),
                        max_seq,
                        seqs: Some(seqs),
                    })
                }
            })
            .await?;
        // A scoped page that found nothing new has still seen everything up to max_seq.
        let page = match page {
            Page {
                count: 0,
                seqs: Some(s),
                max_seq,
                ..
            } if max_seq > q.after => Page {
                count: 0,
                through: max_seq,
                max_seq,
                seqs: Some(s),
            },
            p => p,
        };
        let now = Instant::now();
        if page.count > 0 || page.max_seq > q.after || now >= deadline || *shutdown.borrow() {
            break page;
        }
        let nap = app.poll.min(deadline - now);
        tokio::select! {
            _ = tokio::time::sleep(nap) => {}
            _ = shutdown.changed() => {}
        }
    };
    app.metrics.note_pull(&caller.name, page.through);
    inc(&app.metrics.facts_sent, page.count);
    let body = stream_page(app.clone(), q.after, &page);
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(wire::CBOR_SEQ),
    );
    h.insert(wire::HEADER_THROUGH, HeaderValue::from(page.through));
    h.insert(wire::HEADER_COUNT, HeaderValue::from(page.count));
    h.insert(wire::HEADER_MAX_SEQ, HeaderValue::from(page.max_seq));
    Ok(r)
}

/// Streams the page's facts from a blocking thread through a small channel, so memory
/// stays bounded by a few 64 KiB chunks whatever the page size.
fn stream_page(app: Arc<App>, after: i64, page: &Page) -> Body {
    if page.count == 0 {
        return Body::empty();
    }
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(8);
    let through = page.through;
    let seqs = page.seqs.clone();
    tokio::task::spawn_blocking(move || {
        let store = match app.pool.take() {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
                return;
            }
        };
        let mut buf = Vec::with_capacity(80 * 1024);
        let mut send = |bytes: &[u8]| -> Result<()> {
            buf.extend_from_slice(bytes);
            if buf.len() >= 64 * 1024 {
                let chunk = Bytes::from(std::mem::replace(&mut buf, Vec::with_capacity(80 * 1024)));
                tx.blocking_send(Ok(chunk))
                    .map_err(|_| Error::Io(std::io::ErrorKind::BrokenPipe.into()))?;
            }
            Ok(())
        };
        let result = match &seqs {
            None => store.for_each_in_range(after, through, |_, _, b| send(b)),
            Some(s) => store.for_each_at(s, |_, _, b| send(b)),
        };
        match result {
            Ok(()) => {
                if !buf.is_empty() {
                    let _ = tx.blocking_send(Ok(Bytes::from(buf)));
                }
            }
            Err(e) => {
                let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
        }
        app.pool.give(store);
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Body::from_stream(stream)
}

/// Reads a request body, refusing one over the limit.
async fn read_body(app: &App, body: Body) -> Result<Bytes, Failure> {
    let max = app.limits.max_body_bytes;
    match http_body_util::Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(Failure::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("request body is over the limit of {max} bytes"),
            ))
        }
        Err(e) => Err(bad_request(format!("cannot read request body: {e}"))),
    }
}

fn require_content_type(headers: &HeaderMap, want: &str) -> Result<(), Failure> {
    let given = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let base = given.split(';').next().unwrap_or("").trim();
    if base.eq_ignore_ascii_case(want) {
        Ok(())
    } else {
        Err(Failure::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("content-type must be {want}, not {given:?}"),
        ))
    }
}

fn too_many(n: u64, max: u64, what: &str) -> Failure {
    Failure::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_many_facts",
        format!("{n} {what} in one request; the limit is {max}"),
    )
}

async fn push(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    let caller = authorize(&app, &headers, Need::Write)?;
    require_content_type(&headers, wire::CBOR_SEQ)?;
    inc(&app.metrics.requests_push, 1);
    let bytes = read_body(&app, body).await?;
    let records = wire::split_records(&bytes);
    let max = app.limits.max_facts_per_request;
    if records.len() as u64 > max {
        return Err(too_many(records.len() as u64, max, "records"));
    }
    let mut facts = Vec::with_capacity(records.len());
    let mut rejected: Vec<(u64, String, Vec<u8>)> = Vec::new();
    for (i, r) in records.into_iter().enumerate() {
        match r
            .map_err(|e| (e.reason, e.bytes))
            .and_then(|b| Fact::from_canonical(b).map_err(|e| (e.to_string(), b.to_vec())))
        {
            Ok(f) => facts.push(f),
            Err((reason, b)) => rejected.push((i as u64, reason, b)),
        }
    }
    if let Some(grant) = &caller.grant
        && let Some(f) = facts.iter().find(|f| !grant.may_write_type(f.type_name()))
    {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "forbidden_type",
            format!(
                "token {:?} may not write facts of type {:?} (fact {})",
                grant.name,
                f.type_name(),
                f.hash()
            ),
        ));
    }
    inc(
        &app.metrics.facts_received,
        (facts.len() + rejected.len()) as u64,
    );
    inc(&app.metrics.rejected, rejected.len() as u64);
    let received = (facts.len() + rejected.len()) as u64;
    let peer = caller.name.clone();
    let max_held = app.limits.max_held_per_peer;
    let report = app
        .with_store(move |store| {
            store.write(|w| {
                let hashes: Vec<FactHash> = facts.iter().map(|f| f.hash()).collect();
                let batch = w.insert_batch(facts)?;
                for (_, reason, b) in &rejected {
                    w.quarantine(&peer, reason, b)?;
                }
                if batch.held > 0 {
                    let held = w.note_held_origin(&peer, &hashes)?;
                    if held > max_held {
                        return Err(Error::HeldLimit {
                            limit: max_held,
                            hash: hashes[0],
                        });
                    }
                }
                let missing = if batch.held > 0 {
                    w.absent_ancestors(1000)?
                } else {
                    Vec::new()
                };
                Ok(PushReport {
                    received,
                    inserted: batch.inserted,
                    duplicates: batch.duplicates,
                    held: batch.held,
                    released: batch.released,
                    rejected: rejected
                        .iter()
                        .map(|(index, reason, _)| Rejected {
                            index: *index,
                            reason: reason.clone(),
                        })
                        .collect(),
                    refused: batch.refused.iter().map(|h| h.to_string()).collect(),
                    missing: missing.iter().map(|h| h.to_string()).collect(),
                })
            })
        })
        .await?;
    Ok(json_response(&report))
}

async fn fetch(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    require_content_type(&headers, wire::JSON)?;
    inc(&app.metrics.requests_fetch, 1);
    let bytes = read_body(&app, body).await?;
    let req: FetchRequest = serde_json::from_slice(&bytes)
        .map_err(|e| bad_request(format!("fetch body is not {{\"hashes\": [...]}}: {e}")))?;
    let max = app.limits.max_facts_per_request;
    if req.hashes.len() as u64 > max {
        return Err(too_many(req.hashes.len() as u64, max, "hashes"));
    }
    let mut hashes = Vec::with_capacity(req.hashes.len());
    for h in &req.hashes {
        let parsed = crate::hash::HashPrefix::parse(h)
            .ok()
            .and_then(|p| p.full())
            .ok_or_else(|| bad_request(format!("{h:?} is not a 64-digit hash")))?;
        hashes.push(parsed);
    }
    let found = app.with_store(move |s| s.fetch_bytes(&hashes)).await?;
    inc(&app.metrics.facts_sent, found.len() as u64);
    let mut out = Vec::new();
    for (_, b) in &found {
        out.extend_from_slice(b);
    }
    let mut r = Response::new(Body::from(out));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(wire::CBOR_SEQ),
    );
    r.headers_mut()
        .insert(wire::HEADER_COUNT, HeaderValue::from(found.len()));
    Ok(r)
}

/// Serves until SIGINT or SIGTERM, on a runtime of its own; for `precedent serve`.
/// `ready` is called with the bound address once the server accepts connections.
///
/// # Errors
/// As [`Server::bind`].
pub fn serve_until_signal(config: ServerConfig, ready: impl FnOnce(SocketAddr)) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let server = Server::bind(config).await?;
        ready(server.local_addr()?);
        server.run(signal()).await
    })
}

/// Completes on SIGINT or SIGTERM.
async fn signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// A server running on a runtime of its own, for tests and embedding; stops when dropped.
pub struct Running {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Running {
    /// Binds and starts a server on a background thread.
    ///
    /// # Errors
    /// As [`Server::bind`].
    pub fn start(config: ServerConfig) -> Result<Running> {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || -> Result<()> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let server = match Server::bind(config).await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = addr_tx.send(Err(e));
                        return Ok(());
                    }
                };
                let _ = addr_tx.send(server.local_addr());
                server
                    .run(async {
                        let _ = stop_rx.await;
                    })
                    .await
            })
        });
        let addr = addr_rx.recv().map_err(|_| Error::SyncConfig {
            reason: "server thread ended before binding".into(),
        })??;
        Ok(Running {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR` (the scheme is `https` only if TLS is configured; pass that yourself).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the server gracefully and waits for it.
    ///
    /// # Errors
    /// What the server ended with.
    pub fn stop(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(Error::SyncConfig {
                    reason: "server thread panicked".into(),
                })
            }),
            None => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

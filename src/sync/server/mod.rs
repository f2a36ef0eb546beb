//! The sync server: axum routes on hyper connections, optional rustls, limits, metrics
//! and graceful shutdown.
//!
//! The server shares its database file with every other process. Every request uses the
//! one shared [`Store`] on a blocking thread (`spawn_blocking`): reads run concurrently on
//! the store's read connections, writes take its one writer, and no write transaction is
//! ever held across an `.await` (a push is decoded, stored and committed inside one
//! blocking call).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::error::{Error, Result};
use crate::store::{Store, StoreOptions};
use crate::sync::SetDigest;
use crate::sync::auth::Tokens;
use crate::sync::metrics::Metrics;
use crate::sync::wire;

mod access;
mod app;
mod console;
mod fanout;
mod graph;
mod http_errors;
mod json_api;
mod json_query;
mod push;
mod queues;
mod routes;
mod sse;

use app::App;
use http_errors::Intercept;
use routes::router;

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
    /// Longest a `GET /v1/watch` client may read nothing while its events wait, before
    /// it is disconnected (`docs/protocol.md`, "Server-Sent Events"). Default 10 s.
    pub sse_stall: Duration,
}

impl Limits {
    /// The longest a long-poll actually waits: [`Limits::max_wait`], and below the request
    /// timeout (by a second, or by half of it when it is under two seconds), so that a
    /// waiting pull answers with an empty page rather than 408.
    pub fn long_poll_cap(&self) -> Duration {
        let t = self.request_timeout;
        self.max_wait
            .min(t.saturating_sub(Duration::from_secs(1)).max(t / 2))
    }

    /// The bytes of request bodies that pushes in progress may hold at once: the body limit,
    /// and at least 64 MiB.
    pub fn push_budget(&self) -> usize {
        self.max_body_bytes.max(64 << 20)
    }
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
            sse_stall: Duration::from_secs(10),
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
    /// Threads that decode and re-hash the records of a push (`precedent::ingest`), for
    /// a body of more than `ingest::MIN_PIECE` records; 0, the default, is one per core.
    pub decode_threads: usize,
    /// The most threads running store calls at once (tokio's blocking pool); a request
    /// beyond them waits for one without a thread of its own. Default
    /// [`STORE_THREADS`].
    pub store_threads: usize,
}

/// The default of [`ServerConfig::store_threads`]. Store calls are short, and a SQLite
/// store has one writer; past a few threads a core, more threads add only their stacks
/// and the allocator's per-thread memory, which the 100-client soak saw grow with the
/// peak number of threads (512, tokio's default) rather than with its work.
pub const STORE_THREADS: usize = 64;

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
            decode_threads: 0,
            store_threads: STORE_THREADS,
        }
    }
}

/// A bound, not yet running server.
pub struct Server {
    listener: TcpListener,
    config: ServerConfig,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// The served store, shared by every request (reads run concurrently beside one
    /// writer).
    store: Arc<Store>,
    /// The served database's identity, reported in every pull and push answer.
    store_id: String,
}

impl Server {
    /// Binds the listening socket (port 0 picks a free port) and checks the database opens
    /// and the TLS files load. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// [`Error::Io`] if the address cannot be bound; [`Error::SyncConfig`] for bad TLS
    /// files; store errors from opening the database.
    pub async fn bind(config: ServerConfig) -> Result<Server> {
        // On a blocking thread: PostgreSQL's blocking client runs a runtime of its own,
        // which may not start inside this one ("Cannot start a runtime from within a
        // runtime"), and opening may wait on the database anyway.
        let (db, options) = (config.db.clone(), config.store_options.clone());
        let (store, store_id) = tokio::task::spawn_blocking(move || -> Result<_> {
            let store = Store::open_with(&db, options)?;
            let id = store.store_id()?;
            // The first push then costs what the others do (PostgreSQL's caches). Only a
            // head start: a database this server may not write to (a role without the
            // right, a replica) still serves reads, as it did.
            if let Err(e) = store.warm() {
                tracing::debug!("warming the store for its first push: {e}");
            }
            Ok((Arc::new(store), id))
        })
        .await
        .map_err(|e| Error::SyncConfig {
            reason: format!("opening the database panicked: {e}"),
        })??;
        let tls = match &config.tls {
            Some((cert, key)) => Some(tls_acceptor(cert, key)?),
            None => None,
        };
        let listener = TcpListener::bind(config.listen).await?;
        Ok(Server {
            listener,
            config,
            tls,
            store,
            store_id,
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
    /// finish (waiting pulls answer at once) for up to 10 s, waits for its figures thread
    /// (one poll interval at most), and returns.
    ///
    /// # Errors
    /// None in practice: accept errors are retried.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let events = sse::Events::start(
            self.store.clone(),
            self.config.poll_interval,
            stop_rx.clone(),
        )?;
        let app = Arc::new(App {
            store: self.store.clone(),
            tokens: self.config.tokens.clone(),
            limits: self.config.limits.clone(),
            poll: self.config.poll_interval,
            metrics: Metrics::default(),
            digest: Mutex::new(SetDigest::default()),
            shutdown: stop_rx,
            store_id: axum::http::HeaderValue::from_str(&self.store_id)
                .expect("hex is a header value"),
            // In KiB: a permit is a KiB of request body.
            push_budget: Arc::new(Semaphore::new(
                self.config.limits.push_budget().div_ceil(1024),
            )),
            push_budget_bytes: self.config.limits.push_budget(),
            push_turn: Arc::new(Semaphore::new(1)),
            decode_threads: self.config.decode_threads,
            events,
            watches: fanout::Watches::default(),
        });
        let router = access::logged(router(app.clone()));
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
                        let conn =
                            http.serve_connection(TokioIo::new(Intercept::new(tcp)), service);
                        let _ = watcher.watch(conn).await;
                    }
                    Some(acceptor) => {
                        let hs = tokio::time::timeout(header_timeout, acceptor.accept(tcp));
                        if let Ok(Ok(stream)) = hs.await {
                            let io = TokioIo::new(Intercept::new(stream));
                            let conn = http.serve_connection(io, service);
                            let _ = watcher.watch(conn).await;
                        }
                    }
                }
            });
        }
        drop(self.listener);
        let _ = stop_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await;
        // The figures thread holds the store: wait for it, so that the database is closed
        // when `run` returns (a caller may then delete or replace its files).
        let _ = tokio::task::spawn_blocking(move || app.events.join()).await;
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

/// Serves until SIGINT or SIGTERM, on a runtime of its own; for `precedent serve`.
/// `ready` is called with the bound address once the server accepts connections.
///
/// # Errors
/// As [`Server::bind`].
pub fn serve_until_signal(config: ServerConfig, ready: impl FnOnce(SocketAddr)) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(config.store_threads.max(1))
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
                .max_blocking_threads(config.store_threads.max(1))
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

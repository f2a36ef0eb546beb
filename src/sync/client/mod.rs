//! The sync client: a blocking HTTP client (ureq) and the sync loop.
//!
//! Bookmarks live in the store (`sync_peer`) and move only inside the transaction that
//! commits the facts they cover, so a sync killed at any point resumes where the last
//! commit left it and sends or receives again at most the one page it was in.

use std::time::Duration;

use super::wire::{
    self, ErrorBody, FetchRequest, FramingError, Health, Info, PullRequest, PushReport,
    RecordReader,
};
use crate::error::{Error, Result};
use crate::hash::FactHash;

mod known;
mod pace;
mod queue;
mod run;

use pace::{Failed, Pace, cut_short};

pub use queue::{RemoteLease, RemoteQueue};

/// How a [`Client`] connects.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Sent as `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// A PEM certificate to trust (for a server with a self-signed certificate); by
    /// default the usual web roots are trusted.
    pub ca_cert_pem: Option<Vec<u8>>,
    /// The most facts in flight: a pull reads ahead one page of `batch / 2` facts while it
    /// commits another, and a push sends `batch` facts per request. So a sync killed at any
    /// moment receives or sends again at most `batch` facts. Default 20,000.
    pub batch: u64,
    /// Longest wait for a connection, an answer to start, or a body to arrive. Default 60 s.
    /// A pull page, push request or fetch that times out or is cut short is sent again at
    /// half its size (`docs/protocol.md`, "Requests fitted to the link").
    pub timeout: Duration,
    /// Threads that decode and re-hash pulled pages (`precedent::ingest`), beside the
    /// reader thread that fetches them; 0, the default, is one per core.
    pub decode_threads: usize,
}

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        ClientOptions {
            token: None,
            ca_cert_pem: None,
            batch: 20_000,
            timeout: Duration::from_secs(60),
            decode_threads: 0,
        }
    }
}

/// Which way facts travel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Direction {
    /// Pull, fetch missing ancestors, then push.
    #[default]
    Both,
    /// Only pull (and fetch missing ancestors).
    Pull,
    /// Only push.
    Push,
}

/// What to sync.
#[derive(Clone, Debug, Default)]
pub struct SyncOptions {
    /// Which way.
    pub direction: Direction,
    /// Pull only the facts below these roots (their descendants and every ancestor those
    /// need). Empty: everything. A scoped sync keeps bookmarks of its own.
    pub roots: Vec<FactHash>,
}

/// What a sync is doing, for a progress bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Receiving pages of facts.
    Pull,
    /// Fetching ancestors of held facts.
    Fetch,
    /// Sending local facts.
    Push,
}

/// A progress report: `done` out of about `total` (sequence numbers, so approximate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The phase.
    pub phase: Phase,
    /// Facts handled so far in this phase.
    pub done: u64,
    /// About how many there are in all (0 when unknown).
    pub total: u64,
}

/// Counts for one sync.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Records received by pull.
    pub pulled: u64,
    /// Records received by fetch.
    pub fetched: u64,
    /// Facts sent by push.
    pub pushed: u64,
    /// Received facts that were new and released on arrival.
    pub inserted: u64,
    /// Facts released here (received ones and held ones they completed).
    pub released: u64,
    /// Received facts this store already had.
    pub duplicates: u64,
    /// Facts held here when the sync ended.
    pub held: u64,
    /// Received records that failed decoding or hashing, now in the quarantine.
    pub quarantined: u64,
    /// Bytes of the records received by pull and fetch (the bodies, without HTTP
    /// headers).
    pub bytes_pulled: u64,
    /// Bytes of the records sent by push (the bodies, without HTTP headers).
    pub bytes_pushed: u64,
    /// The remote's highest release sequence when last seen.
    pub remote_seq: i64,
    /// Whether the database behind the peer's URL turned out to be another one than
    /// when the bookmarks were written: they started again from 0, and this sync pulled
    /// and pushed everything (`docs/protocol.md`, "Store identity").
    pub replaced: bool,
}

/// One pulled page.
#[derive(Debug)]
pub struct PullPage {
    /// The next bookmark (the server sequence of the page's last fact).
    pub through: i64,
    /// The server's highest sequence when the page was cut.
    pub max_seq: i64,
    /// The records, in the server's release order; `Err` for an unframeable tail.
    pub records: Vec<std::result::Result<Vec<u8>, FramingError>>,
    /// The server database's identity ([`wire::HEADER_STORE`]), if it sent one.
    pub store: Option<String>,
}

/// A scoped pull with more roots than this sends them in a `POST /v1/pull` body rather
/// than in the URL (servers before that endpoint take only the URL, up to about 900).
const ROOTS_IN_URL: usize = 512;

/// A connection to one sync server.
pub struct Client {
    base: String,
    agent: ureq::Agent,
    token: Option<String>,
    batch: u64,
    decode_threads: usize,
    /// [`ClientOptions::timeout`]: a request that takes a quarter of it lets the next one
    /// of its kind grow.
    timeout: Duration,
    /// The request sizes this client's link has shown it can carry in time, kept across
    /// its syncs.
    pace: std::sync::Mutex<Pace>,
}

impl Client {
    /// A client for the server at `url` (`http://host:port` or `https://...`). A URL
    /// ending in the protocol's prefix `/v1` stands for the server's base URL.
    ///
    /// # Errors
    /// [`Error::SyncConfig`] for a URL that is not http(s) or a certificate that does not
    /// parse.
    pub fn new(url: &str, options: ClientOptions) -> Result<Client> {
        let mut base = url.trim_end_matches('/');
        if let Some(b) = base.strip_suffix("/v1") {
            base = b.trim_end_matches('/');
        }
        let base = base.to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::SyncConfig {
                reason: format!("peer url {url:?} must start with http:// or https://"),
            });
        }
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(options.timeout.min(Duration::from_secs(10))))
            // A waiting pull may take up to the server's longest wait (30 s) to answer.
            .timeout_recv_response(Some(options.timeout + Duration::from_secs(35)))
            .timeout_recv_body(Some(options.timeout))
            .timeout_send_body(Some(options.timeout))
            .max_idle_connections_per_host(4);
        if let Some(pem) = &options.ca_cert_pem {
            let cert = ureq::tls::Certificate::from_pem(pem).map_err(|e| Error::SyncConfig {
                reason: format!("ca certificate: {e}"),
            })?;
            config = config.tls_config(
                ureq::tls::TlsConfig::builder()
                    .root_certs(ureq::tls::RootCerts::new_with_certs(&[cert]))
                    .build(),
            );
        }
        Ok(Client {
            base,
            agent: config.build().new_agent(),
            token: options.token,
            batch: options.batch.max(1),
            decode_threads: options.decode_threads,
            timeout: options.timeout,
            pace: std::sync::Mutex::new(Pace::default()),
        })
    }

    /// The server's base URL, as given (without a trailing `/`).
    pub fn url(&self) -> &str {
        &self.base
    }

    fn transport(&self, e: impl std::fmt::Display) -> Error {
        let mut reason = e.to_string();
        if let Some(rest) = self.base.strip_prefix("https://")
            && (reason.contains("InvalidContentType") || reason.contains("corrupt message"))
        {
            reason = format!(
                "the server speaks plain HTTP, not HTTPS (try http://{rest}); the TLS library said: {reason}"
            );
        }
        Error::Transport {
            url: self.base.clone(),
            reason,
        }
    }

    fn protocol(&self, reason: impl Into<String>) -> Error {
        Error::Protocol {
            url: self.base.clone(),
            reason: reason.into(),
        }
    }

    fn auth<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => req.header("authorization", format!("Bearer {t}")),
            None => req,
        }
    }

    /// Turns an error status into [`Error::Remote`] with the JSON body's code and message.
    fn check(
        &self,
        resp: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let mut resp = resp.map_err(|e| self.transport(e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .with_config()
            .limit(64 * 1024)
            .read_to_vec()
            .unwrap_or_default();
        let (code, mut message) = match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(b) => (b.error, b.message),
            Err(_) => (
                "unknown".to_string(),
                String::from_utf8_lossy(&body).into_owned(),
            ),
        };
        if status == 404 {
            message = format!(
                "{message}; {} does not look like the base URL of a precedent server \
                 (it should be like http://HOST:{}, the part before /v1/...)",
                self.base,
                wire::DEFAULT_PORT
            );
        }
        Err(Error::Remote {
            url: self.base.clone(),
            status,
            code,
            message,
        })
    }

    fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        mut resp: ureq::http::Response<ureq::Body>,
    ) -> Result<T> {
        let body = resp
            .body_mut()
            .with_config()
            .limit(16 << 20)
            .read_to_vec()
            .map_err(|e| self.transport(e))?;
        serde_json::from_slice(&body).map_err(|e| self.protocol(format!("bad json answer: {e}")))
    }

    /// `GET /v1/health`.
    ///
    /// # Errors
    /// [`Error::Transport`], [`Error::Remote`], [`Error::Protocol`].
    pub fn health(&self) -> Result<Health> {
        let r = self
            .agent
            .get(format!("{}{}", self.base, wire::PATH_HEALTH))
            .call();
        self.read_json(self.check(r)?)
    }

    /// `GET /v1/info`: the remote's count, digest and highest sequence.
    ///
    /// # Errors
    /// As [`Client::health`].
    pub fn info(&self) -> Result<Info> {
        let req = self.auth(self.agent.get(format!("{}{}", self.base, wire::PATH_INFO)));
        self.read_json(self.check(req.call())?)
    }

    /// Pulls one page: at most `limit` facts released after `after` (scoped to `roots`
    /// when given), waiting up to `wait` for one to appear.
    ///
    /// # Errors
    /// [`Error::Transport`] (also for a stream cut short), [`Error::Remote`],
    /// [`Error::Protocol`].
    pub fn pull_page(
        &self,
        after: i64,
        limit: u64,
        wait: Duration,
        roots: &[FactHash],
    ) -> Result<PullPage> {
        self.try_pull_page(after, limit, wait, roots)
            .map_err(|f| f.error)
    }

    /// [`Client::pull_page`], telling a request cut short by the link from other failures.
    fn try_pull_page(
        &self,
        after: i64,
        limit: u64,
        wait: Duration,
        roots: &[FactHash],
    ) -> std::result::Result<PullPage, Failed> {
        let sent = if roots.len() > ROOTS_IN_URL {
            let body = serde_json::to_vec(&PullRequest {
                after,
                limit: Some(limit),
                wait_ms: wait.as_millis() as u64,
                roots: roots.iter().map(|h| h.to_string()).collect(),
            })
            .expect("pull request serialises");
            let req = self
                .auth(self.agent.post(format!("{}{}", self.base, wire::PATH_PULL)))
                .header("content-type", wire::JSON);
            req.send(&body[..])
        } else {
            let mut url = format!(
                "{}{}?after={after}&limit={limit}",
                self.base,
                wire::PATH_FACTS
            );
            if !wait.is_zero() {
                url.push_str(&format!("&wait_ms={}", wait.as_millis()));
            }
            for r in roots {
                url.push_str(&format!("&root={r}"));
            }
            self.auth(self.agent.get(url)).call()
        };
        let resp = self.check_cut(sent)?;
        let header = |name: &str| -> Result<i64> {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| self.protocol(format!("answer lacks a numeric {name} header")))
        };
        let through = header(wire::HEADER_THROUGH)?;
        let max_seq = header(wire::HEADER_MAX_SEQ)?;
        let count = header(wire::HEADER_COUNT)? as u64;
        let store = store_header(resp.headers());
        if count > limit {
            return Err(self
                .protocol(format!("page of {count} facts, asked for {limit}"))
                .into());
        }
        // From here on, a failure is the body cut short or timed out: the link's doing.
        let cut = |error: Error| Failed {
            error,
            cut: true,
            announced: Some(count),
        };
        let mut reader = RecordReader::new(resp.into_body().into_reader());
        let mut records = Vec::with_capacity(count as usize);
        while let Some(r) = reader.next_record().map_err(|e| cut(self.transport(e)))? {
            match r {
                Err(e) if e.truncated => {
                    return Err(cut(self.transport("stream ended inside a record")));
                }
                // An oversize record, or an unframeable tail (the reader ends after it).
                Err(e) => records.push(Err(e)),
                Ok(rec) => records.push(Ok(rec)),
            }
            if records.len() as u64 > count {
                return Err(self
                    .protocol(format!("more than the {count} records announced"))
                    .into());
            }
        }
        let framing_failed = records.last().is_some_and(|r| r.is_err());
        if records.len() as u64 != count && !framing_failed {
            return Err(cut(self.transport(format!(
                "stream ended after {} of {count} records",
                records.len()
            ))));
        }
        Ok(PullPage {
            through,
            max_seq,
            records,
            store,
        })
    }

    /// Pushes canonical fact encodings (a CBOR sequence) in one request.
    ///
    /// # Errors
    /// [`Error::Transport`], [`Error::Remote`] (401, 403, 413, 429, ...), [`Error::Protocol`].
    pub fn push_records(&self, body: &[u8]) -> Result<PushReport> {
        self.try_push_records(body).map_err(|f| f.error)
    }

    /// [`Client::push_records`], telling a request cut short by the link from other
    /// failures.
    fn try_push_records(&self, body: &[u8]) -> std::result::Result<PushReport, Failed> {
        let req = self
            .auth(
                self.agent
                    .post(format!("{}{}", self.base, wire::PATH_FACTS)),
            )
            .header("content-type", wire::CBOR_SEQ);
        let resp = match self.check_cut(req.send(body)) {
            Err(Failed {
                error:
                    Error::Remote {
                        url,
                        status: 403,
                        code,
                        message,
                    },
                ..
            }) if code == "forbidden" => {
                return Err(Error::Remote {
                    url,
                    status: 403,
                    code,
                    message: format!(
                        "{message}; a token that may only read can still pull (precedent sync --pull)"
                    ),
                }
                .into());
            }
            r => r?,
        };
        let store = store_header(resp.headers());
        // An answer whose body does not arrive is cut short too (the push may have been
        // stored: sending it again stores nothing twice).
        let mut report: PushReport = self.read_json(resp).map_err(|error| {
            let cut = matches!(error, Error::Transport { .. });
            Failed::new(error, cut)
        })?;
        report.store = store;
        Ok(report)
    }

    /// [`Client::check`], noting whether a failure is the link's: a timeout or a
    /// connection broken mid-exchange ([`cut_short`]), or the server's 408.
    fn check_cut(
        &self,
        resp: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> std::result::Result<ureq::http::Response<ureq::Body>, Failed> {
        let cut = resp.as_ref().err().is_some_and(cut_short);
        self.check(resp).map_err(|error| {
            let cut = cut || matches!(error, Error::Remote { status: 408, .. });
            Failed::new(error, cut)
        })
    }

    /// Fetches facts by hash; returns the records of those the server has.
    ///
    /// # Errors
    /// As [`Client::push_records`].
    pub fn fetch(
        &self,
        hashes: &[FactHash],
    ) -> Result<Vec<std::result::Result<Vec<u8>, FramingError>>> {
        self.try_fetch(hashes).map_err(|f| f.error)
    }

    /// [`Client::fetch`], saying whether the link cut it short (see `pace`).
    fn try_fetch(
        &self,
        hashes: &[FactHash],
    ) -> std::result::Result<Vec<std::result::Result<Vec<u8>, FramingError>>, Failed> {
        let body = serde_json::to_vec(&FetchRequest {
            hashes: hashes.iter().map(|h| h.to_string()).collect(),
        })
        .expect("fetch request serialises");
        let req = self
            .auth(
                self.agent
                    .post(format!("{}{}", self.base, wire::PATH_FETCH)),
            )
            .header("content-type", wire::JSON);
        let resp = self.check_cut(req.send(&body[..]))?;
        // From here on, a failure is the body cut short or timed out: the link's doing.
        let cut = |error: Error| Failed::new(error, true);
        let mut reader = RecordReader::new(resp.into_body().into_reader());
        let mut out = Vec::new();
        while let Some(r) = reader.next_record().map_err(|e| cut(self.transport(e)))? {
            if let Err(e) = &r
                && e.truncated
            {
                return Err(cut(self.transport("stream ended inside a record")));
            }
            out.push(r);
            if out.len() > hashes.len() {
                return Err(self.protocol("more records than hashes asked for").into());
            }
        }
        Ok(out)
    }

    /// The bookmark key of a sync with this server over `roots`.
    pub fn peer_key(&self, roots: &[FactHash]) -> String {
        if roots.is_empty() {
            return self.base.clone();
        }
        let mut r: Vec<String> = roots.iter().map(|h| h.to_string()).collect();
        r.sort();
        format!("{}#roots={}", self.base, r.join(","))
    }
}

/// The [`wire::HEADER_STORE`] header of an answer, if it has a usable one.
fn store_header(headers: &ureq::http::HeaderMap) -> Option<String> {
    headers
        .get(wire::HEADER_STORE)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64)
        .map(str::to_ascii_lowercase)
}

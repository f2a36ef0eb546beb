//! The sync client: a blocking HTTP client (ureq) and the sync loop.
//!
//! Bookmarks live in the store (`sync_peer`) and move only inside the transaction that
//! commits the facts they cover, so a sync killed at any point resumes where the last
//! commit left it and sends or receives again at most the one page it was in.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::wire::{
    self, ErrorBody, FetchRequest, FramingError, Health, Info, PushReport, RecordReader,
};
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::store::Store;
use crate::sync::SetDigest;

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
    pub timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        ClientOptions {
            token: None,
            ca_cert_pem: None,
            batch: 20_000,
            timeout: Duration::from_secs(60),
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

/// A connection to one sync server.
pub struct Client {
    base: String,
    agent: ureq::Agent,
    token: Option<String>,
    batch: u64,
}

impl Client {
    /// A client for the server at `url` (`http://host:port` or `https://...`).
    ///
    /// # Errors
    /// [`Error::SyncConfig`] for a URL that is not http(s) or a certificate that does not
    /// parse.
    pub fn new(url: &str, options: ClientOptions) -> Result<Client> {
        let base = url.trim_end_matches('/').to_string();
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
        })
    }

    /// The server's base URL, as given (without a trailing `/`).
    pub fn url(&self) -> &str {
        &self.base
    }

    fn transport(&self, e: impl std::fmt::Display) -> Error {
        Error::Transport {
            url: self.base.clone(),
            reason: e.to_string(),
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
        let (code, message) = match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(b) => (b.error, b.message),
            Err(_) => (
                "unknown".to_string(),
                String::from_utf8_lossy(&body).into_owned(),
            ),
        };
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
        let resp = self.check(self.auth(self.agent.get(url)).call())?;
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
            return Err(self.protocol(format!("page of {count} facts, asked for {limit}")));
        }
        let mut reader = RecordReader::new(resp.into_body().into_reader());
        let mut records = Vec::with_capacity(count as usize);
        while let Some(r) = reader.next_record().map_err(|e| self.transport(e))? {
            match r {
                Err(e) if e.truncated => {
                    return Err(self.transport("stream ended inside a record"));
                }
                Err(e) => {
                    records.push(Err(e));
                    break;
                }
                Ok(rec) => records.push(Ok(rec)),
            }
            if records.len() as u64 > count {
                return Err(self.protocol(format!("more than the {count} records announced")));
            }
        }
        let framing_failed = records.last().is_some_and(|r| r.is_err());
        if records.len() as u64 != count && !framing_failed {
            return Err(self.transport(format!(
                "stream ended after {} of {count} records",
                records.len()
            )));
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
        let req = self
            .auth(
                self.agent
                    .post(format!("{}{}", self.base, wire::PATH_FACTS)),
            )
            .header("content-type", wire::CBOR_SEQ);
        let resp = self.check(req.send(body))?;
        let store = store_header(resp.headers());
        let mut report: PushReport = self.read_json(resp)?;
        report.store = store;
        Ok(report)
    }

    /// Fetches facts by hash; returns the records of those the server has.
    ///
    /// # Errors
    /// As [`Client::push_records`].
    pub fn fetch(
        &self,
        hashes: &[FactHash],
    ) -> Result<Vec<std::result::Result<Vec<u8>, FramingError>>> {
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
        let resp = self.check(req.send(&body[..]))?;
        let mut reader = RecordReader::new(resp.into_body().into_reader());
        let mut out = Vec::new();
        while let Some(r) = reader.next_record().map_err(|e| self.transport(e))? {
            if let Err(e) = &r
                && e.truncated
            {
                return Err(self.transport("stream ended inside a record"));
            }
            out.push(r);
            if out.len() > hashes.len() {
                return Err(self.protocol("more records than hashes asked for"));
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

    /// Syncs once: pulls what this store has not seen, fetches the ancestors of what is
    /// held, pushes what the server has not seen. Records the outcome in `sync_peer`
    /// (last sync time, or the error).
    ///
    /// # Errors
    /// Transport, remote and protocol errors; store errors. Everything committed before
    /// the error stays committed, bookmarks included.
    pub fn sync(
        &self,
        store: &Store,
        options: &SyncOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<SyncReport> {
        let mut report = SyncReport::default();
        let result = self.round(store, options, Duration::ZERO, &mut report, progress);
        self.finish(store, options, result.map(|()| report))
    }

    fn finish(
        &self,
        store: &Store,
        options: &SyncOptions,
        result: Result<SyncReport>,
    ) -> Result<SyncReport> {
        let key = self.peer_key(&options.roots);
        match result {
            Ok(mut report) => {
                report.held = store.held_count()?;
                let remote = report.remote_seq;
                store.write(|w| w.record_peer_success(&key, remote))?;
                Ok(report)
            }
            Err(e) => {
                let _ = store.record_peer_error(&key, &e.to_string());
                Err(e)
            }
        }
    }

    /// Syncs, then keeps syncing as facts appear on either side until `stop` is set:
    /// each round waits on the server (long-poll, up to `wait`) for new facts. Transport
    /// errors are recorded and retried after a second; `on_round` sees each round's outcome.
    ///
    /// # Errors
    /// Store errors, and remote errors that retrying cannot fix (401, 403).
    pub fn follow(
        &self,
        store: &Store,
        options: &SyncOptions,
        wait: Duration,
        stop: &AtomicBool,
        on_round: &mut dyn FnMut(&Result<SyncReport>),
    ) -> Result<()> {
        while !stop.load(Ordering::Relaxed) {
            let mut report = SyncReport::default();
            let result = self.round(store, options, wait, &mut report, &mut |_| {});
            let result = self.finish(store, options, result.map(|()| report));
            on_round(&result);
            match result {
                Ok(_) => {}
                Err(Error::Remote { status: 401, .. }) | Err(Error::Remote { status: 403, .. }) => {
                    return result.map(|_| ());
                }
                Err(Error::Transport { .. })
                | Err(Error::Remote { .. })
                | Err(Error::Protocol { .. }) => {
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn round(
        &self,
        store: &Store,
        options: &SyncOptions,
        wait: Duration,
        report: &mut SyncReport,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<()> {
        let key = self.peer_key(&options.roots);
        if options.direction != Direction::Push {
            // A replaced peer database restarts the bookmarks: pull again from 0.
            if self.pull_all(store, &key, &options.roots, wait, report, progress)? {
                self.pull_all(store, &key, &options.roots, wait, report, progress)?;
            }
            self.fetch_missing(store, report, progress)?;
        }
        if options.direction != Direction::Pull {
            if options.direction == Direction::Both && options.roots.is_empty() {
                self.skip_push_if_in_sync(store, &key)?;
            }
            self.push_all(store, &key, report, progress)?;
        }
        Ok(())
    }

    /// Pulls pages until the server has nothing more. A reader thread fetches and decodes
    /// the next page while this thread commits the current one; pages are committed in
    /// order, each with its bookmark, so an error or a kill loses at most the pages in flight.
    /// Returns `true`, having committed nothing, if the first page shows that the database
    /// behind the URL was replaced (its bookmarks are then back at 0).
    fn pull_all(
        &self,
        store: &Store,
        key: &str,
        roots: &[FactHash],
        wait: Duration,
        report: &mut SyncReport,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<bool> {
        let start = store.peer(key)?.map_or(0, |p| p.pull_after);
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Decoded>>(1);
        std::thread::scope(|scope| {
            scope.spawn(move || {
                let (mut after, mut wait) = (start, wait);
                loop {
                    let page = self.pull_page(after, (self.batch / 2).max(1), wait, roots);
                    wait = Duration::ZERO;
                    let decoded = page.map(|p| {
                        let last = p.through >= p.max_seq || p.records.is_empty();
                        let (facts, bad) = decode_records(p.records);
                        Decoded {
                            through: p.through,
                            max_seq: p.max_seq,
                            last,
                            facts,
                            bad,
                            store: p.store,
                        }
                    });
                    let stop = decoded.as_ref().map_or(true, |d| d.last);
                    if let Ok(d) = &decoded {
                        after = d.through;
                    }
                    if tx.send(decoded).is_err() || stop {
                        return;
                    }
                }
            });
            let mut done = 0;
            let mut first = true;
            for page in rx {
                let page = page?;
                if std::mem::take(&mut first)
                    && let Some(id) = &page.store
                    && store.write(|w| w.note_peer_store(key, id))?
                {
                    report.replaced = true;
                    return Ok(true);
                }
                report.remote_seq = report.remote_seq.max(page.max_seq);
                let n = (page.facts.len() + page.bad.len()) as u64;
                let through = page.through;
                self.commit_page(store, key, page, report)?;
                done += n;
                progress(Progress {
                    phase: Phase::Pull,
                    done,
                    total: done + (report.remote_seq - through).max(0) as u64,
                });
            }
            Ok(false)
        })
    }

    /// Stores one pulled page and moves the bookmark, in one transaction.
    fn commit_page(
        &self,
        store: &Store,
        key: &str,
        page: Decoded,
        report: &mut SyncReport,
    ) -> Result<()> {
        let (facts, bad) = (page.facts, page.bad);
        report.pulled += (facts.len() + bad.len()) as u64;
        report.quarantined += bad.len() as u64;
        let peer = self.base.clone();
        let batch = store.write(|w| {
            let before = w.max_seq()?;
            let push_after = w.peer(key)?.map_or(0, |p| p.push_after);
            let batch = w.insert_batch(facts)?;
            if let Some(h) = batch.refused.first() {
                return Err(Error::HeldLimit {
                    limit: batch.refused.len() as u64,
                    hash: *h,
                });
            }
            for (reason, bytes) in &bad {
                w.quarantine(&peer, reason, bytes)?;
            }
            w.set_pull_bookmark(key, page.through, page.max_seq)?;
            // Every fact this transaction released came from the peer (no earlier held
            // fact was released), and nothing local was waiting to be pushed: the peer has
            // everything up to here, so there is nothing to push back.
            if push_after >= before && batch.released == batch.inserted {
                let now = w.max_seq()?;
                w.set_push_bookmark(key, now)?;
            }
            Ok(batch)
        })?;
        report.inserted += batch.inserted;
        report.released += batch.released;
        report.duplicates += batch.duplicates;
        Ok(())
    }

    /// Asks the server for the ancestors that held facts wait for, until none is absent
    /// or the server has none of them.
    fn fetch_missing(
        &self,
        store: &Store,
        report: &mut SyncReport,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<()> {
        loop {
            let absent = store.absent_ancestors(1000)?;
            if absent.is_empty() {
                return Ok(());
            }
            let (fetched, mut bad) = decode_records(self.fetch(&absent)?);
            // A fetched record must be one of the facts asked for: anything else fails the
            // hash check and goes to the quarantine like a record that does not decode.
            let mut facts = Vec::with_capacity(fetched.len());
            for f in fetched {
                if absent.contains(&f.hash()) {
                    facts.push(f);
                } else {
                    let reason =
                        format!("fetched fact {} is none of the hashes asked for", f.hash());
                    bad.push((reason, f.canonical_bytes().to_vec()));
                }
            }
            report.fetched += (facts.len() + bad.len()) as u64;
            report.quarantined += bad.len() as u64;
            let useful = facts.iter().any(|f| absent.contains(&f.hash()));
            let peer = self.base.clone();
            let batch = store.write(|w| {
                for (reason, bytes) in &bad {
                    w.quarantine(&peer, reason, bytes)?;
                }
                w.insert_batch(facts)
            })?;
            report.inserted += batch.inserted;
            report.released += batch.released;
            report.duplicates += batch.duplicates;
            progress(Progress {
                phase: Phase::Fetch,
                done: report.fetched,
                total: 0,
            });
            if !useful || batch.inserted + batch.held == 0 {
                return Ok(());
            }
        }
    }

    /// When both sides hold the same fact set, marks everything local as pushed.
    fn skip_push_if_in_sync(&self, store: &Store, key: &str) -> Result<()> {
        let push_after = store.peer(key)?.map_or(0, |p| p.push_after);
        if store.max_seq()? - push_after <= self.batch as i64 {
            return Ok(()); // cheaper to push than to compare
        }
        let remote = self.info()?;
        let local = store.digest_since(SetDigest::default())?;
        if remote.count == local.count && remote.digest == local.xor_hex() {
            store.write(|w| w.set_push_bookmark(key, local.through))?;
        }
        Ok(())
    }

    fn push_all(
        &self,
        store: &Store,
        key: &str,
        report: &mut SyncReport,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<()> {
        /// A push body is cut at this size, well under the server's default body limit.
        const MAX_BODY: usize = 8 << 20;
        let mut first = true;
        loop {
            let after = store.peer(key)?.map_or(0, |p| p.push_after);
            let (count, through) = store.release_page(after, self.batch)?;
            if count == 0 {
                return Ok(());
            }
            let mut body = Vec::new();
            let mut last = after;
            let mut n = 0u64;
            let full = store.for_each_in_range(after, through, |seq, _, bytes| {
                if !body.is_empty() && body.len() + bytes.len() > MAX_BODY {
                    return Err(Error::Io(std::io::ErrorKind::WriteZero.into()));
                }
                body.extend_from_slice(bytes);
                last = seq;
                n += 1;
                Ok(())
            });
            match full {
                Ok(()) | Err(Error::Io(_)) => {}
                Err(e) => return Err(e),
            }
            let answer = self.push_records(&body)?;
            // Pushed to a database that replaced the one the bookmark was written for: the
            // bookmark is back at 0, and the loop pushes everything again. The first answer
            // tells; later ones come from the same server (a write transaction each would
            // only cost time).
            if std::mem::take(&mut first)
                && let Some(id) = &answer.store
                && store.write(|w| w.note_peer_store(key, id))?
            {
                report.replaced = true;
                continue;
            }
            if let Some(r) = answer.rejected.first() {
                return Err(self.protocol(format!(
                    "server rejected record {} of a push: {}",
                    r.index, r.reason
                )));
            }
            if !answer.refused.is_empty() {
                return Err(Error::Remote {
                    url: self.base.clone(),
                    status: 200,
                    code: "refused".into(),
                    message: format!(
                        "{} facts refused: the server's held-fact bound is reached",
                        answer.refused.len()
                    ),
                });
            }
            store.write(|w| w.set_push_bookmark(key, last))?;
            report.pushed += n;
            let remaining = (store.max_seq()? - last).max(0) as u64;
            progress(Progress {
                phase: Phase::Push,
                done: report.pushed,
                total: report.pushed + remaining,
            });
        }
    }
}

/// A pulled page, decoded on the reader thread.
struct Decoded {
    through: i64,
    max_seq: i64,
    last: bool,
    facts: Vec<Fact>,
    bad: Vec<(String, Vec<u8>)>,
    store: Option<String>,
}

/// The [`wire::HEADER_STORE`] header of an answer, if it has a usable one.
fn store_header(headers: &ureq::http::HeaderMap) -> Option<String> {
    headers
        .get(wire::HEADER_STORE)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64)
        .map(str::to_ascii_lowercase)
}

/// Splits received records into facts and refused records (reason, bytes).
fn decode_records(
    records: Vec<std::result::Result<Vec<u8>, FramingError>>,
) -> (Vec<Fact>, Vec<(String, Vec<u8>)>) {
    let mut facts = Vec::with_capacity(records.len());
    let mut bad = Vec::new();
    for r in records {
        match r {
            Ok(bytes) => match Fact::from_canonical(&bytes) {
                Ok(f) => facts.push(f),
                Err(e) => bad.push((e.to_string(), bytes)),
            },
            Err(e) => bad.push((e.reason, e.bytes)),
        }
    }
    (facts, bad)
}

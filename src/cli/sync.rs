//! `serve`, `sync`, `peers` and `poison`: moving facts between nodes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::{Args, Subcommand};
use precedent::FactHash;
use precedent::sync::auth::Tokens;
use precedent::sync::client::{Client, ClientOptions, Direction, Phase, SyncOptions, SyncReport};
use precedent::sync::server::{Limits, ServerConfig, serve_until_signal};
use precedent::sync::wire::DEFAULT_PORT;
use serde_json::json;

use super::{Failure, Global, Status, exit};

/// `precedent serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port, printed on start).
    #[arg(long, value_name = "ADDR", default_value_t = SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)))]
    pub listen: SocketAddr,
    /// Token file (JSON, see docs/protocol.md); without it every request may read and write.
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// PEM certificate chain: serve HTTPS (needs --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Largest request body in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_body_bytes)]
    pub max_body_bytes: usize,
    /// Most records per push or hashes per fetch; also the largest pull page.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_facts_per_request)]
    pub max_facts_per_request: u64,
    /// Most facts pushed by one peer that may wait here for ancestors at once.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_held_per_peer)]
    pub max_held_per_peer: u64,
    /// How long a request may take before its answer starts: 60s, 1m30s; a bare number
    /// is seconds.
    #[arg(long, value_name = "DUR", default_value = "60s",
          value_parser = super::time::parse_secs_or_duration)]
    pub request_timeout: Duration,
    /// Most connections open at once.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_connections)]
    pub max_connections: usize,
    /// How long a `GET /v1/watch` client may read nothing while its events wait before it
    /// is disconnected: 10s, 1m; a bare number is seconds.
    #[arg(long, value_name = "DUR", default_value = "10s",
          value_parser = super::time::parse_secs_or_duration)]
    pub sse_stall: Duration,
    /// The longest a waiting pull, a watch (`GET /v1/watch`) or the events stream goes
    /// without looking for new facts; commits through this server, and on PostgreSQL from
    /// anywhere, wake them at once: 50ms, 1s.
    #[arg(long, value_name = "DUR", default_value = "50ms",
          value_parser = super::time::parse_secs_or_duration)]
    pub poll_interval: Duration,
    /// Most threads running store calls at once (each a database connection on
    /// PostgreSQL); further requests wait their turn without a thread.
    #[arg(long, value_name = "N", default_value_t = precedent::sync::server::STORE_THREADS)]
    pub store_threads: usize,
    /// Most memory, in MiB, that SQLite's page caches hold in this process, over all its
    /// connections (a soft limit: pages beyond it are read again from the file); 0 lifts
    /// it, leaving each connection its own cache. SQLite only.
    #[arg(long, value_name = "MIB", default_value_t = SQLITE_MEMORY_MIB)]
    pub sqlite_memory: u64,
    /// Serve an address other than loopback without --tokens, letting anyone who can
    /// reach it read and write (refused without this flag).
    #[arg(long)]
    pub insecure: bool,
}

/// `serve`'s default `--sqlite-memory`: a hub opens up to `--store-threads` connections,
/// and with each keeping its own page cache of up to 64 MiB SQLite's memory grows with
/// the database long after the hub's own has levelled off (docs/robustness.md, "Soak with
/// 100 clients"). 16 MiB kept a 600 s soak of 100 clients flat; what it costs reads is in
/// docs/performance.md ("Queries").
pub const SQLITE_MEMORY_MIB: u64 = 16;

/// Refuses to serve an address reachable from other hosts without tokens unless
/// `--insecure` says so, as Redis's protected mode does: an open server on the network
/// lets anyone read and write every fact, which a user who only wanted a quick test on
/// `0.0.0.0` did not mean.
fn check_exposure(a: &ServeArgs) -> anyhow::Result<()> {
    if a.tokens.is_some() || a.listen.ip().is_loopback() {
        return Ok(());
    }
    if a.insecure {
        eprintln!(
            "warning: --insecure: serving {} without --tokens: anyone who can reach it may read and write",
            a.listen
        );
        return Ok(());
    }
    Err(Failure::error(
        exit::USAGE,
        format!(
            "refusing to serve {} without --tokens: anyone who can reach it could read and write. \
             Write a token file such as {{\"tokens\": [{{\"name\": \"laptop\", \"token\": \"<a secret: openssl rand -hex 32>\", \
             \"read\": true, \"write\": true}}]}} (docs/protocol.md, \"Tokens\") and pass --tokens FILE; \
             or listen on 127.0.0.1; or pass --insecure to serve it open anyway",
            a.listen
        ),
    ))
}

/// `precedent sync`.
#[derive(Args, Debug)]
pub struct SyncArgs {
    /// The peer's base URL, e.g. http://127.0.0.1:7341.
    pub url: String,
    /// Only pull (and fetch missing ancestors).
    #[arg(long, conflicts_with = "push")]
    pub pull: bool,
    /// Only push.
    #[arg(long)]
    pub push: bool,
    /// Keep syncing as new facts appear, until SIGINT/SIGTERM.
    #[arg(long)]
    pub follow: bool,
    /// Pull only the facts below this root (repeatable): its descendants and their ancestors.
    #[arg(long = "root", value_name = "HASH")]
    pub roots: Vec<String>,
    /// Bearer token.
    #[arg(long, env = "PRECEDENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM certificate to trust for an https peer (a self-signed server).
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Most facts in flight: pulled in pages of N/2 (one committing, one read ahead),
    /// pushed N per request; a killed sync receives or sends again at most N.
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    pub batch: u64,
}

/// `precedent poison ...`.
#[derive(Subcommand, Debug)]
pub enum PoisonCommand {
    /// List quarantined records, newest first.
    List {
        /// Show at most N.
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
    },
    /// Show one quarantined record: where it came from, why, and its bytes in hex.
    Show {
        /// The record's id (from `poison list`).
        id: i64,
        /// Write the raw bytes to stdout instead.
        #[arg(long)]
        raw: bool,
    },
}

pub fn serve(g: &Global, a: ServeArgs) -> anyhow::Result<Status> {
    check_exposure(&a)?;
    drop(g.open(true)?);
    precedent::store::set_sqlite_memory_limit(a.sqlite_memory.saturating_mul(1 << 20));
    let tokens = match &a.tokens {
        Some(p) => Tokens::from_file(p)?,
        None => Tokens::open(),
    };
    let mut config = ServerConfig::new(&g.db);
    config.listen = a.listen;
    config.store_options.max_held = g.max_held();
    config.tokens = tokens;
    config.tls = a.tls_cert.zip(a.tls_key);
    config.decode_threads = super::import::threads();
    config.poll_interval = a.poll_interval.max(Duration::from_millis(1));
    config.store_threads = a.store_threads.max(1);
    config.limits = Limits {
        max_body_bytes: a.max_body_bytes,
        max_facts_per_request: a.max_facts_per_request.max(1),
        max_held_per_peer: a.max_held_per_peer,
        request_timeout: a.request_timeout.max(Duration::from_millis(1)),
        max_connections: a.max_connections.max(1),
        sse_stall: a.sse_stall.max(Duration::from_millis(1)),
        ..Limits::default()
    };
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let open = config.tokens.is_open();
    serve_until_signal(config, |addr| {
        // One line a script can wait for; stderr so stdout stays clean.
        eprintln!("listening on {scheme}://{addr}");
        if open {
            tracing::warn!("no --tokens: every request may read and write");
        }
    })?;
    tracing::info!("stopped");
    Ok(Status::Ok)
}

fn parse_roots(store: &precedent::Store, roots: &[String]) -> anyhow::Result<Vec<FactHash>> {
    roots
        .iter()
        .map(|r| {
            let p = precedent::HashPrefix::parse(r)?;
            match p.full() {
                Some(h) => Ok(h),
                None => Ok(store.resolve(r)?),
            }
        })
        .collect()
}

pub fn sync(g: &Global, a: SyncArgs) -> anyhow::Result<Status> {
    let mut store = g.open(true)?;
    let ca_cert_pem = match &a.ca_cert {
        Some(p) => Some(
            std::fs::read(p)
                .map_err(|e| super::unreadable(format!("cannot read {}", p.display()), &e))?,
        ),
        None => None,
    };
    let client = Client::new(
        &a.url,
        ClientOptions {
            token: a.token.clone(),
            ca_cert_pem,
            batch: a.batch.max(1),
            decode_threads: super::import::threads(),
            ..ClientOptions::default()
        },
    )?;
    let options = SyncOptions {
        direction: match (a.pull, a.push) {
            (true, _) => Direction::Pull,
            (_, true) => Direction::Push,
            _ => Direction::Both,
        },
        roots: parse_roots(&store, &a.roots)?,
    };
    if a.follow {
        return follow(g, &client, &mut store, &options);
    }
    let bar = super::progress(None, "sync");
    let report = client.sync(&store, &options, &mut |p| {
        let phase = match p.phase {
            Phase::Pull => "pulled",
            Phase::Fetch => "fetched",
            Phase::Push => "pushed",
        };
        bar.set_message(format!("{phase} {} of about {}", p.done, p.total));
    });
    bar.finish_and_clear();
    let report = report?;
    print_report(g, &report)?;
    Ok(if report.quarantined > 0 {
        Status::Problems
    } else {
        Status::Ok
    })
}

fn follow(
    g: &Global,
    client: &Client,
    store: &mut precedent::Store,
    options: &SyncOptions,
) -> anyhow::Result<Status> {
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signal(stop.clone());
    let json = g.json;
    client.follow(
        store,
        options,
        Duration::from_secs(25),
        &stop,
        &mut |r| match r {
            Ok(rep) if rep.pulled + rep.pushed + rep.fetched > 0 => {
                if json {
                    println!("{}", report_json(rep));
                } else {
                    eprintln!(
                        "pulled {}, fetched {}, pushed {}, held {}",
                        rep.pulled, rep.fetched, rep.pushed, rep.held
                    );
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("{e} (retrying)"),
        },
    )?;
    Ok(Status::Ok)
}

/// Sets `stop` on SIGINT or SIGTERM, so the loop ends after the round in progress. A
/// round may be waiting on the server for up to 25 s, so if it has not ended 2 s later the
/// process exits: every committed page is kept and its bookmark with it, so nothing is lost.
fn stop_on_signal(stop: Arc<AtomicBool>) {
    super::on_stop_signal(move || {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs(2));
        std::process::exit(0);
    });
}

fn report_json(r: &SyncReport) -> serde_json::Value {
    json!({
        "pulled": r.pulled,
        "fetched": r.fetched,
        "pushed": r.pushed,
        "inserted": r.inserted,
        "released": r.released,
        "duplicates": r.duplicates,
        "held": r.held,
        "quarantined": r.quarantined,
        "remote_seq": r.remote_seq,
        "replaced": r.replaced,
        "bytes_pulled": r.bytes_pulled,
        "bytes_pushed": r.bytes_pushed,
    })
}

fn print_report(g: &Global, r: &SyncReport) -> anyhow::Result<()> {
    if g.json {
        say!("{}", report_json(r));
    } else {
        if r.replaced {
            say!("the peer's database was replaced since the last sync: synced from the start");
        }
        say!(
            "pulled {}, fetched {}, pushed {}; inserted {}, released {}, duplicates {}, held {}, quarantined {}",
            r.pulled,
            r.fetched,
            r.pushed,
            r.inserted,
            r.released,
            r.duplicates,
            r.held,
            r.quarantined
        );
    }
    Ok(())
}

pub fn peers(g: &Global) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    let peers = store.peers()?;
    if g.json {
        for p in &peers {
            say!(
                "{}",
                json!({
                    "url": p.url,
                    "pull_after": p.pull_after,
                    "push_after": p.push_after,
                    "remote_seq": p.remote_seq,
                    "lag": p.lag(),
                    "last_sync_ms": p.last_sync_ms,
                    "last_error": p.last_error,
                })
            );
        }
        return Ok(Status::Ok);
    }
    if peers.is_empty() {
        say!("no peers: this database has not synced with any node");
        return Ok(Status::Ok);
    }
    say!(
        "{:<40}  {:>10}  {:>10}  {:>8}  {:<24}  last error",
        "peer",
        "pulled to",
        "pushed to",
        "lag",
        "last sync (utc)"
    );
    for p in &peers {
        let when = p
            .last_sync_ms
            .map(super::time::format_ms)
            .unwrap_or_else(|| "never".into());
        say!(
            "{:<40}  {:>10}  {:>10}  {:>8}  {:<24}  {}",
            p.url,
            p.pull_after,
            p.push_after,
            p.lag(),
            when,
            p.last_error.as_deref().unwrap_or("-")
        );
    }
    Ok(Status::Ok)
}

pub fn poison(g: &Global, c: PoisonCommand) -> anyhow::Result<Status> {
    let store = g.open(false)?;
    match c {
        PoisonCommand::List { limit } => {
            let list = store.quarantine(limit)?;
            if g.json {
                for q in &list {
                    say!(
                        "{}",
                        json!({"id": q.id, "peer": q.peer, "received_ms": q.received_ms,
                               "reason": q.reason, "bytes": q.bytes.len()})
                    );
                }
                return Ok(Status::Ok);
            }
            if list.is_empty() {
                say!("no quarantined records");
                return Ok(Status::Ok);
            }
            say!(
                "{:>6}  {:<20}  {:<20}  {:>8}  reason",
                "id",
                "peer",
                "received (utc)",
                "bytes"
            );
            for q in &list {
                say!(
                    "{:>6}  {:<20}  {:<20}  {:>8}  {}",
                    q.id,
                    q.peer,
                    super::time::format_ms(q.received_ms),
                    q.bytes.len(),
                    q.reason
                );
            }
            Ok(Status::Ok)
        }
        PoisonCommand::Show { id, raw } => {
            let Some(q) = store.quarantined(id)? else {
                return Err(Failure::error(
                    exit::NOT_FOUND,
                    format!("no quarantined record {id}"),
                ));
            };
            if raw {
                use std::io::Write;
                std::io::stdout().write_all(&q.bytes)?;
                return Ok(Status::Ok);
            }
            if g.json {
                say!(
                    "{}",
                    json!({"id": q.id, "peer": q.peer, "received_ms": q.received_ms,
                           "reason": q.reason, "bytes_hex": hex::encode(&q.bytes)})
                );
            } else {
                say!("id        {}", q.id);
                say!("peer      {}", q.peer);
                say!("received  {}", super::time::format_ms(q.received_ms));
                say!("reason    {}", q.reason);
                say!(
                    "bytes     {} ({} bytes)",
                    hex::encode(&q.bytes),
                    q.bytes.len()
                );
            }
            Ok(Status::Ok)
        }
    }
}

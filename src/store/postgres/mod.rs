//! The PostgreSQL backend: a pool of connections to one database, the schema migrations
//! of `schema/postgres/`, and all SQL of the fact core on PostgreSQL.
//!
//! - `conn.rs`: connections with their prepared statements, transactions ([`conn::Tx`]),
//!   the [`Sql`](crate::store::Sql) seam; `params.rs`: its values (`?N` rewritten to `$N`,
//!   arguments bound as the server's inferred types, columns read back).
//! - `errors.rs`: PostgreSQL's errors as the crate's, saying which failure it is.
//! - `migrate.rs`: the schema versions, applied at open under a lock.
//! - `names.rs`: type and role ids, cached.
//! - `write.rs`: inserts, the held set and its cascades, release; `batch.rs`: a batch
//!   of inserts in a few round trips, `cascade.rs` its cascades; `held.rs`: dropping
//!   held facts.
//! - `recent.rs`: released facts seen lately, so a batch looks up only the others.
//! - `read.rs`: reads; `verify.rs`: the whole-store check.
//! - `tls.rs`: `sslmode`, `sslrootcert`, `sslcert`, `sslkey` as libpq reads them, over
//!   rustls; `libpq.rs`: what libpq takes from its environment variables and its
//!   password file for what a URL leaves out.
//! - `notify.rs`: the listener that wakes waiters on `NOTIFY` (started by the first wait).
//!
//! Concurrency (`docs/design.md`, "The PostgreSQL backend"): writes run READ COMMITTED
//! and take one transaction-level advisory lock before their first fact or held-set
//! change, so the decisions to hold or release and the numbering of releases are
//! serialized across processes and hosts, and sequence numbers, drawn from a counter row
//! under that lock, follow commit order with no gaps. Reads run REPEATABLE READ READ ONLY:
//! one snapshot each.

mod batch;
mod cascade;
mod conn;
mod errors;
mod held;
mod libpq;
mod migrate;
mod names;
mod notify;
mod params;
mod read;
mod recent;
mod stream;
mod tls;
mod verify;
mod write;

use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use postgres::{Client, NoTls};

use super::backend::{Backend, ReadTx, WriteTx};
use super::{Durability, StoreOptions};
use crate::error::{Error, Result};
pub use migrate::PG_SCHEMA_VERSION;
use names::NameCache;

/// The oldest PostgreSQL the backend runs on (`server_version_num`): 13, for
/// `gen_random_uuid` in the core and the planner features the queries rely on.
pub const MIN_SERVER_VERSION: i32 = 130_000;

/// The advisory lock every write transaction that changes facts or the held set takes
/// (`pg_advisory_xact_lock`), held to its commit: "prec" "dent" in ASCII.
const WRITE_LOCK: i64 = 0x7072_6563_6465_6e74;

/// Idle connections kept open between transactions.
const IDLE: usize = 8;

/// What every transaction of one backend shares.
pub(crate) struct Shared {
    pub(crate) names: NameCache,
    pub(crate) options: StoreOptions,
    pub(crate) reprepares: AtomicU64,
    /// Released facts seen lately, and when a batch may be guessed new.
    pub(crate) recent: recent::Recent,
    /// Roles whose `edge_more` partition is committed (schema version 7,
    /// `Tx::partitions_on`).
    pub(crate) partitions: Mutex<std::collections::HashSet<i64>>,
}

/// A store's database in PostgreSQL.
pub struct PostgresBackend {
    config: postgres::Config,
    /// The TLS connector, `None` with `sslmode=disable`.
    tls: Option<tls::MakeRustlsConnect>,
    /// The URL as given, with its password hidden: what messages name.
    url: String,
    /// Where the password came from (the URL, `PGPASSWORD`, the password file), for the
    /// message of a refused connection.
    password: libpq::Password,
    idle: Mutex<Vec<conn::PgConn>>,
    pub(crate) shared: Shared,
    /// The `LISTEN` thread, once something waits for a wake-up.
    listener: Mutex<Option<notify::Listener>>,
}

pub(crate) type PgBackend = PostgresBackend;

impl Drop for PostgresBackend {
    /// Closes the idle connections on a thread of their own: the blocking client closes
    /// on a runtime of its own, which panics inside an async runtime ("Cannot start a
    /// runtime from within a runtime"), where a sync server drops its store.
    fn drop(&mut self) {
        // Stopped and joined first: it holds a connection of its own.
        drop(
            self.listener
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        let idle = std::mem::take(self.idle.get_mut().unwrap_or_else(|e| e.into_inner()));
        if !idle.is_empty() {
            let _ = std::thread::spawn(move || drop(idle)).join();
        }
    }
}

impl PostgresBackend {
    /// Connects to the database at `url` (a libpq URL: user, password, host, port,
    /// database, `application_name`, `connect_timeout`, ..., and TLS as libpq's
    /// `sslmode=disable|prefer|require|verify-ca|verify-full`, `sslrootcert`, `sslcert`,
    /// `sslkey`: see `tls.rs`; what it leaves out from libpq's environment variables,
    /// `PGHOST`, `PGUSER`, `PGPASSWORD`, ..., and its password file: see `libpq.rs`),
    /// checks the server's version and migrates the schema.
    ///
    /// # Errors
    /// [`Error::Open`] saying why it cannot connect (the server is down, the password was
    /// refused, the server is older than [`MIN_SERVER_VERSION`]);
    /// [`Error::SchemaTooNew`]; [`Error::NeedsMigration`] for a read-only open of an older
    /// schema.
    pub fn open(url: &str, options: StoreOptions) -> Result<PostgresBackend> {
        let bad =
            |e: String| errors::open(url, format!("not a postgresql url: {e}").to_lowercase());
        let env = libpq::process_env;
        let with_port = libpq::port_in_url(url, &env).map_err(|e| errors::open(url, e))?;
        let (driver_url, tls) = tls::split(&with_port, &env).map_err(bad)?;
        // With the driver's cause: which option is unknown or has a bad value.
        let mut config =
            postgres::Config::from_str(&driver_url).map_err(|e| bad(errors::one_line(&e)))?;
        let password = libpq::complete(&mut config, &env).map_err(|e| errors::open(url, e))?;
        config.ssl_mode(tls.driver_mode());
        let tls = tls.connector().map_err(|e| errors::open(url, e))?;
        if config.get_application_name().is_none() {
            config.application_name("precedent");
        }
        let backend = PostgresBackend {
            config,
            tls,
            url: errors::redact(url),
            password,
            idle: Mutex::new(Vec::new()),
            shared: Shared {
                names: NameCache::default(),
                options,
                reprepares: AtomicU64::new(0),
                recent: recent::Recent::default(),
                partitions: Mutex::default(),
            },
            listener: Mutex::new(None),
        };
        let mut first = backend.connect()?;
        backend.check_version(&mut first.client)?;
        migrate::migrate(
            &mut first.client,
            &backend.url,
            backend.shared.options.read_only,
        )?;
        backend.give_back(first);
        Ok(backend)
    }

    fn check_version(&self, client: &mut Client) -> Result<()> {
        let row = client
            .query_one(
                "SELECT current_setting('server_version_num')::int, current_setting('server_version')",
                &[],
            )
            .map_err(errors::backend)?;
        let (num, text): (i32, String) = (row.get(0), row.get(1));
        if num < MIN_SERVER_VERSION {
            return Err(errors::open(
                &self.url,
                format!(
                    "server is postgresql {text}, older than the {} precedent needs",
                    MIN_SERVER_VERSION / 10_000
                ),
            ));
        }
        Ok(())
    }

    /// A new connection, set up for the store's options.
    fn connect(&self) -> Result<conn::PgConn> {
        let mut client = connect(&self.config, self.tls.as_ref())
            .map_err(|e| errors::connect(e, &self.url, &self.config, &self.password))?;
        let o = &self.shared.options;
        let sync = match o.durability {
            Durability::Full => "on",
            Durability::Normal => "off",
        };
        client
            .batch_execute(&format!(
                "SET lock_timeout = {}; SET synchronous_commit = {sync}",
                o.busy_timeout.as_millis().max(1)
            ))
            .map_err(errors::backend)?;
        Ok(conn::PgConn::new(client))
    }

    /// An idle connection, or a new one.
    pub(crate) fn connection(&self) -> Result<conn::PgConn> {
        let idle = lock(&self.idle).pop();
        match idle {
            Some(c) if !c.client.is_closed() => Ok(c),
            _ => self.connect_again(),
        }
    }

    /// A new connection, in place of a lost one: the idle ones are dropped too, as they
    /// were probably lost together (a server restart).
    pub(crate) fn fresh_connection(&self) -> Result<conn::PgConn> {
        lock(&self.idle).clear();
        self.connect_again()
    }

    /// A new connection mid-run: a failure is a backend failure the caller may retry.
    fn connect_again(&self) -> Result<conn::PgConn> {
        match self.connect() {
            Ok(c) => Ok(c),
            Err(e) => Err(match e {
                // Mid-run, a failed connect is a backend failure the caller may retry,
                // not a bad URL.
                Error::Open { reason, .. } => Error::Backend(crate::error::BackendError::new(
                    crate::error::BackendErrorKind::Unavailable,
                    format!("postgres: {reason}"),
                )),
                e => e,
            }),
        }
    }

    pub(crate) fn give_back(&self, conn: conn::PgConn) {
        if conn.client.is_closed() || conn.broken.is_some() {
            return;
        }
        let mut idle = lock(&self.idle);
        if idle.len() < IDLE {
            idle.push(conn);
        }
    }

    /// The URL the store was opened with, its password hidden.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// The listener's connection settings: `config`'s, with TCP keepalives that find a dead
/// connection within about a minute. The listener only reads, for as long as the store
/// lives, so a connection that died without a reset (a NAT or firewall dropping it when
/// idle, a failover) would show only to keepalives, after two hours by default; until
/// then waiters would fall back to their poll interval. What the URL sets is kept.
fn listener_config(config: &postgres::Config) -> postgres::Config {
    let mut config = config.clone();
    if !config.get_keepalives() {
        // Turned off in the URL (`keepalives=0`).
        return config;
    }
    if config.get_keepalives_idle() == DRIVER_KEEPALIVES_IDLE {
        config.keepalives_idle(Duration::from_secs(30));
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(Duration::from_secs(10));
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(3);
    }
    config
}

/// The driver's keepalive idle time when the URL sets none (libpq's is the system's).
const DRIVER_KEEPALIVES_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// A client connected as `config` says, over TLS when `tls` is given.
fn connect(
    config: &postgres::Config,
    tls: Option<&tls::MakeRustlsConnect>,
) -> std::result::Result<Client, postgres::Error> {
    match tls {
        Some(tls) => config.connect(tls.clone()),
        None => config.connect(NoTls),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Backend for PostgresBackend {
    fn read(&self) -> Result<Box<dyn ReadTx + '_>> {
        let mut tx = conn::Tx::begin(self, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
        tx.read_only = true;
        Ok(Box::new(tx))
    }

    fn write(&self) -> Result<Box<dyn WriteTx + '_>> {
        if self.shared.options.read_only {
            return Err(Error::ReadOnly {
                path: self.url.clone().into(),
            });
        }
        Ok(Box::new(write::PgWrite::begin(self)?))
    }

    fn dialect(&self) -> crate::store::Dialect {
        crate::store::Dialect::Postgres
    }

    fn reprepares(&self) -> u64 {
        self.shared
            .reprepares
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn path(&self) -> Option<&std::path::Path> {
        None
    }

    /// Runs a push's first statements once on an idle connection, in a transaction
    /// rolled back: the `COPY`s of facts and edges with no rows, and the look-ups of
    /// names and hashes prepared. A fresh connection's first push otherwise builds
    /// PostgreSQL's caches of both tables and their indexes as it writes, about 4 ms
    /// (`docs/performance.md`). The connection goes back to the pool, where the first
    /// push takes it. A read-only store does nothing.
    fn warm(&self) -> Result<()> {
        if self.shared.options.read_only {
            return Ok(());
        }
        let tx = conn::Tx::begin(self, "BEGIN ISOLATION LEVEL READ COMMITTED")?;
        let mut prepare = names::STATEMENTS.to_vec();
        prepare.push(batch::LOOK_UP);
        tx.warm(&prepare)
        // Dropped: rolled back, the connection given back.
    }

    fn listen(&self, wake: &std::sync::Arc<crate::store::Wake>) {
        let mut listener = lock(&self.listener);
        if listener.is_some() {
            return;
        }
        let (config, tls) = (listener_config(&self.config), self.tls.clone());
        let connect = move || connect(&config, tls.as_ref()).map_err(|e| e.to_string());
        // A thread that cannot start leaves the waiters polling; the next wait tries again.
        *listener = notify::Listener::start(connect, wake.clone()).ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_probes_an_idle_connection_unless_the_url_says_otherwise() {
        let config = |url: &str| listener_config(&postgres::Config::from_str(url).unwrap());
        let c = config("postgres://u@h/d");
        assert!(c.get_keepalives());
        assert_eq!(c.get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(c.get_keepalives_interval(), Some(Duration::from_secs(10)));
        assert_eq!(c.get_keepalives_retries(), Some(3));
        let c = config("postgres://u@h/d?keepalives_idle=90");
        assert_eq!(c.get_keepalives_idle(), Duration::from_secs(90));
        assert!(!config("postgres://u@h/d?keepalives=0").get_keepalives());
    }
}

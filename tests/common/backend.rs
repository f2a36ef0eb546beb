//! The conformance suite's backends: one test source run on SQLite and on PostgreSQL.
//!
//! A test written as `conformance! { fn name(b: Backend) { ... } }` becomes the function
//! `name` and two tests, `name::sqlite` and `name::postgres`, that call it with each
//! backend (the shape of River's driver conformance suite). Inside, the test opens its
//! stores through the backend: [`Backend::store`] for a private store (SQLite's
//! temporary store, a fresh PostgreSQL database), [`Backend::db`] for a database that is
//! opened more than once (reopening, several connections). PostgreSQL comes from
//! `tests/common/pg.rs`: one throwaway cluster per test binary, a fresh database per
//! test; without PostgreSQL the `postgres` arm prints the harness's loud `SKIPPED` line
//! and passes, and under `CI` it fails.
//!
//! `conformance_sync! { fn name(server: Backend, client: Backend) { ... } }` runs a test
//! of two sides on the pairs SQLite↔SQLite, PostgreSQL server ↔ SQLite client and
//! PostgreSQL↔PostgreSQL (tests `name::sqlite_sqlite`, `name::postgres_sqlite`,
//! `name::postgres_postgres`).

use std::path::PathBuf;

use precedent::store::Dialect;
use precedent::{Store, StoreOptions};

use super::pg;

/// The backend a conformance test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Whether the PostgreSQL arm can run: starts this binary's cluster on first call;
/// `false` after the harness's `SKIPPED` line when PostgreSQL is not installed (under
/// `CI` the harness panics instead).
pub fn postgres_ready() -> bool {
    pg::cluster().is_some()
}

impl Backend {
    /// Whether this backend's tests can run here (see [`postgres_ready`]).
    pub fn ready(self) -> bool {
        self == Backend::Sqlite || postgres_ready()
    }

    /// A private, empty store with default options.
    pub fn store(self) -> Store {
        self.store_with(StoreOptions::default())
    }

    /// A private, empty store with `options`: SQLite's temporary store
    /// ([`Store::open_in_memory_with`]), or a fresh PostgreSQL database.
    pub fn store_with(self, options: StoreOptions) -> Store {
        match self {
            Backend::Sqlite => Store::open_in_memory_with(options).unwrap(),
            Backend::Postgres => self.db().store_with(options),
        }
    }

    /// A fresh database that does not exist yet (SQLite: a path in a temporary folder;
    /// PostgreSQL: an empty database), to open as often as the test needs.
    pub fn db(self) -> TestDb {
        match self {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let location = dir.path().join("test.db");
                TestDb {
                    backend: self,
                    location,
                    pg: None,
                    _dir: Some(dir),
                }
            }
            Backend::Postgres => {
                let db = pg::db().expect("the postgres arm runs only with PostgreSQL");
                TestDb {
                    backend: self,
                    location: PathBuf::from(&db.url),
                    pg: Some(db),
                    _dir: None,
                }
            }
        }
    }
}

/// The type of a byte-string column in a table a test creates through `store`'s own
/// SQL connection: SQLite's `BLOB`, PostgreSQL's `BYTEA`.
pub fn blob_type(store: &Store) -> &'static str {
    if store.dialect() == Dialect::Postgres {
        "BYTEA"
    } else {
        "BLOB"
    }
}

/// A database of one test on one backend.
pub struct TestDb {
    /// Its backend.
    pub backend: Backend,
    /// What `Store::open_with` takes: the SQLite file's path or the PostgreSQL URL.
    pub location: PathBuf,
    /// The PostgreSQL database, for `psql`.
    pub pg: Option<pg::PgDb>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// The database opened with default options.
    pub fn store(&self) -> Store {
        Store::open(&self.location).unwrap()
    }

    /// The database opened with `options`.
    pub fn store_with(&self, options: StoreOptions) -> Store {
        Store::open_with(&self.location, options).unwrap()
    }

    /// Runs one data-changing statement underneath the store (with SQLite alone or with
    /// `psql`), to damage or set up rows; returns the rows it changed. SQLite's
    /// connection has foreign keys off, as the store's own have.
    pub fn exec(&self, sql: &str) -> usize {
        match &self.pg {
            None => {
                let c = rusqlite::Connection::open(&self.location).unwrap();
                c.pragma_update(None, "foreign_keys", "OFF").unwrap();
                c.execute(sql, []).unwrap()
            }
            Some(db) => db
                .psql(&format!(
                    "WITH c AS ({sql} RETURNING 1) SELECT count(*) FROM c"
                ))
                .parse()
                .unwrap(),
        }
    }

    /// The one integer `sql` selects, read underneath the store.
    pub fn query_i64(&self, sql: &str) -> i64 {
        match &self.pg {
            None => rusqlite::Connection::open(&self.location)
                .unwrap()
                .query_row(sql, [], |r| r.get(0))
                .unwrap(),
            Some(db) => db.psql(sql).parse().unwrap(),
        }
    }

    /// `bytes` as a literal of this backend's SQL (`x'..'`, `'\x..'::bytea`).
    pub fn blob(&self, bytes: &[u8]) -> String {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        match self.backend {
            Backend::Sqlite => format!("x'{hex}'"),
            Backend::Postgres => format!("'\\x{hex}'::bytea"),
        }
    }

    /// Empties the database, as if it were fresh (for property tests, whose cases share
    /// one database: a database per case would cost a `CREATE DATABASE` each). Every
    /// store opened on it must be dropped first.
    pub fn reset(&self) {
        match &self.pg {
            None => {
                let _ = std::fs::remove_file(&self.location);
                for ext in ["-wal", "-shm"] {
                    let mut p = self.location.clone().into_os_string();
                    p.push(ext);
                    let _ = std::fs::remove_file(p);
                }
            }
            Some(db) => {
                db.psql("DROP SCHEMA public CASCADE; CREATE SCHEMA public");
            }
        }
    }
}

/// Tests run on both backends from one source: see the module's documentation.
#[macro_export]
macro_rules! conformance {
    // A test whose PostgreSQL arm is left out (with a `FIXME(postgres)` comment saying
    // what fails): only `name::sqlite`.
    (@sqlite_only $(#[$meta:meta])* fn $name:ident($b:ident : Backend) $body:block) => {
        $(#[$meta])*
        fn $name($b: $crate::common::backend::Backend) $body

        mod $name {
            $crate::conformance!(@arm $name, sqlite, Sqlite);
        }
    };
    // One test `arm` calling `name` with the backends given, when they are all there.
    (@arm $name:ident, $arm:ident, $($v:ident),+) => {
        #[test]
        fn $arm() {
            use $crate::common::backend::Backend;
            if $(Backend::$v.ready())&&+ {
                super::$name($(Backend::$v),+)
            }
        }
    };
    ($($(#[$meta:meta])* fn $name:ident($b:ident : Backend) $body:block)*) => {$(
        $(#[$meta])*
        fn $name($b: $crate::common::backend::Backend) $body

        mod $name {
            $crate::conformance!(@arm $name, sqlite, Sqlite);
            #[cfg(feature = "postgres")]
            $crate::conformance!(@arm $name, postgres, Postgres);
        }
    )*};
}

/// Tests of a server and a client run on the pairs of backends: see the module's
/// documentation.
#[macro_export]
macro_rules! conformance_sync {
    ($($(#[$meta:meta])* fn $name:ident($s:ident : Backend, $c:ident : Backend) $body:block)*) => {$(
        $(#[$meta])*
        fn $name($s: $crate::common::backend::Backend, $c: $crate::common::backend::Backend) $body

        mod $name {
            $crate::conformance!(@arm $name, sqlite_sqlite, Sqlite, Sqlite);
            #[cfg(feature = "postgres")]
            $crate::conformance!(@arm $name, postgres_sqlite, Postgres, Sqlite);
            #[cfg(feature = "postgres")]
            $crate::conformance!(@arm $name, postgres_postgres, Postgres, Postgres);
        }
    )*};
}

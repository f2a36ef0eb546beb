//! A database file in a temporary directory, opened in this process (the commands that
//! run the binary against it are in `bin.rs`, under the `cli` feature).

use std::path::PathBuf;

use precedent::Store;

/// A database file in a temporary directory.
pub struct Db {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl Db {
    /// A path for a database that does not exist yet.
    pub fn new() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("test.db");
        Db { _dir: dir, path }
    }

    /// A database created (at the current schema version) and closed again.
    pub fn init() -> Db {
        let db = Db::new();
        drop(db.store());
        db
    }

    /// The database opened in this process.
    pub fn store(&self) -> Store {
        Store::open(&self.path).unwrap()
    }

    /// The database opened with SQLite alone, to damage or inspect what the store wrote.
    pub fn raw(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(&self.path).unwrap()
    }

    /// Released and held counts.
    pub fn counts(&self) -> (u64, u64) {
        let s = self.store();
        (s.count_and_max_seq().unwrap().0, s.held_count().unwrap())
    }

    /// Asserts that `verify` finds nothing wrong.
    pub fn assert_clean(&self) {
        let v = self.store().verify(|_| {}).unwrap();
        assert!(v.is_clean(), "{:?}", v.problems);
    }
}

//! Running the `precedent` binary against a temporary database.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use precedent::Store;
use serde_json::Value as Json;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_precedent");

/// `precedent --db DB ARGS..`, with `PRECEDENT_DB` and `PRECEDENT_TOKEN` cleared so that
/// the environment of whoever runs the tests cannot point a command elsewhere.
pub fn cmd(db: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--db")
        .arg(db)
        .args(args)
        .env_remove("PRECEDENT_DB")
        .env_remove("PRECEDENT_TOKEN");
    c
}

/// Runs a command with `stdin` as its input and waits for it, whatever its exit code.
pub fn run(db: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = cmd(db, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// Runs a command that must succeed.
pub fn run_ok(db: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let out = run(db, args, stdin);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    out
}

/// A database file in a temporary directory, and commands run against it.
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

    /// `precedent --db PATH ARGS..`, with `PRECEDENT_DB` cleared.
    pub fn cmd(&self, args: &[&str]) -> Command {
        cmd(&self.path, args)
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.run_with(args, b"")
    }

    pub fn run_with(&self, args: &[&str], stdin: &[u8]) -> Output {
        run(&self.path, args, stdin)
    }

    /// Runs a command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs a command with `--json` that must succeed; returns its parsed stdout.
    pub fn json(&self, args: &[&str]) -> Json {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        serde_json::from_str(&self.ok(&all)).unwrap()
    }
}

pub fn code(out: &Output) -> i32 {
    out.status.code().expect("exited normally")
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

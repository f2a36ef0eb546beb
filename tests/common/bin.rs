//! Running the `precedent` binary against a temporary database (needs the `cli` feature).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value as Json;

pub use super::db::Db;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_precedent");

/// `precedent --db DB ARGS..`, with `PRECEDENT_DB` and `PRECEDENT_TOKEN` cleared so that
/// the environment of whoever runs the tests cannot point a command elsewhere, and no
/// config file of theirs read (`PRECEDENT_CONFIG` cleared, the XDG directory a missing
/// one).
pub fn cmd(db: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--db").arg(db).args(args);
    isolate(&mut c);
    c
}

/// libpq's variables that a `postgres://` URL's missing parts are taken from
/// (src/store/postgres/libpq.rs, tls.rs).
pub const LIBPQ_VARS: &[&str] = &[
    "PGHOST",
    "PGPORT",
    "PGDATABASE",
    "PGUSER",
    "PGPASSWORD",
    "PGOPTIONS",
    "PGAPPNAME",
    "PGCONNECT_TIMEOUT",
    "PGSSLMODE",
    "PGSSLROOTCERT",
    "PGSSLCERT",
    "PGSSLKEY",
];

/// Clears what the environment of whoever runs the tests could change a command with:
/// precedent's variables, its config file, and libpq's variables and password file.
pub fn isolate(c: &mut Command) -> &mut Command {
    for var in LIBPQ_VARS {
        c.env_remove(var);
    }
    c.env_remove("PRECEDENT_DB")
        .env_remove("PRECEDENT_TOKEN")
        .env_remove("PRECEDENT_CONFIG")
        .env_remove("PRECEDENT_CLOCK_OFFSET_MS")
        .env("PGPASSFILE", "/nonexistent/precedent-tests/pgpass")
        .env("XDG_CONFIG_HOME", "/nonexistent/precedent-tests")
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

impl Db {
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

    /// Runs a command with `--json` that must succeed and print JSON Lines (a list or a
    /// stream); returns each line parsed.
    pub fn json_lines(&self, args: &[&str]) -> Vec<Json> {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        json_lines(&self.ok(&all))
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

/// Each line of JSON Lines output parsed; panics on a line that is not one JSON document.
pub fn json_lines(text: &str) -> Vec<Json> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

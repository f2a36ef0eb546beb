//! Running the `precedent` binary against a temporary database.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value as Json;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_precedent");

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

    /// `precedent --db PATH ARGS..`, with `PRECEDENT_DB` cleared.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.arg("--db").arg(&self.path).args(args);
        c.env_remove("PRECEDENT_DB");
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.run_with(args, b"")
    }

    pub fn run_with(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = self
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
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

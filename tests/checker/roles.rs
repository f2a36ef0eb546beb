//! The processes of a checker run: each role (a server, a syncer, a worker) is one
//! `precedent` command line, started again by the supervisor after it dies, paused with
//! SIGSTOP, and killed with SIGKILL when dropped.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use precedent::clock::CLOCK_OFFSET_ENV;

use crate::common::bin::cmd;
use crate::common::process::kill;

/// What a role is, for the faults that pick one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `precedent serve` on the hub's database.
    Server,
    /// `precedent sync --follow` of a node to the hub.
    Syncer,
    /// `precedent work`, on the hub's database or `--remote`.
    Worker,
}

/// One process of the run, restarted when it dies.
pub struct Role {
    pub name: String,
    pub kind: Kind,
    /// The database given as `--db`.
    db: PathBuf,
    /// The arguments after `--db DB`.
    args: Vec<String>,
    /// Extra environment of the process.
    env: Vec<(String, String)>,
    /// `PRECEDENT_CLOCK_OFFSET_MS` of the next start (0: none).
    pub skew_ms: i64,
    /// Stdout and stderr go here (appended), for a look after a failure.
    pub log: PathBuf,
    child: Option<Child>,
    /// Stopped with SIGSTOP until then.
    paused_until: Option<Instant>,
    /// Not started again before then (a kill's down time).
    down_until: Option<Instant>,
    /// Kept down by the checker (the syncers, at the drain).
    pub held: bool,
    /// How many times it was started.
    pub starts: usize,
}

impl Role {
    pub fn new(
        name: &str,
        kind: Kind,
        db: PathBuf,
        args: &[&str],
        log_dir: &std::path::Path,
    ) -> Role {
        Role {
            name: name.to_string(),
            kind,
            db,
            args: args.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            skew_ms: 0,
            log: log_dir.join(format!("{name}.log")),
            child: None,
            paused_until: None,
            down_until: None,
            held: false,
            starts: 0,
        }
    }

    /// Sets an environment variable of every start.
    pub fn env(mut self, key: &str, value: &str) -> Role {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    fn spawn(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let mut c = cmd(&self.db, &args);
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        c.envs(self.env.iter().map(|(k, v)| (k, v)))
            .env(CLOCK_OFFSET_ENV, self.skew_ms.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.child = Some(c.spawn().unwrap());
        self.starts += 1;
    }

    /// The running process's id.
    fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: signalling our own child, which is not reaped while we hold it.
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// SIGKILL; started again by [`Role::supervise`] after `down`.
    pub fn kill(&mut self, down: Duration) {
        if let Some(mut c) = self.child.take() {
            kill(&mut c);
        }
        self.paused_until = None;
        self.down_until = Some(Instant::now() + down);
    }

    /// SIGSTOP until `d` from now (or a later pause's end).
    pub fn pause(&mut self, d: Duration) {
        let until = Instant::now() + d;
        self.paused_until = Some(self.paused_until.map_or(until, |u| u.max(until)));
        self.signal(libc::SIGSTOP);
    }

    /// Resumes a paused process at once.
    pub fn resume(&mut self) {
        if self.paused_until.take().is_some() {
            self.signal(libc::SIGCONT);
        }
    }

    /// Resumes a pause that is over, notes a death, starts the role again when its down
    /// time is over.
    pub fn supervise(&mut self) {
        let now = Instant::now();
        if self.paused_until.is_some_and(|u| u <= now) {
            self.resume();
        }
        if let Some(c) = self.child.as_mut()
            && c.try_wait().unwrap().is_some()
        {
            self.child = None;
            // A process that exits on its own (a server that found PostgreSQL down) is
            // started again, but not in a tight loop.
            self.down_until = Some(now + Duration::from_millis(200));
        }
        if self.child.is_none() && !self.held && self.down_until.is_none_or(|u| u <= now) {
            self.down_until = None;
            self.spawn();
        }
    }

    /// Kills the process and keeps it down.
    pub fn hold(&mut self) {
        self.kill(Duration::ZERO);
        self.held = true;
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill(&mut c);
        }
    }
}

//! Child processes killed on purpose: SIGKILL at a random moment, and a `precedent serve`
//! child whose address is read from what it prints.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rand::RngExt;
use rand::rngs::StdRng;

use super::bin::cmd;

/// SIGKILLs `child` if it still runs; returns whether it did.
pub fn kill(child: &mut Child) -> bool {
    let running = child.try_wait().unwrap().is_none();
    if running {
        child.kill().unwrap(); // SIGKILL
    }
    child.wait().unwrap();
    running
}

/// Sleeps a random moment of at least a millisecond and less than `max` (seeded, so a
/// failing run can be replayed).
pub fn random_pause(rng: &mut StdRng, max: Duration) {
    let us = rng.random_range(1_000..max.as_micros().max(2_000) as u64);
    std::thread::sleep(Duration::from_micros(us));
}

/// Spawns a child with no stdio, sleeps a random moment, and SIGKILLs it. Returns whether
/// the child was still running when the kill landed.
pub fn spawn_and_kill(c: &mut Command, rng: &mut StdRng, max_delay: Duration) -> bool {
    let mut child = quiet(c).spawn().unwrap();
    random_pause(rng, max_delay);
    kill(&mut child)
}

/// `c` with no stdin and its output thrown away.
pub fn quiet(c: &mut Command) -> &mut Command {
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
}

/// A `precedent serve` child on a free port of 127.0.0.1; killed when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Server {
    /// Starts a server on `db` and waits for the line naming its address.
    pub fn start(db: &Path) -> Server {
        Server::start_with(db, &["--listen", "127.0.0.1:0"])
    }

    /// Starts `serve ARGS..` on `db` (ARGS naming its `--listen` address) and waits for
    /// the line naming its address.
    pub fn start_with(db: &Path, args: &[&str]) -> Server {
        let mut child = cmd(db, &[&["serve"], args].concat())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines.next().expect("serve exited").unwrap();
            if let Some(u) = line.strip_prefix("listening on ") {
                break u.trim().to_string();
            }
        };
        // Keep reading, so the server never writes to a closed pipe.
        std::thread::spawn(move || for _ in lines {});
        Server { child, url }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// Whether process `pid` is gone (or a zombie, which runs nothing).
pub fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

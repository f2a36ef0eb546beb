//! The hub of the soak: `precedent serve` on a SQLite file or a PostgreSQL database.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use precedent::{Store, StoreOptions};

use super::Config;
use crate::common;

pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// The hub: its database, its server process and URL.
pub struct Hub {
    pub db: PathBuf,
    pub sqlite: bool,
    pub server: Child,
    pub url: String,
}

impl Hub {
    pub fn start(dir: &Path, config: &Config) -> Hub {
        let (db, sqlite) = match &config.db_url {
            Some(url) => (PathBuf::from(url), false),
            None => (dir.join("hub.db"), true),
        };
        let run = |args: &[&str]| {
            let out = Command::new(common::BIN)
                .arg("--db")
                .arg(&db)
                .args(args)
                .env_remove("PRECEDENT_DB")
                .env_remove("PRECEDENT_TOKEN")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&["init"]);
        run(&[
            "queue",
            "add",
            "jobs",
            "--input",
            "Soak.Job",
            "--done-by",
            "Soak.Done.job",
            "--lease",
            "30s",
        ]);
        let (server, url) = common::serve(&db);
        Hub {
            db,
            sqlite,
            server,
            url,
        }
    }

    pub fn open(&self) -> Store {
        Store::open_with(&self.db, StoreOptions::default()).unwrap()
    }

    pub fn db_bytes(&self) -> u64 {
        if !self.sqlite {
            return 0;
        }
        let wal = PathBuf::from(format!("{}-wal", self.db.display()));
        [self.db.clone(), wal]
            .iter()
            .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
            .sum()
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        // SIGTERM: serve stops cleanly on it.
        unsafe { libc::kill(self.server.id() as i32, libc::SIGTERM) };
        let _ = self.server.wait();
    }
}

/// `precedent_sqlite_memory_bytes` from the hub's `/metrics` (0 if it cannot be read).
pub fn sqlite_bytes(agent: &ureq::Agent, url: &str) -> u64 {
    agent
        .get(format!("{url}/metrics"))
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("precedent_sqlite_memory_bytes "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

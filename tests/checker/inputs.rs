//! The producers: batches of unique inputs imported on a node or on the hub while the
//! faults run, each recorded as attempted before its command starts and as acknowledged
//! when the command exited 0. Some imports are SIGKILLed at a random moment: whether
//! they committed is for the tally to find out.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::common::bin::cmd;
use crate::common::process::{kill, quiet};

/// What the producers claimed: every id tried, and those whose import exited 0.
#[derive(Default)]
pub struct Ledger {
    pub attempted: BTreeSet<String>,
    pub acknowledged: BTreeSet<String>,
}

/// One producer: `batches` batches of `per_batch` inputs on `db`, ids `PREFIX-N`.
pub struct Producer {
    pub db: PathBuf,
    pub prefix: String,
    pub batches: usize,
    pub per_batch: usize,
    /// Spacing between batches.
    pub every: Duration,
    pub seed: u64,
}

impl Producer {
    /// Runs the producer in a thread of its own; joined by the caller.
    pub fn spawn(self, dir: &Path, ledger: Arc<Mutex<Ledger>>) -> std::thread::JoinHandle<()> {
        let dir = dir.to_path_buf();
        std::thread::spawn(move || self.run(&dir, &ledger))
    }

    fn run(&self, dir: &Path, ledger: &Mutex<Ledger>) {
        let mut rng = StdRng::seed_from_u64(self.seed);
        for b in 0..self.batches {
            let ids: Vec<String> = (0..self.per_batch)
                .map(|k| format!("{}-{}", self.prefix, b * self.per_batch + k))
                .collect();
            let file = dir.join(format!("{}-{b}.jsonl", self.prefix));
            let text: String = ids
                .iter()
                .map(|id| format!("{{\"type\":\"Q.In\",\"fields\":{{\"id\":\"{id}\"}}}}\n"))
                .collect();
            std::fs::write(&file, text).unwrap();
            ledger.lock().unwrap().attempted.extend(ids.iter().cloned());
            let mut c = cmd(&self.db, &["import", file.to_str().unwrap()]);
            let mut child = quiet(&mut c).spawn().unwrap();
            // One import in six is killed after a moment: it may or may not have
            // committed, and is not acknowledged unless it exited 0 first.
            let acked = if rng.random_range(0..6) == 0 {
                std::thread::sleep(Duration::from_millis(rng.random_range(1..60)));
                let ran_on = child.try_wait().unwrap().is_none();
                let status = if ran_on {
                    kill(&mut child);
                    None
                } else {
                    child.wait().ok()
                };
                status.is_some_and(|s| s.success())
            } else {
                child.wait().unwrap().success()
            };
            if acked {
                ledger.lock().unwrap().acknowledged.extend(ids);
            }
            std::thread::sleep(self.every);
        }
    }
}

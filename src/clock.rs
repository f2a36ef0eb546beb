//! Time, as the store sees it: leases, backoff and held-fact timestamps read a [`Clock`],
//! so tests can move time by hand instead of sleeping.

use std::fmt::Debug;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + Debug {
    /// The current time, ms since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The system's wall clock, moved by `PRECEDENT_CLOCK_OFFSET_MS` when that is set.
///
/// NOTE: the offset is a testing aid (docs/robustness.md, "Total-queue checker"): a
/// process started with `PRECEDENT_CLOCK_OFFSET_MS=-5000` reads every time 5 s behind
/// the machine's clock, so that tests can run a worker or a server whose clock is skewed
/// against the others' leases. It is read once per process; a value that is not an
/// integer is ignored (no offset) here, and refused by the command line.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

/// The environment variable that skews [`SystemClock`], in milliseconds (may be negative).
pub const CLOCK_OFFSET_ENV: &str = "PRECEDENT_CLOCK_OFFSET_MS";

/// The offset [`CLOCK_OFFSET_ENV`] asks for: 0 when unset.
///
/// # Errors
/// A one-line message naming the variable when its value is not an integer (the
/// command line refuses to start with it; [`SystemClock`] ignores it).
pub fn offset_from_env() -> std::result::Result<i64, String> {
    match std::env::var(CLOCK_OFFSET_ENV) {
        Err(_) => Ok(0),
        Ok(v) => v.trim().parse().map_err(|_| {
            format!("{CLOCK_OFFSET_ENV}={v:?}: not an integer number of milliseconds")
        }),
    }
}

fn offset_ms() -> i64 {
    static OFFSET: OnceLock<i64> = OnceLock::new();
    *OFFSET.get_or_init(|| offset_from_env().unwrap_or(0))
}

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        now.saturating_add(offset_ms())
    }
}

/// A clock that moves only when told to, for tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    /// A clock reading `start_ms`, shared so the test keeps a handle to move it.
    pub fn starting_at(start_ms: i64) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            now: AtomicI64::new(start_ms),
        })
    }

    /// Moves the clock forward (or back, with a negative amount) by `ms`.
    pub fn advance(&self, ms: i64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock.
    pub fn set(&self, ms: i64) {
        self.now.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }
}

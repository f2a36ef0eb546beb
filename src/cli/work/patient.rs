//! Waiting out a database that is locked or briefly unavailable, instead of exiting.
//!
//! A worker that exits because another process held SQLite's write lock past the busy
//! timeout (a long `import --atomic`) leaves its leases to expire and needs a supervisor
//! to come back; the lock is released in the end, so the worker waits for it.

use std::time::{Duration, Instant};

use precedent::Error;
use precedent::error::BackendErrorKind;

/// How long a job keeps retrying while its database server is unavailable (down,
/// restarting, connections cut) before the worker exits with the last error.
pub(super) const OUTAGE: Duration = Duration::from_secs(300);
/// The first pause after a failure for a locked or unavailable database, doubled per
/// failure up to [`BACKOFF_CAP`].
pub(super) const BACKOFF: Duration = Duration::from_millis(100);
pub(super) const BACKOFF_CAP: Duration = Duration::from_secs(5);

/// Whether `e` is another process holding the write lock past the busy timeout.
pub(super) fn is_busy(e: &Error) -> bool {
    matches!(e, Error::Backend(b) if b.kind == BackendErrorKind::Busy)
}

/// Runs `op` until it does not fail for a locked database ([`is_busy`]: retried for as
/// long as it takes) or an unavailable one ([`Error::is_unavailable`]: retried for up to
/// [`OUTAGE`]), pausing 100 ms, doubled up to 5 s, between tries and logging each.
/// `what` names the operation in the log.
pub(super) fn patiently<T>(
    what: &str,
    mut op: impl FnMut() -> Result<T, Error>,
) -> Result<T, Error> {
    let mut pause = BACKOFF;
    let since = Instant::now();
    loop {
        match op() {
            Err(e) if is_busy(&e) || (e.is_unavailable() && since.elapsed() < OUTAGE) => {
                eprintln!(
                    "warning: cannot {what} yet: {e}; waiting for it ({} s so far), retrying in {} ms",
                    since.elapsed().as_secs(),
                    pause.as_millis()
                );
                std::thread::sleep(pause);
                pause = (pause * 2).min(BACKOFF_CAP);
            }
            r => return r,
        }
    }
}

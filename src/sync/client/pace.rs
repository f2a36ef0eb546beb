//! Request sizes fitted to the link (`docs/protocol.md`, "A sync, step by step"): a pull
//! page, a push request or a fetch that the link cut short or let time out is sent again
//! at half its size ([`halved`]), down to one fact, and the size doubles back
//! ([`doubled`]) after full requests that finish well within their time ([`quick`]). So
//! a link too slow for a default-sized request in the time allowed still moves the
//! bookmarks, rather than sending the same request again and again.

use std::time::Duration;

use crate::error::Error;

/// The size of a request sent again after one of `n` failed: half, at least one.
pub(super) fn halved(n: u64) -> u64 {
    (n / 2).max(1)
}

/// Whether a request that took `took` finished well within the `allowed` time (under a
/// quarter of it), so that the next of its kind may be twice as large.
pub(super) fn quick(took: Duration, allowed: Duration) -> bool {
    took < allowed / 4
}

/// Twice `n`, at most `most`.
pub(super) fn doubled(n: u64, most: u64) -> u64 {
    n.saturating_mul(2).min(most)
}

/// The sizes one client has learned, kept across its syncs (a follower's rounds, and a
/// caller's retries); `u64::MAX` is "as large as the round allows".
#[derive(Debug)]
pub(super) struct Pace {
    /// Facts per pull page.
    pub pull: u64,
    /// Facts per push request.
    pub push_facts: u64,
    /// Bytes per push request.
    pub push_bytes: u64,
    /// Hashes per fetch request.
    pub fetch: u64,
}

impl Default for Pace {
    fn default() -> Pace {
        Pace {
            pull: u64::MAX,
            push_facts: u64::MAX,
            push_bytes: u64::MAX,
            fetch: u64::MAX,
        }
    }
}

/// A request that failed, and whether the link cut it short (see [`cut_short`]; also the
/// server's 408 and an answer's body that ended early): a smaller request may get through.
pub(super) struct Failed {
    pub error: Error,
    pub cut: bool,
    /// The facts a pull page announced (`Precedent-Count`) before its body was cut.
    pub announced: Option<u64>,
}

impl Failed {
    /// A failure of the link's (`cut`) or not.
    pub fn new(error: Error, cut: bool) -> Failed {
        Failed {
            error,
            cut,
            announced: None,
        }
    }
}

impl From<Error> for Failed {
    fn from(error: Error) -> Failed {
        Failed::new(error, false)
    }
}

/// Whether a request failed under way: a timeout once connected (sending the body,
/// waiting for or receiving the answer), or a connection reset, broken or ended early.
/// Not a connection that could not be made (the server is down, or the address wrong):
/// a smaller request would fare no better.
pub(super) fn cut_short(e: &ureq::Error) -> bool {
    use std::io::ErrorKind as K;
    match e {
        ureq::Error::Timeout(t) => !matches!(t, ureq::Timeout::Connect | ureq::Timeout::Resolve),
        ureq::Error::Io(e) => matches!(
            e.kind(),
            K::ConnectionReset
                | K::ConnectionAborted
                | K::BrokenPipe
                | K::UnexpectedEof
                | K::TimedOut
                | K::WriteZero
        ),
        _ => false,
    }
}

//! Counters the server keeps in memory and prints in the Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters since the server started, and the last bookmark each peer pulled to.
#[derive(Default)]
pub(crate) struct Metrics {
    pub requests_pull: AtomicU64,
    pub requests_push: AtomicU64,
    pub requests_fetch: AtomicU64,
    pub requests_info: AtomicU64,
    pub errors: AtomicU64,
    pub facts_sent: AtomicU64,
    pub facts_received: AtomicU64,
    pub rejected: AtomicU64,
    /// Peer name -> the `through` of its last pull.
    pub pulled_through: Mutex<BTreeMap<String, i64>>,
}

/// Store-wide figures read at scrape time.
pub(crate) struct Gauges {
    pub facts: u64,
    pub max_seq: i64,
    pub held: u64,
    pub quarantined: u64,
    /// What SQLite holds in the server's process ([`crate::store::sqlite_memory_used`]).
    pub sqlite_memory: u64,
}

pub(crate) fn inc(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Metrics {
    pub fn note_pull(&self, peer: &str, through: i64) {
        let mut m = self
            .pulled_through
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let e = m.entry(peer.to_string()).or_insert(through);
        *e = (*e).max(through);
    }

    pub fn render(&self, g: &Gauges) -> String {
        let mut s = String::new();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        gauge(
            &mut s,
            "precedent_facts",
            "Released facts in the store.",
            g.facts,
        );
        gauge(
            &mut s,
            "precedent_held",
            "Facts held for missing ancestors.",
            g.held,
        );
        gauge(
            &mut s,
            "precedent_quarantined",
            "Records refused at the door and kept in the quarantine.",
            g.quarantined,
        );
        gauge(
            &mut s,
            "precedent_sqlite_memory_bytes",
            "Bytes SQLite holds in the server's process: page caches, statements, schemas.",
            g.sqlite_memory,
        );
        let _ = writeln!(
            s,
            "# HELP precedent_sync_requests_total Sync requests served, by endpoint.\n\
             # TYPE precedent_sync_requests_total counter"
        );
        for (ep, c) in [
            ("pull", &self.requests_pull),
            ("push", &self.requests_push),
            ("fetch", &self.requests_fetch),
            ("info", &self.requests_info),
        ] {
            let _ = writeln!(
                s,
                "precedent_sync_requests_total{{endpoint=\"{ep}\"}} {}",
                get(c)
            );
        }
        counter(
            &mut s,
            "precedent_sync_errors_total",
            "Requests answered with an error status.",
            get(&self.errors),
        );
        counter(
            &mut s,
            "precedent_sync_facts_sent_total",
            "Fact records sent by pull and fetch.",
            get(&self.facts_sent),
        );
        counter(
            &mut s,
            "precedent_sync_facts_received_total",
            "Records received by push.",
            get(&self.facts_received),
        );
        counter(
            &mut s,
            "precedent_sync_rejects_total",
            "Pushed records refused (failed decoding or hashing) and quarantined.",
            get(&self.rejected),
        );
        let _ = writeln!(
            s,
            "# HELP precedent_peer_lag Released facts a peer has not pulled yet, from its last pull.\n\
             # TYPE precedent_peer_lag gauge"
        );
        let m = self
            .pulled_through
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (peer, through) in m.iter() {
            let lag = (g.max_seq - through).max(0);
            let _ = writeln!(s, "precedent_peer_lag{{peer=\"{}\"}} {lag}", escape(peer));
        }
        s
    }
}

fn gauge(s: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

fn counter(s: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
}

/// Escapes a label value (backslash, quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

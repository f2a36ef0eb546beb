//! The faults of a run, drawn from its seed before it starts, so that a failing run
//! prints the schedule it ran and the seed replays it.

use std::fmt;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::roles::Kind;

/// One fault.
#[derive(Clone, Debug)]
pub enum Fault {
    /// SIGKILL the role; it is started again after `down_ms`.
    Kill { role: usize, down_ms: u64 },
    /// SIGSTOP the role for `ms`, then SIGCONT.
    Pause { role: usize, ms: u64 },
    /// Cut the sync link of a node (its faulty proxy) for `ms`.
    Cut { node: usize, ms: u64 },
    /// Kill the role and start it again with its clock `offset_ms` off.
    Skew { role: usize, offset_ms: i64 },
    /// Stop PostgreSQL (immediate shutdown) and start it again after `ms`.
    PgRestart { ms: u64 },
}

/// A fault at a moment of the run.
#[derive(Clone, Debug)]
pub struct Event {
    pub at_ms: u64,
    pub fault: Fault,
}

/// The schedule of a run: its events in time order, with the role names to print them.
pub struct Schedule {
    pub seed: u64,
    pub events: Vec<Event>,
    names: Vec<String>,
}

/// What a fault may strike: the roles' names and kinds, the nodes, the lease.
pub struct Targets<'a> {
    pub roles: &'a [(String, Kind)],
    /// Roles whose clock may be skewed (local workers, which judge leases by their own
    /// clock, and a server, which judges them for its remote workers).
    pub skewable: &'a [usize],
    pub nodes: usize,
    pub lease_ms: u64,
}

impl Schedule {
    /// Faults every 150 to 500 ms over `span_ms`, drawn from `seed`.
    pub fn draw(seed: u64, span_ms: u64, t: &Targets) -> Schedule {
        let mut rng = StdRng::seed_from_u64(seed);
        let pausable: Vec<usize> = (0..t.roles.len())
            .filter(|&i| t.roles[i].1 != Kind::Syncer)
            .collect();
        let mut events = Vec::new();
        let mut at = rng.random_range(100..400);
        while at < span_ms {
            let role = rng.random_range(0..t.roles.len());
            let fault = match rng.random_range(0..20) {
                0..=6 => Fault::Kill {
                    role,
                    down_ms: rng.random_range(50..800),
                },
                // Longer than a lease, so that the paused process's leases expire and
                // other workers take its inputs while it sleeps.
                7..=10 => Fault::Pause {
                    role: pausable[rng.random_range(0..pausable.len())],
                    ms: rng.random_range(t.lease_ms + 200..t.lease_ms * 3),
                },
                11..=14 => Fault::Cut {
                    node: rng.random_range(0..t.nodes),
                    ms: rng.random_range(200..2_000),
                },
                15..=17 => {
                    let skew = rng.random_range(t.lease_ms..t.lease_ms * 4) as i64;
                    Fault::Skew {
                        role: t.skewable[rng.random_range(0..t.skewable.len())],
                        offset_ms: if rng.random_bool(0.5) { skew } else { -skew },
                    }
                }
                _ => Fault::PgRestart {
                    ms: rng.random_range(100..1_000),
                },
            };
            events.push(Event { at_ms: at, fault });
            at += rng.random_range(150..500);
        }
        Schedule {
            seed,
            events,
            names: t.roles.iter().map(|(n, _)| n.clone()).collect(),
        }
    }

    /// How many events of each kind: kills, pauses, cuts, skews, PostgreSQL restarts.
    pub fn counts(&self) -> [usize; 5] {
        let mut c = [0; 5];
        for e in &self.events {
            c[match e.fault {
                Fault::Kill { .. } => 0,
                Fault::Pause { .. } => 1,
                Fault::Cut { .. } => 2,
                Fault::Skew { .. } => 3,
                Fault::PgRestart { .. } => 4,
            }] += 1;
        }
        c
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed={} schedule:", self.seed)?;
        for e in &self.events {
            let name = |r: usize| self.names[r].as_str();
            match e.fault {
                Fault::Kill { role, down_ms } => {
                    writeln!(
                        f,
                        "  {:>5} ms  kill {} (down {down_ms} ms)",
                        e.at_ms,
                        name(role)
                    )
                }
                Fault::Pause { role, ms } => {
                    writeln!(f, "  {:>5} ms  pause {} for {ms} ms", e.at_ms, name(role))
                }
                Fault::Cut { node, ms } => {
                    writeln!(
                        f,
                        "  {:>5} ms  cut the link of node {node} for {ms} ms",
                        e.at_ms
                    )
                }
                Fault::Skew { role, offset_ms } => {
                    writeln!(
                        f,
                        "  {:>5} ms  restart {} with clock {offset_ms:+} ms",
                        e.at_ms,
                        name(role)
                    )
                }
                Fault::PgRestart { ms } => {
                    writeln!(f, "  {:>5} ms  restart PostgreSQL (down {ms} ms)", e.at_ms)
                }
            }?;
        }
        Ok(())
    }
}

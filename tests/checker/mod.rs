//! A total-queue checker in the manner of Jepsen's (docs/robustness.md, "Total-queue
//! checker"): real `precedent` processes in a topology of three SQLite nodes and a
//! PostgreSQL hub with two servers, unique inputs enqueued on every node and on the hub,
//! faults on a seeded schedule, then a heal, a drain, and a tally of what became of each
//! input.
//!
//! Layout: `roles` (one restartable process each), `schedule` (the faults, drawn from the
//! seed), `inputs` (the producers and their ledger of attempted and acknowledged inputs),
//! `tally` (reading every database after the drain).

pub mod inputs;
pub mod roles;
pub mod schedule;
pub mod tally;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::bin::run;
use crate::common::pg::{Cluster, PgDb, free_port};
use crate::sync_support::FaultyProxy;
use roles::{Kind, Role};
use schedule::{Fault, Schedule, Targets};

/// The queue's lease: short, so that pauses and skews outlast it within a short run.
pub const LEASE_MS: u64 = 1_000;
/// Nodes on SQLite.
pub const NODES: usize = 3;

/// A per-input handler: an effect fact naming its input, distinct per attempt and worker
/// (`W`, the pid), so that a second application is a second fact, never the same one.
pub const EFFECT: &str = r#"printf '{"type":"Q.Effect","fields":{"w":"%s","attempt":%s,"pid":%s},"predecessors":{"input":"%s"}}\n' "$W" "$PRECEDENT_ATTEMPT" "$$" "$PRECEDENT_INPUT_HASH""#;

/// A long-running handler (`work --process`) answering each request with the same kind
/// of effect, numbered within the process.
const EFFECT_PROCESS: &str = r#"read -r hello
n=0
while read -r request; do
    n=$((n + 1))
    lease=$(printf '%s\n' "$request" | sed 's/^{"lease":\([0-9]*\),.*/\1/')
    hash=$(printf '%s\n' "$request" | sed 's/.*"input":{"hash":"\([0-9a-f]*\)".*/\1/')
    printf '{"lease":%s,"outcome":"done","facts":[{"type":"Q.Effect","fields":{"w":"%s","pid":%s,"n":%s},"predecessors":{"input":"%s"}}]}\n' "$lease" "$W" "$$" "$n" "$hash"
done
"#;

/// `queue add` of the queue `q` over `Q.In`, done by a `Q.Effect` naming its input.
pub const DECLARE: &[&str] = &[
    "queue",
    "add",
    "q",
    "--input",
    "Q.In",
    "--done-by",
    "Q.Effect.input",
];

/// Every process and link of one run.
pub struct Topology {
    pub dir: tempfile::TempDir,
    pub hub: PgDb,
    pub nodes: Vec<PathBuf>,
    /// The hub servers' fixed ports, kept over restarts.
    pub ports: [u16; 2],
    /// Node `i`'s link to server `i % 2`.
    pub proxies: Vec<FaultyProxy>,
    pub roles: Vec<Role>,
}

fn ok(db: &Path, args: &[&str]) {
    let out = run(db, args, b"");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Topology {
    /// The hub (its queue declared) and the nodes, every role defined, none started.
    pub fn new(hub: PgDb, seed: u64) -> Topology {
        let dir = tempfile::tempdir().unwrap();
        let url = PathBuf::from(&hub.url);
        declare_hub(&url);
        let ports = [free_port(), free_port()];
        let nodes: Vec<PathBuf> = (0..NODES)
            .map(|i| {
                let p = dir.path().join(format!("node{i}.db"));
                ok(&p, &["init"]);
                p
            })
            .collect();
        let proxies: Vec<FaultyProxy> = (0..NODES)
            .map(|i| {
                let to: SocketAddr = format!("127.0.0.1:{}", ports[i % 2]).parse().unwrap();
                FaultyProxy::start(to, seed ^ ((i as u64 + 1) * 0x9E37_79B9))
            })
            .collect();
        let logs = dir.path().to_path_buf();
        let mut roles = Vec::new();
        for (i, name) in ["server-a", "server-b"].iter().enumerate() {
            let listen = format!("127.0.0.1:{}", ports[i]);
            let args = ["serve", "--listen", &listen];
            roles.push(Role::new(name, Kind::Server, url.clone(), &args, &logs));
        }
        for (i, p) in proxies.iter().enumerate() {
            let to = format!("http://{}", p.addr());
            let args = ["sync", &to, "--follow"];
            let name = format!("sync-{i}");
            roles.push(Role::new(
                &name,
                Kind::Syncer,
                nodes[i].clone(),
                &args,
                &logs,
            ));
        }
        roles.extend(workers(dir.path(), &url, ports));
        Topology {
            dir,
            hub,
            nodes,
            ports,
            proxies,
            roles,
        }
    }

    pub fn hub_path(&self) -> PathBuf {
        PathBuf::from(&self.hub.url)
    }

    /// The roles a fault may strike, and those whose clock it may skew.
    pub fn targets(&self) -> (Vec<(String, Kind)>, Vec<usize>) {
        let all = self
            .roles
            .iter()
            .map(|r| (r.name.clone(), r.kind))
            .collect();
        let skewable = self
            .roles
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                ["work-local", "work-local-process", "server-b"].contains(&r.name.as_str())
            })
            .map(|(i, _)| i)
            .collect();
        (all, skewable)
    }

    pub fn supervise(&mut self) {
        for r in &mut self.roles {
            r.supervise();
        }
    }

    /// Runs `schedule` over `span`, the roles supervised every 20 ms; then heals every
    /// fault: pauses resumed, links mended, PostgreSQL up, clocks true.
    pub fn run_faults(&mut self, cluster: &Cluster, schedule: &Schedule, span: Duration) {
        let start = Instant::now();
        let mut next = 0;
        let mut heals: Vec<(Instant, usize)> = Vec::new();
        let mut pg_up_at: Option<Instant> = None;
        while start.elapsed() < span {
            let now_ms = start.elapsed().as_millis() as u64;
            while next < schedule.events.len() && schedule.events[next].at_ms <= now_ms {
                match schedule.events[next].fault {
                    Fault::Kill { role, down_ms } => {
                        self.roles[role].kill(Duration::from_millis(down_ms))
                    }
                    Fault::Pause { role, ms } => self.roles[role].pause(Duration::from_millis(ms)),
                    Fault::Cut { node, ms } => {
                        self.proxies[node].partition();
                        heals.push((Instant::now() + Duration::from_millis(ms), node));
                    }
                    Fault::Skew { role, offset_ms } => {
                        self.roles[role].skew_ms = offset_ms;
                        self.roles[role].kill(Duration::ZERO);
                    }
                    Fault::PgRestart { ms } => {
                        if pg_up_at.is_none() {
                            cluster.stop();
                            pg_up_at = Some(Instant::now() + Duration::from_millis(ms));
                        }
                    }
                }
                next += 1;
            }
            heals.retain(|&(at, node)| {
                let due = at <= Instant::now();
                if due {
                    self.proxies[node].heal();
                }
                !due
            });
            if pg_up_at.is_some_and(|at| at <= Instant::now()) {
                cluster.start_again();
                pg_up_at = None;
            }
            self.supervise();
            std::thread::sleep(Duration::from_millis(20));
        }
        self.heal(cluster);
    }

    /// Ends every fault at once.
    pub fn heal(&mut self, cluster: &Cluster) {
        cluster.start_again();
        for p in &self.proxies {
            p.heal();
        }
        for r in &mut self.roles {
            r.resume();
            if r.skew_ms != 0 {
                r.skew_ms = 0;
                r.kill(Duration::ZERO);
            }
        }
        self.supervise();
    }

    /// One full sync of node `i` straight to its server (no proxy), retried (bounded)
    /// until it exits 0.
    pub fn sync_node(&mut self, i: usize) {
        let url = format!("http://127.0.0.1:{}", self.ports[i % 2]);
        let mut last = String::new();
        for _ in 0..60 {
            let out = run(&self.nodes[i], &["sync", &url], b"");
            if out.status.success() {
                return;
            }
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            self.supervise();
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("node {i}: sync to {url} failed 60 times after the heal; last: {last}");
    }

    /// Syncers down, every node synced whole to the hub; then every worker on until the
    /// queue is empty (bounded by `timeout`); then the nodes pull the effects.
    pub fn drain(&mut self, timeout: Duration) {
        for r in self.roles.iter_mut().filter(|r| r.kind == Kind::Syncer) {
            r.hold();
        }
        for i in 0..NODES {
            self.sync_node(i);
        }
        let hub = self.hub_path();
        let start = Instant::now();
        loop {
            let out = run(&hub, &["--json", "queue", "stats", "q"], b"");
            let stats = if out.status.success() {
                let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                let left: u64 = ["ready", "leased", "delayed", "blocked"]
                    .iter()
                    .map(|k| s[k].as_u64().unwrap())
                    .sum();
                if left == 0 {
                    break;
                }
                s.to_string()
            } else {
                String::from_utf8_lossy(&out.stderr).into_owned()
            };
            assert!(
                start.elapsed() < timeout,
                "the drain timed out after {timeout:?} with every worker on: {stats}"
            );
            self.supervise();
            std::thread::sleep(Duration::from_millis(100));
        }
        for i in 0..NODES {
            self.sync_node(i);
        }
    }

    /// The tails of every role's log, for a failure's message.
    pub fn logs(&self) -> String {
        self.roles
            .iter()
            .map(|r| {
                format!(
                    "--- {} (started {} times)\n{}\n",
                    r.name,
                    r.starts,
                    r.log_tail(8)
                )
            })
            .collect()
    }
}

/// `init` of the hub and the declaration of its queue.
fn declare_hub(url: &Path) {
    ok(url, &["init"]);
    let policy = [
        "--lease",
        &format!("{LEASE_MS}ms"),
        "--max-attempts",
        "1000",
        "--max-age",
        "1d",
        "--backoff-base",
        "1ms",
        "--backoff-cap",
        "50ms",
    ];
    ok(url, &[DECLARE, &policy[..]].concat());
}

/// The four workers: per-input and long-running handlers, on the hub's database and
/// `--remote` to either server.
fn workers(dir: &Path, url: &Path, ports: [u16; 2]) -> Vec<Role> {
    let handler = dir.join("effect.sh");
    std::fs::write(&handler, EFFECT_PROCESS).unwrap();
    let handler = handler.to_str().unwrap().to_string();
    let nowhere = dir.join("absent.db");
    let server_url = |i: usize| format!("http://127.0.0.1:{}", ports[i]);
    let mut roles = Vec::new();
    let exec = [
        "work", "q", "-j", "2", "--poll", "50ms", "--", "sh", "-c", EFFECT,
    ];
    let process = [
        "work",
        "q",
        "--process",
        "--poll",
        "50ms",
        "--",
        "sh",
        &handler,
    ];
    let (a, b) = (server_url(0), server_url(1));
    let remote_process = [&["work", "q", "--remote", &a], &process[2..]].concat();
    let remote_exec = [&["work", "q", "--remote", &b], &exec[2..]].concat();
    for (name, db, args) in [
        ("work-local", url, &exec[..]),
        ("work-local-process", url, &process[..]),
        (
            "work-remote-a-process",
            nowhere.as_path(),
            &remote_process[..],
        ),
        ("work-remote-b", nowhere.as_path(), &remote_exec[..]),
    ] {
        roles.push(Role::new(name, Kind::Worker, db.to_path_buf(), args, dir).env("W", name));
    }
    roles
}

/// The targets of a schedule for `topo`.
pub fn draw(topo: &Topology, seed: u64, span: Duration) -> Schedule {
    let (roles, skewable) = topo.targets();
    Schedule::draw(
        seed,
        span.as_millis() as u64,
        &Targets {
            roles: &roles,
            skewable: &skewable,
            nodes: NODES,
            lease_ms: LEASE_MS,
        },
    )
}

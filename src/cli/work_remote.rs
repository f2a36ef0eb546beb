//! `precedent work QUEUE --remote URL [--token T] -- COMMAND`: the process-per-input
//! worker against a hub's queues over HTTP (`docs/protocol.md`, "Queues over HTTP"), with
//! no local database.
//!
//! The handler sees what it sees locally: the input's JSON form on stdin, the
//! `PRECEDENT_INPUT_HASH`, `PRECEDENT_ATTEMPT` and `PRECEDENT_QUEUE` variables, and the
//! same exit statuses (0 done, 75 retry later, 65 poison, anything else a transient
//! failure). Its stdout's facts are sent with the completion and stored with it in one
//! transaction on the hub; a completing fact `{"by": "precedent work"}` is added when
//! none of them completes the input, as locally.
//!
//! The hub going away (connection refused, 503) does not stop the worker: each call is
//! retried with a backoff of 100 ms doubling to 5 s for up to 5 minutes. Lease ids hold no
//! server state, so a completion sent after the hub restarted still counts if the lease
//! lives; one whose lease ended meanwhile is refused and the input offered again.
//!
//! The calls sit behind [`Hub`], so that other ways of running handlers can share it.

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use precedent::json::{self, PredSpec};
use precedent::sync::client::{ClientOptions, RemoteLease, RemoteQueue};
use precedent::sync::queue_wire::LeaseResult;
use precedent::{Error, Result};

use super::work::WorkArgs;
use super::{Failure as CliFailure, Global, Status, exit};

/// How long a call keeps being retried while the hub is unreachable or unavailable.
const OUTAGE: Duration = Duration::from_secs(300);
/// The first pause after such a failure, doubled per failure up to [`BACKOFF_CAP`].
const BACKOFF: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(5);
/// The long-poll wait of a claim when not `--once`.
const CLAIM_WAIT: Duration = Duration::from_secs(20);

/// A hub's queue as a worker uses it: every call retried through outages.
pub(super) struct Hub {
    queue: RemoteQueue,
    stop: Arc<AtomicBool>,
}

/// Whether `e` may pass if tried again: the hub unreachable, restarting or busy.
fn passing(e: &Error) -> bool {
    matches!(e, Error::Transport { .. })
        || matches!(e, Error::Remote { status, .. } if matches!(status, 408 | 502 | 503 | 504))
}

impl Hub {
    fn retrying<T>(&self, what: &str, mut call: impl FnMut() -> Result<T>) -> Result<T> {
        let since = Instant::now();
        let mut pause = BACKOFF;
        loop {
            match call() {
                Err(e) if passing(&e) && since.elapsed() < OUTAGE => {
                    eprintln!("warning: {what}: {e}; retrying in {} ms", pause.as_millis());
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(BACKOFF_CAP);
                }
                r => return r,
            }
        }
    }

    /// Claims up to `n`, waiting up to `wait` for the first.
    pub(super) fn claim(&self, n: usize, wait: Duration) -> Result<Vec<RemoteLease>> {
        if self.stop.load(Ordering::Relaxed) {
            return Ok(Vec::new());
        }
        self.retrying("claim", || self.queue.claim(n, wait))
    }

    /// Completes one lease with facts in their JSON form.
    pub(super) fn complete(&self, lease: &RemoteLease, facts: Vec<String>) -> Result<LeaseResult> {
        let items = [(lease.id.as_str(), facts)];
        let mut r = self.retrying("complete", || self.queue.complete_json(&items))?;
        Ok(r.remove(0))
    }

    /// Extends leases; a failure is only logged (the handler runs on, and its completion
    /// is refused if the lease ended meanwhile).
    pub(super) fn extend(&self, ids: &[&str]) {
        if let Err(e) = self.queue.extend(ids) {
            eprintln!("warning: cannot extend leases: {e}");
        }
    }

    /// Fails (transient, retried no sooner than `retry_after` when given) or poisons one
    /// lease.
    pub(super) fn fail(
        &self,
        lease: &RemoteLease,
        reason: &str,
        poison: bool,
        retry_after: Option<Duration>,
    ) -> Result<LeaseResult> {
        let items = [(lease.id.as_str(), reason)];
        let mut r = self.retrying("fail", || match (poison, retry_after) {
            (true, _) => self.queue.poison(&items),
            (false, Some(after)) => self.queue.fail_not_before(&[(&lease.id, reason, after)]),
            (false, None) => self.queue.fail(&items, false),
        })?;
        Ok(r.remove(0))
    }
}

/// `precedent work --remote URL`.
pub(super) fn work(_g: &Global, args: WorkArgs, url: &str) -> anyhow::Result<Status> {
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        super::on_stop_signal(move || {
            eprintln!("stopping: finishing running commands");
            stop.store(true, Ordering::Relaxed);
        });
    }
    let args = Arc::new(args);
    let busy = Arc::new(AtomicUsize::new(0));
    let mut jobs = Vec::new();
    for _ in 0..args.jobs.max(1) {
        let options = ClientOptions {
            token: args.token.clone(),
            ..ClientOptions::default()
        };
        let hub = Hub {
            queue: RemoteQueue::new(url, &args.queue, options)?,
            stop: stop.clone(),
        };
        let (args, busy) = (args.clone(), busy.clone());
        jobs.push(std::thread::spawn(move || job(&hub, &args, &busy)));
    }
    let mut first_error = None;
    for j in jobs {
        match j.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                stop.store(true, Ordering::Relaxed);
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(anyhow::anyhow!("a worker thread panicked"));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(Status::Ok),
    }
}

/// One job: claim a batch, run the command per input, until stopped (or, with `--once`,
/// until nothing is ready and no other job holds work).
fn job(hub: &Hub, a: &WorkArgs, busy: &AtomicUsize) -> anyhow::Result<()> {
    while !hub.stop.load(Ordering::Relaxed) {
        busy.fetch_add(1, Ordering::SeqCst);
        let wait = if a.once { Duration::ZERO } else { CLAIM_WAIT };
        let leases = match hub.claim(a.batch.max(1), wait) {
            Ok(l) => l,
            Err(e) => {
                busy.fetch_sub(1, Ordering::SeqCst);
                return Err(e.into());
            }
        };
        if leases.is_empty() {
            let others = busy.fetch_sub(1, Ordering::SeqCst) - 1;
            if a.once && others == 0 {
                return Ok(());
            }
            let pause = if a.once { 5 } else { a.poll.max(1) as u64 };
            std::thread::sleep(Duration::from_millis(pause));
            continue;
        }
        let result = run_batch(hub, a, &leases);
        busy.fetch_sub(1, Ordering::SeqCst);
        result?;
    }
    Ok(())
}

/// Runs the command for each lease in turn; leases not started when a stop comes are left
/// to expire.
fn run_batch(hub: &Hub, a: &WorkArgs, leases: &[RemoteLease]) -> anyhow::Result<()> {
    for (i, lease) in leases.iter().enumerate() {
        if hub.stop.load(Ordering::Relaxed) {
            break;
        }
        let line = handle(hub, a, lease, &leases[i + 1..])?;
        if !super::log::quiet() {
            eprintln!("{line}");
        }
    }
    Ok(())
}

/// Runs the command for one input and completes or fails it; one line for the log.
fn handle(
    hub: &Hub,
    a: &WorkArgs,
    lease: &RemoteLease,
    waiting: &[RemoteLease],
) -> anyhow::Result<String> {
    let short = lease.input.hash().to_string()[..12].to_string();
    let (status, stdout, stderr) = run_command(hub, a, lease, waiting)?;
    let last_err = String::from_utf8_lossy(&stderr)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string();
    let with_err = |head: String| {
        if last_err.is_empty() {
            head
        } else {
            format!("{head}: {last_err}")
        }
    };
    let (reason, poison) = match status.code() {
        Some(0) => match completion_facts(lease, &stdout) {
            Ok(facts) => {
                let r = hub.complete(lease, facts)?;
                if r.ok {
                    return Ok(format!("{short} done ({} facts)", r.facts.unwrap_or(0)));
                }
                if r.error.as_deref() == Some("lease_lost") {
                    return Ok(format!(
                        "{short} lease lost: another worker has it; nothing written"
                    ));
                }
                (
                    format!("cannot store the output: {}", r.message.unwrap_or_default()),
                    false,
                )
            }
            Err(reason) => (reason, false),
        },
        Some(75) => {
            let reason = with_err("exit 75 (retry later)".into());
            let (reason, after) = match super::work::retry_after_line(&stdout) {
                Ok(after) => (reason, after),
                Err(bad) => (format!("{reason}; {bad}"), None),
            };
            let after = after.map(|ms| Duration::from_millis(ms.max(0) as u64));
            return failed(hub, lease, &short, &reason, false, after);
        }
        Some(65) => (with_err("exit 65 (poison)".into()), true),
        Some(c) => (with_err(format!("exit {c}")), false),
        None => (
            with_err(format!("killed by signal {}", status.signal().unwrap_or(0))),
            false,
        ),
    };
    failed(hub, lease, &short, &reason, poison, None)
}

/// Fails or poisons one lease; one line for the log.
fn failed(
    hub: &Hub,
    lease: &RemoteLease,
    short: &str,
    reason: &str,
    poison: bool,
    retry_after: Option<Duration>,
) -> anyhow::Result<String> {
    let r = hub.fail(lease, reason, poison, retry_after)?;
    Ok(match (r.ok, r.outcome.as_deref()) {
        (true, Some("retry")) => format!("{short} retry: {reason}"),
        (true, Some("dead")) => format!("{short} dead-lettered: {reason}"),
        (true, Some("poison")) => format!("{short} poison: {reason}"),
        (true, _) => format!("{short} failed, dropped (at-most-once): {reason}"),
        (false, _) => format!("{short} lease lost before failing: {reason}"),
    })
}

/// The command's stdout as facts to send: each non-blank line checked to be a fact in the
/// JSON form, and a completing fact of our own added unless one of them names the input
/// under the completion rule. `Err` is the reason of a transient failure.
fn completion_facts(
    lease: &RemoteLease,
    stdout: &[u8],
) -> std::result::Result<Vec<String>, String> {
    let text = String::from_utf8_lossy(stdout);
    let mut facts = Vec::new();
    let mut completes = false;
    let input = lease.input.hash();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let spec = json::parse(line).map_err(|e| format!("stdout line {}: {e}", i + 1))?;
        completes |= spec.type_name == lease.completion.type_name
            && spec
                .predecessors
                .get(&lease.completion.role)
                .is_some_and(|p| {
                    p.iter()
                        .any(|p| matches!(p, PredSpec::Hash(h) if *h == input))
                });
        facts.push(line.to_string());
    }
    if !completes {
        // Deterministic per input: a retry after a crash writes the same fact.
        let own = lease
            .completion()
            .field("by", "precedent work")
            .build()
            .map_err(|e| e.to_string())?;
        facts.push(json::to_json(&own).to_string());
    }
    Ok(facts)
}

/// Starts the command with the input on stdin and waits for it, extending this job's
/// leases every third of the lease duration meanwhile.
fn run_command(
    hub: &Hub,
    a: &WorkArgs,
    lease: &RemoteLease,
    waiting: &[RemoteLease],
) -> anyhow::Result<(ExitStatus, Vec<u8>, Vec<u8>)> {
    let program = &a.command[0];
    // The local worker's handler command: its own process group, killed with the worker.
    let mut child = super::work::handler_command(a)
        .env("PRECEDENT_INPUT_HASH", lease.input.hash().to_string())
        .env("PRECEDENT_ATTEMPT", lease.attempt.to_string())
        .env("PRECEDENT_QUEUE", &lease.queue)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| CliFailure::error(exit::INVALID, format!("cannot run {program}: {e}")))?;
    let mut input = json::to_json(&lease.input).to_string();
    input.push('\n');
    let mut stdin = child.stdin.take().expect("piped");
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut se = child.stderr.take().expect("piped");
        let errs = std::thread::spawn(move || {
            let _ = se.read_to_end(&mut err);
            err
        });
        let _ = child.stdout.take().expect("piped").read_to_end(&mut out);
        let err = errs.join().unwrap_or_default();
        let _ = tx.send(child.wait().map(|s| (s, out, err)));
    });
    let beat = Duration::from_millis((lease.lease_ms / 3).max(1) as u64);
    let mut ids: Vec<&str> = vec![lease.id.as_str()];
    ids.extend(waiting.iter().map(|l| l.id.as_str()));
    let done = loop {
        match rx.recv_timeout(beat) {
            Ok(r) => break r.context("waiting for the command")?,
            Err(mpsc::RecvTimeoutError::Timeout) => hub.extend(&ids),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                anyhow::bail!("lost track of the command {program}")
            }
        }
    };
    let _ = writer.join();
    Ok(done)
}

//! `precedent work QUEUE -- COMMAND ARGS..`: a worker that runs a command per input.
//!
//! Each of `-j` threads opens its own [`Store`] on the database file (SQLite serialises
//! the writers), claims a batch and runs the command once per input: the fact's JSON form
//! on stdin, JSON Lines of facts on stdout. The facts and a completing fact are stored in
//! the transaction that completes the input ([`Store::complete`]), so a crash at any
//! moment either stores all of them or none and the input is handed out again.
//!
//! Exit statuses follow sysexits(3): 0 done, 75 (`EX_TEMPFAIL`) retry later, 65
//! (`EX_DATAERR`) poison; anything else, a signal included, is a transient failure.
//!
//! With `--process` ([`process`]) the command is started once per job instead and
//! talks JSON Lines with the worker, many inputs in flight at a time.

mod patient;
mod process;
mod protocol;
mod spawn;

pub(in crate::cli) use protocol::retry_after_line;

pub(in crate::cli) use spawn::handler_command;
use spawn::{command, describe_status, kill_group};

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use precedent::queue::{FailOutcome, Failure, Lease, QueueSpec};
use precedent::{Error, Fact, Store, json};

use super::queue::parse_duration;
use super::{Failure as CliFailure, Global, Status, exit};
use patient::{BACKOFF, BACKOFF_CAP, OUTAGE, patiently};

/// The options of `precedent work`.
#[derive(Args, Debug)]
pub struct WorkArgs {
    /// The queue to work on.
    pub queue: String,
    /// Run up to N commands at once.
    #[arg(short = 'j', long = "jobs", value_name = "N", default_value_t = 1)]
    pub jobs: usize,
    /// Claim up to N inputs at a time per job.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub batch: usize,
    /// Process what is ready now, then exit (for tests and cron).
    #[arg(long)]
    pub once: bool,
    /// How long to wait before looking again when nothing is ready.
    #[arg(long, value_name = "DUR", default_value = "200ms", value_parser = parse_duration)]
    pub poll: i64,
    /// Start the command once per job and hand it inputs as JSON Lines on its stdin,
    /// reading one answer line per input from its stdout (docs/queues.md, "Long-running
    /// handlers").
    #[arg(long)]
    pub process: bool,
    /// With --process: how many inputs each handler has at most at once.
    #[arg(long, value_name = "N", default_value_t = 32, requires = "process")]
    pub in_flight: usize,
    /// Give up on an input after this long: its handler's process group is killed (with
    /// --process: the input is failed, and a handler that answers nothing meanwhile is
    /// restarted); the attempt counts as a transient failure.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub timeout: Option<i64>,
    /// Work on the queue of the hub at this URL (`precedent serve`) instead of a local
    /// database (a command per input: not with --process or --timeout yet).
    #[arg(long, value_name = "URL", conflicts_with_all = ["process", "timeout"])]
    pub remote: Option<String>,
    /// Bearer token for --remote.
    #[arg(long, env = "PRECEDENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// What every job shares.
struct Shared {
    args: WorkArgs,
    spec: QueueSpec,
    db: PathBuf,
    /// Set on SIGINT/SIGTERM: claim nothing more.
    stop: Arc<AtomicBool>,
    /// Jobs claiming or holding leases, for `--once`: a job stops when nothing is ready
    /// and no other job holds work that could unblock more.
    busy: AtomicUsize,
    /// Inputs dead-lettered or poisoned by this worker's failures, for `--once`'s exit
    /// status.
    ended_badly: AtomicUsize,
}

/// `precedent work`.
pub fn work(g: &Global, args: WorkArgs) -> anyhow::Result<Status> {
    if let Some(url) = args.remote.clone() {
        return super::work_remote::work(g, args, &url);
    }
    let store = g.open(false)?;
    let spec = store
        .queues()?
        .into_iter()
        .find(|s| s.name == args.queue)
        .ok_or_else(|| Error::UnknownQueue {
            name: args.queue.clone(),
        })?;
    drop(store);
    let db = std::fs::canonicalize(&g.db).unwrap_or_else(|_| g.db.clone());
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signal(stop.clone());
    let jobs = args.jobs.max(1);
    let shared = Arc::new(Shared {
        args,
        spec,
        db,
        stop,
        busy: AtomicUsize::new(0),
        ended_badly: AtomicUsize::new(0),
    });
    let handles: Vec<_> = (0..jobs)
        .map(|_| {
            let shared = shared.clone();
            let g = g.clone();
            std::thread::spawn(move || {
                if shared.args.process {
                    process::job(&g, &shared)
                } else {
                    job(&g, &shared)
                }
            })
        })
        .collect();
    let mut first_error = None;
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                shared.stop.store(true, Ordering::Relaxed);
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(anyhow::anyhow!("a worker thread panicked"));
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let ended_badly = shared.ended_badly.load(Ordering::Relaxed);
    if shared.args.once && ended_badly > 0 {
        // Exit 1, as for other data problems: cron and scripts see that some inputs need
        // a look (`dlq list`, `poison queue list`).
        eprintln!("{ended_badly} input(s) dead-lettered or poisoned in this run");
        return Ok(Status::Problems);
    }
    Ok(Status::Ok)
}

/// One job: claim a batch, run the command per input, repeat until stopped (or, with
/// `--once`, until nothing is ready).
///
/// A database server that is unavailable (PostgreSQL restarting, connections cut:
/// [`Error::is_unavailable`]) does not stop the job: it logs the error and tries again
/// after a pause that doubles from 100 ms to 5 s, reconnecting, for up to 5 minutes of
/// failures in a row. Inputs whose completion was lost with the connection are handed out
/// again when their leases expire; none is completed twice, as a completion is refused on
/// a lease that is no longer live.
fn job(g: &Global, sh: &Shared) -> anyhow::Result<()> {
    let store = g.open(false)?;
    let mut outage: Option<(Instant, Duration)> = None;
    while !sh.stop.load(Ordering::Relaxed) {
        match step(&store, sh) {
            Ok(Step::Done) => return Ok(()),
            Ok(Step::Again) => outage = None,
            Err(e) if e.downcast_ref::<Error>().is_some_and(Error::is_unavailable) => {
                let (since, pause) = outage.get_or_insert((Instant::now(), BACKOFF));
                if since.elapsed() >= OUTAGE {
                    return Err(e.context(format!(
                        "the database stayed unavailable for {} s; giving up",
                        OUTAGE.as_secs()
                    )));
                }
                eprintln!("warning: {e}; retrying in {} ms", pause.as_millis());
                idle(sh, *pause);
                *pause = (*pause * 2).min(BACKOFF_CAP);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What a job does after one [`step`].
enum Step {
    /// Claim again.
    Again,
    /// `--once` and nothing left to do.
    Done,
}

/// Claims one batch and runs it; or, with nothing ready, waits the poll interval.
fn step(store: &Store, sh: &Shared) -> anyhow::Result<Step> {
    let a = &sh.args;
    sh.busy.fetch_add(1, Ordering::SeqCst);
    let claimed = patiently("claim", || store.claim(&a.queue, a.batch.max(1)));
    let mut leases = match claimed {
        Ok(l) => l,
        Err(e) => {
            sh.busy.fetch_sub(1, Ordering::SeqCst);
            return Err(e.into());
        }
    };
    if leases.is_empty() {
        let others = sh.busy.fetch_sub(1, Ordering::SeqCst) - 1;
        if a.once && others == 0 {
            return Ok(Step::Done);
        }
        let wait = if a.once { 5 } else { a.poll.max(1) as u64 };
        idle(sh, Duration::from_millis(wait));
        return Ok(Step::Again);
    }
    let result = run_batch(store, sh, &mut leases);
    // Whatever happened, leases not started are given back, not left to expire.
    for lease in leases.drain(..) {
        match patiently("release a lease", || store.release(lease.clone())) {
            Ok(()) | Err(Error::LeaseLost { .. }) => {}
            Err(e) => eprintln!("warning: cannot release a lease: {e}"),
        }
    }
    sh.busy.fetch_sub(1, Ordering::SeqCst);
    result.map(|()| Step::Again)
}

/// Sleeps up to `d`, waking early when a stop is requested.
fn idle(sh: &Shared, d: Duration) {
    let until = Instant::now() + d;
    while !sh.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

/// Runs the command for each lease in turn, front first, removing each from `leases` as
/// it starts; stops starting new ones on a stop request.
fn run_batch(store: &Store, sh: &Shared, leases: &mut Vec<Lease>) -> anyhow::Result<()> {
    while !leases.is_empty() && !sh.stop.load(Ordering::Relaxed) {
        let lease = leases.remove(0);
        let outcome = handle(store, sh, lease, leases)?;
        log_line(&outcome);
    }
    Ok(())
}

/// How a finished command ended, as one line.
type Outcome = String;

/// Runs the command for one input and completes or fails it. `waiting` are this job's
/// other leases, kept alive too while the command runs.
fn handle(
    store: &Store,
    sh: &Shared,
    lease: Lease,
    waiting: &mut [Lease],
) -> anyhow::Result<Outcome> {
    let hash = lease.input.hash();
    let short = &hash.to_string()[..12];
    let Ran {
        status,
        stdout,
        stderr,
        lease,
        timed_out,
    } = run_command(store, sh, lease, waiting)?;
    // The handler's stderr, kept in the log with the input it was about.
    let stderr = String::from_utf8_lossy(&stderr);
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        eprintln!("{short} stderr: {line}");
    }
    let last_err = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string();
    if let Some(limit) = timed_out {
        return failed(store, sh, &lease, self::timed_out(limit));
    }
    let failure = match status.code() {
        Some(0) => match complete(store, &sh.spec, &lease, &stdout) {
            Ok(n) => return Ok(format!("{short} done ({n} facts)")),
            Err(CompleteError::LeaseLost) => {
                return Ok(format!(
                    "{short} lease lost: another worker has it; nothing written"
                ));
            }
            Err(CompleteError::Store(e)) => return Err(e.into()),
            Err(CompleteError::Output(reason)) => Failure::Transient(reason),
        },
        Some(75) => {
            let reason = with_stderr("exit 75 (retry later)", &last_err);
            return match protocol::retry_after_line(&stdout) {
                Ok(after) => failed_after(store, sh, &lease, Failure::Transient(reason), after),
                Err(bad) => failed(
                    store,
                    sh,
                    &lease,
                    Failure::Transient(format!("{reason}; {bad}")),
                ),
            };
        }
        Some(65) => Failure::Poison(with_stderr("exit 65 (poison)", &last_err)),
        Some(c) => Failure::Transient(with_stderr(&format!("exit {c}"), &last_err)),
        None => Failure::Transient(with_stderr(
            &format!("killed by signal {}", status.signal().unwrap_or(0)),
            &last_err,
        )),
    };
    failed(store, sh, &lease, failure)
}

/// Fails `lease` (waiting out a locked database) and says what became of it, as one log
/// line; counts dead letters and poison for `--once`.
fn failed(store: &Store, sh: &Shared, lease: &Lease, failure: Failure) -> anyhow::Result<Outcome> {
    failed_after(store, sh, lease, failure, None)
}

/// [`failed`], a retry not before `retry_after_ms` from now when given.
fn failed_after(
    store: &Store,
    sh: &Shared,
    lease: &Lease,
    failure: Failure,
    retry_after_ms: Option<i64>,
) -> anyhow::Result<Outcome> {
    let short = &lease.input.hash().to_string()[..12];
    let what = failure.reason().to_string();
    let result = patiently("record a failure", || match retry_after_ms {
        Some(ms) => store.fail_not_before(lease, failure.clone(), ms),
        None => store.fail(lease, failure.clone()),
    });
    let bad = |n: &AtomicUsize| n.fetch_add(1, Ordering::Relaxed);
    Ok(match result {
        Ok(FailOutcome::Retry { at_ms }) => {
            let now = precedent::clock::Clock::now_ms(&precedent::clock::SystemClock);
            let wait = super::time::format_duration_ms(at_ms - now);
            format!("{short} retry in {wait}: {what}")
        }
        Ok(FailOutcome::DeadLettered(h)) => {
            bad(&sh.ended_badly);
            format!("{short} dead-lettered as {h}: {what}")
        }
        Ok(FailOutcome::Poisoned(h)) => {
            bad(&sh.ended_badly);
            format!("{short} poison as {h}: {what}")
        }
        Ok(FailOutcome::Dropped) => format!("{short} failed, dropped (at-most-once): {what}"),
        Err(Error::LeaseLost { .. }) => format!("{short} lease lost before failing: {what}"),
        Err(e) => return Err(e.into()),
    })
}

/// Logs what became of one input, unless `-q` (`work ship --quiet`).
fn log_line(line: &str) {
    if !super::log::quiet() {
        eprintln!("{line}");
    }
}

/// The failure of an attempt that ran past `--timeout`: retried as a transient failure
/// and counted in the queue's `timed_out`.
fn timed_out(limit: Duration) -> Failure {
    Failure::TimedOut {
        reason: format!(
            "timed out after {}",
            super::time::format_duration_ms(limit.as_millis() as i64)
        ),
    }
}

fn with_stderr(head: &str, last: &str) -> String {
    if last.is_empty() {
        head.to_string()
    } else {
        format!("{head}: {last}")
    }
}

/// How a command for one input ended.
struct Ran {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// The lease as last extended.
    lease: Lease,
    /// `--timeout`, if the command ran past it and its process group was killed.
    timed_out: Option<Duration>,
}

/// Starts the command with the input on stdin and waits for it, extending this job's
/// leases every third of the lease duration meanwhile, and killing its process group if
/// it runs past `--timeout`.
fn run_command(
    store: &Store,
    sh: &Shared,
    mut lease: Lease,
    waiting: &mut [Lease],
) -> anyhow::Result<Ran> {
    let program = &sh.args.command[0];
    let spawned = command(sh)
        .env("PRECEDENT_INPUT_HASH", lease.input.hash().to_string())
        .env("PRECEDENT_ATTEMPT", lease.attempt.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            // Not the input's fault: give it back uncounted and stop the worker.
            let _ = store.release(lease);
            return Err(CliFailure::error(
                exit::INVALID,
                format!("cannot run {program}: {e}"),
            ));
        }
    };
    let pid = child.id();
    let mut input = json::to_json(&lease.input).to_string();
    input.push('\n');
    let mut stdin = child.stdin.take().expect("piped");
    // A command that does not read its stdin closes the pipe; that is not an error.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let mut so = child.stdout.take().expect("piped");
        let mut se = child.stderr.take().expect("piped");
        let errs = std::thread::spawn(move || {
            let _ = se.read_to_end(&mut err);
            err
        });
        let _ = so.read_to_end(&mut out);
        let err = errs.join().unwrap_or_default();
        let _ = tx.send(child.wait().map(|s| (s, out, err)));
    });
    let beat = Duration::from_millis((sh.spec.lease_ms / 3).max(1) as u64);
    let limit = sh
        .args
        .timeout
        .map(|t| Duration::from_millis(t.max(1) as u64));
    let tick = match limit {
        Some(_) => beat.min(Duration::from_millis(20)),
        None => beat,
    };
    let started = Instant::now();
    let mut beaten = Instant::now();
    let mut timed_out = None;
    let done = loop {
        match rx.recv_timeout(tick) {
            Ok(r) => break r.context("waiting for the command")?,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(limit) =
                    limit.filter(|l| timed_out.is_none() && started.elapsed() >= *l)
                {
                    kill_group(pid);
                    timed_out = Some(limit);
                }
                if beaten.elapsed() >= beat {
                    beaten = Instant::now();
                    lease = extend(store, lease)?;
                    for w in waiting.iter_mut() {
                        *w = extend(store, w.clone())?;
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                anyhow::bail!("lost track of the command {program}")
            }
        }
    };
    let _ = writer.join();
    Ok(Ran {
        status: done.0,
        stdout: done.1,
        stderr: done.2,
        lease,
        timed_out,
    })
}

/// Extends a lease; a lost one is kept as it is (completing it will be refused), and so
/// is one that cannot be extended while the database server is unavailable: the command
/// runs on, and its completion is tried when it ends (refused if the lease expired
/// meanwhile).
fn extend(store: &Store, lease: Lease) -> anyhow::Result<Lease> {
    match patiently("extend a lease", || store.extend(&lease)) {
        Ok(l) => Ok(l),
        Err(Error::LeaseLost { .. }) => Ok(lease),
        Err(e) if e.is_unavailable() => {
            eprintln!("warning: cannot extend a lease: {e}");
            Ok(lease)
        }
        Err(e) => Err(e.into()),
    }
}

enum CompleteError {
    LeaseLost,
    /// The command's output could not be stored: a transient failure with this reason.
    Output(String),
    Store(Error),
}

/// Stores the facts of `stdout` and, unless one of them completes the input, a completing
/// fact of our own, in the transaction that completes the input. Returns the fact count.
fn complete(
    store: &Store,
    spec: &QueueSpec,
    lease: &Lease,
    stdout: &[u8],
) -> Result<usize, CompleteError> {
    let text = String::from_utf8_lossy(stdout);
    let mut specs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let s = json::parse(line)
            .map_err(|e| CompleteError::Output(format!("stdout line {}: {e}", i + 1)))?;
        specs.push((format!("stdout line {}", i + 1), s));
    }
    let result = patiently("store a completion", || {
        store.complete(lease, |w| store_output(w, spec, lease, &specs))
    });
    match result {
        Ok(n) => Ok(n),
        Err(e) => Err(CompleteError::from(e)),
    }
}

impl From<Error> for CompleteError {
    fn from(e: Error) -> CompleteError {
        match e {
            Error::LeaseLost { .. } => CompleteError::LeaseLost,
            e @ (Error::Backend(_) | Error::Io(_) | Error::Corrupt { .. }) => {
                CompleteError::Store(e)
            }
            e => CompleteError::Output(format!("cannot store the output: {e}")),
        }
    }
}

/// Stores a handler's facts (`specs`, each with where it was read, for errors) in the
/// transaction completing `lease` and, unless one of them completes the input, a
/// completing fact of our own. Returns the fact count.
fn store_output<W: std::fmt::Display>(
    w: &mut precedent::Writer<'_>,
    spec: &QueueSpec,
    lease: &Lease,
    specs: &[(W, json::FactSpec)],
) -> Result<usize, Error> {
    let input = lease.input.hash();
    let mut facts: Vec<Fact> = Vec::new();
    for (at, s) in specs {
        let resolved = json::resolve(s, &mut |p| w.resolve_prefix(p)).map_err(|e| Error::Json {
            reason: format!("{at}: {e}"),
        })?;
        facts.extend(resolved);
    }
    let completes = facts.iter().any(|f| {
        spec.completions.iter().any(|c| {
            f.type_name() == c.type_name
                && f.predecessors()
                    .get(&c.role)
                    .is_some_and(|set| set.contains(&input))
        })
    });
    if !completes {
        // Deterministic per input: a retry after a crash writes the same fact.
        facts.push(lease.completion().field("by", "precedent work").build()?);
    }
    for f in &facts {
        w.insert(f)?;
    }
    Ok(facts.len())
}

/// Sets `stop` on SIGINT or SIGTERM. The worker then claims nothing more, lets running
/// commands finish, completes or fails them and gives back what it had not started.
fn stop_on_signal(stop: Arc<AtomicBool>) {
    super::on_stop_signal(move || {
        eprintln!("stopping: finishing running commands");
        stop.store(true, Ordering::Relaxed);
    });
}

//! `precedent work QUEUE -- COMMAND ARGS..`: a worker that runs a command per input.
//!
//! Each of `-j` threads opens its own `Store` on the database file (SQLite serialises
//! the writers), claims a batch and runs the command once per input: the fact's JSON form
//! on stdin, JSON Lines of facts on stdout. The facts and a completing fact are stored in
//! the transaction that completes the input (`Store::complete_batch`), so a crash at any
//! moment either stores all of them or none and the input is handed out again.
//!
//! The jobs reach the queue only through [`WorkQueue`] ([`seam`]): the local database, or
//! a remote hub with `--remote` (`work_remote`), run by the same code.
//!
//! Exit statuses follow sysexits(3): 0 done, 75 (`EX_TEMPFAIL`) retry later, 65
//! (`EX_DATAERR`) poison; anything else, a signal included, is a transient failure.
//!
//! With `--process` ([`process`]) the command is started once per job instead and
//! talks JSON Lines with the worker, many inputs in flight at a time.

mod patient;
mod process;
mod protocol;
mod seam;
mod spawn;

pub(in crate::cli) use seam::{Completed, Effect, Failed, Held, WorkQueue};
use seam::{Local, effects_of};
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
use precedent::queue::Failure;
use precedent::{Error, json};

use super::queue::parse_duration;
use super::{Failure as CliFailure, Global, Status, exit};
use patient::{BACKOFF, BACKOFF_CAP, OUTAGE};

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
    /// database.
    #[arg(long, value_name = "URL")]
    pub remote: Option<String>,
    /// Bearer token for --remote.
    #[arg(long, env = "PRECEDENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// What every job shares.
pub(in crate::cli) struct Shared {
    args: WorkArgs,
    /// The local database, for the handler's `PRECEDENT_DB`; none for a remote hub.
    db: Option<PathBuf>,
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
    let g = g.clone();
    run_jobs(args, Some(db), move || {
        let store = g.open(false)?;
        let spec = spec.clone();
        Ok(Local { store, spec })
    })
}

/// Runs `-j` jobs, each on its own queue from `open` (called in the job's thread), each
/// running a command per input or, with `--process`, a long-running handler; until
/// stopped (or, with `--once`, until nothing is ready).
pub(in crate::cli) fn run_jobs<Q: WorkQueue + 'static>(
    args: WorkArgs,
    db: Option<PathBuf>,
    open: impl Fn() -> anyhow::Result<Q> + Send + Sync + 'static,
) -> anyhow::Result<Status> {
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signal(stop.clone());
    let jobs = args.jobs.max(1);
    let shared = Arc::new(Shared {
        args,
        db,
        stop,
        busy: AtomicUsize::new(0),
        ended_badly: AtomicUsize::new(0),
    });
    let open = Arc::new(open);
    let handles: Vec<_> = (0..jobs)
        .map(|_| {
            let (shared, open) = (shared.clone(), open.clone());
            std::thread::spawn(move || {
                let q = open()?;
                if shared.args.process {
                    process::job(&q, &shared)
                } else {
                    job(&q, &shared)
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
/// a lease that is no longer live. (A hub's calls wait out its outages themselves.)
fn job<Q: WorkQueue>(q: &Q, sh: &Shared) -> anyhow::Result<()> {
    let mut outage: Option<(Instant, Duration)> = None;
    while !sh.stop.load(Ordering::Relaxed) {
        match step(q, sh) {
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

/// The long-poll wait of a claim on a hub when nothing is in hand and not `--once`.
const CLAIM_WAIT: Duration = Duration::from_secs(20);

/// How long a claim may wait for a first input: a hub's long poll unless `--once`.
fn claim_wait(sh: &Shared) -> Duration {
    if sh.args.once {
        Duration::ZERO
    } else {
        CLAIM_WAIT
    }
}

/// Claims one batch and runs it; or, with nothing ready, waits the poll interval.
fn step<Q: WorkQueue>(q: &Q, sh: &Shared) -> anyhow::Result<Step> {
    let a = &sh.args;
    sh.busy.fetch_add(1, Ordering::SeqCst);
    let mut leases = match q.claim(a.batch.max(1), claim_wait(sh)) {
        Ok(l) => l,
        Err(e) => {
            sh.busy.fetch_sub(1, Ordering::SeqCst);
            return Err(e);
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
    let result = run_batch(q, sh, &mut leases);
    // Whatever happened, leases not started are given back, not left to expire.
    for lease in leases.drain(..) {
        q.release(lease);
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
fn run_batch<Q: WorkQueue>(q: &Q, sh: &Shared, leases: &mut Vec<Q::Lease>) -> anyhow::Result<()> {
    while !leases.is_empty() && !sh.stop.load(Ordering::Relaxed) {
        let lease = leases.remove(0);
        let outcome = handle(q, sh, lease, leases)?;
        log_line(&outcome);
    }
    Ok(())
}

/// How a finished command ended, as one line.
type Outcome = String;

/// Runs the command for one input and completes or fails it. `waiting` are this job's
/// other leases, kept alive too while the command runs.
fn handle<Q: WorkQueue>(
    q: &Q,
    sh: &Shared,
    lease: Q::Lease,
    waiting: &mut [Q::Lease],
) -> anyhow::Result<Outcome> {
    let hash = lease.input().hash();
    let short = &hash.to_string()[..12];
    let Ran {
        status,
        stdout,
        stderr,
        lease,
        timed_out,
    } = run_command(q, sh, lease, waiting)?;
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
        return failed(q, sh, &lease, self::timed_out(limit));
    }
    let failure = match status.code() {
        Some(0) => match effects_of(&stdout) {
            Ok(effects) => match q.complete(&[(lease.clone(), effects)])?.pop() {
                Some(Completed::Done(n)) => return Ok(format!("{short} done ({n} facts)")),
                Some(Completed::LeaseLost) | None => {
                    return Ok(format!(
                        "{short} lease lost: another worker has it; nothing written"
                    ));
                }
                Some(Completed::Refused(reason)) => Failure::Transient(reason),
            },
            Err(reason) => Failure::Transient(reason),
        },
        Some(75) => {
            let reason = with_stderr("exit 75 (retry later)", &last_err);
            return match protocol::retry_after_line(&stdout) {
                Ok(after) => failed_after(q, sh, &lease, Failure::Transient(reason), after),
                Err(bad) => failed(
                    q,
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
    failed(q, sh, &lease, failure)
}

/// Fails `lease` and says what became of it, as one log line; counts dead letters and
/// poison for `--once`.
fn failed<Q: WorkQueue>(
    q: &Q,
    sh: &Shared,
    lease: &Q::Lease,
    failure: Failure,
) -> anyhow::Result<Outcome> {
    failed_after(q, sh, lease, failure, None)
}

/// [`failed`], a retry not before `retry_after_ms` from now when given.
fn failed_after<Q: WorkQueue>(
    q: &Q,
    sh: &Shared,
    lease: &Q::Lease,
    failure: Failure,
    retry_after_ms: Option<i64>,
) -> anyhow::Result<Outcome> {
    let short = &lease.input().hash().to_string()[..12];
    let what = failure.reason().to_string();
    let bad = |n: &AtomicUsize| n.fetch_add(1, Ordering::Relaxed);
    Ok(match q.fail(lease, failure, retry_after_ms)? {
        Failed::Retry(at_ms) => {
            let now = precedent::clock::Clock::now_ms(&precedent::clock::SystemClock);
            let wait = super::time::format_duration_ms(at_ms - now);
            format!("{short} retry in {wait}: {what}")
        }
        Failed::Dead(h) => {
            bad(&sh.ended_badly);
            format!("{short} dead-lettered as {h}: {what}")
        }
        Failed::Poison(h) => {
            bad(&sh.ended_badly);
            format!("{short} poison as {h}: {what}")
        }
        Failed::Dropped => format!("{short} failed, dropped (at-most-once): {what}"),
        Failed::LeaseLost => format!("{short} lease lost before failing: {what}"),
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
struct Ran<L> {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// The lease as last extended.
    lease: L,
    /// `--timeout`, if the command ran past it and its process group was killed.
    timed_out: Option<Duration>,
}

/// Starts the command with the input on stdin and waits for it, extending this job's
/// leases every third of the lease duration meanwhile, and killing its process group if
/// it runs past `--timeout`.
fn run_command<Q: WorkQueue>(
    q: &Q,
    sh: &Shared,
    mut lease: Q::Lease,
    waiting: &mut [Q::Lease],
) -> anyhow::Result<Ran<Q::Lease>> {
    let program = &sh.args.command[0];
    let spawned = command(sh)
        .env("PRECEDENT_INPUT_HASH", lease.input().hash().to_string())
        .env("PRECEDENT_ATTEMPT", lease.attempt().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            // Not the input's fault: give it back uncounted and stop the worker.
            q.release(lease);
            return Err(CliFailure::error(
                exit::INVALID,
                format!("cannot run {program}: {e}"),
            ));
        }
    };
    let pid = child.id();
    let mut input = json::to_json(lease.input()).to_string();
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
    let beat = Duration::from_millis((q.lease_ms(&lease) / 3).max(1) as u64);
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
                    let mut all: Vec<&mut Q::Lease> = std::iter::once(&mut lease)
                        .chain(waiting.iter_mut())
                        .collect();
                    q.extend(&mut all)?;
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

/// Sets `stop` on SIGINT or SIGTERM. The worker then claims nothing more, lets running
/// commands finish, completes or fails them and gives back what it had not started.
fn stop_on_signal(stop: Arc<AtomicBool>) {
    super::on_stop_signal(move || {
        eprintln!("stopping: finishing running commands");
        stop.store(true, Ordering::Relaxed);
    });
}

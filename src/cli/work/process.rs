//! `precedent work QUEUE --process -- COMMAND`: one long-running handler per job.
//!
//! The job starts COMMAND once and keeps up to `--in-flight` inputs with it: one request
//! line per input on its stdin, one answer line per input on its stdout, in any order
//! (docs/queues.md, "Long-running handlers"). Each round the job reads the answers that
//! have arrived, claims and sends inputs for the slots they freed, and only then commits
//! the answered ones as one batch ([`WorkQueue::complete`]: one transaction locally, one
//! request to a hub), so the handler works on the next inputs while the previous ones
//! commit. The queue is a local database or a remote hub ([`WorkQueue`]): the driver is
//! the same.
//!
//! A handler that exits, writes a line that names no input in flight, or stops answering
//! past `--timeout` is stopped (its whole process group) and started again after a
//! pause that doubles from 100 ms to 5 s until it answers again; the inputs it held are
//! failed as transient failures, so they are retried with their attempt counted.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use precedent::queue::Failure;

use super::patient::{BACKOFF, BACKOFF_CAP};
use super::protocol::{self, Answer, Malformed, Outcome};
use super::seam::{Completed, Effect, Held, WorkQueue};
use super::{Shared, claim_wait, failed, failed_after, idle, log_line};
use crate::cli::{Failure as CliFailure, exit};

/// What the reader of a handler's stdout reports.
enum Line {
    /// Line `n` (1-based).
    Out(usize, String),
    /// Its stdout closed: it exited (or closed it, which is as good as exiting).
    Closed,
}

/// A running handler: its process, the channel to the thread writing its stdin, and the
/// lines of its stdout.
struct Handler {
    child: Child,
    /// Dropped to close its stdin.
    stdin: Option<Sender<String>>,
    lines: Receiver<Line>,
    /// How it ended, once reaped: its pid (and so its group's id) may then be reused,
    /// and nothing may be sent a signal through it.
    ended: Option<String>,
}

impl Handler {
    /// Starts the command and writes the protocol's first line.
    fn start(sh: &Shared) -> anyhow::Result<Handler> {
        let mut cmd = super::command(sh);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| {
            CliFailure::error(
                exit::INVALID,
                format!("cannot run {}: {e}", sh.args.command[0]),
            )
        })?;
        let pid = child.id();
        let mut stdin = child.stdin.take().expect("piped");
        let (to_stdin, requests) = mpsc::channel::<String>();
        // A thread writes, so that a handler that stops reading never blocks the job.
        std::thread::spawn(move || {
            for text in requests {
                if stdin.write_all(text.as_bytes()).is_err() || stdin.flush().is_err() {
                    return;
                }
            }
        });
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut out = BufReader::new(stdout);
            let mut buf = Vec::new();
            for n in 1.. {
                buf.clear();
                match out.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&buf).trim_end().to_string();
                        if tx.send(Line::Out(n, text)).is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = tx.send(Line::Closed);
        });
        let stderr = child.stderr.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("handler {pid}: {line}");
            }
        });
        let _ = to_stdin.send(protocol::hello(&sh.args.queue));
        Ok(Handler {
            child,
            stdin: Some(to_stdin),
            lines,
            ended: None,
        })
    }

    fn send(&self, text: String) {
        if let Some(s) = &self.stdin {
            // A handler that exited is noticed when its stdout closes.
            let _ = s.send(text);
        }
    }

    /// Kills its whole process group and reaps it; says how it ended.
    fn kill(&mut self) -> String {
        if self.ended.is_none() {
            super::kill_group(self.child.id());
        }
        self.reap()
    }

    /// Waits for it to exit; says how it ended.
    fn reap(&mut self) -> String {
        self.stdin = None;
        if let Some(how) = &self.ended {
            return how.clone();
        }
        let how = match self.child.wait() {
            Ok(s) => super::describe_status(s),
            Err(e) => format!("lost track of it: {e}"),
        };
        self.ended = Some(how.clone());
        how
    }

    /// Closes its stdin (the end of the protocol) and waits up to `grace` for it to exit,
    /// then kills its process group.
    fn close(&mut self, grace: Duration) {
        self.stdin = None;
        let until = Instant::now() + grace;
        while self.ended.is_none() && Instant::now() < until {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.ended = Some(super::describe_status(s));
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if self.ended.is_some() {
            return;
        }
        eprintln!(
            "warning: handler {} did not exit within {} s of its stdin closing; killing it",
            self.child.id(),
            grace.as_secs()
        );
        self.kill();
    }
}

/// An input sent to the handler.
struct InFlight<L> {
    lease: L,
    sent: Instant,
    /// When its lease was taken or last extended.
    extended: Instant,
}

/// An answered input, waiting for its round's commit.
enum Answered<L> {
    Done(L, Vec<Effect>),
    Failed(L, Failure, Option<i64>),
}

/// One job of `work --process`.
struct Job<'a, Q: WorkQueue> {
    q: &'a Q,
    sh: &'a Shared,
    handler: Handler,
    flight: HashMap<u64, InFlight<Q::Lease>>,
    /// Leases failed for a timeout while the handler had them: a late answer is ignored.
    abandoned: HashSet<u64>,
    next_id: u64,
    /// When the handler last answered (or was started).
    last_answer: Instant,
    /// The pause before the next restart; back to the first once a handler answers.
    restart_pause: Duration,
    /// Whether this job counts in `Shared::busy`.
    holding: bool,
    /// Claim only after this instant (after a claim found nothing).
    claim_after: Instant,
}

/// How long the job waits for an answer before looking at leases and timeouts again.
const TICK: Duration = Duration::from_millis(50);
/// How long a handler may take to exit once its stdin is closed.
const GRACE: Duration = Duration::from_secs(10);

/// Runs one `--process` job until stopped (or, with `--once`, until nothing is ready),
/// then closes the handler's stdin and waits for it.
pub(super) fn job<Q: WorkQueue>(q: &Q, sh: &Shared) -> anyhow::Result<()> {
    let handler = Handler::start(sh)?;
    let mut job = Job {
        q,
        sh,
        handler,
        flight: HashMap::new(),
        abandoned: HashSet::new(),
        next_id: 1,
        last_answer: Instant::now(),
        restart_pause: BACKOFF,
        holding: false,
        claim_after: Instant::now(),
    };
    let result = job.run();
    if job.holding {
        sh.busy.fetch_sub(1, Ordering::SeqCst);
    }
    if result.is_err() {
        job.give_back();
    }
    job.handler.close(GRACE);
    result
}

impl<Q: WorkQueue> Job<'_, Q> {
    fn run(&mut self) -> anyhow::Result<()> {
        loop {
            let stopping = self.sh.stop.load(Ordering::Relaxed);
            if stopping && self.flight.is_empty() {
                return Ok(());
            }
            let answered = if self.flight.is_empty() {
                Vec::new()
            } else {
                self.gather()?
            };
            if !stopping && self.refill(answered.len())? {
                return Ok(());
            }
            self.commit(answered)?;
            self.extend_leases()?;
            self.time_out()?;
        }
    }

    /// Claims inputs for the free slots and sends them. With nothing claimed and nothing
    /// in flight or `pending` commit, waits the poll interval; returns true when `--once`
    /// is finished.
    fn refill(&mut self, pending: usize) -> anyhow::Result<bool> {
        let a = &self.sh.args;
        let free = a.in_flight.max(1).saturating_sub(self.flight.len());
        if free == 0 || Instant::now() < self.claim_after {
            return Ok(false);
        }
        if !self.holding {
            self.sh.busy.fetch_add(1, Ordering::SeqCst);
            self.holding = true;
        }
        // A hub's long poll only when nothing is in hand: answers must not wait on it.
        let wait = if self.flight.is_empty() && pending == 0 {
            claim_wait(self.sh)
        } else {
            Duration::ZERO
        };
        let leases = self.q.claim(free, wait)?;
        if !leases.is_empty() {
            for lease in leases {
                self.send(lease);
            }
            return Ok(false);
        }
        if !self.flight.is_empty() || pending > 0 {
            // Answers still to come or to commit may unblock successors: look again
            // after the poll interval (`--once`: the next round).
            if !a.once {
                self.claim_after = Instant::now() + Duration::from_millis(a.poll.max(1) as u64);
            }
            return Ok(false);
        }
        self.holding = false;
        let others = self.sh.busy.fetch_sub(1, Ordering::SeqCst) - 1;
        if a.once && others == 0 {
            return Ok(true);
        }
        let wait = if a.once { 5 } else { a.poll.max(1) as u64 };
        idle(self.sh, Duration::from_millis(wait));
        Ok(false)
    }

    fn send(&mut self, lease: Q::Lease) {
        let id = self.next_id;
        self.next_id += 1;
        self.handler.send(protocol::request(id, &lease));
        let sent = Instant::now();
        let extended = sent;
        self.flight.insert(
            id,
            InFlight {
                lease,
                sent,
                extended,
            },
        );
    }

    /// Waits up to a tick for an answer, then takes every answer already there.
    fn gather(&mut self) -> anyhow::Result<Vec<Answered<Q::Lease>>> {
        let mut answered = Vec::new();
        let mut next = match self.handler.lines.recv_timeout(TICK) {
            Ok(line) => Some(line),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Line::Closed),
        };
        while let Some(line) = next {
            match line {
                Line::Out(n, text) => {
                    if let Err(why) = self.take(n, &text, &mut answered) {
                        self.restart(&why, &mut answered)?;
                        break;
                    }
                }
                Line::Closed => {
                    let how = self.handler.reap();
                    self.restart(&format!("the handler exited ({how})"), &mut answered)?;
                    break;
                }
            }
            if answered.len() >= self.sh.args.in_flight.max(1) {
                break;
            }
            next = self.handler.lines.try_recv().ok();
        }
        Ok(answered)
    }

    /// Reads one answer line. A line that names no input in flight is an error (the
    /// handler is restarted); one that names an input but is malformed fails that input.
    fn take(
        &mut self,
        n: usize,
        text: &str,
        out: &mut Vec<Answered<Q::Lease>>,
    ) -> Result<(), String> {
        if text.trim().is_empty() {
            return Ok(());
        }
        let (id, outcome) = match protocol::answer(n, text) {
            Ok(Answer { lease, outcome }) => (lease, Ok(outcome)),
            Err(Malformed {
                lease: Some(id),
                message,
            }) => (id, Err(message)),
            Err(Malformed {
                lease: None,
                message,
            }) => return Err(message),
        };
        let Some(f) = self.flight.remove(&id) else {
            if self.abandoned.remove(&id) {
                eprintln!(
                    "warning: handler stdout line {n}: lease {id} had timed out; its answer is ignored"
                );
                return Ok(());
            }
            return Err(format!(
                "handler stdout line {n}: no input in flight has lease {id}"
            ));
        };
        self.last_answer = Instant::now();
        self.restart_pause = BACKOFF;
        out.push(match outcome {
            Ok(Outcome::Done(facts)) => Answered::Done(f.lease, facts),
            Ok(Outcome::Retry {
                reason,
                retry_after_ms,
            }) => Answered::Failed(f.lease, Failure::Transient(reason), retry_after_ms),
            Ok(Outcome::Poison(reason)) => Answered::Failed(f.lease, Failure::Poison(reason), None),
            Err(message) => {
                eprintln!("error: {message}");
                Answered::Failed(f.lease, Failure::Transient(message), None)
            }
        });
        Ok(())
    }

    /// Stops the handler for `why`, fails what it had in flight (into `out`, committed
    /// with the round), and starts it again after the restart pause.
    fn restart(&mut self, why: &str, out: &mut Vec<Answered<Q::Lease>>) -> anyhow::Result<()> {
        let how = self.handler.kill();
        eprintln!(
            "error: {why}; restarting the handler in {} ms (it ended: {how})",
            self.restart_pause.as_millis()
        );
        for (_, f) in self.flight.drain() {
            let reason = format!("{why}, with this input in flight");
            out.push(Answered::Failed(f.lease, Failure::Transient(reason), None));
        }
        self.abandoned.clear();
        idle(self.sh, self.restart_pause);
        self.restart_pause = (self.restart_pause * 2).min(BACKOFF_CAP);
        self.handler = Handler::start(self.sh)?;
        self.last_answer = Instant::now();
        Ok(())
    }

    /// Commits the round: the done inputs as one batch, then each failure.
    fn commit(&mut self, answered: Vec<Answered<Q::Lease>>) -> anyhow::Result<()> {
        let mut done = Vec::new();
        let mut fails = Vec::new();
        for a in answered {
            match a {
                Answered::Done(lease, effects) => done.push((lease, effects)),
                Answered::Failed(lease, failure, after) => fails.push((lease, failure, after)),
            }
        }
        if !done.is_empty() {
            let results = self.q.complete(&done)?;
            for ((lease, _), result) in done.into_iter().zip(results) {
                let short = &lease.input().hash().to_string()[..12];
                match result {
                    Completed::Done(n) => log_line(&format!("{short} done ({n} facts)")),
                    // At least once: the input is offered again (or another worker has
                    // it already).
                    Completed::LeaseLost => log_line(&format!(
                        "{short} lease lost: another worker has it; nothing written"
                    )),
                    Completed::Refused(reason) => {
                        fails.push((lease, Failure::Transient(reason), None));
                    }
                }
            }
        }
        for (lease, failure, after) in fails {
            let line = failed_after(self.q, self.sh, &lease, failure, after)?;
            log_line(&line);
        }
        Ok(())
    }

    /// Extends, in one call, the leases of inputs in flight for more than a third of the
    /// lease since it was taken or last extended.
    fn extend_leases(&mut self) -> anyhow::Result<()> {
        let q = self.q;
        let due: Vec<&mut InFlight<Q::Lease>> = (self.flight.values_mut())
            .filter(|f| {
                let third = (q.lease_ms(&f.lease) / 3).max(1) as u64;
                f.extended.elapsed() >= Duration::from_millis(third)
            })
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        let mut leases = Vec::with_capacity(due.len());
        for f in due {
            f.extended = now;
            leases.push(&mut f.lease);
        }
        q.extend(&mut leases)
    }

    /// Fails the inputs in flight for longer than `--timeout`; restarts a handler that
    /// has answered nothing since the oldest of them was sent (it is stuck).
    fn time_out(&mut self) -> anyhow::Result<()> {
        let Some(limit) = self.sh.args.timeout else {
            return Ok(());
        };
        let limit = Duration::from_millis(limit.max(1) as u64);
        let late: Vec<u64> = self
            .flight
            .iter()
            .filter(|(_, f)| f.sent.elapsed() >= limit)
            .map(|(id, _)| *id)
            .collect();
        let mut stuck = false;
        for id in late {
            let f = self.flight.remove(&id).expect("listed");
            stuck |= self.last_answer <= f.sent;
            self.abandoned.insert(id);
            let line = failed(self.q, self.sh, &f.lease, super::timed_out(limit))?;
            log_line(&line);
        }
        if stuck {
            let mut out = Vec::new();
            self.restart("the handler answered nothing within --timeout", &mut out)?;
            self.commit(out)?;
        }
        Ok(())
    }

    /// Gives back, uncounted, the inputs in flight when the job stops on an error.
    fn give_back(&mut self) {
        for (_, f) in self.flight.drain() {
            self.q.release(f.lease);
        }
    }
}

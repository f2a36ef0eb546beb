//! The sync loop: pull, fetch, push, and pull again what the push released, with the
//! bookmarks of `sync_peer` (`docs/protocol.md`, "A sync, step by step").

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::known::{Known, Ranges};
use super::pace::{doubled, halved, quick};
use super::{Client, Direction, Phase, Progress, SyncOptions, SyncReport};
use crate::error::{Error, Result};
use crate::fact::Fact;
use crate::hash::FactHash;
use crate::ingest::{self, Ordered};
use crate::store::{BatchReport, Store};
use crate::sync::SetDigest;
use crate::sync::wire::{FramingError, ServerLimits};

/// A push body is cut at this size, well under the server's default body limit.
const MAX_BODY: usize = 8 << 20;
/// The first and the longest nap of [`Client::follow`] after a round that found this
/// node's database locked past the busy timeout.
const LOCKED_NAP: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));
/// Hashes asked for in one fetch.
const FETCH: usize = 1000;
/// A long poll cut before its answer after this long (or half its wait, if less) was cut
/// for being idle, not for what the link carries (see the pull's `feed`).
const IDLE_CUT: Duration = Duration::from_secs(1);
/// Pushes after the first in one sync: each is needed only when pulling what the one
/// before released on the server released held facts here in turn.
const MORE_PUSHES: usize = 8;
/// How often a push-only follower looks at this store's highest `seq` while it waits:
/// commits by other processes on SQLite wake nothing.
const LOCAL_LOOK: Duration = Duration::from_millis(500);

/// What one round works with: the peer's bookmarks key, the sizes fitted to the server's
/// limits, and what this round knows the peer has.
struct Round<'a> {
    store: &'a Store,
    key: String,
    roots: &'a [FactHash],
    /// This database's identity: a peer reporting it is this database itself.
    local_id: String,
    /// Facts per pull page.
    page: u64,
    /// The most facts and bytes per push request.
    push_facts: u64,
    push_bytes: usize,
    /// The time a push request has: this client's timeout, and the server's request
    /// timeout, which covers reading the body.
    push_time: Duration,
    /// Hashes per fetch.
    fetch: usize,
    /// Longest long-poll wait the server grants.
    max_wait: Option<Duration>,
    /// Local facts that came from the peer in this round.
    known: Known,
    /// The peer's `seq` ranges of the facts this round pushed.
    ours: Ranges,
}

/// The outcome of storing received facts, for [`Known`].
struct Stored {
    batch: BatchReport,
    /// Local facts released by the transaction that are among the received ones.
    seqs: Vec<(i64, i64)>,
}

impl Client {
    /// Syncs once: pulls what this store has not seen, fetches the ancestors of what is
    /// held, pushes what the server lacks, and pulls again what that push released on the
    /// server (held facts it completed), until both sides hold the same facts. Records the
    /// outcome in `sync_peer` (last sync time, or the error).
    ///
    /// # Errors
    /// Transport, remote and protocol errors; [`Error::SyncConfig`] when the server is
    /// this database itself; store errors. Everything committed before the error stays
    /// committed, bookmarks included.
    pub fn sync(
        &self,
        store: &Store,
        options: &SyncOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<SyncReport> {
        let mut report = SyncReport::default();
        let result = self.round(store, options, Duration::ZERO, &mut report, progress);
        self.finish(store, options, result.map(|()| report))
    }

    fn finish(
        &self,
        store: &Store,
        options: &SyncOptions,
        result: Result<SyncReport>,
    ) -> Result<SyncReport> {
        let key = self.peer_key(&options.roots);
        match result {
            Ok(mut report) => {
                report.held = store.held_count()?;
                let remote = report.remote_seq;
                // Bookkeeping no waiter waits for: it wakes no one (a push-only follower
                // waits for this store's wake-ups, and its own would wake it at once).
                store.write(|w| {
                    w.record_peer_success(&key, remote)?;
                    w.quiet();
                    Ok(())
                })?;
                Ok(report)
            }
            Err(e) => {
                let _ = store.record_peer_error(&key, &e.to_string());
                Err(e)
            }
        }
    }

    /// Syncs, then keeps syncing as facts appear on either side until `stop` is set:
    /// each round waits on the server (long-poll, up to `wait`) for new facts; a
    /// push-only follower ([`Direction::Push`]) waits instead, up to `wait`, for new facts
    /// in `store`. Transport
    /// errors, and this store's database server being unavailable
    /// ([`Error::is_unavailable`]), are recorded and retried after a second; `on_round`
    /// sees each round's outcome.
    ///
    /// # Errors
    /// Store errors, remote errors that retrying cannot fix (401, 403), and a server that
    /// is this database itself.
    pub fn follow(
        &self,
        store: &Store,
        options: &SyncOptions,
        wait: Duration,
        stop: &AtomicBool,
        on_round: &mut dyn FnMut(&Result<SyncReport>),
    ) -> Result<()> {
        // The nap after a round that found this node's database locked by another
        // process (a long `import --atomic`) past the busy timeout: doubled each time,
        // from 100 ms to 5 s, and back to the start after a round that succeeds.
        let mut locked_nap = LOCKED_NAP.0;
        let push_only = options.direction == Direction::Push;
        while !stop.load(Ordering::Relaxed) {
            // Taken before the round reads what to push, so that nothing written after
            // that read is missed by the wait below; only a push-only follower waits, and
            // a failed read here is the round's to meet and retry, not the follower's end.
            let mark = store.wake_mark();
            let seq_before = if push_only {
                store.max_seq().ok()
            } else {
                None
            };
            let mut report = SyncReport::default();
            let result = self.round(store, options, wait, &mut report, &mut |_| {});
            let result = self.finish(store, options, result.map(|()| report));
            on_round(&result);
            if result.is_ok() {
                locked_nap = LOCKED_NAP.0;
            }
            match result {
                // A push-only round does not wait on the server: it waits here for new
                // facts in this store instead, where a pulling round long-polls.
                Ok(r) if push_only && r.pushed == 0 => {
                    wait_for_local(store, mark, seq_before, wait, stop);
                }
                Ok(_) => {}
                // Every page committed before the lock is kept with its bookmark; the
                // next round starts from there.
                Err(e) if e.is_busy() => {
                    std::thread::sleep(locked_nap);
                    locked_nap = (locked_nap * 2).min(LOCKED_NAP.1);
                }
                Err(Error::Remote { status: 401, .. }) | Err(Error::Remote { status: 403, .. }) => {
                    return result.map(|_| ());
                }
                Err(Error::Transport { .. })
                | Err(Error::Remote { .. })
                | Err(Error::Protocol { .. }) => {
                    std::thread::sleep(Duration::from_secs(1));
                }
                // This node's database server is down or restarting: the store
                // reconnects on the next round.
                Err(e) if e.is_unavailable() => std::thread::sleep(Duration::from_secs(1)),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The request sizes this client has learned (see `pace`).
    fn pace(&self) -> std::sync::MutexGuard<'_, super::Pace> {
        self.pace.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_push_pace(&self, facts: u64, bytes: usize) {
        let mut p = self.pace();
        p.push_facts = facts;
        p.push_bytes = bytes as u64;
    }

    /// The error for a server that serves this database itself.
    fn itself(&self, id: &str) -> Error {
        Error::SyncConfig {
            reason: format!(
                "{} serves this database itself (store {id}): sync with another node",
                self.base
            ),
        }
    }

    /// Fits the round's sizes to the limits the server reports (`GET /v1/health`; a
    /// server that does not report them gets the defaults).
    fn start<'a>(&self, store: &'a Store, roots: &'a [FactHash]) -> Result<Round<'a>> {
        let limits = match self.health() {
            Ok(h) => h.limits,
            Err(e @ Error::Transport { .. }) => return Err(e),
            Err(_) => None,
        };
        let max_wait = limits
            .as_ref()
            .map(|l| Duration::from_millis(l.max_wait_ms));
        let l = limits.unwrap_or(ServerLimits {
            max_body_bytes: 64 << 20,
            max_facts_per_request: 100_000,
            max_held_per_peer: 100_000,
            request_timeout_ms: 60_000,
            max_wait_ms: 30_000,
            max_roots: crate::sync::wire::MAX_ROOTS as u64,
        });
        if roots.len() as u64 > l.max_roots {
            return Err(Error::SyncConfig {
                reason: format!(
                    "{} roots; the server at {} takes at most {}",
                    roots.len(),
                    self.base,
                    l.max_roots
                ),
            });
        }
        let per_request = l.max_facts_per_request.max(1);
        Ok(Round {
            store,
            key: self.peer_key(roots),
            roots,
            local_id: store.store_id()?,
            page: (self.batch / 2).clamp(1, per_request),
            push_facts: self.batch.clamp(1, per_request),
            push_bytes: MAX_BODY.min(l.max_body_bytes as usize).max(1),
            push_time: self
                .timeout
                .min(Duration::from_millis(l.request_timeout_ms.max(1))),
            fetch: FETCH.min(per_request as usize),
            max_wait,
            known: Known::default(),
            ours: Ranges::default(),
        })
    }

    fn round(
        &self,
        store: &Store,
        options: &SyncOptions,
        wait: Duration,
        report: &mut SyncReport,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<()> {
        let mut r = self.start(store, &options.roots)?;
        let wait = r.max_wait.map_or(wait, |m| wait.min(m));
        let pulls = options.direction != Direction::Push;
        if pulls {
            // A replaced peer database restarts the bookmarks: pull again from 0.
            if self.pull_all(&mut r, wait, report, progress)? {
                self.pull_all(&mut r, wait, report, progress)?;
            }
            self.fetch_missing(&mut r, report, progress)?;
        }
        if options.direction == Direction::Pull {
            return Ok(());
        }
        if !pulls {
            // Nothing was pulled, so no answer has shown the peer's identity yet.
            match self.info() {
                Ok(info) if info.store.as_deref() == Some(r.local_id.as_str()) => {
                    return Err(self.itself(&r.local_id));
                }
                _ => {}
            }
        } else if options.roots.is_empty() {
            self.skip_push_if_in_sync(&r)?;
        }
        let mut sent = self.push_all(&mut r, report, progress)?;
        self.skip_own_pushes(&r, report)?;
        // What the push released on the server (held facts it completed) comes back now,
        // and what that releases here goes out in turn.
        for _ in 0..MORE_PUSHES {
            if !pulls || sent == 0 {
                break;
            }
            self.pull_all(&mut r, Duration::ZERO, report, progress)?;
            self.fetch_missing(&mut r, report, progress)?;
            sent = self.push_all(&mut r, report, progress)?;
            self.skip_own_pushes(&r, report)?;
        }
        Ok(())
    }

    /// Moves the pull bookmark past the facts this round pushed, when nothing else lies
    /// between: they are stored here, so the bookmark's promise holds without pulling them.
    fn skip_own_pushes(&self, r: &Round<'_>, report: &SyncReport) -> Result<()> {
        if !r.roots.is_empty() {
            return Ok(());
        }
        let pull_after = r.store.peer(&r.key)?.map_or(0, |p| p.pull_after);
        let moved = r.ours.advance(pull_after);
        if moved > pull_after {
            let remote = report.remote_seq.max(moved);
            r.store
                .write(|w| w.set_pull_bookmark(&r.key, moved, remote))?;
        }
        Ok(())
    }

    /// Pulls pages until the server has nothing more, skipping the ranges of the peer's
    /// sequence that this round pushed. A reader thread fetches and decodes the next page
    /// while this thread commits the current one; pages are committed in order, each with
    /// its bookmark, so an error or a kill loses at most the pages in flight.
    /// Returns `true`, having committed nothing, if the first page shows that the database
    /// behind the URL was replaced (its bookmarks are then back at 0).
    fn pull_all(
        &self,
        r: &mut Round<'_>,
        wait: Duration,
        report: &mut SyncReport,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<bool> {
        let start = r.store.peer(&r.key)?.map_or(0, |p| p.pull_after);
        let ours = if r.roots.is_empty() {
            r.ours.clone()
        } else {
            Ranges::default() // a scoped page is not a range of the sequence
        };
        let (roots, page) = (r.roots, r.page);
        let threads = ingest::threads(self.decode_threads);
        // About one page decoded ahead of the commit, as many pieces per worker.
        let ahead = (page as usize / ingest::PIECE / threads).max(1);
        std::thread::scope(|scope| {
            // The reader thread fetches pages and deals their records to the workers in
            // pieces; this thread takes the decoded pieces back in order.
            let feed = move |give: &mut dyn FnMut(PullJob) -> bool| {
                let (mut after, mut wait) = (start, wait);
                // The page size the link has shown it carries in time (see `pace`).
                let mut size = self.pace().pull.clamp(1, page);
                loop {
                    // Skip what this round pushed, and stop a page short of the next of it.
                    after = ours.advance(after);
                    let limit = ours
                        .next_after(after)
                        .map_or(size, |next| size.min((next - after - 1).max(1) as u64));
                    let started = Instant::now();
                    let p = match self.try_pull_page(after, limit, wait, roots) {
                        Ok(p) => p,
                        // Cut short or timed out: the same page again, half as large (half
                        // of what it held, when its headers told). One fact that cannot
                        // get through is an error.
                        // Cut while waiting for facts, before the server answered, after
                        // a while: a proxy closing an idle connection, most likely, which
                        // says nothing of what the link carries. The same page again at
                        // once, at the same size, without waiting (a server with nothing
                        // new answers an empty page, and the next round waits again). A
                        // cut of that request too is the link's, and so is one that came
                        // at once (a reset), which would otherwise make rounds back to
                        // back as fast as the resets come.
                        Err(f)
                            if f.cut
                                && f.announced.is_none()
                                && !wait.is_zero()
                                && started.elapsed() >= (wait / 2).min(IDLE_CUT) =>
                        {
                            wait = Duration::ZERO;
                            continue;
                        }
                        Err(f) if f.cut => {
                            let was = f.announced.map_or(limit, |n| n.min(limit));
                            size = halved(was);
                            self.pace().pull = size;
                            if was > 1 {
                                continue;
                            }
                            give(PullJob::Failed(f.error));
                            return;
                        }
                        Err(f) => {
                            give(PullJob::Failed(f.error));
                            return;
                        }
                    };
                    // A full page in under a quarter of the time allowed: the next may be
                    // twice as large.
                    if size < page
                        && p.records.len() as u64 >= limit
                        && quick(started.elapsed(), self.timeout)
                    {
                        size = doubled(size, page);
                        self.pace().pull = size;
                    }
                    wait = Duration::ZERO;
                    let last = p.through >= p.max_seq || p.records.is_empty();
                    let end = PageEnd {
                        through: p.through,
                        max_seq: p.max_seq,
                        bytes: p.records.iter().map(record_len).sum(),
                        store: p.store,
                    };
                    after = p.through;
                    let mut records = p.records.into_iter();
                    loop {
                        let piece: Vec<_> = records.by_ref().take(ingest::PIECE).collect();
                        if piece.is_empty() {
                            break;
                        }
                        if !give(PullJob::Records(piece)) {
                            return;
                        }
                    }
                    if !give(PullJob::End(end)) || last {
                        return;
                    }
                }
            };
            let work = |job: PullJob| match job {
                PullJob::Records(records) => PullOut::Decoded(
                    records
                        .into_iter()
                        .map(|r| match r {
                            Ok(bytes) => {
                                Fact::from_canonical(&bytes).map_err(|e| (e.to_string(), bytes))
                            }
                            Err(e) => Err((e.reason, e.bytes)),
                        })
                        .collect(),
                ),
                PullJob::End(end) => PullOut::End(end),
                PullJob::Failed(e) => PullOut::Failed(e),
            };
            let pieces = Ordered::start(scope, "sync-decode", threads, ahead, feed, work)
                .map_err(Error::Io)?;
            let mut done = 0;
            let mut first = true;
            let (mut facts, mut bad) = (Vec::new(), Vec::new());
            for out in pieces {
                let end = match out {
                    PullOut::Decoded(records) => {
                        for d in records {
                            match d {
                                Ok(f) => facts.push(f),
                                Err(b) => bad.push(b),
                            }
                        }
                        continue;
                    }
                    PullOut::Failed(e) => return Err(e),
                    PullOut::End(end) => end,
                };
                let page = Decoded {
                    through: end.through,
                    max_seq: end.max_seq,
                    facts: std::mem::take(&mut facts),
                    bad: std::mem::take(&mut bad),
                    bytes: end.bytes,
                };
                if std::mem::take(&mut first)
                    && let Some(id) = &end.store
                {
                    if *id == r.local_id {
                        return Err(self.itself(id));
                    }
                    if r.store.write(|w| w.note_peer_store(&r.key, id))? {
                        report.replaced = true;
                        return Ok(true);
                    }
                }
                report.remote_seq = report.remote_seq.max(page.max_seq);
                let n = (page.facts.len() + page.bad.len()) as u64;
                let through = page.through;
                self.commit_page(r, page, report)?;
                done += n;
                progress(Progress {
                    phase: Phase::Pull,
                    done,
                    total: done + (report.remote_seq - through).max(0) as u64,
                });
            }
            Ok(false)
        })
    }

    /// Stores one pulled page and moves the bookmark, in one transaction.
    fn commit_page(&self, r: &mut Round<'_>, page: Decoded, report: &mut SyncReport) -> Result<()> {
        report.pulled += (page.facts.len() + page.bad.len()) as u64;
        report.bytes_pulled += page.bytes;
        report.quarantined += page.bad.len() as u64;
        let key = r.key.clone();
        let (through, max_seq) = (page.through, page.max_seq);
        let stored = self.store_received(r, page.facts, page.bad, |w, batch, before| {
            let push_after = w.peer(&key)?.map_or(0, |p| p.push_after);
            w.set_pull_bookmark(&key, through, max_seq)?;
            // Every fact this transaction released came from the peer (no earlier held
            // fact was released, no release hook added one), and nothing local was waiting to be pushed: the peer has
            // everything up to here, so there is nothing to push back.
            let now = w.max_seq()?;
            if push_after >= before
                && batch.released == batch.inserted
                && (now - before) as u64 == batch.inserted
            {
                w.set_push_bookmark(&key, now)?;
            }
            Ok(())
        })?;
        report.inserted += stored.inserted;
        report.released += stored.released;
        report.duplicates += stored.duplicates;
        Ok(())
    }

    /// Stores facts received from the peer (and quarantines the refused records) in one
    /// transaction, with `also` run in it, and notes which local facts came from the peer.
    fn store_received(
        &self,
        r: &mut Round<'_>,
        facts: Vec<Fact>,
        bad: Vec<(String, Vec<u8>)>,
        also: impl FnOnce(&mut crate::store::Writer<'_>, &BatchReport, i64) -> Result<()>,
    ) -> Result<BatchReport> {
        let peer = self.base.clone();
        let received: Vec<FactHash> = facts.iter().map(Fact::hash).collect();
        let known = &r.known;
        let stored = r.store.write(|w| {
            let before = w.max_seq()?;
            let batch = w.insert_batch(facts)?;
            if let Some(h) = batch.refused.first() {
                return Err(Error::HeldLimit {
                    limit: batch.refused.len() as u64,
                    hash: *h,
                });
            }
            for (reason, bytes) in &bad {
                w.quarantine(&peer, reason, bytes)?;
            }
            also(w, &batch, before)?;
            let now = w.max_seq()?;
            let seqs =
                if (now - before) as u64 == batch.inserted && batch.released == batch.inserted {
                    vec![(before + 1, now)]
                } else {
                    // Some of what was released was held here before: tell the peer's facts
                    // from this node's own by hash.
                    let set: HashSet<FactHash> = received.iter().copied().collect();
                    w.released_after(before)?
                        .into_iter()
                        .filter(|(_, h)| set.contains(h) || known.hashes.contains(h))
                        .map(|(s, _)| (s, s))
                        .collect()
                };
            Ok(Stored { batch, seqs })
        })?;
        for (a, b) in stored.seqs {
            r.known.seqs.add(a, b);
        }
        if stored.batch.held + stored.batch.duplicates > 0 {
            // Held here, or stored here before: known by hash, for when they are released
            // or when the push reaches them.
            r.known.hashes.extend(received);
        }
        Ok(stored.batch)
    }

    /// Asks the server for the ancestors that held facts wait for, a page of absent
    /// hashes at a time in hash order, until a pass over all of them stores nothing
    /// (none is absent, or the server has none of them). Each pass goes through every
    /// absent hash: asking for the lowest page again and again would never reach a hash
    /// the server has behind a page of hashes it has not.
    fn fetch_missing(
        &self,
        r: &mut Round<'_>,
        report: &mut SyncReport,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<()> {
        let (mut after, mut stored_in_pass) = (None::<FactHash>, false);
        // The hashes a fetch asks for, fitted to the link as pull pages are (see `pace`).
        let mut size = (self.pace().fetch.min(r.fetch as u64) as usize).max(1);
        loop {
            let absent = match &after {
                None => r.store.absent_ancestors(size)?,
                Some(h) => r.store.absent_ancestors_after(h, size)?,
            };
            let Some(&last) = absent.last() else {
                // The end of a pass: again from the lowest if it stored facts (those it
                // released, or holds, may wait for others now), else done.
                if after.is_none() || !stored_in_pass {
                    return Ok(());
                }
                (after, stored_in_pass) = (None, false);
                continue;
            };
            let started = Instant::now();
            let records = match self.try_fetch(&absent) {
                Ok(records) => records,
                // Cut short or timed out: the same hashes again, half of them. One hash
                // that cannot get through is an error.
                Err(f) if f.cut && absent.len() > 1 => {
                    size = halved(absent.len() as u64) as usize;
                    self.pace().fetch = size as u64;
                    continue;
                }
                Err(f) => return Err(f.error),
            };
            // A full request in under a quarter of the time allowed: the next may ask for
            // twice as many.
            if size < r.fetch && absent.len() >= size && quick(started.elapsed(), self.timeout) {
                size = doubled(size as u64, r.fetch as u64) as usize;
                self.pace().fetch = size as u64;
            }
            after = Some(last);
            report.bytes_pulled += records.iter().map(record_len).sum::<u64>();
            let (fetched, mut bad) = decode_records(records);
            // A fetched record must be one of the facts asked for: anything else fails the
            // hash check and goes to the quarantine like a record that does not decode.
            let mut facts = Vec::with_capacity(fetched.len());
            for f in fetched {
                if absent.contains(&f.hash()) {
                    facts.push(f);
                } else {
                    let reason =
                        format!("fetched fact {} is none of the hashes asked for", f.hash());
                    bad.push((reason, f.canonical_bytes().to_vec()));
                }
            }
            report.fetched += (facts.len() + bad.len()) as u64;
            report.quarantined += bad.len() as u64;
            let useful = !facts.is_empty();
            r.known.hashes.extend(facts.iter().map(Fact::hash));
            let batch = self.store_received(r, facts, bad, |_, _, _| Ok(()))?;
            report.inserted += batch.inserted;
            report.released += batch.released;
            report.duplicates += batch.duplicates;
            progress(Progress {
                phase: Phase::Fetch,
                done: report.fetched,
                total: 0,
            });
            stored_in_pass |= useful && batch.inserted + batch.held > 0;
        }
    }

    /// When both sides hold the same fact set, marks everything local as pushed.
    fn skip_push_if_in_sync(&self, r: &Round<'_>) -> Result<()> {
        let push_after = r.store.peer(&r.key)?.map_or(0, |p| p.push_after);
        let max = r.store.max_seq()?;
        // Only the facts not known to have come from the peer would be pushed.
        let unknown: i64 = r
            .known
            .seqs
            .gaps(push_after, max)
            .iter()
            .map(|(a, b)| b - a)
            .sum();
        if unknown <= self.batch as i64 {
            return Ok(()); // cheaper to push than to compare
        }
        let remote = self.info()?;
        let local = r.store.digest_since(SetDigest::default())?;
        if remote.count == local.count && remote.digest == local.xor_hex() {
            r.store
                .write(|w| w.set_push_bookmark(&r.key, local.through))?;
        }
        Ok(())
    }

    /// Pushes the local facts after the push bookmark that the peer lacks, in requests
    /// fitted to its limits (halved again on a 413) and to the link (halved after a
    /// request cut short or timed out, see `pace`); returns how many facts it sent.
    fn push_all(
        &self,
        r: &mut Round<'_>,
        report: &mut SyncReport,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<u64> {
        let mut first = true;
        let mut sent = 0;
        let (mut most, mut most_bytes) = (r.push_facts, r.push_bytes);
        let (mut cap, mut cap_bytes) = {
            let p = self.pace();
            (
                p.push_facts.clamp(1, most),
                usize::try_from(p.push_bytes).map_or(most_bytes, |b| b.clamp(1, most_bytes)),
            )
        };
        loop {
            let after = r.store.peer(&r.key)?.map_or(0, |p| p.push_after);
            let max = r.store.max_seq()?;
            if after >= max {
                return Ok(sent);
            }
            let body = self.push_body(r, after, max, cap, cap_bytes)?;
            if body.count == 0 {
                r.store.write(|w| w.set_push_bookmark(&r.key, body.last))?;
                continue;
            }
            let started = Instant::now();
            let answer = match self.try_push_records(&body.bytes) {
                Ok(a) => a,
                Err(f)
                    if body.count > 1 && matches!(f.error, Error::Remote { status: 413, .. }) =>
                {
                    cap = halved(body.count);
                    cap_bytes = halved(body.bytes.len() as u64) as usize;
                    (most, most_bytes) = (cap, cap_bytes);
                    continue;
                }
                // Cut short or timed out: the same facts again, in requests half as large.
                Err(f) if f.cut && body.count > 1 => {
                    cap = halved(body.count);
                    cap_bytes = halved(body.bytes.len() as u64) as usize;
                    self.set_push_pace(cap, cap_bytes);
                    continue;
                }
                Err(f) => {
                    if f.cut {
                        self.set_push_pace(1, body.bytes.len());
                    }
                    return Err(f.error);
                }
            };
            // A request cut by the caps (more was waiting) that took under a quarter of
            // the time allowed: the next may be twice as large.
            if body.last < max
                && (cap < most || cap_bytes < most_bytes)
                && quick(started.elapsed(), r.push_time)
            {
                cap = doubled(cap, most);
                cap_bytes = doubled(cap_bytes as u64, most_bytes as u64) as usize;
                self.set_push_pace(cap, cap_bytes);
            }
            // Pushed to a database that replaced the one the bookmark was written for: the
            // bookmark is back at 0, and the loop pushes everything again. The first answer
            // tells; later ones come from the same server (a write transaction each would
            // only cost time).
            if std::mem::take(&mut first)
                && let Some(id) = &answer.store
            {
                if *id == r.local_id {
                    return Err(self.itself(id));
                }
                if r.store.write(|w| w.note_peer_store(&r.key, id))? {
                    report.replaced = true;
                    r.known = Known::default();
                    continue;
                }
            }
            if let Some(rej) = answer.rejected.first() {
                return Err(self.protocol(format!(
                    "server rejected record {} of a push: {}",
                    rej.index, rej.reason
                )));
            }
            if !answer.refused.is_empty() {
                return Err(Error::Remote {
                    url: self.base.clone(),
                    status: 200,
                    code: "refused".into(),
                    message: format!(
                        "{} facts refused: the server's held-fact bound is reached",
                        answer.refused.len()
                    ),
                });
            }
            for (a, b) in &answer.seqs {
                r.ours.add(*a, *b);
            }
            r.store.write(|w| w.set_push_bookmark(&r.key, body.last))?;
            report.pushed += body.count;
            report.bytes_pushed += body.bytes.len() as u64;
            sent += body.count;
            progress(Progress {
                phase: Phase::Push,
                done: report.pushed,
                total: report.pushed + (max - body.last).max(0) as u64,
            });
        }
    }

    /// The next push body: local facts after `after` that the peer lacks, in release
    /// order, at most `cap` facts and `cap_bytes` bytes (one fact at least).
    fn push_body(
        &self,
        r: &Round<'_>,
        after: i64,
        max: i64,
        cap: u64,
        cap_bytes: usize,
    ) -> Result<Body> {
        let mut body = Body {
            bytes: Vec::new(),
            count: 0,
            last: after,
        };
        for (from, to) in r.known.seqs.gaps(after, max) {
            // Everything up to `from` is known to be on the peer.
            body.last = body.last.max(from);
            let walked = r.store.for_each_in_range(from, to, |seq, hash, bytes| {
                if body.count >= cap
                    || (!body.bytes.is_empty() && body.bytes.len() + bytes.len() > cap_bytes)
                {
                    return Err(Error::Io(std::io::ErrorKind::WriteZero.into()));
                }
                if !r.known.has(seq, &hash) {
                    body.bytes.extend_from_slice(bytes);
                    body.count += 1;
                }
                body.last = seq;
                Ok(())
            });
            match walked {
                Ok(()) => body.last = to,
                Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::WriteZero => {
                    return Ok(body);
                }
                Err(e) => return Err(e),
            }
        }
        body.last = max;
        Ok(body)
    }
}

/// Waits, for at most `wait` and until `stop`, for facts released in `store` after `mark`
/// (this process's commits, and on PostgreSQL every process's) or past `seq_before` (what
/// another process committed on SQLite, looked for every [`LOCAL_LOOK`]).
fn wait_for_local(
    store: &Store,
    mark: crate::store::WakeMark,
    seq_before: Option<i64>,
    wait: Duration,
    stop: &AtomicBool,
) {
    let until = std::time::Instant::now() + wait;
    while !stop.load(Ordering::Relaxed) {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero()
            || store.wait_for_wake(mark, left.min(LOCAL_LOOK))
            || store.max_seq().ok() != seq_before
        {
            break;
        }
    }
}

/// One push request's body.
struct Body {
    bytes: Vec<u8>,
    count: u64,
    /// The local `seq` through which every fact is in the body or on the peer.
    last: i64,
}

/// A pulled page, decoded.
struct Decoded {
    through: i64,
    max_seq: i64,
    facts: Vec<Fact>,
    bad: Vec<(String, Vec<u8>)>,
    /// Bytes of the page's records.
    bytes: u64,
}

/// What the reader thread of a pull hands the decoding workers.
enum PullJob {
    /// A piece of a page's records.
    Records(Vec<std::result::Result<Vec<u8>, FramingError>>),
    /// The page ends here.
    End(PageEnd),
    /// The pull failed here; nothing after it was read.
    Failed(Error),
}

/// What a worker hands back, in the order of the jobs.
enum PullOut {
    Decoded(Vec<ingest::Decoded>),
    End(PageEnd),
    Failed(Error),
}

/// The rest of a pulled page, after its records.
struct PageEnd {
    through: i64,
    max_seq: i64,
    /// Bytes of the page's records.
    bytes: u64,
    store: Option<String>,
}

fn record_len(r: &std::result::Result<Vec<u8>, FramingError>) -> u64 {
    match r {
        Ok(b) => b.len() as u64,
        Err(e) => e.bytes.len() as u64,
    }
}

/// Splits received records into facts and refused records (reason, bytes).
fn decode_records(
    records: Vec<std::result::Result<Vec<u8>, FramingError>>,
) -> (Vec<Fact>, Vec<(String, Vec<u8>)>) {
    let mut facts = Vec::with_capacity(records.len());
    let mut bad = Vec::new();
    for r in records {
        match r {
            Ok(bytes) => match Fact::from_canonical(&bytes) {
                Ok(f) => facts.push(f),
                Err(e) => bad.push((e.to_string(), bytes)),
            },
            Err(e) => bad.push((e.reason, e.bytes)),
        }
    }
    (facts, bad)
}

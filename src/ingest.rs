//! Decoding received records on every core, in order: the piece shared by `precedent
//! import` and both receiving sides of sync (a push on the server, a pulled page on the
//! client), where every record is decoded, checked and re-hashed before one writer stores
//! the facts in the order they came.
//!
//! ```text
//! feeder ──job i──▶ worker i % n ──output i──▶ caller (takes output 0, 1, 2, ...)
//! ```
//!
//! [`Ordered::start`] runs a feeder (the caller's function, which splits its input into
//! jobs) and `n` workers on threads of a [`std::thread::Scope`]; the feeder deals jobs to
//! the workers in turn over one bounded channel each, and [`Ordered::next`] takes the
//! outputs back in the same turn, so input order needs no reordering buffer. Memory is
//! bounded by the channels: one job waiting for each worker, one in each worker's hands,
//! and `ahead` outputs per worker waiting for the caller.
//!
//! Threads: the library starts these only where a body of records is decoded, and only
//! for a body of more than [`MIN_PIECE`] records: an import, a sync push received by the
//! server, a pulled page received by the client. They live for that one body (a scoped
//! thread costs some tens of microseconds to start, against about 3 us to decode and hash
//! each record; a push of 1,000 JSON facts costs 3 to 4 ms of decoding on an idle
//! machine). Nothing else in the library starts them.

use std::io;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::Scope;

use crate::error::Error;
use crate::fact::Fact;

/// Records a worker decodes at a time: large enough that channel traffic is negligible,
/// small enough that the workers share a body evenly.
pub const PIECE: usize = 1_000;

/// The fewest records [`in_order`] cuts a piece to: a body of at most this many is
/// decoded in the caller's thread.
pub const MIN_PIECE: usize = 125;

/// How many records a piece of a body of `n` records holds at most (the first pieces of
/// [`in_order`] are smaller), decoded on `threads`
/// threads: [`PIECE`], or for a body of less than two pieces a thread, a quarter or less
/// of it a thread (two pieces each, at least [`MIN_PIECE`] records), so that a push of
/// 1,000 records is decoded on every core rather than in one thread, and its first
/// records are ready for the writer before its last are.
pub fn piece_len(n: usize, threads: usize) -> usize {
    PIECE.min(n.div_ceil(threads.max(1) * 2)).max(MIN_PIECE)
}

/// How many of the first items [`in_order`] makes in the caller's thread, for pieces of
/// `piece`: a quarter of a piece, about as long as the threads take to start and make
/// their first (an eighth of a piece).
pub fn head_len(piece: usize) -> usize {
    (piece / 4).max(1)
}

/// Drops `facts` on a thread of its own (started on first use) when the caller is their
/// last owner, so that a writer does not spend its time freeing them: an import's
/// batches, a push's facts once stored. One lot waits there at most; while one does, the
/// caller frees its own.
pub fn drop_elsewhere(facts: Vec<Fact>) {
    static DROPPER: std::sync::OnceLock<Option<SyncSender<Vec<Fact>>>> = std::sync::OnceLock::new();
    let dropper = DROPPER.get_or_init(|| {
        let (tx, rx) = sync_channel::<Vec<Fact>>(1);
        std::thread::Builder::new()
            .name("precedent-drop".into())
            .spawn(move || rx.into_iter().for_each(drop))
            .ok()
            .map(|_| tx)
    });
    if let Some(tx) = dropper {
        // Refused (a lot waits, or the thread is gone): dropped here with the error.
        let _ = tx.try_send(facts);
    }
}

/// The threads to decode with: `requested`, or one per core when it is 0.
pub fn threads(requested: usize) -> usize {
    if requested > 0 {
        return requested;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The outputs of a feeder's jobs, worked on by several threads, in job order.
pub struct Ordered<O> {
    outputs: Vec<Receiver<O>>,
    next: usize,
}

impl<O: Send> Ordered<O> {
    /// Starts `threads` workers (at least one) that each run `work` on the jobs dealt to
    /// them, and a feeder thread that runs `feed`: it hands out jobs in order with the
    /// function it is given, which returns `false` once the caller has dropped this
    /// [`Ordered`] (the feeder should then stop). Up to `ahead` outputs per worker wait for
    /// the caller. All of them are threads of `scope`, named after `name`.
    ///
    /// # Errors
    /// A thread that cannot be started.
    pub fn start<'scope, 'env, J, F, W>(
        scope: &'scope Scope<'scope, 'env>,
        name: &str,
        threads: usize,
        ahead: usize,
        feed: F,
        work: W,
    ) -> io::Result<Ordered<O>>
    where
        J: Send + 'scope,
        O: 'scope,
        F: FnOnce(&mut dyn FnMut(J) -> bool) + Send + 'scope,
        W: Fn(J) -> O + Send + Sync + 'scope,
    {
        let mut spawn = |name: String, f: Box<dyn FnOnce() + Send + 'scope>| {
            std::thread::Builder::new()
                .name(name)
                .spawn_scoped(scope, f)
                .map(drop)
        };
        Ordered::build(name, threads, ahead, feed, work, &mut spawn)
    }

    /// [`Ordered::start`] on threads of their own, not joined by anyone: for a feeder that
    /// may block on its input (standard input, say) after the caller has given up, which a
    /// scope would wait for. Each thread ends once the caller has dropped this
    /// [`Ordered`] and its next send fails.
    ///
    /// # Errors
    /// A thread that cannot be started.
    pub fn start_detached<J, F, W>(
        name: &str,
        threads: usize,
        ahead: usize,
        feed: F,
        work: W,
    ) -> io::Result<Ordered<O>>
    where
        J: Send + 'static,
        O: 'static,
        F: FnOnce(&mut dyn FnMut(J) -> bool) + Send + 'static,
        W: Fn(J) -> O + Send + Sync + 'static,
    {
        let mut spawn = |name: String, f: Box<dyn FnOnce() + Send + 'static>| {
            std::thread::Builder::new().name(name).spawn(f).map(drop)
        };
        Ordered::build(name, threads, ahead, feed, work, &mut spawn)
    }

    fn build<'a, J, F, W>(
        name: &str,
        threads: usize,
        ahead: usize,
        feed: F,
        work: W,
        spawn: &mut dyn FnMut(String, Box<dyn FnOnce() + Send + 'a>) -> io::Result<()>,
    ) -> io::Result<Ordered<O>>
    where
        J: Send + 'a,
        O: 'a,
        F: FnOnce(&mut dyn FnMut(J) -> bool) + Send + 'a,
        W: Fn(J) -> O + Send + Sync + 'a,
    {
        let threads = threads.max(1);
        let work = Arc::new(work);
        let mut inputs: Vec<SyncSender<J>> = Vec::with_capacity(threads);
        let mut outputs = Vec::with_capacity(threads);
        for i in 0..threads {
            let (in_tx, in_rx) = sync_channel::<J>(1);
            let (out_tx, out_rx) = sync_channel::<O>(ahead.max(1));
            let work = work.clone();
            spawn(
                format!("{name}-{i}"),
                Box::new(move || {
                    while let Ok(job) = in_rx.recv() {
                        if out_tx.send(work(job)).is_err() {
                            return;
                        }
                    }
                }),
            )?;
            inputs.push(in_tx);
            outputs.push(out_rx);
        }
        spawn(
            format!("{name}-feed"),
            Box::new(move || {
                let mut turn = 0;
                feed(&mut |job| {
                    let sent = inputs[turn % inputs.len()].send(job).is_ok();
                    turn += 1;
                    sent
                });
            }),
        )?;
        Ok(Ordered { outputs, next: 0 })
    }
}

impl<O> Iterator for Ordered<O> {
    type Item = O;

    /// The output of the next job, in the order the feeder gave them; `None` once the
    /// feeder has returned and every output of its jobs was taken (or a worker stopped).
    fn next(&mut self) -> Option<O> {
        let out = self.outputs[self.next % self.outputs.len()].recv().ok()?;
        self.next += 1;
        Some(out)
    }
}

/// What decoding made of one received record: the fact, or why it is refused and the
/// bytes to quarantine.
pub type Decoded = Result<Fact, (String, Vec<u8>)>;

/// Decodes and re-hashes one received record ([`Fact::from_canonical`]); a refused one
/// keeps its reason and its bytes, for the quarantine.
pub fn decode(bytes: &[u8]) -> Decoded {
    Fact::from_canonical(bytes).map_err(|e: Error| (e.to_string(), bytes.to_vec()))
}

/// Runs `f` on every item of `items`, in pieces ([`piece_len`]) on `threads` threads
/// (one per core when 0), and calls `each` with the results in the order of `items`;
/// stops at the first error of `each`. A body of [`MIN_PIECE`] items or less is done in
/// this thread alone.
///
/// # Errors
/// The first error of `each`; [`Error::Io`] if a thread cannot be started.
pub fn for_each_in_order<T, O, E>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> O + Send + Sync,
    mut each: impl FnMut(O) -> Result<(), E>,
) -> Result<(), E>
where
    T: Sync,
    O: Send,
    E: From<Error>,
{
    in_order(items, threads, f, |outputs| {
        for out in outputs {
            each(out)?;
        }
        Ok(())
    })
}

/// Runs `body` with the results of [`for_each_in_order`]'s work on `items`, in the
/// order of `items`, as they come: the threads start when `body` asks for its first
/// result, so that what `body` does before it (a server's push takes the write lock) has
/// the cores to itself, and then decode ahead of it while it stores what it has taken.
/// The first [`head_len`] results are made in the caller's thread as `body` takes them,
/// while the threads start and make their first: `body` has its first result at once.
/// Once `body` returns, results not taken are not computed (the threads stop at their
/// next piece) and this waits for them. If no thread can be started, the work is done
/// in the caller's thread.
///
/// # Errors
/// What `body` returns.
pub fn in_order<T, O, E, R>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> O + Send + Sync,
    body: impl FnOnce(&mut dyn Iterator<Item = O>) -> Result<R, E>,
) -> Result<R, E>
where
    T: Sync,
    O: Send,
    E: From<Error>,
{
    let threads = self::threads(threads);
    let piece = piece_len(items.len(), threads);
    if threads <= 1 || items.len() <= piece {
        return body(&mut items.iter().map(f));
    }
    let f = &f;
    let (head, rest) = items.split_at(head_len(piece));
    std::thread::scope(|scope| {
        // The threads start when `body` asks for its first result, for the items after
        // the head, which this thread makes meanwhile.
        let start = || -> Box<dyn Iterator<Item = O>> {
            let started = Ordered::start(
                scope,
                "decode",
                threads,
                2,
                move |give| {
                    // The first pieces are smaller, doubling up to `piece`: the first
                    // results are ready sooner.
                    let (mut rest, mut len) = (rest, (piece / 8).max(1));
                    while !rest.is_empty() {
                        let (now, next) = rest.split_at(len.min(rest.len()));
                        if !give(now) {
                            return;
                        }
                        (rest, len) = (next, (len * 2).min(piece));
                    }
                },
                |piece: &[T]| piece.iter().map(f).collect::<Vec<O>>(),
            );
            match started {
                Ok(pieces) => Box::new(pieces.flatten()),
                // No thread to be had: decoded in this one.
                Err(_) => Box::new(rest.iter().map(f)),
            }
        };
        let (mut start, mut head, mut rest) = (Some(start), head.iter(), None);
        let mut outputs = std::iter::from_fn(move || {
            if let Some(start) = start.take() {
                rest = Some(start());
            }
            match head.next() {
                Some(item) => Some(f(item)),
                None => rest.as_mut()?.next(),
            }
        });
        let result = body(&mut outputs);
        // Dropped before the scope waits for the workers: their next send fails and
        // they stop.
        drop(outputs);
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_push_of_1000_records_is_cut_for_every_thread() {
        assert_eq!(piece_len(1_000, 2), 250);
        assert_eq!(piece_len(1_000, 1), 500);
        assert_eq!(piece_len(3_000, 2), 750);
        assert_eq!(piece_len(10_000, 2), PIECE);
        assert_eq!(piece_len(100, 2), MIN_PIECE);
        // The head in the caller's thread, the rest on both workers: who made each.
        let items: Vec<u64> = (0..1_000).collect();
        let caller = std::thread::current().id();
        let mut names = Vec::new();
        for_each_in_order(
            &items,
            2,
            |_| {
                let me = std::thread::current();
                (me.id() == caller)
                    .then(|| "caller".to_string())
                    .or(me.name().map(str::to_string))
            },
            |name| {
                names.push(name);
                Ok::<(), Error>(())
            },
        )
        .unwrap();
        let head = head_len(piece_len(1_000, 2));
        assert_eq!(head, 62);
        assert!(names[..head].iter().all(|n| n.as_deref() == Some("caller")));
        let rest: std::collections::BTreeSet<_> = names[head..].iter().cloned().collect();
        let want: std::collections::BTreeSet<_> =
            [Some("decode-0".to_string()), Some("decode-1".to_string())].into();
        assert_eq!(rest, want);
    }

    #[test]
    fn bodies_of_every_size_come_back_in_order() {
        for n in [0, 1, MIN_PIECE, MIN_PIECE + 1, 999, 1_000, 1_001, 2_345] {
            let items: Vec<u64> = (0..n as u64).collect();
            let got = in_order(
                &items,
                2,
                |x| x + 1,
                |out| Ok::<_, Error>(out.collect::<Vec<_>>()),
            )
            .unwrap();
            assert_eq!(got, items.iter().map(|x| x + 1).collect::<Vec<_>>(), "{n}");
        }
    }

    #[test]
    fn a_body_that_stops_early_stops_the_threads() {
        let items: Vec<u64> = (0..1_000).collect();
        let got = in_order(
            &items,
            2,
            |x| *x,
            |out| Ok::<_, Error>(out.take(3).collect::<Vec<_>>()),
        )
        .unwrap();
        assert_eq!(got, vec![0, 1, 2]);
    }

    #[test]
    fn outputs_come_back_in_feed_order_whatever_the_threads() {
        for threads in 1..=4 {
            let items: Vec<u64> = (0..10_000).collect();
            let mut seen = Vec::new();
            for_each_in_order(
                &items,
                threads,
                |x| x * 2,
                |y| {
                    seen.push(y);
                    Ok::<(), Error>(())
                },
            )
            .unwrap();
            assert_eq!(seen, items.iter().map(|x| x * 2).collect::<Vec<_>>());
        }
    }

    #[test]
    fn an_error_stops_the_feeder_and_the_workers() {
        let items: Vec<u64> = (0..100_000).collect();
        let mut taken = 0;
        let r = for_each_in_order(
            &items,
            3,
            |x| *x,
            |x| {
                taken += 1;
                if x == 2_500 {
                    return Err(Error::InvalidFact {
                        reason: "stop".into(),
                    });
                }
                Ok(())
            },
        );
        assert!(r.is_err());
        assert_eq!(taken, 2_501);
    }
}

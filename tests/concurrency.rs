//! One store shared by threads: reads beside an open write, writers waiting for each other
//! up to the busy timeout, and transactions that end when a closure panics; and, on both
//! backends, a queue declared or dropped while another store on the database writes.

mod common;

use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use precedent::queue::{Completion, QueueSpec};
use precedent::{Fact, Store, StoreOptions};

fn fact(n: i64) -> Fact {
    Fact::builder("Item").field("n", n).build().unwrap()
}

fn file_store(options: StoreOptions) -> (tempfile::TempDir, Arc<Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with(dir.path().join("shared.db"), options).unwrap();
    (dir, Arc::new(store))
}

/// A write transaction held open on another thread: it has inserted `f` when this
/// returns, and commits when [`OpenWrite::commit`] is called.
struct OpenWrite {
    release: Arc<Barrier>,
    thread: std::thread::JoinHandle<()>,
}

impl OpenWrite {
    fn start(store: &Arc<Store>, f: Fact) -> OpenWrite {
        let (inserted, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let thread = {
            let (store, inserted, release) = (store.clone(), inserted.clone(), release.clone());
            std::thread::spawn(move || {
                store
                    .write(|w| {
                        w.insert(&f)?;
                        inserted.wait();
                        release.wait();
                        Ok(())
                    })
                    .unwrap()
            })
        };
        inserted.wait();
        OpenWrite { release, thread }
    }

    fn commit(self) {
        self.release.wait();
        self.thread.join().unwrap();
    }
}

/// A read while another thread's write transaction is open answers at once, from the
/// last committed state; once the write commits, the next read sees it.
#[test]
fn reads_run_beside_an_open_write() {
    let (_dir, store) = file_store(StoreOptions::default());
    let f = fact(1);
    let writer = OpenWrite::start(&store, f.clone());
    // The writer holds its transaction open: a read must not wait for it.
    let (tx, rx) = mpsc::channel();
    {
        let (store, hash) = (store.clone(), f.hash());
        std::thread::spawn(move || tx.send(store.get(&hash).unwrap()).unwrap());
    }
    let seen = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a read waited for the writer");
    assert_eq!(seen, None, "a read saw an uncommitted write");
    writer.commit();
    assert_eq!(store.get(&f.hash()).unwrap(), Some(f));
}

/// A second writer in the same process waits for the first up to the busy timeout, then
/// fails busy having written nothing; after the first commits, writing works again.
#[test]
fn a_second_writer_waits_up_to_the_busy_timeout_then_fails_busy() {
    let options = StoreOptions {
        busy_timeout: Duration::from_millis(200),
        ..StoreOptions::default()
    };
    let (_dir, store) = file_store(options);
    let first = OpenWrite::start(&store, fact(1));
    let t0 = Instant::now();
    let err = store.insert(&fact(2)).unwrap_err();
    let waited = t0.elapsed();
    assert!(err.is_busy(), "{err}");
    assert!(
        waited >= Duration::from_millis(150),
        "gave up after {waited:?}"
    );
    first.commit();
    assert_eq!(store.get(&fact(2).hash()).unwrap(), None);
    assert!(store.insert(&fact(2)).unwrap().released() == 1);
    assert_eq!(store.stats().unwrap().released, 2);
}

/// Threads sharing one store each write and read; every write lands once, in a valid
/// release order.
#[test]
fn threads_share_one_store() {
    let (_dir, store) = file_store(StoreOptions::default());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let f = fact(t * 1000 + i);
                    store.insert(&f).unwrap();
                    assert_eq!(store.get(&f.hash()).unwrap(), Some(f));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(store.stats().unwrap().released, 200);
    assert!(store.verify(|_| {}).unwrap().is_clean());
}

/// A panic inside a write closure rolls the transaction back, and the store stays usable
/// by every thread (its lock is not left poisoned or taken).
#[test]
fn a_panic_in_a_write_rolls_back_and_the_store_stays_usable() {
    let (_dir, store) = file_store(StoreOptions::default());
    let s = store.clone();
    let panicked = std::thread::spawn(move || {
        s.write(|w| -> precedent::Result<()> {
            w.insert(&fact(1))?;
            panic!("the handler failed");
        })
    })
    .join();
    assert!(panicked.is_err());
    assert_eq!(store.get(&fact(1).hash()).unwrap(), None);
    assert_eq!(store.insert(&fact(2)).unwrap().released(), 1);
    assert_eq!(store.stats().unwrap().released, 1);
}

/// A panic inside a read closure ends its transaction: the connection goes back to the
/// pool with no transaction open, so later reads begin afresh and see later writes.
#[test]
fn a_panic_in_a_read_ends_its_transaction() {
    let (_dir, store) = file_store(StoreOptions::default());
    store.insert(&fact(1)).unwrap();
    let s = store.clone();
    let panicked = std::thread::spawn(move || {
        s.read(|r| -> precedent::Result<()> {
            r.last_seq()?;
            panic!("the reader failed");
        })
    })
    .join();
    assert!(panicked.is_err());
    store.insert(&fact(2)).unwrap();
    for _ in 0..8 {
        // Every pooled connection: a stale snapshot or a transaction left open would show.
        assert_eq!(store.stats().unwrap().released, 2);
    }
}

/// A write started inside a write on the same thread fails at once, with a message that
/// says what to do, instead of waiting for itself until the busy timeout.
#[test]
fn a_write_inside_a_write_on_one_thread_fails_at_once() {
    let (_dir, store) = file_store(StoreOptions::default());
    let t0 = Instant::now();
    let inner = store.write(|w| {
        w.insert(&fact(1))?;
        Ok(store.insert(&fact(2)).map(|_| ()))
    });
    let err = inner.unwrap().unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(4), "waited for itself");
    assert!(
        err.to_string().contains("already open on this thread"),
        "{err}"
    );
    // The outer write committed; the inner one wrote nothing.
    assert!(store.get(&fact(1).hash()).unwrap().is_some());
    assert_eq!(store.get(&fact(2).hash()).unwrap(), None);
}

/// A watch's poll (a brief read, which may use the write connection when it is free)
/// does not wait for a write transaction open on another thread, and sees only what is
/// committed.
#[test]
fn a_watch_poll_does_not_wait_for_an_open_write() {
    use precedent::query::{Givens, Query};
    let (_dir, store) = file_store(StoreOptions::default());
    let q = Query::parse("match i: Item select i.n").unwrap();
    let mut watch = store.watch(&q, &Givens::new()).unwrap();
    store.insert(&fact(1)).unwrap();
    let writer = OpenWrite::start(&store, fact(2));
    let (tx, rx) = mpsc::channel();
    let poller = {
        let store = store.clone();
        std::thread::spawn(move || {
            let changes = watch.poll(&store).unwrap();
            tx.send(changes.len()).unwrap();
            watch
        })
    };
    let seen = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a poll waited for the writer");
    assert_eq!(
        seen, 1,
        "the poll saw the uncommitted fact, or missed the committed one"
    );
    writer.commit();
    let mut watch = poller.join().unwrap();
    assert_eq!(watch.poll(&store).unwrap().len(), 1);
    assert_eq!(watch.results().len(), 2);
}

fn ship_queue(store: &Store) {
    let done = Completion {
        type_name: "Shipment".into(),
        role: "order".into(),
    };
    store
        .declare_queue(&QueueSpec::new("ship", "Order", vec![done]))
        .unwrap();
}

/// A store on `db` that waits up to two minutes for the write lock: a writer waiting
/// out a declaration's back-fill, which may take seconds.
fn patient(db: &common::backend::TestDb) -> Store {
    db.store_with(StoreOptions {
        busy_timeout: Duration::from_secs(120),
        ..StoreOptions::default()
    })
}

fn plain_order(id: i64) -> Fact {
    Fact::builder("Order").field("id", id).build().unwrap()
}

/// Pushes batches of 500 orders into `writer` on a thread of its own while `meanwhile`
/// runs, from 100 ms after the first batch is in to 200 ms after `meanwhile` returns;
/// returns how many orders were pushed before `meanwhile` began, and in all.
fn pushing_while(writer: &Store, meanwhile: impl FnOnce()) -> (i64, i64) {
    use std::sync::atomic::Ordering::Relaxed;
    let (stop, pushed) = (AtomicBool::new(false), AtomicI64::new(0));
    let before = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Relaxed) {
                let n = pushed.load(Relaxed);
                writer
                    .insert_batch((n..n + 500).map(plain_order).collect())
                    .unwrap();
                pushed.store(n + 500, Relaxed);
            }
        });
        // The first batch in, and then some (bounded: 60 s).
        for _ in 0..6_000 {
            if pushed.load(Relaxed) > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(100));
        let before = pushed.load(Relaxed);
        meanwhile();
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Relaxed);
        before
    });
    (before, pushed.load(Relaxed))
}

/// On PostgreSQL a write transaction may read the queue declarations before it takes the
/// write lock (a claim takes none), and a queue another process declares meanwhile
/// commits before this transaction gets the lock: what it releases after that is an
/// input of the new queue too, as the declaration's back-fill did not see it. (SQLite's
/// writer holds its lock from its first statement, so there the declaration waits.)
#[test]
fn a_queue_declared_between_a_claim_and_its_completion_gets_the_completion() {
    let Some(db) = common::pg::db() else { return };
    let worker = Store::open_with(&db.url, StoreOptions::default()).unwrap();
    let declarer = Store::open_with(&db.url, StoreOptions::default()).unwrap();
    ship_queue(&worker);
    worker.insert(&plain_order(1)).unwrap();
    let invoice = QueueSpec::new(
        "invoice",
        "Shipment",
        vec![Completion {
            type_name: "Invoice".into(),
            role: "shipment".into(),
        }],
    );
    let (claimed, claimed_rx) = mpsc::channel();
    let (declared, declared_rx) = mpsc::channel();
    std::thread::scope(|s| {
        let worker = &worker;
        s.spawn(move || {
            worker
                .write(|w| {
                    let lease = w.claim("ship", 1)?.pop().unwrap();
                    claimed.send(()).unwrap();
                    declared_rx.recv_timeout(Duration::from_secs(60)).unwrap();
                    w.complete(&lease, |w| {
                        w.insert(&lease.completion().build()?).map(|_| ())
                    })
                })
                .unwrap();
        });
        claimed_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        declarer.declare_queue(&invoice).unwrap();
        declared.send(()).unwrap();
    });
    let stats = declarer.queue_stats("invoice").unwrap();
    assert_eq!(
        stats.ready, 1,
        "the shipment is an input of the queue declared before it"
    );
}

/// On PostgreSQL a claim of an at-most-once queue with a limit (a rate: a live-lease
/// limit is refused on such a queue) takes the write lock (for its delivery fact) before
/// it locks the queue's row (to charge its window), as a
/// completion holding the write lock updates that row at its commit: in the other order
/// the two waited for each other until PostgreSQL aborted one as a deadlock.
#[test]
fn a_limited_at_most_once_claim_beside_a_completion_does_not_deadlock() {
    use precedent::queue::Semantics;
    let Some(db) = common::pg::db() else { return };
    let completer = Store::open_with(&db.url, StoreOptions::default()).unwrap();
    let claimer = Store::open_with(&db.url, StoreOptions::default()).unwrap();
    let mut spec = QueueSpec::new(
        "once",
        "Order",
        vec![Completion {
            type_name: "Shipment".into(),
            role: "order".into(),
        }],
    );
    spec.semantics = Semantics::AtMostOnce;
    spec.rate = Some(precedent::queue::RateLimit {
        count: 100,
        per_ms: 60_000,
    });
    completer.declare_queue(&spec).unwrap();
    completer
        .insert_batch(vec![plain_order(1), plain_order(2)])
        .unwrap();
    let lease = completer.claim("once", 1).unwrap().pop().unwrap();
    let (holding, holding_rx) = mpsc::channel();
    std::thread::scope(|s| {
        let (completer, lease) = (&completer, &lease);
        let done = s.spawn(move || {
            completer.write(|w| {
                w.complete(lease, |w| {
                    w.insert(&lease.completion().build()?).map(|_| ())
                })?;
                // The write lock is held; the claim below starts and waits for it.
                holding.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(500));
                Ok(())
            })
        });
        holding_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        let claimed = claimer.claim("once", 1);
        let completed = done.join().unwrap();
        assert!(completed.is_ok(), "the completion: {completed:?}");
        assert_eq!(claimed.unwrap().len(), 1, "the claim");
    });
}

conformance! {
    /// A queue declared while another store on the database pushes facts of its input
    /// type gets each of them as an input: the declaration and the releases take turns
    /// at the write lock, so a release either is seen by the back-fill or sees the queue.
    fn a_queue_declared_during_pushes_gets_every_input(b: Backend) {
        let db = b.db();
        let writer = patient(&db);
        let declarer = db.store();
        let (before, pushed) = pushing_while(&writer, || ship_queue(&declarer));
        assert!(
            before > 0 && pushed > before,
            "orders pushed before ({before}) and during or after ({pushed}) the declaration"
        );
        let stats = declarer.queue_stats("ship").unwrap();
        assert_eq!(stats.ready as i64, pushed, "every order is an input");
    }

    /// A queue dropped while another store on the database pushes facts of its input type
    /// leaves no item behind: a release that indexed an input for it came before the
    /// drop, which deletes the item.
    fn a_queue_dropped_during_pushes_leaves_no_item(b: Backend) {
        let db = b.db();
        let writer = patient(&db);
        let dropper = db.store();
        ship_queue(&dropper);
        let (before, pushed) = pushing_while(&writer, || dropper.drop_queue("ship").unwrap());
        assert!(before > 0 && pushed > before, "pushed {before}, then {pushed}");
        assert_eq!(db.query_i64("SELECT count(*) FROM queue_item"), 0);
    }
}

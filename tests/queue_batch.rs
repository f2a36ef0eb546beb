//! `Store::complete_batch`: whatever mix of handlers succeed, fail, forget the completion,
//! complete another lease's input or fail another lease, each lease ends as if it ran `Store::complete` alone:
//! its writes commit exactly once or not at all, and the other leases are unaffected.
//! The batch runs its handlers in one savepoint and replays lease by lease after a
//! failure, so handlers may run twice; this checks that nothing shows it in the database.

mod common;

use std::collections::HashMap;

use precedent::queue::{Completion, Failure, QueueSpec};
use precedent::store::SqlExt;
use precedent::{Error, Fact, FactHash, Store, args};
use proptest::prelude::*;

use common::backend::{TestDb, blob_type};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Handler {
    /// Writes its effect and the completion.
    Completes,
    /// Writes its effect, a held fact and a note, then fails.
    Fails,
    /// Writes its effect and returns `Ok` without a completion.
    Forgets,
    /// Writes its effect, its completion and the next lease's completion.
    CompletesNext,
    /// Writes its effect and its completion, and fails the next lease (back to ready):
    /// the batch checked that lease before the first handler ran, and must see that it
    /// no longer holds.
    FailsNext,
}

fn handler() -> impl Strategy<Value = Handler> {
    prop_oneof![
        6 => Just(Handler::Completes),
        2 => Just(Handler::Fails),
        1 => Just(Handler::Forgets),
        1 => Just(Handler::CompletesNext),
        1 => Just(Handler::FailsNext),
    ]
}

fn shipped(input: &FactHash) -> Fact {
    Fact::builder("Shipped")
        .predecessor("order", *input)
        .build()
        .unwrap()
}

/// What each lease's result must be, judged lease by lease in order.
#[derive(Debug, PartialEq, Eq)]
enum Expected {
    Ok,
    Failed,
    NotCompleted,
    LeaseLost,
}

fn expected(plan: &[Handler]) -> Vec<Expected> {
    let mut out: Vec<Expected> = Vec::new();
    for (i, h) in plan.iter().enumerate() {
        let lost = i > 0
            && matches!(plan[i - 1], Handler::CompletesNext | Handler::FailsNext)
            && out[i - 1] == Expected::Ok;
        out.push(if lost {
            Expected::LeaseLost
        } else {
            match h {
                Handler::Completes | Handler::CompletesNext | Handler::FailsNext => Expected::Ok,
                Handler::Fails => Expected::Failed,
                Handler::Forgets => Expected::NotCompleted,
            }
        });
    }
    out
}

/// A store with queue `ship` of `Order`s (completed by a `Shipped`) and `n` orders in it.
fn orders_queued(db: &TestDb, n: usize) -> Store {
    db.reset();
    let store = db.store();
    let done = Completion {
        type_name: "Shipped".into(),
        role: "order".into(),
    };
    store
        .declare_queue(&QueueSpec::new("ship", "Order", vec![done]))
        .unwrap();
    let orders: Vec<Fact> = (0..n as i64)
        .map(|n| Fact::builder("Order").field("n", n).build().unwrap())
        .collect();
    store.insert_batch(orders).unwrap();
    store
}

/// Runs `plan` on a fresh store in `db` (emptied first).
fn run(db: &TestDb, plan: &[Handler]) -> Result<Vec<u32>, TestCaseError> {
    let store = orders_queued(db, plan.len());
    let blob = blob_type(&store);
    store
        .write(|w| {
            w.sql()
                .batch(&format!("CREATE TABLE effect (input {blob} NOT NULL)"))
        })
        .unwrap();
    let leases = store.claim("ship", plan.len()).unwrap();
    prop_assert_eq!(leases.len(), plan.len());
    let index: HashMap<FactHash, usize> = leases
        .iter()
        .enumerate()
        .map(|(i, l)| (l.input.hash(), i))
        .collect();
    let missing = Fact::builder("Lost").build().unwrap().hash();
    let mut calls = vec![0u32; plan.len()];
    let results = store
        .complete_batch(&leases, |w, lease| {
            let i = index[&lease.input.hash()];
            calls[i] += 1;
            w.sql().execute(
                "INSERT INTO effect (input) VALUES (?1)",
                args![&lease.input.hash()],
            )?;
            match plan[i] {
                Handler::Completes => {
                    w.insert(&lease.completion().build()?)?;
                }
                Handler::Fails => {
                    w.insert(&Fact::builder("Waiting").predecessor("p", missing).build()?)?;
                    w.insert(
                        &Fact::builder("Note")
                            .predecessor("order", lease.input.hash())
                            .build()?,
                    )?;
                    return Err(Error::InvalidFact {
                        reason: format!("handler {i} gave up"),
                    });
                }
                Handler::Forgets => {}
                Handler::CompletesNext => {
                    w.insert(&lease.completion().build()?)?;
                    if let Some(next) = leases.get(i + 1) {
                        w.insert(&shipped(&next.input.hash()))?;
                    }
                }
                Handler::FailsNext => {
                    w.insert(&lease.completion().build()?)?;
                    if let Some(next) = leases.get(i + 1) {
                        w.fail(
                            next,
                            &Failure::Transient("failed by the lease before".into()),
                        )?;
                    }
                }
            }
            Ok(())
        })
        .unwrap();

    let want = expected(plan);
    prop_assert_eq!(results.len(), plan.len(), "one result per lease");
    for (i, (got, want)) in results.iter().zip(&want).enumerate() {
        let fits = match (got, want) {
            (Ok(()), Expected::Ok) => true,
            (Err(Error::InvalidFact { reason }), Expected::Failed) => {
                reason == &format!("handler {i} gave up")
            }
            (Err(Error::NotCompleted { .. }), Expected::NotCompleted) => true,
            (Err(Error::LeaseLost { .. }), Expected::LeaseLost) => true,
            _ => false,
        };
        prop_assert!(fits, "lease {i} of {plan:?}: got {got:?}, want {want:?}");
    }

    // Every committed effect is there exactly once, and only those.
    let effects: Vec<FactHash> = store
        .read(|r| r.query_vec("SELECT input FROM effect", args![], |row| row.hash(0)))
        .unwrap();
    let mut per_lease = vec![0usize; plan.len()];
    for e in &effects {
        per_lease[index[e]] += 1;
    }
    for (i, want) in want.iter().enumerate() {
        let once = usize::from(*want == Expected::Ok);
        prop_assert_eq!(per_lease[i], once, "effects of lease {} in {:?}", i, plan);
    }
    prop_assert_eq!(
        store.held_count().unwrap(),
        0,
        "a failed handler's held fact stayed"
    );

    // A handler runs at most twice, a lost lease's never, and one that failed (or any
    // after the last failure) once.
    let last_failure = want
        .iter()
        .rposition(|w| matches!(w, Expected::Failed | Expected::NotCompleted));
    for (i, want) in want.iter().enumerate() {
        let bound = match want {
            Expected::LeaseLost => 0..=0,
            Expected::Failed | Expected::NotCompleted => 1..=1,
            Expected::Ok if last_failure.is_none_or(|f| i > f) => 1..=1,
            Expected::Ok => 1..=2,
        };
        prop_assert!(
            bound.contains(&calls[i]),
            "lease {i} ran {} times in {plan:?}",
            calls[i]
        );
    }

    // The queue agrees: completed leases are gone, failed ones still leased, and one that
    // the lease before it failed is backing off.
    let stats = store.queue_stats("ship").unwrap();
    let ok = want.iter().filter(|w| **w == Expected::Ok).count();
    let lost = want.iter().filter(|w| **w == Expected::LeaseLost).count();
    let failed_by_previous = (1..plan.len())
        .filter(|&i| want[i] == Expected::LeaseLost && plan[i - 1] == Handler::FailsNext)
        .count();
    prop_assert_eq!(stats.completed as usize, ok + lost - failed_by_previous);
    prop_assert_eq!(stats.ready + stats.delayed, failed_by_previous as u64);
    prop_assert_eq!(stats.leased as usize, plan.len() - ok - lost);
    Ok(calls)
}

conformance! {
    /// The cases share one database, emptied before each.
    fn every_lease_of_a_batch_ends_as_if_completed_alone(b: Backend) {
        let db = b.db();
        proptest!(ProptestConfig::with_cases(96), |(plan in prop::collection::vec(handler(), 1..14))| {
            run(&db, &plan)?;
        });
    }
}

conformance! {
    fn a_failure_replays_only_the_leases_before_it(b: Backend) {
        use Handler::*;
        let plan = [
            Completes, Completes, Fails, Completes, Completes, Forgets, Completes,
        ];
        // Each failure rolls back the pass it ends and runs again, one by one, the leases
        // of that pass before it; the failing handler is not called again.
        assert_eq!(run(&b.db(), &plan).unwrap(), vec![2, 2, 1, 2, 2, 1, 1]);
    }
}

conformance! {
    fn a_lease_failed_by_an_earlier_handler_is_not_run(b: Backend) {
        use Handler::*;
        // The batch checks every lease before the first handler; the second lease is failed
        // by the first handler, so its check no longer holds and its handler never runs.
        assert_eq!(
            run(&b.db(), &[FailsNext, Completes, Completes]).unwrap(),
            vec![1, 0, 1]
        );
        assert_eq!(
            run(&b.db(), &[Completes, CompletesNext, Completes]).unwrap(),
            vec![1, 1, 0]
        );
    }
}

conformance! {
    fn a_batch_without_failures_runs_each_handler_once(b: Backend) {
        assert_eq!(run(&b.db(), &[Handler::Completes; 20]).unwrap(), vec![1; 20]);
    }
}

conformance! {
    fn a_lost_lease_far_from_the_others_in_its_batch_is_found_lost(b: Backend) {
        // The batch reads the item rows between its lowest and highest input, up to a bound;
        // a lease past the bound is looked up on its own, and one that was lost stays lost.
        let db = b.db();
        let store = orders_queued(&db, 60);
        let leases = store.claim("ship", 60).unwrap();
        let (first, last) = (leases[0].clone(), leases[59].clone());
        store
            .fail(&last, Failure::Transient("given back".into()))
            .unwrap();
        let mut ran = Vec::new();
        let results = store
            .complete_batch(&[first.clone(), last.clone()], |w, lease| {
                ran.push(lease.input.hash());
                w.insert(&lease.completion().build()?).map(|_| ())
            })
            .unwrap();
        assert!(results[0].is_ok(), "{:?}", results[0]);
        assert!(
            matches!(results[1], Err(Error::LeaseLost { .. })),
            "{:?}",
            results[1]
        );
        assert_eq!(ran, vec![first.input.hash()]);
    }
}

conformance! {
    /// On PostgreSQL a batch writes its released facts ahead, taking each to be new; a
    /// handler that writes a fact stored already proves that wrong, and the batch runs
    /// again without writing ahead. Nothing of the wrong guess shows: every lease
    /// completes, the stored fact is one row, and release numbers have no gap.
    fn a_handler_writing_a_stored_fact_still_completes_its_batch(b: Backend) {
        let db = b.db();
        let store = orders_queued(&db, 5);
        let catalog = Fact::builder("Catalog").field("v", 1).build().unwrap();
        store.insert(&catalog).unwrap();
        let before = db.query_i64("SELECT count(*) FROM fact");
        let leases = store.claim("ship", 5).unwrap();
        let mut calls = 0;
        let mut outcomes = Vec::new();
        let results = store
            .complete_batch(&leases, |w, lease| {
                calls += 1;
                outcomes.push(w.insert(&catalog)?);
                w.insert(&lease.completion().build()?).map(|_| ())
            })
            .unwrap();
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        // The last pass saw the stored fact as what it is.
        for o in &outcomes[outcomes.len() - 5..] {
            assert!(
                matches!(o, precedent::InsertOutcome::Duplicate { .. }),
                "{o:?}"
            );
        }
        // Once each, and on PostgreSQL again after the pass that found the guess wrong.
        assert!((5..=10).contains(&calls), "handlers ran {calls} times");
        assert_eq!(
            db.query_i64("SELECT count(*) FROM fact"),
            db.query_i64("SELECT max(seq) FROM fact"),
            "release numbers without a gap"
        );
        assert_eq!(db.query_i64("SELECT count(*) FROM fact"), before + 5);
        let stats = store.queue_stats("ship").unwrap();
        assert_eq!((stats.completed, stats.leased), (5, 0));
    }
}

conformance! {
    /// What a handler wrote is there for its next read in the same batch, also the facts
    /// PostgreSQL writes ahead.
    fn a_handler_reads_what_it_wrote_in_its_batch(b: Backend) {
        let db = b.db();
        let store = orders_queued(&db, 4);
        let leases = store.claim("ship", 4).unwrap();
        let results = store
            .complete_batch(&leases, |w, lease| {
                let done = lease.completion().build()?;
                w.insert(&done)?;
                assert_eq!(w.sql().get(&done.hash())?.as_ref(), Some(&done));
                let rows = w.sql().query_vec(
                    "SELECT count(*) FROM fact WHERE hash = ?1",
                    args![&done.hash()],
                    |r| r.get::<i64>(0),
                )?;
                assert_eq!(rows, vec![1]);
                Ok(())
            })
            .unwrap();
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    }
}

conformance! {
    /// An input completed in a batch unblocks at once what its handler writes after it:
    /// a new input descending from it is ready, not blocked by it (on PostgreSQL the
    /// completed input's item row is deleted later, in one statement with the others).
    fn an_input_written_after_its_ancestor_completed_in_a_batch_is_ready(b: Backend) {
        let db = b.db();
        let store = orders_queued(&db, 3);
        let leases = store.claim("ship", 3).unwrap();
        let results = store
            .complete_batch(&leases, |w, lease| {
                w.insert(&lease.completion().build()?)?;
                let again = Fact::builder("Order")
                    .field("n", 100)
                    .predecessor("after", lease.input.hash())
                    .build()?;
                w.insert(&again).map(|_| ())
            })
            .unwrap();
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        let stats = store.queue_stats("ship").unwrap();
        assert_eq!((stats.ready, stats.blocked, stats.completed), (3, 0, 3));
    }
}

conformance! {
    /// A batch completion that waits for another writer past its busy timeout fails as
    /// busy as a whole, having run no handler and written nothing, so that a caller
    /// retries it (`precedent work` waits and tries again, a hub answers 503). On
    /// PostgreSQL the batch used to wait for the write lock first at its first lease's
    /// step: the lock's timeout became that lease's result, in a transaction PostgreSQL
    /// had aborted, and the batch failed as another error. Once the other writer is done,
    /// the batch again completes every lease, once.
    fn a_batch_held_off_past_the_busy_timeout_is_busy(b: Backend) {
        let db = b.db();
        let holder = orders_queued(&db, 2);
        let waiter = db.store_with(precedent::StoreOptions {
            busy_timeout: std::time::Duration::from_secs(1),
            ..precedent::StoreOptions::default()
        });
        let leases = waiter.claim("ship", 2).unwrap();
        assert_eq!(leases.len(), 2);
        let mut calls = 0;
        let mut complete = || {
            waiter.complete_batch(&leases, |w, lease| {
                calls += 1;
                w.insert(&lease.completion().build()?).map(|_| ())
            })
        };
        let other = Fact::builder("Other").build().unwrap();
        holder
            .write(|w| {
                // The other writer's fact takes the write lock, held to its commit.
                w.insert(&other)?;
                let err = complete().unwrap_err();
                assert!(err.is_busy(), "{err:?}");
                Ok(())
            })
            .unwrap();
        assert_eq!(holder.seq_of(&other.hash()).unwrap(), Some(3));
        let results = complete().unwrap();
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        assert_eq!(calls, 2, "a handler ran while the batch waited");
        assert_eq!(db.query_i64("SELECT count(*) FROM fact"), 5);
        let stats = waiter.queue_stats("ship").unwrap();
        assert_eq!((stats.completed, stats.leased), (2, 0));
        assert!(waiter.claim("ship", 2).unwrap().is_empty());
    }
}

/// On PostgreSQL a batch completion locks its leases' rows before it takes the write
/// lock, as a claim that dead-letters an expired lease does (the row, then the write):
/// while it waits for a row another transaction holds, it holds no write lock, so that
/// transaction may take the write lock and commit. Taking the write lock first would
/// make the two wait for each other.
#[cfg(feature = "postgres")]
#[test]
fn a_batch_completion_keeps_the_lock_order_of_claims() {
    use common::backend::Backend;
    if !Backend::Postgres.ready() {
        return;
    }
    let db = Backend::Postgres.db();
    let store = orders_queued(&db, 1);
    let lease = store.claim("ship", 1).unwrap().pop().unwrap();
    let url = db.location.to_str().unwrap().to_string();
    let mut raw = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut tx = raw.transaction().unwrap();
    tx.execute("SELECT * FROM queue_item FOR UPDATE", &[])
        .unwrap();
    let batch = std::thread::spawn(move || {
        store.complete_batch(&[lease], |w, lease| {
            w.insert(&lease.completion().build()?).map(|_| ())
        })
    });
    // Until the batch waits for the row.
    let mut watcher = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND datname = current_database()",
                &[],
            )
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the batch never waited for the row"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let free: bool = tx
        .query_one(
            "SELECT pg_try_advisory_xact_lock($1)",
            &[&0x7072_6563_6465_6e74_i64],
        )
        .unwrap()
        .get(0);
    assert!(
        free,
        "the batch held the write lock while it waited for a row"
    );
    tx.commit().unwrap();
    let results = batch.join().unwrap().unwrap();
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
}

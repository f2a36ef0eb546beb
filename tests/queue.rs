//! Work queues: every promise of docs/semantics.md ("Work queues") has a test here.
//! Time is a ManualClock: no test sleeps.

mod common;

use std::sync::Arc;

use precedent::clock::{Clock, ManualClock};
use precedent::queue::{
    Completion, FailOutcome, Failure, FieldKind, FieldRequirement, ItemState, Ordering, QueueSpec,
    Semantics, system,
};
use precedent::store::SqlExt;
use precedent::{Error, Fact, FactHash, Store, StoreOptions, args};
use proptest::prelude::*;

use common::backend::{Backend, blob_type};

const T0: i64 = 1_800_000_000_000;

fn store_with(b: Backend, clock: &Arc<ManualClock>) -> Store {
    b.store_with(StoreOptions {
        clock: clock.clone(),
        ..StoreOptions::default()
    })
}

fn orders_spec() -> QueueSpec {
    QueueSpec::new(
        "ship",
        "Order",
        vec![
            Completion {
                type_name: "Shipped".into(),
                role: "order".into(),
            },
            Completion {
                type_name: "Cancelled".into(),
                role: "order".into(),
            },
        ],
    )
}

fn order(n: i64, after: &[FactHash]) -> Fact {
    let mut b = Fact::builder("Order").field("n", n);
    for a in after {
        b = b.predecessor("after", *a);
    }
    b.build().unwrap()
}

fn shipped(order: &Fact) -> Fact {
    Fact::builder("Shipped")
        .predecessor("order", order.hash())
        .build()
        .unwrap()
}

fn claimed(store: &mut Store, n: usize) -> Vec<FactHash> {
    let mut v: Vec<FactHash> = store
        .claim("ship", n)
        .unwrap()
        .into_iter()
        .map(|l| l.input.hash())
        .collect();
    v.sort();
    v
}

conformance! {
    fn an_input_is_pending_until_a_completing_successor_arrives(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let mut s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        let (a, b) = (order(1, &[]), order(2, &[]));
        s.insert_batch(vec![a.clone(), b.clone()]).unwrap();
        assert_eq!(s.queue_stats("ship").unwrap().ready, 2);
        // A completion written by anyone (here a plain insert) ends the input.
        s.insert(
            &Fact::builder("Cancelled")
                .predecessor("order", b.hash())
                .build()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(claimed(&mut s, 10), vec![a.hash()]);
        let st = s.queue_stats("ship").unwrap();
        assert_eq!((st.ready, st.leased, st.completed), (0, 1, 1));
    }
}

conformance! {
    fn completion_commits_the_handlers_rows_with_it_or_nothing(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let mut s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        let blob = blob_type(&s);
        s.write(|w| {
            w.sql()
                .batch(&format!("CREATE TABLE effect (input {blob} PRIMARY KEY)"))
        })
        .unwrap();
        let a = order(1, &[]);
        s.insert(&a).unwrap();
        let lease = s.claim("ship", 1).unwrap().pop().unwrap();
        // A handler that writes its row but no completion: refused, and its row is gone.
        let r = s.complete(&lease, |w| {
            w.sql()
                .execute("INSERT INTO effect VALUES (?1)", args![&lease.input.hash()])?;
            Ok(())
        });
        assert!(matches!(r, Err(Error::NotCompleted { .. })));
        let count = |s: &mut Store| {
            s.write(|w| {
                w.sql()
                    .query_one("SELECT count(*) FROM effect", args![], |r| r.get::<i64>(0))
            })
            .unwrap()
        };
        assert_eq!(count(&mut s), 0);
        s.complete(&lease, |w| {
            w.sql()
                .execute("INSERT INTO effect VALUES (?1)", args![&lease.input.hash()])?;
            w.insert(&lease.completion().field("by", "test").build()?)?;
            Ok(())
        })
        .unwrap();
        assert_eq!(count(&mut s), 1);
        assert!(s.claim("ship", 1).unwrap().is_empty());
        assert_eq!(
            s.successors(&a.hash(), Some("order"), Some("Shipped"))
                .unwrap()
                .len(),
            1
        );
    }
}

conformance! {
    fn a_lease_is_exclusive_until_it_expires_and_a_stale_completion_is_refused(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        let a = order(1, &[]);
        s.insert(&a).unwrap();
        let first = s.claim("ship", 5).unwrap().pop().unwrap();
        assert_eq!(first.attempt, 1);
        assert!(s.claim("ship", 5).unwrap().is_empty());
        // A heartbeat pushes the expiry out.
        clock.advance(20_000);
        let first = s.extend(&first).unwrap();
        clock.advance(20_000);
        assert!(s.claim("ship", 5).unwrap().is_empty());
        // Past the lease, the input is handed out again with the attempt counted.
        clock.advance(30_001);
        let second = s.claim("ship", 5).unwrap().pop().unwrap();
        assert_eq!(second.attempt, 2);
        let stale = s.complete(&first, |w| w.insert(&shipped(&a)).map(|_| ()));
        assert!(matches!(stale, Err(Error::LeaseLost { .. })));
        assert!(
            s.successors(&a.hash(), None, None).unwrap().is_empty(),
            "nothing of the stale completion is written"
        );
        assert!(matches!(s.extend(&first), Err(Error::LeaseLost { .. })));
        s.complete(&second, |w| w.insert(&shipped(&a)).map(|_| ()))
            .unwrap();
    }
}

conformance! {
    fn two_processes_never_hold_live_leases_on_one_input(backend: Backend) {
        let db = backend.db();
        let mut a = db.store();
        let mut b = db.store();
        a.declare_queue(&orders_spec()).unwrap();
        let orders: Vec<Fact> = (0..40).map(|i| order(i, &[])).collect();
        b.insert_batch(orders).unwrap();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10 {
            for s in [&mut a, &mut b] {
                for l in s.claim("ship", 3).unwrap() {
                    assert!(seen.insert(l.input.hash()), "handed out twice");
                }
            }
        }
        assert_eq!(seen.len(), 40);
    }
}

conformance! {
    fn transient_failures_back_off_then_dead_letter_with_audit_fields(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut spec = orders_spec();
        spec.retry.max_attempts = 3;
        s.declare_queue(&spec).unwrap();
        let a = order(1, &[]);
        s.insert(&a).unwrap();
        for attempt in 1..=2u32 {
            let lease = s.claim("ship", 1).unwrap().pop().unwrap();
            assert_eq!(lease.attempt, attempt);
            let now = clock.now_ms();
            let FailOutcome::Retry { at_ms } = s
                .fail(&lease, Failure::Transient("downstream 503".into()))
                .unwrap()
            else {
                panic!("expected a retry")
            };
            let ceiling = spec.retry.backoff_base_ms << (attempt - 1);
            assert!(
                at_ms >= now && at_ms <= now + ceiling,
                "attempt {attempt}: {at_ms} outside [now, now+{ceiling}]"
            );
            if at_ms > now {
                assert!(
                    s.claim("ship", 1).unwrap().is_empty(),
                    "claimable during backoff"
                );
                assert_eq!(s.queue_stats("ship").unwrap().delayed, 1);
            }
            clock.set(at_ms);
        }
        let lease = s.claim("ship", 1).unwrap().pop().unwrap();
        let out = s
            .fail(&lease, Failure::Transient("still 503".into()))
            .unwrap();
        let FailOutcome::DeadLettered(dl) = out else {
            panic!("{out:?}")
        };
        let dead = s.get(&dl).unwrap().unwrap();
        assert_eq!(dead.type_name(), system::DEAD_LETTER);
        assert_eq!(dead.field("attempts"), Some(&precedent::Value::Integer(3)));
        assert_eq!(
            dead.field("first_attempt_at"),
            Some(&precedent::Value::Integer(T0 as i128))
        );
        assert!(
            matches!(dead.field("reason"), Some(precedent::Value::Text(r)) if r.contains("still 503"))
        );
        assert!(dead.predecessor_hashes().contains(&a.hash()));
        assert!(s.claim("ship", 1).unwrap().is_empty());
        assert_eq!(s.queue_stats("ship").unwrap().failed_5m, 3);
        let breaches = s.queue_check(None).unwrap();
        assert!(
            breaches.iter().any(|b| b.alert == "dead" && b.value == 1),
            "{breaches:?}"
        );
    }
}

conformance! {
    fn the_age_budget_dead_letters_even_with_attempts_left(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        s.insert(&order(1, &[])).unwrap();
        let lease = s.claim("ship", 1).unwrap().pop().unwrap();
        clock.advance(31 * 60 * 1000);
        assert!(matches!(
            s.fail(&lease, Failure::Transient("slow".into())),
            Ok(FailOutcome::DeadLettered(_))
        ));
    }
}

conformance! {
    fn an_expired_lease_past_the_budget_is_dead_lettered_at_claim(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut spec = orders_spec();
        spec.retry.max_attempts = 2;
        s.declare_queue(&spec).unwrap();
        s.insert(&order(1, &[])).unwrap();
        for _ in 0..2 {
            let _ = s.claim("ship", 1).unwrap().pop().unwrap();
            clock.advance(spec.lease_ms + 1);
        }
        assert!(s.claim("ship", 1).unwrap().is_empty());
        let dead = s.queue_items("ship", Some(ItemState::Dead), 10).unwrap();
        assert_eq!(dead.len(), 1);
        assert!(
            dead[0]
                .describe()
                .contains("lease expired after 2 attempts")
        );
    }
}

conformance! {
    /// Found by tests/power_loss.rs: redriven and failed again in the same millisecond
    /// with the same reason, the second dead letter was the first one's fact, a duplicate
    /// that ended nothing, so the input stayed leased while `fail` said dead-lettered.
    fn an_input_failed_again_in_the_same_millisecond_after_a_redrive_is_dead_again(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        let a = order(1, &[]);
        s.insert(&a).unwrap();
        let mut entries = Vec::new();
        for _ in 0..3 {
            let lease = s.claim("ship", 1).unwrap().pop().unwrap();
            let out = s.fail(&lease, Failure::Permanent("bad address".into())).unwrap();
            let FailOutcome::DeadLettered(dl) = out else { panic!("{out:?}") };
            let st = s.queue_stats("ship").unwrap();
            assert_eq!((st.dead, st.leased), (1, 0), "{st:?}");
            let item = s.queue_item("ship", &a.hash()).unwrap().unwrap();
            assert_eq!(item.entry, Some(dl));
            entries.push(dl);
            s.redrive("ship", &dl).unwrap();
        }
        entries.dedup();
        assert_eq!(entries.len(), 3, "each dead letter is a fact of its own");
    }
}

conformance! {
    fn permanent_failure_dead_letters_now_and_redrive_gives_a_fresh_budget(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        let a = order(1, &[]);
        s.insert(&a).unwrap();
        let lease = s.claim("ship", 1).unwrap().pop().unwrap();
        let FailOutcome::DeadLettered(dl) = s
            .fail(&lease, Failure::Permanent("bad address".into()))
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(s.queue_stats("ship").unwrap().dead, 1);
        let redrive = s.redrive("ship", &dl).unwrap();
        assert_eq!(
            s.get(&redrive).unwrap().unwrap().type_name(),
            system::REDRIVE
        );
        let again = s.claim("ship", 1).unwrap().pop().unwrap();
        assert_eq!(again.attempt, 1, "fresh budget");
        // Redriving something that is not dead-lettered is a clear error.
        assert!(matches!(
            s.redrive("ship", &a.hash()),
            Err(Error::Queue { .. })
        ));
        let discard = s.discard("ship", &a.hash(), "customer left").unwrap();
        assert_eq!(
            s.get(&discard).unwrap().unwrap().type_name(),
            system::DISCARD
        );
        assert!(s.queue_items("ship", None, 10).unwrap().is_empty());
        assert_eq!(s.queue_stats("ship").unwrap().discarded, 1);
    }
}

conformance! {
    fn input_failing_field_requirements_is_poison_and_never_handed_out(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let mut s = store_with(b, &clock);
        let mut spec = orders_spec();
        spec.required_fields.push(FieldRequirement {
            name: "n".into(),
            kind: FieldKind::Integer,
        });
        s.declare_queue(&spec).unwrap();
        let bad = Fact::builder("Order").field("n", "seven").build().unwrap();
        let good = order(7, &[]);
        s.insert_batch(vec![bad.clone(), good.clone()]).unwrap();
        assert_eq!(claimed(&mut s, 10), vec![good.hash()]);
        let poison = s.queue_items("ship", Some(ItemState::Poison), 10).unwrap();
        assert_eq!(poison.len(), 1);
        assert_eq!(poison[0].input, bad.hash());
        assert!(poison[0].last_error.as_deref().unwrap().contains("\"n\""));
        assert_eq!(
            s.get(&poison[0].entry.unwrap())
                .unwrap()
                .unwrap()
                .type_name(),
            system::POISON
        );
        assert!(
            s.queue_check(Some("ship"))
                .unwrap()
                .iter()
                .any(|b| b.alert == "poison")
        );
        // A handler can declare poison too.
        let lease = s.claim("ship", 1).unwrap();
        assert!(lease.is_empty());
    }
}

conformance! {
    fn causal_release_blocks_descendants_only_and_dead_letters_say_so(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let mut s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        let a = order(1, &[]);
        let note = Fact::builder("Note")
            .predecessor("about", a.hash())
            .build()
            .unwrap();
        let b = order(2, &[note.hash()]); // a descendant of a through a non-input fact
        let c = order(3, &[]); // unrelated
        s.insert_batch(vec![b.clone(), note, a.clone(), c.clone()])
            .unwrap();
        let mut want = vec![a.hash(), c.hash()];
        want.sort();
        let leases = s.claim("ship", 10).unwrap();
        let mut got: Vec<_> = leases.iter().map(|l| l.input.hash()).collect();
        got.sort();
        assert_eq!(got, want, "b waits for a; c is unrelated");
        let la = leases
            .into_iter()
            .find(|l| l.input.hash() == a.hash())
            .unwrap();
        let FailOutcome::DeadLettered(_) = s.fail(&la, Failure::Permanent("no stock".into())).unwrap()
        else {
            panic!()
        };
        let info = s.queue_item("ship", &b.hash()).unwrap().unwrap();
        assert_eq!(info.state, ItemState::Blocked);
        assert_eq!(
            info.describe(),
            format!("blocked by {}, dead-lettered", a.hash())
        );
        s.redrive("ship", &a.hash()).unwrap();
        assert!(
            s.claim("ship", 10)
                .unwrap()
                .iter()
                .all(|l| l.input.hash() != b.hash())
        );
        clock.advance(60_000);
        let la = s
            .claim("ship", 10)
            .unwrap()
            .into_iter()
            .find(|l| l.input.hash() == a.hash())
            .unwrap();
        s.complete(&la, |w| w.insert(&shipped(&a)).map(|_| ()))
            .unwrap();
        assert_eq!(claimed(&mut s, 10), vec![b.hash()]);
    }
}

conformance! {
    fn unordered_queues_offer_descendants_at_once(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut spec = orders_spec();
        spec.ordering = Ordering::None;
        s.declare_queue(&spec).unwrap();
        let a = order(1, &[]);
        let b = order(2, &[a.hash()]);
        s.insert_batch(vec![a, b]).unwrap();
        assert_eq!(s.claim("ship", 10).unwrap().len(), 2);
    }
}

conformance! {
    fn declaring_a_queue_back_fills_only_unfinished_inputs(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let mut s = store_with(b, &clock);
        let done = order(1, &[]);
        let open = order(2, &[done.hash()]);
        let other = order(3, &[]);
        s.insert_batch(vec![
            done.clone(),
            open.clone(),
            other.clone(),
            shipped(&done),
        ])
        .unwrap();
        s.declare_queue(&orders_spec()).unwrap();
        let mut want = vec![open.hash(), other.hash()];
        want.sort();
        assert_eq!(claimed(&mut s, 10), want);
        // Re-declaring with a new policy keeps the leases.
        let mut spec = orders_spec();
        spec.lease_ms = 5_000;
        s.declare_queue(&spec).unwrap();
        assert_eq!(s.queue_stats("ship").unwrap().leased, 2);
    }
}

conformance! {
    fn inputs_released_from_the_held_set_are_queued(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let mut s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        let shop = Fact::builder("Shop").build().unwrap();
        let a = Fact::builder("Order")
            .predecessor("shop", shop.hash())
            .build()
            .unwrap();
        assert!(s.insert(&a).unwrap().is_held());
        assert!(s.claim("ship", 1).unwrap().is_empty());
        s.insert(&shop).unwrap();
        assert_eq!(claimed(&mut s, 1), vec![a.hash()]);
    }
}

conformance! {
    fn at_most_once_hands_an_input_out_once_even_if_the_handler_dies(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut spec = orders_spec();
        spec.semantics = Semantics::AtMostOnce;
        s.declare_queue(&spec).unwrap();
        let a = order(1, &[]);
        s.insert(&a).unwrap();
        let lease = s.claim("ship", 1).unwrap().pop().unwrap();
        assert_eq!(
            s.fail(&lease, Failure::Transient("x".into())).unwrap(),
            FailOutcome::Dropped
        );
        clock.advance(3_600_000);
        assert!(s.claim("ship", 1).unwrap().is_empty());
        assert_eq!(
            s.successors(&a.hash(), Some("input"), Some(system::DELIVERED))
                .unwrap()
                .len(),
            1
        );
    }
}

conformance! {
    /// An at-most-once input given back unstarted (a worker stopping) cannot be offered
    /// again; it is counted dropped, not lost without a trace.
    fn an_at_most_once_input_given_back_is_counted_dropped(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut spec = orders_spec();
        spec.semantics = Semantics::AtMostOnce;
        s.declare_queue(&spec).unwrap();
        s.insert_batch((1..=3).map(|i| order(i, &[])).collect()).unwrap();
        let mut leases = s.claim("ship", 3).unwrap();
        assert_eq!(leases.len(), 3);
        for lease in leases.drain(1..) {
            s.release(lease).unwrap();
        }
        let stats = s.queue_stats("ship").unwrap();
        assert_eq!(stats.dropped, 2, "{stats:?}");
        clock.advance(3_600_000);
        assert!(s.claim("ship", 3).unwrap().is_empty());
    }
}

conformance! {
    fn releasing_a_lease_does_not_count_the_attempt(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        s.insert(&order(1, &[])).unwrap();
        let lease = s.claim("ship", 1).unwrap().pop().unwrap();
        s.release(lease).unwrap();
        assert_eq!(s.claim("ship", 1).unwrap().pop().unwrap().attempt, 1);
    }
}

conformance! {
    fn the_oldest_ready_age_alert_fires(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        s.insert(&order(1, &[])).unwrap();
        assert!(s.queue_check(None).unwrap().is_empty());
        clock.advance(5 * 60 * 1000 + 1);
        let b = s.queue_check(None).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].alert, "ready-age");
    }
}

conformance! {
    fn completed_history_leaves_no_local_state(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        let orders: Vec<Fact> = (0..50).map(|i| order(i, &[])).collect();
        s.insert_batch(orders).unwrap();
        while let Some(l) = s.claim("ship", 1).unwrap().pop() {
            let done = shipped(&l.input);
            s.complete(&l, |w| w.insert(&done).map(|_| ())).unwrap();
        }
        assert!(s.queue_items("ship", None, 100).unwrap().is_empty());
        let st = s.queue_stats("ship").unwrap();
        assert_eq!((st.completed, st.completed_5m, st.failed_5m), (50, 50, 0));
        clock.advance(6 * 60 * 1000);
        assert_eq!(
            s.queue_stats("ship").unwrap().completed_5m,
            0,
            "rates cover five minutes"
        );
    }
}

conformance! {
    fn a_back_fill_counts_no_past_ending(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        s.insert_batch((0..3).map(|i| order(i, &[])).collect())
            .unwrap();
        for _ in 0..2 {
            let l = s.claim("ship", 1).unwrap().pop().unwrap();
            let done = shipped(&l.input);
            s.complete(&l, |w| w.insert(&done).map(|_| ())).unwrap();
        }
        let left = s.claim("ship", 1).unwrap().pop().unwrap();
        s.discard("ship", &left.input.hash(), "not wanted").unwrap();
        let counts = |s: &Store, name: &str| {
            let st = s.queue_stats(name).unwrap();
            (st.completed, st.completed_5m, st.discarded)
        };
        assert_eq!(counts(&s, "ship"), (2, 2, 1));
        // A new completion rule rebuilds the queue from the stored facts: the endings it
        // replays were counted when they happened.
        let mut spec = orders_spec();
        spec.completions.push(Completion {
            type_name: "Refunded".into(),
            role: "order".into(),
        });
        s.declare_queue(&spec).unwrap();
        assert_eq!(counts(&s, "ship"), (2, 2, 1));
        assert!(s.queue_items("ship", None, 10).unwrap().is_empty());
        // A queue declared over the same history counts from its declaration.
        let mut other = orders_spec();
        other.name = "audit".into();
        s.declare_queue(&other).unwrap();
        assert_eq!(counts(&s, "audit"), (0, 0, 0));
        assert_eq!(s.queue_stats("audit").unwrap().ready, 1);
        // What happens after a re-declaration is counted.
        s.insert(&shipped(&left.input)).unwrap();
        assert_eq!(counts(&s, "audit"), (1, 1, 0));
        assert_eq!(counts(&s, "ship"), (2, 2, 1));
    }
}

/// A random DAG of orders (inputs) and notes (not inputs).
fn dag() -> impl Strategy<Value = Vec<(bool, Vec<usize>)>> {
    (2usize..30).prop_flat_map(|n| {
        (0..n)
            .map(|i| {
                (
                    any::<bool>(),
                    proptest::collection::vec(0..i.max(1), if i == 0 { 0..1 } else { 0..3 }),
                )
            })
            .collect::<Vec<_>>()
    })
}

conformance! {
    /// With causal ordering, no input is ever handed out while an ancestor input of the
    /// same queue is unfinished, whatever fails, and everything ends completed or dead.
    /// The cases share one database, emptied before each.
    fn no_input_is_handed_out_before_an_unfinished_ancestor(b: Backend) {
        let db = b.db();
        proptest!(ProptestConfig::with_cases(40), |(shape in dag(), fails in proptest::collection::vec(0u8..4, 64))| {
            let clock = ManualClock::starting_at(T0);
            db.reset();
            let s = db.store_with(StoreOptions {
                clock: clock.clone(),
                ..StoreOptions::default()
            });
            let mut spec = orders_spec();
            spec.retry.max_attempts = 2;
            s.declare_queue(&spec).unwrap();
            let mut facts: Vec<Fact> = Vec::new();
            for (i, (is_order, preds)) in shape.iter().enumerate() {
                let mut b = Fact::builder(if *is_order { "Order" } else { "Note" }).field("i", i);
                for &p in preds { b = b.predecessor("after", facts[p].hash()); }
                facts.push(b.build().unwrap());
            }
            let mut delivery = facts.clone();
            delivery.reverse();
            s.insert_batch(delivery).unwrap();
            let mut finished = std::collections::HashSet::new();
            let mut k = 0;
            for _round in 0..200 {
                let leases = s.claim("ship", 3).unwrap();
                if leases.is_empty() {
                    clock.advance(10 * 60 * 1000);
                    if s.claim("ship", 1).map(|l| { let e = l.is_empty(); for x in l { s.release(x).unwrap(); } e }).unwrap() { break; }
                    continue;
                }
                for l in leases {
                    for anc in s.ancestors(&l.input.hash()).unwrap() {
                        let f = s.get(&anc).unwrap().unwrap();
                        prop_assert!(f.type_name() != "Order" || finished.contains(&anc), "{} handed out before ancestor {}", l.input.hash(), anc);
                    }
                    k += 1;
                    match fails[k % fails.len()] {
                        0 => { let _ = s.fail(&l, Failure::Transient("t".into())).unwrap(); }
                        _ => { let d = shipped(&l.input); s.complete(&l, |w| w.insert(&d).map(|_| ())).unwrap(); finished.insert(l.input.hash()); }
                    }
                }
            }
            let st = s.queue_stats("ship").unwrap();
            prop_assert_eq!(st.ready + st.leased + st.delayed, 0);
        });
    }
}

conformance! {
    fn a_batch_of_completions_commits_once_and_a_failing_one_leaves_nothing(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        let orders: Vec<Fact> = (0..5).map(|i| order(i, &[])).collect();
        s.insert_batch(orders.clone()).unwrap();
        let leases = s.claim("ship", 5).unwrap();
        let unknown_parent = Fact::builder("Lost").build().unwrap();
        let results = s
            .complete_batch(&leases, |w, lease| {
                if lease.input.field("n") == Some(&precedent::Value::Integer(2)) {
                    // Writes a held fact and a note, then fails: both must vanish.
                    let held = Fact::builder("Waiting")
                        .predecessor("p", unknown_parent.hash())
                        .build()?;
                    w.insert(&held)?;
                    w.insert(
                        &Fact::builder("Note")
                            .predecessor("order", lease.input.hash())
                            .build()?,
                    )?;
                    return Err(Error::InvalidFact {
                        reason: "handler gave up".into(),
                    });
                }
                w.insert(&shipped(&lease.input))?;
                Ok(())
            })
            .unwrap();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 4);
        let failed = leases
            .iter()
            .zip(&results)
            .find(|(_, r)| r.is_err())
            .unwrap()
            .0;
        assert_eq!(failed.input.field("n"), Some(&precedent::Value::Integer(2)));
        assert!(
            s.successors(&failed.input.hash(), None, None)
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            s.held_count().unwrap(),
            0,
            "the held fact of the failed handler is gone"
        );
        let st = s.queue_stats("ship").unwrap();
        assert_eq!((st.completed, st.leased), (4, 1));
        assert!(s.verify(|_| {}).unwrap().is_clean());
        // The failed lease is still live and can be completed on its own.
        s.complete(failed, |w| w.insert(&shipped(&failed.input)).map(|_| ()))
            .unwrap();
    }
}

/// Writes `input`'s completion in a savepoint and rolls it back.
fn complete_then_roll_back(w: &mut precedent::Writer<'_>, input: &Fact) {
    let inner: Result<(), Error> = w.savepoint(|w| {
        w.insert(&shipped(input))?;
        Err(Error::InvalidFact {
            reason: "changed its mind".into(),
        })
    });
    assert!(inner.is_err());
}

conformance! {
    fn a_completion_rolled_back_inside_the_handler_does_not_count(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        let input = order(1, &[]);
        s.insert(&input).unwrap();
        let [lease] = <[_; 1]>::try_from(s.claim("ship", 1).unwrap()).unwrap();
        // The handler writes the completion in a savepoint of its own that it rolls back: the
        // input is not done, so the completion must be refused and nothing counted.
        let result = s.complete(&lease, |w| {
            complete_then_roll_back(w, &input);
            Ok(())
        });
        assert!(
            matches!(result, Err(Error::NotCompleted { .. })),
            "{result:?}"
        );
        // The same through a plain write: a rolled-back completion leaves the counters alone.
        s.write(|w| {
            complete_then_roll_back(w, &input);
            Ok(())
        })
        .unwrap();
        let st = s.queue_stats("ship").unwrap();
        assert_eq!((st.completed, st.completed_5m, st.leased), (0, 0, 1));
        s.complete(&lease, |w| w.insert(&shipped(&input))).unwrap();
        let st = s.queue_stats("ship").unwrap();
        assert_eq!((st.completed, st.completed_5m, st.leased), (1, 1, 0));
    }
}

conformance! {
    fn a_batch_handler_that_completes_another_leases_input_makes_that_lease_lost(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        for n in 0..2 {
            s.insert(&order(n, &[])).unwrap();
        }
        let leases = s.claim("ship", 2).unwrap();
        let second = leases[1].input.clone();
        let mut ran = Vec::new();
        let results = s
            .complete_batch(&leases, |w, lease| {
                ran.push(lease.input.hash());
                w.insert(&shipped(&lease.input))?;
                w.insert(&shipped(&second))?;
                Ok(())
            })
            .unwrap();
        assert!(results[0].is_ok());
        assert!(
            matches!(results[1], Err(Error::LeaseLost { .. })),
            "{:?}",
            results[1]
        );
        assert_eq!(
            ran,
            vec![leases[0].input.hash()],
            "the lost lease's handler never ran"
        );
        assert_eq!(s.queue_stats("ship").unwrap().completed, 2);
    }
}

conformance! {
    /// A claim that finds nothing to hand out wakes no one waiting on the store: a waiter
    /// that claims and then waits (a remote worker's long-poll) sleeps until a commit
    /// that may bring it work, rather than being woken by its own empty claim, claiming
    /// again at once, and so on for as long as it waits.
    fn an_empty_claim_wakes_no_waiter(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&orders_spec()).unwrap();
        // On PostgreSQL the first wait starts the listener, which wakes once connected.
        if s.dialect() == precedent::store::Dialect::Postgres {
            let first = s.wake_mark();
            assert!(s.wait_for_wake(first, std::time::Duration::from_secs(10)));
        }
        let mark = s.wake_mark();
        assert!(s.claim("ship", 10).unwrap().is_empty());
        assert!(
            !s.wait_for_wake(mark, std::time::Duration::from_millis(300)),
            "woken by its own empty claim"
        );
        s.insert(&order(1, &[])).unwrap();
        assert!(s.wait_for_wake(mark, std::time::Duration::from_secs(10)));
        assert_eq!(s.claim("ship", 10).unwrap().len(), 1);
    }
}

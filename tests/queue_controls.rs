//! Queue controls (priorities, schedules, live-lease and rate limits, the depth alert,
//! counters) and the queue bugs users reported, each reproduced first. Both backends run
//! every test from one source; time is a ManualClock except in the concurrent test.

mod common;

use std::sync::{Arc, Barrier};

use precedent::clock::ManualClock;
use precedent::queue::{
    Completion, FailOutcome, Failure, FieldKind, FieldRequirement, ItemState, Ordering, QueueSpec,
    RateLimit, Semantics,
};
use precedent::{Error, Fact, FactHash, Store, StoreOptions};

use common::backend::Backend;

const T0: i64 = 1_800_000_000_000;

fn store_with(b: Backend, clock: &Arc<ManualClock>) -> Store {
    b.store_with(StoreOptions {
        clock: clock.clone(),
        ..StoreOptions::default()
    })
}

fn spec() -> QueueSpec {
    QueueSpec::new(
        "ship",
        "Order",
        vec![Completion {
            type_name: "Shipped".into(),
            role: "order".into(),
        }],
    )
}

fn order(n: i64) -> Fact {
    Fact::builder("Order").field("n", n).build().unwrap()
}

fn shipped(order: &Fact) -> Fact {
    Fact::builder("Shipped")
        .predecessor("order", order.hash())
        .build()
        .unwrap()
}

fn ship(s: &Store, lease: &precedent::queue::Lease) {
    s.complete(lease, |w| w.insert(&shipped(&lease.input)).map(|_| ()))
        .unwrap();
}

/// How many `precedent.Poison` facts the store holds.
fn poison_entries(s: &Store) -> u64 {
    s.stats()
        .unwrap()
        .per_type
        .get("precedent.Poison")
        .copied()
        .unwrap_or(0)
}

fn n_of(f: &Fact) -> i64 {
    match f.field("n") {
        Some(precedent::Value::Integer(n)) => *n as i64,
        other => panic!("no n: {other:?}"),
    }
}

conformance! {
    /// The report: "retry in 1227 ms" announced inside the age budget, then the input was
    /// dead-lettered at the next claim without that retry ever running.
    fn a_failure_inside_the_age_budget_is_retried_even_if_the_claim_comes_after_it(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut q = spec();
        q.retry.max_age_ms = 10_000;
        q.retry.backoff_base_ms = 5_000;
        q.retry.backoff_cap_ms = 5_000;
        s.declare_queue(&q).unwrap();
        s.insert(&order(1)).unwrap();
        let lease = s.claim("ship", 1).unwrap().pop().unwrap();
        clock.advance(9_000);
        let FailOutcome::Retry { at_ms } = s.fail(&lease, Failure::Transient("503".into())).unwrap()
        else {
            panic!("a failure inside the budget is retried")
        };
        // The retry comes after the budget's end: it still runs.
        clock.set(at_ms.max(T0 + 11_000));
        let again = s.claim("ship", 1).unwrap();
        assert_eq!(again.len(), 1, "the announced retry runs");
        assert_eq!(again[0].attempt, 2);
        assert!(s.queue_items("ship", Some(ItemState::Dead), 10).unwrap().is_empty());
        // Its failure, now outside the budget, dead-letters.
        assert!(matches!(
            s.fail(&again[0], Failure::Transient("503".into())),
            Ok(FailOutcome::DeadLettered(_))
        ));
    }
}

conformance! {
    fn an_expired_lease_past_the_age_budget_is_dead_lettered_at_claim(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut q = spec();
        q.retry.max_age_ms = 10_000;
        q.lease_ms = 20_000;
        s.declare_queue(&q).unwrap();
        s.insert(&order(1)).unwrap();
        let _ = s.claim("ship", 1).unwrap().pop().unwrap();
        clock.advance(20_001);
        assert!(s.claim("ship", 1).unwrap().is_empty());
        assert_eq!(s.queue_stats("ship").unwrap().dead, 1);
    }
}

conformance! {
    /// The report: an at-most-once input dropped after a failure counted as completed.
    fn an_at_most_once_input_dropped_after_a_failure_counts_as_dropped(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut q = spec();
        q.semantics = Semantics::AtMostOnce;
        s.declare_queue(&q).unwrap();
        s.insert_batch(vec![order(1), order(2)]).unwrap();
        let leases = s.claim("ship", 2).unwrap();
        assert_eq!(leases.len(), 2);
        assert_eq!(s.fail(&leases[0], Failure::Transient("boom".into())).unwrap(), FailOutcome::Dropped);
        s.complete(&leases[1], |_| Ok(())).unwrap();
        let st = s.queue_stats("ship").unwrap();
        assert_eq!((st.completed, st.dropped, st.failed), (1, 1, 1), "{st:?}");
        assert_eq!(st.completed_5m, 1);
    }
}

conformance! {
    /// The report: `stats` said ready 1 while `items` said leased, and `items --state
    /// ready` listed nothing.
    fn an_expired_lease_is_ready_in_stats_and_items_alike(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&spec()).unwrap();
        let a = order(1);
        s.insert(&a).unwrap();
        let _ = s.claim("ship", 1).unwrap().pop().unwrap();
        let st = s.queue_stats("ship").unwrap();
        assert_eq!((st.ready, st.leased), (0, 1));
        assert_eq!(s.queue_items("ship", None, 10).unwrap()[0].state, ItemState::Leased);
        clock.advance(spec().lease_ms + 1);
        let st = s.queue_stats("ship").unwrap();
        assert_eq!((st.ready, st.leased), (1, 0));
        assert_eq!(s.queue_items("ship", None, 10).unwrap()[0].state, ItemState::Ready);
        assert_eq!(s.queue_items("ship", Some(ItemState::Ready), 10).unwrap().len(), 1);
        assert!(s.queue_items("ship", Some(ItemState::Leased), 10).unwrap().is_empty());
        assert_eq!(s.queue_item("ship", &a.hash()).unwrap().unwrap().state, ItemState::Ready);
        // Claimed again, it counts as a redelivery.
        let again = s.claim("ship", 1).unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(s.queue_stats("ship").unwrap().redelivered, 1);
    }
}

conformance! {
    /// The report: an effect naming a missing predecessor was held and the input reported
    /// done, the effect invisible to reads.
    fn a_completion_whose_effect_names_a_missing_predecessor_is_refused(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        s.declare_queue(&spec()).unwrap();
        let a = order(1);
        s.insert(&a).unwrap();
        let lease = s.claim("ship", 1).unwrap().pop().unwrap();
        let absent = order(999).hash();
        let effect = Fact::builder("Effect")
            .predecessor("input", a.hash())
            .predecessor("other", absent)
            .build()
            .unwrap();
        let r = s.complete(&lease, |w| {
            w.insert(&shipped(&a))?;
            w.insert(&effect).map(|_| ())
        });
        let Err(Error::Queue { reason, .. }) = r else { panic!("{r:?}") };
        assert!(reason.contains("missing predecessor") && reason.contains(&absent.to_string()), "{reason}");
        assert!(s.held(10).unwrap().is_empty(), "nothing of it stored");
        assert!(s.get(&shipped(&a).hash()).unwrap().is_none());
        assert_eq!(s.queue_stats("ship").unwrap().leased, 1);
        // A successor written before its predecessor, both in the handler, is fine.
        let first = Fact::builder("Effect").field("k", 1).build().unwrap();
        let second = Fact::builder("Effect").predecessor("after", first.hash()).build().unwrap();
        s.complete(&lease, |w| {
            w.insert(&second)?;
            w.insert(&first)?;
            w.insert(&shipped(&a)).map(|_| ())
        })
        .unwrap();
        assert!(s.get(&second.hash()).unwrap().is_some());
    }
}

conformance! {
    /// The report: redriving an input that still lacks a required field handed it to the
    /// handler.
    fn redriving_an_input_still_missing_a_required_field_puts_it_back_on_poison(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut q = spec();
        q.required_fields.push(FieldRequirement { name: "address".into(), kind: FieldKind::Text });
        s.declare_queue(&q).unwrap();
        let a = order(1);
        s.insert(&a).unwrap();
        assert_eq!(s.queue_stats("ship").unwrap().poison, 1);
        s.redrive("ship", &a.hash()).unwrap();
        assert!(s.claim("ship", 1).unwrap().is_empty(), "handed to a handler");
        let poison = s.queue_items("ship", Some(ItemState::Poison), 10).unwrap();
        assert_eq!(poison.len(), 1);
        assert!(poison[0].describe().contains("address"), "{}", poison[0].describe());
        // Redriven again at the same instant: back on poison again.
        s.redrive("ship", &a.hash()).unwrap();
        assert_eq!(s.queue_stats("ship").unwrap().poison, 1);
    }
}

conformance! {
    fn a_queue_declared_from_now_takes_only_facts_stored_after(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let old = order(1);
        s.insert(&old).unwrap();
        s.declare_queue_from_now(&spec()).unwrap();
        assert_eq!(s.queue_stats("ship").unwrap().depth, 0);
        let new = order(2);
        s.insert(&new).unwrap();
        let got: Vec<FactHash> = s.claim("ship", 10).unwrap().iter().map(|l| l.input.hash()).collect();
        assert_eq!(got, vec![new.hash()]);
        // A policy change later keeps the limit, also when it rebuilds the index.
        let mut changed = spec();
        changed.ordering = Ordering::None;
        s.declare_queue(&changed).unwrap();
        assert_eq!(s.queue_stats("ship").unwrap().depth, 1);
    }
}

conformance! {
    fn counters_count_failures_retries_and_timeouts(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut q = spec();
        q.retry.backoff_base_ms = 0;
        q.retry.backoff_cap_ms = 0;
        q.retry.max_attempts = 3;
        s.declare_queue(&q).unwrap();
        s.insert(&order(1)).unwrap();
        let l = s.claim("ship", 1).unwrap().pop().unwrap();
        assert!(matches!(s.fail(&l, Failure::TimedOut { reason: "timed out after 1s".into() }), Ok(FailOutcome::Retry { .. })));
        let l = s.claim("ship", 1).unwrap().pop().unwrap();
        s.fail(&l, Failure::Transient("503".into())).unwrap();
        let l = s.claim("ship", 1).unwrap().pop().unwrap();
        assert!(matches!(s.fail(&l, Failure::TimedOut { reason: "again".into() }), Ok(FailOutcome::DeadLettered(_))));
        let st = s.queue_stats("ship").unwrap();
        assert_eq!((st.failed, st.retried, st.timed_out, st.redelivered), (3, 2, 2, 0), "{st:?}");
    }
}

conformance! {
    fn the_depth_alert_fires_over_its_threshold(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut q = spec();
        q.alerts.max_depth = Some(2);
        s.declare_queue(&q).unwrap();
        s.insert_batch(vec![order(1), order(2)]).unwrap();
        assert!(s.queue_check(None).unwrap().iter().all(|b| b.alert != "depth"));
        s.insert(&order(3)).unwrap();
        let breaches = s.queue_check(None).unwrap();
        let depth = breaches.iter().find(|b| b.alert == "depth").expect("a depth breach");
        assert_eq!((depth.value, depth.threshold), (3, 2));
        assert_eq!(s.queue_stats("ship").unwrap().depth_alert, Some(2));
    }
}

conformance! {
    fn higher_priority_inputs_are_handed_out_first_within_causal_order(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut q = spec();
        q.priority_field = Some("p".into());
        s.declare_queue(&q).unwrap();
        let with = |n: i64, p: Option<i64>, after: Option<&Fact>| {
            let mut f = Fact::builder("Order").field("n", n);
            if let Some(p) = p { f = f.field("p", p); }
            if let Some(a) = after { f = f.predecessor("after", a.hash()); }
            f.build().unwrap()
        };
        let low = with(1, Some(1), None);
        // A high-priority input behind a low one waits for it: causal order comes first.
        let behind = with(2, Some(100), Some(&low));
        s.insert_batch(vec![low.clone(), behind, with(3, Some(5), None), with(4, None, None), with(5, Some(-2), None)]).unwrap();
        let mut order_seen = Vec::new();
        while let Some(l) = s.claim("ship", 1).unwrap().pop() {
            order_seen.push(n_of(&l.input));
            ship(&s, &l);
        }
        assert_eq!(order_seen, vec![3, 1, 2, 4, 5]);
        // A priority that is not an integer is poison.
        s.insert(&Fact::builder("Order").field("n", 9).field("p", "high").build().unwrap()).unwrap();
        assert_eq!(s.queue_stats("ship").unwrap().poison, 1);
    }
}

conformance! {
    fn scheduled_inputs_wait_for_their_not_before_time(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut q = spec();
        q.not_before_field = Some("at".into());
        s.declare_queue(&q).unwrap();
        // T0 is 2027-01-15T08:00:00Z.
        let text = Fact::builder("Order").field("n", 1).field("at", "2027-01-15T08:01:00Z").build().unwrap();
        let ms = Fact::builder("Order").field("n", 2).field("at", T0 + 120_000).build().unwrap();
        // Scheduled behind an unfinished ancestor: unblocked, it still waits for its time.
        let blocked = Fact::builder("Order").field("n", 3).field("at", T0 + 180_000)
            .predecessor("after", ms.hash()).build().unwrap();
        s.insert_batch(vec![text, ms, blocked, order(4)]).unwrap();
        let now = s.claim("ship", 10).unwrap();
        assert_eq!(now.iter().map(|l| n_of(&l.input)).collect::<Vec<_>>(), vec![4]);
        ship(&s, &now[0]);
        assert_eq!(s.queue_stats("ship").unwrap().delayed, 2);
        clock.set(T0 + 60_000);
        let l = s.claim("ship", 10).unwrap();
        assert_eq!(l.iter().map(|l| n_of(&l.input)).collect::<Vec<_>>(), vec![1]);
        ship(&s, &l[0]);
        clock.set(T0 + 120_000);
        let l = s.claim("ship", 10).unwrap().pop().unwrap();
        assert_eq!(n_of(&l.input), 2);
        ship(&s, &l);
        assert!(s.claim("ship", 10).unwrap().is_empty(), "unblocked before its time");
        clock.set(T0 + 180_000);
        assert_eq!(s.claim("ship", 10).unwrap().len(), 1);
        // A time that does not parse is poison, with the reason.
        s.insert(&Fact::builder("Order").field("n", 5).field("at", "tomorrow").build().unwrap()).unwrap();
        let poison = s.queue_items("ship", Some(ItemState::Poison), 10).unwrap();
        assert!(poison[0].describe().contains("RFC 3339"), "{}", poison[0].describe());
    }
}

conformance! {
    fn the_rate_limit_hands_out_at_most_n_per_window_across_stores(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let db = b.db();
        let options = || StoreOptions { clock: clock.clone(), ..StoreOptions::default() };
        let (s1, s2) = (db.store_with(options()), db.store_with(options()));
        let mut q = spec();
        q.rate = Some(RateLimit { count: 3, per_ms: 1000 });
        s1.declare_queue(&q).unwrap();
        s1.insert_batch((0..10).map(order).collect()).unwrap();
        assert_eq!(s1.claim("ship", 2).unwrap().len(), 2);
        assert_eq!(s2.claim("ship", 5).unwrap().len(), 1);
        assert!(s1.claim("ship", 5).unwrap().is_empty());
        clock.advance(1000);
        assert_eq!(s2.claim("ship", 5).unwrap().len(), 3);
    }
}

conformance! {
    /// Two processes whose clocks disagree by less than a window (one has entered the
    /// next window, the other not yet) share the window the faster one charged: the
    /// slower one does not start the count again at zero (and so let each hand out a full
    /// quota every time they took turns). A clock more than a window ahead is taken as
    /// wrong, not as skew: the others keep their own windows.
    fn clocks_a_little_apart_share_one_rate_window(b: Backend) {
        let (ahead, behind) = (ManualClock::starting_at(T0 + 1000), ManualClock::starting_at(T0 + 600));
        let db = b.db();
        let with = |c: &Arc<ManualClock>| db.store_with(StoreOptions { clock: c.clone(), ..StoreOptions::default() });
        let (fast, slow) = (with(&ahead), with(&behind));
        let mut q = spec();
        q.rate = Some(RateLimit { count: 2, per_ms: 1000 });
        slow.declare_queue(&q).unwrap();
        // Inserted by the slow clock: claimable by both.
        slow.insert_batch((0..20).map(order).collect()).unwrap();
        // The fast clock is in window T0 + 1000, the slow one still in T0.
        assert_eq!(fast.claim("ship", 5).unwrap().len(), 2);
        assert!(slow.claim("ship", 5).unwrap().is_empty(), "the window the fast clock charged");
        assert!(fast.claim("ship", 5).unwrap().is_empty(), "its own window, still charged");
        // A second on: the slow clock is in the window the fast one charged, the fast one
        // in the next, which it charges; the slow one then counts in that.
        behind.advance(1000);
        ahead.advance(1000);
        assert!(slow.claim("ship", 5).unwrap().is_empty());
        assert_eq!(fast.claim("ship", 5).unwrap().len(), 2);
        assert!(slow.claim("ship", 5).unwrap().is_empty());
        // A clock an hour ahead is not followed: the slow one keeps its own windows.
        let far = ManualClock::starting_at(T0 + 3_600_000);
        assert_eq!(with(&far).claim("ship", 5).unwrap().len(), 2);
        assert_eq!(slow.claim("ship", 5).unwrap().len(), 2);
    }
}

conformance! {
    /// Claims from several stores at once (threads, each its own connection) never give
    /// out more live leases than the limit: on PostgreSQL they race for real.
    fn concurrent_claims_never_exceed_max_leased(b: Backend) {
        const WORKERS: usize = 4;
        const MAX: u64 = 3;
        let db = b.db();
        let first = db.store();
        let mut q = spec();
        q.max_leased = Some(MAX);
        q.ordering = Ordering::None;
        first.declare_queue(&q).unwrap();
        first.insert_batch((0..200).map(order).collect()).unwrap();
        let stores: Vec<Store> = (0..WORKERS).map(|_| db.store()).collect();
        for round in 0..12 {
            let barrier = Barrier::new(WORKERS);
            let taken: Vec<Vec<precedent::queue::Lease>> = std::thread::scope(|scope| {
                let handles: Vec<_> = stores
                    .iter()
                    .map(|s| {
                        let barrier = &barrier;
                        scope.spawn(move || {
                            barrier.wait();
                            s.claim("ship", 2).unwrap()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let total: usize = taken.iter().map(Vec::len).sum();
            assert!(total as u64 <= MAX, "round {round}: {total} live leases, limit {MAX}");
            assert_eq!(first.queue_stats("ship").unwrap().leased as usize, total);
            for l in taken.iter().flatten() {
                ship(&first, l);
            }
        }
    }
}

conformance! {
    fn max_leased_is_refused_on_an_at_most_once_queue(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut q = spec();
        q.semantics = Semantics::AtMostOnce;
        q.max_leased = Some(1);
        // Its inputs end when they are handed out: a limit on live leases would count
        // none, and let any number of handlers run at once.
        let err = s.declare_queue(&q).unwrap_err();
        assert!(
            matches!(&err, Error::Queue { reason, .. } if reason.contains("at-most-once")),
            "{err:?}"
        );
        assert!(matches!(
            s.queue_stats("ship"),
            Err(Error::UnknownQueue { .. })
        ));
        // A rate limit paces it, and an at-least-once queue takes the limit.
        q.max_leased = None;
        q.rate = Some(RateLimit { count: 1, per_ms: 1000 });
        s.declare_queue(&q).unwrap();
        s.insert_batch(vec![order(1), order(2)]).unwrap();
        assert_eq!(s.claim("ship", 2).unwrap().len(), 1);
        let mut q = spec();
        q.name = "limited".into();
        q.max_leased = Some(1);
        s.declare_queue(&q).unwrap();
    }
}

conformance! {
    /// An expired lease no longer counts as live, so a claim may hand out its place: its
    /// worker's late heartbeat must not bring it back over `max_leased`. While the limit
    /// has room, or before the lease expires, the heartbeat extends it as ever.
    fn extending_an_expired_lease_keeps_max_leased(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut q = spec();
        q.max_leased = Some(1);
        q.lease_ms = 1_000;
        q.ordering = Ordering::None;
        s.declare_queue(&q).unwrap();
        s.insert_batch(vec![order(1), order(2)]).unwrap();
        let first = s.claim("ship", 1).unwrap().pop().unwrap();
        // Live: extended.
        clock.advance(500);
        let first = s.extend(&first).unwrap();
        assert_eq!(first.expires_at_ms, T0 + 1_500);
        // Expired, and its place handed to another input.
        clock.advance(1_500);
        let second = s.claim("ship", 1).unwrap().pop().unwrap();
        assert_ne!(second.input.hash(), first.input.hash());
        let err = s.extend(&first).unwrap_err();
        assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
        assert_eq!(s.queue_stats("ship").unwrap().leased, 1);
        // Expired with room left: extended.
        ship(&s, &second);
        let again = s.extend(&first).unwrap();
        assert_eq!(again.expires_at_ms, T0 + 3_000);
        assert_eq!(s.queue_stats("ship").unwrap().leased, 1);
        ship(&s, &again);
    }
}

conformance! {
    /// A re-declaration that rebuilds the queue's index replays the stored facts and
    /// judges again only the inputs still open: one poisoned (and discarded) before gets
    /// no second poison entry, while one that the new requirements refuse, and that
    /// nothing ended, gets one, once.
    fn a_rebuilding_declaration_poisons_only_open_inputs_and_once(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut q = spec();
        q.required_fields.push(FieldRequirement { name: "address".into(), kind: FieldKind::Text });
        s.declare_queue(&q).unwrap();
        let unfit = order(1);
        s.insert(&unfit).unwrap();
        assert_eq!(poison_entries(&s), 1);
        s.discard("ship", &unfit.hash(), "no address").unwrap();
        // Fit under these rules: no requirement on `gift`.
        let open = Fact::builder("Order").field("n", 2).field("address", "x").build().unwrap();
        s.insert(&open).unwrap();
        clock.advance(1);
        // Rebuilt (another completion), with a requirement the open input fails.
        let mut q2 = q.clone();
        q2.completions.push(Completion { type_name: "Cancelled".into(), role: "order".into() });
        q2.required_fields.push(FieldRequirement { name: "gift".into(), kind: FieldKind::Text });
        s.declare_queue(&q2).unwrap();
        assert_eq!(poison_entries(&s), 2, "the open input poisoned, the discarded one not again");
        let stats = s.queue_stats("ship").unwrap();
        assert_eq!((stats.poison, stats.ready), (1, 0));
        // Rebuilt again: both ended by what it replays.
        clock.advance(1);
        let mut q3 = q2.clone();
        q3.completions.pop();
        s.declare_queue(&q3).unwrap();
        assert_eq!(poison_entries(&s), 2, "no entry is written twice");
        assert_eq!(s.queue_stats("ship").unwrap().poison, 1);
    }
}

conformance! {
    /// A re-declaration that rebuilds the queue's index keeps what is in flight: a live
    /// lease still holds (its worker extends and completes it, and no claim hands its
    /// input out again), and a retried input keeps its attempts and its backoff.
    fn a_rebuilding_declaration_keeps_leases_and_retries(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut q = spec();
        q.lease_ms = 10_000;
        q.ordering = Ordering::None;
        s.declare_queue(&q).unwrap();
        let (o1, o2, o3) = (order(1), order(2), order(3));
        s.insert_batch(vec![o1.clone(), o2.clone(), o3.clone()]).unwrap();
        let claimed = s.claim("ship", 2).unwrap();
        let held = claimed.iter().find(|l| l.input.hash() == o1.hash()).unwrap().clone();
        let retried = claimed.iter().find(|l| l.input.hash() == o2.hash()).unwrap().clone();
        let FailOutcome::Retry { at_ms } =
            s.fail(&retried, Failure::Transient("503".into())).unwrap()
        else {
            panic!("a transient failure is retried")
        };
        clock.advance(1);
        let mut q2 = q.clone();
        q2.completions.push(Completion { type_name: "Cancelled".into(), role: "order".into() });
        s.declare_queue(&q2).unwrap();
        let stats = s.queue_stats("ship").unwrap();
        assert_eq!(stats.leased, 1, "the lease still counts");
        // Only the third order is handed out: the first is leased, the second backs off.
        let now = s.claim("ship", 5).unwrap();
        assert_eq!(now.len(), 1);
        assert_eq!(now[0].input.hash(), o3.hash());
        let held = s.extend(&held).unwrap();
        ship(&s, &held);
        ship(&s, &now[0]);
        // The second after its backoff, on its second attempt.
        clock.set(at_ms);
        let again = s.claim("ship", 5).unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].input.hash(), o2.hash());
        assert_eq!(again[0].attempt, 2);
    }
}

conformance! {
    /// A redrive that reopens nothing (its entry is no longer the input's current one: a
    /// redrive sent twice, by two operators or two nodes) asks for no poison entry, even
    /// when the input still fails the queue's requirements.
    fn a_redrive_of_a_stale_entry_writes_no_poison_entry(b: Backend) {
        let clock = ManualClock::starting_at(T0);
        let s = store_with(b, &clock);
        let mut q = spec();
        q.required_fields.push(FieldRequirement { name: "address".into(), kind: FieldKind::Text });
        s.declare_queue(&q).unwrap();
        let unfit = order(1);
        s.insert(&unfit).unwrap();
        assert_eq!(poison_entries(&s), 1);
        let first_entry = s.queue_item("ship", &unfit.hash()).unwrap().unwrap().entry.unwrap();
        clock.advance(1);
        // Redriven, still unfit: poisoned again, a second entry naming the redrive.
        s.redrive("ship", &unfit.hash()).unwrap();
        assert_eq!(poison_entries(&s), 2);
        // The same first entry redriven again, as another node would have.
        clock.advance(1);
        let stale = Fact::builder("precedent.Redrive")
            .field("queue", "ship")
            .field("at", T0 + 2)
            .predecessor("entry", first_entry)
            .build()
            .unwrap();
        s.insert(&stale).unwrap();
        assert_eq!(poison_entries(&s), 2, "no entry for a redrive that reopened nothing");
        assert_eq!(s.queue_stats("ship").unwrap().poison, 1);
    }
}

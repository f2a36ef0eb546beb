//! Typed queues: a queue declared from fact types hands out decoded inputs and stores the
//! completion its handler returns, with the handler's rows, in one transaction. Time is a
//! ManualClock: no test sleeps.

use std::sync::Arc;

use precedent::clock::ManualClock;
use precedent::query::{FactType, Ref};
use precedent::queue::{FailOutcome, Failure, ItemState, QueueHandle, system};
use precedent::store::SqlExt;
use precedent::{Error, Fact, Store, StoreOptions, args};
use serde::{Deserialize, Serialize};

const T0: i64 = 1_800_000_000_000;

#[derive(Serialize, Deserialize, FactType, Debug, Clone, PartialEq)]
#[fact(type = "Shop.Order")]
struct Order {
    id: u64,
}

#[derive(Serialize, Deserialize, FactType, Debug, Clone, PartialEq)]
#[fact(type = "Shop.Shipment")]
struct Shipment {
    order: Ref<Order>,
    carrier: String,
}

fn store_with(clock: &Arc<ManualClock>) -> Store {
    Store::open_in_memory_with(StoreOptions {
        clock: clock.clone(),
        ..StoreOptions::default()
    })
    .unwrap()
}

/// A store with the `ship` queue declared and the application's own `shipped` table.
fn shop() -> (Arc<ManualClock>, Store, QueueHandle<Order, Shipment>) {
    let clock = ManualClock::starting_at(T0);
    let store = store_with(&clock);
    let ship = store
        .declare_typed_queue::<Order, Shipment>("ship", "order")
        .unwrap();
    store
        .write(|w| {
            w.sql()
                .batch("CREATE TABLE shipped (order_id INTEGER PRIMARY KEY, carrier TEXT)")
        })
        .unwrap();
    (clock, store, ship)
}

fn shipped_rows(store: &Store) -> Vec<(i64, String)> {
    store
        .write(|w| {
            w.sql().query_vec(
                "SELECT order_id, carrier FROM shipped ORDER BY order_id",
                args![],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .unwrap()
}

fn shipments_of(store: &Store, order: Ref<Order>) -> usize {
    store
        .successors(&order.hash(), Some("order"), Some(Shipment::TYPE))
        .unwrap()
        .len()
}

/// The handler of a shop: one row in its own table, and the shipment.
fn ship_it(
    w: &mut precedent::Writer<'_>,
    order: &Order,
    input: Ref<Order>,
) -> precedent::Result<Shipment> {
    w.sql().execute(
        "INSERT INTO shipped (order_id, carrier) VALUES (?1, ?2)",
        args![order.id as i64, "post"],
    )?;
    Ok(Shipment {
        order: input,
        carrier: "post".into(),
    })
}

#[test]
fn a_claimed_order_is_shipped_with_its_row_in_one_commit() {
    let (_clock, store, ship) = shop();
    let order = store.save(&Order { id: 7 }).unwrap();
    let leases = ship.claim(&store, 10).unwrap();
    assert_eq!(leases.len(), 1);
    let lease = &leases[0];
    assert_eq!(lease.input(), &Order { id: 7 });
    assert_eq!(lease.input_ref(), order);
    assert_eq!(lease.attempt, 1, "the typed lease derefs to the lease");
    let done = ship
        .complete(&store, lease, |w, o| ship_it(w, o, lease.input_ref()))
        .unwrap();
    assert_eq!(
        store.load(done).unwrap(),
        Shipment {
            order,
            carrier: "post".into()
        }
    );
    assert_eq!(shipped_rows(&store), vec![(7, "post".to_string())]);
    assert_eq!(shipments_of(&store, order), 1);
    assert_eq!(store.queue_stats("ship").unwrap().completed, 1);
    assert!(ship.claim(&store, 10).unwrap().is_empty());
}

#[test]
fn a_failing_handler_leaves_nothing_and_the_order_comes_back_after_the_lease() {
    let (clock, store, ship) = shop();
    let order = store.save(&Order { id: 7 }).unwrap();
    let lease = ship.claim(&store, 1).unwrap().pop().unwrap();
    let r = ship.complete(&store, &lease, |w, o| {
        ship_it(w, o, lease.input_ref())?;
        Err(Error::InvalidFact {
            reason: "carrier down".into(),
        })
    });
    assert!(matches!(r, Err(Error::InvalidFact { ref reason }) if reason == "carrier down"));
    assert!(
        shipped_rows(&store).is_empty(),
        "the handler's row is undone"
    );
    assert_eq!(shipments_of(&store, order), 0);
    // Still leased: nobody else gets it until the lease runs out.
    assert!(ship.claim(&store, 1).unwrap().is_empty());
    clock.advance(store.queue("ship").unwrap().lease_ms);
    let again = ship.claim(&store, 1).unwrap().pop().unwrap();
    assert_eq!((again.input_ref(), again.attempt), (order, 2));
    // The first lease is gone: completing under it is refused, and writes nothing.
    let stale = ship.complete(&store, &lease, |w, o| ship_it(w, o, lease.input_ref()));
    assert!(matches!(stale, Err(Error::LeaseLost { .. })));
    assert!(shipped_rows(&store).is_empty());
    ship.complete(&store, &again, |w, o| ship_it(w, o, again.input_ref()))
        .unwrap();
    assert_eq!(shipped_rows(&store), vec![(7, "post".to_string())]);
}

#[test]
fn a_shipment_of_another_order_does_not_complete_this_one() {
    let (_clock, store, ship) = shop();
    let first = store.save(&Order { id: 1 }).unwrap();
    let second = store.save(&Order { id: 2 }).unwrap();
    let lease = ship
        .claim(&store, 2)
        .unwrap()
        .into_iter()
        .find(|l| l.input_ref() == first)
        .unwrap();
    let r = ship.complete(&store, &lease, |w, o| ship_it(w, o, second));
    assert!(matches!(r, Err(Error::NotCompleted { input, .. }) if input == first.hash()));
    assert!(shipped_rows(&store).is_empty());
    assert_eq!(shipments_of(&store, second), 0);
    assert_eq!(store.queue_stats("ship").unwrap().completed, 0);
}

#[test]
fn a_completion_role_that_is_not_a_role_of_the_completion_type_is_refused() {
    let store = Store::open_in_memory().unwrap();
    let r = store.declare_typed_queue::<Order, Shipment>("ship", "input");
    let Err(Error::Queue { queue, reason }) = r else {
        panic!("expected a queue error, got {r:?}");
    };
    assert_eq!(queue, "ship");
    assert!(
        reason.contains("\"input\"") && reason.contains("order"),
        "{reason}"
    );
    assert!(store.queues().unwrap().is_empty(), "nothing was declared");

    // A spec of other types than the handle's is refused the same way.
    let mut spec = QueueHandle::<Order, Shipment>::spec("ship", "order");
    spec.input_type = "Shop.Refund".into();
    let r = store.declare_typed::<Order, Shipment>(&spec);
    assert!(matches!(r, Err(Error::Queue { ref reason, .. }) if reason.contains("Shop.Refund")));
    let mut spec = QueueHandle::<Order, Shipment>::spec("ship", "order");
    spec.completions[0].type_name = "Shop.Cancelled".into();
    let r = store.declare_typed::<Order, Shipment>(&spec);
    assert!(matches!(r, Err(Error::Queue { ref reason, .. }) if reason.contains("Shop.Shipment")));
    assert!(store.queues().unwrap().is_empty());
}

#[test]
fn an_order_that_does_not_decode_is_poison_and_never_handed_out() {
    let (_clock, store, ship) = shop();
    // Of the queue's input type, but `id` is text: it cannot be an `Order`.
    let bad = Fact::builder(Order::TYPE)
        .field("id", "seven")
        .build()
        .unwrap();
    store.insert(&bad).unwrap();
    let good = store.save(&Order { id: 8 }).unwrap();
    let leases = ship.claim(&store, 10).unwrap();
    let claimed: Vec<Ref<Order>> = leases.iter().map(|l| l.input_ref()).collect();
    assert_eq!(claimed, vec![good], "the bad order is not returned");
    let item = store.queue_item("ship", &bad.hash()).unwrap().unwrap();
    assert_eq!(item.state, ItemState::Poison);
    let why = item.last_error.unwrap();
    assert!(
        why.contains("Shop.Order"),
        "the decode error is the reason: {why}"
    );
    let poison = store
        .successors(&bad.hash(), Some(system::INPUT_ROLE), Some(system::POISON))
        .unwrap();
    assert_eq!(poison.len(), 1);
    assert_eq!(store.queue_stats("ship").unwrap().poison, 1);
}

#[test]
fn a_typed_lease_is_failed_extended_and_released_through_the_untyped_api() {
    let (clock, store, ship) = shop();
    store.save(&Order { id: 7 }).unwrap();
    let lease = ship.claim(&store, 1).unwrap().pop().unwrap();
    clock.advance(1000);
    let longer = store.extend(&lease).unwrap();
    assert_eq!(longer.expires_at_ms, lease.expires_at_ms + 1000);
    let outcome = store
        .fail(&lease, Failure::Transient("later".into()))
        .unwrap();
    assert!(matches!(outcome, FailOutcome::Retry { .. }));
    let FailOutcome::Retry { at_ms } = outcome else {
        unreachable!()
    };
    clock.set(at_ms);
    let lease = ship.claim(&store, 1).unwrap().pop().unwrap();
    assert_eq!(lease.attempt, 2);
    let (untyped, order) = lease.into_parts();
    assert_eq!(order, Order { id: 7 });
    store.release(untyped).unwrap();
    assert_eq!(ship.claim(&store, 1).unwrap().pop().unwrap().attempt, 2);
}

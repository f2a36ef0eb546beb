//! The demo's second part: the store is the queue. Orders are pending work of queue
//! `ship`; a handler ships one (its effect and the completing fact in one transaction),
//! another fails, is retried and dead-lettered; a watch reports each change.

use std::time::Duration;

use precedent::query::{Change, Watch};
use precedent::queue::{Completion, FailOutcome, Failure, QueueSpec, RetryPolicy};
use precedent::{Fact, FactHash, Store, args};

/// The queue the demo declares.
pub const QUEUE: &str = "ship";

/// The shop's open orders: neither shipped nor cancelled.
pub const OPEN_ORDERS: &str = "given s: Shop
    match o: Shop.Order where o->shop = s
      and not exists (match sh: Shop.Shipment where sh->order = o)
      and not exists (match c: Shop.Order.Cancelled where c->order = o)
    select o.number";

/// The facts of this part, built from the first part's shop and customers, so that their
/// hashes are the same in every demo database.
pub struct Orders {
    /// Orders #4, #5 and #6, each with its one item.
    pub orders: Vec<(Fact, Fact)>,
    /// The shipment that completes order #4.
    pub shipment: Fact,
}

/// Orders #4 (Grace), #5 (Linus), #6 (Ada), and the shipment of #4.
pub fn orders(shop: FactHash, customers: [FactHash; 3]) -> precedent::Result<Orders> {
    let lines = [
        (4, customers[1], "BK-401", "The Little Schemer", 2700),
        (
            5,
            customers[2],
            "BK-501",
            "Types and Programming Languages",
            7400,
        ),
        (6, customers[0], "BK-601", "Elements of Programming", 3900),
    ];
    let mut orders = Vec::new();
    for (number, customer, sku, title, cents) in lines {
        let order = Fact::builder("Shop.Order")
            .field("number", number as u64)
            .predecessor("shop", shop)
            .predecessor("customer", customer)
            .build()?;
        let item = Fact::builder("Shop.Order.Item")
            .field("sku", sku)
            .field("title", title)
            .field("quantity", 1u64)
            .field("price_cents", cents as u64)
            .predecessor("order", order.hash())
            .build()?;
        orders.push((order, item));
    }
    let shipment = Fact::builder("Shop.Shipment")
        .field("carrier", "parcel post")
        .field("tracking", "PP-1004")
        .predecessor("order", orders[0].0.hash())
        .predecessor("items", orders[0].1.hash())
        .build()?;
    Ok(Orders { orders, shipment })
}

/// The queue `ship`: an order is done once a shipment or a cancellation names it. Two
/// attempts and a 20 ms backoff keep the demo short.
fn spec() -> QueueSpec {
    let done_by = |t: &str| Completion {
        type_name: t.into(),
        role: "order".into(),
    };
    let mut spec = QueueSpec::new(
        QUEUE,
        "Shop.Order",
        vec![done_by("Shop.Shipment"), done_by("Shop.Order.Cancelled")],
    );
    spec.retry = RetryPolicy {
        max_attempts: 2,
        backoff_base_ms: 20,
        backoff_cap_ms: 20,
        ..spec.retry
    };
    spec
}

/// Runs the second part on `store`.
pub fn run(store: &Store, shop: FactHash, o: &Orders) -> anyhow::Result<()> {
    say!("The store is also the work queue. Queue `ship` takes every Shop.Order and counts");
    say!("it done once a Shop.Shipment or a Shop.Order.Cancelled names it: orders #1 to #3");
    say!("are done already. A watch follows the query of the shop's open orders.");
    store.declare_queue(&spec())?;
    store.write(|w| {
        w.sql().batch(
            "CREATE TABLE IF NOT EXISTS shipping_label (
                 order_number INTEGER PRIMARY KEY, tracking TEXT NOT NULL)",
        )
    })?;
    let mut watch = store.prepare(OPEN_ORDERS)?.given("s", shop)?.watch()?;
    say!("  watch: {} open orders", watch.results().len());

    let [(o4, i4), (o5, i5), (o6, i6)] = &o.orders[..] else {
        unreachable!("three orders")
    };
    store.insert_batch(vec![o4.clone(), i4.clone(), o5.clone(), i5.clone()])?;
    say!("  <- orders #4 (Grace) and #5 (Linus) arrive: pending work, nothing else to do");
    report(store, &mut watch)?;

    let mut retry_at = None;
    for lease in &store.claim(QUEUE, 2)? {
        if lease.input.hash() == o4.hash() {
            store.complete(lease, |w| {
                w.sql().execute(
                    // `ON CONFLICT`, which SQLite and PostgreSQL both take.
                    "INSERT INTO shipping_label (order_number, tracking) VALUES (4, 'PP-1004')
                     ON CONFLICT DO NOTHING",
                    args![],
                )?;
                w.insert(&o.shipment)
            })?;
            say!("  handler ships #4: a shipping_label row and Shipment PP-1004, one transaction");
        } else if let FailOutcome::Retry { at_ms } =
            store.fail(lease, Failure::Transient("carrier timeout".into()))?
        {
            say!("  handler fails #5 (carrier timeout, attempt 1 of 2): it will be retried");
            retry_at = Some(at_ms);
        }
    }
    report(store, &mut watch)?;
    if let Some(at_ms) = retry_at {
        let lease = claim_at(store, at_ms)?;
        let outcome = store.fail(&lease, Failure::Transient("carrier timeout".into()))?;
        if let FailOutcome::DeadLettered(entry) = outcome {
            say!(
                "  handler fails #5 again: out of attempts, dead letter {} (`precedent dlq`)",
                entry.short(8)
            );
        }
    }
    store.insert_batch(vec![o6.clone(), i6.clone()])?;
    say!("  <- order #6 (Ada) arrives, and waits for a worker");
    report(store, &mut watch)?;
    Ok(())
}

/// Claims the one input that becomes ready again at `at_ms`, waiting for it (the backoff
/// is at most 20 ms; a second is allowed for a slow machine).
fn claim_at(store: &Store, at_ms: i64) -> anyhow::Result<precedent::queue::Lease> {
    let now = store.options().clock.now_ms();
    std::thread::sleep(Duration::from_millis((at_ms - now).max(0) as u64 + 1));
    for _ in 0..200 {
        if let Some(lease) = store.claim(QUEUE, 1)?.pop() {
            return Ok(lease);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    anyhow::bail!("order #5 did not become ready again after its backoff")
}

/// Prints the watch's changes and the queue's counts.
fn report(store: &Store, watch: &mut Watch) -> anyhow::Result<()> {
    for change in watch.poll(store)? {
        let (what, row) = match &change {
            Change::Added(r) => ("opened", r),
            Change::Removed(r) => ("closed", r),
            Change::Updated(r) => ("changed", r),
        };
        say!("     watch: order #{} {what}", row.value_as::<u64>()?);
    }
    let s = store.queue_stats(QUEUE)?;
    say!(
        "     queue ship: {} ready, {} waiting to retry, {} dead-lettered",
        s.ready,
        s.delayed,
        s.dead
    );
    Ok(())
}

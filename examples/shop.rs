//! A small shop on precedent, from facts to shipped orders. It shows:
//! - typed facts with `#[derive(FactType)]`: a `Shop`, its `Order`s (a `Ref<Shop>` is the
//!   edge to their shop), and the `Shipment` that completes an order;
//! - a query of a shop's pending orders, read into a plain struct through serde;
//! - a watch of that query on a thread of its own, whose changes this thread receives;
//! - a worker on another thread that claims each order from a queue and completes it: its
//!   effect (a row in the shop's own `shipping_label` table) and the `Shipment` fact
//!   commit in one transaction, so a crash never leaves one without the other.
//!
//! Run it with `cargo run --example shop`.

use std::error::Error;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use precedent::query::{Change, FactType, Ref, typed};
use precedent::queue::{Completion, QueueSpec};
use precedent::store::SqlExt;
use precedent::{Store, args};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, FactType, Debug)]
#[fact(type = "Shop")]
pub struct Shop {
    pub name: String,
}

#[derive(Serialize, Deserialize, FactType, Debug)]
#[fact(type = "Shop.Order")]
pub struct Order {
    pub shop: Ref<Shop>,
    pub id: i64,
    pub item: String,
}

#[derive(Serialize, Deserialize, FactType, Debug)]
#[fact(type = "Shop.Shipment")]
pub struct Shipment {
    pub order: Ref<Order>,
    pub carrier: String,
}

/// A pending order, as the query below projects it.
#[derive(Deserialize, Debug, PartialEq)]
pub struct Pending {
    pub id: i64,
    pub item: String,
}

/// The orders of a shop that no shipment completes yet.
pub const PENDING: &str = "given s: Shop
    match o: Shop.Order where o->shop = s
      and not exists (match sh: Shop.Shipment where sh->order = o)
    select {id: o.id, item: o.item}";

/// How long to wait for the watch to report a change before giving up.
const PATIENCE: Duration = Duration::from_secs(10);

fn main() -> Result<(), Box<dyn Error>> {
    let store = Arc::new(Store::open_in_memory()?);
    run(&store, &mut std::io::stdout().lock())
}

/// Runs the shop on `store`, telling `out` what happens.
pub fn run(store: &Arc<Store>, out: &mut impl Write) -> Result<(), Box<dyn Error>> {
    // The shop's own table, beside the facts, and the queue of orders to ship: an order
    // is pending until a Shipment names it through its `order` role.
    store.write(|w| {
        w.sql().batch(
            "CREATE TABLE IF NOT EXISTS shipping_label (order_id INTEGER PRIMARY KEY, carrier TEXT NOT NULL)",
        )
    })?;
    let done_by = Completion {
        type_name: Shipment::TYPE.into(),
        role: "order".into(),
    };
    store.declare_queue(&QueueSpec::new("ship", Order::TYPE, vec![done_by]))?;

    let shop = store.write(|w| {
        let shop = w.save(&Shop {
            name: "corner".into(),
        })?;
        for (id, item) in [(1, "teapot"), (2, "kettle")] {
            let item = item.into();
            w.save(&Order { shop, id, item })?;
        }
        Ok(shop)
    })?;
    let pending: Vec<Pending> = store.prepare(PENDING)?.given("s", shop)?.rows_as()?;
    writeln!(out, "pending: {}", describe(&pending))?;

    // The watch polls on a thread of its own; this thread receives what changes.
    let changes = store
        .prepare(PENDING)?
        .given("s", shop)?
        .watch()?
        .spawn(store.clone())?;
    store.save(&Order {
        shop,
        id: 3,
        item: "mug".into(),
    })?;
    report(out, &changes.recv_timeout(PATIENCE)??)?;

    let worker = {
        let store = store.clone();
        std::thread::spawn(move || ship_everything(&store))
    };
    let shipped = worker.join().expect("the worker does not panic")?;
    writeln!(out, "worker: shipped {shipped} orders")?;
    for _ in 0..shipped {
        report(out, &changes.recv_timeout(PATIENCE)??)?;
    }
    let watch = changes.stop();
    writeln!(out, "watch: {} pending", watch.results().len())?;

    let labels = store.read(|r| {
        r.query_vec(
            "SELECT order_id, carrier FROM shipping_label ORDER BY order_id",
            args![],
            |row| {
                Ok(format!(
                    "#{} by {}",
                    row.get::<i64>(0)?,
                    row.get::<String>(1)?
                ))
            },
        )
    })?;
    writeln!(out, "labels: {}", labels.join(", "))?;
    Ok(())
}

/// The worker: claims orders one at a time until none is left, and ships each. Returns
/// how many it shipped.
fn ship_everything(store: &Store) -> precedent::Result<usize> {
    let mut shipped = 0;
    while let Some(lease) = store.claim("ship", 1)?.pop() {
        let order: Order = typed::from_fact(&lease.input)?;
        let carrier = if order.item == "mug" {
            "post"
        } else {
            "courier"
        };
        // The label and the shipment commit together, or neither does; a worker that
        // dies before this lets the lease expire, and the order is handed out again.
        store.complete(&lease, |w| {
            w.sql().execute(
                "INSERT INTO shipping_label (order_id, carrier) VALUES (?1, ?2)",
                args![order.id, carrier],
            )?;
            let order = Ref::new(lease.input.hash());
            w.save(&Shipment {
                order,
                carrier: carrier.into(),
            })
        })?;
        shipped += 1;
    }
    Ok(shipped)
}

/// One line for a change to the pending orders.
fn report(out: &mut impl Write, change: &Change) -> Result<(), Box<dyn Error>> {
    match change {
        Change::Added(row) => {
            let order: Pending = row.value_as()?;
            writeln!(out, "watch: #{} {} is pending", order.id, order.item)?;
        }
        Change::Removed(row) => {
            let order: Pending = row.value_as()?;
            writeln!(out, "watch: #{} {} shipped", order.id, order.item)?;
        }
        Change::Updated(_) => {}
    }
    Ok(())
}

fn describe(orders: &[Pending]) -> String {
    let orders: Vec<String> = orders
        .iter()
        .map(|o| format!("#{} {}", o.id, o.item))
        .collect();
    orders.join(", ")
}

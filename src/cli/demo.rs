//! `demo`: a small shop delivered out of order, narrated step by step; then its orders
//! as work of a queue, followed by a watch (`queue.rs`), and a sync with a second
//! database (`sync.rs`). Every fact but the dead letter has fixed content, so the hashes
//! the help texts and README.md use are those of every demo database.

mod queue;
mod sync;

use std::collections::HashMap;
use std::path::Path;

use precedent::{Fact, FactHash, InsertOutcome, Store};

use super::inspect::{print_verify, run_verify};
use super::{Global, Status};

/// The demo's facts, with a name for each so the narration can refer to them.
#[derive(Default)]
struct Cast {
    facts: Vec<Fact>,
    names: HashMap<FactHash, String>,
}

impl Cast {
    fn add(&mut self, name: &str, fact: Fact) -> FactHash {
        let h = fact.hash();
        self.names.insert(h, name.to_string());
        self.facts.push(fact);
        h
    }

    fn name(&self, h: &FactHash) -> String {
        match self.names.get(h) {
            Some(n) => format!("{n} ({})", h.short(8)),
            None => h.short(12),
        }
    }

    fn fact(&self, h: FactHash) -> &Fact {
        self.facts
            .iter()
            .find(|f| f.hash() == h)
            .expect("a demo fact")
    }
}

fn build() -> precedent::Result<Cast> {
    let mut c = Cast::default();
    let shop = Fact::builder("Shop")
        .field("name", "Corner Books")
        .field("city", "Utrecht")
        .build()?;
    let shop = c.add("shop Corner Books", shop);
    let mut customers = Vec::new();
    for name in ["Ada", "Grace", "Linus"] {
        let f = Fact::builder("Shop.Customer")
            .field("name", name)
            .predecessor("shop", shop)
            .build()?;
        customers.push(c.add(&format!("customer {name}"), f));
    }
    let catalogue: [&[(&str, &str, u64, u64)]; 3] = [
        &[
            ("BK-101", "The Art of Computer Programming", 1, 19900),
            ("BK-102", "Structure and Interpretation", 2, 4500),
        ],
        &[
            ("BK-201", "A Discipline of Programming", 1, 3800),
            ("BK-202", "Communicating Sequential Processes", 1, 4200),
        ],
        &[
            ("BK-301", "The Mythical Man-Month", 1, 2900),
            ("BK-302", "Purely Functional Data Structures", 1, 5100),
        ],
    ];
    let mut orders = Vec::new();
    let mut items: Vec<Vec<FactHash>> = Vec::new();
    for (i, lines) in catalogue.iter().enumerate() {
        let n = i as u64 + 1;
        let order = Fact::builder("Shop.Order")
            .field("number", n)
            .predecessor("shop", shop)
            .predecessor("customer", customers[i])
            .build()?;
        let order = c.add(&format!("order #{n}"), order);
        orders.push(order);
        let mut these = Vec::new();
        for (sku, title, quantity, cents) in lines.iter() {
            let item = Fact::builder("Shop.Order.Item")
                .field("sku", *sku)
                .field("title", *title)
                .field("quantity", *quantity)
                .field("price_cents", *cents)
                .predecessor("order", order)
                .build()?;
            these.push(c.add(&format!("item {sku}"), item));
        }
        items.push(these);
    }
    let shipments = [
        ("PP-1001", 0, vec![items[0][0], items[0][1]]),
        ("PP-1002", 1, vec![items[1][0]]),
        ("PP-1003", 1, vec![items[1][1]]),
    ];
    let mut shipped = Vec::new();
    for (tracking, order, its) in shipments {
        let mut b = Fact::builder("Shop.Shipment")
            .field("carrier", "parcel post")
            .field("tracking", tracking)
            .predecessor("order", orders[order]);
        for it in its {
            b = b.predecessor("items", it);
        }
        shipped.push(c.add(&format!("shipment {tracking}"), b.build()?));
    }
    for (ship, signer) in [(shipped[0], "Ada"), (shipped[1], "Grace")] {
        let f = Fact::builder("Shop.Shipment.Delivered")
            .field("signed_by", signer)
            .predecessor("shipment", ship)
            .build()?;
        c.add(&format!("delivery signed by {signer}"), f);
    }
    let cancel = Fact::builder("Shop.Order.Cancelled")
        .field("reason", "ordered twice by mistake")
        .predecessor("order", orders[2])
        .build()?;
    c.add("cancellation of order #3", cancel);
    Ok(c)
}

/// `precedent demo`.
pub fn demo(g: &Global) -> anyhow::Result<Status> {
    let cast = build()?;
    let store = g.open(true)?;
    let h = |name: &str| {
        *cast
            .names
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .expect("a demo name")
            .0
    };
    say!(
        "precedent demo: a bookshop's history as facts ({} to begin with), its orders as",
        cast.facts.len()
    );
    say!("the work of a queue, a watch, and a sync with a second database.");
    say!("database: {}", g.shown_db());
    say!();
    say!("Every fact names its predecessors by hash: an order names its shop and customer,");
    say!("an item its order, a shipment its order and items, a delivery its shipment.");
    say!("A fact whose predecessors have not all arrived is HELD; the moment its last");
    say!("missing ancestor arrives it is RELEASED, numbered (seq), and visible to readers.");
    say!("Here the facts arrive out of order, children first, one of them twice.");
    if store.lookup(&cast.facts[0].hash())?.is_some() {
        say!();
        say!("Note: this database already holds the demo facts. A fact's identity is the");
        say!("hash of its content, so delivering them again stores nothing new: every step");
        say!("below reports a duplicate, and the counts at the end do not change.");
    }
    let steps: [(&str, Vec<FactHash>); 7] = [
        (
            "The proof of delivery for Ada's parcel arrives first.",
            vec![h("delivery signed by Ada")],
        ),
        (
            "Then the shipment it refers to.",
            vec![h("shipment PP-1001")],
        ),
        (
            "Then the two items of order #1.",
            vec![h("item BK-101"), h("item BK-102")],
        ),
        (
            "Item BK-101 arrives a second time (networks repeat themselves).",
            vec![h("item BK-101")],
        ),
        ("Order #1 itself.", vec![h("order #1")]),
        ("Customer Ada.", vec![h("customer Ada")]),
        (
            "Finally the shop, the root of everything.",
            vec![h("shop Corner Books")],
        ),
    ];
    let mut sent = Vec::new();
    let mut pending: Vec<FactHash> = Vec::new();
    for (i, (story, hashes)) in steps.iter().enumerate() {
        say!();
        say!("step {}: {story}", i + 1);
        for &hash in hashes {
            let fact = cast.fact(hash);
            let outcome = store.insert(fact)?;
            sent.push(hash);
            say!("  <- {} [{}]", cast.name(&hash), fact.type_name());
            say!("     {}", narrate(&cast, &outcome));
            if outcome.is_held() {
                pending.push(hash);
            }
        }
        report_released(&store, &cast, &mut pending)?;
    }
    let rest: Vec<Fact> = cast
        .facts
        .iter()
        .rev()
        .filter(|f| !sent.contains(&f.hash()))
        .cloned()
        .collect();
    say!();
    say!(
        "step {}: the other {} facts arrive together, children first, as one batch.",
        steps.len() + 1,
        rest.len()
    );
    say!("  insert_batch sorts a batch parents-first and stores it in one transaction:");
    let report = store.insert_batch(rest)?;
    say!(
        "     inserted {}, duplicate {}, held {}, released {}",
        report.inserted,
        report.duplicates,
        report.held,
        report.released
    );
    let shop = h("shop Corner Books");
    let customers = [h("customer Ada"), h("customer Grace"), h("customer Linus")];
    let more = queue::orders(shop, customers)?;
    say!();
    if store.lookup(&more.orders[0].0.hash())?.is_some() {
        say!("The queue, watch and sync steps ran when this database was built; queue ship now:");
        let s = store.queue_stats(queue::QUEUE)?;
        say!("  {} ready, {} dead-lettered", s.ready, s.dead);
    } else {
        queue::run(&store, shop, &more)?;
        say!();
        let delivered = Fact::builder("Shop.Shipment.Delivered")
            .field("signed_by", "Grace")
            .predecessor("shipment", more.shipment.hash())
            .build()?;
        sync::run(&store, &delivered)?;
    }
    let stats = store.stats()?;
    say!();
    say!(
        "Now {} facts are held and {} released (`precedent stats` counts them per type).",
        stats.held,
        stats.released
    );
    say!();
    say!("`precedent verify` re-hashes every fact and checks every edge:");
    let verify = run_verify(&store)?;
    print_verify(&verify)?;
    say!();
    say!("Try these (`watch` runs until Ctrl-C):");
    let (p, hidden) = program(&g.db);
    let s = shop.short(8);
    say!("  {p} get {s}");
    say!("  {p} query 'match o: Shop.Order where o.number > 3 select o.number'");
    say!("  {p} queue items ship");
    say!("  {p} work ship --once -- true");
    say!("  {p} dlq list ship");
    say!("  {p} export | head -3");
    say!("  {p} watch 'match o: Shop.Order select o.number'");
    if hidden {
        say!("(The URL's password is left out of these: give it with PGPASSWORD or ~/.pgpass.)");
    }
    Ok(if verify.is_clean() {
        Status::Ok
    } else {
        Status::Problems
    })
}

/// How to run `precedent` on this database: with `--db` unless it is the default one,
/// and whether a password was left out of it (a PostgreSQL URL's, shown as `***`, as
/// every message shows it: the terminal, and whatever records it, never sees one).
fn program(db: &Path) -> (String, bool) {
    if db == Path::new("./precedent.db") {
        return ("precedent".into(), false);
    }
    let text = precedent::store::shown_path(db);
    let hidden = text != db.to_string_lossy();
    let plain = text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c));
    let program = if plain {
        format!("precedent --db {text}")
    } else {
        format!("precedent --db '{}'", text.replace('\'', "'\\''"))
    };
    (program, hidden)
}

fn narrate(cast: &Cast, outcome: &InsertOutcome) -> String {
    match outcome {
        InsertOutcome::Inserted { seq, released } if *released > 1 => format!(
            "released as seq {seq}, and it completes the ancestry of {} held fact(s):",
            released - 1
        ),
        InsertOutcome::Inserted { seq, .. } => format!("released as seq {seq}"),
        InsertOutcome::Duplicate { seq: Some(seq) } => {
            format!("duplicate: already released as seq {seq}; stored once, nothing changes")
        }
        InsertOutcome::Duplicate { seq: None } => {
            "duplicate: already held; stored once, nothing changes".to_string()
        }
        InsertOutcome::Held { missing } => {
            let names: Vec<String> = missing.iter().map(|m| cast.name(m)).collect();
            format!("HELD, waiting for {}", names.join(", "))
        }
        other => format!("{other:?}"),
    }
}

/// Prints the demo facts that were held and are now released, in release order.
fn report_released(
    store: &Store,
    cast: &Cast,
    pending: &mut Vec<FactHash>,
) -> precedent::Result<()> {
    let mut released = Vec::new();
    let mut still = Vec::new();
    for h in pending.drain(..) {
        match store.seq_of(&h)? {
            Some(seq) => released.push((seq, h)),
            None => still.push(h),
        }
    }
    *pending = still;
    released.sort();
    for (seq, h) in &released {
        say!("     RELEASED seq {seq}: {}", cast.name(h));
    }
    if !pending.is_empty() {
        say!("     (held so far: {})", pending.len());
    }
    Ok(())
}

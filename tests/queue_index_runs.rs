//! The queue index kept in runs: on PostgreSQL a batch writes its released facts in runs
//! and calls the queue index for each fact of a run after the run is written, and the
//! index keeps the item rows and blocks of the inputs it indexes until one statement
//! writes them (`src/queue/index.rs`, `NewItems`). Whatever the batches, the index must
//! end where SQLite's, which writes and indexes each fact before the next, ends: the
//! same item rows (state, blockers, when claimable), the same blocks, the same counts,
//! after every batch. Inputs chain causally, are completed in the batch that brings
//! them, in a later one, twice or never, by two queues on one input type; batches come
//! out of order (held facts released by a later batch's cascade) and carry facts stored
//! already (a batch of 256 facts or more guessed new is then rolled back to its
//! savepoint and written again, with what the index kept for later); the queues are
//! declared before the first batch or after some, when a declaration back-fills what
//! is stored (its facts and edges read a page at a time).

mod common;
mod sync_support;

use std::sync::Arc;

use precedent::clock::ManualClock;
use precedent::queue::{Completion, Ordering, QueueSpec};
use precedent::store::SqlExt;
use precedent::{Fact, FactHash, Store, StoreOptions, args};
use proptest::prelude::*;

use common::backend::{Backend, TestDb};
use sync_support::{JSON_CT, Node, http};

const T0: i64 = 1_800_000_000_000;

/// One fact of the workload, by the indexes of the facts it names.
#[derive(Clone, Debug)]
enum Step {
    /// An order of shop `shop`, after order `after` (causal: it waits for it).
    Order { shop: usize, after: Option<usize> },
    /// A shipment of order `order` (completes it in queue `causal`); `n` tells two
    /// shipments of one order apart.
    Shipped { order: usize, n: u8 },
    /// A cancellation of order `order` (completes it in queue `flat`).
    Cancelled { order: usize },
}

const SHOPS: usize = 3;

/// The workload's facts in release order: the shops, then `steps`, each naming only
/// facts before it.
fn facts(steps: &[Step]) -> Vec<Fact> {
    let mut all: Vec<Fact> = (0..SHOPS)
        .map(|i| Fact::builder("Shop").field("n", i as i64).build().unwrap())
        .collect();
    let mut orders: Vec<FactHash> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let fact = match step {
            Step::Order { shop, after } => {
                let mut b = Fact::builder("Order")
                    .field("n", i as i64)
                    .predecessor("shop", all[*shop].hash());
                if let Some(a) = after.filter(|_| !orders.is_empty()) {
                    b = b.predecessor("after", orders[a % orders.len()]);
                }
                let f = b.build().unwrap();
                orders.push(f.hash());
                f
            }
            Step::Shipped { order, n } if !orders.is_empty() => Fact::builder("Shipped")
                .field("n", i64::from(*n))
                .predecessor("order", orders[order % orders.len()])
                .build()
                .unwrap(),
            Step::Cancelled { order } if !orders.is_empty() => Fact::builder("Cancelled")
                .predecessor("order", orders[order % orders.len()])
                .build()
                .unwrap(),
            // Nothing to complete yet: a shop's note, no input.
            _ => Fact::builder("Note")
                .field("n", i as i64)
                .predecessor("shop", all[i % SHOPS].hash())
                .build()
                .unwrap(),
        };
        all.push(fact);
    }
    all
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0..SHOPS, prop::option::weighted(0.4, 0..64usize))
            .prop_map(|(shop, after)| Step::Order { shop, after }),
        3 => (0..64usize, 0..2u8).prop_map(|(order, n)| Step::Shipped { order, n }),
        1 => (0..64usize).prop_map(|order| Step::Cancelled { order }),
    ]
}

/// How the facts are cut into batches: each batch's length, whether it is stored after
/// the next one (its facts' children arrive first, held), and how many of its first
/// facts another handle on the database stores first (as another process would: the
/// store does not know of them, and a batch guessed new finds them stored).
type Cuts = Vec<(usize, bool, usize)>;

fn cuts() -> impl Strategy<Value = Cuts> {
    prop::collection::vec(
        (
            prop_oneof![3 => 1..40usize, 1 => 250..400usize],
            prop::bool::weighted(0.25),
            prop_oneof![3 => Just(0usize), 1 => 1..4usize],
        ),
        1..8,
    )
}

fn open(db: &TestDb, clock: &Arc<ManualClock>) -> Store {
    db.reset();
    db.store_with(StoreOptions {
        clock: clock.clone(),
        ..StoreOptions::default()
    })
}

/// Declares the two queues: on a store with facts, each back-fills what it holds.
fn declare(store: &Store) {
    let causal = QueueSpec::new(
        "causal",
        "Order",
        vec![Completion {
            type_name: "Shipped".into(),
            role: "order".into(),
        }],
    );
    let mut flat = QueueSpec::new(
        "flat",
        "Order",
        vec![Completion {
            type_name: "Cancelled".into(),
            role: "order".into(),
        }],
    );
    flat.ordering = Ordering::None;
    store.declare_queue(&causal).unwrap();
    store.declare_queue(&flat).unwrap();
}

/// Another handle on `db`'s store, as another process would open.
fn other(db: &TestDb, clock: &Arc<ManualClock>) -> Store {
    db.store_with(StoreOptions {
        clock: clock.clone(),
        ..StoreOptions::default()
    })
}

/// The queue index of `store`, by hashes: item rows (queue, input, state, blockers,
/// claimable at), blocks (queue, blocker, blocked), and each queue's completed count.
type Index = (
    Vec<(String, FactHash, i64, i64, Option<i64>)>,
    Vec<(String, FactHash, FactHash)>,
    Vec<(String, i64)>,
);

fn index(store: &Store) -> Index {
    store
        .read(|r| {
            let mut items = r.query_vec(
                "SELECT q.name, f.hash, i.state, i.blockers, i.claimable_at
                 FROM queue_item i JOIN queue q ON q.id = i.queue_id
                 JOIN fact f ON f.seq = i.input",
                args![],
                |row| {
                    Ok((
                        row.get(0)?,
                        row.hash(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        row.get(4)?,
                    ))
                },
            )?;
            items.sort();
            let mut blocks = r.query_vec(
                "SELECT q.name, fb.hash, fd.hash
                 FROM queue_block b JOIN queue q ON q.id = b.queue_id
                 JOIN fact fb ON fb.seq = b.blocker JOIN fact fd ON fd.seq = b.blocked",
                args![],
                |row| Ok((row.get(0)?, row.hash(1)?, row.hash(2)?)),
            )?;
            blocks.sort();
            let counts = r.query_vec(
                "SELECT name, completed FROM queue ORDER BY name",
                args![],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )?;
            Ok((items, blocks, counts))
        })
        .unwrap()
}

/// Stores `all` cut by `cuts` in both databases (through `reference` and `runs`, and
/// the facts stored first through `others`, other handles on them), with the queues
/// declared before batch `declare_at` (a declaration after facts back-fills them),
/// comparing their indexes after each batch (the rest of `all` is a last batch).
fn same_index(
    (reference, runs): (&Store, &Store),
    others: (&Store, &Store),
    all: &[Fact],
    cuts: &Cuts,
    declare_at: usize,
) -> Result<(), TestCaseError> {
    let mut batches: Vec<(Vec<Fact>, bool, usize)> = Vec::new();
    let mut at = 0;
    for &(len, late, first) in cuts.iter().chain([(all.len(), false, 0)].iter()) {
        if at >= all.len() {
            break;
        }
        let end = (at + len).min(all.len());
        batches.push((all[at..end].to_vec(), late, first));
        at = end;
    }
    let mut i = 0;
    while i + 1 < batches.len() {
        if batches[i].1 {
            batches.swap(i, i + 1);
            i += 1;
        }
        i += 1;
    }
    let count = batches.len();
    for (i, (batch, _, first)) in batches.into_iter().enumerate() {
        if i == declare_at.min(count - 1) {
            declare(reference);
            declare(runs);
            prop_assert_eq!(index(reference), index(runs), "declared before batch {}", i);
        }
        let first = batch[..first.min(batch.len())].to_vec();
        others.0.insert_batch(first.clone()).unwrap();
        others.1.insert_batch(first).unwrap();
        prop_assert_eq!(index(reference), index(runs), "before batch {}", i);
        let a = reference.insert_batch(batch.clone()).unwrap();
        let b = runs.insert_batch(batch).unwrap();
        prop_assert_eq!(
            (a.inserted, a.held, a.duplicates),
            (b.inserted, b.held, b.duplicates),
            "batch {}",
            i
        );
        prop_assert_eq!(index(reference), index(runs), "after batch {}", i);
    }
    prop_assert_eq!(reference.stats().unwrap().held, 0, "every fact released");
    Ok(())
}

#[test]
fn postgres_indexes_batches_as_sqlite_does() {
    if !(Backend::Sqlite.ready() && Backend::Postgres.ready()) {
        return;
    }
    let (sqlite, postgres) = (Backend::Sqlite.db(), Backend::Postgres.db());
    let declared_first = Backend::Sqlite.db();
    proptest!(ProptestConfig::with_cases(24), |(
        steps in prop::collection::vec(step(), 1..700),
        cuts in cuts(),
        declare_at in prop_oneof![2 => Just(0usize), 1 => 1..4usize],
    )| {
        let clock = ManualClock::starting_at(T0);
        let all = facts(&steps);
        let reference = open(&sqlite, &clock);
        let runs = open(&postgres, &clock);
        let others = (other(&sqlite, &clock), other(&postgres, &clock));
        same_index((&reference, &runs), (&others.0, &others.1), &all, &cuts, declare_at)?;
        // A declaration back-fills what is stored as if it had been declared first: the
        // same facts stored on a store with the queues declared first end in the same
        // items and blocks, whatever the order of releases between them. (Not the same
        // counts: those count what ended since the declaration, so a back-fill counts
        // none of what it replays; `tests/queue.rs`, `a_back_fill_counts_no_past_ending`.)
        let oracle = open(&declared_first, &clock);
        declare(&oracle);
        oracle.insert_batch(all.clone()).unwrap();
        let ((items, blocks, _), (ref_items, ref_blocks, _)) = (index(&oracle), index(&reference));
        prop_assert_eq!((items, blocks), (ref_items, ref_blocks), "declared first");
    });
}

/// The shape the index's buffer was made for, with the index compared as above: a
/// thousand orders of one shop in one batch, half of them shipped in the same batch;
/// then the rest shipped and a chain of orders each after the one before (the first
/// after a shipped order), the first five shipped; then a batch of two runs guessed new
/// and rolled back at the second (below).
#[test]
fn a_batch_of_orders_and_their_shipments_indexes_as_on_sqlite() {
    if !(Backend::Sqlite.ready() && Backend::Postgres.ready()) {
        return;
    }
    let (sqlite, postgres) = (Backend::Sqlite.db(), Backend::Postgres.db());
    let mut steps: Vec<Step> = (0..1_000)
        .map(|_| Step::Order {
            shop: 0,
            after: None,
        })
        .collect();
    steps.extend((0..500).map(|o| Step::Shipped { order: o, n: 0 }));
    steps.extend((500..1_000).map(|o| Step::Shipped { order: o, n: 0 }));
    // Each after the one before it (pending), the first after a shipped order.
    steps.extend((0..20).map(|k| Step::Order {
        shop: 1,
        after: Some(if k == 0 { 0 } else { 999 + k }),
    }));
    steps.extend((0..5).map(|k| Step::Shipped {
        order: 1_000 + k,
        n: 1,
    }));
    // Then a batch of more than one run: 9,000 new orders, and three shipments of
    // pending orders of the chain, which another handle stores first: the batch, guessed
    // new, is rolled back at its second run, after the first was written and indexed.
    let mut more = steps.clone();
    more.extend((0..9_000).map(|_| Step::Order {
        shop: 2,
        after: None,
    }));
    more.extend((0..3).map(|k| Step::Shipped {
        order: 1_005 + 2 * k,
        n: 2,
    }));
    let more = facts(&more);
    let all = facts(&steps);
    let more = &more[all.len()..];
    let clock = ManualClock::starting_at(T0);
    let reference = open(&sqlite, &clock);
    let runs = open(&postgres, &clock);
    let others = (other(&sqlite, &clock), other(&postgres, &clock));
    same_index(
        (&reference, &runs),
        (&others.0, &others.1),
        &all,
        &vec![(1_503, false, 0), (600, false, 0)],
        0,
    )
    .unwrap();
    let (items, blocks, counts) = index(&runs);
    assert_eq!(
        counts,
        vec![("causal".to_string(), 1_005), ("flat".to_string(), 0)],
        "every shipped order completed once"
    );
    assert_eq!(
        blocks.len(),
        14,
        "each pending order of the chain but the first waits for the one before"
    );
    assert_eq!(
        items.iter().filter(|i| i.0 == "causal").count(),
        15,
        "the fifteen orders not shipped are pending"
    );
    let last = more[more.len() - 3..].to_vec();
    others.0.insert_batch(last.clone()).unwrap();
    others.1.insert_batch(last).unwrap();
    let a = reference.insert_batch(more.to_vec()).unwrap();
    let b = runs.insert_batch(more.to_vec()).unwrap();
    assert_eq!((a.inserted, a.duplicates), (9_000, 3));
    assert_eq!((b.inserted, b.duplicates), (9_000, 3));
    assert_eq!(
        index(&reference),
        index(&runs),
        "after the batch of two runs"
    );
}

/// Pushes to `precedent serve` (`POST /v1/facts`), 300 records each, to a store with
/// queues: on PostgreSQL each is written as a batch in runs with the queue index called
/// after each run (a push to a store without queues would be streamed into `COPY`). The
/// same pushes to a server on SQLite end in the same index (but for when each input
/// became claimable: the servers' clocks run).
#[test]
fn pushes_to_a_server_index_as_on_sqlite() {
    if !(Backend::Sqlite.ready() && Backend::Postgres.ready()) {
        return;
    }
    let nodes = [Node::on(Backend::Sqlite), Node::on(Backend::Postgres)];
    for n in &nodes {
        declare(&n.store());
    }
    let servers: Vec<_> = nodes.iter().map(Node::serve).collect();
    // Orders, each after an earlier one now and then; shipments and cancellations of
    // earlier ones among them, so that pushes carry inputs and completions both.
    let steps: Vec<Step> = (0..1_500usize)
        .map(|i| match i % 5 {
            0..=2 => Step::Order {
                shop: i % SHOPS,
                after: (i % 7 == 0).then_some(i * 13),
            },
            3 => Step::Shipped { order: i * 7, n: 0 },
            _ => Step::Cancelled { order: i * 11 },
        })
        .collect();
    let all = facts(&steps);
    // Pushes of 300 records: over the 256 from which a batch is guessed new.
    for (k, chunk) in all.chunks(300).enumerate() {
        let body = serde_json::Value::Array(
            chunk
                .iter()
                .map(|f| serde_json::from_str(&precedent::json::to_json(f).to_string()).unwrap())
                .collect(),
        )
        .to_string();
        let mut reports = Vec::new();
        for server in &servers {
            let (status, report) =
                http(server, "POST", "/v1/facts", JSON_CT, body.as_bytes(), None);
            assert_eq!(status, 200, "push {k}: {report}");
            reports.push((report["inserted"].as_u64(), report["duplicates"].as_u64()));
        }
        assert_eq!(reports[0], reports[1], "push {k}");
    }
    let untimed = |store: Store| {
        let (items, blocks, counts) = index(&store);
        let items: Vec<_> = items
            .into_iter()
            .map(|(q, h, state, blockers, at)| (q, h, state, blockers, at.is_some()))
            .collect();
        (items, blocks, counts)
    };
    let (sqlite, postgres) = (untimed(nodes[0].store()), untimed(nodes[1].store()));
    assert!(
        !sqlite.1.is_empty() && sqlite.2.iter().all(|(_, c)| *c > 10),
        "the pushes made blocks and completions: {:?}",
        (sqlite.1.len(), &sqlite.2)
    );
    assert_eq!(sqlite, postgres);
}

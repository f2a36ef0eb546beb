//! Watches delivered to another thread (`Watch::spawn`) and as an async stream
//! (`Watch::into_stream`): changes from other threads and other connections arrive, and the
//! watch thread ends, giving its share of the store back, once the receiving end goes.

mod common;

use std::sync::Arc;
use std::time::Duration;

use precedent::query::watch::{CHANNEL_CAPACITY, WatchHandle};
use precedent::query::{Change, Watch};
use precedent::{Fact, Store};

/// Long enough for any poll on a loaded machine; the waits below end as soon as they can.
const BOUND: Duration = Duration::from_secs(10);

fn shop() -> Fact {
    common::shop::shop("corner")
}

fn order(shop: &Fact, id: i64) -> Fact {
    common::shop::order(shop, "id", id)
}

/// A watch of the shop's order ids, on a store that holds the shop.
fn watch_orders(store: &Store, shop: &Fact) -> Watch {
    store.insert(shop).unwrap();
    store
        .prepare("given s: Shop match o: Shop.Order where o->shop = s select o.id")
        .unwrap()
        .given("s", shop)
        .unwrap()
        .watch()
        .unwrap()
}

/// The ids of the next `n` changes, each an addition.
fn added_ids(handle: &WatchHandle, n: usize) -> Vec<i64> {
    (0..n)
        .map(|_| match handle.recv_timeout(BOUND).unwrap().unwrap() {
            Change::Added(row) => row.value_as::<i64>().unwrap(),
            other => panic!("expected an addition, got {other:?}"),
        })
        .collect()
}

/// Drops `handle` on another thread, so that a drop that never ends fails the test instead
/// of hanging it.
fn drop_in_time(handle: WatchHandle) {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(handle);
        done_tx.send(()).unwrap();
    });
    done_rx.recv_timeout(BOUND).expect("the drop ends");
}

#[test]
fn a_spawned_watch_receives_changes_written_by_another_thread() {
    let store = Arc::new(Store::open_in_memory().unwrap());
    let shop = shop();
    let handle = watch_orders(&store, &shop).spawn(store.clone()).unwrap();
    let writer = {
        let (store, shop) = (store.clone(), shop.clone());
        std::thread::spawn(move || {
            for id in 1..=3 {
                store.insert(&order(&shop, id)).unwrap();
            }
        })
    };
    writer.join().unwrap();
    assert_eq!(added_ids(&handle, 3), [1, 2, 3]);
    assert!(handle.try_recv().is_err(), "each change arrives once");
    let watch = handle.stop();
    assert_eq!(watch.results().len(), 3);
    assert_eq!(Arc::strong_count(&store), 1, "stop waits for the thread");
}

#[test]
fn a_spawned_watch_receives_facts_written_through_another_store_on_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("facts.db");
    let store = Arc::new(Store::open(&path).unwrap());
    let other = Store::open(&path).unwrap();
    let shop = shop();
    let handle = watch_orders(&store, &shop).spawn(store.clone()).unwrap();
    other
        .insert_batch(vec![order(&shop, 1), order(&shop, 2)])
        .unwrap();
    assert_eq!(added_ids(&handle, 2), [1, 2]);
}

#[test]
fn dropping_an_idle_handle_ends_the_thread() {
    let store = Arc::new(Store::open_in_memory().unwrap());
    let handle = watch_orders(&store, &shop()).spawn(store.clone()).unwrap();
    std::thread::sleep(Duration::from_millis(120));
    assert_eq!(Arc::strong_count(&store), 2, "the thread holds the store");
    // Nothing is written, so the thread never sends: only the flag tells it to end.
    drop_in_time(handle);
    assert_eq!(Arc::strong_count(&store), 1, "drop waits for the thread");
}

#[test]
fn dropping_a_handle_whose_channel_is_full_ends_the_thread() {
    let store = Arc::new(Store::open_in_memory().unwrap());
    let shop = shop();
    let handle = watch_orders(&store, &shop).spawn(store.clone()).unwrap();
    let orders = (0..CHANNEL_CAPACITY as i64 + 10)
        .map(|id| order(&shop, id))
        .collect();
    store.insert_batch(orders).unwrap();
    // The first change arrives once the thread is past its poll and filling the channel.
    assert!(handle.recv_timeout(BOUND).unwrap().is_ok());
    std::thread::sleep(Duration::from_millis(50));
    drop_in_time(handle);
    assert_eq!(Arc::strong_count(&store), 1, "drop waits for the thread");
}

#[test]
fn a_stopped_watch_comes_back_current_and_goes_on_polling() {
    let store = Arc::new(Store::open_in_memory().unwrap());
    let shop = shop();
    let handle = watch_orders(&store, &shop).spawn(store.clone()).unwrap();
    store.insert(&order(&shop, 1)).unwrap();
    assert_eq!(added_ids(&handle, 1), [1]);
    let mut watch = handle.stop();
    assert_eq!(Arc::strong_count(&store), 1);
    store.insert(&order(&shop, 2)).unwrap();
    assert_eq!(watch.poll(&store).unwrap().len(), 1);
    assert_eq!(watch.results().len(), 2);
}

#[cfg(feature = "server")]
mod stream {
    use std::time::Instant;

    use futures_util::StreamExt;

    use super::*;

    async fn next_id(stream: &mut precedent::query::watch::WatchStream) -> i64 {
        let change = tokio::time::timeout(BOUND, stream.next()).await;
        match change
            .expect("a change in time")
            .expect("the stream goes on")
        {
            Ok(Change::Added(row)) => row.value_as::<i64>().unwrap(),
            other => panic!("expected an addition, got {other:?}"),
        }
    }

    /// Waits until only `store`'s owner holds it: the watch thread has ended.
    async fn wait_until_alone(store: &Arc<Store>) {
        let start = Instant::now();
        while Arc::strong_count(store) > 1 {
            assert!(
                start.elapsed() < BOUND,
                "the watch thread still holds the store"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    // One runtime thread: were the database polled on it, nothing else would run meanwhile.
    #[tokio::test(flavor = "current_thread")]
    async fn a_watch_stream_yields_changes_from_other_threads_and_stores() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("facts.db");
        let store = Arc::new(Store::open(&path).unwrap());
        let shop = shop();
        let mut stream = watch_orders(&store, &shop)
            .into_stream(store.clone())
            .unwrap();
        let writer = {
            let (store, shop) = (store.clone(), shop.clone());
            tokio::task::spawn_blocking(move || store.insert(&order(&shop, 1)).unwrap())
        };
        assert_eq!(next_id(&mut stream).await, 1);
        writer.await.unwrap();
        Store::open(&path)
            .unwrap()
            .insert(&order(&shop, 2))
            .unwrap();
        assert_eq!(next_id(&mut stream).await, 2);
        let watch = stream.stop().await;
        assert_eq!(watch.results().len(), 2);
        wait_until_alone(&store).await;
    }

    #[tokio::test]
    async fn dropping_an_idle_watch_stream_ends_the_thread() {
        let store = Arc::new(Store::open_in_memory().unwrap());
        let stream = watch_orders(&store, &shop())
            .into_stream(store.clone())
            .unwrap();
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert_eq!(Arc::strong_count(&store), 2, "the thread holds the store");
        drop(stream);
        wait_until_alone(&store).await;
    }

    #[tokio::test]
    async fn stopping_a_watch_stream_whose_channel_is_full_gives_the_watch_back() {
        let store = Arc::new(Store::open_in_memory().unwrap());
        let shop = shop();
        let mut stream = watch_orders(&store, &shop)
            .into_stream(store.clone())
            .unwrap();
        let n = CHANNEL_CAPACITY + 10;
        let orders = (0..n as i64).map(|id| order(&shop, id)).collect();
        store.insert_batch(orders).unwrap();
        assert_eq!(next_id(&mut stream).await, 0);
        let watch = tokio::time::timeout(BOUND, stream.stop()).await;
        assert_eq!(watch.expect("the stop ends").results().len(), n);
        wait_until_alone(&store).await;
    }
}

//! `precedent serve` and `precedent sync --follow` while another process holds the SQLite
//! write lock longer than the busy timeout (5 s), as a long `import --atomic` does: both
//! keep running, the server answers 503 `busy` with `Retry-After` meanwhile, and both
//! converge once the lock is released.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::bin::cmd;
use common::db::Db;
use common::process::{Server, kill};
use precedent::Fact;

/// Longer than the busy timeout of the command line's stores.
const HOLD: Duration = Duration::from_secs(7);
/// The longest convergence may take on a loaded machine.
const BOUND: Duration = Duration::from_secs(60);

fn push(url: &str, f: &Fact) -> ureq::http::Response<ureq::Body> {
    let body = precedent::json::to_json(f).to_string();
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .new_agent()
        .post(format!("{url}/v1/facts"))
        .header("content-type", "application/json")
        .send(format!("[{body}]"))
        .unwrap()
}

/// Holds `BEGIN EXCLUSIVE` on `db` on a thread for [`HOLD`]; returns when the lock is
/// taken.
fn hold_lock(db: &Db) -> std::thread::JoinHandle<()> {
    let conn = db.raw();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
        tx.send(()).unwrap();
        std::thread::sleep(HOLD);
        conn.execute_batch("COMMIT").unwrap();
    });
    rx.recv().unwrap();
    t
}

fn wait_until(mut ok: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + BOUND;
    while Instant::now() < until {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn serve_answers_busy_while_the_lock_is_held_and_keeps_serving() {
    let db = Db::init();
    let shop = common::shop::shop("corner");
    let mut server = Server::start(&db.path);
    let lock = hold_lock(&db);
    let r = push(&server.url, &shop);
    assert_eq!(r.status().as_u16(), 503);
    assert!(r.headers().get("retry-after").is_some());
    assert!(server.child.try_wait().unwrap().is_none(), "serve exited");
    lock.join().unwrap();
    // Retried as Retry-After says, the push is stored.
    let r = push(&server.url, &shop);
    assert_eq!(r.status().as_u16(), 200);
    assert!(db.store().get(&shop.hash()).unwrap().is_some());
    assert!(server.child.try_wait().unwrap().is_none(), "serve exited");
}

#[test]
fn sync_follow_waits_out_a_lock_on_its_own_database_and_converges() {
    let (a, b) = (Db::init(), Db::init());
    let server = Server::start(&a.path);
    let mut follow = cmd(&b.path, &["sync", &server.url, "--follow"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let shop = common::shop::shop("corner");
    a.store().insert(&shop).unwrap();
    assert!(wait_until(|| b
        .store()
        .get(&shop.hash())
        .unwrap()
        .is_some()));
    // The follower's own database locked past the busy timeout while new facts arrive.
    let lock = hold_lock(&b);
    let orders: Vec<Fact> = (1..=3)
        .map(|i| common::shop::order(&shop, "id", i))
        .collect();
    a.store().insert_batch(orders.clone()).unwrap();
    lock.join().unwrap();
    let still = follow.try_wait().unwrap();
    assert!(still.is_none(), "sync --follow exited: {still:?}");
    assert!(wait_until(|| orders.iter().all(|o| b
        .store()
        .get(&o.hash())
        .unwrap()
        .is_some())));
    assert!(kill(&mut follow), "sync --follow exited");
}

//! The console in a real browser (`docs/ui.md`): `precedent serve` on a port of
//! 127.0.0.1 from the OS, headless Chromium driven through chromedriver (WebDriver) by
//! fantoccini. One browser session runs the cases in turn, each with bounded waits:
//!
//! - the overview shows the store's counts;
//! - a fact whose field holds `<script>` and HTML renders as text;
//! - a fact page shows its predecessors, each a link, and the neighbourhood picture;
//! - a dead-lettered input is listed, redriven with its button, leaves the list, and is
//!   then completed by `precedent work --once`;
//! - the overview updates, without a reload, when a fact is added from the command line;
//! - keyboard: Tab reaches the controls, buttons are buttons, inputs have labels, and a
//!   search runs from the keyboard alone.
//!
//! Without `chromium` and `chromedriver` (the distribution's `chromium` and
//! `chromium-driver`, which `.ci/run` installs) the test prints `SKIPPED` and passes,
//! except under `CI`, where it fails. Screenshots are saved to `target/ui-screenshots/`.

mod common;

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::bin::Db;
use common::process::Server;
use common::shop::{order, shop};
use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use precedent::queue::{Completion, Failure, QueueSpec};
use precedent::{Fact, Store};

/// The longest any one wait of this test lasts.
const WAIT: Duration = Duration::from_secs(15);

fn under_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
}

fn on_path(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A chromedriver child on a free port; killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Driver {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let deadline = Instant::now() + WAIT;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn screenshots() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

/// Waits until `css` matches an element whose text satisfies `ok`; returns the text.
async fn wait_text(c: &Client, css: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    let mut last = String::new();
    loop {
        if let Ok(e) = c.find(Locator::Css(css)).await
            && let Ok(t) = e.text().await
        {
            if ok(&t) {
                return t;
            }
            last = t;
        }
        assert!(
            Instant::now() < deadline,
            "{css}: no element with the text wanted; last seen {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no element matches `css`.
async fn wait_gone(c: &Client, css: &str) {
    let deadline = Instant::now() + WAIT;
    while !c.find_all(Locator::Css(css)).await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "{css} is still on the page");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn eval(c: &Client, script: &str) -> serde_json::Value {
    c.execute(script, vec![]).await.unwrap()
}

/// The facts of the test: a shop, one order dead-lettered in queue `ship`, a note with
/// HTML in its field naming the shop, and an order held for an absent shop.
struct World {
    shop: Fact,
    order: Fact,
    note: Fact,
}

fn world(store: &Store) -> World {
    let s = shop("corner");
    let o = order(&s, "id", 1);
    let note = Fact::builder("Note")
        .field(
            "text",
            "<script>document.title='pwned'</script><b id=\"injected\">bold</b>",
        )
        .predecessor("about", s.hash())
        .build()
        .unwrap();
    store
        .insert_batch(vec![s.clone(), o.clone(), note.clone()])
        .unwrap();
    let mut spec = QueueSpec::new(
        "ship",
        "Shop.Order",
        vec![Completion {
            type_name: "Shop.Shipment".into(),
            role: "order".into(),
        }],
    );
    spec.retry.max_attempts = 1;
    store.declare_queue(&spec).unwrap();
    for lease in store.claim("ship", 1).unwrap() {
        store
            .fail(&lease, Failure::Permanent("carrier refused".into()))
            .unwrap();
    }
    store.insert(&order(&shop("absent"), "id", 2)).unwrap();
    World {
        shop: s,
        order: o,
        note,
    }
}

#[test]
fn the_console_in_chromium() {
    if !on_path("chromedriver") || !on_path("chromium") {
        assert!(
            !under_ci(),
            "chromium and chromedriver are needed under CI (.ci/run installs them)"
        );
        eprintln!(
            "SKIPPED: chromium or chromedriver not installed (apt-get install chromium chromium-driver)"
        );
        return;
    }
    let db = Db::init();
    let w = world(&db.store());
    let server = Server::start(&db.path);
    let driver = Driver::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let caps = serde_json::json!({
            "goog:chromeOptions": {
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1200,800"]
            }
        });
        let caps = caps.as_object().unwrap().clone();
        let c = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&driver.url)
            .await
            .expect("a Chromium session");
        let result = cases(&c, &server, &db, &w).await;
        let _ = c.close().await;
        result
    });
}

async fn cases(c: &Client, server: &Server, db: &Db, w: &World) {
    let ui = format!("{}/ui/", server.url);
    overview_counts(c, &ui, db).await;
    html_renders_as_text(c, &ui, w).await;
    fact_page(c, w).await;
    redrive(c, &ui, db, w).await;
    live_update(c, &ui, db).await;
    keyboard(c, &ui, w).await;
}

async fn overview_counts(c: &Client, ui: &str, db: &Db) {
    c.goto(&format!("{ui}#/")).await.unwrap();
    let store = db.store();
    let (facts, _) = store.count_and_max_seq().unwrap();
    // The shop, the order, the note and the dead letter.
    assert_eq!(facts, 4);
    wait_text(c, "#count-facts", |t| t == facts.to_string()).await;
    wait_text(c, "#count-held", |t| t == "1").await;
    wait_text(c, "#count-breached", |t| t == "1").await;
    let row = wait_text(c, "main table tbody tr", |t| t.contains("ship")).await;
    assert!(row.contains("Shop.Order"), "{row}");
    screenshot(c, "overview").await;
}

async fn html_renders_as_text(c: &Client, ui: &str, w: &World) {
    c.goto(&format!("{ui}#/facts/{}", w.note.hash()))
        .await
        .unwrap();
    let text = wait_text(c, "span.value", |t| t.contains("script")).await;
    assert_eq!(
        text, "<script>document.title='pwned'</script><b id=\"injected\">bold</b>",
        "the field's characters are shown as they are"
    );
    let injected = eval(
        c,
        "return document.querySelectorAll('#injected, main script').length",
    )
    .await;
    assert_eq!(injected, 0, "no element was made from the field");
    assert_eq!(c.title().await.unwrap(), "precedent console");
    screenshot(c, "html-as-text").await;
}

async fn fact_page(c: &Client, w: &World) {
    // The note's page is open: its predecessor is the shop, a link.
    let shop = w.shop.hash().to_string();
    let link = format!("#predecessors a[href=\"#/facts/{shop}\"]");
    wait_text(c, &link, |t| shop.starts_with(t)).await;
    let role = wait_text(c, "#predecessors td", |_| true).await;
    assert_eq!(role, "about");
    let src = c
        .find(Locator::Css("img#graph"))
        .await
        .unwrap()
        .attr("src")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        src,
        format!("/v1/graph/{}?format=svg&depth=2", w.note.hash())
    );
    let alt = c
        .find(Locator::Css("img#graph"))
        .await
        .unwrap()
        .attr("alt")
        .await
        .unwrap();
    assert!(alt.is_some_and(|a| !a.is_empty()));
    // The picture loads (GET /v1/graph/HASH?format=svg).
    let deadline = Instant::now() + WAIT;
    loop {
        let width = eval(
            c,
            "const i = document.getElementById('graph'); return i.complete ? i.naturalWidth : -1",
        )
        .await;
        if width.as_i64().unwrap_or(0) > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the graph did not load ({width})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Following the link shows the shop, whose successors list the order and the note.
    c.find(Locator::Css(&link))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(c, "#fact-hash", |t| t == shop).await;
    let order = w.order.hash().to_string();
    let succ = format!("#successors a[href=\"#/facts/{order}\"]");
    wait_text(c, &succ, |t| order.starts_with(t)).await;
    let n = eval(
        c,
        "return document.querySelectorAll('#successors tbody tr').length",
    )
    .await;
    assert_eq!(n, 2, "the order and the note");
    screenshot(c, "fact").await;
}

async fn redrive(c: &Client, ui: &str, db: &Db, w: &World) {
    c.goto(&format!("{ui}#/queues/ship")).await.unwrap();
    let input = w.order.hash().to_string();
    let button = format!("button.redrive[data-input=\"{input}\"]");
    let row = wait_text(c, "main table tbody tr", |t| t.contains("carrier refused")).await;
    assert!(row.contains(&input[..12]), "{row}");
    wait_text(c, "#q-dead", |t| t == "1").await;
    screenshot(c, "queue").await;
    c.find(Locator::Css(&button))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_gone(c, &button).await;
    wait_text(c, "#q-dead", |t| t == "0").await;
    wait_text(c, "#action-status", |t| t.starts_with("redrive")).await;
    let store = db.store();
    assert_eq!(store.queue_stats("ship").unwrap().dead, 0);
    assert_eq!(store.queue_stats("ship").unwrap().ready, 1);
    // The redriven input is then completed by a worker.
    db.ok(&["work", "ship", "--once", "--", "true"]);
    let s = store.queue_stats("ship").unwrap();
    assert_eq!((s.ready, s.completed), (0, 1));
    c.refresh().await.unwrap();
    wait_text(c, "#q-completed", |t| t == "1").await;
}

async fn live_update(c: &Client, ui: &str, db: &Db) {
    c.goto(&format!("{ui}#/")).await.unwrap();
    let (facts, _) = db.store().count_and_max_seq().unwrap();
    wait_text(c, "#count-facts", |t| t == facts.to_string()).await;
    db.ok(&[
        "add",
        r#"{"type": "Shop", "fields": {"name": "added live"}}"#,
    ]);
    // The count changes without a reload (GET /v1/events).
    let want = (facts + 1).to_string();
    wait_text(c, "#count-facts", |t| t == want).await;
    wait_text(c, "#live", |t| t == "live").await;
    screenshot(c, "live").await;
}

async fn keyboard(c: &Client, ui: &str, w: &World) {
    c.goto(&format!("{ui}#/facts")).await.unwrap();
    wait_text(c, "#find button", |t| t == "Find").await;
    // Every control is a real control, and every input is labelled.
    let unlabelled = eval(
        c,
        "return [...document.querySelectorAll('input, textarea, select')].filter(i => i.labels.length === 0).length",
    )
    .await;
    assert_eq!(unlabelled, 0);
    let fake = eval(
        c,
        "return document.querySelectorAll('[onclick], div[role=button], span[role=button]').length",
    )
    .await;
    assert_eq!(fake, 0);
    // Tab from the top reaches the nav, the search field and the Find button, in order.
    eval(c, "document.activeElement.blur(); window.focus(); return 0").await;
    let mut seen = Vec::new();
    for _ in 0..40 {
        let tab = KeyActions::new("keyboard".into())
            .then(KeyAction::Down {
                value: Key::Tab.into(),
            })
            .then(KeyAction::Up {
                value: Key::Tab.into(),
            });
        c.perform_actions(tab).await.unwrap();
        let who = eval(
            c,
            "const a = document.activeElement; return a.tagName + '#' + (a.id || a.textContent.trim())",
        )
        .await;
        let who = who.as_str().unwrap().to_string();
        let done = who == "BUTTON#Find";
        seen.push(who);
        if done {
            break;
        }
    }
    let at = |x: &str| seen.iter().position(|s| s == x);
    let (nav, prefix, find) = (at("A#Overview"), at("INPUT#find-prefix"), at("BUTTON#Find"));
    assert!(
        nav.is_some() && nav < prefix && prefix < find,
        "tab order: {seen:?}"
    );
    // Typing a prefix and pressing Enter in the field runs the search.
    let prefix = &w.note.hash().to_string()[..10];
    let field = c.find(Locator::Css("#find-prefix")).await.unwrap();
    field.send_keys(prefix).await.unwrap();
    field.send_keys(&Key::Enter.to_string()).await.unwrap();
    let link = format!("main table a[href=\"#/facts/{}\"]", w.note.hash());
    let note = w.note.hash().to_string();
    wait_text(c, &link, |t| !t.is_empty() && note.starts_with(t)).await;
    assert!(
        c.current_url()
            .await
            .unwrap()
            .as_str()
            .contains(&format!("prefix={prefix}"))
    );
    screenshot(c, "keyboard").await;
}

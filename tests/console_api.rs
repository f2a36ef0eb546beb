//! The console's JSON endpoints and pages over 127.0.0.1 (`docs/ui.md`): paging, the
//! permissions (read for views, admin for redrive and discard, 401 and 403), the token
//! cookie, and the security headers of `/ui/`; on SQLite and PostgreSQL.

mod common;
mod sync_support;

use common::shop::{order, shop};
use precedent::queue::{Completion, Failure, QueueSpec};
use precedent::sync::auth::{Grant, Tokens};
use precedent::sync::server::Running;
use precedent::{Fact, FactHash, Store};
use serde_json::{Value, json};
use sync_support::*;

/// `reader` reads, `admin` reads and administers queues, `writer` only writes.
fn console_tokens() -> Tokens {
    let grant = |name: &str, read, write, admin| Grant {
        name: name.into(),
        token: format!("{name}-secret"),
        read,
        write,
        types: None,
        work: Default::default(),
        admin,
    };
    Tokens::new(vec![
        grant("reader", true, false, false),
        grant("admin", true, false, true),
        grant("writer", false, true, false),
    ])
    .unwrap()
}

fn get(server: &Running, path: &str, token: Option<&str>) -> (u16, Value) {
    http(server, "GET", path, "", b"", token)
}

fn post(server: &Running, path: &str, body: &Value, token: Option<&str>) -> (u16, Value) {
    http(
        server,
        "POST",
        path,
        JSON_CT,
        body.to_string().as_bytes(),
        token,
    )
}

/// The queue `ship` of orders (done by `Shop.Shipment.order`), at most one attempt.
fn ship_queue() -> QueueSpec {
    let mut spec = QueueSpec::new(
        "ship",
        "Shop.Order",
        vec![Completion {
            type_name: "Shop.Shipment".into(),
            role: "order".into(),
        }],
    );
    spec.retry.max_attempts = 1;
    spec
}

/// A shop and `n` orders in queue `ship`, the first `dead` of them dead-lettered.
fn dead_letters(store: &Store, n: i64, dead: usize) -> (Fact, Vec<Fact>) {
    let s = shop("corner");
    let orders: Vec<Fact> = (0..n).map(|i| order(&s, "id", i)).collect();
    let mut facts = vec![s.clone()];
    facts.extend(orders.iter().cloned());
    store.insert_batch(facts).unwrap();
    store.declare_queue(&ship_queue()).unwrap();
    for lease in store.claim("ship", dead).unwrap() {
        store
            .fail(&lease, Failure::Permanent("<b>boom</b>".into()))
            .unwrap();
    }
    (s, orders)
}

/// Every item of a list, read `limit` at a time; also checks that no page but the last
/// is short and that the last has `next: null`.
fn all_pages(server: &Running, path: &str, limit: usize, token: Option<&str>) -> Vec<Value> {
    let sep = if path.contains('?') { '&' } else { '?' };
    let mut after: Option<String> = None;
    let mut out = Vec::new();
    for _ in 0..1000 {
        let url = match &after {
            Some(a) => format!("{path}{sep}limit={limit}&after={a}"),
            None => format!("{path}{sep}limit={limit}"),
        };
        let (status, page) = get(server, &url, token);
        assert_eq!(status, 200, "{url}: {page}");
        let items = page["items"].as_array().unwrap().clone();
        match page["next"].as_str() {
            Some(next) => {
                assert_eq!(items.len(), limit, "{url}: a page before the last is full");
                after = Some(next.to_string());
            }
            None => {
                assert!(items.len() <= limit);
                out.extend(items);
                return out;
            }
        }
        out.extend(items);
    }
    panic!("{path}: more than 1000 pages");
}

fn hashes_of(items: &[Value], key: &str) -> Vec<String> {
    items
        .iter()
        .map(|i| {
            let v = key.split('.').fold(i, |v, k| &v[k]);
            v.as_str().unwrap().to_string()
        })
        .collect()
}

conformance! {
    fn the_overview_counts_facts_held_queues_and_peers(backend: Backend) {
        let a = Node::on(backend);
        let store = a.store();
        dead_letters(&store, 4, 2);
        let absent = shop("absent");
        store.insert(&order(&absent, "id", 9)).unwrap();
        store.record_peer_error("http://127.0.0.1:1", "connection refused").unwrap();
        let server = a.serve_with(|c| c.tokens = console_tokens());
        let (status, o) = get(&server, "/v1/overview", Some("reader-secret"));
        assert_eq!(status, 200, "{o}");
        let declared = store.max_seq().unwrap();
        // A shop, four orders and two dead-letter facts are released; one order is held.
        assert_eq!(o["facts"], json!(7));
        assert_eq!(o["max_seq"], json!(declared));
        assert_eq!(o["held"], json!(1));
        assert_eq!(o["queues"][0]["name"], "ship");
        assert_eq!(o["queues"][0]["stats"]["dead"], json!(2));
        assert_eq!(o["queues"][0]["stats"]["ready"], json!(2));
        assert_eq!(o["queues"][0]["breaches"][0]["alert"], "dead");
        assert_eq!(o["queues_breached"], json!(1));
        assert_eq!(o["peers"][0]["last_error"], "connection refused");
        let (status, q) = get(&server, "/v1/queues/ship", Some("reader-secret"));
        assert_eq!(status, 200, "{q}");
        let minutes = q["minutes"].as_array().unwrap();
        assert_eq!(minutes.len(), 60);
        let failed: u64 = minutes.iter().map(|m| m["failed"].as_u64().unwrap()).sum();
        assert_eq!(failed, 2, "the two failures are in the last hour's minutes");
        assert_eq!(get(&server, "/v1/queues/nope", Some("reader-secret")).0, 404);
    }

    fn dead_letters_page_and_are_redriven_and_discarded_by_admins(backend: Backend) {
        let a = Node::on(backend);
        let store = a.store();
        let (_, orders) = dead_letters(&store, 7, 5);
        let server = a.serve_with(|c| c.tokens = console_tokens());
        let items = all_pages(&server, "/v1/queues/ship/items?state=dead", 2, Some("reader-secret"));
        let want: Vec<String> = orders[..5].iter().map(|o| o.hash().to_string()).collect();
        assert_eq!(hashes_of(&items, "input"), want, "every dead letter once, in release order");
        assert_eq!(items[0]["last_error"], "<b>boom</b>");
        assert_eq!(items[0]["attempts"], json!(1));
        assert_eq!(items[0]["fact"]["fields"]["id"], json!(0));
        assert!(items[0]["entry_at_ms"].is_i64(), "{}", items[0]);
        let ready = all_pages(&server, "/v1/queues/ship/items?state=ready", 1, Some("reader-secret"));
        assert_eq!(ready.len(), 2);

        let input = json!({"input": orders[0].hash().to_string()});
        let path = "/v1/queues/ship/redrive";
        assert_eq!(post(&server, path, &input, None).0, 401);
        let (status, err) = post(&server, path, &input, Some("reader-secret"));
        assert_eq!((status, err["error"].as_str()), (403, Some("forbidden")));
        assert_eq!(post(&server, path, &input, Some("writer-secret")).0, 403);
        assert_eq!(store.queue_stats("ship").unwrap().dead, 5, "refused: nothing changed");
        let (status, r) = post(&server, path, &input, Some("admin-secret"));
        assert_eq!(status, 200, "{r}");
        let redrive: FactHash = r["redrive"].as_str().unwrap().parse().unwrap();
        let fact = store.get(&redrive).unwrap().expect("the redrive is a stored fact");
        assert_eq!(fact.type_name(), precedent::queue::system::REDRIVE);
        assert_eq!(store.queue_stats("ship").unwrap().dead, 4);
        let (status, err) = post(&server, path, &input, Some("admin-secret"));
        assert_eq!(status, 409, "a ready input cannot be redriven: {err}");

        let discard = "/v1/queues/ship/discard";
        let second = orders[1].hash().to_string();
        let (status, _) = post(&server, discard, &json!({"input": second}), Some("admin-secret"));
        assert_eq!(status, 400, "a discard needs a reason");
        let body = json!({"input": second, "reason": "customer left"});
        assert_eq!(post(&server, discard, &body, Some("reader-secret")).0, 403);
        let (status, r) = post(&server, discard, &body, Some("admin-secret"));
        assert_eq!(status, 200, "{r}");
        let d: FactHash = r["discard"].as_str().unwrap().parse().unwrap();
        assert_eq!(store.get(&d).unwrap().unwrap().field("reason").cloned(), Some("customer left".into()));
        let s = store.queue_stats("ship").unwrap();
        assert_eq!((s.dead, s.discarded), (3, 1));
        let unknown = "/v1/queues/nope/redrive";
        assert_eq!(post(&server, unknown, &input, Some("admin-secret")).0, 404);
        let bad = json!({"input": "abc"});
        assert_eq!(post(&server, path, &bad, Some("admin-secret")).0, 400);
        let extra = json!({"input": second, "why": 1});
        assert_eq!(post(&server, path, &extra, Some("admin-secret")).0, 400);
    }

    fn held_find_successors_peers_and_quarantine_page(backend: Backend) {
        let a = Node::on(backend);
        let store = a.store();
        let s = shop("corner");
        let orders: Vec<Fact> = (0..9).map(|i| order(&s, "id", i)).collect();
        let mut facts = vec![s.clone()];
        facts.extend(orders.iter().cloned());
        store.insert_batch(facts).unwrap();
        let absent: Vec<Fact> = (0..3).map(|i| shop(&format!("absent {i}"))).collect();
        for (i, p) in absent.iter().enumerate() {
            store.insert(&order(p, "id", i as i64)).unwrap();
        }
        for i in 0..3 {
            store.record_peer_error(&format!("http://peer-{i}.example"), "down").unwrap();
        }
        let server = a.serve();

        let held = all_pages(&server, "/v1/held", 2, None);
        assert_eq!(held.len(), 3);
        for (h, p) in held.iter().zip(&absent) {
            assert_eq!(h["missing"], json!([p.hash().to_string()]), "each waits for its shop");
        }

        let newest = all_pages(&server, "/v1/find?type=Shop.Order", 4, None);
        let mut want: Vec<String> = orders.iter().map(|o| o.hash().to_string()).collect();
        want.reverse();
        assert_eq!(hashes_of(&newest, "fact.hash"), want, "orders newest first");
        let target = orders[4].hash().to_string();
        let found = all_pages(&server, &format!("/v1/find?prefix={}", &target[..6]), 1, None);
        assert!(hashes_of(&found, "fact.hash").contains(&target));
        assert!(hashes_of(&found, "fact.hash").iter().all(|h| h.starts_with(&target[..6])));
        let typed = all_pages(&server, &format!("/v1/find?prefix={}&type=Shop", &target[..6]), 1, None);
        assert!(!hashes_of(&typed, "fact.hash").contains(&target), "an order is not a Shop");
        let mut by_hash: Vec<String> = want.clone();
        by_hash.push(s.hash().to_string());
        by_hash.sort();
        let every = all_pages(&server, "/v1/find?prefix=0", 1000, None);
        let zeros: Vec<&String> = by_hash.iter().filter(|h| h.starts_with('0')).collect();
        assert_eq!(hashes_of(&every, "fact.hash").iter().collect::<Vec<_>>(), zeros);
        assert_eq!(get(&server, "/v1/find?prefix=xyz", None).0, 400);
        assert_eq!(get(&server, "/v1/find?type=Nobody", None).1["items"], json!([]));

        let succ = all_pages(&server, &format!("/v1/facts/{}/successors", s.hash()), 2, None);
        let mut got = hashes_of(&succ, "fact.hash");
        got.sort();
        let mut all_orders: Vec<String> = orders.iter().map(|o| o.hash().to_string()).collect();
        all_orders.sort();
        assert_eq!(got, all_orders, "every order once");
        assert!(succ.iter().all(|x| x["role"] == "shop"));
        let none = format!("/v1/facts/{}/successors", FactHash::of_canonical(b"nothing"));
        assert_eq!(get(&server, &none, None).0, 404);

        let peers = all_pages(&server, "/v1/peers", 2, None);
        let urls = hashes_of(&peers, "url");
        assert_eq!(urls, ["http://peer-0.example", "http://peer-1.example", "http://peer-2.example"]);
        assert_eq!(peers[0]["last_error"], "down");

        for i in 0..3 {
            let line = format!("{{\"type\": \"Broken\", \"fields\": {i}}}\n");
            let (status, _) = http(&server, "POST", "/v1/facts", "application/jsonl", line.as_bytes(), None);
            assert_eq!(status, 200);
        }
        let q = all_pages(&server, "/v1/quarantine", 2, None);
        assert_eq!(q.len(), 3);
        let ids: Vec<i64> = q.iter().map(|x| x["id"].as_i64().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
        assert_eq!(q[0]["peer"], "anonymous");
    }
}

#[test]
fn list_parameters_are_checked() {
    let a = Node::new();
    dead_letters(&a.store(), 2, 1);
    let server = a.serve();
    for path in [
        "/v1/held?limit=0",
        "/v1/held?limit=1001",
        "/v1/held?limit=ten",
        "/v1/held?after=zz",
        "/v1/held?colour=red",
        "/v1/queues/ship/items?state=sleeping",
        "/v1/peers?after=nothex",
        "/v1/facts/abc/successors",
    ] {
        let (status, err) = get(&server, path, None);
        assert_eq!(
            (status, err["error"].as_str()),
            (400, Some("bad_request")),
            "{path}: {err}"
        );
        assert!(!err["message"].as_str().unwrap().is_empty());
    }
    let (status, page) = get(&server, "/v1/held?limit=1000", None);
    assert_eq!((status, page["next"].clone()), (200, Value::Null));
}

#[test]
fn views_need_read_and_reject_unknown_tokens() {
    let a = Node::new();
    dead_letters(&a.store(), 2, 1);
    let server = a.serve_with(|c| c.tokens = console_tokens());
    for path in [
        "/v1/overview",
        "/v1/queues",
        "/v1/queues/ship",
        "/v1/queues/ship/items?state=dead",
        "/v1/held",
        "/v1/peers",
        "/v1/quarantine",
        "/v1/find",
    ] {
        assert_eq!(get(&server, path, None).0, 401, "{path}");
        assert_eq!(get(&server, path, Some("guess")).0, 401, "{path}");
        assert_eq!(get(&server, path, Some("writer-secret")).0, 403, "{path}");
        assert_eq!(get(&server, path, Some("reader-secret")).0, 200, "{path}");
    }
}

/// The response head of a request (lowercased).
fn head(
    server: &Running,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    raw_http_with(server.addr(), method, path, headers, body)
}

#[test]
fn the_console_is_served_with_a_strict_policy_and_no_inline_script() {
    let a = Node::new();
    let server = a.serve_with(|c| c.tokens = console_tokens());
    let (status, h, body) = head(&server, "GET", "/ui/", &[], b"");
    assert_eq!(status, 200, "the page holds no data and needs no token");
    assert!(h.contains("content-type: text/html"), "{h}");
    let csp = h
        .lines()
        .find_map(|l| l.strip_prefix("content-security-policy: "))
        .unwrap_or_else(|| panic!("no policy: {h}"));
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
        "{csp}"
    );
    assert!(h.contains("x-content-type-options: nosniff"), "{h}");
    assert!(h.contains("x-frame-options: deny"), "{h}");
    let html = String::from_utf8(body).unwrap();
    // Every script is a file of this origin; no inline style or handler.
    let scripts = html.matches("<script").count();
    assert_eq!(
        scripts,
        html.matches("<script src=\"console.js\"").count(),
        "{html}"
    );
    for inline in [" style=", " onclick=", " onload=", "<style"] {
        assert!(!html.contains(inline), "inline {inline} in the page");
    }
    let (status, h, js) = head(&server, "GET", "/ui/console.js", &[], b"");
    assert_eq!(status, 200);
    assert!(h.contains("content-type: text/javascript"), "{h}");
    let js = String::from_utf8(js).unwrap();
    for sink in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
    ] {
        assert!(!js.contains(sink), "console.js uses {sink}");
    }
    assert_eq!(head(&server, "GET", "/ui/console.css", &[], b"").0, 200);
    assert_eq!(head(&server, "GET", "/ui/secrets.txt", &[], b"").0, 404);
    let (status, h, _) = head(&server, "GET", "/ui", &[], b"");
    assert_eq!(status, 308);
    assert!(h.contains("location: /ui/"), "{h}");
}

#[test]
fn the_login_cookie_is_same_origin_and_only_reads() {
    let a = Node::new();
    let (_, orders) = dead_letters(&a.store(), 2, 1);
    let server = a.serve_with(|c| c.tokens = console_tokens());
    let body = json!({"token": "admin-secret"}).to_string();
    let login = |origin: Option<&str>| {
        let mut h = vec![("content-type", JSON_CT)];
        if let Some(o) = origin {
            h.push(("origin", o));
        }
        head(&server, "POST", "/ui/login", &h, body.as_bytes())
    };
    // raw_http_with sends `host: test`.
    assert_eq!(login(None).0, 403, "no Origin");
    assert_eq!(login(Some("http://evil.example")).0, 403, "another origin");
    let (status, h, _) = login(Some("http://test"));
    assert_eq!(status, 204, "{h}");
    let cookie = h
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .unwrap_or_else(|| panic!("no cookie: {h}"));
    assert!(
        cookie.contains("httponly") && cookie.contains("samesite=strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_string();
    let wrong = json!({"token": "guess"}).to_string();
    let h = [("content-type", JSON_CT), ("origin", "http://test")];
    assert_eq!(
        head(&server, "POST", "/ui/login", &h, wrong.as_bytes()).0,
        401
    );

    // A cookie reads...
    let (status, _, _) = head(&server, "GET", "/v1/overview", &[("cookie", &pair)], b"");
    assert_eq!(status, 200);
    let other = "precedent_token=guess";
    assert_eq!(
        head(&server, "GET", "/v1/overview", &[("cookie", other)], b"").0,
        401
    );
    // ...but never redrives, even an admin's.
    let redrive = json!({"input": orders[0].hash().to_string()}).to_string();
    let h = [("content-type", JSON_CT), ("cookie", pair.as_str())];
    let (status, _, _) = head(
        &server,
        "POST",
        "/v1/queues/ship/redrive",
        &h,
        redrive.as_bytes(),
    );
    assert_eq!(status, 401);
    assert_eq!(a.store().queue_stats("ship").unwrap().dead, 1);
}

//! The JSON API of `precedent serve` over 127.0.0.1 (`docs/protocol.md`, "JSON API"): one
//! fact by hash, pushes in the JSON form, and `POST /v1/query`, on SQLite and
//! PostgreSQL.

mod common;
mod sync_support;

use common::shop::{order, shipment, shop};
use precedent::query::{Givens, Query};
use precedent::sync::server::Running;
use precedent::{Fact, FactHash};
use serde_json::{Value, json};
use sync_support::*;

const JSONL: &str = "application/jsonl";

/// The JSON form of a fact, as the server writes it, as a `serde_json` value.
fn form(f: &Fact) -> Value {
    serde_json::from_str(&precedent::json::to_json(f).to_string()).unwrap()
}

fn post_json(server: &Running, ct: &str, body: &str, token: Option<&str>) -> (u16, Value) {
    http(server, "POST", "/v1/facts", ct, body.as_bytes(), token)
}

fn array(facts: &[Fact]) -> String {
    Value::Array(facts.iter().map(form).collect()).to_string()
}

/// `GET /v1/facts/HASH` with an `Accept` header: status, head, body.
fn get_fact(server: &Running, hash: &str, accept: &str) -> (u16, String, Vec<u8>) {
    let path = format!("/v1/facts/{hash}");
    let headers: Vec<(&str, &str)> = if accept.is_empty() {
        vec![]
    } else {
        vec![("accept", accept)]
    };
    raw_http_with(server.addr(), "GET", &path, &headers, b"")
}

fn query(server: &Running, body: &Value, token: Option<&str>) -> (u16, String, Value) {
    let mut headers = vec![("content-type", JSON_CT)];
    let auth = token.map(|t| format!("Bearer {t}"));
    if let Some(a) = &auth {
        headers.push(("authorization", a));
    }
    let bytes = body.to_string();
    let (status, head, body) = raw_http_with(
        server.addr(),
        "POST",
        "/v1/query",
        &headers,
        bytes.as_bytes(),
    );
    let v = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&body)));
    (status, head, v)
}

/// Every result of a query, read through pages of `page_size` (all at once for `None`),
/// checking that each page says how many it holds and only the last has no `next`.
fn all_pages(server: &Running, text: &str, givens: &Value, page_size: Option<u64>) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10_000 {
        let mut req = json!({"query": text, "givens": givens});
        if let Some(n) = page_size {
            req["page_size"] = json!(n);
        }
        if let Some(a) = &after {
            req["after"] = json!(a);
        }
        let (status, head, v) = query(server, &req, None);
        assert_eq!(status, 200, "{text}: {v}");
        assert!(head.contains("content-type: application/json"), "{head}");
        let results = v["results"].as_array().unwrap();
        assert_eq!(v["count"], json!(results.len()));
        if let Some(n) = page_size {
            assert!(results.len() as u64 <= n);
        }
        out.extend(results.iter().cloned());
        match v["next"].as_str() {
            Some(next) => {
                assert_eq!(
                    results.len() as u64,
                    page_size.unwrap(),
                    "a short page has a next"
                );
                after = Some(next.to_string());
            }
            None => {
                assert!(v["next"].is_null());
                return out;
            }
        }
    }
    panic!("{text}: pages never end");
}

/// A shop with `n` orders, every third shipped, and a second shop with two orders.
fn workload(n: i64) -> (Fact, Vec<Fact>) {
    let s = shop("corner");
    let other = shop("far");
    let mut facts = vec![s.clone(), other.clone()];
    for i in 0..n {
        let o = Fact::builder("Shop.Order")
            .field("id", i)
            .field("total", (i * 37) % 11)
            .field("note", format!("order {i}"))
            .predecessor("shop", s.hash())
            .build()
            .unwrap();
        facts.push(o.clone());
        if i % 3 == 0 {
            facts.push(shipment(&o));
        }
    }
    facts.push(order(&other, "id", 1));
    facts.push(order(&other, "id", 2));
    (s, facts)
}

conformance! {
    fn facts_posted_as_json_read_back_by_hash(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve();
        let s = shop("corner");
        let orders: Vec<Fact> = (1..=3).map(|i| order(&s, "id", i)).collect();
        let mut facts = vec![s.clone()];
        facts.extend(orders.iter().cloned());
        let (status, report) = post_json(&server, JSON_CT, &array(&facts), None);
        assert_eq!(status, 200, "{report}");
        assert_eq!(
            (report["received"].as_u64(), report["inserted"].as_u64()),
            (Some(4), Some(4))
        );
        assert_eq!(report["rejected"], json!([]));
        for f in &facts {
            let (status, head, body) = get_fact(&server, &f.hash().to_string(), JSON_CT);
            assert_eq!(status, 200);
            assert!(head.contains("content-type: application/json"), "{head}");
            assert!(head.contains("x-content-type-options: nosniff"), "{head}");
            let got: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(got, form(f));
            assert_eq!(got["hash"], json!(f.hash().to_string()));
            // No Accept header: JSON too. Accept: application/cbor: the canonical bytes.
            let (_, _, plain) = get_fact(&server, &f.hash().to_string(), "");
            assert_eq!(serde_json::from_slice::<Value>(&plain).unwrap(), form(f));
            let (status, head, cbor) =
                get_fact(&server, &f.hash().to_string(), "application/cbor");
            assert_eq!(status, 200);
            assert!(head.contains("content-type: application/cbor\r\n"), "{head}");
            assert_eq!(cbor, f.canonical_bytes());
            assert_eq!(Fact::from_canonical(&cbor).unwrap().hash(), f.hash());
        }
        // Posting them again: duplicates, as JSON Lines.
        let lines: String = facts.iter().map(|f| format!("{}\n", form(f))).collect();
        let (status, report) = post_json(&server, "application/x-ndjson", &lines, None);
        assert_eq!((status, report["duplicates"].as_u64()), (200, Some(4)));
        // Absent, or not a full hash.
        let (status, _, body) = get_fact(&server, &FactHash([7; 32]).to_string(), JSON_CT);
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((status, body["error"].as_str()), (404, Some("not_found")));
        let prefix = &s.hash().to_string()[..12];
        let (status, _, body) = get_fact(&server, prefix, JSON_CT);
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((status, body["error"].as_str()), (400, Some("bad_request")));
    }

    fn a_held_fact_is_invisible_until_its_predecessor_is_posted(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve();
        let s = shop("corner");
        let o = order(&s, "id", 1);
        let (status, report) = post_json(&server, JSONL, &format!("{}\n", form(&o)), None);
        assert_eq!(status, 200, "{report}");
        assert_eq!(report["held"].as_u64(), Some(1));
        assert_eq!(report["missing"], json!([s.hash().to_string()]));
        let (status, _, _) = get_fact(&server, &o.hash().to_string(), JSON_CT);
        assert_eq!(status, 404, "a held fact is not served");
        let (status, report) = post_json(&server, JSON_CT, &array(std::slice::from_ref(&s)), None);
        assert_eq!(status, 200);
        assert_eq!(report["released"].as_u64(), Some(2), "{report}");
        let (status, _, body) = get_fact(&server, &o.hash().to_string(), JSON_CT);
        assert_eq!(status, 200);
        assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), form(&o));
    }

    fn bad_records_are_named_and_the_valid_ones_kept(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve();
        let s = shop("corner");
        let o = order(&s, "id", 1);
        let mut wrong_hash = form(&order(&s, "id", 2));
        wrong_hash["hash"] = json!(FactHash([1; 32]).to_string());
        let mut prefix = form(&order(&s, "id", 3));
        prefix["predecessors"]["shop"] = json!(&s.hash().to_string()[..10]);
        let body = format!(
            "[{}, {{\"type\": 5}}, {}, 3, {}, {{\"type\": \"X\", \"colour\": 1}}, {}]",
            form(&s),
            wrong_hash,
            prefix,
            form(&o)
        );
        let (status, report) = post_json(&server, JSON_CT, &body, None);
        assert_eq!(status, 200, "{report}");
        assert_eq!(report["received"].as_u64(), Some(7));
        assert_eq!(report["inserted"].as_u64(), Some(2));
        let rejected = report["rejected"].as_array().unwrap();
        let by_index: Vec<(u64, &str)> = rejected
            .iter()
            .map(|r| (r["index"].as_u64().unwrap(), r["reason"].as_str().unwrap()))
            .collect();
        assert_eq!(
            by_index.iter().map(|r| r.0).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5],
            "{report}"
        );
        assert!(by_index[0].1.contains("type: must be a string"), "{}", by_index[0].1);
        assert!(by_index[1].1.contains("hash"), "{}", by_index[1].1);
        assert!(by_index[2].1.contains("must be a JSON object"), "{}", by_index[2].1);
        assert!(by_index[3].1.contains("predecessors.shop"), "{}", by_index[3].1);
        assert!(by_index[4].1.contains("colour: unknown key"), "{}", by_index[4].1);
        assert!(rejected.iter().all(|r| r["reason"].as_str().unwrap().starts_with("json record: ")));
        let store = a.store();
        assert!(store.get(&s.hash()).unwrap().is_some());
        assert!(store.get(&o.hash()).unwrap().is_some());
        assert_eq!(store.max_seq().unwrap(), 2);
        assert_eq!(store.quarantine_count().unwrap(), 5);
        // JSON Lines: a line that is not JSON is one record, and the others stand; blank
        // lines are no records.
        let lines = format!("\n{}\n{{\"type\": \n\n{}\n", form(&order(&s, "id", 8)), form(&order(&s, "id", 9)));
        let (status, report) = post_json(&server, JSONL, &lines, None);
        assert_eq!(status, 200, "{report}");
        assert_eq!(report["received"].as_u64(), Some(3));
        assert_eq!(report["inserted"].as_u64(), Some(2));
        assert_eq!(report["rejected"][0]["index"].as_u64(), Some(1), "{report}");
        // An array that cannot be split: 400 naming the byte, and nothing stored.
        let before = store.max_seq().unwrap();
        let cut = format!("[{}, {{\"type\": \"S", form(&order(&s, "id", 10)));
        let (status, err) = post_json(&server, JSON_CT, &cut, None);
        assert_eq!((status, err["error"].as_str()), (400, Some("bad_request")), "{err}");
        assert!(err["message"].as_str().unwrap().contains("at byte"), "{err}");
        assert_eq!(store.max_seq().unwrap(), before);
        assert_eq!(store.quarantine_count().unwrap(), 6);
        // Another content type: 415.
        let (status, err) = post_json(&server, "text/plain", "[]", None);
        assert_eq!((status, err["error"].as_str()), (415, Some("unsupported_media_type")));
    }

    fn json_pushes_keep_the_push_limits(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve_with(|c| {
            c.limits.max_facts_per_request = 3;
            c.limits.max_body_bytes = 2000;
        });
        let s = shop("corner");
        let facts: Vec<Fact> = std::iter::once(s.clone())
            .chain((1..=3).map(|i| order(&s, "id", i)))
            .collect();
        let (status, err) = post_json(&server, JSON_CT, &array(&facts), None);
        assert_eq!((status, err["error"].as_str()), (413, Some("too_many_facts")), "{err}");
        let lines: String = facts.iter().map(|f| format!("{}\n", form(f))).collect();
        let (status, err) = post_json(&server, JSONL, &lines, None);
        assert_eq!((status, err["error"].as_str()), (413, Some("too_many_facts")), "{err}");
        let big = Fact::builder("Shop").field("name", "x".repeat(3000)).build().unwrap();
        let (status, err) = post_json(&server, JSON_CT, &array(&[big]), None);
        assert_eq!((status, err["error"].as_str()), (413, Some("body_too_large")), "{err}");
        let store = a.store();
        assert_eq!(store.max_seq().unwrap(), 0);
        assert_eq!(store.held_count().unwrap(), 0);
        assert_eq!(store.quarantine_count().unwrap(), 0);
        let (status, _) = post_json(&server, JSON_CT, &array(&facts[..3]), None);
        assert_eq!(status, 200);
        assert_eq!(store.max_seq().unwrap(), 3);
    }

    fn tokens_guard_the_json_endpoints(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve_with(|c| c.tokens = tokens());
        let s = shop("corner");
        let body = array(std::slice::from_ref(&s));
        let (status, err) = post_json(&server, JSON_CT, &body, None);
        assert_eq!((status, err["error"].as_str()), (401, Some("unauthorized")));
        let (status, err) = post_json(&server, JSON_CT, &body, Some("r-secret"));
        assert_eq!((status, err["error"].as_str()), (403, Some("forbidden")));
        let o = order(&s, "id", 1);
        let (status, err) = post_json(&server, JSON_CT, &array(&[s.clone(), o]), Some("s-secret"));
        assert_eq!((status, err["error"].as_str()), (403, Some("forbidden_type")));
        assert_eq!(a.store().max_seq().unwrap(), 0, "refused pushes store nothing");
        let (status, _) = post_json(&server, JSON_CT, &body, Some("w-secret"));
        assert_eq!(status, 200);
        let path = format!("/v1/facts/{}", s.hash());
        let get = |token: Option<&str>| http(&server, "GET", &path, "", b"", token).0;
        assert_eq!(get(None), 401);
        assert_eq!(get(Some("s-secret")), 403);
        assert_eq!(get(Some("r-secret")), 200);
        let q = json!({"query": "match s: Shop select s"});
        assert_eq!(query(&server, &q, None).0, 401);
        assert_eq!(query(&server, &q, Some("s-secret")).0, 403);
        let (status, _, v) = query(&server, &q, Some("r-secret"));
        assert_eq!((status, &v["results"]), (200, &json!([form(&s)])));
    }

    fn a_script_in_a_field_comes_back_as_the_exact_string(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve();
        let text = "</script><script>alert(\"x\")</script>\u{2028}&";
        let f = Fact::builder("Note").field("text", text).build().unwrap();
        let (status, _) = post_json(&server, JSON_CT, &array(std::slice::from_ref(&f)), None);
        assert_eq!(status, 200);
        let (status, head, body) = get_fact(&server, &f.hash().to_string(), "text/html,*/*");
        assert_eq!(status, 200);
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(head.contains("x-content-type-options: nosniff"), "{head}");
        let got: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(got["fields"]["text"], json!(text));
        // Escaped as JSON: the quotes inside are escaped, and the body is one JSON value.
        assert!(String::from_utf8(body).unwrap().contains(r#"alert(\"x\")"#));
        let (status, head, v) = query(&server, &json!({"query": "match n: Note select n.text"}), None);
        assert_eq!(status, 200);
        assert!(head.contains("x-content-type-options: nosniff"), "{head}");
        assert_eq!(v["results"], json!([text]));
    }

    fn query_results_equal_the_stores_over_every_page_size(backend: Backend) {
        let a = Node::on(backend);
        let (s, facts) = workload(40);
        a.store().insert_batch(facts).unwrap();
        let server = a.serve();
        let given = json!({"s": s.hash().to_string()});
        let queries = [
            "given s: Shop
             match o: Shop.Order where o->shop = s
               and not exists (match sh: Shop.Shipment where sh->order = o)
             select hash(o)",
            "given s: Shop
             match o: Shop.Order where o->shop = s
               and not exists (match sh: Shop.Shipment where sh->order = o)
             select o",
            "given s: Shop match o: Shop.Order where o->shop = s
             order by o.total desc, o.id select {id: o.id, total: o.total, at: seq(o)}",
            "given s: Shop match o: Shop.Order where o->shop = s
             order by o.note limit 17 select o.note",
            "given s: Shop match o: Shop.Order where o->shop = s and o.total >= 5
             select {order: hash(o), shipments: [match sh: Shop.Shipment where sh->order = o select hash(sh)]}",
        ];
        let store = a.store();
        let givens = Givens::from([("s".to_string(), s.hash())]);
        for text in queries {
            let q = Query::parse(text).unwrap();
            let want: Vec<Value> = store
                .query(&q, &givens)
                .unwrap()
                .iter()
                .map(|r| serde_json::from_str(&r.value.to_json().to_string()).unwrap())
                .collect();
            assert!(want.len() > 5, "{text}: a workload too small to page");
            for size in [None, Some(1), Some(3), Some(7), Some(1000)] {
                let got = all_pages(&server, text, &given, size);
                assert_eq!(got, want, "{text}, page_size {size:?}");
            }
        }
        // No given: every pending order of both shops.
        let text = "match o: Shop.Order
            where not exists (match sh: Shop.Shipment where sh->order = o)
            order by seq(o) desc select hash(o)";
        let want = store.query(&Query::parse(text).unwrap(), &Givens::new()).unwrap();
        assert_eq!(all_pages(&server, text, &json!({}), Some(4)).len(), want.len());
    }

    fn bad_queries_answer_400_with_the_parsers_place(backend: Backend) {
        let a = Node::on(backend);
        let s = shop("corner");
        a.store().insert(&s).unwrap();
        let server = a.serve();
        let (status, _, v) = query(&server, &json!({"query": "match o: Shop.Order\nselect o.id wat"}), None);
        assert_eq!((status, v["error"].as_str()), (400, Some("bad_query")), "{v}");
        assert!(v["message"].as_str().unwrap().contains("line 2, column"), "{v}");
        let text = "given s: Shop match o: Shop.Order where o->shop = s select o";
        let bad = [
            json!({"query": text}),
            json!({"query": text, "givens": {"s": "abc"}}),
            json!({"query": text, "givens": {"s": s.hash().to_string(), "t": s.hash().to_string()}}),
            json!({"query": text, "givens": {"s": s.hash().to_string()}, "page_size": 0}),
            json!({"query": text, "givens": {"s": s.hash().to_string()}, "after": "00"}),
            json!({"query": text, "colour": 1}),
        ];
        for body in &bad {
            let (status, _, v) = query(&server, body, None);
            assert_eq!((status, v["error"].as_str()), (400, Some("bad_request")), "{body}: {v}");
        }
        // A cursor of another query is refused.
        let o = order(&s, "id", 1);
        let o2 = order(&s, "id", 2);
        a.store().insert_batch(vec![o, o2]).unwrap();
        let g = json!({"s": s.hash().to_string()});
        let (_, _, v) = query(&server, &json!({"query": text, "givens": g, "page_size": 1}), None);
        let next = v["next"].as_str().unwrap().to_string();
        let other = "given s: Shop match o: Shop.Order where o->shop = s select hash(o)";
        let (status, _, v) = query(&server, &json!({"query": other, "givens": g, "after": next}), None);
        assert_eq!((status, v["error"].as_str()), (400, Some("bad_request")), "{v}");
        // A given bound to a fact of another type.
        let wrong = json!({"query": text, "givens": {"s": order(&s, "id", 1).hash().to_string()}});
        let (status, _, v) = query(&server, &wrong, None);
        assert_eq!(status, 400, "{v}");
        assert!(v["message"].as_str().unwrap_or_default().contains("Shop"), "{v}");
        // And so in a page (checked when the statement finds nothing).
        let mut paged = wrong.clone();
        paged["page_size"] = json!(1);
        let (status, _, v) = query(&server, &paged, None);
        assert_eq!(status, 400, "{v}");
    }
}

conformance! {
    /// Results past the per-request limit, in one answer: streamed in chunks.
    fn a_query_streams_more_than_100_000_results(backend: Backend) {
        let a = Node::on(backend);
        let s = shop("corner");
        let n = 100_500;
        let mut facts = vec![s.clone()];
        facts.extend((0..n).map(|i| order(&s, "id", i)));
        a.store().insert_batch(facts).unwrap();
        let server = a.serve();
        let req = json!({
            "query": "given s: Shop match o: Shop.Order where o->shop = s select hash(o)",
            "givens": {"s": s.hash().to_string()},
        });
        let (status, head, v) = query(&server, &req, None);
        assert_eq!(status, 200);
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        assert_eq!(v["count"].as_u64(), Some(n as u64));
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), n as usize);
        assert_eq!(results[0], json!(order(&s, "id", 0).hash().to_string()));
        assert!(v["next"].is_null());
    }
}

/// `n` orders of `s`, with ids from `from`.
fn orders(s: &Fact, from: i64, n: i64) -> Vec<Fact> {
    (from..from + n).map(|i| order(s, "id", i)).collect()
}

/// Asserts that each of `facts` is released after each of its predecessors.
fn parents_first(store: &precedent::Store, facts: &[Fact]) {
    for f in facts {
        let seq = store.seq_of(&f.hash()).unwrap().expect("released");
        for p in f.predecessor_hashes() {
            let before = store.seq_of(&p).unwrap().expect("its predecessor released");
            assert!(
                before < seq,
                "{} at {seq} after its predecessor at {before}",
                f.hash()
            );
        }
    }
}

// Pushes of at least 256 facts, which PostgreSQL stores as they are decoded
// (src/store/postgres/stream.rs): what cannot be written without a look-up (a new type,
// a child before its parent, a missing ancestor) is written after the stream, and a fact
// stored meanwhile by another process fails the stream, which is then written again.
conformance! {
    fn a_large_push_in_any_order_is_stored_as_one_batch(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve();
        let s = shop("corner");
        let mut first = vec![s.clone()];
        first.extend(orders(&s, 0, 299));
        let (status, r) = post_json(&server, JSON_CT, &array(&first), None);
        assert_eq!((status, r["inserted"].as_u64()), (200, Some(300)), "{r}");

        let new_orders = orders(&s, 1000, 100);
        let late_orders = orders(&s, 2000, 50);
        let refunds: Vec<Fact> = first[1..21]
            .iter()
            .map(|o| {
                Fact::builder("Shop.Refund")
                    .field("amount", 1)
                    .predecessor("order", o.hash())
                    .build()
                    .unwrap()
            })
            .collect();
        let ghost = shop("ghost");
        let orphans = orders(&ghost, 0, 5);
        let mut body: Vec<Fact> = new_orders[..50].to_vec();
        // Children before their parents.
        body.extend(late_orders.iter().map(shipment));
        // Stored by the first push.
        body.extend(first[100..150].iter().cloned());
        // A type the store has not seen.
        body.extend(refunds.iter().cloned());
        // Their shop is missing.
        body.extend(orphans.iter().cloned());
        body.extend(new_orders[50..].iter().cloned());
        body.extend(late_orders.iter().cloned());
        // Twice in the body.
        body.extend(new_orders[..10].iter().cloned());
        let (status, r) = post_json(&server, JSON_CT, &array(&body), None);
        assert_eq!(status, 200, "{r}");
        let counts = ["received", "inserted", "duplicates", "held", "released"]
            .map(|k| r[k].as_u64().unwrap());
        assert_eq!(counts, [285, 220, 60, 5, 220], "{r}");
        assert_eq!(r["missing"], json!([ghost.hash().to_string()]));
        assert_eq!(r["seqs"], json!([[301, 520]]), "{r}");
        let store = a.store();
        assert_eq!((store.max_seq().unwrap(), store.held_count().unwrap()), (520, 5));
        let released: Vec<Fact> = body.iter().filter(|f| !orphans.contains(f)).cloned().collect();
        parents_first(&store, &released);
        // With their edges: the shop's orders, each order's shipment and refunds.
        let of_shop = store.successors(&s.hash(), Some("shop"), Some("Shop.Order")).unwrap();
        assert_eq!(of_shop.len(), 299 + 100 + 50);
        for o in &late_orders {
            assert_eq!(store.successors(&o.hash(), None, None).unwrap(), vec![shipment(o)]);
        }
        for (o, refund) in first[1..21].iter().zip(&refunds) {
            assert_eq!(store.successors(&o.hash(), Some("order"), None).unwrap(), vec![refund.clone()]);
        }
        // The missing shop releases the five.
        let (status, r) = post_json(&server, JSON_CT, &array(&[ghost]), None);
        assert_eq!((status, r["released"].as_u64()), (200, Some(6)), "{r}");
        parents_first(&store, &orphans);
    }

    fn a_large_push_of_facts_another_process_stored_counts_them_once(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve();
        let s = shop("corner");
        let (status, _) = post_json(&server, JSON_CT, &array(&[s.clone(), order(&s, "id", -1)]), None);
        assert_eq!(status, 200);
        // Stored past the server, which has not seen them.
        let elsewhere = orders(&s, 500, 30);
        a.store().insert_batch(elsewhere.clone()).unwrap();
        let mut body = orders(&s, 0, 300);
        for (k, f) in elsewhere.iter().enumerate() {
            body.insert(k * 10 + 5, f.clone());
        }
        for round in 0..2 {
            let (status, r) = post_json(&server, JSON_CT, &array(&body), None);
            assert_eq!(status, 200, "{r}");
            let counts = ["received", "inserted", "duplicates"].map(|k| r[k].as_u64().unwrap());
            let expected = if round == 0 { [330, 300, 30] } else { [330, 0, 330] };
            assert_eq!(counts, expected, "round {round}: {r}");
            if round == 0 {
                assert_eq!(r["seqs"], json!([[33, 332]]), "{r}");
            }
        }
        let store = a.store();
        assert_eq!(store.max_seq().unwrap(), 332);
        parents_first(&store, &body);
    }

    fn a_large_push_of_many_new_types_is_stored_whole(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve();
        let s = shop("corner");
        // 20 types and 20 roles the store has not seen, each first met deep in the push.
        let mut body = vec![s.clone()];
        for i in 0..300 {
            let kind = i % 20;
            body.push(
                Fact::builder(format!("Shop.Kind{kind}"))
                    .field("n", i)
                    .predecessor(format!("shop{kind}"), s.hash())
                    .build()
                    .unwrap(),
            );
        }
        let (status, r) = post_json(&server, JSON_CT, &array(&body), None);
        assert_eq!(status, 200, "{r}");
        assert_eq!((r["inserted"].as_u64(), r["seqs"].clone()), (Some(301), json!([[1, 301]])), "{r}");
        let store = a.store();
        parents_first(&store, &body);
        for kind in 0..20 {
            let role = format!("shop{kind}");
            let of_kind = store.successors(&s.hash(), Some(&role), None).unwrap();
            assert_eq!(of_kind.len(), 15, "{role}");
            assert!(of_kind.iter().all(|f| f.type_name() == format!("Shop.Kind{kind}")));
        }
    }

    fn bad_records_in_a_large_push_are_quarantined_and_the_rest_kept(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve();
        let s = shop("corner");
        let (status, _) = post_json(&server, JSON_CT, &array(&[s.clone(), order(&s, "id", -1)]), None);
        assert_eq!(status, 200);
        let forms: Vec<String> = orders(&s, 0, 300).iter().map(|f| form(f).to_string()).collect();
        let mut records: Vec<String> = Vec::new();
        for (i, f) in forms.into_iter().enumerate() {
            if i % 100 == 50 {
                records.push("{\"type\": 5}".to_string());
            }
            records.push(f);
        }
        let (status, r) = post_json(&server, JSON_CT, &format!("[{}]", records.join(",")), None);
        assert_eq!(status, 200, "{r}");
        let counts = ["received", "inserted"].map(|k| r[k].as_u64().unwrap());
        assert_eq!(counts, [303, 300], "{r}");
        let at: Vec<u64> = r["rejected"].as_array().unwrap().iter().map(|x| x["index"].as_u64().unwrap()).collect();
        assert_eq!(at, vec![50, 151, 252], "{r}");
        assert_eq!(r["seqs"], json!([[3, 302]]), "{r}");
        let store = a.store();
        assert_eq!((store.max_seq().unwrap(), store.quarantine_count().unwrap()), (302, 3));
    }

    fn a_forbidden_type_late_in_a_large_push_stores_none_of_it(backend: Backend) {
        let a = Node::on(backend);
        let server = a.serve_with(|c| c.tokens = tokens());
        let (status, _) = post_json(&server, JSON_CT, &array(&[shop("first")]), Some("s-secret"));
        assert_eq!(status, 200);
        let mut body: Vec<Fact> = (0..300).map(|i| shop(&format!("shop {i}"))).collect();
        body.push(order(&body[0], "id", 1));
        let (status, err) = post_json(&server, JSON_CT, &array(&body), Some("s-secret"));
        assert_eq!((status, err["error"].as_str()), (403, Some("forbidden_type")), "{err}");
        assert_eq!(a.store().max_seq().unwrap(), 1, "refused pushes store nothing");
        body.pop();
        let (status, r) = post_json(&server, JSON_CT, &array(&body), Some("s-secret"));
        assert_eq!((status, r["inserted"].as_u64()), (200, Some(300)), "{r}");
    }
}

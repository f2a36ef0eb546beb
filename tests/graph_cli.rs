//! `precedent graph HASH` and `GET /v1/graph/HASH`: the neighbourhood of a fact, as dot
//! (parsed back here and compared with what the facts say), SVG and JSON; depth limits,
//! escaping, and a missing hash.

mod common;

use std::collections::BTreeSet;
use std::process::Output;

use common::bin::{code, run, run_ok, stderr, stdout};
use common::db::Db;
use common::process::Server;
use precedent::{Fact, FactHash};

/// A node of the graph as dot gives it: the id and its label.
type Nodes = BTreeSet<(String, String)>;
/// An edge: from, to, role.
type Edges = BTreeSet<(String, String, String)>;

/// The tokens of a dot text: quoted strings unescaped, `->`, punctuation, words.
fn tokens(text: &str) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '"' => {
                let mut s = String::new();
                loop {
                    match chars.next().expect("an unterminated string") {
                        '"' => break,
                        '\\' => match chars.next().expect("an escape") {
                            'n' => s.push('\n'),
                            c => s.push(c),
                        },
                        c => s.push(c),
                    }
                }
                out.push((true, s));
            }
            '-' if chars.peek() == Some(&'>') => {
                chars.next();
                out.push((false, "->".into()));
            }
            '{' | '}' | '[' | ']' | ';' | ',' | '=' => out.push((false, c.to_string())),
            c => {
                let mut s = c.to_string();
                while let Some(&n) = chars.peek() {
                    if n.is_alphanumeric() || n == '_' {
                        s.push(n);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push((false, s));
            }
        }
    }
    out
}

/// Parses `digraph NAME { stmt; ... }` into its nodes and edges (a small dot grammar:
/// attribute statements, node statements and edges with attribute lists).
fn parse_dot(text: &str) -> (Nodes, Edges) {
    let t = tokens(text);
    assert_eq!(t[0].1, "digraph", "{text}");
    assert_eq!(t[2].1, "{");
    assert_eq!(t.last().unwrap().1, "}");
    let body = &t[3..t.len() - 1];
    let (mut nodes, mut edges) = (Nodes::new(), Edges::new());
    for stmt in body.split(|(q, s)| !q && s == ";") {
        if stmt.is_empty() {
            continue;
        }
        let attrs = |from: usize| -> Vec<(String, String)> {
            let mut v = Vec::new();
            let Some(open) = stmt[from..].iter().position(|(q, s)| !q && s == "[") else {
                return v;
            };
            let list = &stmt[from + open + 1..stmt.len() - 1];
            for a in list.split(|(q, s)| !q && s == ",") {
                assert_eq!(a.len(), 3, "attribute {a:?}");
                assert_eq!(a[1].1, "=");
                v.push((a[0].1.clone(), a[2].1.clone()));
            }
            v
        };
        let label = |from| {
            attrs(from)
                .into_iter()
                .find(|(k, _)| k == "label")
                .map(|(_, v)| v)
        };
        match stmt {
            [(false, k), ..] if ["node", "edge", "graph"].contains(&k.as_str()) => {}
            [(false, _), (false, eq), _] if eq == "=" => {}
            [(true, a), (false, arrow), (true, b), ..] if arrow == "->" => {
                edges.insert((a.clone(), b.clone(), label(3).expect("an edge label")));
            }
            [(true, a), ..] => {
                nodes.insert((a.clone(), label(1).expect("a node label")));
            }
            other => panic!("not a statement: {other:?}"),
        }
    }
    (nodes, edges)
}

/// The nodes within `depth` of `center` and the predecessor edges between them,
/// computed from the facts themselves.
fn expected(facts: &[Fact], center: FactHash, depth: u32) -> (BTreeSet<String>, Edges) {
    let mut set = BTreeSet::from([center]);
    for up in [true, false] {
        let mut frontier = BTreeSet::from([center]);
        for _ in 0..depth {
            let mut next = BTreeSet::new();
            for f in facts {
                for h in &frontier {
                    let g = facts.iter().find(|x| x.hash() == *h).unwrap();
                    if up && g.predecessor_hashes().contains(&f.hash())
                        || !up && f.predecessor_hashes().contains(h)
                    {
                        next.insert(f.hash());
                    }
                }
            }
            set.extend(next.iter().copied());
            frontier = next;
        }
    }
    let mut edges = Edges::new();
    for f in facts.iter().filter(|f| set.contains(&f.hash())) {
        for (role, preds) in f.predecessors() {
            for p in preds.iter().filter(|p| set.contains(p)) {
                edges.insert((f.hash().to_string(), p.to_string(), role.clone()));
            }
        }
    }
    (set.iter().map(|h| h.to_string()).collect(), edges)
}

/// a and b at the top; c below a; d below a, b and c; e below d; f below e.
fn dag(note: &str) -> Vec<Fact> {
    let a = Fact::builder("Root").field("name", "a").build().unwrap();
    let b = Fact::builder("Root")
        .field("name", "b")
        .field("note", note)
        .build()
        .unwrap();
    let c = Fact::builder("Mid")
        .predecessor("p", a.hash())
        .build()
        .unwrap();
    let d = Fact::builder("Mid")
        .predecessor("p", a.hash())
        .predecessor("p", b.hash())
        .predecessor("q", c.hash())
        .build()
        .unwrap();
    let e = Fact::builder("Leaf")
        .predecessor("p", d.hash())
        .build()
        .unwrap();
    let f = Fact::builder("Leaf")
        .predecessor("p", e.hash())
        .build()
        .unwrap();
    vec![a, b, c, d, e, f]
}

const NOTE: &str = "<script>\"x\"</script> & 'q' \\N";

#[test]
fn dot_has_exactly_the_neighbourhood_at_each_depth() {
    let db = Db::init();
    let facts = dag(NOTE);
    db.store().insert_batch(facts.clone()).unwrap();
    let d = facts[3].hash();
    let mut sizes = Vec::new();
    for depth in [0, 1, 2, 3] {
        let out = run_ok(
            &db.path,
            &["graph", &d.to_string()[..12], "--depth", &depth.to_string()],
            b"",
        );
        let (nodes, edges) = parse_dot(&stdout(&out));
        let (want_nodes, want_edges) = expected(&facts, d, depth);
        let ids: BTreeSet<String> = nodes.iter().map(|(id, _)| id.clone()).collect();
        assert_eq!(ids, want_nodes, "depth {depth}");
        assert_eq!(edges, want_edges, "depth {depth}");
        // Each label names the type and the short hash.
        for (id, label) in &nodes {
            let f = facts.iter().find(|f| f.hash().to_string() == *id).unwrap();
            assert!(
                label.starts_with(&format!("{} {}", f.type_name(), &id[..8])),
                "{label}"
            );
        }
        sizes.push(ids.len());
    }
    // The depths do limit: d alone, then its parents and child, then everything.
    assert_eq!(sizes, [1, 5, 6, 6]);
}

#[test]
fn labels_with_markup_and_quotes_are_escaped_in_dot_svg_and_json() {
    let db = Db::init();
    let facts = dag(NOTE);
    db.store().insert_batch(facts.clone()).unwrap();
    let b = facts[1].hash().to_string();
    let dot = stdout(&run_ok(&db.path, &["graph", &b, "--depth", "1"], b""));
    let (nodes, _) = parse_dot(&dot);
    let label = &nodes.iter().find(|(id, _)| *id == b).unwrap().1;
    // The label read back by a dot parser holds the field's text exactly (as JSON).
    let as_json = serde_json::to_string(NOTE).unwrap();
    assert!(label.contains(&format!("note = {as_json}")), "{label}");

    // The layout of precedent's own: with no `dot` on the PATH.
    let svg = stdout(&graph_svg(&db.path, &b, Some(no_dot_path().path())));
    assert!(svg.starts_with("<svg "), "{svg}");
    assert!(!svg.to_ascii_lowercase().contains("<script"), "{svg}");
    assert!(
        svg.contains("&lt;script&gt;\\&quot;x\\&quot;&lt;/script&gt; &amp; &#39;q&#39; \\\\N"),
        "{svg}"
    );
    let (want, want_edges) = expected(&facts, facts[1].hash(), 2);
    assert_eq!(svg.matches("<g class=\"node\">").count(), want.len());
    assert_eq!(svg.matches("<g class=\"edge\">").count(), want_edges.len());
}

/// `precedent graph HASH --format svg`, with `path` as the PATH when given.
fn graph_svg(db: &std::path::Path, hash: &str, path: Option<&std::path::Path>) -> Output {
    let mut c = common::bin::cmd(db, &["graph", hash, "--format", "svg"]);
    if let Some(path) = path {
        c.env("PATH", path);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    out
}

/// A PATH of one empty folder, so that no `dot` can be found (removed when dropped).
fn no_dot_path() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Whether Graphviz's `dot` runs here. Under CI it must (`.ci/run` installs graphviz), so
/// the test of the Graphviz path cannot be skipped there.
fn have_dot() -> bool {
    let found = std::process::Command::new("dot")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but Graphviz's dot is not installed"
        );
        eprintln!("SKIPPED: Graphviz's dot is not installed; the dot-drawn SVG is not tested");
    }
    found
}

#[test]
fn svg_is_drawn_by_graphviz_when_dot_is_installed_with_labels_escaped() {
    if !have_dot() {
        return;
    }
    let db = Db::init();
    let facts = dag(NOTE);
    db.store().insert_batch(facts.clone()).unwrap();
    let b = facts[1].hash().to_string();
    let svg = stdout(&graph_svg(&db.path, &b, None));
    // Graphviz's SVG: its own header comment, one <g class="node"> group per fact of the
    // neighbourhood and one per edge, each node titled with its dot id (the full hash).
    assert!(svg.contains("Generated by graphviz"), "{svg}");
    let (want, want_edges) = expected(&facts, facts[1].hash(), 2);
    assert_eq!(svg.matches("class=\"node\"").count(), want.len(), "{svg}");
    assert_eq!(
        svg.matches("class=\"edge\"").count(),
        want_edges.len(),
        "{svg}"
    );
    for id in &want {
        assert!(svg.contains(&format!("<title>{id}</title>")), "{id}: {svg}");
    }
    // The field's markup is text in the drawing, never an element.
    assert!(!svg.to_ascii_lowercase().contains("<script"), "{svg}");
    assert!(svg.contains("&lt;script&gt;"), "{svg}");
    // And the same command without dot on the PATH falls back to precedent's layout.
    let own = stdout(&graph_svg(&db.path, &b, Some(no_dot_path().path())));
    assert!(own.starts_with("<svg ") && !own.contains("Generated by graphviz"));
}

#[test]
fn a_missing_hash_is_a_one_line_error_with_a_non_zero_exit() {
    let db = Db::init();
    let missing = "0".repeat(64);
    let out = run(&db.path, &["graph", &missing], b"");
    assert_ne!(code(&out), 0);
    let err = stderr(&out);
    assert!(err.contains(&missing[..8]), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(stdout(&out).is_empty());
}

#[test]
fn the_server_answers_the_same_graph_as_svg_dot_and_json() {
    let db = Db::init();
    let facts = dag(NOTE);
    db.store().insert_batch(facts.clone()).unwrap();
    let server = Server::start(&db.path);
    let d = facts[3].hash();
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let get = |q: &str| {
        let mut r = agent
            .get(format!("{}/v1/graph/{d}{q}", server.url))
            .call()
            .unwrap();
        let kind = r.headers()["content-type"].to_str().unwrap().to_string();
        (
            r.status().as_u16(),
            kind,
            r.body_mut().read_to_string().unwrap(),
        )
    };
    let (status, kind, svg) = get("");
    assert_eq!((status, kind.as_str()), (200, "image/svg+xml"));
    assert!(!svg.to_ascii_lowercase().contains("<script"));
    assert!(svg.contains("&lt;script&gt;"));
    let (_, _, dot) = get("?format=dot&depth=1");
    let cli = stdout(&run_ok(
        &db.path,
        &["graph", &d.to_string(), "--depth", "1"],
        b"",
    ));
    assert_eq!(dot, cli);
    let (_, kind, json) = get("?format=json&depth=2");
    assert_eq!(kind, "application/json");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let (want, want_edges) = expected(&facts, d, 2);
    let got: BTreeSet<String> = json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["hash"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(got, want);
    assert_eq!(json["edges"].as_array().unwrap().len(), want_edges.len());
    let (status, _, body) = get("?depth=99");
    assert_eq!(status, 400, "{body}");
    let (status, _, _) = get("?format=png");
    assert_eq!(status, 400);
    let missing = agent
        .get(format!("{}/v1/graph/{}", server.url, "0".repeat(64)))
        .call()
        .unwrap();
    assert_eq!(missing.status().as_u16(), 404);
}

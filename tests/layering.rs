//! The crate's layering, checked on its source: dependencies point one way.
//!
//! - The fact model, hashes and the canonical encoding are pure: they name no other layer.
//! - The fact core (`src/store/`) knows nothing of what is built on it: no file under it
//!   names `crate::queue`, `crate::sync` or `crate::query`.
//! - SQLite stays behind the seam: no file outside `src/store/` mentions `rusqlite`; the
//!   PostgreSQL driver is named only under `src/store/postgres/`.
//!
//! A check that reads text is coarse, so it is strict: a mention in a comment counts too.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn all_sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    assert!(files.len() > 30, "found only {} source files", files.len());
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            (rel, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// Files under `prefix` (or, with `inside == false`, outside it) that contain `needle`.
fn offenders(prefix: &str, inside: bool, needles: &[&str]) -> Vec<String> {
    all_sources()
        .into_iter()
        .filter(|(path, _)| path.starts_with(prefix) == inside)
        .flat_map(|(path, text)| {
            needles
                .iter()
                .filter(|n| text.contains(**n))
                .map(|n| format!("{path} names {n}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn the_store_knows_no_queue_sync_or_query() {
    let found = offenders(
        "src/store/",
        true,
        &["crate::queue", "crate::sync", "crate::query"],
    );
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn rusqlite_is_used_only_inside_the_store() {
    let found = offenders("src/store/", false, &["rusqlite"]);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn the_postgres_driver_is_used_only_by_its_backend() {
    // The driver's paths (`postgres::Client`, `tokio_postgres`), not the store's own
    // module (`self::postgres::`, `store::postgres::`) or the word in prose.
    let found: Vec<String> = all_sources()
        .into_iter()
        .filter(|(path, _)| !path.starts_with("src/store/postgres/"))
        .flat_map(|(path, text)| {
            let driver = text.match_indices("postgres::").any(|(i, _)| {
                let before = &text[..i];
                !(before.ends_with("self::") || before.ends_with("store::"))
            }) || text.contains("tokio_postgres");
            driver.then(|| format!("{path} names the postgres driver"))
        })
        .collect();
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn fact_hash_and_encoding_are_pure() {
    for file in [
        "src/fact.rs",
        "src/hash.rs",
        "src/encoding.rs",
        "src/predicate.rs",
    ] {
        let found = offenders(
            file,
            true,
            &[
                "crate::store",
                "crate::queue",
                "crate::sync",
                "crate::query",
                "crate::cli",
            ],
        );
        assert!(found.is_empty(), "{found:#?}");
    }
}

#[test]
fn the_checks_can_fail() {
    // The scan sees the files it checks: the seam names rusqlite in its SQLite backend,
    // and the queue index names the store it hooks into.
    assert!(!offenders("src/store/sqlite/", true, &["rusqlite"]).is_empty());
    assert!(!offenders("src/queue/", true, &["crate::store"]).is_empty());
}

/// An app shares one store across threads and tasks.
#[test]
fn a_store_is_send_and_sync() {
    fn shared<T: Send + Sync>() {}
    shared::<precedent::Store>();
    shared::<std::sync::Arc<precedent::Store>>();
}

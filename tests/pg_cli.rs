//! The core commands with `--db postgres://...` on a real cluster (tests/common/pg.rs):
//! `init`, `add`, `import`, `get`, `held`, `export`, `verify`, `stats`; and `serve` on
//! PostgreSQL with a SQLite node syncing against it.

mod common;

use std::path::Path;

use common::bin::{code, run, stderr, stdout};
use common::{chain, pg};
use precedent::json;
use serde_json::Value as Json;

fn ok(url: &str, args: &[&str], stdin: &[u8]) -> String {
    let out = run(Path::new(url), args, stdin);
    assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
    stdout(&out)
}

/// A chain of `n` links written last link first, as JSON Lines in `dir`.
fn reversed_chain(dir: &Path, n: usize) -> std::path::PathBuf {
    let mut links = chain(n);
    links.reverse();
    let lines: String = links
        .iter()
        .map(|f| json::to_json(f).to_string() + "\n")
        .collect();
    let file = dir.join("links.jsonl");
    std::fs::write(&file, &lines).unwrap();
    file
}

#[test]
fn the_core_commands_run_on_postgres() {
    let Some(db) = pg::db() else { return };
    let url = db.url.as_str();
    // A command that reads, on a database with no schema: refused, nothing created.
    let out = run(Path::new(url), &["stats"], b"");
    assert_ne!(code(&out), 0);
    assert!(stderr(&out).contains("precedent init"), "{}", stderr(&out));
    let init: Json = serde_json::from_str(&ok(url, &["--json", "init"], b"")).unwrap();
    assert_eq!(init["path"], url);
    let shop = ok(
        url,
        &["add", r#"{"type":"Shop","fields":{"name":"corner"}}"#],
        b"",
    );
    let shop = shop.trim();
    assert_eq!(shop.len(), 64);
    let got: Json = serde_json::from_str(&ok(url, &["--json", "get", &shop[..10]], b"")).unwrap();
    assert_eq!(got["fact"]["type"], "Shop", "{got}");
    assert_eq!(got["seq"], 1);

    // A chain given last link first: held until its root arrives, all in one import.
    let dir = tempfile::tempdir().unwrap();
    let file = reversed_chain(dir.path(), 30);
    let report: Json =
        serde_json::from_str(&ok(url, &["--json", "import", file.to_str().unwrap()], b"")).unwrap();
    assert_eq!(
        (report["inserted"].as_i64(), report["held"].as_i64()),
        (Some(30), Some(0))
    );
    assert_eq!(ok(url, &["--json", "held"], b""), "");

    // A fact waiting for one that never comes.
    let orphan = format!(
        r#"{{"type":"Orphan","fields":{{}},"predecessors":{{"p":"{}"}}}}"#,
        "ab".repeat(32)
    );
    let held: Json = serde_json::from_str(&ok(url, &["--json", "add", &orphan], b"")).unwrap();
    assert_eq!(held["outcome"], "held");
    assert_eq!(ok(url, &["--json", "held"], b"").lines().count(), 1);

    let export = ok(url, &["export"], b"");
    assert_eq!(export.lines().count(), 31);
    let stats: Json = serde_json::from_str(&ok(url, &["--json", "stats"], b"")).unwrap();
    assert_eq!(stats["released"], 31, "{stats}");
    assert_eq!(stats["held"], 1);
    assert_eq!(stats["per_type"]["Link"], 30);
    let verify = run(Path::new(url), &["verify"], b"");
    assert_eq!(code(&verify), 0, "{}", stderr(&verify));

    // A database that does not exist: `init` makes tables, not databases; it says how.
    let missing = format!("{}_missing", url);
    let out = run(Path::new(&missing), &["init"], b"");
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("does not exist") && err.contains("createdb"),
        "{err}"
    );

    // A server that is down: one line saying so, no password shown.
    let down = pg::down_url().replace("postgres@", "postgres:hunter2@");
    let out = run(Path::new(&down), &["stats"], b"");
    assert_eq!(code(&out), 4, "the exit code of a database error (README)");
    let err = stderr(&out);
    assert!(err.contains("server down"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn serve_on_postgres_syncs_both_ways_with_a_sqlite_node() {
    let Some(db) = pg::db() else { return };
    let url = db.url.as_str();
    ok(url, &["init"], b"");
    let hub_shop = ok(
        url,
        &["add", r#"{"type":"Shop","fields":{"name":"hub"}}"#],
        b"",
    );
    let server = common::process::Server::start(Path::new(url));

    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node.db");
    let node_url = node.to_str().unwrap();
    ok(node_url, &["init"], b"");
    let file = reversed_chain(dir.path(), 40);
    ok(node_url, &["import", file.to_str().unwrap()], b"");

    // One run pulls the hub's shop and pushes the node's chain.
    ok(node_url, &["sync", &server.url], b"");
    let on_hub = ok(url, &["export"], b"");
    let on_node = ok(node_url, &["export"], b"");
    let sorted = |text: &str| {
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        lines.join("\n")
    };
    assert_eq!(on_hub.lines().count(), 41, "{on_hub}");
    assert_eq!(sorted(&on_hub), sorted(&on_node));
    let got: Json =
        serde_json::from_str(&ok(node_url, &["--json", "get", hub_shop.trim()], b"")).unwrap();
    assert_eq!(got["fact"]["fields"]["name"], "hub", "{got}");
    let verify: Json = serde_json::from_str(&ok(url, &["--json", "verify"], b"")).unwrap();
    assert_eq!(
        (&verify["clean"], &verify["released"]),
        (&Json::Bool(true), &Json::from(41))
    );
    drop(server);
}

/// `serve` as a role that may only read (no `--read-only`): it starts and serves pulls
/// as it did before the warm-up of its first push, which such a role cannot run.
#[test]
fn serve_as_a_role_that_may_only_read_starts_and_serves_pulls() {
    let Some(db) = pg::db() else { return };
    let url = db.url.as_str();
    ok(url, &["init"], b"");
    ok(
        url,
        &["add", r#"{"type":"Shop","fields":{"name":"hub"}}"#],
        b"",
    );
    let role = format!("reader_{}", db.name);
    db.psql(&format!(
        "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA public TO {role};
         GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"
    ));
    let reader = url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    assert_ne!(reader, url);
    let server = common::process::Server::start(Path::new(&reader));
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node.db");
    let node_url = node.to_str().unwrap();
    ok(node_url, &["init"], b"");
    ok(node_url, &["sync", "--pull", &server.url], b"");
    assert_eq!(ok(node_url, &["export"], b"").lines().count(), 1);
    drop(server);
}

/// `precedent --db URL ARGS..` with libpq's variables `env` set (and the others cleared,
/// as for every test command).
fn with_env(url: &str, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = common::bin::cmd(Path::new(url), args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// What a URL leaves out comes from libpq's variables and password file, as for `psql`:
/// the password from `PGPASSWORD` or a private password file (one others may read is
/// passed over, and the refusal says so), the URL's own password first; a bare
/// `postgres://` from `PGHOST`, `PGPORT`, `PGUSER` and `PGDATABASE`.
#[test]
fn what_the_url_leaves_out_comes_from_libpqs_variables_and_password_file() {
    let Some(db) = pg::db() else { return };
    // Made by the password user, whose tables they are.
    let owner = db.url_with_password(pg::PASSWORD);
    ok(&owner, &["init"], b"");
    ok(&owner, &["add", r#"{"type":"Shop","fields":{}}"#], b"");
    let port = db.cluster.port.to_string();
    // The password user, over TCP, where its password is asked for.
    let url = format!(
        "postgres://{}@127.0.0.1:{port}/{}",
        pg::PASSWORD_USER,
        db.name
    );
    let released = |out: &std::process::Output| {
        assert_eq!(code(out), 0, "{}", stderr(out));
        let stats: Json = serde_json::from_str(&stdout(out)).unwrap();
        stats["released"].as_i64()
    };

    let out = with_env(&url, &["stats"], &[]);
    assert_eq!(code(&out), 4, "a database error (README)");
    let err = stderr(&out);
    assert!(
        err.contains("asks a password") && err.contains("PGPASSWORD") && err.contains(".pgpass"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let out = with_env(&url, &["--json", "stats"], &[("PGPASSWORD", pg::PASSWORD)]);
    assert_eq!(released(&out), Some(1));
    // A wrong one says where it came from, and is not shown.
    let out = with_env(&url, &["stats"], &[("PGPASSWORD", "hunter2")]);
    let err = stderr(&out);
    assert_eq!(code(&out), 4);
    assert!(
        err.contains("password refused") && err.contains("PGPASSWORD"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    // The URL's password comes first.
    let wrong_in_url = url.replace("pw_user@", "pw_user:wrong@");
    let out = with_env(&wrong_in_url, &["stats"], &[("PGPASSWORD", pg::PASSWORD)]);
    assert!(
        stderr(&out).contains("password refused"),
        "{}",
        stderr(&out)
    );

    // The password file: a line for another database, then the one that matches.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pgpass");
    std::fs::write(
        &file,
        format!(
            "127.0.0.1:{port}:other:{user}:wrong\n127.0.0.1:*:{}:{user}:{}\n",
            db.name,
            pg::PASSWORD,
            user = pg::PASSWORD_USER
        ),
    )
    .unwrap();
    let pass_file = [("PGPASSFILE", file.to_str().unwrap())];
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        released(&with_env(&url, &["--json", "stats"], &pass_file)),
        Some(1)
    );
    // Others may read it: not read, and the refusal says why.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = with_env(&url, &["stats"], &pass_file);
    assert_eq!(code(&out), 4);
    assert!(stderr(&out).contains("chmod 0600"), "{}", stderr(&out));

    // A bare URL: everything from the environment (the superuser, trusted on TCP).
    let bare = [
        ("PGHOST", "127.0.0.1"),
        ("PGPORT", port.as_str()),
        ("PGUSER", "postgres"),
        ("PGDATABASE", db.name.as_str()),
    ];
    assert_eq!(
        released(&with_env("postgres://", &["--json", "stats"], &bare)),
        Some(1)
    );
    // PGPORT is used only where the URL gives no port: here it gives one.
    let mut wrong_port = bare;
    wrong_port[1].1 = "1";
    let given = format!("postgres://postgres@127.0.0.1:{port}/{}", db.name);
    assert_eq!(
        released(&with_env(&given, &["--json", "stats"], &wrong_port)),
        Some(1)
    );
    let out = with_env("postgres://", &["stats"], &wrong_port);
    assert!(stderr(&out).contains("server down"), "{}", stderr(&out));
}

/// `demo` on a PostgreSQL URL with a password prints the commands to try with the
/// password hidden, as every message shows a URL, and says how to give it: a terminal
/// (and whatever records it) never sees the password.
#[test]
fn demo_on_a_url_with_a_password_prints_it_hidden() {
    let Some(db) = pg::db() else { return };
    let url = db.url_with_password(pg::PASSWORD);
    let out = ok(&url, &["demo"], b"");
    assert!(!out.contains(pg::PASSWORD), "{out}");
    assert!(
        out.contains(&format!("{}:***@", pg::PASSWORD_USER)),
        "{out}"
    );
    assert!(out.contains("PGPASSWORD"), "{out}");
}

//! TLS to PostgreSQL as libpq's `sslmode` says: a cluster with `ssl=on` and a certificate
//! made here by a CA of the test's own; `require` and `prefer` encrypt, `verify-full`
//! checks the chain and the host name, `verify-ca` the chain only, and a role that
//! `pg_hba.conf` admits over TLS only is refused in plain text, each with a one-line
//! message.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::pg::{self, PgDb, TLS_USER};
use precedent::store::SqlExt as _;
use precedent::{Error, Store};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// The certificate files of this binary's cluster, TLS turned on once.
struct Certs {
    /// The CA that signed the server's certificate (for 127.0.0.1 only).
    ca: PathBuf,
    /// Another CA, which signed nothing the server shows.
    other_ca: PathBuf,
    _dir: tempfile::TempDir,
}

/// A CA named `name`: its certificate (PEM) and what signs with it.
fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(params, key))
}

fn certs() -> Option<&'static Certs> {
    static CERTS: OnceLock<Option<Certs>> = OnceLock::new();
    CERTS
        .get_or_init(|| {
            let cluster = pg::cluster()?;
            let (ca_pem, issuer) = ca("precedent test ca");
            let (other_pem, _) = ca("another ca");
            let key = KeyPair::generate().unwrap();
            let server = CertificateParams::new(vec!["127.0.0.1".to_string()])
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            cluster.enable_tls(&server.pem(), &key.serialize_pem());
            let dir = tempfile::tempdir().unwrap();
            let (ca, other_ca) = (dir.path().join("ca.pem"), dir.path().join("other.pem"));
            std::fs::write(&ca, ca_pem).unwrap();
            std::fs::write(&other_ca, other_pem).unwrap();
            Some(Certs {
                ca,
                other_ca,
                _dir: dir,
            })
        })
        .as_ref()
}

/// A fresh database and the cluster's certificates, or `None` without PostgreSQL.
fn setup() -> Option<(PgDb, &'static Certs)> {
    let certs = certs()?;
    Some((pg::db()?, certs))
}

/// `db`'s URL for `user` at `host`, with `params`.
fn url(db: &PgDb, user: &str, host: &str, params: &str) -> String {
    format!(
        "postgres://{user}@{host}:{}/{}?{params}",
        db.cluster.port, db.name
    )
}

/// Whether the store's connection is encrypted, as the server sees it.
fn encrypted(store: &Store) -> bool {
    let on: i64 = store
        .read(|r| {
            r.query_one(
                "SELECT ssl::int FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
                |row| row.get(0),
            )
        })
        .unwrap();
    on == 1
}

/// The reason `Store::open` gives for refusing `url`: one line.
fn refused(url: &str) -> String {
    match Store::open(url) {
        Err(Error::Open { reason, .. }) => {
            assert!(!reason.contains('\n'), "{reason}");
            reason
        }
        Err(e) => panic!("expected an open error for {url}, got {e}"),
        Ok(_) => panic!("{url} connected"),
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn require_and_prefer_encrypt_and_disable_does_not() {
    let Some((db, _)) = setup() else { return };
    let require = Store::open(url(&db, "postgres", "127.0.0.1", "sslmode=require")).unwrap();
    assert!(encrypted(&require));
    let prefer = Store::open(url(&db, "postgres", "127.0.0.1", "sslmode=prefer")).unwrap();
    assert!(encrypted(&prefer));
    let plain = Store::open(url(&db, "postgres", "127.0.0.1", "sslmode=disable")).unwrap();
    assert!(!encrypted(&plain));
}

#[test]
fn verify_full_checks_the_chain_and_the_host_and_verify_ca_only_the_chain() {
    let Some((db, certs)) = setup() else { return };
    let (ca, other) = (path(&certs.ca), path(&certs.other_ca));
    let full = |host: &str, root: &str| {
        url(
            &db,
            "postgres",
            host,
            &format!("sslmode=verify-full&sslrootcert={root}"),
        )
    };
    let store = Store::open(full("127.0.0.1", ca)).unwrap();
    assert!(encrypted(&store));

    let reason = refused(&full("127.0.0.1", other));
    assert!(reason.to_lowercase().contains("tls"), "{reason}");
    assert!(reason.to_lowercase().contains("unknownissuer"), "{reason}");
    // The certificate names 127.0.0.1, not localhost.
    let reason = refused(&full("localhost", ca));
    assert!(reason.to_lowercase().contains("tls"), "{reason}");

    let verify_ca = url(
        &db,
        "postgres",
        "localhost",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    );
    assert!(encrypted(&Store::open(verify_ca).unwrap()));
    let wrong_ca = url(
        &db,
        "postgres",
        "localhost",
        &format!("sslmode=verify-ca&sslrootcert={other}"),
    );
    assert!(refused(&wrong_ca).to_lowercase().contains("tls"));
    // require with a root file checks the chain, as libpq does.
    let require = url(
        &db,
        "postgres",
        "127.0.0.1",
        &format!("sslmode=require&sslrootcert={other}"),
    );
    assert!(refused(&require).to_lowercase().contains("tls"));
}

#[test]
fn a_hostssl_only_role_is_refused_in_plain_text_and_admitted_over_tls() {
    let Some((db, _)) = setup() else { return };
    let reason = refused(&url(&db, TLS_USER, "127.0.0.1", "sslmode=disable"));
    assert!(reason.contains("no encryption"), "{reason}");
    assert!(reason.contains(TLS_USER), "{reason}");
    let store = Store::open(url(&db, TLS_USER, "127.0.0.1", "sslmode=require")).unwrap();
    assert!(encrypted(&store));
}

#[test]
fn bad_tls_parameters_are_refused_with_what_is_wrong() {
    let Some((db, certs)) = setup() else { return };
    let reason = refused(&url(&db, "postgres", "127.0.0.1", "sslmode=bogus"));
    assert!(reason.contains("sslmode \"bogus\""), "{reason}");
    let reason = refused(&url(
        &db,
        "postgres",
        "127.0.0.1",
        "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
    ));
    assert!(
        reason.contains("sslrootcert /nonexistent/ca.pem"),
        "{reason}"
    );
    let ca = path(&certs.ca);
    let reason = refused(&url(
        &db,
        "postgres",
        "127.0.0.1",
        &format!("sslrootcert={ca}&sslrootcert={ca}"),
    ));
    assert!(reason.contains("sslrootcert is given twice"), "{reason}");
    let reason = refused(&url(&db, "postgres", "127.0.0.1", &format!("sslkey={ca}")));
    assert!(
        reason.contains("sslcert and sslkey go together"),
        "{reason}"
    );
}

/// `sslrootcert=system` is the system's CA bundle, found as OpenSSL finds it (here
/// `SSL_CERT_FILE` names the test's CA), and means `verify-full`: a server whose chain
/// ends elsewhere and a host its certificate does not name are refused, and a weaker mode
/// is refused before connecting. Run through the command line, whose environment the
/// test sets.
#[test]
fn sslrootcert_system_is_the_systems_bundle_and_verify_full() {
    let Some((db, certs)) = setup() else { return };
    let Some(bin) = option_env!("CARGO_BIN_EXE_precedent") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "under CI the precedent binary (the `cli` feature) is built for this test"
        );
        eprintln!("SKIPPED: sslrootcert=system is tried through the binary (the `cli` feature)");
        return;
    };
    let run = |host: &str, params: &str, bundle: &Path, args: &[&str]| {
        let mut c = std::process::Command::new(bin);
        c.arg("--db")
            .arg(url(&db, "postgres", host, params))
            .args(args)
            .env("SSL_CERT_FILE", bundle)
            .env("PGPASSFILE", "/nonexistent/precedent-tests/pgpass")
            .env("XDG_CONFIG_HOME", "/nonexistent/precedent-tests")
            .env_remove("PRECEDENT_DB");
        for var in ["PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"] {
            c.env_remove(var);
        }
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let system = "sslrootcert=system";
    let (code, err) = run("127.0.0.1", system, &certs.ca, &["init"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = run("127.0.0.1", system, &certs.ca, &["stats"]);
    assert_eq!(code, Some(0), "{err}");

    let (code, err) = run("127.0.0.1", system, &certs.other_ca, &["stats"]);
    assert_eq!(code, Some(4), "{err}");
    assert!(err.to_lowercase().contains("unknownissuer"), "{err}");
    // verify-full: the certificate names 127.0.0.1, not localhost.
    let (code, err) = run("localhost", system, &certs.ca, &["stats"]);
    assert_eq!(code, Some(4), "{err}");
    assert!(err.to_lowercase().contains("tls"), "{err}");
    let weaker = format!("{system}&sslmode=require");
    let (code, err) = run("127.0.0.1", &weaker, &certs.ca, &["stats"]);
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("only verify-full"), "{err}");
}

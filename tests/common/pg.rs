//! A throwaway PostgreSQL cluster for the tests that run on PostgreSQL.
//!
//! Started once per test binary (the first [`db`] call): `initdb` into a temporary folder
//! as an unprivileged user (PostgreSQL refuses to run as root: under root the server runs
//! as the `postgres` system user of Debian's package, else `nobody`, with the folder given
//! to it), trust authentication on 127.0.0.1 and on a socket inside the folder, a free
//! port, `fsync=off`. Each test gets a fresh database of its own ([`db`]). The server is
//! stopped by its PID and the folder removed when the test process exits (`atexit`).
//!
//! Without PostgreSQL's binaries (`$PRECEDENT_PG_BINDIR`, else `pg_config --bindir`, else
//! the newest `/usr/lib/postgresql/*/bin`) [`db`]
//! prints a loud `SKIPPED: PostgreSQL not installed` line and returns `None`, so the test
//! returns early; with the environment variable `CI` set it panics instead: under CI a
//! skip is a failure.
//!
//! The harness needs no PostgreSQL driver: it creates databases and runs setup SQL with
//! `psql`, so any test binary can use it whatever the crate's features.
//!
//! ```ignore
//! let Some(db) = common::pg::db() else { return };
//! let store = Store::open_with(&db.url, StoreOptions::default())?;
//! ```

use std::io::Write as _;
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The role with a password, refused anything but scram-sha-256 on TCP (for the tests
/// of a wrong password).
pub const PASSWORD_USER: &str = "pw_user";
/// Its password.
pub const PASSWORD: &str = "s3cret";

/// The running cluster of this test process.
pub struct Cluster {
    /// The folder with PostgreSQL's programs.
    pub bindir: PathBuf,
    /// The temporary folder: data directory `data/`, sockets, log.
    pub dir: PathBuf,
    /// The TCP port on 127.0.0.1.
    pub port: u16,
    /// The uid and gid the server runs as (`None`: as this process).
    user: Option<(u32, u32)>,
    /// Its index in [`SERVER_PIDS`].
    slot: usize,
    server: Mutex<Option<Child>>,
}

/// A fresh database of one test, on the cluster.
pub struct PgDb {
    /// Its name.
    pub name: String,
    /// `postgres://postgres@127.0.0.1:PORT/NAME`.
    pub url: String,
    /// The cluster it is on.
    pub cluster: &'static Cluster,
}

impl PgDb {
    /// Runs `sql` on this database with `psql` (as the superuser) and returns what it
    /// printed, unaligned and without headers; panics if psql fails.
    pub fn psql(&self, sql: &str) -> String {
        self.cluster.psql(&self.name, sql)
    }

    /// The URL of this database for [`PASSWORD_USER`] with `password`, over TCP where
    /// the password is checked.
    pub fn url_with_password(&self, password: &str) -> String {
        format!(
            "postgres://{PASSWORD_USER}:{password}@127.0.0.1:{}/{}",
            self.cluster.port, self.name
        )
    }
}

/// The tests' server settings: no durability, for speed.
const TEST_SETTINGS: &[&str] = &[
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    "max_connections=300",
    "shared_buffers=32MB",
];

/// The server settings (`-c` options) of this process's cluster.
static SETTINGS: OnceLock<&'static [&'static str]> = OnceLock::new();

/// Starts this process's cluster with `settings` (`name=value`, as `postgres -c` takes
/// them) instead of the tests' (which turn durability off): a benchmark's. Only before
/// the first [`db`] or [`cluster`] call; returns whether it was.
pub fn use_settings(settings: &'static [&'static str]) -> bool {
    SETTINGS.set(settings).is_ok()
}

/// PIDs of the running servers (the shared cluster's, a private one's), for the exit
/// handler.
static SERVER_PIDS: [AtomicI32; 2] = [AtomicI32::new(0), AtomicI32::new(0)];
/// The folders to remove at exit.
static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A fresh, empty database on this process's cluster (started on first use), or `None`
/// (after a loud `SKIPPED` line on stderr) when PostgreSQL is not installed. Under `CI`
/// a missing PostgreSQL panics.
pub fn db() -> Option<PgDb> {
    Some(cluster()?.db())
}

impl Cluster {
    /// A fresh, empty database on this cluster.
    pub fn db(&'static self) -> PgDb {
        let cluster = self;
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "t{}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            fastrand::u32(..)
        );
        // Owned by the password user, so that it may create the schema too (PostgreSQL 15
        // lets only the owner create in `public`); the superuser may do anything anyway.
        cluster.psql(
            "postgres",
            &format!("CREATE DATABASE {name} OWNER {PASSWORD_USER}"),
        );
        PgDb {
            url: format!("postgres://postgres@127.0.0.1:{}/{name}", cluster.port),
            name,
            cluster,
        }
    }
}

/// This process's cluster, started on first call; `None` when PostgreSQL is not
/// installed (see [`db`]).
pub fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| match find_bindir() {
            Some(bindir) => Some(Cluster::start(bindir, 0)),
            None => {
                let line = "SKIPPED: PostgreSQL not installed (no pg_config --bindir, no \
                            /usr/lib/postgresql/*/bin): the PostgreSQL tests did not run";
                if std::env::var_os("CI").is_some() {
                    panic!("{line}; under CI that is a failure");
                }
                let _ = writeln!(std::io::stderr(), "\n*** {line} ***\n");
                None
            }
        })
        .as_ref()
}

/// A second cluster of this process, apart from the shared one of [`db`], for tests that
/// stop and restart their server ([`Cluster::stop`], [`Cluster::start_again`]) while the
/// other tests of the binary go on with theirs; started on first call. The tests that
/// use it share it: they take [`private_lock`] for their run. `None` when PostgreSQL is
/// not installed (after the same `SKIPPED` line as [`db`]).
pub fn private_cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    let bindir = cluster()?.bindir.clone();
    CLUSTER
        .get_or_init(|| Some(Cluster::start(bindir, 1)))
        .as_ref()
}

/// Held by a test for as long as it uses [`private_cluster`], so that one test's restart
/// does not land in another's run.
pub fn private_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A URL on which no server listens (a port just freed), for the tests of a server that
/// is down.
pub fn down_url() -> String {
    format!("postgres://postgres@127.0.0.1:{}/postgres", free_port())
}

fn find_bindir() -> Option<PathBuf> {
    let has = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    // `PRECEDENT_PG_BINDIR` picks the programs (and, naming a folder without them,
    // shows what a machine without PostgreSQL does).
    if let Some(d) = std::env::var_os("PRECEDENT_PG_BINDIR") {
        let d = PathBuf::from(d);
        return has(&d).then_some(d);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has(&d) {
            return Some(d);
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| Some(e.ok()?.path().join("bin")))
        .filter(|d| has(d))
        .collect();
    // The newest major version.
    found.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop()
}

/// A port of 127.0.0.1 free a moment ago (bound to port 0 and let go).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The uid and gid to run the server as when this process is root.
fn server_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    for name in [c"postgres", c"nobody"] {
        // SAFETY: a valid C string; the result is read at once, before any other
        // getpw* call (tests start the cluster under a OnceLock).
        let pw = unsafe { libc::getpwnam(name.as_ptr()) };
        if !pw.is_null() {
            // SAFETY: non-null, points to a passwd record.
            let pw = unsafe { &*pw };
            return Some((pw.pw_uid, pw.pw_gid));
        }
    }
    panic!("running as root, and neither a postgres nor a nobody user to run PostgreSQL as");
}

extern "C" fn stop_at_exit() {
    for pid in &SERVER_PIDS {
        let pid = pid.load(Ordering::SeqCst);
        if pid > 0 {
            stop_pid(pid);
        }
    }
    // PRECEDENT_PG_KEEP keeps the folders (and the servers' logs, with every failed
    // statement) for a look after a failure.
    if std::env::var_os("PRECEDENT_PG_KEEP").is_none() {
        for dir in DIRS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Immediate shutdown of the server `pid`, waiting up to 10 s for it to go.
fn stop_pid(pid: i32) {
    // SAFETY: signalling and reaping a child process by its pid.
    unsafe {
        libc::kill(pid, libc::SIGQUIT);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let mut status = 0;
            let r = libc::waitpid(pid, &mut status, libc::WNOHANG);
            if r == pid || (r < 0 && libc::kill(pid, 0) != 0) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}

fn chown_all(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
}

impl Cluster {
    fn start(bindir: PathBuf, slot: usize) -> Cluster {
        let dir = std::env::temp_dir().join(format!(
            "precedent-pg-{}-{:x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        DIRS.lock().unwrap().push(dir.clone());
        if slot == 0 {
            // SAFETY: registers a plain extern "C" function.
            unsafe { libc::atexit(stop_at_exit) };
        }
        let user = server_user();
        if let Some((uid, gid)) = user {
            chown_all(&dir, uid, gid);
        }
        let mut initdb = Command::new(bindir.join("initdb"));
        initdb
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .args(["--locale", "C"])
            .stdout(Stdio::null());
        as_user(&mut initdb, user);
        let out = initdb.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The password user on TCP needs its password; every other connection is trusted.
        std::fs::write(
            dir.join("data/pg_hba.conf"),
            format!(
                "local all all trust\n\
                 host all {PASSWORD_USER} 127.0.0.1/32 scram-sha-256\n\
                 host all all 127.0.0.1/32 trust\n"
            ),
        )
        .unwrap();
        let cluster = Cluster {
            bindir,
            dir,
            port: free_port(),
            user,
            slot,
            server: Mutex::new(None),
        };
        cluster.spawn();
        cluster.psql(
            "postgres",
            &format!("CREATE ROLE {PASSWORD_USER} LOGIN PASSWORD '{PASSWORD}'"),
        );
        cluster
    }

    /// Starts the server and waits until it takes connections.
    fn spawn(&self) {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .unwrap();
        if let Some((uid, gid)) = self.user {
            chown_all(&self.dir.join("server.log"), uid, gid);
        }
        let mut cmd = Command::new(self.bindir.join("postgres"));
        cmd.arg("-D")
            .arg(self.dir.join("data"))
            .arg("-k")
            .arg(&self.dir)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(
                SETTINGS
                    .get_or_init(|| TEST_SETTINGS)
                    .iter()
                    .flat_map(|s| ["-c", s]),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        as_user(&mut cmd, self.user);
        let child = cmd.spawn().expect("start postgres");
        SERVER_PIDS[self.slot].store(child.id() as i32, Ordering::SeqCst);
        *self.server.lock().unwrap() = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = Command::new(self.bindir.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            if let Some(status) = self
                .server
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "postgres exited ({status}) at start: {}",
                    std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not start in 60 s: {}",
                std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (immediate shutdown: as a crash would, every connection cut).
    pub fn stop(&self) {
        if let Some(child) = self.server.lock().unwrap().take() {
            SERVER_PIDS[self.slot].store(0, Ordering::SeqCst);
            stop_pid(child.id() as i32);
        }
    }

    /// Starts the server again after [`Cluster::stop`], on the same port.
    pub fn start_again(&self) {
        if self.server.lock().unwrap().is_none() {
            self.spawn();
        }
    }

    /// Runs `sql` on database `db` with `psql` as the superuser, over the socket;
    /// returns its output (unaligned, no headers); panics if psql fails.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new(self.bindir.join("psql"))
            .arg("-h")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string(), "-U", "postgres", "-d", db])
            .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

fn as_user(cmd: &mut Command, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
        // PostgreSQL reads its home, locale and temp settings from the environment.
        cmd.env("HOME", "/tmp").env_remove("PGDATA");
    }
}

/// The role that may connect over TCP only with TLS (`hostssl`; plain `host` rejected),
/// once [`Cluster::enable_tls`] ran.
pub const TLS_USER: &str = "tls_user";

impl Cluster {
    /// Turns TLS on (`ssl=on`, reloaded) with the server certificate and key given as PEM,
    /// and adds [`TLS_USER`], whom `pg_hba.conf` lets in over TCP with TLS only. Every
    /// other role may still connect in plain text.
    pub fn enable_tls(&self, cert_pem: &str, key_pem: &str) {
        let data = self.dir.join("data");
        for (name, pem) in [("server.crt", cert_pem), ("server.key", key_pem)] {
            let path = data.join(name);
            std::fs::write(&path, pem).unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
            if let Some((uid, gid)) = self.user {
                chown_all(&path, uid, gid);
            }
        }
        let hba = data.join("pg_hba.conf");
        let rest = std::fs::read_to_string(&hba).unwrap();
        std::fs::write(
            &hba,
            format!(
                "hostssl all {TLS_USER} 127.0.0.1/32 trust\n\
                 host all {TLS_USER} 127.0.0.1/32 reject\n{rest}"
            ),
        )
        .unwrap();
        self.psql(
            "postgres",
            &format!("CREATE ROLE {TLS_USER} LOGIN SUPERUSER"),
        );
        self.psql("postgres", "ALTER SYSTEM SET ssl = on");
        self.psql("postgres", "SELECT pg_reload_conf()");
        // The reload is asynchronous: wait (bounded) until the server says it is on.
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.psql("postgres", "SHOW ssl") != "on" {
            assert!(Instant::now() < deadline, "ssl did not turn on");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

//! Soak: three nodes syncing continuously while workers process a steady stream of inputs.
//!
//! Three `precedent serve` processes on 127.0.0.1, each on its own database, and three
//! `precedent sync --follow` processes in a ring (a follows b, b follows c, c follows a).
//! A producer thread writes `Soak.Job` facts to node a at a steady rate, each carrying its
//! write time in `t_ms`; two worker threads on node c claim the jobs as they arrive by
//! sync and complete them with `Soak.Done` facts (`Store::claim` / `complete_batch`),
//! which sync back around the ring. Measured: inputs completed/s, facts synced/s, queue
//! latency from write on a to completion on c (p50/p95/p99), the RSS of every process
//! sampled every few seconds (first, middle, last, max) and the database files' growth.
//!
//! `PRECEDENT_SOAK_SECONDS` (default 120) bounds the run and `PRECEDENT_SOAK_RATE`
//! (default 200 inputs/s) sets the stream:
//!
//!     cargo bench --bench soak
//!     PRECEDENT_SOAK_SECONDS=600 cargo bench --bench soak

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use precedent::{Fact, Store, json};

const BIN: &str = env!("CARGO_BIN_EXE_precedent");
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn cmd(db: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--db")
        .arg(db)
        .args(args)
        .env_remove("PRECEDENT_DB")
        .env_remove("PRECEDENT_TOKEN");
    c
}

fn run(db: &Path, args: &[&str]) {
    let out = cmd(db, args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `precedent serve` on a free port; returns the child and its URL.
fn serve(db: &Path) -> (Child, String) {
    let mut child = cmd(db, &["serve", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("serve exited").unwrap();
        if let Some(u) = line.strip_prefix("listening on ") {
            break u.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, url)
}

/// Resident set size of `pid` in KiB, from /proc/<pid>/status.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The database file plus its WAL, in bytes.
fn db_bytes(db: &Path) -> u64 {
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    [db.to_path_buf(), wal]
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum()
}

fn released(db: &Path) -> u64 {
    Store::open(db).unwrap().count_and_max_seq().unwrap().0
}

fn pct(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn main() {
    // `cargo bench` passes --bench; a filter naming another bench skips this one.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args
        .iter()
        .any(|a| !a.starts_with('-') && !"soak".contains(a.as_str()))
    {
        return;
    }
    let seconds = env_u64("PRECEDENT_SOAK_SECONDS", 120);
    let rate = env_u64("PRECEDENT_SOAK_RATE", 200).max(1);
    let dir = tempfile::tempdir().unwrap();
    let dbs: Vec<PathBuf> = ["a", "b", "c"]
        .iter()
        .map(|n| dir.path().join(format!("{n}.db")))
        .collect();
    for db in &dbs {
        run(db, &["init"]);
    }
    run(
        &dbs[2],
        &[
            "queue",
            "add",
            "jobs",
            "--input",
            "Soak.Job",
            "--done-by",
            "Soak.Done.job",
            "--lease",
            "30s",
        ],
    );
    let mut children: Vec<(String, Child)> = Vec::new();
    let mut urls = Vec::new();
    for (i, db) in dbs.iter().enumerate() {
        let (child, url) = serve(db);
        children.push((format!("serve {}", ["a", "b", "c"][i]), child));
        urls.push(url);
    }
    for i in 0..3 {
        let next = (i + 1) % 3;
        let child = cmd(&dbs[i], &["sync", &urls[next], "--follow"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let names = ["a", "b", "c"];
        children.push((format!("sync {}->{}", names[i], names[next]), child));
    }
    eprintln!(
        "soak: {seconds} s, {rate} inputs/s to a, workers on c, ring a->b->c->a ({})",
        urls.join(" ")
    );

    let stop = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(AtomicU64::new(0));
    let completed = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::<i64>::new()));

    // Producer: batches every 20 ms, so the stream is steady at `rate`.
    let producer = {
        let (db, stop, produced) = (dbs[0].clone(), stop.clone(), produced.clone());
        std::thread::spawn(move || {
            let store = Store::open(&db).unwrap();
            let started = Instant::now();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
                let t = now_ms();
                let batch: Vec<Fact> = (n..due)
                    .map(|i| {
                        Fact::builder("Soak.Job")
                            .field("n", i as i64)
                            .field("t_ms", t)
                            .field("payload", "p".repeat(100))
                            .build()
                            .unwrap()
                    })
                    .collect();
                if !batch.is_empty() {
                    store.insert_batch(batch).unwrap();
                    produced.store(due, Ordering::Relaxed);
                    n = due;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    // Workers on c: claim what has arrived, complete a claim in one transaction.
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (db, stop) = (dbs[2].clone(), stop.clone());
            let (completed, latencies) = (completed.clone(), latencies.clone());
            std::thread::spawn(move || {
                let store = Store::open(&db).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let leases = store.claim("jobs", 64).unwrap();
                    if leases.is_empty() {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    let results = store
                        .complete_batch(&leases, |w, lease| {
                            w.insert(&lease.completion().field("by", "soak").build()?)
                                .map(|_| ())
                        })
                        .unwrap();
                    let done = now_ms();
                    let mut l = latencies.lock().unwrap();
                    for (lease, r) in leases.iter().zip(&results) {
                        r.as_ref().unwrap();
                        let t = json::to_json(&lease.input)["fields"]["t_ms"]
                            .as_i64()
                            .unwrap();
                        l.push(done - t);
                    }
                    completed.fetch_add(leases.len() as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();

    // Sampling: RSS of every process, file sizes, released counts.
    let me = std::process::id();
    let mut names: Vec<String> = children.iter().map(|(n, _)| n.clone()).collect();
    names.push("bench (producer+workers)".into());
    let pids: Vec<u32> = children.iter().map(|(_, c)| c.id()).chain([me]).collect();
    let mut rss: Vec<Vec<u64>> = vec![Vec::new(); pids.len()];
    let mut sizes: Vec<Vec<u64>> = vec![Vec::new(); 3];
    let started = Instant::now();
    let released0: Vec<u64> = dbs.iter().map(|d| released(d)).collect();
    loop {
        for (i, pid) in pids.iter().enumerate() {
            rss[i].push(rss_kib(*pid));
        }
        for (i, db) in dbs.iter().enumerate() {
            sizes[i].push(db_bytes(db));
        }
        let el = started.elapsed();
        eprintln!(
            "  {:>4.0} s: produced {} completed {} released a/b/c {:?}",
            el.as_secs_f64(),
            produced.load(Ordering::Relaxed),
            completed.load(Ordering::Relaxed),
            dbs.iter().map(|d| released(d)).collect::<Vec<_>>()
        );
        if el >= Duration::from_secs(seconds) {
            break;
        }
        std::thread::sleep(SAMPLE_EVERY.min(Duration::from_secs(seconds) - el));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let released1: Vec<u64> = dbs.iter().map(|d| released(d)).collect();
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    for w in workers {
        w.join().unwrap();
    }
    // Let the ring drain, then check all three hold the same facts.
    let drain = Instant::now();
    let converged = loop {
        let counts: Vec<u64> = dbs.iter().map(|d| released(d)).collect();
        if counts.iter().all(|c| *c == counts[0]) {
            break Some(counts[0]);
        }
        if drain.elapsed() > Duration::from_secs(60) {
            eprintln!("not converged after 60 s: {counts:?}");
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let drain_s = drain.elapsed().as_secs_f64();
    for (_, c) in &mut children {
        // SIGTERM by pid: serve and sync stop cleanly on it.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    }
    for (_, c) in &mut children {
        c.wait().unwrap();
    }
    for db in &dbs {
        let out = cmd(db, &["verify"]).output().unwrap();
        assert!(out.status.success(), "verify {}", db.display());
    }

    let produced = produced.load(Ordering::Relaxed);
    let completed = completed.load(Ordering::Relaxed);
    let mut lat = latencies.lock().unwrap().clone();
    lat.sort_unstable();
    let synced: u64 = released1
        .iter()
        .zip(&released0)
        .skip(1)
        .map(|(a, b)| a - b)
        .sum::<u64>()
        + (released1[0] - released0[0]).saturating_sub(produced);
    println!("\n## soak: {seconds} s at {rate} inputs/s, three nodes in a ring\n");
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| inputs written (a) | {produced} ({:.0}/s) |",
        produced as f64 / elapsed
    );
    println!(
        "| inputs completed (c) | {completed} ({:.0}/s) |",
        completed as f64 / elapsed
    );
    println!(
        "| facts synced in (b, c, and a's Done facts) | {synced} ({:.0}/s) |",
        synced as f64 / elapsed
    );
    println!(
        "| queue latency write on a -> completion on c | p50 {} ms, p95 {} ms, p99 {} ms, max {} ms |",
        pct(&lat, 0.50),
        pct(&lat, 0.95),
        pct(&lat, 0.99),
        lat.last().copied().unwrap_or(0)
    );
    println!(
        "| converged after stop | {} in {drain_s:.1} s |",
        converged.map_or("NO".to_string(), |c| format!("{c} facts on each node"))
    );
    println!("\n| process | RSS first | mid | last | max (MiB) |");
    println!("|---|---|---|---|---|");
    for (i, n) in names.iter().enumerate() {
        let r = &rss[i];
        println!(
            "| {n} | {} | {} | {} | {} |",
            mib(r[0]),
            mib(r[r.len() / 2]),
            mib(*r.last().unwrap()),
            mib(*r.iter().max().unwrap())
        );
    }
    println!("\n| database | first | mid | last (MiB, file + WAL) | bytes per fact |");
    println!("|---|---|---|---|---|");
    for (i, n) in ["a", "b", "c"].iter().enumerate() {
        let s = &sizes[i];
        let last = *s.last().unwrap();
        println!(
            "| {n} | {:.1} | {:.1} | {:.1} | {:.0} |",
            s[0] as f64 / 1048576.0,
            s[s.len() / 2] as f64 / 1048576.0,
            last as f64 / 1048576.0,
            last as f64 / released1[i].max(1) as f64
        );
    }
    assert!(converged.is_some(), "the three nodes did not converge");
}

//! Helpers shared by the benchmarks that run `precedent` as a child process: settings
//! from the environment, reaping a child with its resource use, its peak memory, and a
//! `serve` on a free port.
#![allow(dead_code)] // each benchmark uses only some of them

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

/// The `precedent` binary of this build.
pub const BIN: &str = env!("CARGO_BIN_EXE_precedent");

/// The 1-minute load average, for the record: other work on the machine moves the figures.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// A whole number from the environment (`_` allowed as a separator), if set.
pub fn env_num(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .map(|s| s.trim().replace('_', "").parse().expect("a whole number"))
}

/// How a child ended.
pub struct Exit {
    /// It exited with status 0.
    pub ok: bool,
    /// `ru_maxrss` in MB. Linux carries the spawning process's resident size across
    /// `exec` into it, so it is an upper bound; [`peak_mb`] reads the child's own.
    pub maxrss_mb: f64,
    /// User and system CPU seconds.
    pub cpu_secs: f64,
}

/// Waits for a child.
pub fn reap(child: Child) -> Exit {
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4 failed");
    std::mem::forget(child); // reaped above
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Exit {
        ok: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        maxrss_mb: usage.ru_maxrss as f64 / 1024.0,
        cpu_secs: secs(usage.ru_utime) + secs(usage.ru_stime),
    }
}

/// The peak resident memory of a running process so far, in MB: `VmHWM` of its own
/// address space; `None` once it has exited.
pub fn peak_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())?;
    Some(kb / 1024.0)
}

/// Watches a child's peak memory until it exits (every 10 ms; the high-water mark only
/// grows, so the last reading is the peak up to its last 10 ms).
pub fn watch_peak(pid: u32) -> JoinHandle<f64> {
    std::thread::spawn(move || {
        let mut peak = 0.0f64;
        while let Some(mb) = peak_mb(pid) {
            peak = peak.max(mb);
            std::thread::sleep(Duration::from_millis(10));
        }
        peak
    })
}

/// `precedent --db DB serve` on a free port of 127.0.0.1 (DB a file or a `postgres://`
/// URL); the child and its URL.
pub fn serve(db: impl AsRef<std::ffi::OsStr>) -> (Child, String) {
    let mut child = Command::new(BIN)
        .arg("--db")
        .arg(db.as_ref())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    // Keep draining: a closed pipe would fail the server's next line to stderr.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_string();
    (child, url)
}

/// `s` percent-encoded for a URL's query: every byte but ASCII letters and digits.
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

//! Every example a new user is shown runs as printed against a fresh demo database: each
//! `Example:` in the `--help` of every command and subcommand, every `precedent` line of
//! README.md's `sh` blocks and every `precedent ...` code span of its prose, and the
//! commands `precedent demo` suggests at its end.
//!
//! Each runs through `sh -c`, in a temporary directory where `precedent demo` has just
//! built `./precedent.db`, with the binary under test first on `PATH`. A command must exit
//! 0, print no `warning:` and, unless [`SILENT`] lists it, print something on stdout.
//! Commands that run until interrupted are run bounded, each as [`LONG_RUNNING`] says;
//! nothing is skipped.

mod common;

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::bin::BIN;
use serde_json::Value as Json;

/// Examples that run until interrupted, matched by a part of their text, and how each is
/// run instead of waiting for it.
const LONG_RUNNING: &[(&str, &str)] = &[
    (
        " serve",
        "serves until SIGINT/SIGTERM: started in the background (its `&`), on a free port in \
         place of 7341 throughout its block so that parallel runs cannot collide; the block's \
         later lines use it; at the block's end SIGTERM must stop it with exit 0",
    ),
    (
        "--follow",
        "syncs until SIGINT/SIGTERM: must still run after 2 s, then SIGTERM must stop it \
         with exit 0, having reported no error on stderr",
    ),
    (
        " watch ",
        "prints changes until interrupted: its first line must be a JSON `added` change, \
         then it is killed",
    ),
];

/// Examples whose stdout is empty by design, with the reason.
const SILENT: &[(&str, &str)] = &[(
    " work ",
    "a worker reports each input on stderr; stdout is left to nothing",
)];

/// Lines of README.md's `sh` blocks that are not `precedent` commands, with the reason
/// this test does not run them.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "cargo run --release -- demo",
        "builds the binary first; the demo itself runs before every example here",
    ),
    ("cargo test", "runs the tests, this one among them"),
];

/// How long an example that should finish may take.
const PATIENCE: Duration = Duration::from_secs(60);

/// A temporary directory holding a fresh demo database, `./precedent.db`.
struct Sandbox {
    dir: tempfile::TempDir,
    path: OsString,
}

impl Sandbox {
    fn new() -> Sandbox {
        Sandbox::with("precedent demo")
    }

    /// A sandbox where `demo`, a `precedent ... demo` command, has run.
    fn with(demo: &str) -> Sandbox {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(BIN, bin.join("precedent")).unwrap();
        let mut path = bin.into_os_string();
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        let sandbox = Sandbox { dir, path };
        let out = sandbox.run(demo);
        assert!(out.status.success(), "{demo}: {}", text(&out.stderr));
        sandbox
    }

    /// `sh -c LINE` in the sandbox, with the environment cleared of anything that could
    /// point a command at another database or peer.
    fn sh(&self, line: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(line)
            .current_dir(self.dir.path())
            .env("PATH", &self.path)
            // Examples may write under the home directory, and read a config file there:
            // the sandbox is their home, so they touch no one's own.
            .env("HOME", self.dir.path())
            .env("XDG_CONFIG_HOME", self.dir.path().join(".config"))
            .env_remove("PRECEDENT_CONFIG")
            .env_remove("PRECEDENT_DB")
            .env_remove("PRECEDENT_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Runs `line` to its end, failing the test if it takes longer than [`PATIENCE`].
    fn run(&self, line: &str) -> Output {
        let mut child = self.sh(line).spawn().unwrap();
        let readers = [
            child.stdout.take().unwrap().boxed(),
            child.stderr.take().unwrap().boxed(),
        ]
        .map(|mut r| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = r.read_to_end(&mut buf);
                buf
            })
        });
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > PATIENCE {
                let _ = child.kill();
                panic!(
                    "{line:?} did not finish in {PATIENCE:?}: a command that runs until \
                     interrupted must be listed in LONG_RUNNING"
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let [stdout, stderr] = readers.map(|t| t.join().unwrap());
        Output {
            status,
            stdout,
            stderr,
        }
    }
}

trait Boxed {
    fn boxed(self) -> Box<dyn Read + Send>;
}

impl<R: Read + Send + 'static> Boxed for R {
    fn boxed(self) -> Box<dyn Read + Send> {
        Box::new(self)
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn listed<'a>(list: &'a [(&str, &str)], line: &str) -> Option<&'a str> {
    list.iter()
        .find(|(part, _)| line.contains(part))
        .map(|(part, _)| *part)
}

/// Runs one example that finishes, and checks what it printed.
fn check_finishing(sandbox: &Sandbox, line: &str) {
    let out = sandbox.run(line);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "{line:?} exited {:?}: {stderr}",
        out.status.code()
    );
    assert!(!stderr.contains("warning:"), "{line:?}: {stderr}");
    // A line ending in `> FILE` (a plain word, not a comparison inside a query's quotes)
    // redirects what it prints to FILE.
    let redirect = line
        .rsplit_once(" > ")
        .map(|(_, file)| file.trim())
        .filter(|file| !file.is_empty() && !file.contains([' ', '\'', '"']));
    if let Some(file) = redirect {
        let written = std::fs::read(sandbox.dir.path().join(file)).unwrap_or_default();
        assert!(!written.is_empty(), "{line:?} wrote nothing to {file}");
    } else if listed(SILENT, line).is_none() {
        assert!(!stdout.trim().is_empty(), "{line:?} printed nothing");
    }
    if line.contains("precedent query") {
        // A query that matches nothing reads as an answer but shows nothing.
        assert!(!stderr.starts_with("0 results"), "{line:?}: {stderr}");
        assert!(stdout.lines().count() >= 2, "{line:?}: {stdout}");
    }
}

/// Sends SIGTERM to `child` and waits (bounded) for its exit code.
fn terminate(child: &mut Child, line: &str) -> Option<i32> {
    // SAFETY: kill(2) on the id of a child this test spawned and has not yet waited for.
    let r = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(r, 0, "cannot signal {line:?}");
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("{line:?} did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first line `r` yields within `limit`, read on a thread of its own.
fn first_line(r: impl Read + Send + 'static, limit: Duration, what: &str) -> String {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what}: no line within {limit:?}"))
}

/// Runs the lines of one block in order on a fresh demo database.
fn run_block(lines: &[String]) {
    run_block_after("precedent demo", lines)
}

/// Runs the lines of one block in order in a fresh sandbox where `demo` has run.
fn run_block_after(demo: &str, lines: &[String]) {
    let sandbox = Sandbox::with(demo);
    let mut servers: Vec<(Child, String)> = Vec::new();
    for line in lines {
        match listed(LONG_RUNNING, line) {
            None => check_finishing(&sandbox, line),
            Some(" serve") => {
                let line = line.trim_end().trim_end_matches('&').trim_end();
                let mut child = sandbox.sh(&format!("exec {line}")).spawn().unwrap();
                let said = first_line(child.stderr.take().unwrap(), Duration::from_secs(30), line);
                assert!(said.starts_with("listening on "), "{line:?}: {said}");
                servers.push((child, line.to_string()));
            }
            Some("--follow") => {
                let mut child = sandbox.sh(&format!("exec {line}")).spawn().unwrap();
                std::thread::sleep(Duration::from_secs(2));
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "{line:?} ended by itself"
                );
                assert_eq!(terminate(&mut child, line), Some(0), "{line:?}");
                // It retries a failed round, saying so on stderr: a sync that never
                // reached its peer would pass the checks above.
                let mut said = String::new();
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut said)
                    .unwrap();
                assert!(!said.contains("error"), "{line:?}: {said}");
            }
            Some(_watch) => {
                let mut child = sandbox.sh(&format!("exec {line}")).spawn().unwrap();
                let said = first_line(child.stdout.take().unwrap(), Duration::from_secs(30), line);
                let change: Json =
                    serde_json::from_str(&said).unwrap_or_else(|e| panic!("{line:?}: {e}: {said}"));
                assert_eq!(change["change"], "added", "{line:?}: {said}");
                assert!(!change["result"].is_null(), "{line:?}: {said}");
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    for (mut child, line) in servers {
        assert_eq!(terminate(&mut child, &line), Some(0), "{line:?}");
    }
}

/// A port of 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `precedent PATH.. --help`.
fn help(path: &[String]) -> String {
    let out = Command::new(BIN).args(path).arg("--help").output().unwrap();
    assert!(
        out.status.success(),
        "{path:?} --help: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The subcommands a help text lists under `Commands:`, without `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect()
}

/// Every command path and its `--help`, the top level first.
fn all_help() -> Vec<(Vec<String>, String)> {
    let mut todo = vec![Vec::<String>::new()];
    let mut out = Vec::new();
    while let Some(path) = todo.pop() {
        let text = help(&path);
        for sub in subcommands(&text) {
            let mut p = path.clone();
            p.push(sub);
            todo.push(p);
        }
        out.push((path, text));
    }
    out
}

/// The examples of one help text: what follows each `Example: `, and any line that
/// starts with `precedent `.
fn help_examples(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in help.lines() {
        if let Some(at) = line.find("Example: ") {
            out.push(line[at + "Example: ".len()..].trim().to_string());
        } else if line.trim_start().starts_with("precedent ") {
            out.push(line.trim().to_string());
        }
    }
    out
}

/// The `sh` blocks of README.md, each as its `precedent` lines.
fn readme_blocks() -> Vec<Vec<String>> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in readme.lines() {
        let trimmed = line.trim();
        match current.as_mut() {
            None if trimmed == "```sh" => current = Some(Vec::new()),
            None => {}
            Some(_) if trimmed == "```" => blocks.push(current.take().unwrap()),
            Some(block) => {
                if trimmed.is_empty() || trimmed.starts_with('#') {
                    continue;
                }
                if trimmed.starts_with("precedent ") {
                    block.push(trimmed.to_string());
                } else {
                    // What is not run is listed, with its reason.
                    let command = trimmed.split(" #").next().unwrap().trim();
                    assert!(
                        NOT_RUN.iter().any(|(l, _)| *l == command),
                        "README.md sh line {trimmed:?} is neither a precedent command nor in NOT_RUN"
                    );
                }
            }
        }
    }
    assert!(current.is_none(), "an unclosed sh block in README.md");
    blocks.retain(|b| !b.is_empty());
    blocks
}

/// The commands `demo` suggests after "Try these".
fn demo_suggestions(demo: &str) -> Vec<String> {
    let sandbox = Sandbox::new();
    let out = sandbox.run(demo);
    assert!(out.status.success());
    text(&out.stdout)
        .lines()
        .skip_while(|l| !l.starts_with("Try these"))
        .skip(1)
        .map(str::trim)
        .filter(|l| l.starts_with("precedent "))
        .map(String::from)
        .collect()
}

#[test]
fn every_help_example_runs_against_the_demo_database() {
    let all = all_help();
    // The walk reached the nested groups, so their examples are among those run.
    let paths: Vec<String> = all.iter().map(|(p, _)| p.join(" ")).collect();
    for nested in ["queue add", "poison queue list", "dlq show", "work"] {
        assert!(paths.iter().any(|p| p == nested), "{nested}: {paths:?}");
    }
    let mut examples = Vec::new();
    for (path, text) in &all {
        for e in help_examples(text) {
            assert!(e.starts_with("precedent "), "{path:?}: {e}");
            examples.push(e);
        }
    }
    for expected in [
        "precedent add ",
        "precedent query ",
        "precedent watch ",
        "precedent queue add ",
        "precedent work ",
        "precedent dlq show ",
    ] {
        assert!(
            examples.iter().any(|e| e.starts_with(expected)),
            "no {expected:?} example among {examples:?}"
        );
    }
    for e in &examples {
        run_block(std::slice::from_ref(e));
    }
}

/// The inline code spans of README.md's prose (outside fenced blocks) that are
/// `precedent` commands.
fn readme_inline_commands() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let mut fenced = false;
    let mut out = Vec::new();
    for line in readme.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Odd pieces between backticks are code spans.
        for span in line.split('`').skip(1).step_by(2) {
            if span.starts_with("precedent ") {
                out.push(span.to_string());
            }
        }
    }
    out
}

#[test]
fn every_readme_command_runs_against_the_demo_database() {
    let inline = readme_inline_commands();
    assert!(inline.iter().any(|c| c == "precedent demo"), "{inline:?}");
    for line in &inline {
        run_block(std::slice::from_ref(line));
    }
    let blocks = readme_blocks();
    let lines: usize = blocks.iter().map(Vec::len).sum();
    assert!(blocks.len() >= 3 && lines >= 10, "{blocks:?}");
    for block in blocks {
        let port = free_port().to_string();
        let block: Vec<String> = block.iter().map(|l| l.replace("7341", &port)).collect();
        run_block(&block);
    }
}

#[test]
fn every_command_the_demo_suggests_runs_as_printed() {
    // On the default database, and on one whose path the suggestions must quote.
    for (demo, program) in [
        ("precedent demo", "precedent "),
        (
            "precedent --db 'my shop.db' demo",
            "precedent --db 'my shop.db' ",
        ),
    ] {
        let suggested = demo_suggestions(demo);
        assert!(suggested.len() >= 5, "{suggested:?}");
        for line in &suggested {
            assert!(line.starts_with(program), "{demo}: {line}");
            run_block_after(demo, std::slice::from_ref(line));
        }
    }
}

#[test]
fn the_demo_names_the_hashes_the_examples_use() {
    // The shop and order #5 have fixed content: the prefixes in --help and README.md
    // are theirs in every demo database.
    let sandbox = Sandbox::new();
    let shop = sandbox.run("precedent --json get 1d1b48e0");
    assert!(shop.status.success(), "{}", text(&shop.stderr));
    let shop: Json = serde_json::from_slice(&shop.stdout).unwrap();
    assert_eq!(shop["fact"]["type"], "Shop");
    assert_eq!(shop["fact"]["fields"]["name"], "Corner Books");
    let order = sandbox.run("precedent --json get 592a3a2d");
    assert!(order.status.success(), "{}", text(&order.stderr));
    let order: Json = serde_json::from_slice(&order.stdout).unwrap();
    assert_eq!(order["fact"]["type"], "Shop.Order");
    assert_eq!(order["fact"]["fields"]["number"], 5);
    let dead = sandbox.run("precedent --json dlq list ship");
    assert!(dead.status.success(), "{}", text(&dead.stderr));
    assert!(
        text(&dead.stdout).contains(order["fact"]["hash"].as_str().unwrap()),
        "{}",
        text(&dead.stdout)
    );
    let demo = sandbox.run("precedent demo");
    let said = text(&demo.stdout);
    assert!(said.contains("shop Corner Books (1d1b48e0)"), "{said}");
}

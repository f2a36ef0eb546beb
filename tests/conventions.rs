//! The conventions a new user expects of the binary (issue 16, item 8): logs on stderr
//! through `-v`/`-q`/`RUST_LOG`, the access log of `serve`, colour only when asked or on a
//! terminal, shell completions and a man page, durations as `1m30s`, one `--json`
//! convention, and the `precedent.toml` config file.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod common;

use common::bin::{Db, code, stderr, stdout};

/// A `precedent serve` child with its stderr lines sent to a channel.
struct Serve {
    child: Child,
    addr: String,
    lines: mpsc::Receiver<String>,
}

impl Serve {
    /// `precedent FLAGS serve --listen 127.0.0.1:0 SERVE_FLAGS`.
    fn start(db: &Db, flags: &[&str], serve_flags: &[&str]) -> Serve {
        let mut args = flags.to_vec();
        args.extend(["serve", "--listen", "127.0.0.1:0"]);
        args.extend_from_slice(serve_flags);
        let mut child = db
            .cmd(&args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let err = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut serve = Serve {
            child,
            addr: String::new(),
            lines,
        };
        let first = serve.next_line().expect("serve printed nothing");
        serve.addr = first
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .to_string();
        serve
    }

    /// The next stderr line, or `None` after 10 s or at the end.
    fn next_line(&self) -> Option<String> {
        self.lines.recv_timeout(Duration::from_secs(10)).ok()
    }

    /// A plain HTTP/1.1 GET; returns the whole answer's bytes.
    fn get(&self, path: &str) -> Vec<u8> {
        self.request("GET", path, "", "", &[])
    }

    /// A plain HTTP/1.1 request, `headers` each ending in CRLF; returns the whole answer.
    fn request(&self, method: &str, path: &str, ct: &str, headers: &str, body: &[u8]) -> Vec<u8> {
        let mut tcp = TcpStream::connect(&self.addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            tcp,
            "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             content-type: {ct}\r\n{headers}content-length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        tcp.write_all(body).unwrap();
        let mut out = Vec::new();
        tcp.read_to_end(&mut out).unwrap();
        out
    }

    /// SIGTERMs the server and returns the rest of what it wrote to stderr.
    fn stop(mut self) -> Vec<String> {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert!(self.child.wait().unwrap().success());
        // The reader thread may still be passing on the last lines when the child is
        // reaped: read until it ends (at the pipe's end), for at most 10 s per line.
        let mut rest = Vec::new();
        while let Some(line) = self.next_line() {
            rest.push(line);
        }
        rest
    }
}

/// The body length of an HTTP answer (what follows the blank line).
fn body_len(answer: &[u8]) -> usize {
    let at = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    answer.len() - at - 4
}

#[test]
fn serve_logs_one_access_line_per_request_with_status_duration_and_bytes() {
    let db = Db::new();
    db.ok(&["init"]);
    let serve = Serve::start(&db, &[], &[]);
    let warning = serve.next_line().unwrap();
    assert!(
        warning.contains("WARN") && warning.contains("no --tokens"),
        "{warning}"
    );
    let answer = serve.get("/v1/health");
    let line = serve.next_line().expect("an access line");
    assert!(line.contains("INFO"), "{line}");
    assert!(line.contains("precedent::access"), "{line}");
    assert!(line.contains("GET /v1/health 200"), "{line}");
    assert!(
        line.contains(&format!("bytes={}", body_len(&answer))),
        "{line}"
    );
    let ms = line
        .split("duration_ms=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|d| d.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no duration in {line:?}"));
    assert!((0.0..10_000.0).contains(&ms), "{line}");
    serve.get("/no/such/endpoint");
    let line = serve.next_line().expect("an access line");
    assert!(line.contains("GET /no/such/endpoint 404"), "{line}");
    let rest = serve.stop();
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:?}");
    assert!(
        !rest.iter().any(|l| l.contains("\x1b[")),
        "no colour into a pipe"
    );
}

#[test]
fn quiet_serve_logs_nothing_but_the_address() {
    let db = Db::new();
    db.ok(&["init"]);
    let serve = Serve::start(&db, &["-q"], &[]);
    serve.get("/v1/health");
    std::thread::sleep(Duration::from_millis(200));
    let rest = serve.stop();
    assert!(rest.is_empty(), "{rest:?}");
}

#[test]
fn verbosity_flags_and_rust_log_choose_what_is_logged() {
    let db = Db::new();
    db.ok(&["init"]);
    let run = |args: &[&str], rust_log: Option<&str>| {
        let mut c = db.cmd(args);
        c.env_remove("RUST_LOG").env_remove("NO_COLOR");
        if let Some(v) = rust_log {
            c.env("RUST_LOG", v);
        }
        let out = c.output().unwrap();
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        assert!(stdout(&out).contains("released"), "stdout unchanged");
        stderr(&out)
    };
    // The debug line every command logs as it opens the database.
    let opening = "opening the database";
    assert_eq!(run(&["stats"], None), "", "quiet by default");
    assert_eq!(run(&["-v", "stats"], None), "", "-v is info");
    assert!(run(&["-vv", "stats"], None).contains(opening));
    assert!(run(&["stats"], Some("debug")).contains(opening));
    assert!(run(&["stats"], Some("precedent=debug")).contains(opening));
    assert_eq!(run(&["stats"], Some("precedent=info")), "");
    assert_eq!(
        run(&["-q", "stats"], Some("debug")),
        "",
        "-q wins over RUST_LOG"
    );
    assert!(
        run(&["-vv", "stats"], Some("error")).contains(opening),
        "-v too"
    );
    let out = db.run(&["-q", "-v", "stats"]);
    assert_eq!(code(&out), 2, "-q and -v conflict");
}

#[test]
fn colour_only_when_asked_or_on_a_terminal_and_never_with_no_color() {
    let db = Db::new();
    db.ok(&["init"]);
    let run = |args: &[&str], no_color: Option<&str>| {
        let mut c = db.cmd(args);
        c.env_remove("RUST_LOG").env_remove("NO_COLOR");
        if let Some(v) = no_color {
            c.env("NO_COLOR", v);
        }
        stderr(&c.output().unwrap())
    };
    let plain = run(&["-vv", "stats"], None);
    assert!(
        plain.contains("DEBUG") && !plain.contains('\x1b'),
        "{plain:?}"
    );
    let always = run(&["-vv", "--color", "always", "stats"], None);
    assert!(always.contains("\x1b["), "{always:?}");
    let never = run(&["-vv", "--color", "never", "stats"], None);
    assert!(!never.contains('\x1b'), "{never:?}");
    // An explicit --color always still wins over NO_COLOR, as no-color.org says.
    assert!(run(&["-vv", "--color", "always", "stats"], Some("1")).contains("\x1b["));
    assert_eq!(code(&db.run(&["--color", "sometimes", "stats"])), 2);
    // On a terminal, `auto` colours unless NO_COLOR is set (to anything but "").
    let tty = |no_color: Option<&str>| {
        let mut c = db.cmd(&["-vv", "stats"]);
        c.env_remove("RUST_LOG").env_remove("NO_COLOR");
        if let Some(v) = no_color {
            c.env("NO_COLOR", v);
        }
        stderr_on_a_terminal(c)
    };
    let coloured = tty(None);
    assert!(
        coloured.contains("DEBUG") && coloured.contains("\x1b["),
        "{coloured:?}"
    );
    let plain = tty(Some("1"));
    assert!(
        plain.contains("DEBUG") && !plain.contains('\x1b'),
        "{plain:?}"
    );
    assert!(
        tty(Some("")).contains("\x1b["),
        "an empty NO_COLOR is unset"
    );
}

/// Runs `c` with its stderr on a new pseudo-terminal; returns what it wrote there.
fn stderr_on_a_terminal(mut c: std::process::Command) -> String {
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut master, mut slave) = (0, 0);
    let made = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(made, 0, "openpty");
    let mut master = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(master) });
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave));
    let mut child = c.spawn().unwrap();
    drop(c); // the parent's copy of the terminal's other end
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        // Linux answers EIO once every holder of the other end has closed it.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    });
    assert!(child.wait().unwrap().success());
    reader.join().unwrap()
}

#[test]
fn completions_for_every_shell_name_the_commands_and_flags() {
    let db = Db::new();
    for (shell, marker) in [
        ("bash", "complete -F _precedent"),
        ("zsh", "#compdef precedent"),
        ("fish", "complete -c precedent"),
        ("elvish", "edit:completion:arg-completer[precedent]"),
        ("powershell", "Register-ArgumentCompleter"),
    ] {
        let script = db.ok(&["completions", shell]);
        assert!(script.contains(marker), "{shell}: {marker:?} missing");
        for word in ["queue", "serve", "max-held", "done-by"] {
            assert!(script.contains(word), "{shell}: {word:?} missing");
        }
    }
    assert!(!db.path.exists(), "completions opens no database");
    // The bash script is valid bash.
    let script = db.ok(&["completions", "bash"]);
    let file = db.path.with_file_name("precedent.bash");
    std::fs::write(&file, script).unwrap();
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(&file)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", stderr(&check));
    assert_eq!(code(&db.run(&["completions", "tcsh"])), 2);
}

#[test]
fn man_prints_the_top_page_or_writes_one_page_per_command() {
    let db = Db::new();
    let page = db.ok(&["man"]);
    assert!(page.contains(".TH precedent 1"), "{page}");
    assert!(page.contains(".SH NAME") && page.contains(".SH SUBCOMMANDS"));
    assert!(page.contains("completions") && page.contains("queue"));
    let dir = db.path.with_file_name("man");
    let listed = db.ok(&["man", "--dir", dir.to_str().unwrap()]);
    let add = dir.join("precedent-queue-add.1");
    assert!(
        listed.lines().any(|l| l == add.to_str().unwrap()),
        "{listed}"
    );
    let text = std::fs::read_to_string(&add).unwrap();
    assert!(text.contains(".TH precedent-queue-add 1"), "{text}");
    assert!(text.contains("done\\-by"), "{text}");
    let top = std::fs::read_to_string(dir.join("precedent.1")).unwrap();
    assert!(top == page, "the top page is the same either way");
    let pages = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(pages, listed.lines().count());
    assert!(pages > 30, "one page per command and subcommand: {pages}");
}

/// The status code of an HTTP answer.
fn status_of(answer: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(answer);
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn durations_take_humantime_forms_and_old_forms_keep_working() {
    let db = Db::new();
    db.ok(&["init"]);
    let declare = |name: &str, flags: &[&str]| {
        let mut args = vec!["queue", "add", name, "--input", "T", "--done-by", "D.t"];
        args.extend_from_slice(flags);
        db.run(&args)
    };
    let out = declare(
        "a",
        &[
            "--lease",
            "1m30s",
            "--max-age",
            "2h 15m",
            "--backoff-base",
            "250ms",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let q = db.json(&["queue", "show", "a"]);
    assert_eq!(q["queue"]["lease_ms"], 90_000);
    assert_eq!(q["queue"]["retry"]["max_age_ms"], 8_100_000);
    assert_eq!(q["queue"]["retry"]["backoff_base_ms"], 250);
    // Every form accepted before still means what it did.
    let out = declare(
        "b",
        &["--lease", "30s", "--max-age", "2d", "--backoff-cap", "5m"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let q = db.json(&["queue", "show", "b"]);
    assert_eq!(q["queue"]["lease_ms"], 30_000);
    assert_eq!(q["queue"]["retry"]["max_age_ms"], 172_800_000);
    assert_eq!(q["queue"]["retry"]["backoff_cap_ms"], 300_000);
    // A number without a unit was refused for these flags, and still is, with examples.
    let out = declare("c", &["--lease", "30"]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("1m30s"), "{}", stderr(&out));
    // The text form of queue stats prints ages as durations, not raw milliseconds.
    let text = db.ok(&["queue", "stats", "a"]);
    assert!(text.contains("oldest ready 0s;"), "{text}");
    // `watch --interval` takes a duration; the old `--interval-ms N` still works.
    for flags in [["--interval", "1s"], ["--interval-ms", "20"]] {
        let mut args = vec!["watch", "match t: T select t"];
        args.extend(flags);
        let mut child = db.cmd(&args).stdout(Stdio::null()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(child.try_wait().unwrap().is_none(), "{flags:?} refused");
        child.kill().unwrap();
        child.wait().unwrap();
    }
    assert_eq!(
        code(&db.run(&["watch", "match t: T select t", "--interval", "fast"])),
        2
    );
}

#[test]
fn serve_request_timeout_takes_a_duration_or_bare_seconds() {
    let db = Db::new();
    db.ok(&["init"]);
    // The server reports the limits it runs with, the request timeout among them.
    let limits = |serve: &Serve| -> serde_json::Value {
        let answer = serve.get("/v1/health");
        let text = String::from_utf8_lossy(&answer);
        let body = &text[text.find("\r\n\r\n").expect("a whole answer") + 4..];
        serde_json::from_str::<serde_json::Value>(body).unwrap()["limits"].clone()
    };
    // 300ms: a long-poll pull that asks to wait 5 s is cut short below the timeout (a long
    // poll waits at most half a timeout under two seconds) and answers an empty page.
    let fast = Serve::start(&db, &["-q"], &["--request-timeout", "300ms"]);
    let l = limits(&fast);
    assert_eq!(l["request_timeout_ms"], 300, "{l}");
    assert_eq!(l["max_wait_ms"], 150, "{l}");
    let started = std::time::Instant::now();
    let answer = fast.get("/v1/facts?after=0&wait_ms=5000");
    assert_eq!(
        status_of(&answer),
        200,
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(started.elapsed() < Duration::from_secs(4));
    drop(fast.stop());
    // A bare number is seconds, as before: 2 s outlasts a 300 ms wait.
    let slow = Serve::start(&db, &["-q"], &["--request-timeout", "2"]);
    assert_eq!(limits(&slow)["request_timeout_ms"], 2_000);
    let answer = slow.get("/v1/facts?after=0&wait_ms=300");
    assert_eq!(
        status_of(&answer),
        200,
        "{}",
        String::from_utf8_lossy(&answer)
    );
    drop(slow.stop());
    let out = db.run(&["serve", "--request-timeout", "soon"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

#[test]
fn tables_print_instants_as_rfc3339_utc() {
    let db = Db::new();
    db.ok(&["init"]);
    let serve = Serve::start(&db, &["-q"], &[]);
    // A record that is not a fact is quarantined, with the time it was received.
    let answer = serve.request("POST", "/v1/facts", CBOR, "", &[0x82, 0x01, 0x02]);
    assert_eq!(status_of(&answer), 200);
    drop(serve.stop());
    let is_instant = |w: &str| {
        let b = w.as_bytes();
        b.len() == 20
            && b[4] == b'-'
            && b[10] == b'T'
            && b[19] == b'Z'
            && w[..4].parse::<u32>().is_ok_and(|y| y >= 2024)
    };
    let list = db.ok(&["poison", "list"]);
    let row = list.lines().nth(1).unwrap_or_else(|| panic!("{list}"));
    assert!(row.split_whitespace().any(is_instant), "{list}");
    let shown = db.ok(&["poison", "show", "1"]);
    let received = shown.lines().find(|l| l.starts_with("received")).unwrap();
    assert!(
        is_instant(received.split_whitespace().nth(1).unwrap()),
        "{shown}"
    );
}

/// `--json` output of a command that prints one thing: exactly one line, one object.
fn one_document(db: &Db, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = db.ok(&all);
    assert_eq!(out.lines().count(), 1, "{args:?} prints one line: {out}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(doc.is_object(), "{args:?}: {doc}");
    doc
}

/// `--json` output of a command that prints a list: JSON Lines, one value per line (an
/// object, except for `query`, whose results are what its `select` says).
fn lines_of(db: &Db, args: &[&str], expected: usize) -> Vec<serde_json::Value> {
    let lines = db.json_lines(args);
    assert_eq!(lines.len(), expected, "{args:?}: {lines:?}");
    let objects = lines.iter().all(|l| l.is_object());
    assert!(objects || args[0] == "query", "{args:?}: {lines:?}");
    lines
}

#[test]
fn json_is_one_document_for_one_thing_and_json_lines_for_a_list() {
    let db = Db::new();
    one_document(&db, &["init"]);
    let shop = one_document(&db, &["add", r#"{"type":"Shop","fields":{"n":1}}"#]);
    let shop = shop["hash"].as_str().unwrap().to_string();
    for i in 0..2 {
        let order = format!(
            r#"{{"type":"Order","fields":{{"i":{i}}},"predecessors":{{"shop":"{shop}"}}}}"#
        );
        one_document(&db, &["add", &order]);
    }
    // Two facts held: they wait for a parent that never arrives.
    let parent = "0".repeat(64);
    let mut file = String::new();
    for i in 0..2 {
        file += &format!(
            "{{\"type\":\"Late\",\"fields\":{{\"i\":{i}}},\"predecessors\":{{\"p\":\"{parent}\"}}}}\n"
        );
    }
    let path = db.path.with_file_name("late.jsonl");
    std::fs::write(&path, file).unwrap();
    one_document(&db, &["import", path.to_str().unwrap()]);
    one_document(&db, &["get", &shop]);
    one_document(&db, &["stats"]);
    one_document(&db, &["verify"]);
    for q in ["ship", "bill"] {
        one_document(
            &db,
            &["queue", "add", q, "--input", "Order", "--done-by", "Done.o"],
        );
    }
    one_document(&db, &["queue", "show", "ship"]);
    // Lists: one line per element, however many (none is no output at all).
    lines_of(&db, &["held"], 2);
    lines_of(&db, &["query", "match o: Order select o.i"], 2);
    lines_of(&db, &["queue", "list"], 2);
    lines_of(&db, &["queue", "stats"], 2);
    lines_of(&db, &["queue", "stats", "ship"], 1);
    lines_of(&db, &["queue", "items", "ship"], 2);
    lines_of(&db, &["queue", "check"], 0);
    lines_of(&db, &["dlq", "list", "ship"], 0);
    lines_of(&db, &["peers"], 0);
    lines_of(&db, &["poison", "list"], 0);
    one_document(&db, &["queue", "rm", "bill"]);
    lines_of(&db, &["queue", "list"], 1);
    // A breached alert is listed as a line of its own.
    one_document(
        &db,
        &[
            "queue",
            "add",
            "slow",
            "--input",
            "Order",
            "--done-by",
            "Done.o",
            "--alert-ready-age",
            "1ms",
        ],
    );
    std::thread::sleep(Duration::from_millis(20));
    let out = db
        .cmd(&["--json", "queue", "check", "slow"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 1, "a breach exits 1");
    let breaches = common::bin::json_lines(&stdout(&out));
    assert_eq!(breaches.len(), 1, "{breaches:?}");
    assert!(breaches[0].is_object());
}

/// A directory for config-file tests, where `precedent` runs with no `--db`.
struct Here {
    dir: tempfile::TempDir,
}

impl Here {
    fn new() -> Here {
        Here {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) {
        let p = self.path(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// `precedent ARGS..` run in this directory, with `env` set.
    fn cmd(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Command {
        let mut c = std::process::Command::new(common::bin::BIN);
        common::bin::isolate(&mut c)
            .env("XDG_CONFIG_HOME", self.path("xdg"))
            .env_remove("RUST_LOG")
            .current_dir(self.dir.path())
            .args(args)
            .stdin(Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        c
    }

    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
        self.cmd(args, env).output().unwrap()
    }

    /// The database `init` creates, from its `--json` line.
    fn init_path(&self, args: &[&str], env: &[(&str, &str)]) -> String {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        all.push("init");
        let out = self.run(&all, env);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let path = std::path::PathBuf::from(doc["path"].as_str().unwrap());
        path.file_name().unwrap().to_string_lossy().into_owned()
    }
}

#[test]
fn config_file_fills_defaults_below_flags_and_environment() {
    let here = Here::new();
    assert_eq!(
        here.init_path(&[], &[]),
        "precedent.db",
        "the built-in default"
    );
    here.write("precedent.toml", "db = \"from-config.db\"\njson = true\n");
    assert_eq!(here.init_path(&[], &[]), "from-config.db");
    let env = [("PRECEDENT_DB", "from-env.db")];
    assert_eq!(here.init_path(&[], &env), "from-env.db", "env > config");
    assert_eq!(
        here.init_path(&["--db", "flag.db"], &env),
        "flag.db",
        "flag > env"
    );
    // `json = true` applies without --json.
    let out = here.run(&["stats"], &[]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["released"], 0, "{doc}");
    // A subcommand's own FILE (import, query -f) is not taken for --config.
    here.write("facts.jsonl", "{\"type\":\"T\"}\n");
    let out = here.run(&["import", "facts.jsonl"], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    here.write("q.txt", "match t: T select t");
    let out = here.run(&["query", "-f", "q.txt"], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 1, "{}", stdout(&out));
    // The config's `log` filter sits below -v/-q and RUST_LOG.
    here.write("precedent.toml", "log = \"debug\"\n");
    let logged = |args: &[&str], env: &[(&str, &str)]| stderr(&here.run(args, env));
    assert!(logged(&["stats"], &[]).contains("read the config file"));
    assert_eq!(logged(&["stats"], &[("RUST_LOG", "warn")]), "");
    assert_eq!(logged(&["-q", "stats"], &[]), "");
}

#[test]
fn config_file_search_order_is_named_then_here_then_xdg() {
    let here = Here::new();
    here.write("xdg/precedent/precedent.toml", "db = \"xdg.db\"\n");
    assert_eq!(
        here.init_path(&[], &[]),
        "xdg.db",
        "the XDG file when none here"
    );
    // A relative path in a config file is relative to the file's directory.
    let made = here.path("xdg/precedent/xdg.db");
    assert!(made.exists(), "{made:?}");
    here.write("precedent.toml", "db = \"here.db\"\n");
    assert_eq!(
        here.init_path(&[], &[]),
        "here.db",
        "./precedent.toml before XDG"
    );
    here.write("other.toml", "db = \"named.db\"\n");
    let named = [("PRECEDENT_CONFIG", "other.toml")];
    assert_eq!(
        here.init_path(&[], &named),
        "named.db",
        "PRECEDENT_CONFIG first"
    );
    here.write("flag.toml", "db = \"flag-named.db\"\n");
    let args = ["--config", "flag.toml"];
    assert_eq!(
        here.init_path(&args, &named),
        "flag-named.db",
        "--config over the env"
    );
    let out = here.run(&["init"], &[("PRECEDENT_CONFIG", "missing.toml")]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("missing.toml"), "{}", stderr(&out));
}

#[test]
fn a_malformed_config_file_is_one_line_naming_file_and_line_exit_1() {
    let here = Here::new();
    for (text, line, says) in [
        (
            "db = \"a.db\"\nmax_hled = 3\n",
            2,
            "unknown field `max_hled`",
        ),
        ("json = \"yes\"\n", 1, "invalid type"),
        ("db = \"a.db\"\n\n[serve\n", 3, ""),
        ("[serve]\nrequest_timeout = \"soon\"\n", 2, "bad duration"),
        ("[sync]\nbatch = -1\n", 2, ""),
    ] {
        here.write("precedent.toml", text);
        let out = here.run(&["stats"], &[]);
        assert_eq!(code(&out), 1, "{text:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{text:?}: {err}");
        assert!(
            err.starts_with(&format!("error: config file precedent.toml:{line}:")),
            "{text:?}: {err}"
        );
        assert!(err.contains(says), "{text:?}: {err}");
        assert!(stdout(&out).is_empty());
    }
    here.write(
        "precedent.toml",
        "[serve]\ntls_cert = \"c.pem\"\nlisten = \"127.0.0.1:0\"\n",
    );
    let out = here.run(&["serve"], &[]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("tls_cert and tls_key go together"));
}

/// Starts `precedent serve` in `here`; returns it with the address it printed.
fn serve_here(here: &Here, args: &[&str]) -> Serve {
    let mut all = vec!["serve"];
    all.extend_from_slice(args);
    let mut child = here
        .cmd(&all, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let err = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in err.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = lines.recv_timeout(Duration::from_secs(10)).unwrap();
    let addr = first
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("{first:?}"))
        .to_string();
    Serve { child, addr, lines }
}

const CBOR: &str = "application/cbor-seq";
const AUTH: &str = "authorization: Bearer s3cret-token-for-tests\r\n";

#[test]
fn serve_limits_and_tokens_and_the_sync_token_come_from_the_config_file() {
    let here = Here::new();
    here.write(
        "conf/tokens.json",
        r#"{"tokens": [{"name": "laptop", "token": "s3cret-token-for-tests", "read": true, "write": true}]}"#,
    );
    here.write(
        "precedent.toml",
        "db = \"server.db\"\n[serve]\nlisten = \"127.0.0.1:0\"\ntokens = \"conf/tokens.json\"\nmax_body_bytes = 16\n",
    );
    assert_eq!(code(&here.run(&["init"], &[])), 0);
    let serve = serve_here(&here, &["-q"]);
    // The token file from the config: a request without the token is refused.
    assert_eq!(status_of(&serve.get("/v1/info")), 401);
    // The body limit from the config: 17 bytes are too many.
    let big = serve.request("POST", "/v1/facts", CBOR, AUTH, &[0u8; 17]);
    assert_eq!(status_of(&big), 413, "{}", String::from_utf8_lossy(&big));
    let url = format!("http://{}", serve.addr);
    // sync's token from the config's [sync]; PRECEDENT_TOKEN and --token would win.
    let client = Here::new();
    let sync = |env: &[(&str, &str)]| client.run(&["--db", "c.db", "sync", &url, "--pull"], env);
    assert_eq!(code(&sync(&[])), 5, "no token: refused");
    client.write(
        "precedent.toml",
        "[sync]\ntoken = \"s3cret-token-for-tests\"\n",
    );
    let out = sync(&[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = sync(&[("PRECEDENT_TOKEN", "wrong")]);
    assert_eq!(code(&out), 5, "the environment wins over the config");
    drop(serve.stop());
    // A flag wins over the config's limit: 64 bytes allowed, so 17 is not too large.
    let serve = serve_here(&here, &["-q", "--max-body-bytes", "64"]);
    let big = serve.request("POST", "/v1/facts", CBOR, AUTH, &[0u8; 17]);
    assert_ne!(status_of(&big), 413, "{}", String::from_utf8_lossy(&big));
    assert_ne!(status_of(&big), 401, "{}", String::from_utf8_lossy(&big));
    drop(serve.stop());
}

#[test]
fn every_serve_flag_but_insecure_has_a_key_in_the_config_file_example() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md")).unwrap();
    let start = doc.find("[serve]").expect("a [serve] section");
    let section = &doc[start..start + doc[start..].find("[sync]").unwrap()];
    let keys: Vec<&str> = section
        .lines()
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k.trim()))
        .collect();
    let out = Here::new().run(&["serve", "--help"], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let help = String::from_utf8(out.stdout).unwrap();
    // The flags of `serve` itself: the global ones have top-level keys or none.
    let global = [
        "db",
        "json",
        "max-held",
        "color",
        "config",
        "verbose",
        "quiet",
        "help",
        "read-only",
    ];
    let mut flags: Vec<String> = help
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("--"))
        .map(|f| f.trim_end_matches([',', '.', ')']).to_string())
        .filter(|f| !f.is_empty() && !global.contains(&f.as_str()))
        .collect();
    flags.sort();
    flags.dedup();
    assert!(flags.len() >= 10, "{flags:?} from {help}");
    let missing: Vec<&String> = flags
        .iter()
        .filter(|f| *f != "insecure" && !keys.contains(&f.replace('-', "_").as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "serve flags with no [serve] key in docs/cli.md: {missing:?}"
    );
}

#[test]
fn the_config_file_shown_in_docs_cli_md_is_accepted() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md")).unwrap();
    let start = doc.find("```toml\n").expect("a toml example") + "```toml\n".len();
    let example = &doc[start..start + doc[start..].find("```").unwrap()];
    assert!(example.contains("[serve]") && example.contains("[sync]"));
    let here = Here::new();
    here.write("precedent.toml", example);
    // `completions` reads the config file as every command does, and opens no database.
    let out = here.run(&["completions", "bash"], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Each key is one the file may have: a misspelt copy is refused.
    here.write(
        "precedent.toml",
        &example.replace("max_connections", "max_conections"),
    );
    assert_eq!(code(&here.run(&["completions", "bash"], &[])), 1);
}

#[test]
fn quiet_anywhere_on_the_line_hides_work_lines_per_input() {
    let db = Db::new();
    db.ok(&["init"]);
    db.ok(&[
        "queue",
        "add",
        "q",
        "--input",
        "Job",
        "--done-by",
        "Job.Done.job",
    ]);
    let work = |extra: &[&str]| {
        db.ok(&[
            "add",
            &format!(r#"{{"type":"Job","fields":{{"n":{}}}}}"#, extra.len()),
        ]);
        let mut args = vec!["work", "q", "--once"];
        args.extend_from_slice(extra);
        args.extend(["--", "true"]);
        let out = db.run(&args);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        stderr(&out)
    };
    assert!(!work(&[]).is_empty(), "a line per input by default");
    assert_eq!(work(&["-q"]), "");
    assert_eq!(work(&["--quiet", "--poll", "1s"]), "");
    let stats = db.json_lines(&["queue", "stats", "q"]);
    assert_eq!(stats[0]["completed"], 3, "{stats:?}");
}

#[test]
fn help_follows_color_too() {
    let db = Db::new();
    let help = |args: &[&str]| stdout(&db.cmd(args).env_remove("NO_COLOR").output().unwrap());
    assert!(!help(&["--help"]).contains('\x1b'), "no colour into a pipe");
    assert!(help(&["--color", "always", "--help"]).contains("\x1b["));
    assert!(help(&["queue", "--color=always", "--help"]).contains("\x1b["));
    assert!(!help(&["--color", "never", "--help"]).contains('\x1b'));
}

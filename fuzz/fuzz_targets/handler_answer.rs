//! What a `precedent work --process` handler writes back, read as the worker reads it:
//! `src/cli/work/protocol.rs` and `src/cli/work/seam.rs` compiled in here, as the binary
//! compiles them. The input is a handler's stdout: each line (lossy UTF-8, trailing
//! blanks trimmed, as `process.rs` reads it) goes to `protocol::answer`; the whole of it
//! also goes to the process-per-input readers, `seam::effects_of` (one fact per line) and
//! `protocol::retry_after_line` (the delay a command exiting 75 asks for).
//!
//! Properties besides "no panic": an answer read names the `"lease"` number of its line and
//! the outcome its `"outcome"` says; a `done` answer's facts, resolved as the local worker
//! stores them, are the same facts as their JSON text resolves to (what a remote worker
//! sends the hub), and each re-encodes to itself; a malformed line's error is one line that
//! starts with `handler stdout line N: ` and carries the lease exactly when the line is an
//! object naming a valid one; delays are never negative; `effects_of` reads one fact per non-blank line
//! or names the line it refused.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code, unused_imports)]
#[path = "../../src/cli"]
mod cli {
    #[path = "time.rs"]
    pub mod time;

    #[path = "work"]
    pub mod work {
        #[path = "patient.rs"]
        mod patient;
        #[path = "protocol.rs"]
        pub mod protocol;
        #[path = "seam.rs"]
        pub mod seam;

        use precedent::json::{self, FactSpec, JsonValue};
        use precedent::{Error, Fact, FactHash};

        use protocol::{Answer, Malformed, Outcome};

        /// The facts a spec stands for, or the error's text: prefixes resolve to nothing.
        fn facts(spec: &FactSpec) -> Result<Vec<FactHash>, String> {
            let resolved = json::resolve(spec, &mut |p| {
                Err(Error::UnknownPrefix { prefix: p.text() })
            });
            let facts = resolved.map_err(|e| e.to_string())?;
            for f in &facts {
                let again =
                    Fact::from_canonical(f.canonical_bytes()).expect("a built fact decodes");
                assert_eq!(again.hash(), f.hash());
            }
            Ok(facts.iter().map(Fact::hash).collect())
        }

        /// The `"lease"` of a line, if it is a JSON object with a lease id in it.
        fn lease_of(text: &str) -> Option<u64> {
            let v = JsonValue::parse(text).ok()?;
            match v.get("lease")? {
                JsonValue::Number(n) => n.as_i128().and_then(|n| u64::try_from(n).ok()),
                _ => None,
            }
        }

        pub fn one_line(n: usize, text: &str) {
            match protocol::answer(n, text) {
                Ok(Answer { lease, outcome }) => {
                    assert_eq!(Some(lease), lease_of(text), "line {text:?}");
                    let v = JsonValue::parse(text).unwrap();
                    let said = match v.get("outcome") {
                        Some(JsonValue::String(s)) => s.clone(),
                        other => panic!("an answer read without an outcome: {other:?}"),
                    };
                    match outcome {
                        Outcome::Done(effects) => {
                            assert_eq!(said, "done");
                            for e in effects {
                                let local = facts(&e.spec);
                                let text =
                                    JsonValue::parse(&e.text).expect("an effect's text is JSON");
                                let sent = json::spec_from_json(&text, "")
                                    .map_err(|e| e.to_string())
                                    .and_then(|s| facts(&s));
                                match (&local, &sent) {
                                    (Ok(a), Ok(b)) => assert_eq!(a, b, "effect {:?}", e.text),
                                    (Err(_), Err(_)) => {}
                                    _ => panic!(
                                        "effect {:?}: stored as {local:?}, sent as {sent:?}",
                                        e.text
                                    ),
                                }
                            }
                        }
                        Outcome::Retry {
                            reason,
                            retry_after_ms,
                        } => {
                            assert_eq!(said, "retry");
                            assert!(!reason.is_empty());
                            assert!(retry_after_ms.is_none_or(|ms| ms >= 0));
                        }
                        Outcome::Poison(reason) => {
                            assert_eq!(said, "poison");
                            assert!(!reason.is_empty());
                        }
                    }
                }
                Err(Malformed { lease, message }) => {
                    let head = format!("handler stdout line {n}: ");
                    assert!(message.starts_with(&head), "{message:?}");
                    assert!(
                        !message.contains('\n'),
                        "a message of two lines: {message:?}"
                    );
                    assert_eq!(lease, lease_of(text), "line {text:?}: {message}");
                }
            }
        }

        pub fn whole(stdout: &[u8]) {
            let blank = |l: &str| l.trim().is_empty();
            let text = String::from_utf8_lossy(stdout);
            match seam::effects_of(stdout) {
                Ok(effects) => {
                    let lines = text.lines().filter(|l| !blank(l)).count();
                    assert_eq!(effects.len(), lines);
                    for e in &effects {
                        let _ = facts(&e.spec);
                    }
                }
                Err(why) => assert!(why.starts_with("stdout line "), "{why:?}"),
            }
            if let Ok(Some(ms)) = protocol::retry_after_line(stdout) {
                assert!(ms >= 0);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut n = 0;
    for line in data.split(|b| *b == b'\n') {
        n += 1;
        let text = String::from_utf8_lossy(line).trim_end().to_string();
        if !text.trim().is_empty() {
            cli::work::one_line(n, &text);
        }
    }
    cli::work::whole(data);
});

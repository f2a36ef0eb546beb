//! The lines of the `--process` protocol (docs/queues.md, "Long-running handlers"): what
//! precedent writes to a handler's stdin and how its answers on stdout are read.

use precedent::json::{self, JsonValue};

use super::seam::{Effect, Held};

/// The protocol version in the first line precedent writes.
pub(super) const VERSION: u32 = 1;

/// The first line a handler reads: `{"precedent":"work","version":1,"queue":NAME}`.
pub(super) fn hello(queue: &str) -> String {
    let mut v = JsonValue::object();
    v.insert("precedent", "work");
    v.insert("version", JsonValue::of(&VERSION).expect("an integer"));
    v.insert("queue", queue);
    v.to_string() + "\n"
}

/// One input for the handler: `{"lease":ID,"queue":..,"attempt":N,"input":FACT}`.
pub(super) fn request(id: u64, lease: &impl Held) -> String {
    let mut v = JsonValue::object();
    v.insert("lease", JsonValue::of(&id).expect("an integer"));
    v.insert("queue", lease.queue());
    v.insert(
        "attempt",
        JsonValue::of(&lease.attempt()).expect("an integer"),
    );
    v.insert("input", json::to_json(lease.input()));
    v.to_string() + "\n"
}

/// What a handler said of one input.
pub(super) enum Outcome {
    /// Complete it with these facts.
    Done(Vec<Effect>),
    /// A transient failure, retried after the queue's backoff or `retry_after` ms,
    /// whichever is later.
    Retry {
        reason: String,
        retry_after_ms: Option<i64>,
    },
    /// The input is bad: the poison list.
    Poison(String),
}

/// One answer line, read.
pub(super) struct Answer {
    pub lease: u64,
    pub outcome: Outcome,
}

/// Why an answer line could not be read: with the lease when the line named one (that
/// input is then failed with the message), without when it did not.
pub(super) struct Malformed {
    pub lease: Option<u64>,
    pub message: String,
}

/// Reads answer line `n` (1-based, counted over the handler's stdout).
pub(super) fn answer(n: usize, text: &str) -> Result<Answer, Malformed> {
    let at = format!("handler stdout line {n}");
    let bad = |lease, what: String| Malformed {
        lease,
        message: format!("{at}: {what}"),
    };
    let v = JsonValue::parse(text).map_err(|e| bad(None, format!("not JSON: {e}")))?;
    if !matches!(v, JsonValue::Object(_)) {
        return Err(bad(None, "expected a JSON object".into()));
    }
    let lease = match v.get("lease") {
        Some(JsonValue::Number(n)) => n
            .as_i128()
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| bad(None, format!("\"lease\" {} is not a lease id", n.as_str())))?,
        Some(other) => {
            return Err(bad(
                None,
                format!("\"lease\" must be a number, not {other}"),
            ));
        }
        None => return Err(bad(None, "no \"lease\"".into())),
    };
    let bad = |what: String| bad(Some(lease), what);
    let reason = match v.get("reason") {
        None | Some(JsonValue::Null) => String::new(),
        Some(JsonValue::String(s)) => s.clone(),
        Some(other) => return Err(bad(format!("\"reason\" must be a string, not {other}"))),
    };
    let outcome = match v.get("outcome") {
        Some(JsonValue::String(s)) if s == "done" => Outcome::Done(facts(&v, &at).map_err(bad)?),
        Some(JsonValue::String(s)) if s == "retry" => Outcome::Retry {
            reason: or_default(reason, "the handler asked for a retry"),
            retry_after_ms: retry_after(&v).map_err(bad)?,
        },
        Some(JsonValue::String(s)) if s == "poison" => {
            Outcome::Poison(or_default(reason, "the handler called it poison"))
        }
        Some(other) => {
            return Err(bad(format!(
                "\"outcome\" must be \"done\", \"retry\" or \"poison\", not {other}"
            )));
        }
        None => return Err(bad("no \"outcome\"".into())),
    };
    Ok(Answer { lease, outcome })
}

fn or_default(reason: String, default: &str) -> String {
    if reason.is_empty() {
        default.to_string()
    } else {
        reason
    }
}

/// The `"facts"` of a `done` answer: an array of facts in the export form.
fn facts(v: &JsonValue, at: &str) -> Result<Vec<Effect>, String> {
    let items = match v.get("facts") {
        None | Some(JsonValue::Null) => return Ok(Vec::new()),
        Some(JsonValue::Array(items)) => items,
        Some(other) => return Err(format!("\"facts\" must be an array, not {other}")),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let spec = json::spec_from_json(f, "").map_err(|e| format!("facts[{i}]: {e}"))?;
            Ok(Effect {
                at: format!("{at}, facts[{i}]"),
                spec,
                text: f.to_string(),
            })
        })
        .collect()
}

/// `"retry_after"`: a duration as text (`"30s"`, `"1500ms"`, `"2m"`).
fn retry_after(v: &JsonValue) -> Result<Option<i64>, String> {
    match v.get("retry_after") {
        None | Some(JsonValue::Null) => Ok(None),
        Some(JsonValue::String(s)) => super::super::time::parse_ms(s)
            .map(Some)
            .map_err(|e| format!("\"retry_after\": {e}")),
        Some(other) => Err(format!(
            "\"retry_after\" must be a duration such as \"30s\", not {other}"
        )),
    }
}

/// Process-per-input mode: the delay a command that exits 75 asks for, in the last
/// non-empty line of its stdout, `{"retry_after":"30s"}`. None if that line is not a
/// JSON object with `retry_after`.
pub(super) fn retry_after_line(stdout: &[u8]) -> Result<Option<i64>, String> {
    let text = String::from_utf8_lossy(stdout);
    let Some(last) = text.lines().rev().find(|l| !l.trim().is_empty()) else {
        return Ok(None);
    };
    match JsonValue::parse(last) {
        Ok(v @ JsonValue::Object(_)) => retry_after(&v),
        _ => Ok(None),
    }
}

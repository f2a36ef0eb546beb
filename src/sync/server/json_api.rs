//! Facts in their JSON form over HTTP (`docs/protocol.md`, "JSON API"): one fact by
//! hash, and the JSON bodies of a push.
//!
//! A JSON push goes through the CBOR push's own path ([`super::push`]): the same budget,
//! body and record limits, one transaction, held facts and quarantine. Only the framing
//! and the decoding of a record differ: a record is one element of a JSON array, or one
//! non-blank line of JSON Lines, and decoding it reads the JSON form (`crate::json`)
//! and builds the canonical fact from it: through `json::parse_fast` when the record has
//! the common shape, through the JSON tree otherwise.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::app::{App, Failure, Need, authorize};
use super::routes::{bad_request, json_response};
use crate::fact::Fact;
use crate::hash::{FactHash, HashPrefix};
use crate::ingest::Decoded;
use crate::json::{JsonValue, PredSpec};
use crate::sync::wire;

/// How a push body is framed, from its `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PushForm {
    /// `application/cbor-seq`: canonical encodings back to back.
    Cbor,
    /// `application/json`: one array of facts in the JSON form.
    JsonArray,
    /// `application/jsonl` or `application/x-ndjson`: one fact per non-blank line.
    JsonLines,
}

impl PushForm {
    /// The form a push's `Content-Type` names: 415 for any other.
    pub(super) fn of(headers: &HeaderMap) -> Result<PushForm, Failure> {
        let given = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let base = given.split(';').next().unwrap_or("").trim();
        let is = |t: &str| base.eq_ignore_ascii_case(t);
        if is(wire::CBOR_SEQ) {
            Ok(PushForm::Cbor)
        } else if is(wire::JSON) {
            Ok(PushForm::JsonArray)
        } else if is(wire::JSON_LINES) || is(wire::NDJSON) {
            Ok(PushForm::JsonLines)
        } else {
            Err(Failure::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!(
                    "content-type must be {}, {}, {} or {}, not {given:?}",
                    wire::CBOR_SEQ,
                    wire::JSON,
                    wire::JSON_LINES,
                    wire::NDJSON
                ),
            ))
        }
    }
}

/// The records of a JSON push body: the elements of its array, or its non-blank lines.
///
/// # Errors
/// 400 `bad_request` for an array body that cannot be split into elements (not an array,
/// an unterminated string, unbalanced brackets, bytes after the closing `]`): nothing is
/// stored then, since no record can be told from the next.
pub(super) fn json_records(bytes: &[u8], form: PushForm) -> Result<Vec<&[u8]>, Failure> {
    match form {
        PushForm::JsonLines => Ok(bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
            .collect()),
        _ => split_array(bytes).map_err(|(at, what)| {
            bad_request(format!(
                "json push body at byte {at}: {what} (a push body is one JSON array of facts)"
            ))
        }),
    }
}

/// Splits a JSON array into the bytes of its elements without parsing them: strings and
/// nesting are followed only to find each element's end.
fn split_array(b: &[u8]) -> Result<Vec<&[u8]>, (usize, &'static str)> {
    let skip_ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    let mut i = skip_ws(0);
    if b.get(i) != Some(&b'[') {
        return Err((i, "expected '['"));
    }
    i = skip_ws(i + 1);
    let mut out = Vec::new();
    if b.get(i) == Some(&b']') {
        return finish(b, skip_ws(i + 1), out);
    }
    loop {
        let start = i;
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        let end = loop {
            let Some(&c) = b.get(i) else {
                return Err((i, "the array does not end"));
            };
            if in_string {
                match c {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    // To the string's next quote or backslash at once: most of a
                    // record's bytes are inside its strings.
                    _ => match memchr::memchr2(b'"', b'\\', &b[i..]) {
                        Some(k) => {
                            i += k;
                            continue;
                        }
                        None => return Err((b.len(), "the array does not end")),
                    },
                }
            } else {
                match c {
                    b'"' => in_string = true,
                    b'[' | b'{' => depth += 1,
                    b']' | b'}' if depth > 0 => depth -= 1,
                    b',' | b']' if depth == 0 => break i,
                    b'}' => return Err((i, "unbalanced '}'")),
                    _ => {}
                }
            }
            i += 1;
        };
        let element = b[start..end].trim_ascii_end();
        if element.is_empty() {
            return Err((start, "expected a value"));
        }
        out.push(element);
        if b[end] == b']' {
            return finish(b, skip_ws(end + 1), out);
        }
        i = skip_ws(end + 1);
    }
}

fn finish<'b>(
    b: &[u8],
    i: usize,
    out: Vec<&'b [u8]>,
) -> Result<Vec<&'b [u8]>, (usize, &'static str)> {
    if i < b.len() {
        return Err((i, "bytes after the array"));
    }
    Ok(out)
}

/// Decodes one JSON record of a push into its fact; a refused one keeps its reason and
/// its bytes for the quarantine, as a CBOR record does.
pub(super) fn decode_json(bytes: &&[u8]) -> Decoded {
    let refuse = |reason: String| (format!("json record: {reason}"), bytes.to_vec());
    let text = std::str::from_utf8(bytes).map_err(|e| refuse(format!("not UTF-8: {e}")))?;
    // The common shape in one pass; anything else, and every refusal with its reason,
    // comes from the general path below.
    if let Some(fact) = crate::json::parse_fast(text) {
        return Ok(fact);
    }
    let json = JsonValue::parse(text).map_err(|e| refuse(e.to_string()))?;
    let spec = crate::json::spec_from_json(&json, "").map_err(|e| refuse(e.to_string()))?;
    // One record is one fact: predecessors by full hash, as the JSON form is written
    // out, so that a record's index names exactly one fact.
    for (role, list) in &spec.predecessors {
        if let Some(p) = list.iter().find(|p| !matches!(p, PredSpec::Hash(_))) {
            let what = match p {
                PredSpec::Prefix(p) => format!("the hash prefix {:?}", p.text()),
                _ => "an inline fact".to_string(),
            };
            return Err(refuse(format!(
                "predecessors.{role}: {what}; a pushed fact names each predecessor by its full 64-digit hash"
            )));
        }
    }
    let mut facts = crate::json::resolve(&spec, &mut |p| {
        Err(crate::Error::UnknownPrefix { prefix: p.text() })
    })
    .map_err(|e| refuse(e.to_string()))?;
    Ok(facts
        .pop()
        .expect("a spec without inline facts resolves to one fact"))
}

/// Whether a request's `Accept` asks for the canonical bytes: it names
/// `application/cbor` and does not name `application/json` before it (parameters and
/// `q` weights are not weighed).
fn wants_cbor(headers: &HeaderMap) -> bool {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    for range in accept.split(',') {
        let base = range.split(';').next().unwrap_or("").trim();
        if base.eq_ignore_ascii_case(wire::JSON) {
            return false;
        }
        if base.eq_ignore_ascii_case(wire::CBOR) {
            return true;
        }
    }
    false
}

/// `GET /v1/facts/HASH`: one released fact, in the JSON form or as its canonical bytes.
pub(super) async fn get_fact(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(text): Path<String>,
) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    let hash = full_hash(&text)?;
    let fact = app.with_store(move |s| s.get(&hash)).await?;
    let Some(fact) = fact else {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no released fact {hash}"),
        ));
    };
    Ok(fact_response(&fact, wants_cbor(&headers)))
}

/// A hash given in a path or a JSON body: 64 hex digits, 400 otherwise (a prefix too).
pub(super) fn full_hash(text: &str) -> Result<FactHash, Failure> {
    HashPrefix::parse(text)
        .ok()
        .and_then(|p| p.full())
        .ok_or_else(|| bad_request(format!("{text:?} is not a 64-digit hash")))
}

fn fact_response(fact: &Fact, cbor: bool) -> Response {
    if cbor {
        let mut r = fact.canonical_bytes().to_vec().into_response();
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(wire::CBOR));
        r
    } else {
        json_response(&crate::json::to_json(fact))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_split_into_their_elements() {
        let body = br#" [ {"a": "x,]}\"[", "b": [1, {"c": 2}]} , 3,"s" ] "#;
        let got = split_array(body).unwrap();
        assert_eq!(
            got,
            vec![
                &br#"{"a": "x,]}\"[", "b": [1, {"c": 2}]}"#[..],
                &b"3"[..],
                &br#""s""#[..]
            ]
        );
        // Strings that end in an escaped backslash, hold only escapes, or an escaped quote
        // before a bracket.
        let body = br#"["a\\", "\\\"", "b\"]"]"#;
        assert_eq!(
            split_array(body).unwrap(),
            vec![&br#""a\\""#[..], &br#""\\\"""#[..], &br#""b\"]""#[..]]
        );
        assert_eq!(split_array(b"[]").unwrap(), Vec::<&[u8]>::new());
        assert!(matches!(split_array(b"{}"), Err((0, _))));
        assert!(matches!(split_array(b"[1,"), Err((3, _))));
        assert!(matches!(split_array(b"[1,,2]"), Err((3, _))));
        assert!(matches!(split_array(b"[\"a]"), Err((4, _))));
        assert!(matches!(split_array(b"[1] x"), Err((4, _))));
        assert!(matches!(split_array(b"[1}]"), Err((2, _))));
    }
}

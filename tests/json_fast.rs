//! `json::parse_fast` against the general path (`JsonValue::parse`, `spec_from_json`,
//! `resolve`), which a JSON push and `import` take when the fast path answers `None`.
//!
//! The promise checked: whatever the fast path accepts, the general path accepts too and
//! builds the same fact (same canonical bytes, same hash); and it does accept the texts
//! `to_json` writes, however they are re-spaced, re-ordered, escaped or their numbers
//! re-written, so that pushes actually take it.

use std::collections::{BTreeMap, BTreeSet};

use precedent::json::{self, JsonValue};
use precedent::{Error, Fact, FactHash, Value};
use proptest::prelude::*;

/// The general path, as a push decodes a record.
fn general(text: &str) -> Result<Vec<Fact>, String> {
    let value = JsonValue::parse(text).map_err(|e| e.to_string())?;
    let spec = json::spec_from_json(&value, "").map_err(|e| e.to_string())?;
    json::resolve(&spec, &mut |p| {
        Err(Error::UnknownPrefix { prefix: p.text() })
    })
    .map_err(|e| e.to_string())
}

/// The fast path's answer, checked against the general path's whenever it gives a fact.
fn fast_agrees(text: &str) -> Option<Fact> {
    let fast = json::parse_fast(text)?;
    match general(text) {
        Ok(facts) => {
            assert_eq!(facts.len(), 1, "{text}");
            assert_eq!(facts[0].canonical_bytes(), fast.canonical_bytes(), "{text}");
            assert_eq!(facts[0].hash(), fast.hash(), "{text}");
        }
        Err(e) => panic!("the fast path accepted what the general path refuses ({e}): {text}"),
    }
    Some(fast)
}

fn text() -> impl Strategy<Value = String> {
    let chars = vec![
        'a',
        'Z',
        ' ',
        '$',
        '"',
        '\\',
        '/',
        '\u{0}',
        '\u{1}',
        '\n',
        '\t',
        '\r',
        '\u{8}',
        '\u{c}',
        '\u{1f}',
        '\u{7f}',
        '\u{e9}',
        '\u{20ac}',
        '\u{fffd}',
        '\u{1f600}',
        '\u{10ffff}',
    ];
    prop::collection::vec(prop::sample::select(chars), 0..8).prop_map(|cs| cs.into_iter().collect())
}

fn floats() -> Vec<f64> {
    vec![
        0.0,
        -0.0,
        2.0,
        -2.0,
        0.1,
        1.5,
        1e15,
        1e16,
        1.5e16,
        1e-4,
        1e-5,
        5e-324,
        1.7976931348623157e308,
        -1.7976931348623157e308,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-4i128..4).prop_map(Value::Integer),
        any::<i64>().prop_map(|i| Value::Integer(i.into())),
        (-(1i128 << 64)..(1i128 << 64)).prop_map(Value::Integer),
        prop::sample::select(vec![-(1i128 << 64), (1i128 << 64) - 1, 1 << 63, -(1 << 63)])
            .prop_map(Value::Integer),
        (-8i32..8).prop_map(|n| Value::Float(f64::from(n) / 2.0)),
        any::<f64>()
            .prop_filter("NaN is not a value", |f| !f.is_nan())
            .prop_map(Value::Float),
        prop::sample::select(floats()).prop_map(Value::Float),
        text().prop_map(Value::Text),
        prop::collection::vec(any::<u8>(), 0..6).prop_map(Value::Bytes),
    ]
}

/// Values of every kind; map keys may start with `$`, so that maps are written with
/// `$map`, and some maps have a `$` key first among others.
fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[ab$]{1,2}", inner, 0..3).prop_map(Value::Map),
        ]
    })
}

fn hash() -> impl Strategy<Value = FactHash> {
    any::<[u8; 32]>().prop_map(|b| FactHash::from_slice(&b).unwrap())
}

fn fact() -> impl Strategy<Value = Fact> {
    let type_name = prop_oneof![
        "[A-Z][a-z]{0,6}(\\.[A-Z][a-z]{0,6}){0,2}",
        text().prop_filter("a type name is not empty", |t| !t.is_empty()),
    ];
    let fields = prop::collection::btree_map("[a-c$\u{e9}\"]{1,3}", value(), 0..5);
    let roles = prop::collection::btree_map(
        "[a-d\u{e9}]{1,3}",
        prop::collection::btree_set(hash(), 1..4),
        0..4,
    );
    (type_name, fields, roles)
        .prop_map(|(t, fields, roles)| Fact::new(t, fields, roles).expect("a valid fact"))
}

/// Whether the fast path reads every rendering of `v`: it leaves to the general path a
/// map of two or more keys that may be written with a `$` key first.
fn plain(v: &Value) -> bool {
    match v {
        Value::Array(items) => items.iter().all(plain),
        Value::Map(m) => {
            (m.len() < 2 || !m.keys().any(|k| k.starts_with('$'))) && m.values().all(plain)
        }
        _ => true,
    }
}

/// JSON whitespace, or none.
fn ws(rng: &mut fastrand::Rng, out: &mut String) {
    for _ in 0..rng.usize(0..3).saturating_sub(1) {
        out.push([' ', '\t', '\n', '\r'][rng.usize(0..4)]);
    }
}

fn hex4(rng: &mut fastrand::Rng, unit: u32) -> String {
    let s = format!("\\u{unit:04x}");
    if rng.bool() {
        s
    } else {
        s.to_uppercase().replacen("\\U", "\\u", 1)
    }
}

/// A string, with the escapes JSON requires and, at random, the ones it allows.
fn string(s: &str, rng: &mut fastrand::Rng, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let escape = rng.u8(0..4) == 0;
        match c {
            '"' | '\\' if !escape => {
                out.push('\\');
                out.push(c);
            }
            '/' if escape => out.push_str("\\/"),
            '\n' if !escape => out.push_str("\\n"),
            '\t' if !escape => out.push_str("\\t"),
            '\r' if !escape => out.push_str("\\r"),
            '\u{8}' if !escape => out.push_str("\\b"),
            '\u{c}' if !escape => out.push_str("\\f"),
            c if escape || c < ' ' || c == '"' || c == '\\' => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&hex4(rng, u32::from(*unit)));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The same number in another spelling: an integer as itself (`-0` for 0), a float
/// with an exponent, trailing zeros or a `+` in its exponent.
fn number(text: &str, rng: &mut fastrand::Rng) -> String {
    let Ok(f) = text.parse::<f64>() else {
        unreachable!("{text}")
    };
    if !text.contains(['.', 'e', 'E']) {
        return if text == "0" && rng.bool() {
            "-0".into()
        } else {
            text.into()
        };
    }
    match rng.u8(0..5) {
        0 => format!("{f:e}"),
        1 => format!("{f:E}"),
        2 if !text.contains(['e', 'E']) => format!("{text}00"),
        3 => {
            let exp = format!("{f:e}");
            let (m, e) = exp.split_once('e').unwrap();
            let m = if m.contains('.') {
                format!("{m}0")
            } else {
                format!("{m}.0")
            };
            let e = if e.starts_with('-') {
                e.to_string()
            } else {
                format!("+{e}")
            };
            format!("{m}e{e}")
        }
        _ => text.into(),
    }
}

/// `v` written as JSON text, re-spaced, its objects' keys shuffled, its strings escaped
/// and its numbers re-spelled at random; the value it stands for is unchanged.
fn render(v: &JsonValue, rng: &mut fastrand::Rng, out: &mut String) {
    ws(rng, out);
    match v {
        JsonValue::Null => out.push_str("null"),
        JsonValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        JsonValue::Number(n) => out.push_str(&number(n.as_str(), rng)),
        JsonValue::String(s) => string(s, rng, out),
        JsonValue::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                render(item, rng, out);
            }
            ws(rng, out);
            out.push(']');
        }
        JsonValue::Object(entries) => {
            let mut entries: Vec<_> = entries.iter().collect();
            rng.shuffle(&mut entries);
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(rng, out);
                string(k, rng, out);
                ws(rng, out);
                out.push(':');
                render(v, rng, out);
            }
            ws(rng, out);
            out.push('}');
        }
    }
    ws(rng, out);
}

/// The JSON form of `fact` with the liberties it allows: no `hash`, empty `fields` or
/// `predecessors` left out, a role's single hash written as an array, a hash repeated,
/// hex digits in upper case, an empty role added.
fn vary(fact: &Fact, rng: &mut fastrand::Rng) -> JsonValue {
    let mut v = json::to_json(fact);
    if rng.bool() {
        v.remove("hash");
    }
    for key in ["fields", "predecessors"] {
        if v[key].as_object().is_some_and(<[_]>::is_empty) && rng.bool() {
            v.remove(key);
        }
    }
    if let Some(JsonValue::Object(roles)) = v.get("predecessors").cloned() {
        let mut roles: Vec<_> = roles
            .into_iter()
            .map(|(role, hashes)| {
                let mut list = match hashes {
                    JsonValue::Array(items) => items,
                    one if rng.bool() => return (role, one),
                    one => vec![one],
                };
                if rng.bool() {
                    list.push(list[rng.usize(0..list.len())].clone());
                }
                for h in &mut list {
                    if rng.bool() {
                        *h = JsonValue::String(h.as_str().unwrap().to_uppercase());
                    }
                }
                (role, JsonValue::Array(list))
            })
            .collect();
        if rng.bool() {
            roles.push(("zz".into(), JsonValue::Array(vec![])));
        }
        v.insert("predecessors", JsonValue::Object(roles));
    }
    v
}

/// A small change to the text that may break it or change what it means: a byte
/// inserted, removed or replaced (at a char boundary), or the text cut short.
fn mutate(text: &str, rng: &mut fastrand::Rng) -> String {
    let bounds: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    let at = bounds[rng.usize(0..bounds.len())];
    let pieces = [
        "\"",
        "\\",
        ",",
        ":",
        "{",
        "}",
        "[",
        "]",
        "0",
        "1",
        ".",
        "e",
        "-",
        "$",
        " ",
        "x",
        "a",
        "\u{e9}",
        "\\u00",
        "\"a\":1,",
        "\"type\":\"T\",",
        "1.0",
        "true",
        "null",
    ];
    let piece = pieces[rng.usize(0..pieces.len())];
    let next = bounds.iter().copied().find(|&i| i > at).unwrap_or(at);
    match rng.u8(0..4) {
        0 => format!("{}{piece}{}", &text[..at], &text[at..]),
        1 => format!("{}{}", &text[..at], &text[next..]),
        2 => format!("{}{piece}{}", &text[..at], &text[next..]),
        _ => text[..at].to_string(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Every rendering of a random fact gives that fact, through the fast path when the
    /// fact is plain, and the general path agrees.
    #[test]
    fn renderings_of_random_facts_take_the_fast_path_to_the_same_fact(
        fact in fact(),
        seed in any::<u64>(),
    ) {
        let is_plain = fact.fields().values().all(plain);
        let written = json::to_json(&fact).to_string();
        let got = fast_agrees(&written);
        prop_assert_eq!(got.is_some(), is_plain, "{}", written);
        let mut rng = fastrand::Rng::with_seed(seed);
        for _ in 0..4 {
            let mut text = String::new();
            render(&vary(&fact, &mut rng), &mut rng, &mut text);
            match fast_agrees(&text) {
                Some(got) => prop_assert_eq!(got.hash(), fact.hash(), "{}", text),
                None => prop_assert!(!is_plain, "not taken: {}", text),
            }
            prop_assert_eq!(general(&text).unwrap()[0].hash(), fact.hash());
        }
    }

    /// A text changed at random, valid or not: the fast path gives no fact that the
    /// general path refuses or builds otherwise.
    #[test]
    fn mutated_texts_get_the_general_paths_fact_or_none(fact in fact(), seed in any::<u64>()) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut text = String::new();
        render(&vary(&fact, &mut rng), &mut rng, &mut text);
        for _ in 0..8 {
            text = mutate(&text, &mut rng);
            fast_agrees(&text);
        }
    }
}

const H: &str = "3a3fda0394ca9c4e05ef244f0d433738cf916391c29c995b2f1a64ffad3f278a";

/// Texts the general path refuses, one per rule: the fast path gives `None` for each,
/// and so leaves the refusal and its message to the general path. (Bytes that are not
/// UTF-8 cannot reach it: it takes a `&str`, and a push checks UTF-8 first.)
#[test]
fn texts_the_general_path_refuses_get_none() {
    let order = Fact::builder("Bench.Order")
        .field("total", 1.5)
        .predecessor("store", H.parse().unwrap())
        .build()
        .unwrap();
    let good = json::to_json(&order).to_string();
    assert!(fast_agrees(&good).is_some(), "{good}");
    let wrong_hash = good.replace(&order.hash().to_string(), H);
    let fields = |f: &str| format!(r#"{{"type":"T","fields":{{{f}}}}}"#);
    let preds = |p: &str| format!(r#"{{"type":"T","predecessors":{{{p}}}}}"#);
    let cases = [
        wrong_hash,
        format!("{good}x"),
        format!("{good} {{}}"),
        good[..good.len() - 1].to_string(),
        format!("\u{feff}{good}"),
        r#"{"type":"T","type":"T"}"#.into(),
        r#"{"type":"T","fields":{},"fields":{}}"#.into(),
        r#"{"type":"T","predecessors":{},"predecessors":{}}"#.into(),
        format!(r#"{{"type":"T","hash":"{H}","hash":"{H}"}}"#),
        fields(r#""a":1,"a":1"#),
        fields(r#""a":{"b":1,"b":2}"#),
        fields(r#""a":{"$bytes":"00","$bytes":"00"}"#),
        fields(r#""a":{"$map":{"x":1,"x":1}}"#),
        preds(&format!(r#""p":"{H}","p":"{H}""#)),
        r#"{"type":"T","extra":1}"#.into(),
        r#"{"fields":{}}"#.into(),
        r#"{"type":""}"#.into(),
        r#"{"type":1}"#.into(),
        r#"{"type":"T","fields":[]}"#.into(),
        r#"{"type":"T","hash":"abc"}"#.into(),
        format!(r#"{{"type":"T","hash":"{}"}}"#, &H[..63]),
        preds(&format!(r#""p":"{}""#, &H[..63])),
        preds(&format!(r#""p":"{}g""#, &H[..63])),
        preds(r#""p":"abc""#),
        preds(r#""p":5"#),
        preds(r#""p":[5]"#),
        preds(&format!(r#""":"{H}""#)),
        fields(r#""a":18446744073709551616"#),
        fields(r#""a":-18446744073709551617"#),
        fields(r#""a":1e999"#),
        fields(r#""a":-1e999"#),
        fields(r#""a":01"#),
        fields(r#""a":1."#),
        fields(r#""a":.5"#),
        fields(r#""a":-"#),
        fields(r#""a":+1"#),
        fields(r#""a":1e"#),
        fields(r#""a":NaN"#),
        fields(r#""a":Infinity"#),
        fields(r#""a":tru"#),
        fields(r#""a":"\x""#),
        fields(r#""a":"\ud800""#),
        fields(r#""a":"\udc00""#),
        fields(r#""a":"\ud800\u0041""#),
        fields(r#""a":"\u12""#),
        fields("\"a\":\"tab\there\""),
        fields(r#""a":{"$float":"NaN"}"#),
        fields(r#""a":{"$float":"inf"}"#),
        fields(r#""a":{"$bytes":"0"}"#),
        fields(r#""a":{"$bytes":"zz"}"#),
        fields(r#""a":{"$nope":1}"#),
        fields(r#""a":{"$map":1}"#),
        fields(r#""a":[1,]"#),
        fields(r#""a":1,"#),
        fields(&format!(r#""a":{}1{}"#, "[".repeat(64), "]".repeat(64))),
        fields(&format!(r#""a":{}1{}"#, "[".repeat(200), "]".repeat(200))),
        fields(&format!(
            r#""a":{}1{}"#,
            r#"{"$map":{"k":"#.repeat(64),
            "}}".repeat(64)
        )),
    ];
    for text in &cases {
        assert!(general(text).is_err(), "the general path accepts {text}");
        assert!(json::parse_fast(text).is_none(), "{text}");
    }
}

/// The forms the fast path leaves to the general path although they are valid: a
/// prefix, an inline fact, a map whose first key starts with `$`, and a special form
/// nested past [`precedent::fact::limits::MAX_DEPTH`] JSON levels (it is no model level).
#[test]
fn valid_texts_of_other_shapes_are_left_to_the_general_path() {
    let cases = [
        format!(r#"{{"type":"T","predecessors":{{"p":"{}"}}}}"#, &H[..8]),
        r#"{"type":"T","predecessors":{"p":{"type":"S"}}}"#.into(),
        r#"{"type":"T","fields":{"a":{"$x":1,"b":2}}}"#.into(),
        format!(
            r#"{{"type":"T","fields":{{"a":{}{{"$bytes":"00"}}{}}}}}"#,
            "[".repeat(63),
            "]".repeat(63)
        ),
    ];
    for text in &cases {
        assert!(json::parse_fast(text).is_none(), "{text}");
    }
    assert!(general(&cases[1]).is_ok());
    assert!(general(&cases[2]).is_ok());
    assert!(general(&cases[3]).is_ok());
    // The deepest arrays the model allows are read by the fast path.
    let deep = format!(
        r#"{{"type":"T","fields":{{"a":{}1{}}}}}"#,
        "[".repeat(63),
        "]".repeat(63)
    );
    assert!(fast_agrees(&deep).is_some());
}

/// The fields object is the fields map even with a single `$` key, in both paths.
#[test]
fn a_single_dollar_field_is_a_field() {
    let f = fast_agrees(r#"{"type":"T","fields":{"$bytes":"00"}}"#).unwrap();
    assert_eq!(f.field("$bytes"), Some(&Value::Text("00".into())));
    let roles: BTreeMap<String, BTreeSet<FactHash>> = BTreeMap::new();
    assert_eq!(f.predecessors(), &roles);
}

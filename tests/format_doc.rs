//! What `docs/format.md` says besides the hash vectors, pinned so that the document and the
//! binary cannot drift apart: the text of exported floats, the messages for bad predecessor
//! strings, the order inline facts are stored in and which of them a prefix can name, how
//! predecessors count against the limit, the strict decoder's check order and offsets, and
//! the splitter's messages on `import` of a CBOR sequence.

mod common;

use precedent::fact::Value;
use precedent::{Error, Fact, json};

/// The text `json::to_json` writes for a float field.
fn exported(f: f64) -> String {
    let fact = Fact::builder("F")
        .field("x", Value::Float(f))
        .build()
        .unwrap();
    json::to_json(&fact)["fields"]["x"].to_string()
}

/// Whether `text` is the documented exponent form: `D[.DDD]eN`, N with `-` when
/// negative, no `+`, no leading zero, no trailing zero in the digits.
fn exponent_form(text: &str) -> bool {
    let text = text.strip_prefix('-').unwrap_or(text);
    let Some((digits, exp)) = text.split_once('e') else {
        return false;
    };
    let exp = exp.strip_prefix('-').unwrap_or(exp);
    let exp_ok =
        !exp.is_empty() && !exp.starts_with('0') && exp.bytes().all(|b| b.is_ascii_digit());
    let digits_ok = match digits.split_once('.') {
        None => digits.len() == 1,
        Some((first, rest)) => first.len() == 1 && !rest.is_empty() && !rest.ends_with('0'),
    };
    exp_ok && digits_ok && digits.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

#[test]
fn exported_floats_follow_the_documented_text_rule() {
    let examples = [
        (1.0, "1.0"),
        (100000.0, "100000.0"),
        (1e15, "1000000000000000.0"),
        (0.0001, "0.0001"),
        (0.1, "0.1"),
        (-0.0, "-0.0"),
        (1e16, "1e16"),
        (1.5e16, "1.5e16"),
        (123456789012345678.0, "1.2345678901234568e17"),
        (1e-5, "1e-5"),
        (5.960464477539063e-8, "5.960464477539063e-8"),
        (5e-324, "5e-324"),
        (f64::MAX, "1.7976931348623157e308"),
        (-2.5e-7, "-2.5e-7"),
    ];
    for (f, text) in examples {
        assert_eq!(exported(f), text, "{f:e}");
    }
    // Across the whole range (bit patterns from a fixed generator): the exponent form
    // exactly outside 1e-4 <= |x| < 1e16, and every text reads back to the same bits.
    let mut bits: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..20_000 {
        bits = bits
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let f = f64::from_bits(bits);
        if !f.is_finite() {
            continue;
        }
        let text = exported(f);
        let plain = f == 0.0 || (1e-4..1e16).contains(&f.abs());
        if plain {
            assert!(!text.contains(['e', 'E']) && text.contains('.'), "{text}");
        } else {
            assert!(exponent_form(&text), "{text} for {f:e}");
        }
        let back = json::parse_standalone(&format!(r#"{{"type":"F","fields":{{"x":{text}}}}}"#));
        assert_eq!(
            back.unwrap()[0].field("x"),
            Some(&Value::Float(f)),
            "{text}"
        );
    }
}

fn json_error(text: &str) -> String {
    match json::parse_standalone(text) {
        Err(e @ (Error::Json { .. } | Error::InvalidFact { .. })) => e.to_string(),
        other => panic!("{text}: {other:?}"),
    }
}

#[test]
fn bad_predecessor_strings_have_the_documented_messages() {
    let with = |p: &str| format!(r#"{{"type":"T","predecessors":{{"p":{p}}}}}"#);
    let cases = [
        (
            r#""abc""#.to_string(),
            r#"predecessors.p: bad hash "abc": a hash prefix needs at least 8 hex digits"#,
        ),
        (
            r#""""#.to_string(),
            r#"predecessors.p: bad hash "": a hash prefix needs at least 8 hex digits"#,
        ),
        (
            format!(r#""{}""#, "a".repeat(65)),
            "a hash has at most 64 hex digits",
        ),
        (
            r#""zzzzzzzz""#.to_string(),
            r#"predecessors.p: bad hash "zzzzzzzz": not a hex digit"#,
        ),
        (
            r#"" abcdef12""#.to_string(),
            r#"bad hash " abcdef12": not a hex digit"#,
        ),
        (
            "[5]".to_string(),
            "predecessors.p[0]: a predecessor is a hash, a hash prefix or an inline fact object",
        ),
        (
            "null".to_string(),
            "predecessors.p: a predecessor is a hash, a hash prefix or an inline fact object",
        ),
    ];
    for (pred, want) in cases {
        let got = json_error(&with(&pred));
        assert!(got.contains(want), "{pred}: {got}");
    }
    // A prefix in either case is accepted as a prefix (here with no store to match).
    let err = json::parse_standalone(&with(r#""ABCDEF12""#)).unwrap_err();
    assert_eq!(err.to_string(), "no fact matches prefix abcdef12");
}

#[test]
fn inline_facts_come_in_role_order_depth_first_and_prefixes_see_earlier_ones() {
    let text = r#"{"type": "Top", "predecessors": {
        "zz": {"type": "Z", "predecessors": {"in": {"type": "ZInner"}}},
        "b": [{"type": "B2"}, {"type": "B1"}],
        "aa": {"type": "AA"}}}"#;
    let facts = json::parse_standalone(text).unwrap();
    let types: Vec<&str> = facts.iter().map(Fact::type_name).collect();
    assert_eq!(types, ["AA", "B2", "B1", "ZInner", "Z", "Top"]);

    // A prefix in role `b` names the inline fact of role `aa`, written after it.
    let aa = Fact::builder("AA").build().unwrap().hash().to_string();
    let text = format!(
        r#"{{"type":"T","predecessors":{{"b":"{}","aa":{{"type":"AA"}}}}}}"#,
        &aa[..8]
    );
    let facts = json::parse_standalone(&text).unwrap();
    assert_eq!(
        facts[1].predecessors()["b"]
            .iter()
            .next()
            .unwrap()
            .to_string(),
        aa
    );
    // Role `zz` sorts after `b`: its inline fact is not resolved yet, so the prefix is
    // looked for in the store (none here).
    let z = Fact::builder("Z").build().unwrap().hash().to_string();
    let text = format!(
        r#"{{"type":"T","predecessors":{{"b":"{}","zz":{{"type":"Z"}}}}}}"#,
        &z[..8]
    );
    let err = json::parse_standalone(&text).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("no fact matches prefix {}", &z[..8])
    );
    // The same fact written inline twice is one fact, and its prefix names it.
    let text = format!(
        r#"{{"type":"T","predecessors":{{"a":{{"type":"AA"}},"b":{{"type":"AA"}},"c":"{}"}}}}"#,
        &aa[..8]
    );
    let facts = json::parse_standalone(&text).unwrap();
    let top = facts.last().unwrap();
    assert_eq!(
        top.predecessors()["c"].iter().next().unwrap().to_string(),
        aa
    );
}

#[test]
fn predecessors_count_over_all_roles_as_sets() {
    let hashes = |n: u32| -> Vec<String> { (0..n).map(|i| format!("{i:064x}")).collect() };
    // 1,000 in one role and 25 of the same in another: 1,025.
    let text = serde_json::json!({"type": "T", "predecessors": {
        "a": hashes(1000), "b": hashes(25)}});
    assert_eq!(
        json_error(&text.to_string()),
        "invalid fact: 1025 predecessors, over the limit of 1024"
    );
    // 1,024 hashes each written twice in one role: a set of 1,024.
    let mut twice = hashes(1024);
    twice.extend(hashes(1024));
    let text = serde_json::json!({"type": "T", "predecessors": {"a": twice}});
    let fact = json::parse_standalone(&text.to_string())
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(fact.predecessor_hashes().len(), 1024);
    // The decoder adds the roles' array lengths: role `b`'s head takes 1,000 + 25 past
    // the limit and is refused there, before its hashes are read.
    let mut bytes = vec![
        0x84, 0x01, 0x61, b'T', 0xa0, 0xa2, 0x61, b'a', 0x99, 0x03, 0xe8,
    ];
    for i in 0..1000u32 {
        // Hash i: zeros, then i big-endian, so the role's hashes ascend.
        bytes.extend([0x58, 0x20]);
        bytes.extend([0u8; 28]);
        bytes.extend(i.to_be_bytes());
    }
    let at = bytes.len() + 2;
    bytes.extend([0x61, b'b', 0x98, 25]);
    assert_eq!(
        Fact::from_canonical(&bytes).unwrap_err().to_string(),
        format!("invalid canonical cbor at byte {at}: more than 1024 predecessors")
    );
}

/// Inputs to the strict decoder, the offset it reports and the reason, in the check order
/// docs/format.md section 4 gives.
#[test]
fn the_strict_decoder_reports_the_first_rule_broken_in_reading_order() {
    let mut oversize = vec![
        0x84, 0x01, 0x61, b'T', 0xa1, 0x61, b'b', 0x5a, 0x00, 0x10, 0x00, 0x00,
    ];
    oversize.resize(oversize.len() + (1 << 20), 0);
    oversize.extend([0xa0]);
    let err = Fact::from_canonical(&oversize).unwrap_err().to_string();
    assert_eq!(
        err,
        "invalid canonical cbor at byte 1048576: fact is 1048589 bytes, over the limit of 1048576"
    );
    let cases = [
        // The input ends inside an item: the offset is the input's length.
        ("840161", 3, "unexpected end of input"),
        // A text head declaring 2^64-1 bytes: the end of the input too.
        ("84017bffffffffffffffff", 11, "unexpected end of input"),
        ("05", 0, "expected a fact array"),
        ("c084016154a0a0", 0, "expected a fact array"),
        ("83016154a0", 0, "a fact is an array of 4 items"),
        (
            "98040161 54a0a0",
            0,
            "integer or length not in its shortest form",
        ),
        ("84026154a0a0", 1, "unsupported format version 2"),
        ("84016054a0a0", 2, "type name is empty"),
        // Not UTF-8: at the text's first content byte.
        ("840162c328a0a0", 3, "text is not valid utf-8"),
        // Keys: checked when read, before the value; the key's head.
        (
            "84016154a2616201616101a0",
            8,
            "map key \"a\" out of canonical order",
        ),
        ("84016154a2616101616101a0", 8, "duplicate map key \"a\""),
        // A value broken before a later key that is out of order: the value first.
        ("84016154a26162f97e00616101a0", 7, "NaN is not allowed"),
        (
            "84016154a16161fb3ff0000000000000a0",
            7,
            "float not in its shortest exact form",
        ),
        // Fields not a map: checked once the item is read, so a NaN inside comes first.
        ("84016154 81f97e00 a0", 5, "NaN is not allowed"),
        ("84016154 8101 a0", 4, "fields must be a map"),
        ("84016154a081", 5, "expected a predecessor map"),
        (
            "84016154a0a1617080",
            8,
            "empty predecessor role (empty roles are dropped)",
        ),
        (
            "84016154a0a161708141 00",
            9,
            "a predecessor hash is 32 bytes",
        ),
        ("84016154a0a0 00", 6, "trailing bytes after the fact"),
    ];
    for (hex_text, offset, reason) in cases {
        let bytes = hex::decode(hex_text.replace(' ', "")).unwrap();
        let err = Fact::from_canonical(&bytes).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("invalid canonical cbor at byte {offset}: {reason}"),
            "{hex_text}"
        );
    }
    // Two hashes out of order: at the second one's head.
    let mut bytes = hex::decode("84016154a0a1617082").unwrap();
    for b in [2u8, 1] {
        bytes.extend([0x58, 0x20]);
        bytes.extend([b; 32]);
    }
    assert_eq!(
        Fact::from_canonical(&bytes).unwrap_err().to_string(),
        "invalid canonical cbor at byte 43: predecessor hashes not sorted or duplicated"
    );
}

/// A well-framed record over the size limit of a fact is one bad record: the records
/// after it are read and stored, as the sync server's splitting does (here a byte string
/// of 1,100,000 bytes, and an array of 1,048,577 items, between two valid facts).
#[cfg(feature = "cli")]
#[test]
fn a_record_over_the_size_limit_does_not_stop_an_import() {
    use common::bin::{code, stderr};
    use common::db::Db;

    let first = hex::decode("84016154a0a0").unwrap();
    let last = hex::decode("84016155a0a0").unwrap();
    let mut bstr = vec![0x5a, 0x00, 0x10, 0xc8, 0xe0];
    bstr.resize(bstr.len() + 1_100_000, 7);
    let mut array = vec![0x9a, 0x00, 0x10, 0x00, 0x01];
    array.resize(array.len() + (1 << 20) + 1, 0);
    for (big, want) in [
        (
            bstr,
            "record 2 (byte offset 6): record of 1100005 bytes is over the limit",
        ),
        (
            array,
            "record 2 (byte offset 6): record of 1048582 bytes is over the limit",
        ),
    ] {
        let db = Db::init();
        let file = db.path.with_file_name("seq.cbor");
        std::fs::write(&file, [first.clone(), big, last.clone()].concat()).unwrap();
        let out = db.run(&["import", file.to_str().unwrap()]);
        let err = stderr(&out);
        assert_eq!(code(&out), 1, "{err}");
        assert!(err.contains(want), "{want:?} not in {err}");
        assert!(err.contains("error: 1 of 3 records in"), "{err}");
        assert_eq!(db.counts(), (2, 0), "{err}");
    }
}

/// `precedent import` of a CBOR sequence: the splitter's own messages, with the offset
/// from the record's first byte, the valid records before the bad one stored, exit 1.
/// (A well-framed record over the size limit is one bad record and the reading goes on:
/// see the next test.)
#[cfg(feature = "cli")]
#[test]
fn the_splitter_reports_its_own_refusals_on_import() {
    use common::bin::{code, stderr};
    use common::db::Db;

    const MINIMAL: &str = "84016154a0a0";
    let mut huge_record = vec![0x9a, 0x00, 0x10, 0x00, 0x01];
    huge_record.resize(huge_record.len() + (1 << 20) + 1, 0);
    let cases: [(Vec<u8>, &str); 6] = [
        (
            hex::decode("840161").unwrap(),
            "record 2 (byte offset 6): input ends inside this record (truncated)",
        ),
        (
            hex::decode("9f01ff").unwrap(),
            "record 2 (byte offset 6): invalid canonical cbor at byte 0: indefinite length or \
             reserved head; the rest of the input cannot be split into records",
        ),
        (
            hex::decode("ff").unwrap(),
            "invalid canonical cbor at byte 0: indefinite length or reserved head;",
        ),
        (
            hex::decode("5a00200000").unwrap(),
            "record 2 (byte offset 6): invalid canonical cbor at byte 5: string of 2097152 \
             bytes in a record over the size limit; the rest of the input cannot be split",
        ),
        (
            huge_record,
            "record 2 (byte offset 6): record of 1048582 bytes is over the limit of 1048576 \
             bytes",
        ),
        (
            [vec![0x81; 70], vec![0x00]].concat(),
            "invalid canonical cbor at byte 67: nesting deeper than 64 levels; the rest",
        ),
    ];
    for (tail, want) in cases {
        let db = Db::init();
        let file = db.path.with_file_name("seq.cbor");
        std::fs::write(&file, [hex::decode(MINIMAL).unwrap(), tail].concat()).unwrap();
        let out = db.run(&["import", "--format", "cbor", file.to_str().unwrap()]);
        let err = stderr(&out);
        assert_eq!(code(&out), 1, "{err}");
        assert!(err.contains(want), "{want:?} not in {err}");
        assert!(
            err.contains("error: 1 of 2 records in") && err.contains("the valid ones are stored"),
            "{err}"
        );
        assert_eq!(db.counts(), (1, 0), "{err}");
        // With --atomic, nothing.
        let db = Db::init();
        let out = db.run(&[
            "import",
            "--atomic",
            "--format",
            "cbor",
            file.to_str().unwrap(),
        ]);
        assert_eq!(code(&out), 1);
        assert_eq!(db.counts(), (0, 0));
    }
}

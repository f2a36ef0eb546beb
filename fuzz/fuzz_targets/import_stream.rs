//! The `precedent import` reader: format sniffing and record splitting from
//! `src/cli/records.rs` (compiled in here, as the binary compiles it), JSON Lines or a CBOR
//! sequence read a few bytes at a time, each record then parsed as import parses it.
//!
//! Properties: no panic; CBOR records are the same as `sync::wire::split_records` finds in
//! the bytes after the skipped byte order mark and blanks, and only the last can be bad; JSON lines are the
//! input's non-blank lines, in order.

#![no_main]

use std::io::{BufReader, Read};

use libfuzzer_sys::fuzz_target;
use precedent::sync::wire::split_records;
use precedent::{Error, Fact, json};

/// The one item of `src/cli/args.rs` that `records.rs` uses.
mod args {
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Format {
        Json,
        Cbor,
    }
}

#[allow(dead_code)]
#[path = "../../src/cli/records.rs"]
mod records;

use args::Format;
use records::{Body, CborSeq, Records, sniff};

/// A reader that hands out at most `step` bytes per call.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&knob, data)) = input.split_first() else {
        return;
    };
    let step = usize::from(knob & 0x3f) + 1;
    let forced = match knob >> 6 {
        1 => Some(Format::Json),
        2 => Some(Format::Cbor),
        _ => None,
    };
    let mut r = BufReader::with_capacity(step, Trickle { data, step });
    let (format, skipped, lines) = sniff(&mut r, forced).unwrap();
    let skipped = skipped as usize;
    assert!(skipped <= data.len());
    // A UTF-8 byte order mark, then blanks.
    let bom = if data[..skipped].starts_with(b"\xEF\xBB\xBF") { 3 } else { 0 };
    assert!(data[bom..skipped].iter().all(u8::is_ascii_whitespace));
    let mut records = match format {
        Format::Json => Records::Lines { r, line: lines },
        Format::Cbor => Records::Cbor(CborSeq::new(r, skipped as u64)),
    };
    let mut got = Vec::new();
    while let Some(rec) = records.next().unwrap() {
        got.push(rec);
    }
    match format {
        Format::Cbor => {
            let want = split_records(&data[skipped..]);
            assert_eq!(got.len(), want.len(), "import and sync split differently");
            for (rec, w) in got.iter().zip(&want) {
                match (&rec.body, w) {
                    (Body::Cbor(b), Ok(w)) => {
                        assert_eq!(&b[..], *w);
                        if let Ok(f) = Fact::from_canonical(b) {
                            assert_eq!(f.canonical_bytes(), &b[..]);
                        }
                    }
                    (Body::Bad(_), Err(_)) => {}
                    _ => panic!("import and sync disagree at {}", rec.label),
                }
            }
        }
        Format::Json => {
            let want = data[skipped..]
                .split_inclusive(|&b| b == b'\n')
                .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
                .count();
            assert_eq!(got.len(), want, "lines miscounted");
            for rec in &got {
                match &rec.body {
                    Body::Json(text) => {
                        if let Ok(spec) = json::parse(text) {
                            let _ = json::resolve(&spec, &mut |p| {
                                Err(Error::UnknownPrefix { prefix: p.text() })
                            });
                        }
                    }
                    Body::Bad(_) => {}
                    Body::Cbor(_) => panic!("a CBOR record in JSON Lines"),
                }
            }
        }
    }
});

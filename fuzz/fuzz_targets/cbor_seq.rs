//! CBOR sequences (RFC 8742), as a push body or an import file carries them:
//! `sync::wire::split_records` and `sync::wire::RecordReader` over arbitrary bytes.
//!
//! Properties: no panic; the in-memory splitter and the streaming reader (fed a few bytes
//! at a time) return the same records; the records are consecutive slices of the input;
//! only the last item can be a framing error, apart from well-framed records over the
//! size limit, which are skipped; each record that decodes re-encodes to itself.

#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use precedent::Fact;
use precedent::sync::wire::{RecordReader, split_records};

/// A reader that hands out at most `step` bytes per call, to cut records at every point.
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
    let Some((&step, data)) = input.split_first() else {
        return;
    };
    let split = split_records(data);
    let mut offset = 0;
    for (i, r) in split.iter().enumerate() {
        match r {
            Ok(rec) => {
                assert_eq!(*rec, &data[offset..offset + rec.len()]);
                offset += rec.len();
                if let Ok(f) = Fact::from_canonical(rec) {
                    assert_eq!(f.canonical_bytes(), *rec);
                }
            }
            Err(e) if e.reason.contains("is over the limit of") => {
                // A well-framed oversize record: skipped whole, the split goes on.
                let n = precedent::encoding::item_len_within(&data[offset..], data.len())
                    .unwrap()
                    .unwrap();
                assert!(n > precedent::fact::limits::MAX_FACT_BYTES);
                assert_eq!(e.bytes[..], data[offset..offset + e.bytes.len()]);
                offset += n;
            }
            Err(e) => {
                assert_eq!(i, split.len() - 1, "a framing error ends the split");
                assert!(e.bytes.len() <= data.len() - offset);
                assert_eq!(e.bytes[..], data[offset..offset + e.bytes.len()]);
            }
        }
    }
    let mut reader = RecordReader::new(Trickle {
        data,
        step: usize::from(step % 64) + 1,
    });
    let mut streamed = Vec::new();
    while let Some(r) = reader
        .next_record()
        .expect("reading from memory cannot fail")
    {
        streamed.push(r);
    }
    assert_eq!(
        streamed.len(),
        split.len(),
        "reader and splitter count differently"
    );
    for (s, m) in streamed.iter().zip(&split) {
        match (s, m) {
            (Ok(a), Ok(b)) => assert_eq!(&a[..], *b),
            (Err(a), Err(b)) => assert_eq!(a.truncated, b.truncated),
            _ => panic!("reader and splitter disagree: {s:?} vs {m:?}"),
        }
    }
});

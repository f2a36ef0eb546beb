//! Splitting an import stream into records: JSON Lines by line, a CBOR sequence
//! (RFC 8742) by `encoding::item_len`, and telling the two apart.

use std::io::{self, BufRead, Read};

use precedent::encoding;
use precedent::fact::limits::MAX_FACT_BYTES;

use super::args::Format;

/// Bytes read at a time from a CBOR sequence.
pub const READ_BYTES: usize = 64 << 10;

/// Most bytes read of a record too large for a fact to find its end and skip it (as the
/// sync server's stream reader does); past that, the rest of the input is one bad record.
const MAX_OVERSIZE: usize = 64 << 20;

/// One record of the input, not yet parsed.
pub struct Record {
    /// `line N` or `record N (byte offset B)`, for messages.
    pub label: String,
    pub body: Body,
}

pub enum Body {
    Json(String),
    Cbor(Vec<u8>),
    /// A record that could not even be read as text or framed as CBOR.
    Bad(String),
}

/// Splits the input into records, one at a time.
pub enum Records<R> {
    Lines { r: R, line: u64 },
    Cbor(CborSeq<R>),
}

impl<R: BufRead> Records<R> {
    pub fn next(&mut self) -> io::Result<Option<Record>> {
        match self {
            Records::Lines { r, line } => loop {
                let mut buf = Vec::new();
                if r.read_until(b'\n', &mut buf)? == 0 {
                    return Ok(None);
                }
                *line += 1;
                if buf.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let label = format!("line {line}");
                let body = match String::from_utf8(buf) {
                    Ok(text) => Body::Json(text),
                    Err(e) => Body::Bad(format!(
                        "not valid utf-8 (at byte {} of the line)",
                        e.utf8_error().valid_up_to()
                    )),
                };
                return Ok(Some(Record { label, body }));
            },
            Records::Cbor(seq) => seq.next(),
        }
    }
}

/// A CBOR sequence split with `encoding::item_len`, holding at most one record plus one
/// read in memory.
pub struct CborSeq<R> {
    r: R,
    buf: Vec<u8>,
    start: usize,
    /// Stream offset of `buf[start]`.
    offset: u64,
    index: u64,
    eof: bool,
    stopped: bool,
    /// The walk over a record too large for a fact, being skipped, with the reason
    /// `item_len` gave.
    skipping: Option<(encoding::ItemScan, String)>,
}

impl<R> CborSeq<R> {
    /// A sequence whose first byte is at stream offset `offset`.
    pub fn new(r: R, offset: u64) -> CborSeq<R> {
        CborSeq {
            r,
            buf: Vec::new(),
            start: 0,
            offset,
            index: 0,
            eof: false,
            stopped: false,
            skipping: None,
        }
    }
}

impl<R: Read> CborSeq<R> {
    pub fn next(&mut self) -> io::Result<Option<Record>> {
        while !self.stopped {
            let avail = &self.buf[self.start..];
            if avail.is_empty() && self.eof {
                return Ok(None);
            }
            if !avail.is_empty() {
                // A record known to be over a fact's size goes on being walked where the
                // last piece ended (`skipping`), not from its start.
                let framed = match &self.skipping {
                    Some((_, e)) => Err(e.clone()),
                    None => encoding::item_len(avail).map_err(|e| e.to_string()),
                };
                let label = format!("record {} (byte offset {})", self.index + 1, self.offset);
                // A record and whether the reading stops after it.
                let found = match framed {
                    Ok(Some(n)) => Some((Body::Cbor(avail[..n].to_vec()), n, false)),
                    Ok(None) if self.eof => Some((
                        Body::Bad("input ends inside this record (truncated)".into()),
                        0,
                        true,
                    )),
                    Ok(None) => None,
                    // A well-framed record too large for a fact is one bad record, and the
                    // reading goes on after it, as the sync server's splitting does.
                    Err(e) => match self
                        .skipping
                        .get_or_insert_with(|| (encoding::ItemScan::new(), e.clone()))
                        .0
                        .resume(avail, usize::MAX)
                    {
                        Ok(Some(n)) => Some((
                            Body::Bad(format!(
                                "record of {n} bytes is over the limit of {MAX_FACT_BYTES} bytes"
                            )),
                            n,
                            false,
                        )),
                        Ok(None) if !self.eof && avail.len() < MAX_OVERSIZE => None,
                        _ => Some((
                            Body::Bad(format!(
                                "{e}; the rest of the input cannot be split into records"
                            )),
                            0,
                            true,
                        )),
                    },
                };
                if let Some((body, n, stop)) = found {
                    self.skipping = None;
                    self.start += n;
                    self.offset += n as u64;
                    self.index += 1;
                    self.stopped = stop;
                    return Ok(Some(Record { label, body }));
                }
            }
            self.fill()?;
        }
        Ok(None)
    }

    fn fill(&mut self) -> io::Result<()> {
        self.buf.drain(..self.start);
        self.start = 0;
        let old = self.buf.len();
        self.buf.resize(old + READ_BYTES, 0);
        let n = loop {
            match self.r.read(&mut self.buf[old..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(e);
                }
            }
        };
        self.buf.truncate(old + n);
        self.eof = n == 0;
        Ok(())
    }
}

/// The UTF-8 byte order mark some editors write at the start of a text file.
const BOM: &[u8] = b"\xEF\xBB\xBF";
/// The first byte of every fact's canonical encoding: the head of an array of four.
const FACT_HEAD: u8 = 0x84;

/// Chooses the format without consuming anything but a UTF-8 byte order mark and leading
/// whitespace; returns it with the bytes and newlines skipped. A CBOR sequence of facts
/// starts with a fact's array head (`0x84`, which no text starts with); anything else is
/// JSON Lines, so that a text file whose first line is bad (a header, a stray character)
/// still has its other lines read, each judged on its own.
pub fn sniff(r: &mut impl BufRead, format: Option<Format>) -> io::Result<(Format, u64, u64)> {
    let (mut skipped, mut lines) = (0u64, 0u64);
    if format != Some(Format::Cbor) && r.fill_buf()?.starts_with(BOM) {
        r.consume(BOM.len());
        skipped += BOM.len() as u64;
    }
    loop {
        let buf = r.fill_buf()?;
        let blank = buf.iter().take_while(|b| b.is_ascii_whitespace()).count();
        let found = buf.get(blank).copied();
        if found.is_some() || buf.is_empty() {
            let sniffed = match found {
                Some(FACT_HEAD) => Format::Cbor,
                _ => Format::Json,
            };
            return Ok((format.unwrap_or(sniffed), skipped, lines));
        }
        skipped += blank as u64;
        lines += buf.iter().filter(|&&b| b == b'\n').count() as u64;
        r.consume(blank);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that gives as much as it is asked for (64 KiB a read) and counts its
    /// reads.
    struct Counted<'a> {
        data: &'a [u8],
        reads: usize,
    }

    impl Read for Counted<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            self.reads += 1;
            let n = out.len().min(self.data.len());
            out[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn an_oversize_record_is_skipped_a_read_at_a_time_and_the_next_one_read() {
        // An array of 8,000,000 zeros (8 MiB), past a fact's size, then a small record.
        let mut data = vec![0x9a, 0x00, 0x7a, 0x12, 0x00];
        data.resize(5 + 8_000_000, 0);
        let next = [0x83, 0x01, 0x02, 0x03];
        data.extend_from_slice(&next);
        let mut seq = CborSeq::new(
            Counted {
                data: &data,
                reads: 0,
            },
            0,
        );
        let first = seq.next().unwrap().unwrap();
        assert!(
            matches!(&first.body, Body::Bad(m) if m.contains("over the limit")),
            "{}",
            first.label
        );
        let second = seq.next().unwrap().unwrap();
        assert!(matches!(&second.body, Body::Cbor(b) if b[..] == next[..]));
        assert!(seq.next().unwrap().is_none());
        // Read a piece at a time (each walked once: `encoding::ItemScan`), not waiting
        // for more than one read before it looks.
        assert!(seq.r.reads > 100, "{} reads", seq.r.reads);
    }
}

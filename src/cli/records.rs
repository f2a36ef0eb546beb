//! Splitting an import stream into records: JSON Lines by line, a CBOR sequence
//! (RFC 8742) by `encoding::item_len`, and telling the two apart.

use std::io::{self, BufRead, Read};

use precedent::encoding;

use super::args::Format;

/// Bytes read at a time from a CBOR sequence.
pub const READ_BYTES: usize = 64 << 10;

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
                let framed = encoding::item_len(avail);
                let label = format!("record {} (byte offset {})", self.index + 1, self.offset);
                let body = match framed {
                    Ok(Some(n)) => {
                        let body = Body::Cbor(avail[..n].to_vec());
                        self.start += n;
                        self.offset += n as u64;
                        Some(body)
                    }
                    Ok(None) if self.eof => Some(Body::Bad(
                        "input ends inside this record (truncated)".into(),
                    )),
                    Ok(None) => None,
                    Err(e) => Some(Body::Bad(format!(
                        "{e}; the rest of the input cannot be split into records"
                    ))),
                };
                if let Some(body) = body {
                    self.index += 1;
                    self.stopped = matches!(body, Body::Bad(_));
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

/// Chooses the format (the first non-blank byte `{` means JSON Lines) without consuming
/// anything but leading whitespace; returns it with the bytes and newlines skipped.
pub fn sniff(r: &mut impl BufRead, format: Option<Format>) -> io::Result<(Format, u64, u64)> {
    let (mut skipped, mut lines) = (0u64, 0u64);
    loop {
        let buf = r.fill_buf()?;
        let blank = buf.iter().take_while(|b| b.is_ascii_whitespace()).count();
        let found = buf.get(blank).copied();
        if found.is_some() || buf.is_empty() {
            let sniffed = match found {
                Some(b'{') | None => Format::Json,
                Some(_) => Format::Cbor,
            };
            return Ok((format.unwrap_or(sniffed), skipped, lines));
        }
        skipped += blank as u64;
        lines += buf.iter().filter(|&&b| b == b'\n').count() as u64;
        r.consume(blank);
    }
}

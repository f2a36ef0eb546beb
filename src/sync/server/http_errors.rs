//! JSON bodies for the errors hyper answers by itself, below the routes.
//!
//! hyper answers a request it cannot parse with a bare status and no body: 400 (a bad
//! request line or header), 414 (a URI over 64 KiB) and 431 (headers over its buffer),
//! and closes the connection; when the header read timeout fires it closes the connection
//! without a word. The protocol promises a JSON body with every error
//! (`docs/protocol.md`, "Errors"), so the connection's stream is wrapped in
//! [`Intercept`], which
//! - replaces those bare answers, as hyper writes them, with the same status and a JSON
//!   body (they are the only answers hyper writes with `content-length: 0` and one of
//!   these statuses: every answer of the routes has a body);
//! - writes a 408 `timeout` answer when the connection is dropped in the middle of its
//!   first request (the header read timeout), on plain TCP only: it is written without
//!   waiting, from `Drop`, which TLS cannot do. (After a first answer, bytes read may be
//!   the rest of a body the server did not want, so nothing is written then.)

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::sync::wire::ErrorBody;

/// A stream that can write a few bytes without waiting, from `Drop`.
pub(super) trait WriteNow {
    /// Writes what it can of `buf` at once; errors are ignored.
    fn write_now(&self, buf: &[u8]);
}

impl WriteNow for tokio::net::TcpStream {
    fn write_now(&self, buf: &[u8]) {
        let _ = self.try_write(buf);
    }
}

impl<S> WriteNow for tokio_rustls::server::TlsStream<S> {
    fn write_now(&self, _buf: &[u8]) {}
}

/// A connection's stream, with hyper's bare error answers given JSON bodies.
pub(super) struct Intercept<S: WriteNow> {
    inner: S,
    /// Bytes still to write of a replaced answer.
    out: Vec<u8>,
    /// Bytes of a request read since the last answer started, and no end of stream.
    in_request: bool,
    /// An answer was written, or the connection cannot answer any more.
    quiet: bool,
    /// The last write was cut short: what hyper writes next continues it (the rest of a
    /// body, whose bytes may look like anything), so it is not the start of an answer.
    partial: bool,
}

impl<S: WriteNow> Intercept<S> {
    pub(super) fn new(inner: S) -> Intercept<S> {
        Intercept {
            inner,
            out: Vec::new(),
            in_request: false,
            quiet: false,
            partial: false,
        }
    }
}

/// The JSON answer standing for hyper's bare one in `head`, if `head` is one.
fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    let (code, message) = if head.starts_with(b"HTTP/1.1 400 ") {
        ("bad_request", "the request line or a header is malformed")
    } else if head.starts_with(b"HTTP/1.1 414 ") {
        (
            "uri_too_long",
            "the request URI is over 64 KiB; a scoped pull with many roots sends them in a POST /v1/pull body",
        )
    } else if head.starts_with(b"HTTP/1.1 431 ") {
        (
            "headers_too_large",
            "the request headers are over the server's limit",
        )
    } else {
        return None;
    };
    let lower = head.to_ascii_lowercase();
    if !lower.windows(19).any(|w| w == b"content-length: 0\r\n") {
        return None;
    }
    let status = std::str::from_utf8(&head[9..12]).ok()?;
    Some(answer(status, code, message))
}

/// A complete answer with a JSON error body that closes the connection.
fn answer(status: &str, code: &str, message: &str) -> Vec<u8> {
    let body = serde_json::to_vec(&ErrorBody {
        error: code.into(),
        message: message.into(),
    })
    .expect("error body serialises");
    let reason = match status {
        "400" => "Bad Request",
        "408" => "Request Timeout",
        "414" => "URI Too Long",
        _ => "Request Header Fields Too Large",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

impl<S: AsyncWrite + WriteNow + Unpin> Intercept<S> {
    /// Whether hyper starts an answer with `buf`: its status line, written after a
    /// request was read and not in the middle of an earlier write (a body's bytes, which
    /// a pulled fact's text can make look like a status line).
    fn answer_starts(&self, buf: &[u8]) -> bool {
        self.in_request && !self.partial && buf.starts_with(b"HTTP/1.1 ")
    }

    /// Writes what is left of a replaced answer.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + WriteNow + Unpin> AsyncRead for Intercept<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = ready!(Pin::new(&mut this.inner).poll_read(cx, buf));
        match &r {
            Ok(()) if buf.filled().len() > before => this.in_request = true,
            _ => this.quiet = true, // end of stream or an error: no one to answer
        }
        Poll::Ready(r)
    }
}

impl<S: AsyncWrite + WriteNow + Unpin> AsyncWrite for Intercept<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        if this.answer_starts(buf) {
            this.in_request = false;
            this.quiet = true;
            if let Some(out) = replacement(buf) {
                this.out = out;
                // The bare answer counts as written; the JSON one goes out in its place,
                // now or in the flush hyper makes before it closes.
                let _ = this.drain(cx)?;
                return Poll::Ready(Ok(buf.len()));
            }
        }
        let written = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.partial = written < buf.len();
        Poll::Ready(Ok(written))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let first = bufs.iter().find(|b| !b.is_empty());
        if first.is_some_and(|b| this.answer_starts(b)) || !this.out.is_empty() {
            // An answer starts (or a replaced one is going out): one slice at a time, so
            // that the check above sees the head by itself.
            return Pin::new(this).poll_write(cx, first.map_or(&[][..], |b| &b[..]));
        }
        let written = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))?;
        this.partial = written < bufs.iter().map(|b| b.len()).sum();
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        this.quiet = true;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: WriteNow> Drop for Intercept<S> {
    fn drop(&mut self) {
        if self.in_request && !self.quiet {
            self.inner.write_now(&answer(
                "408",
                "timeout",
                "the request's headers did not arrive within the request timeout",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connection that reads `input` and takes at most `max` bytes a write.
    struct Slow {
        input: Vec<u8>,
        out: Vec<u8>,
        max: usize,
    }

    impl WriteNow for Slow {
        fn write_now(&self, _buf: &[u8]) {}
    }

    impl AsyncRead for Slow {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            let n = this.input.len().min(buf.remaining());
            buf.put_slice(&this.input[..n]);
            this.input.drain(..n);
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Slow {
        fn poll_write(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            let n = buf.len().min(this.max);
            this.out.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A body whose bytes look like a bare error answer passes through untouched, when a
    /// write cut short leaves them at the start of the next write, and also when the
    /// client has sent its next request meanwhile.
    #[tokio::test]
    async fn body_bytes_that_look_like_an_answer_pass_through() {
        let head = b"HTTP/1.1 200 OK\r\ncontent-length: 48\r\n\r\n".to_vec();
        let body = b"xxxxHTTP/1.1 400 Bad\r\ncontent-length: 0\r\n\r\nyyyyyyy".to_vec();
        for pipelined in [false, true] {
            let mut c = Intercept::new(Slow {
                input: b"GET /v1/facts HTTP/1.1\r\n\r\n".to_vec(),
                out: Vec::new(),
                max: 4,
            });
            let mut request = [0u8; 64];
            let _ = c.read(&mut request).await.unwrap();
            c.inner.max = usize::MAX;
            c.write_all(&head).await.unwrap();
            if pipelined {
                c.inner.input = b"GET /v1/info HTTP/1.1\r\n\r\n".to_vec();
                let _ = c.read(&mut request).await.unwrap();
            }
            c.inner.max = 4;
            c.write_all(&body).await.unwrap();
            c.flush().await.unwrap();
            assert_eq!(
                c.inner.out,
                [head.clone(), body.clone()].concat(),
                "{pipelined}"
            );
        }
    }

    /// A bare answer to a request hyper could not parse is still replaced.
    #[tokio::test]
    async fn a_bare_answer_after_a_request_is_replaced() {
        let mut c = Intercept::new(Slow {
            input: b"GET /\x01 HTTP/1.1\r\n\r\n".to_vec(),
            out: Vec::new(),
            max: usize::MAX,
        });
        let mut request = [0u8; 64];
        let _ = c.read(&mut request).await.unwrap();
        c.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        c.flush().await.unwrap();
        assert!(
            c.inner.out.ends_with(b"}"),
            "{:?}",
            String::from_utf8_lossy(&c.inner.out)
        );
    }

    #[test]
    fn only_bare_parse_error_answers_are_replaced() {
        let bare = b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let out = replacement(bare).unwrap();
        assert!(out.starts_with(b"HTTP/1.1 414 URI Too Long\r\n"));
        assert!(out.ends_with(b"}"));
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 57\r\n\r\n{..}";
        assert!(replacement(ours).is_none());
        assert!(replacement(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
    }
}

//! The access log: one `tracing` event per request, at info level with target
//! `precedent::access`, once its answer has been sent: method, path, status, duration
//! and bytes of the answer's body.
//!
//! The event is emitted when the answer's body is dropped, that is after its last byte
//! was written (or the peer went away), so a streamed pull is logged with all the bytes
//! it sent and the time it took. Nothing is logged unless the application installs a
//! `tracing` subscriber, as `precedent serve` does.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};

/// `router` with every request logged.
pub(super) fn logged(router: Router) -> Router {
    router.layer(middleware::from_fn(log_request))
}

async fn log_request(req: Request, next: Next) -> Response {
    // Dropped unanswered (the peer went away first), the entry logs status 0.
    let mut entry = Entry {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        status: 0,
        start: Instant::now(),
        bytes: 0,
    };
    let response = next.run(req).await;
    let (parts, body) = response.into_parts();
    entry.status = parts.status.as_u16();
    Response::from_parts(parts, Body::new(Counted { inner: body, entry }))
}

/// One line of the log, written when dropped.
struct Entry {
    method: String,
    path: String,
    status: u16,
    start: Instant,
    bytes: u64,
}

impl Drop for Entry {
    fn drop(&mut self) {
        let elapsed = self.start.elapsed();
        tracing::info!(
            target: "precedent::access",
            duration_ms = format_args!("{:.3}", elapsed.as_secs_f64() * 1000.0),
            bytes = self.bytes,
            "{} {} {}",
            self.method,
            self.path,
            self.status,
        );
    }
}

/// A response body that counts the bytes it yields into its log entry.
struct Counted {
    inner: Body,
    entry: Entry,
}

impl hyper::body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.entry.bytes += data.len() as u64;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

//! The state every request shares: the store, tokens, limits, metrics, and the JSON
//! error answer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

use super::Limits;
use crate::error::{Error, Result};
use crate::store::Store;
use crate::sync::SetDigest;
use crate::sync::auth::{Access, Grant, Tokens};
use crate::sync::metrics::Metrics;
use crate::sync::wire::{self, ErrorBody};

pub(super) struct App {
    /// The served store, shared by every request.
    pub(super) store: Arc<Store>,
    pub(super) tokens: Tokens,
    pub(super) limits: Limits,
    pub(super) poll: Duration,
    pub(super) metrics: Metrics,
    /// The digest of the released set, brought up to date incrementally.
    pub(super) digest: Mutex<SetDigest>,
    pub(super) shutdown: watch::Receiver<bool>,
    /// The served database's identity (`precedent-store` header).
    pub(super) store_id: HeaderValue,
    /// The memory budget of pushes, in KiB of request body: a push takes as many
    /// permits as its body's length in KiB before it reads the body, and gives them back when
    /// it has been stored. So the bodies held in memory at once, and the one decoded
    /// beside them, stay bounded whatever the number of concurrent pushes.
    pub(super) push_budget: Arc<tokio::sync::Semaphore>,
    /// The budget in bytes (`push_budget` has as many permits as KiB in it).
    pub(super) push_budget_bytes: usize,
    /// One permit: the push whose body is being stored.
    pub(super) push_turn: Arc<tokio::sync::Semaphore>,
    /// Threads decoding a push ([`super::ServerConfig::decode_threads`]).
    pub(super) decode_threads: usize,
    /// The figures `GET /v1/events` sends.
    pub(super) events: super::sse::Events,
    /// The shared watches of `GET /v1/watch`.
    pub(super) watches: super::fanout::Watches,
}

impl App {
    /// Runs `f` with the store on a blocking thread: store calls block, and must not
    /// stall the runtime's workers.
    pub(super) async fn with_store<T: Send + 'static>(
        self: &Arc<App>,
        f: impl FnOnce(&Store) -> Result<T> + Send + 'static,
    ) -> Result<T, Failure> {
        let app = self.clone();
        tokio::task::spawn_blocking(move || f(&app.store))
            .await
            .map_err(|e| Failure::internal(format!("worker failed: {e}")))?
            .map_err(Failure::from)
    }
}

/// An error answer: status, code and message, sent as JSON.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) status: StatusCode,
    pub(super) code: &'static str,
    pub(super) message: String,
    /// Seconds to send as `Retry-After` (503 answers).
    pub(super) retry_after: Option<u64>,
}

impl Failure {
    pub(super) fn new(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> Failure {
        // One line, whatever it quotes (an unknown JSON key with line breaks in it).
        let message: String = message.into();
        let message = if message.contains(['\n', '\r']) {
            message.replace('\n', "\\n").replace('\r', "\\r")
        } else {
            message
        };
        Failure {
            status,
            code,
            message,
            retry_after: None,
        }
    }

    /// The same failure, asking the client to retry after `secs` seconds.
    pub(super) fn retry_after(mut self, secs: u64) -> Failure {
        self.retry_after = Some(secs);
        self
    }

    pub(super) fn internal(message: String) -> Failure {
        Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        match e {
            Error::HeldLimit { limit, .. } => Failure::new(
                StatusCode::TOO_MANY_REQUESTS,
                "held_limit",
                format!(
                    "this peer already has {limit} facts held here, the most allowed; send their ancestors first"
                ),
            ),
            Error::UnknownQueue { name } => Failure::new(
                StatusCode::NOT_FOUND,
                "unknown_queue",
                format!("no queue {name:?} is declared here"),
            ),
            e if e.is_busy() => Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "database is busy; retry",
            )
            .retry_after(1),
            // The database server is down or restarting; the store reconnects on the
            // next request.
            e if e.is_unavailable() => Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!("database unavailable; retry: {e}"),
            )
            .retry_after(1),
            other => Failure::internal(other.to_string()),
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let mut r = error_response(self.status, self.code, &self.message);
        if let Some(secs) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        r
    }
}

pub(super) fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::to_vec(&ErrorBody {
        error: code.into(),
        message: message.into(),
    })
    .expect("error body serialises");
    let mut r = (status, body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(wire::JSON));
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

/// Who is asking and what they may do.
pub(super) struct Caller {
    pub(super) name: String,
    pub(super) grant: Option<Grant>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Need {
    Read,
    Write,
    /// Redrive and discard queue entries (`super::console`).
    Admin,
}

pub(super) fn authorize(app: &App, headers: &HeaderMap, need: Need) -> Result<Caller, Failure> {
    let header = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    // The console's cookie stands in for the header only for reading: an EventSource
    // cannot send a header, and nothing a cookie alone authorizes changes the store
    // (docs/ui.md, "Tokens in a browser").
    let cookie = match (header, need) {
        (None, Need::Read) => super::console::cookie_token(headers),
        _ => None,
    };
    let auth = header.or(cookie.as_deref());
    match app.tokens.check(auth) {
        Access::Open => Ok(Caller {
            name: "anonymous".into(),
            grant: None,
        }),
        Access::Unauthorized => Err(Failure::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or unknown bearer token",
        )),
        Access::Granted(g) => {
            let (ok, what) = match need {
                Need::Read => (g.read, "read"),
                Need::Write => (g.write, "write"),
                Need::Admin => (g.admin, "administer queues"),
            };
            if !ok {
                return Err(Failure::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    format!("token {:?} may not {what}", g.name),
                ));
            }
            Ok(Caller {
                name: g.name.clone(),
                grant: Some(g.clone()),
            })
        }
    }
}

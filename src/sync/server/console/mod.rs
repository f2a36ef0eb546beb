//! The web console (`/ui/`) and the JSON endpoints it reads (`docs/ui.md`).
//!
//! - [`ui`]: the embedded assets, their security headers, and `POST /ui/login`, which
//!   sets the cookie an `EventSource` needs;
//! - [`lists`]: the paged lists (held facts, peers, quarantine, fact search, successors)
//!   as keyset pages over the store's indexes;
//! - this file: the routes, the paging parameters and the queue endpoints, redrive and
//!   discard among them.
//!
//! Every list answers `{"items": [...], "next": CURSOR}`: `next` is `null` on the last
//! page, and otherwise the opaque `after` of the next one. `limit` is 1 to 1000
//! (default 100).

mod lists;
mod queues;
mod ui;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{get, post};
use serde::Serialize;

use super::app::{App, Failure, Need, authorize};
use super::routes::{bad_request, json_response};

pub(super) use ui::cookie_token;

/// Most items a page may ask for.
const MAX_LIMIT: usize = 1000;
/// Items in a page that names no `limit`.
const DEFAULT_LIMIT: usize = 100;

/// The console's routes, merged into the server's.
pub(super) fn router() -> Router<Arc<App>> {
    Router::new()
        .route("/ui", get(ui::redirect))
        .route("/ui/", get(ui::index))
        .route("/ui/login", post(ui::login))
        .route("/ui/{asset}", get(ui::asset))
        .route("/v1/overview", get(queues::overview))
        .route("/v1/queues", get(queues::list))
        .route("/v1/queues/{name}", get(queues::one))
        .route("/v1/queues/{name}/items", get(queues::items))
        .route("/v1/queues/{name}/redrive", post(queues::redrive))
        .route("/v1/queues/{name}/discard", post(queues::discard))
        .route("/v1/held", get(lists::held))
        .route("/v1/peers", get(lists::peers))
        .route("/v1/quarantine", get(lists::quarantine))
        .route("/v1/find", get(lists::find))
        .route("/v1/facts/{hash}/successors", get(lists::successors))
}

/// A list endpoint's query parameters: `limit`, `after` and those `allowed` besides.
struct Params {
    limit: usize,
    after: Option<String>,
    rest: BTreeMap<String, String>,
}

type RawParams = Result<Query<BTreeMap<String, String>>, QueryRejection>;

impl Params {
    /// A list request's permission (read) and parameters.
    fn read(
        app: &App,
        headers: &HeaderMap,
        raw: RawParams,
        allowed: &[&str],
    ) -> Result<Params, Failure> {
        authorize(app, headers, Need::Read)?;
        Params::parse(raw, allowed)
    }

    fn parse(raw: RawParams, allowed: &[&str]) -> Result<Params, Failure> {
        let Query(mut map) = raw.map_err(|e| bad_request(format!("query string: {e}")))?;
        let limit = match map.remove("limit") {
            None => DEFAULT_LIMIT,
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
                _ => {
                    return Err(bad_request(format!(
                        "limit must be 1 to {MAX_LIMIT}, not {v:?}"
                    )));
                }
            },
        };
        let after = map.remove("after").filter(|a| !a.is_empty());
        if let Some(k) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(bad_request(format!("unknown parameter {k:?}")));
        }
        Ok(Params {
            limit,
            after,
            rest: map,
        })
    }

    /// `after` as a sequence number or row id (absent: `none`).
    fn after_int(&self, none: i64) -> Result<i64, Failure> {
        match &self.after {
            None => Ok(none),
            Some(a) => a
                .parse::<i64>()
                .map_err(|_| bad_request(format!("after={a:?} is not a cursor of this list"))),
        }
    }
}

/// A page of a list: its items and the cursor of the next page.
#[derive(Serialize)]
struct Page<T> {
    items: Vec<T>,
    next: Option<String>,
}

/// Answers the first `limit` of `items`, read with one more than `limit` so that a
/// next page is promised only when it exists; `cursor` gives an item's cursor.
fn page<T: Serialize>(mut items: Vec<T>, limit: usize, cursor: impl Fn(&T) -> String) -> Response {
    let next = if items.len() > limit {
        items.truncate(limit);
        items.last().map(cursor)
    } else {
        None
    };
    json_response(&Page { items, next })
}

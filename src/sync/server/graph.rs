//! `GET /v1/graph/HASH?depth=N&format=svg|dot|json`: a fact's neighbourhood
//! ([`crate::graph`]), the same code as `precedent graph`.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::app::{App, Failure, Need, authorize};
use super::json_api::full_hash;
use super::routes::bad_request;
use crate::graph::Neighbourhood;

/// The deepest walk asked for.
const MAX_DEPTH: u32 = 10;

pub(super) async fn graph(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(hash): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, Failure> {
    authorize(&app, &headers, Need::Read)?;
    let hash = full_hash(&hash)?;
    let (depth, format) = parse(q.as_deref())?;
    let n = app
        .with_store(move |s| match Neighbourhood::walk(s, &hash, depth) {
            Err(crate::Error::NotFound { .. }) => Ok(None),
            other => other.map(Some),
        })
        .await?
        .ok_or_else(|| {
            Failure::new(
                axum::http::StatusCode::NOT_FOUND,
                "not_found",
                format!("no released fact {hash}"),
            )
        })?;
    let (body, kind) = match format {
        "dot" => (n.to_dot(), "text/vnd.graphviz; charset=utf-8"),
        "json" => (n.to_json().to_string(), "application/json"),
        _ => (n.to_svg(), "image/svg+xml"),
    };
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    // Opened on its own, the picture may run nothing and load nothing.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
    );
    Ok(r)
}

/// `depth` (default 2, at most [`MAX_DEPTH`]) and `format` (default `svg`).
fn parse(q: Option<&str>) -> Result<(u32, &'static str), Failure> {
    let (mut depth, mut format) = (2, "svg");
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "depth" => {
                depth = v.parse().ok().filter(|d| *d <= MAX_DEPTH).ok_or_else(|| {
                    bad_request(format!("depth must be 0 to {MAX_DEPTH}, not {v:?}"))
                })?
            }
            "format" => {
                format = match v {
                    "svg" => "svg",
                    "dot" => "dot",
                    "json" => "json",
                    _ => {
                        return Err(bad_request(format!(
                            "format must be svg, dot or json, not {v:?}"
                        )));
                    }
                }
            }
            _ => return Err(bad_request(format!("unknown parameter {k:?}"))),
        }
    }
    Ok((depth, format))
}

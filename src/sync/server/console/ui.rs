//! The console's assets, embedded in the binary, served with a strict
//! Content-Security-Policy; and the login that sets the token cookie.
//!
//! The console keeps its token in `sessionStorage` and sends it as
//! `Authorization: Bearer` on every fetch. An `EventSource` cannot send a header, so
//! `POST /ui/login` (same origin only) also sets the token as an `HttpOnly`,
//! `SameSite=Strict` cookie, which the server accepts in place of the header for
//! reading only (`super::super::app::authorize`): a page of another site can neither
//! send it (SameSite) nor change anything with it (no write or admin through a cookie).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::sync::auth::Access;
use crate::sync::server::app::{App, Failure};
use crate::sync::server::routes::{bad_request, read_body, require_content_type};
use crate::sync::wire;

/// The cookie that carries the token for `EventSource`.
const COOKIE: &str = "precedent_token";

/// The policy of every console page: only this origin's own script, style, images and
/// connections; no inline script or style, no plugins, never framed.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// Each asset: its name under `/ui/`, its type, its bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../ui/index.html"),
    ),
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/console.js"),
    ),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_bytes!("../ui/console.css"),
    ),
];

fn serve(name: &str) -> Response {
    let Some((_, ty, bytes)) = ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return Failure::new(StatusCode::NOT_FOUND, "not_found", "no such console asset")
            .into_response();
    };
    let mut r = Response::new(Body::from(*bytes));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ty));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// `GET /ui`: to `/ui/`, so that relative asset paths resolve.
pub(super) async fn redirect() -> Response {
    (
        StatusCode::PERMANENT_REDIRECT,
        [(header::LOCATION, HeaderValue::from_static("/ui/"))],
    )
        .into_response()
}

/// `GET /ui/`: the page. It holds no data, so it needs no token.
pub(super) async fn index() -> Response {
    serve("index.html")
}

/// `GET /ui/ASSET`.
pub(super) async fn asset(Path(name): Path<String>) -> Response {
    serve(&name)
}

/// Whether the request comes from a page of this server: its `Origin` names the host
/// the request was sent to. A browser always sends `Origin` on a cross-origin POST.
fn same_origin(headers: &HeaderMap) -> bool {
    let get = |h| headers.get(h).and_then(|v: &HeaderValue| v.to_str().ok());
    match (get(header::ORIGIN), get(header::HOST)) {
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_some_and(|(scheme, rest)| matches!(scheme, "http" | "https") && rest == host),
        _ => false,
    }
}

/// `POST /ui/login` with `{"token": T}`: checks the token and sets it as the cookie.
/// 403 from another origin, 401 for an unknown token; on an open server, 204 and no
/// cookie.
pub(super) async fn login(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    if !same_origin(&headers) {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "login must come from a page of this server (Origin does not match Host)",
        ));
    }
    require_content_type(&headers, wire::JSON)?;
    let bytes = read_body(&app, body).await?;
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Login {
        token: String,
    }
    let login: Login = serde_json::from_slice(&bytes)
        .map_err(|e| bad_request(format!("login body is not {{\"token\": TEXT}}: {e}")))?;
    let token_ok = login
        .token
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b';' && b != b',');
    let bearer = format!("Bearer {}", login.token);
    match app.tokens.check(Some(bearer.as_bytes())) {
        Access::Open => Ok(StatusCode::NO_CONTENT.into_response()),
        Access::Granted(_) if token_ok => {
            let cookie = format!(
                "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
                login.token
            );
            let value = HeaderValue::from_str(&cookie)
                .map_err(|_| bad_request("the token cannot be a cookie"))?;
            Ok((StatusCode::NO_CONTENT, [(header::SET_COOKIE, value)]).into_response())
        }
        _ => Err(Failure::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "unknown token",
        )),
    }
}

/// The token of the console's cookie, as an `Authorization` header value.
pub(crate) fn cookie_token(headers: &HeaderMap) -> Option<Vec<u8>> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .map(|t| format!("Bearer {t}").into_bytes())
}

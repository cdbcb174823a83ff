//! Who may call a route, declared where the route is: `reads(get(handler))`,
//! `writes(post(handler))`; a route wrapped in neither is open. With tokens configured
//! (`[auth]`), reads need the read or the write token, writes the write token; without a
//! read token, reads are open. The OpenAPI document declares the same levels, and a test
//! tries every route against them.
//!
//! A token is presented as `Authorization: Bearer <token>`, or as other tools' clients send
//! theirs: `Authorization: Token <token>` (InfluxDB 2.x) or basic authentication with the
//! token as the password (any user name). InfluxDB 1.x's `?u=&p=` query parameters are taken
//! only on the route that speaks its protocol ([`writes_with_query_password`]): elsewhere a
//! token in a URL would end up in logs for nothing.

use axum::extract::Request;
use axum::http::{header, HeaderMap};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;

use crate::auth::token_matches;
use crate::config::Auth;
use crate::error::ApiError;
use crate::state::AppState;

/// What a route needs when tokens are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// A route that reads: the read token (or the write token) when tokens are configured.
pub fn reads<S: Clone + Send + Sync + 'static>(route: MethodRouter<S>) -> MethodRouter<S> {
    guarded(route, Access::Read, false)
}

/// A route that changes data (or runs a benchmark that writes): the write token.
pub fn writes<S: Clone + Send + Sync + 'static>(route: MethodRouter<S>) -> MethodRouter<S> {
    guarded(route, Access::Write, false)
}

/// [`writes`], also taking the token as the `p` query parameter (InfluxDB 1.x's `u`/`p`).
pub fn writes_with_query_password<S: Clone + Send + Sync + 'static>(
    route: MethodRouter<S>,
) -> MethodRouter<S> {
    guarded(route, Access::Write, true)
}

fn guarded<S: Clone + Send + Sync + 'static>(
    route: MethodRouter<S>,
    access: Access,
    query_password: bool,
) -> MethodRouter<S> {
    route.route_layer(middleware::from_fn(move |request: Request, next: Next| {
        authenticate(access, query_password, request, next)
    }))
}

/// Lets the request through if its token grants `access`. The server's state comes from the
/// request's extensions, where the router puts it for every request.
async fn authenticate(
    access: Access,
    query_password: bool,
    request: Request,
    next: Next,
) -> Response {
    let Some(state) = request.extensions().get::<AppState>().cloned() else {
        return ApiError::internal("the router did not attach the server's state").into_response();
    };
    let auth = &state.config().auth;
    if !auth.is_enabled() {
        return next.run(request).await;
    }
    let from_query = query_password
        .then(|| query_parameter(request.uri().query(), "p"))
        .flatten();
    let from_header = presented_token(request.headers());
    let presented = from_header.as_deref().or(from_query.as_deref());
    match check(auth, access, presented) {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}

/// Refuses a request of a read route that writes (SQL's `INSERT` through `/v1/query`)
/// unless it presents the write token, where tokens are configured.
pub fn check_writes(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let auth = &state.config().auth;
    if !auth.is_enabled() {
        return Ok(());
    }
    check(auth, Access::Write, presented_token(headers).as_deref())
}

/// Whether `presented` grants `access` with tokens configured (`auth`).
fn check(auth: &Auth, access: Access, presented: Option<&str>) -> Result<(), ApiError> {
    let granted = match access {
        // Without a read token, reads are open; the write token grants reads too.
        Access::Read => {
            auth.read_token.is_none()
                || presented.is_some_and(|t| {
                    token_matches(t, &auth.read_token) || token_matches(t, &auth.write_token)
                })
        }
        Access::Write => presented.is_some_and(|t| token_matches(t, &auth.write_token)),
    };
    if granted {
        return Ok(());
    }
    Err(ApiError::unauthorized(match (presented, access) {
        (None, _) => "this route needs a bearer token (Authorization: Bearer <token>)",
        (Some(_), Access::Write) => "this route needs the write token",
        (Some(_), Access::Read) => "the token is not valid",
    }))
}

/// The token of an `Authorization` header: `Bearer <token>`, `Token <token>`, or `Basic`
/// with the token as the password.
fn presented_token(headers: &HeaderMap) -> Option<String> {
    use base64::Engine as _;
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, credentials) = value.split_once(' ')?;
    let credentials = credentials.trim();
    if scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token") {
        return Some(credentials.to_string());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(credentials)
            .ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (_user, password) = text.split_once(':')?;
        return Some(password.to_string());
    }
    None
}

/// The decoded value of query parameter `name`.
fn query_parameter(query: Option<&str>, name: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

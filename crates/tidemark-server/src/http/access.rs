//! Who may call a route, declared where the route is: `reads(get(handler))`,
//! `writes(post(handler))`; a route wrapped in neither is open. With tokens configured
//! (`[auth]`), reads need the read or the write token, writes the write token; without a
//! read token, reads are open. The OpenAPI document declares the same levels, and a test
//! tries every route against them.

use axum::extract::Request;
use axum::http::{header, HeaderMap};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;

use crate::auth::token_matches;
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
    guarded(route, Access::Read)
}

/// A route that changes data (or runs a benchmark that writes): the write token.
pub fn writes<S: Clone + Send + Sync + 'static>(route: MethodRouter<S>) -> MethodRouter<S> {
    guarded(route, Access::Write)
}

fn guarded<S: Clone + Send + Sync + 'static>(
    route: MethodRouter<S>,
    access: Access,
) -> MethodRouter<S> {
    route.route_layer(middleware::from_fn(move |request: Request, next: Next| {
        authenticate(access, request, next)
    }))
}

/// Lets the request through if its token grants `access`. The server's state comes from the
/// request's extensions, where the router puts it for every request.
async fn authenticate(access: Access, request: Request, next: Next) -> Response {
    let Some(state) = request.extensions().get::<AppState>().cloned() else {
        return ApiError::internal("the router did not attach the server's state").into_response();
    };
    let auth = &state.config().auth;
    if !auth.is_enabled() {
        return next.run(request).await;
    }
    let presented = bearer_token(request.headers());
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
        return next.run(request).await;
    }
    let error = ApiError::unauthorized(match (presented, access) {
        (None, _) => "this route needs a bearer token (Authorization: Bearer <token>)",
        (Some(_), Access::Write) => "this route needs the write token",
        (Some(_), Access::Read) => "the token is not valid",
    });
    state.count_rejection(&error);
    error.into_response()
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

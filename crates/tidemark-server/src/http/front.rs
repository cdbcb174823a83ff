//! What a program built on the server puts before its HTTP API: its own routes, answered
//! first, and a rule for which of the API's requests it serves at all. The agent
//! (`tidemark agent`) answers `/agent/status` and passes on only the write routes.

use axum::extract::Request;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::Router;

use crate::error::ApiError;
use crate::state::{AppState, ExtraMetrics};

pub struct HttpFront {
    /// Answered before the API: a path here wins over the API's.
    pub routes: Router,
    /// Which API requests are served, by method and path; the others are answered 404
    /// with `refusal` as the message.
    pub admits: fn(&Method, &str) -> bool,
    pub refusal: &'static str,
    /// Added to the API's `/metrics`.
    pub metrics: Option<ExtraMetrics>,
}

/// The API behind `front`, or the API alone.
pub(crate) fn router(state: AppState, front: Option<HttpFront>) -> Router {
    let Some(front) = front else {
        return super::router(state);
    };
    if let Some(metrics) = front.metrics {
        state.set_extra_metrics(metrics);
    }
    let (admits, refusal) = (front.admits, front.refusal);
    let admitted = super::routes(state.clone()).layer(axum::middleware::from_fn(
        move |request: Request, next: Next| async move {
            if admits(request.method(), request.uri().path()) {
                next.run(request).await
            } else {
                ApiError::not_found("not_served", refusal).into_response()
            }
        },
    ));
    front
        .routes
        .fallback_service(super::counted(admitted, state))
}

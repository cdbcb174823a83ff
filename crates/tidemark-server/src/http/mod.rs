//! The HTTP API: the router, and the routes every server answers (`/health`, `/ready`, and
//! the refusals of unknown routes and methods). Each group of routes is a file of its own;
//! what their handlers share — request bodies read under admission control, calls into the
//! stores off the async threads — is `extract.rs` and `run.rs`, which import no handler file.
//!
//! Must never know about: storage formats, Raft; what a write does in the store (that is
//! [`crate::store`]'s).

mod access;
mod chronicle;
mod cluster;
pub mod connections;
pub mod console;
mod extract;
mod follow;
pub mod front;
mod influx;
mod native;
mod prometheus;
mod run;
mod sql;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::error::ApiError;
use crate::metrics::Rejection;
use crate::state::{AppState, Namespace};
use crate::store::StoreErrorKind;

/// The whole HTTP API, every refusal it answers counted; each route declares who may call
/// it (`access`).
pub fn router(state: AppState) -> Router {
    counted(routes(state.clone()), state)
}

/// The API's routes, refusals not yet counted: [`counted`] goes around whatever else is put
/// in front of them (`front`), so that its refusals are counted too.
pub(crate) fn routes(state: AppState) -> Router {
    Router::new()
        .nest(
            "/api/event-store",
            chronicle::store_routes(Namespace::Replicated),
        )
        .nest(
            "/api/event-store/embedded",
            chronicle::store_routes(Namespace::Local),
        )
        .merge(chronicle::sys_routes())
        .merge(native::routes())
        .merge(influx::routes())
        .merge(prometheus::routes())
        .merge(cluster::routes())
        .merge(console::routes())
        .route("/health", get(health))
        .route("/ready", get(ready))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // For the access guards of `access`, which run after routing.
        .layer(axum::Extension(state.clone()))
        .with_state(state)
}

/// `api` with every refusal it answers counted, outside every route's own layers, so that
/// it sees each answer as it leaves, the access guards' refusals included.
pub(crate) fn counted(api: Router, state: AppState) -> Router {
    api.layer(middleware::from_fn_with_state(state, count_rejections))
}

/// Counts every refused request by the refusal its answer carries ([`ApiError::mark`]):
/// the one place the HTTP API counts refusals, so that no handler's error path can forget
/// to.
async fn count_rejections(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if let Some(&why) = response.extensions().get::<Rejection>() {
        state.metrics().rejected(why);
    }
    response
}

/// Why a store of this server refuses writes until restarted, if one does.
fn write_failure(state: &AppState) -> Option<String> {
    [Namespace::Replicated, Namespace::Local]
        .into_iter()
        .find_map(|namespace| state.db(namespace).write_failure())
}

/// Liveness: 200 and `pass` while the process answers, whatever its stores' state (that is
/// `/ready`'s to say, with a 503). The body is InfluxDB 2's health check because its clients
/// read it: influxdb-client's `health()` reports `fail` without a `name`, and its model's
/// `status` is `pass` or `fail`. Load balancers and our own tools look at the status code.
async fn health(State(state): State<AppState>) -> Json<serde_json::Value> {
    let failure = write_failure(&state);
    // Still alive when read-only (a restart is the cure, not a reroute), but not silent.
    let message = match failure {
        Some(reason) => format!("alive, read-only until restarted: {reason}"),
        None => "ready for queries and writes".to_string(),
    };
    Json(serde_json::json!({
        "name": "tidemark",
        "message": message,
        "status": "pass",
        "checks": [],
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

/// Ready once the stores are open, which is before the listener starts: a server that
/// answers at all is ready; a cluster node is ready once it knows a leader (503 before).
/// A store whose log failed (a full disk) refuses writes until restarted: 503 then too.
async fn ready(State(state): State<AppState>) -> Response {
    let uptime = state.uptime().as_millis() as u64;
    let failure = write_failure(&state);
    if let Some(failure) = failure {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"status": "read-only", "uptimeMs": uptime, "reason": failure})),
        )
            .into_response();
    }
    match state.cluster().map(|c| c.status()) {
        Some(status) if status.leader.is_none() => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"status": "no leader", "uptimeMs": uptime})),
        )
            .into_response(),
        Some(status) => Json(serde_json::json!({
            "status": "ready", "uptimeMs": uptime, "leader": status.leader, "node": status.node
        }))
        .into_response(),
        None => Json(serde_json::json!({"status": "ready", "uptimeMs": uptime})).into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found("not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StoreErrorKind::Invalid,
        "method_not_allowed",
        "this route does not take that method",
    )
    .with_status(StatusCode::METHOD_NOT_ALLOWED)
}

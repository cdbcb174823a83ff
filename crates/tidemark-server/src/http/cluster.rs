//! `/v1/cluster`: the state of the Raft group as this node sees it, and membership changes.
//! On a single (embedded) node these answer 404 `not_a_cluster`.

use std::sync::Arc;

use axum::extract::State;
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value as Json_};
use tidemark_cluster::{Cluster, NodeAddrs};

use super::access::{reads, writes};
use super::extract::{ApiPath, JsonBody};
use crate::error::ApiError;
use crate::state::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/cluster", reads(get(status)))
        .route("/v1/cluster/nodes", writes(axum::routing::post(add_node)))
        .route("/v1/cluster/nodes/{id}", writes(delete(remove_node)))
}

fn cluster(state: &AppState) -> Result<Arc<Cluster>, ApiError> {
    state.cluster().cloned().ok_or_else(|| {
        ApiError::not_found(
            "not_a_cluster",
            "this server runs embedded; start it with --cluster-config to form a cluster",
        )
    })
}

async fn status(State(state): State<AppState>) -> Result<Json<Json_>, ApiError> {
    let status = cluster(&state)?.status();
    serde_json::to_value(status)
        .map(Json)
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// `{"id": 4, "raft": "127.0.0.1:9010", "http": "…", "binary": "…"}`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddNode {
    id: u64,
    raft: String,
    http: String,
    binary: String,
}

async fn add_node(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<AddNode>,
) -> Result<Json<Json_>, ApiError> {
    let addrs = NodeAddrs {
        raft: request.raft,
        http: request.http,
        binary: request.binary,
    };
    cluster(&state)?
        .add_node(request.id, addrs)
        .await
        .map_err(|e| ApiError::from_cluster(e, state.retry_after_ms()))?;
    Ok(Json(json!({"added": request.id})))
}

async fn remove_node(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<u64>,
) -> Result<Json<Json_>, ApiError> {
    cluster(&state)?
        .remove_node(id)
        .await
        .map_err(|e| ApiError::from_cluster(e, state.retry_after_ms()))?;
    Ok(Json(json!({"removed": id})))
}

/// Waits, for `consistency=linearizable`, until this node has applied every write
/// acknowledged before the request (ReadIndex through the leader). `local` (the default)
/// reads what this node has applied.
pub async fn read_barrier(state: &AppState, consistency: Option<&str>) -> Result<(), ApiError> {
    match consistency.unwrap_or("local") {
        "local" => Ok(()),
        "linearizable" => match state.cluster() {
            Some(cluster) => cluster
                .read_barrier()
                .await
                .map_err(|e| ApiError::from_cluster(e, state.retry_after_ms())),
            None => Ok(()), // one embedded node: every acknowledged write is already visible
        },
        other => Err(ApiError::bad_request(format!(
            "consistency must be \"local\" or \"linearizable\", not {other:?}"
        ))),
    }
}

//! Running a handler's work against a store: blocking work off the async threads, commands
//! submitted, and appends through the store layer; refusals mapped to their HTTP answers.

use std::sync::Arc;

use tidemark_core::{Command, EventBatch, ProducerSeq, Schema};
use tidemark_engine::{Engine, EngineError};

use super::extract::Body;
use crate::append::{self, Append, AppendError};
use crate::error::ApiError;
use crate::state::{AppState, Namespace};
use crate::store::{Ack, StoreError};

/// Runs blocking engine work off the async threads.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("the request's worker failed: {e}")))
}

/// Appends `body` to `stream` through the store layer ([`crate::append`]), decoded by
/// `decode`; answers once the batch is durable. The body's admission is held until then.
pub async fn append_decoded(
    state: &AppState,
    namespace: Namespace,
    stream: String,
    body: Body,
    producer: Option<ProducerSeq>,
    decode: impl FnOnce(&[u8], &Arc<Schema>) -> Result<EventBatch, ApiError> + Send + 'static,
) -> Result<Ack, ApiError> {
    let append = Append {
        stream,
        body: body.bytes,
        permit: body.permit,
        producer,
    };
    append::append(state.store(namespace), state.metrics(), append, decode)
        .await
        .map_err(|e| match e {
            AppendError::Store(e) => refusal(state, e),
            AppendError::Decode(e) => e,
        })
}

/// A store's refusal as the HTTP answer, with the server's retry hint.
pub fn refusal(state: &AppState, e: StoreError) -> ApiError {
    ApiError::from_store(e, state.retry_after_ms())
}

/// Runs `command` on the store of `namespace`; a refusal is mapped to its HTTP answer.
pub async fn submit(
    state: &AppState,
    namespace: Namespace,
    command: Command<EventBatch>,
) -> Result<Ack, ApiError> {
    state
        .store(namespace)
        .submit(command)
        .await
        .map_err(|e| refusal(state, e))
}

/// Runs `work` on a store off the async threads, engine errors mapped.
pub async fn with_db<T: Send + 'static>(
    state: &AppState,
    namespace: Namespace,
    work: impl FnOnce(&Engine) -> Result<T, EngineError> + Send + 'static,
) -> Result<T, ApiError> {
    let db = state.db(namespace).clone();
    blocking(move || work(&db))
        .await?
        .map_err(|e| ApiError::from_engine(e, state.retry_after_ms()))
}

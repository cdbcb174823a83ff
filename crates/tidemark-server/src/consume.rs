//! What every transport's consumers share (HTTP's reads and follows, the binary protocol's
//! subscriptions): where a read by position starts, the read itself off the async workers,
//! and the slots of `limits.max_subscriptions`. Errors are [`StoreError`]s, which each
//! transport maps once.

use tidemark_engine::{Engine, PositionRead, PositionRequest};

use crate::state::AppState;
use crate::store::{StoreError, StoreErrorKind};

/// Where a read by position starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// After this position.
    After(u64),
    /// At the earliest event the stream holds.
    Earliest,
    /// At the first position whose event starts at or after this time (nanoseconds).
    FromTime(i64),
    /// After the position this named consumer committed; from the earliest held if it
    /// never committed.
    Consumer(String),
}

/// The position a read from `start` begins after (`None`: from the earliest event held).
///
/// On a cluster, a position another node gave may not be applied on this one yet (a
/// consumer whose node died moved to one that lags): before it is judged, this node applies
/// every write committed before the request, as a linearizable read waits for.
pub async fn start_after(
    state: &AppState,
    db: &Engine,
    stream: &str,
    start: &Start,
) -> Result<Option<u64>, StoreError> {
    let after = match start {
        Start::After(after) => Some(*after),
        Start::Earliest => None,
        Start::FromTime(time) => {
            let (db, stream, time) = (db.clone(), stream.to_string(), *time);
            let first = blocking(move || db.first_position_from(&stream, time)).await??;
            // Position 0 is the first a stream gives: after none is from the earliest.
            first.checked_sub(1)
        }
        Start::Consumer(name) => db.consumer_position(stream, name)?,
    };
    if let (Some(after), Some(cluster)) = (after, state.cluster()) {
        if after >= *db.watch_positions(stream)?.borrow() {
            cluster.read_barrier().await?;
        }
    }
    Ok(after)
}

/// The events of `stream` after `after`, at most `limit` of them and about `max_bytes`,
/// read on the blocking pool (a read may decode blocks from disk).
pub async fn read(
    db: &Engine,
    stream: &str,
    after: Option<u64>,
    limit: usize,
    max_bytes: usize,
) -> Result<PositionRead, StoreError> {
    let (db, stream) = (db.clone(), stream.to_string());
    let request = PositionRequest {
        after,
        limit,
        max_bytes,
    };
    Ok(blocking(move || db.read_positions(&stream, &request)).await??)
}

/// A slot of `limits.max_subscriptions` for a follow, a long poll or a subscription, held
/// while it runs; the refusal when as many run already.
pub fn subscription_slot(
    state: &AppState,
) -> Result<tokio::sync::OwnedSemaphorePermit, StoreError> {
    state.subscription_slot().ok_or_else(|| {
        let message = format!(
            "the server follows {} streams for clients at once (limits.max_subscriptions): \
             retry later",
            state.config().limits.max_subscriptions
        );
        StoreError::new(StoreErrorKind::Unavailable, message)
    })
}

/// Where a follow or subscription that ends because the server stops says so.
pub fn stopping() -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        "the server is stopping: follow again after the last position received",
    )
}

/// Resolves once the server is stopping (`stopping` from [`AppState::stopping`]).
pub async fn until_stopping(stopping: &mut tokio::sync::watch::Receiver<bool>) {
    // The guard `wait_for` answers is dropped here: it must not live across an await.
    let _ = stopping.wait_for(|stopping| *stopping).await.map(|_| ());
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        StoreError::new(
            StoreErrorKind::Internal,
            format!("the read's worker failed: {e}"),
        )
    })
}

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
            let first = read_slotted(move || db.first_position_from(&stream, time)).await??;
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
    Ok(read_slotted(move || db.read_positions(&stream, &request)).await??)
}

/// Runs a read on the blocking pool once it has a slot of [`blocking_reads`], awaited as
/// a task: a thousand followers catching up at once must not start a thread each.
async fn read_slotted<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StoreError> {
    let _slot = blocking_reads()
        .acquire()
        .await
        .map_err(|e| StoreError::internal(format!("the read slots closed: {e}")))?;
    blocking(work).await
}

/// Reads by position that run on the blocking pool at once (each decodes blocks).
fn blocking_reads() -> &'static tokio::sync::Semaphore {
    static SLOTS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    SLOTS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        tokio::sync::Semaphore::new((4 * cores).max(16))
    })
}

/// Whether the stream a follower watches is still the one it began with: a stream dropped
/// (and perhaps created again under its name, counting from 0) closes the watch, and what a
/// read found after that is the new stream's, never to be sent as the old one's. Checked
/// after each read.
pub fn still_there(
    watch: &tokio::sync::watch::Receiver<u64>,
    stream: &str,
) -> Result<(), StoreError> {
    match watch.has_changed() {
        Ok(_) => Ok(()),
        Err(_) => Err(tidemark_engine::EngineError::UnknownStream(stream.to_string()).into()),
    }
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

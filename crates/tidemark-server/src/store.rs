//! The server's seam to storage. Every transport turns what a client sent into a
//! [`Command`] and hands it to [`Store::submit`]; the answer is an [`Ack`] or a
//! [`StoreError`], which each transport maps once to its own terms (HTTP status and JSON
//! body in `http::error`, a binary error code in `binary`). Reads go to a local database
//! ([`Store::db`]): the embedded one, or this node's replica of the cluster.
//!
//! Whether writes go straight into an embedded database (or an agent's spool) or through
//! the Raft cluster this node belongs to is decided here and nowhere else.

use std::sync::Arc;

use tidemark_cluster::{Cluster, ClusterError, FailureKind};
use tidemark_core::{Command, EventBatch, Schema};
use tidemark_engine::{Ack as EngineAck, Db, Engine, EngineError, PendingAck, Positions, Spool};

#[derive(Clone)]
pub enum Store {
    Embedded(Arc<Db>),
    Replicated(Arc<Cluster>),
    /// An agent's spool (`tidemark-agent`): writes are logged for its forwarder; it keeps
    /// no events, so its reads find none.
    Spool(Arc<Spool>),
}

/// An acknowledged command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The log position (embedded) or Raft index (cluster) of the command.
    pub lsn: u64,
    /// Events appended (0 for a catalog change).
    pub events: u64,
    /// The stream positions the appended events were given, first and last (see
    /// `tidemark_engine::Ack::positions` for when there are none).
    pub positions: Option<Positions>,
    /// Whether the producer's sequence number had been applied before (nothing was
    /// appended), where the store can tell: a cluster's apply says so; the embedded engine
    /// acknowledges a retry as it acknowledges the first write and cannot (`None`), and an
    /// answer must not claim `false` for a retry.
    pub duplicate: Option<bool>,
}

/// What a client should make of a refusal or failure, whatever protocol it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// The request is wrong and would be refused again as it is.
    Invalid,
    /// The batch (or one of its events) is over a size limit: split it.
    TooLarge,
    UnknownStream,
    StreamExists,
    /// A membership change that conflicts with the cluster's state.
    Conflict,
    /// Nothing was stored; the same request may succeed shortly (the server is over its
    /// budget or behind on flushing).
    Overloaded,
    /// Nothing was stored, or (said in the message) the outcome is unknown; retry shortly
    /// (no leader yet, a failover under way).
    Unavailable,
    /// The store refuses writes until the server restarts (its log failed, or it closed).
    ReadOnly,
    /// The request lacks the token it needs. Never a store's answer: the transports' own
    /// refusals are of these kinds too, so that each is answered and counted as one.
    Unauthorized,
    /// What the request names, other than a stream, does not exist here (a route, a
    /// feature this server runs without).
    NotFound,
    /// A read by position asked for events that were removed (retention, a clear): the
    /// message names the earliest position held after them.
    Gone,
    /// A fault on the server's side.
    Internal,
}

/// A store's refusal or failure, in transport-neutral terms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    pub kind: StoreErrorKind,
    pub message: String,
    /// The event of the appended batch the refusal is about (its index from 0), when it is
    /// about one: a protocol that numbers its lines names the line with it.
    pub event: Option<usize>,
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> StoreError {
        StoreError {
            kind,
            message: message.into(),
            event: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> StoreError {
        StoreError::new(StoreErrorKind::Internal, message)
    }

    /// Whether the same request may succeed if sent again shortly.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            StoreErrorKind::Overloaded | StoreErrorKind::Unavailable
        )
    }
}

impl From<EngineError> for StoreError {
    fn from(e: EngineError) -> StoreError {
        use StoreErrorKind as K;
        let kind = match &e {
            EngineError::UnknownStream(_) => K::UnknownStream,
            EngineError::StreamExists { .. } => K::StreamExists,
            EngineError::Invalid(_)
            | EngineError::TooLate { .. }
            | EngineError::TooFarAhead { .. }
            | EngineError::ValueTooLong { .. }
            | EngineError::InvalidRequest(_) => K::Invalid,
            EngineError::BatchTooLarge { .. } | EngineError::Command(_) => K::TooLarge,
            EngineError::Overloaded(_) => K::Overloaded,
            EngineError::LogWriteUndone(_) => K::Unavailable,
            EngineError::LogFailed(_) | EngineError::Closed => K::ReadOnly,
            // A tiered segment whose bucket did not answer: the same read may work shortly.
            e if e.is_bucket_unavailable() => K::Unavailable,
            EngineError::Storage(_) | EngineError::FlushFailed(_) | EngineError::Tier(_) => {
                K::Internal
            }
            EngineError::PositionsRemoved { .. } => K::Gone,
        };
        let event = match &e {
            EngineError::TooLate { row, .. }
            | EngineError::TooFarAhead { row, .. }
            | EngineError::ValueTooLong { row, .. } => Some(*row),
            _ => None,
        };
        StoreError {
            event,
            ..StoreError::new(kind, e.to_string())
        }
    }
}

impl From<ClusterError> for StoreError {
    /// Refusals before proposing as the engine's, committed failures by their kind, no
    /// leader or quorum as retryable.
    fn from(e: ClusterError) -> StoreError {
        use StoreErrorKind as K;
        let message = e.to_string();
        let kind = match e {
            ClusterError::Engine(e) => return e.into(),
            ClusterError::Failed { kind, .. } => match kind {
                FailureKind::UnknownStream => K::UnknownStream,
                FailureKind::StreamExists => K::StreamExists,
                FailureKind::Invalid | FailureKind::OutOfOrder => K::Invalid,
            },
            ClusterError::Invalid(_) => K::Invalid,
            ClusterError::Membership(_) => K::Conflict,
            ClusterError::Unavailable(_) | ClusterError::NotLeader => K::Unavailable,
            ClusterError::Config(_) | ClusterError::Io(_) => K::Internal,
        };
        StoreError::new(kind, message)
    }
}

impl Store {
    /// The local database that answers reads (a cheap handle to keep).
    pub fn db(&self) -> Engine {
        match self {
            Store::Embedded(db) => Engine::clone(db),
            Store::Replicated(cluster) => cluster.db(),
            Store::Spool(spool) => spool.engine(),
        }
    }

    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        match self {
            Store::Embedded(_) | Store::Spool(_) => None,
            Store::Replicated(cluster) => Some(cluster),
        }
    }

    /// The schema a write to `name` is decoded against (in a cluster, after catching up
    /// with the leader if this node does not know the stream yet: [`Cluster::stream_schema`]).
    pub async fn stream_schema(&self, name: &str) -> Result<Arc<Schema>, StoreError> {
        match self {
            Store::Embedded(db) => Ok(db.stream_schema(name)?),
            Store::Spool(spool) => Ok(spool.engine().stream_schema(name)?),
            Store::Replicated(cluster) => Ok(cluster.stream_schema(name).await?),
        }
    }

    /// Whether writes may add fields to stream `name`, as the replica that answers reads
    /// knows it (`false` for a stream it does not know).
    pub fn stream_is_evolving(&self, name: &str) -> bool {
        self.db().stream_is_evolving(name).unwrap_or(false)
    }

    /// Runs `command` and answers once it is durable (embedded: fsync'd; cluster: committed
    /// on a quorum) and applied where the reads of this node see it.
    pub async fn submit(&self, command: Command<EventBatch>) -> Result<Ack, StoreError> {
        match self {
            Store::Embedded(db) => Ok(embedded_ack(submit_embedded(db, command).await?)),
            Store::Spool(spool) => Ok(embedded_ack(submit_embedded(spool, command).await?)),
            Store::Replicated(cluster) => {
                let ack = cluster.submit(command).await?;
                Ok(Ack {
                    lsn: ack.index,
                    events: ack.events,
                    positions: ack.positions,
                    duplicate: Some(ack.duplicate),
                })
            }
        }
    }
}

/// Work on a request of up to this many bytes — decoding its body, checking, encoding and
/// queueing its batch — runs on the async worker itself: it takes microseconds, less than
/// a hand-off to a blocking thread, and a burst of hundreds of small appends (W2's one
/// point per host per second) would otherwise make the blocking pool start a thread for
/// each. Larger work goes to the blocking pool, so that no worker stalls the others'
/// connections for long.
pub const INLINE_BYTES: usize = 64 << 10;

/// The acknowledgement of an embedded store, which cannot tell a retry from a first write.
fn embedded_ack(ack: EngineAck) -> Ack {
    Ack {
        lsn: ack.lsn,
        events: ack.events as u64,
        positions: ack.positions,
        duplicate: None,
    }
}

/// A command queued in place, or handed back to be run where blocking is fine.
type Tried = Result<PendingAck, Command<EventBatch>>;

/// What is written through its own log: an embedded database, or an agent's spool.
trait OwnLog: Send + Sync + 'static {
    fn submit_queued(&self, command: Command<EventBatch>) -> Result<PendingAck, EngineError>;
    fn try_submit_queued(&self, command: Command<EventBatch>) -> Result<Tried, EngineError>;
}

impl OwnLog for Db {
    fn submit_queued(&self, command: Command<EventBatch>) -> Result<PendingAck, EngineError> {
        Db::submit_queued(self, command)
    }
    fn try_submit_queued(&self, command: Command<EventBatch>) -> Result<Tried, EngineError> {
        Db::try_submit_queued(self, command)
    }
}

impl OwnLog for Spool {
    fn submit_queued(&self, command: Command<EventBatch>) -> Result<PendingAck, EngineError> {
        Spool::submit_queued(self, command)
    }
    fn try_submit_queued(&self, command: Command<EventBatch>) -> Result<Tried, EngineError> {
        Spool::try_submit_queued(self, command)
    }
}

/// Runs `work` on `bytes` of a request (decoding, inflating) where [`INLINE_BYTES`] says:
/// in place when they are few, else on the blocking pool. The one place that choice is
/// made for a request's work.
pub async fn in_place_or_blocking<T: Send + 'static>(
    bytes: usize,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StoreError> {
    if bytes <= INLINE_BYTES {
        return Ok(work());
    }
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| StoreError::internal(format!("the request's worker failed: {e}")))
}

/// Writes that may block a thread of the blocking pool at once (see [`submit_embedded`]).
fn blocking_writes() -> &'static tokio::sync::Semaphore {
    static SLOTS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    SLOTS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        tokio::sync::Semaphore::new((4 * cores).max(16))
    })
}

/// Runs `command` on an embedded database and awaits its fsync without holding a thread.
/// Checking and encoding a large batch, and anything that may have to wait (a catalog
/// change, an append while memory is full or the catalog is changing), run on the
/// blocking pool; the wait for the group's fsync is awaited here.
///
/// Those blocking writes take a slot of [`blocking_writes`] first, awaited: when memory is
/// full, every small append waits for the flush, and given a blocking thread each, hundreds
/// of pipelined appends made tokio start hundreds of threads (its pool's bound, 512), each
/// parked until the flush caught up. Past the slots they wait as tasks, holding no thread.
async fn submit_embedded<D: OwnLog>(
    db: &Arc<D>,
    command: Command<EventBatch>,
) -> Result<EngineAck, StoreError> {
    let small =
        matches!(&command, Command::Append { batch, .. } if batch.heap_bytes() <= INLINE_BYTES);
    let command = if small {
        match db.try_submit_queued(command)? {
            Ok(pending) => return Ok(pending.await?),
            Err(command) => command,
        }
    } else {
        command
    };
    let db = db.clone();
    let slot = blocking_writes()
        .acquire()
        .await
        .map_err(|e| StoreError::internal(format!("the write slots closed: {e}")))?;
    let pending = tokio::task::spawn_blocking(move || db.submit_queued(command))
        .await
        .map_err(|e| StoreError::internal(format!("the write's worker failed: {e}")))??;
    // Queued in the log: its fsync is awaited without the slot.
    drop(slot);
    Ok(pending.await?)
}

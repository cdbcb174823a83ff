use std::path::PathBuf;

use tidemark_core::CoreError;
use tidemark_storage::StorageError;

/// Why an engine operation failed. Nothing of a failed append is stored.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Invalid(#[from] CoreError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("no stream named {0:?}")]
    UnknownStream(String),
    #[error("stream {name:?} already exists with schema {existing}")]
    StreamExists { name: String, existing: String },
    #[error("data directory {0} is in use by another process (its LOCK file is held)")]
    Locked(PathBuf),
    #[error("event {row} at {tstart} is older than the out-of-order window allows (events before {oldest_allowed} are refused for stream {stream:?})")]
    TooLate {
        stream: String,
        row: usize,
        tstart: i64,
        oldest_allowed: i64,
    },
    #[error("event {row}: field {field:?} holds {len} bytes, the limit is {max}")]
    ValueTooLong {
        row: usize,
        field: String,
        len: usize,
        max: usize,
    },
    #[error("the batch takes {bytes} bytes in the log, the limit is {max}: split it")]
    BatchTooLarge { bytes: usize, max: usize },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("overloaded: {0}")]
    Overloaded(String),
    /// The log could not be written or fsync'd. The database refuses further writes until
    /// it is reopened, because the OS may have dropped the unsynced pages.
    #[error("the log failed and the database is read-only until reopened: {0}")]
    LogFailed(String),
    #[error("flushing to segments failed (the events stay durable in the log): {0}")]
    FlushFailed(String),
    #[error("the database is closed")]
    Closed,
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

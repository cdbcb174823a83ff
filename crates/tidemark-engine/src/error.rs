//! The engine's errors — [`OpenError`] for opening a database, [`EngineError`] for what is
//! done with an open one — in terms of the database: never of a transport
//! (a status code, a route), which each transport adds when it maps them.

use std::path::PathBuf;

use tidemark_core::time::format_instant;
use tidemark_core::CoreError;
use tidemark_storage::replay::ReplayError;
pub use tidemark_storage::replay::{CorruptLog, Evidence};
use tidemark_storage::StorageError;

/// Why a database ([`crate::Db`], [`crate::Replica`], [`crate::Spool`]) could not be opened.
/// Each kind asks something different of whoever opens it (stop the other process, use a
/// newer build, repair the log, fix the options); nothing in the directory was changed that
/// a later open would not do again.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("data directory {0} is in use by another process (its LOCK file is held)")]
    Locked(PathBuf),
    #[error("data directory {dir} was written with log format {found}; this build reads formats 1 to {newest} (a newer Tidemark wrote it)")]
    UnsupportedFormat {
        dir: PathBuf,
        found: u32,
        newest: u32,
    },
    /// The log is damaged where a crash cannot have damaged it: records that were
    /// acknowledged lie after the damage. The open is refused rather than drop them
    /// ([`crate::Db::repair_log`] cuts the log there, saving what it cuts).
    #[error("{0}")]
    CorruptLog(Box<CorruptLog>),
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// Reading, checking or starting failed: a file that cannot be read, a damaged segment
    /// or manifest, a thread that would not start.
    #[error(transparent)]
    Failed(#[from] EngineError),
}

impl From<StorageError> for OpenError {
    fn from(e: StorageError) -> Self {
        OpenError::Failed(EngineError::Storage(e))
    }
}

impl From<ReplayError> for OpenError {
    fn from(e: ReplayError) -> Self {
        match e {
            ReplayError::Storage(e) => e.into(),
            ReplayError::Corrupt(corrupt) => OpenError::CorruptLog(corrupt),
        }
    }
}

/// Why an operation on an open database failed. Nothing of a failed append is stored.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Invalid(#[from] CoreError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A command that cannot be encoded (a name or schema over the codec's lengths).
    #[error(transparent)]
    Command(#[from] tidemark_core::command::CommandError),
    #[error("no stream named {0:?}")]
    UnknownStream(String),
    /// `existing`: what differs, as "schema NAME:TYPE,..." or "partition 1d".
    #[error("stream {name:?} already exists with {existing}")]
    StreamExists { name: String, existing: String },
    #[error("event {row} at {} ({tstart}) is older than the out-of-order window of stream {stream:?} allows ({window_ns} ns before its newest event: events before {} are refused){}; a backfill may widen the window (`tidemark streams window {stream} --set 30d`, or the stream's out-of-order-window setting through any API)", format_instant(*tstart), format_instant(*oldest_allowed), unit_hint(*tstart))]
    TooLate {
        stream: String,
        row: usize,
        tstart: i64,
        oldest_allowed: i64,
        window_ns: i64,
    },
    #[error("event {row} at {tstart} is more than {max_ahead_ns} ns ahead of this server's clock ({now}); timestamps are nanoseconds since the epoch")]
    TooFarAhead {
        row: usize,
        tstart: i64,
        now: i64,
        max_ahead_ns: i64,
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
    /// The log could not be written (a full disk, a quota) and the write was undone: the
    /// records were not logged, and the same request may succeed once space returns.
    #[error("the log could not be written; nothing of this request was stored, retry once the disk has space: {0}")]
    LogWriteUndone(String),
    #[error("flushing to segments failed (the events stay durable in the log): {0}")]
    FlushFailed(String),
    /// Tiering to the bucket failed (the thread retries; nothing local was removed).
    #[error("tiering: {0}")]
    Tier(String),
    #[error("the database is closed")]
    Closed,
    /// A read by position met positions the stream gave whose events it no longer holds.
    #[error("stream {stream:?} no longer holds the events from position {from}{}: they were removed (by retention or a clear); {}", removed_until(*earliest_held, *next_position), resume_hint(*earliest_held, *next_position))]
    PositionsRemoved {
        stream: String,
        /// The first position asked for that is gone.
        from: u64,
        /// The earliest position held after it, if any.
        earliest_held: Option<u64>,
        next_position: u64,
    },
}

fn removed_until(earliest_held: Option<u64>, next_position: u64) -> String {
    let until = earliest_held.unwrap_or(next_position).saturating_sub(1);
    format!(" to {until}")
}

fn resume_hint(earliest_held: Option<u64>, next_position: u64) -> String {
    match earliest_held {
        Some(held) => format!(
            "the earliest it holds after them is {held}: read after {} to go on from there",
            held.saturating_sub(1)
        ),
        None => format!(
            "it holds none after them: its next event gets {next_position} (read after {})",
            next_position.saturating_sub(1)
        ),
    }
}

impl EngineError {
    /// Whether this is a read of a tiered segment whose bucket did not answer (down, slow,
    /// refusing the credentials): the same read may succeed later.
    pub fn is_bucket_unavailable(&self) -> bool {
        matches!(self, EngineError::Storage(StorageError::Unavailable { .. }))
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// A hint for a timestamp that looks like seconds or milliseconds since the epoch where
/// nanoseconds are expected (a common cause of events refused as too old).
fn unit_hint(tstart: i64) -> &'static str {
    // Nanoseconds since the epoch passed 10^17 in 1973; seconds and milliseconds of any
    // date before the year 5000 stay below 10^14.
    match tstart {
        1_000_000_000..100_000_000_000 => {
            "; the timestamp looks like seconds since the epoch: Tidemark's are nanoseconds"
        }
        100_000_000_000..100_000_000_000_000 => {
            "; the timestamp looks like milliseconds since the epoch: Tidemark's are nanoseconds"
        }
        _ => "",
    }
}

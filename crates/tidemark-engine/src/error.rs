//! The engine's errors ([`EngineError`]), in terms of the database: never of a transport
//! (a status code, a route), which each transport adds when it maps them.

use std::path::PathBuf;

use tidemark_core::time::format_instant;
use tidemark_core::CoreError;
use tidemark_storage::StorageError;

/// Why an engine operation failed. Nothing of a failed append is stored.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Invalid(#[from] CoreError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A command that cannot be encoded (a name or schema over the codec's lengths).
    #[error(transparent)]
    Command(#[from] tidemark_core::command::CommandError),
    #[error("data directory {dir} was written with log format {found}; this build reads formats 1 to {newest} (a newer Tidemark wrote it)")]
    UnsupportedFormat {
        dir: PathBuf,
        found: u32,
        newest: u32,
    },
    /// The log is damaged where a crash cannot have damaged it: records that were
    /// acknowledged lie after the damage. The open is refused rather than drop them.
    #[error("{0}")]
    CorruptLog(Box<CorruptLog>),
    #[error("no stream named {0:?}")]
    UnknownStream(String),
    /// `existing`: what differs, as "schema NAME:TYPE,..." or "partition 1d".
    #[error("stream {name:?} already exists with {existing}")]
    StreamExists { name: String, existing: String },
    #[error("data directory {0} is in use by another process (its LOCK file is held)")]
    Locked(PathBuf),
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
    #[error("invalid options: {0}")]
    InvalidOptions(String),
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
}

impl EngineError {
    /// Whether this is a read of a tiered segment whose bucket did not answer (down, slow,
    /// refusing the credentials): the same read may succeed later.
    pub fn is_bucket_unavailable(&self) -> bool {
        matches!(self, EngineError::Storage(StorageError::Unavailable { .. }))
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Where a log is corrupt and why that is not a torn tail ([`EngineError::CorruptLog`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptLog {
    /// The damaged log file.
    pub file: PathBuf,
    /// Where in it the damage starts (the first frame that does not check out), and that
    /// position's LSN.
    pub offset: u64,
    pub lsn: u64,
    /// What is wrong with the frame there.
    pub reason: String,
    /// Why this cannot be the torn tail of a crash.
    pub evidence: Evidence,
    /// Valid records found after the damage (in its file, and in the log files after it),
    /// and their bytes.
    pub records_after: u64,
    pub bytes_after: u64,
    /// Log files after the damaged one: all of them lie after the damage.
    pub later_files: Vec<PathBuf>,
    /// What to do about it, in the terms of whoever opened the log (`tidemark verify
    /// --repair` for a data directory, rebuilding from its peers for a cluster node).
    pub advice: String,
}

/// Why damage in a log is corruption and not a torn tail ([`CorruptLog`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// A valid frame that starts a write follows the damage, at this LSN: the log writer
    /// issues a write only once the one before it is fsync'd, so the damaged write was
    /// durable, and acknowledged.
    LaterWrite { lsn: u64 },
    /// The damaged file is not the last one: files roll only once everything before is
    /// fsync'd.
    NotLastFile,
    /// The damage lies before the replay point `from`, among records a checkpoint
    /// reflects (so they were durable), and no valid frame starts where replay must go on.
    BeforeReplayPoint { from: u64 },
}

impl std::fmt::Display for CorruptLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the log is corrupt, not torn by a crash: {} is damaged at byte {} (LSN {}: {}), ",
            self.file.display(),
            self.offset,
            self.lsn,
            self.reason
        )?;
        match &self.evidence {
            Evidence::LaterWrite { lsn } => write!(
                f,
                "and a later write begins after it, at LSN {lsn} (a write is made only once \
                 the one before it is on disk, so the damaged one had been acknowledged)"
            )?,
            Evidence::NotLastFile => write!(
                f,
                "which is not the last log file ({} more follow; files roll only once \
                 everything before is on disk)",
                self.later_files.len()
            )?,
            Evidence::BeforeReplayPoint { from } => write!(
                f,
                "before LSN {from}, where replay starts (among records a checkpoint holds, \
                 so they had been on disk), and the records needed from there on cannot be \
                 found after it"
            )?,
        }
        write!(
            f,
            "; {} valid records ({} bytes) lie after the damage. Refusing to open rather \
             than drop acknowledged records",
            self.records_after, self.bytes_after
        )?;
        if !self.advice.is_empty() {
            write!(f, ". {}", self.advice)?;
        }
        Ok(())
    }
}

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

//! Tidemark's embedded database.
//!
//! Owns: [`Db`] — streams and their catalog, the shared write-ahead log with group commit
//! ([`wal`]), memtables, flushing memtables into segments and checkpointing the manifest
//! ([`flush`]), recovery after a crash, retention, and the two read primitives: [`Db::scan`]
//! (time-ordered, projected, filtered events) and [`Db::aggregate`] (bucketed summaries).
//!
//! Must never know about: HTTP or any other transport, Raft, SQL text. Callers hand it
//! validated [`tidemark_core::EventBatch`]es and typed requests; everything on disk goes
//! through `tidemark-storage`.
//!
//! # Durability
//! [`Db::append`] returns only after the batch's log record is fsync'd. Recovery replays
//! the log from the last manifest checkpoint, cutting off a torn tail, so every
//! acknowledged batch is restored exactly once. See `docs/ARCHITECTURE.md` for the argument.

mod aggregate;
mod db;
mod error;
mod flush;
mod memtable;
mod options;
mod scan;
mod state;
pub mod wal;

pub use aggregate::{AggregateRequest, AggregateRow, Aggregation};
pub use db::{AppendAck, Db, StreamInfo};
pub use error::{EngineError, Result};
pub use options::Options;
pub use scan::{CmpOp, Predicate, Scan, ScanRequest, TimeRange};
pub use tidemark_storage::record::Retention;
pub use tidemark_storage::segment::SegmentOptions;

//! Tidemark's embedded database.
//!
//! Owns: [`Db`] — streams and their catalog, the shared write-ahead log (`wal`, written
//! through the storage layer's log files and group-commit queue), memtables, flushing
//! memtables into segments and checkpointing the manifest (`flush`), recovery after a crash, retention, tiering old segments to a bucket
//! ([`tier`], `tier_mover`), and the two read primitives: [`Engine::scan`]
//! (time-ordered, projected, filtered events) and [`Engine::aggregate`] (bucketed summaries).
//!
//! Every change is a [`Command`] (`tidemark_core::command`), logged in one encoding and
//! applied in log order by one rule. A database is either embedded (its own log,
//! [`Db::open`], written with [`Db::submit`]) or a cluster replica whose log is the
//! cluster's Raft log ([`Replica::open`], fed with [`Replica::apply_replicated`]); both
//! read through [`Engine`], the state machine they share. A [`Spool`] (the agent's) is
//! written as an embedded database is, but keeps only the log of its appends, for its
//! reader to forward.
//!
//! # Layout
//! Imports point one way, down this list; no module imports one above it (none imports
//! another that imports it back):
//! - `spool` (the agent's spool, an embedded database that keeps only its log);
//! - `replica` (a cluster's replica), `db` (an embedded database: opening, the write path,
//!   and starting the threads every database runs) — the only modules that start threads;
//! - `scan`, `read` (by position) and `aggregate`, the reads, as `impl Engine`;
//! - `engine` (the read handle, the checks of an append), `flush` (checkpoints);
//! - `sink` (writing segments durably), `tier_mover` (the tiering thread's work);
//! - `shared` (the handle every thread of a database holds), `recovery` (from files back
//!   to state and log), `compact` (what to merge);
//! - `state` (the catalog), `merge` (the k-way merge);
//! - `segment` (sealed segments), `plan` (what a scan asks for, bound to a schema),
//!   `flush_signal`, `wal` (the commands' log), `restore` (from a bucket);
//! - leaves: [`tier`] (the bucket and its page cache, which tiered segments read through),
//!   `memtable`, `options`, [`producers`], [`priority`], `error`.
//!
//! Must never know about: HTTP or any other transport, Raft, SQL text. Callers hand it
//! validated [`tidemark_core::EventBatch`]es and typed requests; everything on disk goes
//! through `tidemark-storage`.
//!
//! # Durability
//! [`Db::append`] returns only after the batch's log record is fsync'd. Recovery replays
//! the log from the last manifest checkpoint, cutting off a torn tail, so every
//! acknowledged batch is restored exactly once. See `docs/ARCHITECTURE.md` for the argument.
//!
//! # Example
//!
//! ```
//! use tidemark_core::{AggFn, BatchBuilder, Schema, Value};
//! use tidemark_engine::{AggregateRequest, Aggregation, Db, Options, ScanRequest, TimeRange};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let db = Db::open(dir.path(), Options::default())?;
//! let schema = Schema::parse_spec("SYMBOL:STRING,LASTTRADEPRICE:FLOAT")?;
//! db.create_stream("ticks", schema.clone())?;
//!
//! let mut batch = BatchBuilder::new(schema.into(), 2);
//! batch.push_row(60_000_000_000, None, &[Value::String("AAPL".into()), Value::Float(189.5)])?;
//! batch.push_row(61_000_000_000, None, &[Value::String("MSFT".into()), Value::Float(402.25)])?;
//! db.append("ticks", batch.finish())?; // returns once fsync'd
//!
//! let rows = db.aggregate("ticks", &AggregateRequest {
//!     range: TimeRange::ALL,
//!     bucket_ns: Some(60_000_000_000),
//!     aggregations: vec![Aggregation::new(AggFn::Max, "LASTTRADEPRICE")],
//! })?;
//! assert_eq!(rows[0].values, vec![Value::Float(402.25)]);
//!
//! let events: usize = db.scan("ticks", &ScanRequest::default())?.map(|b| b.map(|b| b.len())).sum::<Result<_, _>>()?;
//! assert_eq!(events, 2);
//! # Ok(()) }
//! ```

mod aggregate;
mod block_cache;
mod compact;
mod db;
mod engine;
mod error;
mod flush;
mod flush_signal;
mod memtable;
mod merge;
mod options;
mod plan;
pub mod priority;
pub mod producers;
mod read;
mod recovery;
mod replica;
mod restore;
mod scan;
mod segment;
mod shared;
mod sink;
mod spool;
mod state;
pub mod tier;
mod tier_mover;
mod wal;

pub use aggregate::{AggregateRequest, AggregateRow, Aggregation};
pub use db::{check_new_command, Ack, Db, PendingAck};
pub use engine::{Engine, StreamInfo};
pub use error::{CorruptLog, EngineError, Evidence, OpenError, Result};
pub use merge::Scan;
pub use options::{Options, SpoolOptions, TierOptions};
pub use plan::{CmpOp, Predicate, ScanRequest, TimeRange};
pub use read::{PositionRead, PositionRequest};
pub use replica::{Applied, ExportedCheckpoint, Replica};
pub use restore::{restore, Restored};
pub use spool::Spool;
pub use state::{ConsumerInfo, Positions};
pub use tidemark_core::{Command, Partition, ProducerSeq, Retention};
pub use tidemark_storage::log_read::LoggedRecord;
pub use tidemark_storage::log_stats::{LogStats, FSYNC_BUCKETS_SECONDS};
pub use tidemark_storage::replay::RepairedLog;
pub use tidemark_storage::segment::SegmentOptions;
pub use tier::TierStatus;
pub use wal::CommandLog;

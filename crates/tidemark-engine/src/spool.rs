//! [`Spool`]: the agent's spool (`docs/pipeline.md`) — a database in one directory whose
//! appends are checked and logged with group commit as a [`crate::Db`]'s are, but kept
//! nowhere else (no memtables, no segments, no compression). Its reader reads the records
//! back ([`Spool::read_spooled`]) and forwards them, then releases them
//! ([`Spool::release_spooled_before`]); log files are deleted only behind both that and a
//! checkpoint of the catalog. Appends are refused, retryably, while the spool holds more
//! than its cap or its disk less than its reserve ([`SpoolOptions`]).
//!
//! Must never know about: where its records are forwarded, or how; any transport.

use std::path::Path;
use std::sync::Arc;

use tidemark_core::{Command, EventBatch, Partition, Schema};
use tidemark_storage::fsutil;

use crate::db::{Ack, Embedded, PendingAck};
use crate::engine::Engine;
use crate::error::{EngineError, OpenError, Result};
use crate::options::{Options, SpoolOptions};
use crate::state::Appends;
use crate::wal::{count_records, read_records, LoggedRecord};

/// A spool in one directory: its catalog of streams, and the log of the appends it took,
/// held until its reader releases them. It keeps no events, and has no reads of them.
pub struct Spool {
    embedded: Embedded,
    limits: SpoolOptions,
}

impl Spool {
    /// Opens (creating if needed) the spool in `dir`, replaying its log's catalog changes.
    /// `options` bound its writes as a database's (`log_file_bytes`, `max_batch_bytes`, the
    /// out-of-order window...); a spool keeps no segments, so it has no tier.
    pub fn open(
        dir: impl AsRef<Path>,
        options: Options,
        limits: SpoolOptions,
    ) -> Result<Spool, OpenError> {
        limits.validate()?;
        if options.tier.is_some() {
            return Err(OpenError::InvalidOptions(
                "a spool keeps no segments to tier".into(),
            ));
        }
        let embedded = Embedded::open(dir.as_ref(), options, Appends::LoggedOnly)?;
        Ok(Spool { embedded, limits })
    }

    /// Runs `command` as [`crate::Db::submit`] does, but for what a spool keeps: an append is
    /// answered once its record is fsync'd, and kept only there.
    pub fn submit(&self, command: Command<EventBatch>) -> Result<Ack> {
        self.submit_queued(command)?.wait()
    }

    /// [`Spool::submit`] up to the log's queue, as [`crate::Db::submit_queued`].
    pub fn submit_queued(&self, command: Command<EventBatch>) -> Result<PendingAck> {
        self.admit(&command)?;
        self.embedded.submit_queued(command)
    }

    /// An append queued without waiting for I/O or another request, as
    /// [`crate::Db::try_submit_queued`]; anything else comes back untouched.
    pub fn try_submit_queued(
        &self,
        command: Command<EventBatch>,
    ) -> Result<std::result::Result<PendingAck, Command<EventBatch>>> {
        self.admit(&command)?;
        self.embedded.try_submit_queued(command)
    }

    /// Creates a stream with a strict schema, as [`crate::Db::create_stream`] does.
    pub fn create_stream(&self, name: &str, schema: Schema) -> Result<()> {
        self.submit(Command::CreateStream {
            name: name.to_string(),
            schema,
            evolving: false,
            partition: Partition::DAY,
        })
        .map(|_| ())
    }

    /// Appends a batch to a stream; returns once its record is durable.
    pub fn append(&self, stream: &str, batch: EventBatch) -> Result<Ack> {
        self.submit(Command::Append {
            name: stream.to_string(),
            batch,
            producer: None,
        })
    }

    /// The spool's records from `from` (a record's LSN, or the end of the last one read) up
    /// to what is durable, about `max_bytes` of them (at least one when there is one).
    /// Empty when nothing more is durable.
    pub fn read_spooled(&self, from: u64, max_bytes: usize) -> Result<Vec<LoggedRecord>> {
        let until = self.embedded.wal().durable_lsn();
        if from >= until {
            return Ok(Vec::new());
        }
        Ok(read_records(&self.log_dir(), from, until, max_bytes)?)
    }

    /// How many records the spool holds from `from` (a record's LSN) to `until` (at most
    /// [`Spool::spooled_end`]).
    pub fn count_spooled(&self, from: u64, until: u64) -> Result<u64> {
        let durable = self.embedded.wal().durable_lsn();
        Ok(count_records(&self.log_dir(), from, until.min(durable))?)
    }

    /// The end of what the spool holds durably: [`Spool::read_spooled`] reads up to it.
    pub fn spooled_end(&self) -> u64 {
        self.embedded.wal().durable_lsn()
    }

    /// The first LSN the spool's log files hold: where its reader starts when it has no
    /// position of its own.
    pub fn spooled_start(&self) -> u64 {
        self.embedded.wal().first_lsn()
    }

    /// Lets the spool delete its records before `lsn` (forwarded: its reader will not read
    /// them again); appends refused for the spool's size are accepted again as it shrinks.
    pub fn release_spooled_before(&self, lsn: u64) -> Result<()> {
        Ok(self.embedded.wal().hold_from(lsn)?)
    }

    /// Bytes the spool holds that its reader has not released.
    pub fn spooled_bytes(&self) -> u64 {
        let wal = self.embedded.wal();
        let held = wal.held_from();
        wal.end_lsn()
            .saturating_sub(if held == u64::MAX { 0 } else { held })
    }

    /// Writes a checkpoint of the catalog and deletes the log files wholly behind both it
    /// and the reader's release; returns when done.
    pub fn checkpoint(&self) -> Result<()> {
        self.embedded.engine().flush()
    }

    /// The schema of stream `name`: what its spooled appends were checked against, and are
    /// decoded with.
    pub fn stream_schema(&self, name: &str) -> Result<Arc<Schema>> {
        self.embedded.engine().stream_schema(name)
    }

    /// The spool's catalog and log, as a database's read handle: what a server that takes
    /// writes into the spool reads stream schemas, the log's health and its counters
    /// through. It keeps no events: scans and aggregates through it find none.
    pub fn engine(&self) -> Engine {
        self.embedded.engine().clone()
    }

    pub fn dir(&self) -> &Path {
        self.embedded.engine().dir()
    }

    /// Checkpoints and closes the spool (dropping it closes it too; its log is replayed).
    pub fn close(self) -> Result<()> {
        self.embedded.close()
    }

    fn log_dir(&self) -> std::path::PathBuf {
        self.dir().join("wal")
    }

    /// Refuses an append, retryably, while the spool holds its cap of bytes not yet
    /// released, or its disk has less free than the spool keeps free.
    fn admit(&self, command: &Command<EventBatch>) -> Result<()> {
        if !matches!(command, Command::Append { .. }) {
            return Ok(());
        }
        let spooled = self.spooled_bytes();
        if spooled >= self.limits.max_bytes {
            return Err(EngineError::Overloaded(format!(
                "the spool holds {spooled} bytes not yet forwarded (its cap is {})",
                self.limits.max_bytes
            )));
        }
        // A filesystem that cannot say how much is free is not refused for it: the log's own
        // write would meet a full disk and be undone.
        if let Ok(free) = fsutil::free_bytes(self.dir()) {
            if free < self.limits.min_free_bytes {
                return Err(EngineError::Overloaded(format!(
                    "the spool's disk has {free} bytes free, less than the {} it keeps free; \
                     {spooled} bytes are not yet forwarded",
                    self.limits.min_free_bytes
                )));
            }
        }
        Ok(())
    }
}

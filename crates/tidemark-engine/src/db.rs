//! [`Db`]: opening (with recovery), the write path, and the catalog operations; and the
//! starting of the threads every database runs (the flusher, the tiering thread), which
//! `replica` uses too. With `replica`, the one place that starts threads.
//!
//! Must never know about: how a checkpoint, a scan or a tiering round works inside; any
//! transport.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use tidemark_core::command::{self, BatchBytes};
use tidemark_core::name::validate_new_stream_name;
use tidemark_core::sync::IgnorePoison;
use tidemark_core::{Command, EventBatch, Field, Partition, ProducerSeq, Retention, Schema};
use tidemark_storage::log;
use tidemark_storage::StorageError;

use crate::engine::Engine;
use crate::error::{EngineError, OpenError, Result};
use crate::flush;
use crate::memtable::Summarized;
use crate::options::Options;
use crate::recovery;
use crate::shared::Shared;
use crate::state::{frees_files_at_checkpoint, Appends, Logged, Positions, Reflected, State};
use crate::tier::Tier;
use crate::tier_mover;
use crate::wal::{CommandLog, Completion, Wal};

/// What an acknowledged command tells the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The command's place in the log: acknowledgements are ordered by it. (A command that
    /// changed nothing, such as an empty batch, is answered with the log's end.)
    pub lsn: u64,
    /// Events appended (0 for a catalog change).
    pub events: usize,
    /// The stream positions the appended events were given; `None` for a catalog change,
    /// an empty batch, a producer's retry (its first attempt was given them), a spool's
    /// append, and a stream that gives none.
    pub positions: Option<Positions>,
}

/// An embedded Tidemark database in one directory: its own write-ahead log, written with
/// [`Db::submit`]; everything it reads is [`Engine`]'s (through `Deref`). Cheap to share
/// across threads by reference (`&Db` is `Send + Sync`); all methods take `&self`.
pub struct Db {
    embedded: Embedded,
}

/// An engine fed by its own write-ahead log, running — the log, and the threads that write
/// it, flush and tier — with the write path into it (checks, the catalog lock, queueing):
/// what a [`Db`] is, and a [`crate::Spool`] too, which keeps only the log of its appends.
pub(crate) struct Embedded {
    engine: Engine,
    wal: Arc<Wal<Logged>>,
    flusher: Option<JoinHandle<()>>,
    /// Writes the log's groups.
    log_writer: Option<JoinHandle<()>>,
    /// Moves old segments to the tier's bucket ([`crate::tier`]), when there is one.
    tierer: Option<JoinHandle<()>>,
}

/// An acknowledgement on its way: the command is queued in the log, and this completes once
/// it is durable and applied. Await it in an async task, or [`PendingAck::wait`] on a thread.
#[must_use = "a command is acknowledged only when its pending ack completes"]
pub struct PendingAck(Pending);

enum Pending {
    /// Needed no log record (an empty batch), or was applied before it was answered (a
    /// catalog change).
    Done(Ack),
    Queued {
        events: usize,
        completion: Completion,
        given: Arc<OnceLock<Positions>>,
    },
}

impl PendingAck {
    /// Blocks the calling thread until the command is durable and applied.
    pub fn wait(self) -> Result<Ack> {
        crate::wal::block_on(self)
    }
}

impl std::future::Future for PendingAck {
    type Output = Result<Ack>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Ack>> {
        match &mut self.0 {
            Pending::Done(ack) => std::task::Poll::Ready(Ok(*ack)),
            Pending::Queued {
                events,
                completion,
                given,
            } => {
                let events = *events;
                std::pin::Pin::new(completion).poll(cx).map(|outcome| {
                    outcome.map(|lsn| Ack {
                        lsn,
                        events,
                        positions: given.get().copied(),
                    })
                })
            }
        }
    }
}

impl Db {
    /// Repairs the database in `dir` whose log is corrupt ([`OpenError::CorruptLog`]: a
    /// damaged record followed by acknowledged ones, which [`Db::open`] refuses): saves
    /// every byte from the damage to the end of the damaged log file into
    /// `wal/damaged-<LSN>.bin` (later log files are moved aside as
    /// `wal/damaged-<LSN>-<start>.bin`), writes `wal/damaged-<LSN>.txt` saying what they
    /// are, fsyncs them, and cuts the log at the damage (`wal::repair`). The database
    /// then opens with every record before the damage; **the records after it are not
    /// restored** (they stay in the saved file). `Ok(None)`: the log is not corrupt (a torn
    /// tail is cut by the open itself), nothing was changed. Takes the directory's lock
    /// for the time it works ([`OpenError::Locked`] while a server holds it).
    pub fn repair_log(dir: impl AsRef<Path>) -> Result<Option<crate::wal::RepairedLog>, OpenError> {
        let dir = dir.as_ref();
        if !dir.join("segments").is_dir() {
            return Err(OpenError::InvalidOptions(format!(
                "{} is not a Tidemark data directory",
                dir.display()
            )));
        }
        let _lock = lock_dir(dir)?;
        recovery::repair_log(dir)
    }

    /// Opens (creating if needed) the database in `dir` and recovers it: the manifest's
    /// segments are opened and checked, and the log is replayed from the checkpoint.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Db, OpenError> {
        let embedded = Embedded::open(dir.as_ref(), options, Appends::Kept)?;
        Ok(Db { embedded })
    }

    /// Runs `command`: checks it, logs it, applies it once durable, and answers. Appends
    /// return once their batch is fsync'd and visible to scans, stored whole or not at all.
    /// An append whose producer tag is at or before its producer's last applied one is a
    /// retry: it is logged and acknowledged but not applied again
    /// (`State::apply_logged`), now or when the log is replayed.
    pub fn submit(&self, command: Command<EventBatch>) -> Result<Ack> {
        self.submit_queued(command)?.wait()
    }

    /// [`Db::submit`] up to the log's queue: checks the command, encodes it and queues it,
    /// then returns what completes once it is durable and applied — so that a caller with
    /// an async runtime waits for the fsync without holding a thread. (The checks, the
    /// encoding, a wait for room in memory, and a catalog change as a whole happen before
    /// this returns.)
    pub fn submit_queued(&self, command: Command<EventBatch>) -> Result<PendingAck> {
        self.embedded.submit_queued(command)
    }

    /// [`Db::submit_queued`] of an append when it can run without waiting for I/O or for
    /// another request (only short in-memory locks): no catalog change holds the catalog,
    /// and memory has room. An async task may so run a small append in place; otherwise the
    /// command comes back untouched (`Ok(Err(command))`, as does any catalog change) for
    /// the caller to run `submit_queued` where blocking is fine.
    pub fn try_submit_queued(
        &self,
        command: Command<EventBatch>,
    ) -> Result<std::result::Result<PendingAck, Command<EventBatch>>> {
        self.embedded.try_submit_queued(command)
    }

    /// Creates a stream with a strict schema. Creating an existing stream with the same
    /// schema (names compared case-insensitively) does nothing; with another schema it
    /// fails with [`EngineError::StreamExists`].
    pub fn create_stream(&self, name: &str, schema: Schema) -> Result<()> {
        self.create_stream_with(name, schema, false, Partition::DAY)
    }

    /// Creates a stream whose schema may grow ([`Db::add_fields`]), as
    /// [`Db::create_stream`] does otherwise.
    pub fn create_evolving_stream(&self, name: &str, schema: Schema) -> Result<()> {
        self.create_stream_with(name, schema, true, Partition::DAY)
    }

    /// Creates a stream, evolving or strict, with its time partitions (no segment holds
    /// events of two; [`Partition::DAY`] is the default). Creating it again with the same
    /// schema and partition does nothing; with another fails with
    /// [`EngineError::StreamExists`].
    pub fn create_stream_with(
        &self,
        name: &str,
        schema: Schema,
        evolving: bool,
        partition: Partition,
    ) -> Result<()> {
        self.submit(Command::CreateStream {
            name: name.to_string(),
            schema,
            evolving,
            partition,
        })
        .map(|_| ())
    }

    /// Adds to the schema of an evolving stream the `fields` it lacks (nullable, at its
    /// end; events stored before read them as null). Fields it has with the same type are
    /// skipped; one it has with another type, or any field for a strict stream, is refused.
    pub fn add_fields(&self, stream: &str, fields: Vec<Field>) -> Result<()> {
        self.submit(Command::AddFields {
            name: stream.to_string(),
            fields,
        })
        .map(|_| ())
    }

    /// Appends a batch to a stream; returns once it is durable (fsync'd in the log) and
    /// visible to scans. The batch is stored whole or not at all.
    pub fn append(&self, stream: &str, batch: EventBatch) -> Result<Ack> {
        self.submit(Command::Append {
            name: stream.to_string(),
            batch,
            producer: None,
        })
    }

    /// Keeps `position` as what `consumer` of `stream` has read to (a position the stream
    /// gave); `None` forgets the consumer. Durable once this returns.
    pub fn commit_position(
        &self,
        stream: &str,
        consumer: &str,
        position: Option<u64>,
    ) -> Result<()> {
        self.submit(Command::CommitPosition {
            name: stream.to_string(),
            consumer: consumer.to_string(),
            position,
        })
        .map(|_| ())
    }

    /// Removes every event of a stream; the stream and its schema stay.
    pub fn clear(&self, stream: &str) -> Result<()> {
        self.submit(Command::Clear {
            name: stream.to_string(),
        })
        .map(|_| ())
    }

    /// Removes a stream and all its events.
    pub fn drop_stream(&self, stream: &str) -> Result<()> {
        self.submit(Command::DropStream {
            name: stream.to_string(),
        })
        .map(|_| ())
    }

    /// Sets how old (by tstart against the wall clock) and how large a stream may grow.
    /// Whole segments are dropped, oldest first, at the next flush.
    pub fn set_retention(&self, stream: &str, retention: Retention) -> Result<()> {
        self.submit(Command::SetRetention {
            name: stream.to_string(),
            retention,
        })
        .map(|_| ())
    }

    /// Sets how far before the stream's newest event an event may be and still be accepted,
    /// in nanoseconds; `None` returns the stream to the database's default
    /// (`Options::out_of_order_window_ns`).
    pub fn set_out_of_order_window(&self, stream: &str, window_ns: Option<i64>) -> Result<()> {
        self.submit(Command::SetOutOfOrderWindow {
            name: stream.to_string(),
            window_ns,
        })
        .map(|_| ())
    }

    /// Flushes and closes the database; with a tier, then uploads the manifest copy if it
    /// changed. Dropping a `Db` closes it too, without the flush (recovery replays the log
    /// instead) unless it has a tier (its stop publishes the manifest copy: `Embedded::publish_on_stop`).
    pub fn close(self) -> Result<()> {
        self.embedded.close()
    }
}

impl std::ops::Deref for Db {
    type Target = Engine;

    /// Everything a database reads: streams, scans, aggregates, flushing.
    fn deref(&self) -> &Engine {
        &self.embedded.engine
    }
}

impl Embedded {
    /// Opens (creating if needed) the database in `dir`, recovers it — the manifest's
    /// segments opened and checked, the log replayed from the checkpoint — and starts its
    /// threads. A log whose appends are only logged (`Appends::LoggedOnly`, a spool's) is
    /// held whole until its reader releases it.
    pub(crate) fn open(
        dir: &Path,
        options: Options,
        appends: Appends,
    ) -> Result<Embedded, OpenError> {
        options.validate()?;
        let dir = dir.to_path_buf();

        let lock = lock_dir(&dir)?;
        let tier = options.tier.as_ref().map(|t| Arc::new(Tier::new(t)));
        let recovered = recovery::recover(&dir, &options, tier.as_ref(), appends)?;
        let upgraded_from = recovered.upgrade_from;
        let wal = Arc::new(recovered.wal);
        if appends == Appends::LoggedOnly {
            // Nothing is released before the log's reader says how far it has read.
            wal.hold_from(0)?;
        }
        let end = wal.end_lsn();
        let (engine, flusher) = start_engine(
            dir,
            options,
            recovered.state,
            wal.clone(),
            recovered.reflected,
            lock,
            tier,
        )?;
        let mut db = Embedded {
            engine,
            wal,
            flusher: Some(flusher),
            log_writer: None,
            tierer: None,
        };
        let (wal, shared) = (db.wal.clone(), db.engine.shared_arc().clone());
        let writer = std::thread::Builder::new()
            .name("tidemark-log".into())
            .spawn(move || wal.run_writer(|group, end| apply_group(&shared, group, end, appends)))
            .map_err(|e| StorageError::io("start the log writer thread in", db.engine.dir(), e))?;
        db.log_writer = Some(writer);
        if let Some(format) = upgraded_from {
            db.finish_upgrade(format, end)?;
        }
        db.tierer = spawn_tierer(&db.engine)?;
        Ok(db)
    }

    /// A directory whose log is of an earlier format was replayed into memory: one full
    /// checkpoint puts all of it in segments and writes a manifest of this format, whose
    /// replay point lies past every old record, before a record of the new format is
    /// written after them.
    fn finish_upgrade(&self, format: u32, end: u64) -> Result<(), OpenError> {
        self.engine.flush()?;
        let manifest = tidemark_storage::manifest::Manifest::load(self.engine.dir())?;
        let done = manifest.as_ref().is_some_and(|m| {
            m.log_format == tidemark_storage::manifest::LOG_FORMAT && m.log_start() >= end
        });
        if !done {
            return Err(EngineError::FlushFailed(format!(
                "upgrading {} from log format {format}: the checkpoint does not cover the old log",
                self.engine.dir().display()
            ))
            .into());
        }
        tracing::info!(
            dir = %self.engine.dir().display(),
            "upgraded the data directory from log format {format} to {}",
            tidemark_storage::manifest::LOG_FORMAT
        );
        Ok(())
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The log the database writes.
    pub(crate) fn wal(&self) -> &Wal<Logged> {
        &self.wal
    }

    /// [`Db::submit_queued`].
    pub(crate) fn submit_queued(&self, command: Command<EventBatch>) -> Result<PendingAck> {
        check_new_command(&command)?;
        match command {
            Command::Append {
                name,
                batch,
                producer,
            } => self.append_batch(name, batch, producer),
            commit @ Command::CommitPosition { .. } => self.queue_commit(commit),
            catalog => self
                .change_catalog(catalog)
                .map(|ack| PendingAck(Pending::Done(ack))),
        }
    }

    /// Queues a consumer's commit as an append is queued: it changes no schema, so it
    /// holds the catalog lock shared (appends go on meanwhile) and is answered once durable
    /// and applied.
    fn queue_commit(&self, commit: Command<EventBatch>) -> Result<PendingAck> {
        let _catalog = self.catalog_shared();
        let lsn = self.wal.end_lsn();
        if !self.engine.shared().read().check_catalog_change(&commit)? {
            return Ok(PendingAck(Pending::Done(Ack {
                lsn,
                events: 0,
                positions: None,
            })));
        }
        let frame = self.frame(&commit)?;
        let prepared = commit.catalog_change().ok_or_else(|| {
            EngineError::InvalidRequest("an append is not a consumer's commit".into())
        })?;
        let completion = self.wal.submit(frame, Logged::catalog_change(prepared))?;
        Ok(PendingAck(Pending::Queued {
            events: 0,
            completion,
            given: Arc::new(OnceLock::new()),
        }))
    }

    fn append_batch(
        &self,
        name: String,
        batch: EventBatch,
        producer: Option<ProducerSeq>,
    ) -> Result<PendingAck> {
        // Held until the append is queued: from then on its place in the log is fixed, and
        // a catalog change queued later waits for it.
        let _catalog = self.catalog_shared();
        self.wait_for_room()?;
        self.queue_append(name, batch, producer)
    }

    /// [`Db::try_submit_queued`].
    pub(crate) fn try_submit_queued(
        &self,
        command: Command<EventBatch>,
    ) -> Result<std::result::Result<PendingAck, Command<EventBatch>>> {
        let _catalog = match self.engine.shared().catalog.try_read() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(Err(command)),
        };
        match command {
            Command::Append {
                name,
                batch,
                producer,
            } if self.has_room() => self.queue_append(name, batch, producer).map(Ok),
            other => Ok(Err(other)),
        }
    }

    /// Whether memory holds less than `max_unflushed_bytes` waiting for a flush.
    fn has_room(&self) -> bool {
        self.engine.shared().has_room()
    }

    /// Checks, summarises, encodes and queues an append, waiting for nothing but short
    /// in-memory locks. The caller holds the catalog lock shared and has found room in memory.
    fn queue_append(
        &self,
        name: String,
        batch: EventBatch,
        producer: Option<ProducerSeq>,
    ) -> Result<PendingAck> {
        self.engine.validate_append(&name, &batch)?;
        let align = self.engine.shared().options.segment.block_align_ns;
        let Some(events) = Summarized::new(batch, align) else {
            return Ok(PendingAck(Pending::Done(Ack {
                lsn: self.wal.end_lsn(),
                events: 0,
                positions: None,
            })));
        };
        let count = events.batch.len();
        let command = Command::Append {
            name,
            batch: events,
            producer,
        };
        let frame = self.frame(&command)?;
        let given = Arc::new(OnceLock::new());
        let logged = Logged {
            command,
            given: Some(given.clone()),
        };
        let completion = self.wal.submit(frame, logged)?;
        Ok(PendingAck(Pending::Queued {
            events: count,
            completion,
            given,
        }))
    }

    /// A catalog change holds the catalog lock exclusively until it is applied, so that
    /// no append is checked against the catalog before it and logged after it.
    fn change_catalog(&self, command: Command<EventBatch>) -> Result<Ack> {
        let _catalog = self.catalog_exclusive();
        let lsn = self.wal.end_lsn();
        if !self.engine.shared().read().check_catalog_change(&command)? {
            return Ok(Ack {
                lsn,
                events: 0,
                positions: None,
            });
        }
        let frame = self.frame(&command)?;
        let frees_files = frees_files_at_checkpoint(&command);
        let prepared = command.catalog_change().ok_or_else(|| {
            EngineError::InvalidRequest("an append is not a catalog change".into())
        })?;
        let lsn = self
            .wal
            .submit(frame, Logged::catalog_change(prepared))?
            .wait()?;
        if frees_files {
            self.engine.shared().flush.request();
        }
        Ok(Ack {
            lsn,
            events: 0,
            positions: None,
        })
    }

    /// Blocks while more than `max_unflushed_bytes` wait for a flush, so that memory stays
    /// bounded when appends outrun compression.
    fn wait_for_room(&self) -> Result<()> {
        if self.has_room() {
            return Ok(());
        }
        let shared = self.engine.shared();
        let limit = shared.options.max_unflushed_bytes;
        let _waiting = shared.waiting_for_flush();
        shared.flush.request();
        let room = shared
            .flush
            .wait_until(shared.options.stall_timeout, || self.has_room());
        if room {
            Ok(())
        } else {
            Err(EngineError::Overloaded(format!(
                "{} bytes wait to be flushed (limit {limit}){}",
                shared.unflushed_bytes(),
                shared
                    .flush
                    .last_error()
                    .map(|e| format!("; the last flush failed: {e}"))
                    .unwrap_or_default()
            )))
        }
    }

    /// [`Db::close`]: stops the threads, with a last checkpoint (and manifest copy).
    pub(crate) fn close(mut self) -> Result<()> {
        self.stop_tierer();
        self.stop_log_writer();
        let result = self.engine.shared().checkpoint_and_wait();
        let published = match &self.engine.shared().tier {
            Some(tier) if result.is_ok() => {
                tier_mover::publish_manifest(self.engine.shared(), tier)
            }
            _ => Ok(()),
        };
        self.stop_flusher();
        result.and(published)
    }

    /// On a stop of a database with a tier (its log writer stopped): a checkpoint, then the
    /// manifest copy uploaded if it changed. The tiering thread uploads the copy only after
    /// its rounds, so a stop between two of them would leave the bucket with a copy that
    /// lacks the streams created (and the settings changed) since: `tidemark restore` after
    /// a clean shutdown would bring back none of them. The log, which recovery replays
    /// instead of a checkpoint, is not in the bucket. A failure is logged, not raised: the
    /// local store is whole either way, and the next start uploads the copy.
    fn publish_on_stop(&self) {
        let shared = self.engine.shared();
        // No flusher: `close` stopped it, after doing this itself.
        let (Some(tier), Some(_)) = (&shared.tier, &self.flusher) else {
            return;
        };
        let published = shared
            .checkpoint_and_wait()
            .and_then(|()| tier_mover::publish_manifest(shared, tier));
        if let Err(e) = published {
            tracing::warn!(error = %e, "stopping: the bucket's manifest copy was not updated (the next start uploads it)");
        }
    }

    /// Lets the log writer write what is queued, then stops it; later writes are refused.
    fn stop_log_writer(&mut self) {
        self.wal.shut_down();
        if let Some(handle) = self.log_writer.take() {
            let _ = handle.join();
        }
    }

    /// Stops the tiering thread after the request it is making, if any.
    fn stop_tierer(&mut self) {
        if let Some(tier) = &self.engine.shared().tier {
            tier.shut_down();
        }
        if let Some(handle) = self.tierer.take() {
            let _ = handle.join();
        }
    }

    fn stop_flusher(&mut self) {
        self.engine.shared().stop_flushing();
        if let Some(handle) = self.flusher.take() {
            let _ = handle.join();
        }
    }

    fn catalog_shared(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.engine.shared().catalog.read().ignore_poison()
    }

    fn catalog_exclusive(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.engine.shared().catalog.write().ignore_poison()
    }

    /// A finished log frame holding `command`; refused whole if it is larger than
    /// `max_batch_bytes`, before anything is logged.
    fn frame<B: BatchBytes>(&self, command: &Command<B>) -> Result<Vec<u8>> {
        let mut frame = Vec::with_capacity(log::FRAME_HEADER + command::encoded_len_hint(command));
        log::begin_frame(&mut frame);
        command::encode(command, &mut frame)?;
        let bytes = frame.len() - log::FRAME_HEADER;
        let max = self.engine.shared().options.max_batch_bytes;
        debug_assert!(max <= log::MAX_PAYLOAD, "Options::validate holds it");
        if bytes > max {
            return Err(EngineError::BatchTooLarge { bytes, max });
        }
        log::end_frame(&mut frame)?;
        Ok(frame)
    }
}

/// What a command must satisfy to be written now, beyond what applying it checks: the
/// rules for new names and schemas (stricter than what old logs may hold, which still
/// replay) and positive retention limits. The cluster checks the same before proposing.
pub fn check_new_command<B>(command: &Command<B>) -> Result<()> {
    match command {
        Command::CreateStream { name, schema, .. } => {
            validate_new_stream_name(name)?;
            schema.validate_new()?;
        }
        Command::AddFields { fields, .. } => {
            if fields.is_empty() {
                return Err(EngineError::InvalidRequest("no fields to add".into()));
            }
            Schema::new(fields.clone())?.validate_new()?;
        }
        Command::SetRetention { retention, .. } => {
            if retention.max_age_ns.is_some_and(|a| a <= 0) || retention.max_bytes == Some(0) {
                return Err(EngineError::InvalidRequest(
                    "retention limits must be positive".into(),
                ));
            }
        }
        Command::SetOutOfOrderWindow { window_ns, .. } => {
            if window_ns.is_some_and(|w| w < 0) {
                return Err(EngineError::InvalidRequest(
                    "an out-of-order window must not be negative".into(),
                ));
            }
        }
        Command::CommitPosition { consumer, .. } => {
            tidemark_core::name::validate_consumer_name(consumer)?;
        }
        Command::DropStream { .. } | Command::Clear { .. } | Command::Append { .. } => {}
    }
    Ok(())
}

/// Creates `dir` if needed and takes its lock file, so that one process at a time opens it.
pub(crate) fn lock_dir(dir: &Path) -> Result<File, OpenError> {
    let io = |action, path: &Path, e| OpenError::from(StorageError::io(action, path, e));
    fs::create_dir_all(dir.join("segments")).map_err(|e| io("create", dir, e))?;
    let lock_path = dir.join("LOCK");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| io("open", &lock_path, e))?;
    if lock.try_lock().is_err() {
        return Err(OpenError::Locked(dir.to_path_buf()));
    }
    Ok(lock)
}

impl Drop for Embedded {
    fn drop(&mut self) {
        self.stop_tierer();
        self.stop_log_writer();
        self.publish_on_stop();
        self.stop_flusher();
    }
}

/// Starts a recovered database fed by `log`: its flush thread (returned, for its owner
/// to stop), and a first flush if the recovered memtables are already full.
pub(crate) fn start_engine(
    dir: PathBuf,
    options: Options,
    state: State,
    log: Arc<dyn CommandLog>,
    reflected: Reflected,
    lock: File,
    tier: Option<Arc<Tier>>,
) -> Result<(Engine, JoinHandle<()>)> {
    // A drop or clear replayed from the log retired segments that the manifest still
    // names; only a checkpoint may delete their files, so one is due now rather than at
    // the next write, which may never come.
    let retirements_pending = !state.retired.is_empty();
    let shared = Arc::new(Shared::new(dir, options, state, log, reflected, lock, tier));
    let flusher = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("tidemark-flush".into())
            .spawn(move || flush::run(&shared))
    }
    .map_err(|e| StorageError::io("start the flush thread in", &shared.dir, e))?;
    shared.request_flush_if_full();
    if retirements_pending {
        shared.flush.request();
    }
    Ok((Engine::new(shared), flusher))
}

/// Starts the thread that moves old segments to the tier's bucket, when there is one.
pub(crate) fn spawn_tierer(engine: &Engine) -> Result<Option<JoinHandle<()>>> {
    let shared = engine.shared_arc();
    if shared.tier.is_none() {
        return Ok(None);
    }
    let mover = shared.clone();
    std::thread::Builder::new()
        .name("tidemark-tier".into())
        .spawn(move || tier_mover::run(&mover))
        .map(Some)
        .map_err(|e| StorageError::io("start the tiering thread in", &shared.dir, e).into())
}

/// What the log writer does with each group once it is durable: apply it in LSN order.
/// Applies a group the log wrote, which ends right before `end`.
fn apply_group(shared: &Shared, group: Vec<(u64, Logged)>, end: u64, appends: Appends) {
    let mut state = shared.write();
    for (lsn, Logged { command, given }) in group {
        let positions = state.apply_logged(lsn, command, appends);
        if let (Some(slot), Some(positions)) = (given, positions) {
            // Each record is applied once: the slot is empty.
            let _ = slot.set(positions);
        }
    }
    // The next checkpoint covers the group to its last byte, not to one past its last
    // record's position: a spool whose reader has forwarded everything then releases
    // every byte of its log (`LogFiles::release_before`).
    state.applied_to(end);
    drop(state);
    shared.request_flush_if_full();
}

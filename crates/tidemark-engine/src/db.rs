//! [`Db`]: opening (with recovery), the write path, and the catalog operations.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;

use tidemark_core::name::validate_new_stream_name;
use tidemark_core::{BatchSummary, ColumnData, EventBatch, Schema};
use tidemark_storage::record::{encode_append, Record, Retention, StreamId};
use tidemark_storage::{log, StorageError};

use crate::error::{EngineError, Result};
use crate::flush::{self, FlushSignal};
use crate::memtable::Summarized;
use crate::recovery;
use crate::state::{Change, State};
use crate::wal::Wal;
use crate::Options;

/// What an acknowledged append tells the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendAck {
    /// The log position of the batch: acknowledgements are ordered by it.
    pub lsn: u64,
    pub events: usize,
}

/// What [`Db::stream_info`] reports.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamInfo {
    pub name: String,
    pub schema: Arc<Schema>,
    pub event_count: u64,
    /// The smallest and largest tstart, if the stream has events.
    pub time_range: Option<(i64, i64)>,
    /// Bytes of the stream's segment files.
    pub bytes_on_disk: u64,
    /// Events in segments (the rest are in memtables, durable in the log).
    pub flushed_events: u64,
    /// Segment bytes per flushed event.
    pub compressed_bytes_per_event: Option<f64>,
    pub segments: usize,
    pub retention: Retention,
}

/// An embedded Tidemark database in one directory. Cheap to share across threads by
/// reference (`&Db` is `Send + Sync`); all methods take `&self`.
pub struct Db {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
}

pub(crate) struct Shared {
    pub dir: PathBuf,
    pub options: Options,
    pub state: RwLock<State>,
    /// The database's own log; `None` for a replica, whose log is its cluster's Raft log
    /// (see [`crate::replica`]).
    pub wal: Option<Wal<Change>>,
    /// What a replica recovered from: entries before its checkpoint are already reflected.
    pub(crate) replica: Option<crate::replica::Recovered>,
    /// Held by a checkpoint while it changes the manifest and segment files, and by an
    /// export of them, so that an export sees one consistent checkpoint.
    pub(crate) checkpointing: Mutex<()>,
    /// Serialises catalog changes (create, drop, clear, retention) between check and commit.
    catalog: Mutex<()>,
    pub flush: FlushSignal,
    /// `State::unflushed`, read without the state lock by appenders.
    unflushed: Arc<AtomicUsize>,
    _lock: File,
}

impl Shared {
    pub fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The database's own log, or an error for a replica: it changes only by what its
    /// cluster applies.
    fn own_log(&self) -> Result<&Wal<Change>> {
        self.wal.as_ref().ok_or_else(|| {
            EngineError::InvalidRequest(
                "this database is a cluster replica: write through the cluster".into(),
            )
        })
    }

    /// Logs a change, applies it once durable, and returns its LSN.
    fn commit(&self, frame: Vec<u8>, change: Change) -> Result<u64> {
        self.own_log()?.commit(frame, change, |group| {
            let mut state = self.write();
            for (lsn, change) in group {
                state.apply(lsn, change);
            }
            drop(state);
            self.request_flush_if_full();
        })
    }

    pub(crate) fn request_flush_if_full(&self) {
        if self.unflushed.load(Ordering::Acquire) >= self.options.memtable_bytes {
            self.flush.request();
        }
    }
}

impl Db {
    /// Opens (creating if needed) the database in `dir` and recovers it: the manifest's
    /// segments are opened and checked, and the log is replayed from the checkpoint.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Db> {
        options.validate()?;
        let dir = dir.as_ref().to_path_buf();

        let lock = lock_dir(&dir)?;
        let (state, wal) = recovery::recover(&dir, &options)?;
        Db::start(dir, options, state, Some(wal), None, lock)
    }

    /// Starts a recovered database: its flush thread, and a first flush if the recovered
    /// memtables are already full.
    pub(crate) fn start(
        dir: PathBuf,
        options: Options,
        state: State,
        wal: Option<Wal<Change>>,
        replica: Option<crate::replica::Recovered>,
        lock: File,
    ) -> Result<Db> {
        let unflushed = state.unflushed.clone();
        // A drop or clear replayed from the log retired segments that the manifest still
        // names; only a checkpoint may delete their files, so one is due now rather than at
        // the next write, which may never come.
        let retirements_pending = !state.retired.is_empty();
        let shared = Arc::new(Shared {
            dir,
            options,
            state: RwLock::new(state),
            wal,
            replica,
            checkpointing: Mutex::new(()),
            catalog: Mutex::new(()),
            flush: FlushSignal::default(),
            unflushed,
            _lock: lock,
        });
        let flusher = flush::spawn(shared.clone()).map_err(|e| {
            EngineError::Storage(StorageError::io(
                "start the flush thread in",
                &shared.dir,
                e,
            ))
        })?;
        shared.request_flush_if_full();
        if retirements_pending {
            shared.flush.request();
        }
        Ok(Db {
            shared,
            flusher: Some(flusher),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Creates a stream. Creating an existing stream with the same schema (names compared
    /// case-insensitively) does nothing; with another schema it fails with
    /// [`EngineError::StreamExists`].
    pub fn create_stream(&self, name: &str, schema: Schema) -> Result<()> {
        validate_new_stream_name(name)?;
        schema.validate_new()?;
        let _catalog = self.catalog();
        let id = {
            let state = self.shared.read();
            if let Some(existing) = state.stream(name) {
                if existing.schema.matches(&schema) {
                    return Ok(());
                }
                return Err(EngineError::StreamExists {
                    name: name.to_string(),
                    existing: existing.schema.to_spec(),
                });
            }
            state.next_stream_id
        };
        let record = Record::CreateStream {
            stream: id,
            name: name.to_string(),
            schema: schema.clone(),
        };
        let change = Change::Create {
            stream: id,
            name: name.to_string(),
            schema,
        };
        self.commit_record(&record, change)
    }

    /// Counters of the write-ahead log (group commits, bytes, fsync latencies).
    /// Why this database refuses writes, if it does: its log failed (a full disk, an I/O
    /// error) and it is read-only until reopened.
    pub fn write_failure(&self) -> Option<String> {
        self.shared.wal.as_ref().and_then(Wal::failure)
    }

    pub fn log_stats(&self) -> crate::LogStats {
        self.shared.wal.as_ref().map(Wal::stats).unwrap_or_default()
    }

    /// Stream names in alphabetical order.
    pub fn list_streams(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shared.read().by_name.keys().cloned().collect();
        names.sort();
        names
    }

    /// The schema of stream `name`: what a batch for it must be built against.
    pub fn stream_schema(&self, name: &str) -> Result<Arc<Schema>> {
        let state = self.shared.read();
        let stream = state
            .stream(name)
            .ok_or_else(|| EngineError::UnknownStream(name.to_string()))?;
        Ok(stream.schema.clone())
    }

    /// What stream `name` holds: events, time range, bytes on disk, retention.
    pub fn stream_info(&self, name: &str) -> Result<StreamInfo> {
        let state = self.shared.read();
        let s = state
            .stream(name)
            .ok_or_else(|| EngineError::UnknownStream(name.to_string()))?;
        let mut total: Option<BatchSummary> = None;
        let mut bytes_on_disk = 0;
        let mut flushed_events = 0;
        for segment in &s.segments {
            bytes_on_disk += segment.meta.bytes;
            flushed_events += segment.meta.event_count();
            for group in &segment.meta.groups {
                merge_into(&mut total, group);
            }
        }
        for memtable in s.memtables() {
            for b in &memtable.batches {
                merge_into(&mut total, &b.summary);
            }
        }
        Ok(StreamInfo {
            name: s.name.clone(),
            schema: s.schema.clone(),
            event_count: total.as_ref().map_or(0, |t| t.count),
            time_range: total.as_ref().map(|t| (t.min_ts, t.max_ts)),
            bytes_on_disk,
            flushed_events,
            compressed_bytes_per_event: (flushed_events > 0)
                .then(|| bytes_on_disk as f64 / flushed_events as f64),
            segments: s.segments.len(),
            retention: s.retention,
        })
    }

    /// Appends a batch to a stream; returns once it is durable (fsync'd in the log) and
    /// visible to scans. The batch is stored whole or not at all.
    pub fn append(&self, stream: &str, batch: EventBatch) -> Result<AppendAck> {
        let target = self.validated_target(stream, &batch)?;
        let id = target.id;
        let align = self.shared.options.segment.block_align_ns;
        let Some(events) = Summarized::new(batch, align) else {
            return Ok(AppendAck {
                lsn: self.shared.own_log()?.end_lsn(),
                events: 0,
            });
        };
        let frame = self.frame(|out| encode_append(id, &events.batch, out))?;
        self.wait_for_room()?;
        let count = events.batch.len();
        let lsn = self
            .shared
            .commit(frame, Change::Append { stream: id, events })?;
        Ok(AppendAck { lsn, events: count })
    }

    /// Blocks while more than `max_unflushed_bytes` wait for a flush, so that memory stays
    /// bounded when appends outrun compression.
    fn wait_for_room(&self) -> Result<()> {
        let shared = &self.shared;
        let limit = shared.options.max_unflushed_bytes;
        if shared.unflushed.load(Ordering::Acquire) < limit {
            return Ok(());
        }
        shared.flush.request();
        let room = shared.flush.wait_until(shared.options.stall_timeout, || {
            shared.unflushed.load(Ordering::Acquire) < limit
        });
        if room {
            Ok(())
        } else {
            Err(EngineError::Overloaded(format!(
                "{} bytes wait to be flushed (limit {limit}){}",
                shared.unflushed.load(Ordering::Acquire),
                shared
                    .flush
                    .last_error()
                    .map(|e| format!("; the last flush failed: {e}"))
                    .unwrap_or_default()
            )))
        }
    }

    /// Removes every event of a stream; the stream and its schema stay.
    pub fn clear(&self, stream: &str) -> Result<()> {
        let _catalog = self.catalog();
        let id = self.stream_id(stream)?;
        self.commit_record(&Record::Clear { stream: id }, Change::Clear { stream: id })?;
        self.shared.flush.request();
        Ok(())
    }

    /// Removes a stream and all its events.
    pub fn drop_stream(&self, stream: &str) -> Result<()> {
        let _catalog = self.catalog();
        let id = self.stream_id(stream)?;
        self.commit_record(
            &Record::DropStream { stream: id },
            Change::Drop { stream: id },
        )?;
        self.shared.flush.request();
        Ok(())
    }

    /// Sets how old (by tstart against the wall clock) and how large a stream may grow.
    /// Whole segments are dropped, oldest first, at the next flush.
    pub fn set_retention(&self, stream: &str, retention: Retention) -> Result<()> {
        if retention.max_age_ns.is_some_and(|a| a <= 0) || retention.max_bytes == Some(0) {
            return Err(EngineError::InvalidRequest(
                "retention limits must be positive".into(),
            ));
        }
        let _catalog = self.catalog();
        let id = self.stream_id(stream)?;
        self.commit_record(
            &Record::SetRetention {
                stream: id,
                retention,
            },
            Change::SetRetention {
                stream: id,
                retention,
            },
        )?;
        self.shared.flush.request();
        Ok(())
    }

    /// Flushes every memtable to segments and writes a manifest; returns when done.
    pub fn flush(&self) -> Result<()> {
        self.shared.flush.request_and_wait()
    }

    /// Flushes and closes the database. Dropping a `Db` closes it too, without the flush
    /// (recovery replays the log instead).
    pub fn close(mut self) -> Result<()> {
        let result = self.shared.flush.request_and_wait();
        self.stop_flusher();
        result
    }

    fn stop_flusher(&mut self) {
        self.shared.flush.shut_down();
        if let Some(handle) = self.flusher.take() {
            let _ = handle.join();
        }
    }

    fn catalog(&self) -> std::sync::MutexGuard<'_, ()> {
        self.shared
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn stream_id(&self, name: &str) -> Result<StreamId> {
        self.shared
            .read()
            .stream(name)
            .map(|s| s.id)
            .ok_or_else(|| EngineError::UnknownStream(name.to_string()))
    }

    fn commit_record(&self, record: &Record, change: Change) -> Result<()> {
        let frame = self.frame(|out| record.encode(out))?;
        self.shared.commit(frame, change).map(|_| ())
    }

    /// A finished log frame holding what `encode` writes; refused whole if the record is
    /// larger than `max_batch_bytes`, before anything is logged.
    fn frame(
        &self,
        encode: impl FnOnce(&mut Vec<u8>) -> std::result::Result<(), StorageError>,
    ) -> Result<Vec<u8>> {
        let mut frame = Vec::new();
        log::begin_frame(&mut frame);
        encode(&mut frame)?;
        let bytes = frame.len() - log::FRAME_HEADER;
        // Options::validate holds max_batch_bytes to the log's record limit.
        let max = self.shared.options.max_batch_bytes;
        debug_assert!(max <= log::MAX_PAYLOAD);
        if bytes > max {
            return Err(EngineError::BatchTooLarge { bytes, max });
        }
        log::end_frame(&mut frame)?;
        Ok(frame)
    }

    /// The stream `batch` is for, after checking the batch against it (schema, value sizes,
    /// the out-of-order window). Validation runs outside the state lock.
    pub(crate) fn validated_target<'a>(
        &self,
        stream: &'a str,
        batch: &EventBatch,
    ) -> Result<Target<'a>> {
        let target = {
            let state = self.shared.read();
            let s = state
                .stream(stream)
                .ok_or_else(|| EngineError::UnknownStream(stream.to_string()))?;
            Target {
                id: s.id,
                name: stream,
                schema: s.schema.clone(),
                max_ts: s.max_ts,
            }
        };
        validate_batch(&target, batch, &self.shared.options)?;
        Ok(target)
    }
}

/// Creates `dir` if needed and takes its lock file, so that one process at a time opens it.
pub(crate) fn lock_dir(dir: &Path) -> Result<File> {
    let io = |action, path: &Path, e| EngineError::Storage(StorageError::io(action, path, e));
    fs::create_dir_all(dir.join("segments")).map_err(|e| io("create", dir, e))?;
    let lock_path = dir.join("LOCK");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| io("open", &lock_path, e))?;
    if lock.try_lock().is_err() {
        return Err(EngineError::Locked(dir.to_path_buf()));
    }
    Ok(lock)
}

impl Drop for Db {
    fn drop(&mut self) {
        self.stop_flusher();
    }
}

fn merge_into(total: &mut Option<BatchSummary>, next: &BatchSummary) {
    match total {
        Some(t) => t.merge(next),
        None => *total = Some(next.clone()),
    }
}

/// What an append checks a batch against, copied out of the state so that validation runs
/// without holding the lock.
pub(crate) struct Target<'a> {
    id: StreamId,
    name: &'a str,
    schema: Arc<Schema>,
    max_ts: Option<i64>,
}

/// Checks what the batch type cannot: the stream's schema, value sizes, how far ahead of
/// the clock events are and the out-of-order window.
fn validate_batch(stream: &Target, batch: &EventBatch, options: &Options) -> Result<()> {
    if batch.schema().fields() != stream.schema.fields() {
        return Err(EngineError::Invalid(tidemark_core::CoreError::Shape(
            format!(
                "batch has schema {}, stream {:?} has {}",
                batch.schema(),
                stream.name,
                stream.schema
            ),
        )));
    }
    for (column, field) in batch.columns().iter().zip(stream.schema.fields()) {
        if let ColumnData::String(values) | ColumnData::Bytes(values) = column.data() {
            if let Some((row, len)) = values
                .lengths()
                .enumerate()
                .find(|&(_, len)| len as usize > options.max_value_bytes)
            {
                return Err(EngineError::ValueTooLong {
                    row,
                    field: field.name.clone(),
                    len: len as usize,
                    max: options.max_value_bytes,
                });
            }
        }
    }
    if let Some(max_ahead_ns) = options.max_future_ns {
        let now = crate::flush::now_ns();
        let latest_allowed = now.saturating_add(max_ahead_ns);
        if let Some((row, &tstart)) = batch
            .tstart()
            .iter()
            .enumerate()
            .find(|&(_, &ts)| ts > latest_allowed)
        {
            return Err(EngineError::TooFarAhead {
                row,
                tstart,
                now,
                max_ahead_ns,
            });
        }
    }
    if let Some(window) = options.out_of_order_window_ns {
        let mut newest = stream.max_ts.unwrap_or(i64::MIN);
        for (row, &ts) in batch.tstart().iter().enumerate() {
            newest = newest.max(ts);
            let oldest_allowed = newest.saturating_sub(window);
            if ts < oldest_allowed {
                return Err(EngineError::TooLate {
                    stream: stream.name.to_string(),
                    row,
                    tstart: ts,
                    oldest_allowed,
                });
            }
        }
    }
    Ok(())
}

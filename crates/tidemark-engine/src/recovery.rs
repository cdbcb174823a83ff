//! Recovery: from the files of a data directory back to the in-memory state and an open
//! log. The manifest's segments are opened and checked, the log is replayed from the
//! manifest's replay point (a torn tail is cut off; corruption refuses the open, and
//! [`repair_log`] cuts it, saving what it cuts), and files no manifest names are deleted.
//! See "Why an acknowledged event survives a crash" in `docs/ARCHITECTURE.md`.
//!
//! Must never know about: the threads a recovered database runs (`db`, `replica` start
//! them), any transport.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tidemark_core::command::{self, Command};
use tidemark_storage::legacy_record::Record;
use tidemark_storage::manifest::{stub_path, Manifest, TieredSegment, LOG_FORMAT};
use tidemark_storage::segment::{SegmentMeta, SegmentStub};
use tidemark_storage::StorageError;

use crate::error::{EngineError, OpenError, Result};
use crate::options::Options;
use crate::segment::{Segment, SegmentFile};
use crate::state::{Appends, Logged, Reflected, State};
use crate::tier::Tier;
use crate::wal::{self, Wal};

/// An embedded database as recovered from its files.
pub(crate) struct Recovered {
    pub state: State,
    pub wal: Wal<Logged>,
    pub reflected: Reflected,
    /// The log format the directory was written in, when it is older than this build's:
    /// its old records are in memory now, and a checkpoint must put them in segments
    /// before anything is logged after them.
    pub upgrade_from: Option<u32>,
}

/// Rebuilds the state of the database in `dir` and opens its log for appending.
/// Appends are replayed as `appends` says: applied, or (a spool's) only logged.
pub(crate) fn recover(
    dir: &Path,
    options: &Options,
    tier: Option<&Arc<Tier>>,
    appends: Appends,
) -> Result<Recovered, OpenError> {
    let (manifest, manifest_found, format) = load_manifest(dir)?;
    let mut state = open_segments(dir, &manifest, tier)?;
    state.freeze_memtables_at = Some(options.memtable_bytes);
    // A stream of a manifest written before streams had positions counts them from its
    // replay point on: this log is the only copy of the database, so no other replica
    // must count alike (a cluster's replicas keep such a stream without positions).
    for stream in state.streams.values_mut() {
        stream.next_position.get_or_insert(0);
    }
    let reflected = Reflected::of(&manifest);
    let align = options.segment.block_align_ns;
    let mut records = 0usize;
    let replayed = wal::replay(
        &dir.join("wal"),
        manifest.log_start(),
        manifest_found,
        options.log_file_bytes,
        |lsn, payload| {
            records += 1;
            let command = if format >= FIRST_COMMAND_FORMAT {
                Some(command::decode(payload).map_err(|e| corrupt_record(lsn, e))?)
            } else {
                legacy_command(&state, &reflected, lsn, payload)?
            };
            match command {
                Some(command) => {
                    replay_command(&mut state, &reflected, align, appends, lsn, command)?;
                    Ok::<(), OpenError>(())
                }
                None => Ok(()),
            }
        },
    )
    .map_err(|e| with_repair_advice(e, dir))?;
    if let Some(what) = &replayed.truncated {
        tracing::warn!(dir = %dir.display(), "recovery {what}");
    }
    if let Some(what) = &replayed.ignored {
        tracing::warn!(dir = %dir.display(), "recovery: {what}");
    }
    let mut files = replayed.files;
    if appends == Appends::LoggedOnly {
        // Its reader releases files in its own time: none is kept to be reused.
        files.stop_recycling()?;
    }
    let wal = Wal::new(files);
    check_log_reaches_checkpoint(&wal, &manifest)?;
    state.applied_lsn = wal.end_lsn();
    remove_unreferenced_segments(dir, &state)?;
    if manifest_found && (FIRST_COMMAND_FORMAT..LOG_FORMAT).contains(&format) {
        mark_writes_from_now_on(dir, &manifest, format)?;
    }
    let fresh = !manifest_found && records == 0;
    if fresh {
        // Its log file exists now: the manifest that names the directory's format may
        // follow (the other order would leave a manifest without the log it needs).
        manifest.store(dir)?;
    }
    Ok(Recovered {
        state,
        wal,
        reflected,
        upgrade_from: (format < FIRST_COMMAND_FORMAT && !fresh).then_some(format),
    })
}

/// New records would get LSNs the manifest says are already reflected if the log ended
/// before its checkpoint: records the manifest relies on are missing.
fn check_log_reaches_checkpoint(wal: &Wal<Logged>, manifest: &Manifest) -> Result<(), OpenError> {
    if wal.end_lsn() >= manifest.checkpoint_lsn {
        return Ok(());
    }
    Err(OpenError::from(StorageError::corrupt(
        "log",
        format!(
            "it ends at LSN {} but the manifest's checkpoint is at {}: records the manifest relies on are missing",
            wal.end_lsn(),
            manifest.checkpoint_lsn
        ),
    )))
}

/// A log of a format whose records are commands but whose writes are not marked: its
/// records are read as they are. The manifest says so before the first marked frame is
/// written, so that a build that would take marked frames for torn ones refuses the
/// directory instead of cutting its log.
fn mark_writes_from_now_on(dir: &Path, manifest: &Manifest, format: u32) -> Result<(), OpenError> {
    let mut upgraded = manifest.clone();
    upgraded.log_format = LOG_FORMAT;
    upgraded.store(dir)?;
    tracing::info!(
        dir = %dir.display(),
        "the log is now written in format {LOG_FORMAT} (each write's first frame marked); \
         its format {format} records read as they are"
    );
    Ok(())
}

/// The manifest of `dir` (an empty one if there is none), whether one was found, and the
/// log format it says, refused if this build cannot read it.
fn load_manifest(dir: &Path) -> Result<(Manifest, bool, u32), OpenError> {
    let loaded = Manifest::load(dir)?;
    let found = loaded.is_some();
    // A directory of this build gets its manifest when it is created, before its log has
    // a record, so a log without a manifest is of format 1.
    let format = loaded.as_ref().map_or(1, |m| m.log_format);
    if !(1..=LOG_FORMAT).contains(&format) {
        return Err(OpenError::UnsupportedFormat {
            dir: dir.to_path_buf(),
            found: format,
            newest: LOG_FORMAT,
        });
    }
    Ok((loaded.unwrap_or_else(Manifest::empty), found, format))
}

/// [`crate::Db::repair_log`]: cuts the corrupt log of the database in `dir` at its damage,
/// saving what it cuts beside it (`wal::repair`). The caller holds the directory's lock.
pub(crate) fn repair_log(dir: &Path) -> Result<Option<wal::RepairedLog>, OpenError> {
    let (manifest, _, _) = load_manifest(dir)?;
    let wal_dir = dir.join("wal");
    if !wal_dir.is_dir() {
        return Ok(None);
    }
    wal::repair(&wal_dir, manifest.log_start(), manifest.checkpoint_lsn)
        .map_err(|e| with_repair_advice(e.into(), dir))
}

/// The first log format whose records are commands (`tidemark_core::command`): format 1's
/// are converted, and put in segments by a full checkpoint before anything is logged after
/// them; later formats differ only in how frames are marked, which the reader takes as it
/// finds it.
const FIRST_COMMAND_FORMAT: u32 = 2;

/// A corrupt log, with what to do about it in a data directory's terms.
pub(crate) fn with_repair_advice(e: OpenError, dir: &Path) -> OpenError {
    match e {
        OpenError::CorruptLog(mut corrupt) => {
            corrupt.advice = format!(
                "To cut the log at the damage and open again, saving every byte cut into a \
                 file beside the log: `tidemark verify --repair --data-dir {}` (the records \
                 after the damage are not restored)",
                dir.display()
            );
            OpenError::CorruptLog(corrupt)
        }
        e => e,
    }
}

/// Applies one replayed command unless the manifest already reflects it. A command the
/// log holds was checked before it was logged, so one that does not apply now means the
/// log and the manifest disagree: the open fails rather than lose it silently.
fn replay_command(
    state: &mut State,
    reflected: &Reflected,
    align_ns: i64,
    appends: Appends,
    lsn: u64,
    command: Command<&[u8]>,
) -> Result<()> {
    if reflected.covers(state, lsn, &command) {
        return Ok(());
    }
    if let (Appends::LoggedOnly, Command::Append { producer, .. }) = (appends, &command) {
        // A spool keeps no events: its appends are not even decoded.
        let applies = state.admit_logged_append(lsn, producer.as_ref(), appends);
        debug_assert!(!applies, "a spool applied an append");
        return Ok(());
    }
    match state
        .prepare(command, align_ns)
        .map_err(|e| corrupt_record(lsn, e))?
    {
        Some(prepared) => {
            state.apply_logged(lsn, prepared, appends);
        }
        None => state.skip(lsn),
    }
    Ok(())
}

fn corrupt_record(lsn: u64, e: impl std::fmt::Display) -> EngineError {
    EngineError::Storage(StorageError::corrupt(
        "log",
        format!("the record at LSN {lsn} does not apply: {e}"),
    ))
}

/// The command a record of log format 1 stands for, with the stream it numbers named as
/// the state being replayed names it; `None` for one to a stream dropped later on (format
/// 1 logged appends and drops in either order).
fn legacy_command<'a>(
    state: &State,
    reflected: &Reflected,
    lsn: u64,
    payload: &'a [u8],
) -> Result<Option<Command<&'a [u8]>>> {
    let record = Record::decode(payload)?;
    if let Record::CreateStream {
        stream,
        name,
        schema,
    } = record
    {
        if lsn < reflected.checkpoint {
            return Ok(None); // the manifest's catalog has it
        }
        // Format 1 logged the number the create assigned; applying it assigns the next
        // one, and later records number the stream by it.
        if stream != state.next_stream_id {
            return Err(EngineError::Storage(StorageError::corrupt(
                "log",
                format!(
                    "stream {name:?} was created as number {stream}, the catalog's next number is {}",
                    state.next_stream_id
                ),
            )));
        }
        return Ok(Some(Command::CreateStream {
            name,
            schema,
            evolving: false,
            partition: tidemark_core::Partition::DAY,
        }));
    }
    let Some(name) = state.streams.get(&record.stream()).map(|s| s.name.clone()) else {
        return Ok(None);
    };
    Ok(Some(match record {
        Record::DropStream { .. } => Command::DropStream { name },
        Record::Clear { .. } => Command::Clear { name },
        Record::SetRetention { retention, .. } => Command::SetRetention { name, retention },
        Record::Append { body, .. } => Command::Append {
            name,
            batch: body,
            producer: None,
        },
        Record::CreateStream { .. } => return Ok(None),
    }))
}

/// Rebuilds the state of a replica in `dir` from its manifest and segments alone: its log
/// is its cluster's, which replays what the manifest does not reflect.
pub(crate) fn recover_replica(
    dir: &Path,
    tier: Option<&Arc<Tier>>,
) -> Result<(State, Reflected), OpenError> {
    let manifest = Manifest::load(dir)?.unwrap_or_else(Manifest::empty);
    let state = open_segments(dir, &manifest, tier)?;
    remove_unreferenced_segments(dir, &state)?;
    Ok((state, Reflected::of(&manifest)))
}

/// Opens every segment the manifest names; a missing or damaged one fails the open. A
/// tiered one is opened from its stub, without a request to the bucket.
fn open_segments(
    dir: &Path,
    manifest: &Manifest,
    tier: Option<&Arc<Tier>>,
) -> Result<State, OpenError> {
    let mut failure = None;
    let mut packs = HashMap::new();
    let state = State::from_manifest(manifest, |m| {
        let mut segments = Vec::new();
        for &id in &m.segments {
            if let Some(object) = manifest.tiered.get(&id) {
                match open_tiered(dir, id, object, tier) {
                    Ok(segment) if m.schema.extends(&segment.meta.schema) => {
                        segments.push(Arc::new(segment))
                    }
                    Ok(_) => {
                        failure.get_or_insert(OpenError::from(StorageError::corrupt(
                            format!("tiered segment {id}"),
                            format!("its schema is not the beginning of stream {:?}'s", m.name),
                        )));
                    }
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
                continue;
            }
            let opened = match manifest.segment_location(dir, id) {
                (path, None) => SegmentMeta::open(&path).map(|(_, meta)| {
                    let file = SegmentFile::new(path, meta.bytes, false);
                    (file, None, meta)
                }),
                (path, Some(packed)) => {
                    open_pack(&mut packs, path, packed.pack).and_then(|(file, opened)| {
                        let meta = SegmentMeta::read(opened, &file.path, packed.range())?;
                        Ok((file.clone(), Some(packed), meta))
                    })
                }
            };
            match opened {
                // A segment written before fields were added has the schema's beginning.
                Ok((file, packed, meta)) if m.schema.extends(&meta.schema) => {
                    segments.push(Arc::new(Segment::new(id, file, packed, meta)))
                }
                Ok((file, ..)) => {
                    failure.get_or_insert(OpenError::from(StorageError::corrupt(
                        format!("segment {id} in {}", file.path.display()),
                        format!("its schema is not the beginning of stream {:?}'s", m.name),
                    )));
                }
                Err(e) => {
                    failure.get_or_insert(e.into());
                }
            }
        }
        segments
    });
    match failure {
        Some(e) => Err(e),
        None => Ok(state),
    }
}

/// Tiered segment `id`, its footer read from its stub.
fn open_tiered(
    dir: &Path,
    id: u64,
    object: &TieredSegment,
    tier: Option<&Arc<Tier>>,
) -> Result<Segment, OpenError> {
    let Some(tier) = tier else {
        return Err(OpenError::InvalidOptions(format!(
            "segment {id} of {} is in a tier's bucket (object {}): open the database with its [tier] configuration",
            dir.display(),
            object.object
        )));
    };
    let path = stub_path(dir, id);
    let bytes = fs::read(&path).map_err(|e| StorageError::io("read", &path, e))?;
    let stub = SegmentStub::from_bytes(bytes, object.origin, object.len)?;
    let meta = SegmentMeta::read(&stub, &path, stub.range())?;
    Ok(Segment::tiered(
        id,
        object.clone(),
        path,
        tier.clone(),
        meta,
    ))
}

/// Pack `id` at `path`, opened once however many segments it holds.
fn open_pack(
    packs: &mut HashMap<u64, (Arc<SegmentFile>, File)>,
    path: PathBuf,
    id: u64,
) -> std::result::Result<&(Arc<SegmentFile>, File), StorageError> {
    use std::collections::hash_map::Entry;
    match packs.entry(id) {
        Entry::Occupied(open) => Ok(open.into_mut()),
        Entry::Vacant(slot) => {
            let file = File::open(&path).map_err(|e| StorageError::io("open pack", &path, e))?;
            let bytes = file
                .metadata()
                .map_err(|e| StorageError::io("stat pack", &path, e))?
                .len();
            Ok(slot.insert((SegmentFile::new(path, bytes, true), file)))
        }
    }
}

/// Deletes segment and pack files no manifest names: leftovers of a flush interrupted by a
/// crash, or of segments retired just before one.
fn remove_unreferenced_segments(dir: &Path, state: &State) -> Result<(), OpenError> {
    let live: HashSet<PathBuf> = state
        .streams
        .values()
        .flat_map(|s| &s.segments)
        .chain(&state.retired)
        .map(|seg| seg.local_path().to_path_buf())
        .collect();
    let segments = dir.join("segments");
    let entries = fs::read_dir(&segments).map_err(|e| StorageError::io("list", &segments, e))?;
    for entry in entries {
        let path = entry
            .map_err(|e| StorageError::io("list", &segments, e))?
            .path();
        if !live.contains(&path) {
            fs::remove_file(&path).map_err(|e| StorageError::io("delete", &path, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use tidemark_core::{BatchBuilder, Schema, Value};

    use crate::{Db, Options};

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }

    fn segment_files(dir: &Path) -> usize {
        std::fs::read_dir(dir.join("segments")).unwrap().count()
    }

    /// kill -9 right after a drop or clear was answered: the log holds the drop, the
    /// manifest still names the segments. Opening must delete their files by itself, not
    /// leave them until some later write.
    #[test]
    fn files_of_a_stream_dropped_or_cleared_just_before_a_crash_are_deleted_on_open() {
        for clear in [false, true] {
            let (dir, crashed) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let db = Db::open(dir.path(), Options::default()).unwrap();
            let schema = Arc::new(Schema::parse_spec("I:LONG").unwrap());
            db.create_stream("gone", (*schema).clone()).unwrap();
            let mut batch = BatchBuilder::new(schema, 1);
            batch.push_row(1, None, &[Value::Long(1)]).unwrap();
            db.append("gone", batch.finish()).unwrap();
            db.flush().unwrap();
            assert!(segment_files(dir.path()) > 0);
            {
                // No checkpoint can run while this is held: the copy is what a crash
                // right after the answer leaves.
                let _no_checkpoint = db.shared().checkpointing.lock().unwrap();
                if clear {
                    db.clear("gone").unwrap();
                } else {
                    db.drop_stream("gone").unwrap();
                }
                copy_dir(dir.path(), crashed.path());
            }
            drop(db);
            assert!(segment_files(crashed.path()) > 0);
            let reopened = Db::open(crashed.path(), Options::default()).unwrap();
            let started = Instant::now();
            while segment_files(crashed.path()) > 0 {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "the dropped stream's segment files are still there (clear: {clear})"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_eq!(reopened.list_streams().len(), usize::from(clear));
        }
    }
}

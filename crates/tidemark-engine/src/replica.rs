//! A replica: a database whose log is not its own but its cluster's Raft log.
//!
//! The cluster writes every change once, as a Raft entry, and applies committed entries here
//! in log order with [`Db::apply_replicated`]; the entry's Raft index is its position, used
//! exactly where an embedded database uses its log position (LSN). Nothing is written to a
//! log of the engine's own: the memtables are rebuilt after a restart by re-applying the Raft
//! log from the manifest's replay point, and the entries before it are skipped because the
//! segments already hold them — the same rule embedded recovery follows.
//!
//! Commands name streams by name, not by id: ids are assigned as the create command is
//! applied, so every replica assigns the same ones, and a command proposed before a stream
//! was dropped and re-created cannot reach the new stream by a stale id.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use tidemark_core::name::validate_stream_name;
use tidemark_core::{EventBatch, Schema};
use tidemark_storage::fsutil::sync_dir;
use tidemark_storage::manifest::Manifest;
use tidemark_storage::record::{decode_append, Retention, StreamId};
use tidemark_storage::StorageError;

use crate::db::{lock_dir, Db};
use crate::error::{EngineError, Result};
use crate::memtable::Summarized;
use crate::recovery;
use crate::state::{Change, State};
use crate::Options;

/// A change to a replicated database, as its cluster's log carries it.
#[derive(Debug, Clone, PartialEq)]
pub enum Command<'a> {
    CreateStream {
        name: &'a str,
        schema: Schema,
    },
    DropStream {
        name: &'a str,
    },
    Clear {
        name: &'a str,
    },
    SetRetention {
        name: &'a str,
        retention: Retention,
    },
    /// `body` is the batch in the wire form of `tidemark_core::wire`.
    Append {
        name: &'a str,
        body: &'a [u8],
    },
}

/// What the manifest a replica was opened from already reflects.
pub(crate) struct Recovered {
    pub checkpoint: u64,
    pub replay_from: HashMap<StreamId, u64>,
}

/// A checkpoint copied out of a replica by [`Db::export_checkpoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportedCheckpoint {
    /// Every position before this one is reflected in the exported files.
    pub log_start: u64,
    pub segments: usize,
    pub bytes: u64,
}

impl Db {
    /// Opens (creating if needed) the replica in `dir` from its manifest and segments.
    /// Every position from [`Db::applied_position`] on must then be applied again, in order.
    pub fn open_replica(dir: impl AsRef<Path>, options: Options) -> Result<Db> {
        options.validate()?;
        let dir = dir.as_ref().to_path_buf();
        let lock = lock_dir(&dir)?;
        let (state, recovered) = recovery::recover_replica(&dir)?;
        Db::start(dir, options, state, None, Some(recovered), lock)
    }

    /// Every position before this one has been applied (or is reflected in segments).
    pub fn applied_position(&self) -> u64 {
        self.shared().read().applied_lsn
    }

    /// Checks an append before it is proposed to the cluster: the stream, the schema, value
    /// sizes, the out-of-order window, and room in memory ([`EngineError::Overloaded`] when
    /// the flush is behind). Applying it later checks only what every replica decides alike.
    pub fn check_append(&self, stream: &str, batch: &EventBatch) -> Result<()> {
        let shared = self.shared();
        self.validated_target(stream, batch)?;
        let limit = shared.options.max_unflushed_bytes;
        let unflushed = shared.read().unflushed_bytes();
        if unflushed >= limit {
            shared.flush.request();
            return Err(EngineError::Overloaded(format!(
                "{unflushed} bytes wait to be flushed (limit {limit})"
            )));
        }
        Ok(())
    }

    /// Applies the command at `position` (positions strictly increase) and returns how many
    /// events it added. The outcome — success or error — is the same on every replica that
    /// applies the same commands in the same order. Positions already reflected in the
    /// manifest the replica was opened from are skipped.
    pub fn apply_replicated(&self, position: u64, command: Command<'_>) -> Result<usize> {
        let outcome = self.apply_command(position, command);
        if outcome.is_err() {
            self.skip_position(position);
        }
        outcome
    }

    fn apply_command(&self, position: u64, command: Command<'_>) -> Result<usize> {
        let shared = self.shared();
        let change = {
            let state = shared.read();
            if self.already_reflected(&state, position, &command) {
                return Ok(0);
            }
            match command {
                Command::CreateStream { name, schema } => {
                    validate_stream_name(name)?;
                    if let Some(existing) = state.stream(name) {
                        if existing.schema.matches(&schema) {
                            drop(state);
                            self.skip_position(position);
                            return Ok(0);
                        }
                        return Err(EngineError::StreamExists {
                            name: name.to_string(),
                            existing: existing.schema.to_spec(),
                        });
                    }
                    Change::Create {
                        stream: state.next_stream_id,
                        name: name.to_string(),
                        schema,
                    }
                }
                Command::DropStream { name } => Change::Drop {
                    stream: stream_id(&state, name)?,
                },
                Command::Clear { name } => Change::Clear {
                    stream: stream_id(&state, name)?,
                },
                Command::SetRetention { name, retention } => Change::SetRetention {
                    stream: stream_id(&state, name)?,
                    retention,
                },
                Command::Append { name, body } => {
                    let s = state
                        .stream(name)
                        .ok_or_else(|| EngineError::UnknownStream(name.to_string()))?;
                    let (id, schema) = (s.id, s.schema.clone());
                    drop(state);
                    let batch = decode_append(body, &schema)?;
                    let align = shared.options.segment.block_align_ns;
                    let Some(events) = Summarized::new(batch, align) else {
                        self.skip_position(position);
                        return Ok(0);
                    };
                    self.wait_for_room_without_failing();
                    let count = events.batch.len();
                    shared
                        .write()
                        .apply(position, Change::Append { stream: id, events });
                    shared.request_flush_if_full();
                    return Ok(count);
                }
            }
        };
        let catalog = !matches!(change, Change::Create { .. });
        shared.write().apply(position, change);
        if catalog {
            shared.flush.request();
        }
        Ok(0)
    }

    /// Records that `position` held nothing for the database (a Raft membership change, an
    /// empty entry, a command that failed), so that checkpoints move past it.
    pub fn skip_position(&self, position: u64) {
        let mut state = self.shared().write();
        state.applied_lsn = state.applied_lsn.max(position + 1);
    }

    /// Flushes, then hard-links the durable manifest and the segments it names into `dest`
    /// (a new directory, on the same file system): a replica opened there holds everything
    /// before the returned `log_start`. Segment files are immutable, so the links are a
    /// consistent copy for as long as `dest` lives, whatever the database does next.
    pub fn export_checkpoint(&self, dest: &Path) -> Result<ExportedCheckpoint> {
        self.flush()?;
        let shared = self.shared();
        let _checkpointing = shared
            .checkpointing
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let manifest = Manifest::load(&shared.dir)?.unwrap_or_else(Manifest::empty);
        let segments_dir = dest.join("segments");
        fs::create_dir_all(&segments_dir)
            .map_err(|e| StorageError::io("create", &segments_dir, e))?;
        let mut exported = ExportedCheckpoint {
            log_start: manifest.log_start(),
            segments: 0,
            bytes: 0,
        };
        exported.segments = manifest.streams.iter().map(|s| s.segments.len()).sum();
        for from in manifest.segment_files(&shared.dir) {
            let to = segments_dir.join(from.file_name().unwrap_or_default());
            fs::hard_link(&from, &to).map_err(|e| StorageError::io("link", &to, e))?;
            exported.bytes += fs::metadata(&to)
                .map_err(|e| StorageError::io("stat", &to, e))?
                .len();
        }
        sync_dir(&segments_dir)?;
        manifest.store(dest)?;
        Ok(exported)
    }

    /// Entries before the checkpoint the replica was opened from are in its manifest's
    /// catalog, and appends before their stream's replay point are in its segments.
    fn already_reflected(&self, state: &State, position: u64, command: &Command<'_>) -> bool {
        let Some(recovered) = &self.shared().replica else {
            return false;
        };
        if position >= recovered.checkpoint {
            return false;
        }
        match command {
            // Below the checkpoint no catalog change has been applied yet, so the name
            // still means the stream the manifest names (or one dropped since: skip).
            Command::Append { name, .. } => state
                .stream(name)
                .is_none_or(|s| position < recovered.replay_from.get(&s.id).copied().unwrap_or(0)),
            _ => true,
        }
    }

    /// A replica cannot refuse a committed entry, so it waits for the flush as long as it
    /// takes; the leader refuses new appends long before ([`Db::check_append`]).
    fn wait_for_room_without_failing(&self) {
        let shared = self.shared();
        let limit = shared.options.max_unflushed_bytes;
        let room = || shared.read().unflushed_bytes() < limit;
        while !room() {
            shared.flush.request();
            if !shared.flush.wait_until(shared.options.stall_timeout, room) {
                tracing::warn!(
                    dir = %shared.dir.display(),
                    "a replicated append waits for the flush to make room"
                );
            }
        }
    }
}

fn stream_id(state: &State, name: &str) -> Result<StreamId> {
    state
        .stream(name)
        .map(|s| s.id)
        .ok_or_else(|| EngineError::UnknownStream(name.to_string()))
}

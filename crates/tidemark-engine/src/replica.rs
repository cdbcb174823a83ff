//! A replica: a database whose log is not its own but its cluster's Raft log.
//!
//! The cluster writes every change once, as a Raft entry, and applies committed entries here
//! in log order with [`Replica::apply_replicated`]; the entry's Raft index is its position, used
//! exactly where an embedded database uses its log position (LSN). Nothing is written to a
//! log of the engine's own: the memtables are rebuilt after a restart by re-applying the Raft
//! log from the manifest's replay point, and the entries before it are skipped because the
//! segments already hold them — the same rule embedded recovery follows.
//!
//! Commands (`tidemark_core::command`) are the same an embedded database logs, and are
//! checked and applied by the same rules ([`crate::state::State::prepare`]).
//!
//! Must never know about: Raft or the cluster's log format (it is handed positions and
//! commands), any transport.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use tidemark_core::sync::IgnorePoison;
use tidemark_core::{Command, EventBatch};
use tidemark_storage::fsutil::sync_dir;
use tidemark_storage::manifest::{stub_path, Manifest};
use tidemark_storage::StorageError;

use crate::db::{lock_dir, spawn_tierer, start_engine};
use crate::engine::Engine;
use crate::error::{EngineError, OpenError, Result};
use crate::options::Options;
use crate::recovery;
use crate::state::{frees_files_at_checkpoint, Positions};
use crate::tier::Tier;
use crate::tier_mover;
use crate::wal::CommandLog;

/// A checkpoint copied out of a replica by [`Replica::export_checkpoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportedCheckpoint {
    /// Every position before this one is reflected in the exported files.
    pub log_start: u64,
    pub segments: usize,
    pub bytes: u64,
}

/// A database whose log is its cluster's: it is changed only by applying the commands
/// its cluster commits ([`Replica::apply_replicated`]), in log order; everything it reads
/// is [`Engine`]'s (through `Deref`). There is no write API to call by mistake.
pub struct Replica {
    engine: Engine,
    flusher: Option<JoinHandle<()>>,
    /// Moves old segments to the tier's bucket ([`crate::tier`]), when there is one.
    tierer: Option<JoinHandle<()>>,
}

impl std::ops::Deref for Replica {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(tier) = &self.shared().tier {
            tier.shut_down();
        }
        if let Some(handle) = self.tierer.take() {
            let _ = handle.join();
        }
        self.shared().stop_flushing();
        if let Some(handle) = self.flusher.take() {
            let _ = handle.join();
        }
    }
}

/// What applying a replicated command added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub events: usize,
    /// The stream positions of an append's events (`None`: not an append, or its stream
    /// gives none).
    pub positions: Option<Positions>,
}

impl Applied {
    const NOTHING: Applied = Applied {
        events: 0,
        positions: None,
    };
}

impl Replica {
    /// Opens (creating if needed) the replica in `dir` from its manifest and segments, fed
    /// by `log` (its cluster's Raft log, for what the replica reports of it). Every position
    /// from [`Replica::applied_position`] on must then be applied again, in order.
    ///
    /// With [`Options::tier`], the replica tiers its own segments into the tier's prefix,
    /// which belongs to it alone (a cluster gives each node, and each generation of a
    /// node's data, a prefix of its own). A directory made from another replica's
    /// checkpoint ([`Replica::export_checkpoint`]) first copies the objects of its tiered
    /// segments into that prefix (`tier_mover::adopt_objects`).
    pub fn open(
        dir: impl AsRef<Path>,
        options: Options,
        log: Arc<dyn CommandLog>,
    ) -> Result<Replica, OpenError> {
        options.validate()?;
        let dir = dir.as_ref().to_path_buf();
        let lock = lock_dir(&dir)?;
        let tier = options.tier.as_ref().map(|t| Arc::new(Tier::new(t)));
        tier_mover::adopt_objects(&dir, tier.as_deref())?;
        let (mut state, reflected) = recovery::recover_replica(&dir, tier.as_ref())?;
        state.freeze_memtables_at = Some(options.memtable_bytes);
        let (engine, flusher) = start_engine(dir, options, state, log, reflected, lock, tier)?;
        let tierer = spawn_tierer(&engine)?;
        Ok(Replica {
            engine,
            flusher: Some(flusher),
            tierer,
        })
    }

    /// A read handle on this replica that callers may keep (see [`Engine`]).
    pub fn engine(&self) -> Engine {
        self.engine.clone()
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
        self.validate_append(stream, batch)?;
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

    /// Applies the command at `position` (positions strictly increase) and returns what it
    /// added. The outcome — success or error, the stream positions given — is the same on
    /// every replica that applies the same commands in the same order. Positions already
    /// reflected in the manifest the replica was opened from are skipped.
    pub fn apply_replicated(&self, position: u64, command: Command<&[u8]>) -> Result<Applied> {
        let shared = self.shared();
        let prepared = {
            let state = shared.read();
            if shared.reflected.covers(&state, position, &command) {
                return Ok(Applied::NOTHING);
            }
            // Applying is serialised by the cluster: the catalog cannot change between
            // this check and the apply below.
            state.prepare(command, shared.options.segment.block_align_ns)
        };
        let prepared = match prepared {
            Ok(Some(prepared)) => prepared,
            Ok(None) => {
                self.skip_position(position);
                return Ok(Applied::NOTHING);
            }
            Err(e) => {
                self.skip_position(position);
                return Err(e);
            }
        };
        let events = match &prepared {
            Command::Append { batch, .. } => {
                self.wait_for_room_without_failing();
                batch.batch.len()
            }
            _ => 0,
        };
        let frees_files = frees_files_at_checkpoint(&prepared);
        let positions = shared.write().apply(position, prepared);
        if frees_files {
            shared.flush.request();
        } else {
            shared.request_flush_if_full();
        }
        Ok(Applied { events, positions })
    }

    /// Records that `position` held nothing for the database (a Raft membership change, an
    /// empty entry, a command that failed), so that checkpoints move past it.
    pub fn skip_position(&self, position: u64) {
        self.shared().write().skip(position);
    }

    /// Flushes, then hard-links the durable manifest and the segments it names into `dest`
    /// (a new directory, on the same file system): a replica opened there holds everything
    /// before the returned `log_start`. Segment files are immutable, so the links are a
    /// consistent copy for as long as `dest` lives, whatever the database does next.
    pub fn export_checkpoint(&self, dest: &Path) -> Result<ExportedCheckpoint> {
        self.flush()?;
        let shared = self.shared();
        let _checkpointing = shared.checkpointing.lock().ignore_poison();
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
        // A tiered segment's stub goes with it; its object stays where it is, and the
        // replica opened from `dest` copies it into its own prefix (`TIER_SOURCE`).
        let stubs = manifest.tiered.keys().map(|&id| stub_path(&shared.dir, id));
        for from in manifest.segment_files(&shared.dir).into_iter().chain(stubs) {
            let to = segments_dir.join(from.file_name().unwrap_or_default());
            fs::hard_link(&from, &to).map_err(|e| StorageError::io("link", &to, e))?;
            exported.bytes += fs::metadata(&to)
                .map_err(|e| StorageError::io("stat", &to, e))?
                .len();
        }
        sync_dir(&segments_dir)?;
        if !manifest.tiered.is_empty() {
            self.write_tier_source(dest)?;
        }
        manifest.store(dest)?;
        Ok(exported)
    }

    /// Records in `dir` (a copy of this replica's checkpoint) where the objects of its
    /// tiered segments are: this replica's prefix.
    pub fn write_tier_source(&self, dir: &Path) -> Result<()> {
        match &self.shared().tier {
            Some(tier) => tier_mover::write_source(dir, tier),
            None => Ok(()),
        }
    }

    /// A replica cannot refuse a committed entry, so it waits for the flush as long as it
    /// takes; the leader refuses new appends long before ([`Replica::check_append`]).
    fn wait_for_room_without_failing(&self) {
        let shared = self.shared();
        let limit = shared.options.max_unflushed_bytes;
        let room = || shared.read().unflushed_bytes() < limit;
        if room() {
            return;
        }
        let _waiting = shared.waiting_for_flush();
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

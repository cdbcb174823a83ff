//! The engine's shared handle ([`Shared`]): everything the threads of one open database
//! share — its directory and options, the state under its lock, the log it is fed from,
//! the locks that order checkpoints and catalog changes, the flush signal, the tier, and the
//! blocks reads by position keep decoded.
//! Readers (`engine`), the write paths (`db`, `replica`), the flusher (`flush`, `sink`) and
//! the tiering thread (`tier_mover`) all hold it.
//!
//! Must never know about: how it was opened or which threads run (`db` and `replica` start
//! them), what a checkpoint does, how commands reach the log.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tidemark_core::sync::IgnorePoison;

use crate::block_cache::BlockCache;
use crate::flush_signal::FlushSignal;
use crate::options::Options;
use crate::segment::Segment;
use crate::state::{Reflected, State};
use crate::tier::Tier;
use crate::wal::CommandLog;

pub(crate) struct Shared {
    pub dir: PathBuf,
    pub options: Options,
    pub state: RwLock<State>,
    /// The log the state is fed from: the database's own write-ahead log, or a replica's
    /// cluster's Raft log (what a checkpoint releases, and what the database reports of its
    /// log's health and counters).
    pub log: Arc<dyn CommandLog>,
    /// What the manifest the database was opened from reflects: replaying (embedded) or
    /// re-applying (replica) the log skips it.
    pub(crate) reflected: Reflected,
    /// Held by a checkpoint while it changes the manifest and segment files, and by an
    /// export of them, so that an export sees one consistent checkpoint.
    pub(crate) checkpointing: Mutex<()>,
    /// Held shared by an append from the check of its stream until it is queued in the log,
    /// and exclusively by a catalog change from its check until it is applied: so the
    /// stream an append names in the log is the one it was checked against, and a replay
    /// that resolves the name finds the same stream.
    pub(crate) catalog: RwLock<()>,
    pub flush: FlushSignal,
    /// `State::unflushed`, read without the state lock by appenders.
    pub(crate) unflushed: Arc<AtomicUsize>,
    /// The bucket old segments move to, when the database tiers ([`crate::tier`]).
    pub(crate) tier: Option<Arc<Tier>>,
    /// Blocks decoded for reads by position, which consumers repeat block after block.
    pub(crate) position_blocks: BlockCache<Segment>,
    _lock: File,
}

impl Shared {
    /// The handle of a recovered database in `dir` (whose `lock` it keeps), fed by `log`.
    pub(crate) fn new(
        dir: PathBuf,
        options: Options,
        state: State,
        log: Arc<dyn CommandLog>,
        reflected: Reflected,
        lock: File,
        tier: Option<Arc<Tier>>,
    ) -> Shared {
        let unflushed = state.unflushed.clone();
        Shared {
            dir,
            options,
            state: RwLock::new(state),
            log,
            reflected,
            checkpointing: Mutex::new(()),
            catalog: RwLock::new(()),
            flush: FlushSignal::default(),
            unflushed,
            tier,
            position_blocks: BlockCache::default(),
            _lock: lock,
        }
    }

    pub fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().ignore_poison()
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().ignore_poison()
    }

    /// Bytes of memtables waiting for a flush, read without the state lock.
    pub(crate) fn unflushed_bytes(&self) -> usize {
        self.unflushed.load(Ordering::Acquire)
    }

    /// Whether memory holds less than `max_unflushed_bytes` waiting for a flush.
    pub(crate) fn has_room(&self) -> bool {
        self.unflushed_bytes() < self.options.max_unflushed_bytes
    }

    pub(crate) fn request_flush_if_full(&self) {
        if self.unflushed_bytes() >= self.options.memtable_bytes {
            self.flush.request();
        }
    }
}

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
use tidemark_storage::pace::WritePace;

use crate::block_cache::BlockCache;
use crate::error::Result;
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
    /// The rate the flusher's segment writes go at (`flush`): slow enough not to stand in
    /// front of the log's fsyncs, unpaced whenever someone waits for the flusher.
    pub(crate) write_pace: Arc<WritePace>,
    /// Callers waiting for the flusher now ([`Shared::waiting_for_flush`]).
    flush_waiters: AtomicUsize,
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
            write_pace: Arc::default(),
            flush_waiters: AtomicUsize::new(0),
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
        let unflushed = self.unflushed_bytes();
        if unflushed >= self.options.memtable_bytes {
            self.flush.request();
        }
        if unflushed >= self.options.max_unflushed_bytes / 2 {
            // Appenders will soon wait for room: the flush must go as fast as it can.
            self.write_pace.unpace();
        }
    }

    /// Asks for a checkpoint that starts after this call and waits for its outcome; its
    /// writes go unpaced, since this caller waits for them.
    pub(crate) fn checkpoint_and_wait(&self) -> Result<()> {
        let _waiting = self.waiting_for_flush();
        self.flush.request_and_wait()
    }

    /// Marks the caller as waiting for the flusher until the guard is dropped: what the
    /// flusher writes meanwhile goes unpaced.
    pub(crate) fn waiting_for_flush(&self) -> FlushWaiter<'_> {
        // Counted before unpacing, and the flusher sets its pace before it looks at the
        // count: whichever comes first, a waiter is never left behind a paced write. Both
        // sides sequentially consistent (`WritePace::set_rate` says why).
        self.flush_waiters.fetch_add(1, Ordering::SeqCst);
        self.write_pace.unpace();
        FlushWaiter(self)
    }

    /// Whether anyone waits for the flusher now ([`Shared::waiting_for_flush`]).
    pub(crate) fn someone_waits_for_flush(&self) -> bool {
        self.flush_waiters.load(Ordering::SeqCst) > 0
    }

    /// Stops the flusher after its checkpoint in progress, which goes unpaced.
    pub(crate) fn stop_flushing(&self) {
        self.flush.shut_down();
        self.write_pace.unpace();
    }
}

/// A caller waiting for the flusher ([`Shared::waiting_for_flush`]).
pub(crate) struct FlushWaiter<'a>(&'a Shared);

impl Drop for FlushWaiter<'_> {
    fn drop(&mut self) {
        self.0.flush_waiters.fetch_sub(1, Ordering::AcqRel);
    }
}

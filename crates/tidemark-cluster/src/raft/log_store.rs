//! openraft's log storage on Tidemark's log files.
//!
//! Entries are frames of Tidemark's log format (`tidemark_storage::log`: length, CRC32C,
//! position, payload) in Tidemark's log files (`tidemark_storage::log_files`, which mark the
//! first frame of each write), so the Raft log gets the same recovery as the embedded log
//! (a torn last write is cut, damage followed by a later write refuses the start:
//! `tidemark_storage::replay`), and an event is written once per node: this log is the only
//! place a replicated batch is written before the flush compresses it into a segment.
//!
//! `append` only queues, on the same group-commit queue the embedded log is written through
//! (`tidemark_storage::group_commit`): one writer thread writes everything queued with one
//! `writev` and one `fdatasync` (so a leader writing while followers catch up costs one
//! fsync per burst) and then reports the entries flushed. Truncations and purges go through
//! the same queue, so they happen in the order openraft asked for them. An in-memory index
//! maps each Raft index to its frame; the newest entries also stay in memory (up to
//! [`CACHE_BYTES`]) because replication reads them right after they are appended.
//!
//! Invariants, asserted where they are written and read: the index holds consecutive Raft
//! indexes, its end is the queue's end, a slot read is the entry asked for; votes never go
//! back; purges only move forward, and a truncation never reaches a purged entry.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::fs;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use serde::{de::DeserializeOwned, Serialize};
use tidemark_core::sync::IgnorePoison;
use tidemark_engine::CommandLog;
use tidemark_storage::group_commit::{Ack, Framed, GroupCommit, OnUndone, Refused};
use tidemark_storage::log;
use tidemark_storage::log_files::LogFiles;
use tidemark_storage::log_stats::LogStats;
use tidemark_storage::pace::WritePace;
use tidemark_storage::replay::{replay, ReplayError};

use super::{io_error, Entry, EntryPayload, LogId, Payload, TypeConfig, Vote};

/// Entries kept in memory after they are written, for replication to read.
pub const CACHE_BYTES: usize = 256 << 20;
const LOG_FILE_BYTES: u64 = 256 << 20;

#[derive(Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
}

/// The log's queue: entry frames, nothing to apply (the index learns what is written from
/// the group's end), openraft's callbacks to tell.
type RaftLog = GroupCommit<Frame, (), Done>;

struct Shared {
    dir: PathBuf,
    index: Arc<Mutex<Index>>,
    /// Group commits, entries, bytes and fsync latencies, as the embedded log counts them;
    /// and why the log stopped acknowledging, once a write failed (until the node restarts).
    log: Arc<RaftLog>,
    committed: Mutex<CommittedFile>,
    /// The vote last saved: the next one may not go back from it.
    vote: Mutex<Option<Vote>>,
    /// The log's writer and deleter threads (`GroupCommit::run_writer`, `run_deleter`).
    threads: Vec<JoinHandle<()>>,
    /// The deleter's pace, dropped when the log closes.
    delete_pace: Arc<WritePace>,
}

impl Drop for Shared {
    /// Stops the log writer once it has written what is queued, and the deleter once it has
    /// deleted what the writer released, and waits for both, so that the log's files are
    /// closed when the last handle goes.
    fn drop(&mut self) {
        self.log.shut_down();
        // What is left to delete goes at once: a close waits for it.
        self.delete_pace.unpace();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Bytes per second at which released log files' blocks are freed: a 256 MiB file in two
/// seconds, in 1 MiB steps that each ride a journal commit of their own instead of 256 MiB
/// of freed (and discarded) blocks in one that the next fsync waits for
/// (`tidemark_storage::fsutil::remove_file_paced`). Nothing waits for the deleter but a
/// close, which unpaces it.
const DELETE_PACE: u64 = 128 << 20;

/// Entries a purge leaves readable behind the purge point. openraft 0.10.0-alpha.37's
/// replication can read entries just purged: a stream that chose its range before the purge
/// reads after it, gets the entries that remain (which the log-reader contract allows) and
/// builds an AppendEntries whose entries do not follow its `prev_log_id` — a debug assertion
/// kills the stream (its follower then never catches up), and in a release build the request
/// would be malformed (openraft issue #1795 is a relative). Four payloads of
/// `max_payload_entries` (256) cover a stream's read in flight; a restart drops them.
const READABLE_AFTER_PURGE: u64 = 1024;

struct Index {
    /// The Raft index of `slots[0]`; each slot holds the index after the one before it.
    first: u64,
    slots: VecDeque<Slot>,
    last_purged: Option<LogId>,
    /// Where the next frame goes: the queue's end.
    end_lsn: u64,
    /// Everything before this position is on disk.
    written_lsn: u64,
    cached_bytes: usize,
}

struct Slot {
    log_id: LogId,
    lsn: u64,
    len: usize,
    entry: Option<Entry>,
}

/// One entry's log frame, in two parts so that a batch's bytes go to the file from the
/// entry's own buffer instead of being copied into the frame first (that copy, into fresh
/// pages the kernel had to zero, took several percent of each node's CPU).
struct Frame {
    /// The frame header and the entry's encoding up to its payload's bytes.
    head: Vec<u8>,
    /// The payload's bytes; empty when `head` holds the whole entry.
    tail: bytes::Bytes,
}

impl Frame {
    /// Frames `entry` as `postcard` encodes it (so recovery decodes it whole). postcard puts
    /// an application payload's bytes last, after their length: the head is the entry
    /// encoded with an empty payload, its length byte (0) swapped for the real length.
    fn of(entry: &Entry) -> io::Result<Frame> {
        let mut head = Vec::with_capacity(64);
        log::begin_frame(&mut head);
        let tail = match &entry.payload {
            EntryPayload::Normal(Payload(bytes)) if !bytes.is_empty() => {
                let hollow = Entry {
                    log_id: entry.log_id,
                    payload: EntryPayload::Normal(Payload(bytes::Bytes::new())),
                };
                head = postcard::to_extend(&hollow, head).map_err(io_error)?;
                if head.pop() != Some(0) {
                    return Err(io_error("postcard did not end an entry with its payload"));
                }
                head = postcard::to_extend(&bytes.len(), head).map_err(io_error)?;
                bytes.clone()
            }
            _ => {
                head = postcard::to_extend(entry, head).map_err(io_error)?;
                bytes::Bytes::new()
            }
        };
        log::end_frame_with_tail(&mut head, &tail).map_err(io_error)?;
        Ok(Frame { head, tail })
    }

    fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }
}

impl Framed for Frame {
    fn head(&self) -> &[u8] {
        &self.head
    }

    fn head_mut(&mut self) -> &mut [u8] {
        &mut self.head
    }

    fn tail(&self) -> &[u8] {
        &self.tail
    }
}

/// Whom the log writer tells: openraft, once appended entries are durable, or the
/// truncation waiting for its cut.
enum Done {
    Flushed(IOFlushed<TypeConfig>),
    Truncated(tokio::sync::oneshot::Sender<io::Result<()>>),
}

impl Ack for Done {
    fn done(self, outcome: Result<u64, Refused>) {
        let outcome = outcome.map(|_| ()).map_err(io_error);
        match self {
            Done::Flushed(callback) => callback.io_completed(outcome),
            Done::Truncated(waiting) => {
                let _ = waiting.send(outcome);
            }
        }
    }
}

/// Why the Raft log could not be opened.
#[derive(Debug, thiserror::Error)]
enum OpenError {
    #[error(transparent)]
    Log(#[from] ReplayError),
    /// A frame that checks out but is not the log's next entry. (Worded as in the builds
    /// that reported it as the engine's invalid request.)
    #[error("invalid request: {0}")]
    Entry(String),
}

impl OpenError {
    /// The error openraft gets; a corrupt log comes with what to do about it: this node's
    /// copy of the log is gone past the damage, but its peers hold the same entries.
    fn into_io(self) -> io::Error {
        match self {
            OpenError::Log(ReplayError::Corrupt(mut corrupt)) => {
                corrupt.advice = "This is a cluster node's Raft log: rebuild the node from its \
                                  peers (`tidemark cluster remove-node`, move its data directory \
                                  aside, start it with an empty one, `tidemark cluster add-node`: \
                                  docs/cluster.md, \"Replacing a node's data\")"
                    .into();
                io_error(corrupt)
            }
            e => io_error(e),
        }
    }
}

impl LogStore {
    /// Opens (creating if needed) the Raft log in `dir`, replaying it to rebuild the index.
    pub fn open(dir: &Path) -> io::Result<LogStore> {
        fs::create_dir_all(dir)?;
        // `purge` saves an `Option<LogId>`; read back as a bare `LogId` its bytes decoded as
        // another log id (term 1, the leader's node id as index), and a node whose log has a
        // gap (a snapshot installed past its end) could not restart.
        let last_purged = load_small::<Option<LogId>>(&dir.join("purged"))?.flatten();
        let (index, files) = Index::replay(dir, last_purged)?;
        let committed = CommittedFile::open(&dir.join("committed"))?;
        let index = Arc::new(Mutex::new(index));
        let log: Arc<RaftLog> = Arc::new(GroupCommit::new(files, OnUndone::Fail));
        let writer = {
            let (log, index) = (log.clone(), index.clone());
            std::thread::Builder::new()
                .name("tidemark-raft-log".into())
                .spawn(move || {
                    log.run_writer(|_, end| index.lock().ignore_poison().written(end));
                })?
        };
        let delete_pace = Arc::new(WritePace::default());
        delete_pace.set_rate(DELETE_PACE);
        let deleter = {
            let (deleting, pace) = (log.clone(), delete_pace.clone());
            let spawned = std::thread::Builder::new()
                .name("tidemark-raft-log-deleter".into())
                .spawn(move || deleting.run_deleter(&pace));
            match spawned {
                Ok(deleter) => deleter,
                Err(e) => {
                    log.shut_down();
                    let _ = writer.join();
                    return Err(e);
                }
            }
        };
        Ok(LogStore {
            shared: Arc::new(Shared {
                dir: dir.to_path_buf(),
                index,
                log,
                committed: Mutex::new(committed),
                vote: Mutex::new(None),
                threads: vec![writer, deleter],
                delete_pace,
            }),
        })
    }

    /// Group commits, entries, bytes and fsync latencies since the log was opened.
    pub fn stats(&self) -> LogStats {
        self.shared.log.stats()
    }
}

/// The Raft log as the replica it feeds sees it: what `/metrics` and `/ready` report of it.
/// Checkpoints release nothing here: openraft purges the log after a snapshot.
impl CommandLog for LogStore {
    fn checkpointed(
        &self,
        _position: u64,
        _pace: &WritePace,
    ) -> Result<(), tidemark_storage::StorageError> {
        Ok(())
    }

    fn stats(&self) -> LogStats {
        LogStore::stats(self)
    }

    fn failure(&self) -> Option<String> {
        self.shared.log.failure()
    }
}

impl Shared {
    fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().ignore_poison()
    }

    fn committed(&self) -> MutexGuard<'_, CommittedFile> {
        self.committed.lock().ignore_poison()
    }
}

/// The saved commit index, in the format of [`store_small`] but rewritten in place: it
/// changes with every commit, and a new file and a rename each time took several percent
/// of a loaded node's CPU. Not fsync'd (see `save_committed`), so a torn rewrite is
/// possible; it fails its checksum and counts as lost.
struct CommittedFile {
    file: fs::File,
    path: PathBuf,
    len: u64,
}

impl CommittedFile {
    fn open(path: &Path) -> io::Result<CommittedFile> {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let len = file.metadata()?.len();
        Ok(CommittedFile {
            file,
            path: path.to_path_buf(),
            len,
        })
    }

    fn save(&mut self, committed: &Option<LogId>) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let bytes = small_file_bytes(committed)?;
        self.file.write_all_at(&bytes, 0)?;
        if self.len != bytes.len() as u64 {
            self.file.set_len(bytes.len() as u64)?;
            self.len = bytes.len() as u64;
        }
        Ok(())
    }

    /// The saved index; `None` before the first save, and (with a warning) if damaged.
    fn load(&self) -> Option<LogId> {
        if self.len == 0 {
            return None;
        }
        match load_small::<Option<LogId>>(&self.path) {
            Ok(committed) => committed.flatten(),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring the saved commit index");
                None
            }
        }
    }
}

impl Index {
    /// Replays the Raft log of `dir` (in `log/`), rebuilding the index of its entries after
    /// `last_purged`, and opens the log for writing after them.
    fn replay(dir: &Path, last_purged: Option<LogId>) -> io::Result<(Index, LogFiles)> {
        let log_dir = dir.join("log");
        fs::create_dir_all(&log_dir)?;
        let oldest = fs::read_dir(&log_dir)?
            .filter_map(|e| e.ok().and_then(|e| log::parse_file_name(&e.path())))
            .min()
            .unwrap_or(0);
        let first = last_purged.as_ref().map_or(0, |p| p.index() + 1);
        let mut slots = VecDeque::new();
        let replayed = replay(&log_dir, oldest, false, LOG_FILE_BYTES, |lsn, payload| {
            let entry: Entry = postcard::from_bytes(payload)
                .map_err(|e| OpenError::Entry(format!("Raft log entry at LSN {lsn}: {e}")))?;
            let index = entry.index();
            if index < first {
                return Ok(()); // purged, in a file not yet released
            }
            let expected = first + slots.len() as u64;
            if index != expected {
                return Err(OpenError::Entry(format!(
                    "Raft log entry at LSN {lsn} has index {index}, expected {expected}"
                )));
            }
            slots.push_back(Slot {
                log_id: entry.log_id(),
                lsn,
                len: log::FRAME_HEADER + payload.len(),
                entry: None,
            });
            Ok(())
        })
        .map_err(OpenError::into_io)?;
        if let Some(what) = &replayed.truncated {
            tracing::warn!(dir = %dir.display(), "Raft log recovery {what}");
        }
        let end = replayed.files.end_lsn();
        let index = Index {
            first,
            slots,
            last_purged,
            end_lsn: end,
            written_lsn: end,
            cached_bytes: 0,
        };
        Ok((index, replayed.files))
    }

    fn last_log_id(&self) -> Option<LogId> {
        self.slots.back().map(|s| s.log_id).or(self.last_purged)
    }

    /// The Raft index the next entry must have.
    fn next_index(&self) -> u64 {
        self.first + self.slots.len() as u64
    }

    /// The slot of Raft index `index`, which the index holds.
    fn slot(&self, index: u64) -> &Slot {
        let slot = &self.slots[(index - self.first) as usize];
        assert_eq!(slot.log_id.index(), index, "slots hold consecutive indexes");
        slot
    }

    /// Notes that the log is written up to `end`, and drops cached entries it may now read
    /// back from there.
    fn written(&mut self, end: u64) {
        self.written_lsn = self.written_lsn.max(end);
        self.evict();
    }

    /// Drops cached entries, oldest first, that are on disk, while over the budget.
    fn evict(&mut self) {
        let written = self.written_lsn;
        for slot in self.slots.iter_mut() {
            if self.cached_bytes <= CACHE_BYTES {
                break;
            }
            if slot.lsn + slot.len as u64 > written {
                break;
            }
            if slot.entry.take().is_some() {
                self.cached_bytes -= slot.len;
            }
        }
    }

    /// Forgets the slots at `range` (positions in `slots`), and their cached entries.
    fn drop_slots(&mut self, range: impl RangeBounds<usize>) {
        for slot in self.slots.drain(range).collect::<Vec<_>>() {
            if slot.entry.is_some() {
                self.cached_bytes -= slot.len;
            }
        }
    }
}

fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let (start, end) = bounds(&range);
        let mut out: Vec<Result<Entry, (LogId, u64, usize)>> = Vec::new();
        {
            let idx = self.shared.index();
            let from = start.max(idx.first);
            let to = end.min(idx.next_index());
            for index in from..to {
                let slot = idx.slot(index);
                out.push(match &slot.entry {
                    Some(entry) => Ok(entry.clone()),
                    None => Err((slot.log_id, slot.lsn, slot.len)),
                });
            }
        }
        let mut entries = Vec::with_capacity(out.len());
        for item in out {
            entries.push(match item {
                Ok(entry) => entry,
                Err((log_id, lsn, len)) => self.read_entry(log_id, lsn, len)?,
            });
        }
        Ok(entries)
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        let vote: Option<Vote> = load_small(&self.shared.dir.join("vote"))?;
        // Not asserted in release builds: a save whose rename succeeded and whose directory
        // fsync failed leaves the newer vote on disk and the older one here.
        if let Some(saved) = &*self.shared.vote.lock().ignore_poison() {
            debug_assert_eq!(
                vote.as_ref(),
                Some(saved),
                "the vote read back is the one saved"
            );
        }
        Ok(vote)
    }
}

impl LogStore {
    /// Reads entry `log_id` back from its frame of `len` bytes at `lsn`.
    fn read_entry(&self, log_id: LogId, lsn: u64, len: usize) -> io::Result<Entry> {
        let frame = self.shared.log.read(lsn, len).map_err(io_error)?;
        let (frames, _) = log::read_frames(&frame, lsn);
        let (_, payload) = frames
            .first()
            .ok_or_else(|| io_error(format!("the Raft log frame at LSN {lsn} is damaged")))?;
        let entry: Entry = postcard::from_bytes(payload).map_err(io_error)?;
        // Not an assertion: a truncation between the index's answer and this read can put
        // another entry where this one was.
        if entry.log_id() != log_id {
            return Err(io_error(format!(
                "the Raft log frame at LSN {lsn} holds entry {}, not {log_id}",
                entry.log_id()
            )));
        }
        Ok(entry)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let idx = self.shared.index();
        Ok(LogState {
            last_purged_log_id: idx.last_purged,
            last_log_id: idx.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        let mut saved = self.shared.vote.lock().ignore_poison();
        // Raft never takes a vote back (it could vote twice in a term): refused, which
        // stops this node, rather than stored.
        if let Some(before) = (*saved).filter(|before| *before > *vote) {
            return Err(io_error(format!(
                "a vote that goes back: {before:?}, then {vote:?}"
            )));
        }
        store_small(&self.shared.dir.join("vote"), vote)?;
        *saved = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        // Not fsync'd: a committed index that is lost or older only means re-applying less
        // on startup; the entries themselves are durable.
        self.shared.committed().save(&committed)
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        // Never past this log's own end: a leader commits once a quorum of followers holds an
        // entry, possibly before its own write of it is durable, so after a kill -9 its log
        // can end before the committed index it saved. openraft re-applies the log up to the
        // committed index at startup and fails if entries are missing; the entries this log
        // does hold up to there were matched with the leader's, so they are committed too.
        let committed = self.shared.committed().load();
        let last = self.shared.index().last_log_id();
        let committed = match (committed, last) {
            (Some(c), Some(l)) if c.index() > l.index() => Some(l),
            (Some(_), None) => None,
            (committed, _) => committed,
        };
        assert!(
            committed.is_none_or(|c| last.is_some_and(|l| c.index() <= l.index())),
            "the committed index read back lies in the log"
        );
        Ok(committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut idx = self.shared.index();
        let (mut frames, mut slots) = (Vec::new(), Vec::new());
        let (mut lsn, mut expected) = (idx.end_lsn, idx.next_index());
        for entry in entries {
            if entry.index() != expected {
                return Err(io_error(format!(
                    "append of index {} to a log that ends before {expected}",
                    entry.index()
                )));
            }
            let frame = Frame::of(&entry)?;
            slots.push(Slot {
                log_id: entry.log_id(),
                lsn,
                len: frame.len(),
                entry: Some(entry),
            });
            lsn += frame.len() as u64;
            expected += 1;
            frames.push((frame, ()));
        }
        assert_eq!(
            idx.end_lsn,
            self.shared.log.end_lsn(),
            "the index ends where the log's queue does"
        );
        match self.shared.log.submit(frames, Done::Flushed(callback)) {
            Ok(first) => assert_eq!(first, idx.end_lsn, "entries go where the index ends"),
            // A failed log: openraft learns it from the callback, as from a failed write.
            Err(_) => return Ok(()),
        }
        idx.end_lsn = lsn;
        idx.cached_bytes += slots.iter().map(|s| s.len).sum::<usize>();
        idx.slots.extend(slots);
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let keep_before = last_log_id.map_or(0, |l| l.index() + 1);
        let (done, wait) = tokio::sync::oneshot::channel();
        {
            let mut idx = self.shared.index();
            assert!(
                keep_before >= idx.last_purged.map_or(0, |p| p.index() + 1),
                "a truncation keeps every purged entry"
            );
            let keep = keep_before.saturating_sub(idx.first) as usize;
            if keep >= idx.slots.len() {
                return Ok(());
            }
            let lsn = idx.slots[keep].lsn;
            // A failed log refuses the cut (and says why through `done`): the index then
            // stays as the log is, so that both still end at the same LSN.
            if self.shared.log.truncate(lsn, Done::Truncated(done)).is_ok() {
                assert_eq!(
                    self.shared.log.end_lsn(),
                    lsn,
                    "the log's queue ends at the cut"
                );
                idx.drop_slots(keep..);
                idx.end_lsn = lsn;
                idx.written_lsn = idx.written_lsn.min(lsn);
            }
        }
        wait.await
            .map_err(|_| io_error("the Raft log's writer has stopped"))?
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        let purged = self.shared.index().last_purged;
        assert!(
            purged.is_none_or(|p| p.index() <= log_id.index()),
            "purges only move forward: {purged:?}, then {log_id}"
        );
        store_small(&self.shared.dir.join("purged"), &Some(log_id))?;
        let before = {
            let mut idx = self.shared.index();
            let log_end = idx.next_index();
            // The last READABLE_AFTER_PURGE entries purged stay readable (until a restart),
            // unless the whole log goes (a snapshot installed past its end).
            let drop_before = if log_id.index() + 1 >= log_end {
                log_end
            } else {
                (log_id.index() + 1).saturating_sub(READABLE_AFTER_PURGE)
            };
            let n = (drop_before.saturating_sub(idx.first) as usize).min(idx.slots.len());
            idx.drop_slots(..n);
            idx.first = if log_id.index() + 1 >= log_end {
                log_id.index() + 1
            } else {
                idx.first + n as u64
            };
            idx.last_purged = Some(log_id);
            idx.slots.front().map_or(idx.end_lsn, |s| s.lsn)
        };
        self.shared.log.release(before);
        Ok(())
    }
}

/// Writes a small value (vote, purged, snapshot state) whole and durably, with the storage
/// layer's one atomic replacement (temporary file, fsync, rename, directory fsync). A
/// CRC32C in front tells a damaged file from a good one.
pub(crate) fn store_small<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let bytes = small_file_bytes(value)?;
    tidemark_storage::fsutil::write_atomic(path, &bytes).map_err(io_error)
}

/// The contents of a small file: a CRC32C of the body, then the body.
fn small_file_bytes<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    let body = postcard::to_stdvec(value).map_err(io_error)?;
    let mut bytes = crc32c::crc32c(&body).to_le_bytes().to_vec();
    bytes.extend_from_slice(&body);
    Ok(bytes)
}

/// Reads a value written by [`store_small`]; `None` if there is none.
pub(crate) fn load_small<T: DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if bytes.len() < 4 || crc32c::crc32c(&bytes[4..]).to_le_bytes() != bytes[..4] {
        return Err(io_error(format!(
            "{} is damaged (checksum mismatch)",
            path.display()
        )));
    }
    // The whole body must be the value: a value of another type that happens to decode from
    // its first bytes is an error, not a wrong value.
    match postcard::take_from_bytes(&bytes[4..]) {
        Ok((value, [])) => Ok(Some(value)),
        Ok((_, rest)) => Err(io_error(format!(
            "{} holds {} bytes more than its value",
            path.display(),
            rest.len()
        ))),
        Err(e) => Err(io_error(e)),
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorage;
    use openraft::type_config::TypeConfigExt;

    use crate::raft::testing::log_id;

    use super::*;

    /// The frame as it was built before frames had two parts: the whole entry encoded.
    fn whole_frame(entry: &Entry) -> Vec<u8> {
        let mut frame = Vec::new();
        log::begin_frame(&mut frame);
        postcard::to_io(entry, &mut frame).unwrap();
        log::end_frame(&mut frame).unwrap();
        frame
    }

    #[test]
    fn a_two_part_frame_is_the_whole_entry_encoded() {
        let mut entries = vec![
            Entry {
                log_id: log_id(1, 0),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: log_id(2, 5),
                payload: EntryPayload::Normal(Payload(bytes::Bytes::new())),
            },
        ];
        // Payload lengths on both sides of each varint length boundary.
        for len in [1, 127, 128, 16_383, 16_384, 1 << 20] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            entries.push(Entry {
                log_id: log_id(3, 1000 + len as u64),
                payload: EntryPayload::Normal(Payload(bytes.into())),
            });
        }
        for entry in &entries {
            let frame = Frame::of(entry).unwrap();
            let joined = [&frame.head[..], &frame.tail[..]].concat();
            assert_eq!(joined, whole_frame(entry), "{entry:?}");
            assert_eq!(frame.len(), joined.len());
            let (read, end) = log::read_frames(&joined, 0);
            assert_eq!(end, log::FrameEnd::Clean);
            let decoded: Entry = postcard::from_bytes(read[0].1).unwrap();
            assert_eq!(&decoded, entry);
        }
    }

    #[tokio::test]
    async fn the_commit_index_is_rewritten_in_place_and_a_damaged_one_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(store.shared.committed().load(), None);
        // A longer value, then a shorter one: the file must not keep the longer one's tail.
        store
            .save_committed(Some(log_id(u64::MAX, u64::MAX)))
            .await
            .unwrap();
        store.save_committed(Some(log_id(1, 2))).await.unwrap();
        assert_eq!(store.shared.committed().load(), Some(log_id(1, 2)));
        drop(store);

        let store = LogStore::open(dir.path()).unwrap();
        assert_eq!(store.shared.committed().load(), Some(log_id(1, 2)));
        drop(store);

        let path = dir.path().join("committed");
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let store = LogStore::open(dir.path()).unwrap();
        assert_eq!(store.shared.committed().load(), None);
    }

    /// Appends blank entries `indexes` of `term`, durably.
    async fn append_blank(store: &mut LogStore, term: u64, indexes: std::ops::RangeInclusive<u64>) {
        let entries: Vec<Entry> = indexes
            .map(|i| Entry {
                log_id: log_id(term, i),
                payload: EntryPayload::Blank,
            })
            .collect();
        let (written, wait) = TypeConfig::oneshot();
        store
            .append(entries, IOFlushed::signal(written))
            .await
            .unwrap();
        wait.await.unwrap().unwrap();
    }

    async fn state_and_indexes(dir: &Path) -> (LogState<TypeConfig>, Vec<u64>) {
        let mut store = LogStore::open(dir).unwrap();
        let state = store.get_log_state().await.unwrap();
        let entries = store.try_get_log_entries(0..u64::MAX).await.unwrap();
        (state, entries.iter().map(|e| e.index()).collect())
    }

    #[tokio::test]
    async fn a_purged_log_reopens_where_it_was_purged() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        append_blank(&mut store, 1, 0..=9).await;
        store.purge(log_id(1, 4)).await.unwrap();
        append_blank(&mut store, 1, 10..=10).await; // after the purge, in order
        drop(store);

        let (state, indexes) = state_and_indexes(dir.path()).await;
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 4)));
        assert_eq!(state.last_log_id, Some(log_id(1, 10)));
        assert_eq!(indexes, (5..=10).collect::<Vec<_>>());
    }

    /// A follower far behind installs a snapshot past the end of its log and goes on from
    /// there: its file then holds entries 0..=9 and, right after them, 21 on. It restarts.
    #[tokio::test]
    async fn a_log_with_a_snapshot_installed_past_its_end_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        append_blank(&mut store, 1, 0..=9).await;
        store.purge(log_id(2, 20)).await.unwrap();
        append_blank(&mut store, 2, 21..=25).await;
        drop(store);

        let (state, indexes) = state_and_indexes(dir.path()).await;
        assert_eq!(state.last_purged_log_id, Some(log_id(2, 20)));
        assert_eq!(state.last_log_id, Some(log_id(2, 25)));
        assert_eq!(indexes, (21..=25).collect::<Vec<_>>());
    }

    /// A damaged entry that a later write follows refuses the start, saying how to rebuild
    /// the node from its peers, instead of dropping it and every entry after it. Damage in
    /// the last write is a torn tail: cut, and the log opens.
    #[tokio::test]
    async fn a_damaged_entry_before_the_last_write_refuses_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        for first in [0, 3, 6] {
            append_blank(&mut store, 1, first..=first + 2).await; // one write each
        }
        drop(store);
        let path = dir.path().join("log").join(log::file_name(0));
        let original = fs::read(&path).unwrap();
        let (frames, end) = log::read_frames(&original, 0);
        assert_eq!((frames.len(), end), (9, log::FrameEnd::Clean));
        let damage = |entry: usize| {
            let mut bytes = original.clone();
            let (lsn, payload) = frames[entry];
            bytes[lsn as usize + log::FRAME_HEADER + payload.len() - 1] ^= 1;
            fs::write(&path, &bytes).unwrap();
            lsn
        };

        let lsn = damage(4);
        let error = LogStore::open(dir.path()).err().unwrap().to_string();
        assert!(
            error.contains(&format!("(LSN {lsn}:")) && error.contains("cluster remove-node"),
            "{error}"
        );

        damage(7);
        let (state, indexes) = state_and_indexes(dir.path()).await;
        assert_eq!(state.last_log_id, Some(log_id(1, 6)));
        assert_eq!(indexes, (0..=6).collect::<Vec<_>>());
    }

    #[test]
    fn a_small_file_holding_more_than_its_value_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("purged");
        store_small(&path, &Some(log_id(3, 149))).unwrap();
        assert_eq!(
            load_small::<Option<LogId>>(&path).unwrap(),
            Some(Some(log_id(3, 149)))
        );
        let e = load_small::<LogId>(&path).unwrap_err();
        assert!(e.to_string().contains("bytes more than its value"), "{e}");
    }

    #[tokio::test]
    async fn the_commit_index_read_back_never_passes_the_logs_end() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        // A leader killed after a quorum committed entries its own log had not written.
        store.save_committed(Some(log_id(1, 5))).await.unwrap();
        assert_eq!(store.read_committed().await.unwrap(), None);
        let entries = (0..3).map(|i| Entry {
            log_id: log_id(1, i),
            payload: EntryPayload::Blank,
        });
        store.append(entries, IOFlushed::noop()).await.unwrap();
        assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 2)));
        store.save_committed(Some(log_id(1, 1))).await.unwrap();
        assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 1)));
    }
}

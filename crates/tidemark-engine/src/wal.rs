//! The write-ahead log: one shared log per database, written with group commit.
//!
//! Every change is a record queued here with [`Wal::submit`], which assigns its LSN at once
//! and returns a [`Completion`]. One thread, the log writer ([`Wal::run_writer`]), takes
//! everything queued so far, writes it with one `writev` and one `fdatasync`, applies it in
//! LSN order, and completes every record it covered; records queued meanwhile form the next
//! group. So N concurrent appends to any number of streams cost one fsync, not N — and an
//! appender waits for its fsync without holding a thread: a completion is awaited in an
//! async task, or waited for on a thread ([`Completion::wait`]).
//!
//! A failed *write* (the disk is full, a quota is reached) is undone: the file is cut back
//! to where the group began, the group's records are refused as retryable, and the log
//! takes the next group — so writes resume by themselves once space returns. A failed
//! fsync, or a write that cannot be undone, poisons the log: the kernel may have dropped
//! the dirty pages, so nothing after that point can be acknowledged until the database is
//! reopened and replays what actually reached the disk.

use std::fs::{self, File, OpenOptions};
use std::future::Future;
use std::io::{IoSlice, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use tidemark_core::sync::IgnorePoison;
use tidemark_storage::fsutil::{self, sync_dir};
use tidemark_storage::log::{self, FrameEnd};
use tidemark_storage::StorageError;

use crate::error::{CorruptLog, EngineError, Evidence, Result};
use crate::stats::{LogCounters, LogStats};

/// Queues records for the log writer, which writes them in groups and applies each group
/// in order.
pub struct Wal<T> {
    queue: Mutex<Queue<T>>,
    /// Signalled when records are queued or the log shuts down.
    queued: Condvar,
    files: Mutex<LogFiles>,
    counters: LogCounters,
    marks: Mutex<ReleaseMarks>,
}

/// Log files are deleted only behind both marks: what checkpoints reflect, and where a
/// reader of the log itself still reads (a spool's forwarder; nowhere otherwise).
struct ReleaseMarks {
    checkpointed: u64,
    held_from: u64,
}

struct Queue<T> {
    /// The LSN the next record gets.
    next_lsn: u64,
    /// Where the next group starts: everything before it is written (or failed).
    written_lsn: u64,
    /// Everything before it is written and fsync'd.
    durable_lsn: u64,
    /// Finished frames waiting for the next group write, each stamped with its LSN.
    frames: Vec<Vec<u8>>,
    items: Vec<(u64, T)>,
    waiters: Vec<(u64, oneshot::Sender<Result<u64>>)>,
    failure: Option<String>,
    shut_down: bool,
}

impl<T> Queue<T> {
    /// Gives the log back the LSNs `start..end` of a group whose write was undone: the
    /// records queued after it move down to follow what is really written, so that the
    /// log has no gap (replay accepts a frame only at its place).
    fn take_back(&mut self, start: u64, end: u64) {
        assert_eq!(
            self.written_lsn, start,
            "an undone group began where the log ended"
        );
        assert!(
            end <= self.next_lsn,
            "an undone group lies inside the queued LSNs"
        );
        let shift = end - start;
        for ((lsn, _), frame) in self.items.iter_mut().zip(&mut self.frames) {
            assert!(*lsn >= end, "a record queued after the group sits after it");
            *lsn -= shift;
            log::set_frame_lsn(frame, *lsn);
        }
        for (lsn, _) in &mut self.waiters {
            *lsn -= shift;
        }
        self.next_lsn -= shift;
    }
}

/// Why [`LogFiles::write`] failed, and whether the log can take the next write.
#[derive(Debug, thiserror::Error)]
pub enum LogWriteError {
    /// None of the write is in the log: it failed before its fsync (a full disk, a quota)
    /// and the file was cut back to where the write began. The log ends where it did and
    /// takes the next write.
    #[error("{0} (undone: nothing of this write is in the log)")]
    Undone(StorageError),
    /// The write's fsync failed, or the write could not be undone: the kernel may have
    /// dropped pages of it, so the log must be reopened (and recovered) before it is written
    /// again.
    #[error(transparent)]
    Broken(StorageError),
}

/// The outcome of a queued record: its LSN once it is durable and applied. Await it in an
/// async task, or [`Completion::wait`] on a thread.
#[must_use = "a record is acknowledged only when its completion says so"]
pub struct Completion(oneshot::Receiver<Result<u64>>);

impl Future for Completion {
    type Output = Result<u64>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<u64>> {
        Pin::new(&mut self.0).poll(cx).map(|outcome| {
            // The writer drops a record's sender only when it unwinds from a panic.
            outcome.unwrap_or_else(|_| {
                Err(EngineError::LogFailed(
                    "the log writer stopped before the record was written".into(),
                ))
            })
        })
    }
}

impl Completion {
    /// Blocks the calling thread until the record is durable and applied.
    pub fn wait(self) -> Result<u64> {
        block_on(self)
    }
}

/// Runs `future` to completion on this thread, parked between polls: the waker std's
/// `Wake` documentation describes, so that a thread can wait for what a task would await
/// without an async runtime in the engine.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

impl<T> Wal<T> {
    pub fn new(files: LogFiles) -> Wal<T> {
        let end = files.end_lsn();
        Wal {
            queue: Mutex::new(Queue {
                next_lsn: end,
                written_lsn: end,
                durable_lsn: end,
                frames: Vec::new(),
                items: Vec::new(),
                waiters: Vec::new(),
                failure: None,
                shut_down: false,
            }),
            queued: Condvar::new(),
            files: Mutex::new(files),
            counters: LogCounters::default(),
            marks: Mutex::new(ReleaseMarks {
                checkpointed: 0,
                held_from: u64::MAX,
            }),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue<T>> {
        self.queue.lock().ignore_poison()
    }

    /// The LSN the next record will get: every record before it is durable or queued.
    pub fn end_lsn(&self) -> u64 {
        self.queue().next_lsn
    }

    /// Queues one record, a frame finished with [`log::end_frame`], behind every record
    /// queued before it, and returns its completion. Only the LSN is written under the
    /// queue lock; the frame itself is never copied.
    pub fn submit(&self, mut frame: Vec<u8>, item: T) -> Result<Completion> {
        let mut q = self.queue();
        if let Some(failure) = &q.failure {
            return Err(EngineError::LogFailed(failure.clone()));
        }
        if q.shut_down {
            return Err(EngineError::Closed);
        }
        let lsn = q.next_lsn;
        log::set_frame_lsn(&mut frame, lsn);
        q.next_lsn += frame.len() as u64;
        q.frames.push(frame);
        q.items.push((lsn, item));
        let (done, completion) = oneshot::channel();
        q.waiters.push((lsn, done));
        if q.frames.len() == 1 {
            // The writer waits only on an empty queue.
            self.queued.notify_one();
        }
        Ok(Completion(completion))
    }

    /// [`Wal::submit`], then waits for the record on this thread.
    pub fn commit(&self, frame: Vec<u8>, item: T) -> Result<u64> {
        self.submit(frame, item)?.wait()
    }

    /// The log writer: writes and fsyncs whatever is queued as one group, passes the group
    /// to `apply` in LSN order (with the LSN right after it), completes its records, and
    /// goes on until [`Wal::shut_down`] (after writing what was queued before it). Run it on
    /// a thread of its own; `apply` is never run concurrently with itself.
    pub fn run_writer(&self, apply: impl Fn(Vec<(u64, T)>, u64)) {
        loop {
            let mut q = self.queue();
            while q.frames.is_empty() && !q.shut_down {
                q = self.queued.wait(q).ignore_poison();
            }
            if q.frames.is_empty() {
                return; // shut down, nothing left
            }
            let start = q.written_lsn;
            let end = q.next_lsn;
            let frames = std::mem::take(&mut q.frames);
            let items = std::mem::take(&mut q.items);
            let waiters = std::mem::take(&mut q.waiters);
            // The group is the log from `start` to `end` with no gap or overlap: each record
            // sits where its LSN says, the next right after it. (Replay rejects a frame
            // whose LSN is not its place; this keeps such a frame from being written.)
            let mut at = start;
            for ((lsn, _), frame) in items.iter().zip(&frames) {
                assert_eq!(*lsn, at, "a record's LSN is not its place in the log");
                at += frame.len() as u64;
            }
            assert_eq!(at, end, "the group does not end where the log does");
            assert_eq!(items.len(), waiters.len());
            if let Some(failure) = q.failure.clone() {
                // Queued before the failure was seen: refused, never written after it.
                q.written_lsn = end;
                drop(q);
                fail(waiters, &failure);
                continue;
            }
            drop(q);
            let mut writing = Writing {
                wal: self,
                armed: true,
            };
            let outcome = self.write(start, &frames);
            if let Ok(fsync) = &outcome {
                self.counters.record_group(items.len(), end - start, *fsync);
                apply(items, end);
            }
            let mut q = self.queue();
            match outcome {
                Ok(_) => {
                    q.written_lsn = end;
                    q.durable_lsn = end;
                    drop(q);
                    for (lsn, done) in waiters {
                        // A waiter that gave up (its task was dropped) needs no answer.
                        let _ = done.send(Ok(lsn));
                    }
                }
                Err(LogWriteError::Undone(e)) => {
                    q.take_back(start, end);
                    drop(q);
                    tracing::warn!(error = %e, "a log write failed and was undone; its records are refused, the log takes the next write");
                    let why = e.to_string();
                    for (_, done) in waiters {
                        let _ = done.send(Err(EngineError::LogWriteUndone(why.clone())));
                    }
                }
                Err(LogWriteError::Broken(e)) => {
                    let failure = e.to_string();
                    q.written_lsn = end;
                    q.failure = Some(failure.clone());
                    drop(q);
                    fail(waiters, &failure);
                }
            }
            // Only now: a broken invariant above (`take_back`'s) poisons the log too.
            writing.armed = false;
        }
    }

    /// Stops the log writer once it has written everything queued so far; later records
    /// are refused with [`EngineError::Closed`].
    pub fn shut_down(&self) {
        self.queue().shut_down = true;
        self.queued.notify_all();
    }

    /// Writes and fsyncs `frames`, returning how long the fsync took.
    fn write(&self, start: u64, frames: &[Vec<u8>]) -> Result<Duration, LogWriteError> {
        let mut files = self.files.lock().ignore_poison();
        files.write(start, frames)
    }

    /// Why the log refuses writes, once an fsync (or a write that could not be undone)
    /// has failed (until reopened).
    pub fn failure(&self) -> Option<String> {
        self.queue().failure.clone()
    }

    /// The log's counters since it was opened.
    pub fn stats(&self) -> LogStats {
        self.counters.snapshot()
    }

    /// Everything before this LSN is written and fsync'd (and applied).
    pub fn durable_lsn(&self) -> u64 {
        self.queue().durable_lsn
    }

    /// Notes that checkpoints reflect every record before `lsn`, and deletes the log files
    /// that hold only records before it and before the hold ([`Wal::hold_from`]).
    pub fn release_before(&self, lsn: u64) -> Result<(), StorageError> {
        self.move_marks(|marks| marks.checkpointed = marks.checkpointed.max(lsn))
    }

    /// Keeps the records from `lsn` on even once checkpoints reflect them, for a reader of
    /// the log itself; deletes the files wholly before both marks. The hold only moves
    /// forward.
    pub fn hold_from(&self, lsn: u64) -> Result<(), StorageError> {
        self.move_marks(|marks| {
            marks.held_from = if marks.held_from == u64::MAX {
                lsn
            } else {
                marks.held_from.max(lsn)
            }
        })
    }

    /// The first LSN the log's files still hold.
    pub fn first_lsn(&self) -> u64 {
        self.files
            .lock()
            .ignore_poison()
            .starts
            .first()
            .copied()
            .unwrap_or(0)
    }

    /// Where the hold is ([`Wal::hold_from`]; `u64::MAX`: none).
    pub fn held_from(&self) -> u64 {
        self.marks.lock().ignore_poison().held_from
    }

    fn move_marks(&self, change: impl FnOnce(&mut ReleaseMarks)) -> Result<(), StorageError> {
        let mut marks = self.marks.lock().ignore_poison();
        change(&mut marks);
        let before = marks.checkpointed.min(marks.held_from);
        // Under the marks' lock, so that deletions happen in the order the marks moved.
        let mut files = self.files.lock().ignore_poison();
        files.release_before(before)
    }
}

/// The log a database's state is fed from, as the database sees it once a command is in
/// it: the embedded write-ahead log ([`Wal`]) or a replica's cluster's Raft log (which the
/// cluster writes, and which openraft replays after a restart). The database tells it what
/// its checkpoints cover and reports what it says of itself.
pub trait CommandLog: Send + Sync {
    /// Every position before `position` is reflected in a durable checkpoint: records
    /// before it will never be read again.
    fn checkpointed(&self, position: u64) -> Result<(), StorageError>;
    /// Group commits, records, bytes and fsync latencies since the log was opened.
    fn stats(&self) -> LogStats;
    /// Why the log refuses writes, once a write or fsync failed (until restart).
    fn failure(&self) -> Option<String>;
}

impl<T: Send> CommandLog for Wal<T> {
    /// Deletes the log files that hold only records before `position`.
    fn checkpointed(&self, position: u64) -> Result<(), StorageError> {
        self.release_before(position)
    }

    fn stats(&self) -> LogStats {
        Wal::stats(self)
    }

    fn failure(&self) -> Option<String> {
        Wal::failure(self)
    }
}

fn fail(waiters: Vec<(u64, oneshot::Sender<Result<u64>>)>, failure: &str) {
    for (_, done) in waiters {
        let _ = done.send(Err(EngineError::LogFailed(failure.to_string())));
    }
}

/// Dropped while still armed only if the writer unwinds (a panic while writing or
/// applying): then it poisons the log, so that every later record is refused instead of
/// waiting for a writer that is gone. (The group's own waiters learn it from their dropped
/// senders.)
struct Writing<'a, T> {
    wal: &'a Wal<T>,
    armed: bool,
}

impl<T> Drop for Writing<'_, T> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut q = self.wal.queue();
        let failure = "a group commit was interrupted by a panic".to_string();
        q.failure = Some(failure.clone());
        let waiters = std::mem::take(&mut q.waiters);
        q.frames.clear();
        q.items.clear();
        drop(q);
        fail(waiters, &failure);
    }
}

/// The log's files: named by their first LSN, contiguous, the last one open for writing.
///
/// A released file is kept, renamed [`SPARE_FILE`], to become the next file instead of a
/// new one (as PostgreSQL recycles WAL segments): overwriting blocks a file already has
/// changes none of its metadata, so an fdatasync flushes only the data, while appending
/// to a growing file also writes its new size (with a journal: a journal commit, which the
/// fsyncs of every other file on that filesystem share). `scripts/fsync-latency.py`
/// measures both. So a file may hold more bytes than the log: a reused file's old
/// contents after its last record, and a rolled file's after the next file's start.
/// Neither is ever read as a record: a frame carries its own LSN, which stale bytes
/// cannot match (their LSNs are older), and recovery cuts the last file at its last
/// valid record (as closing does, so that a clean reopen has nothing to cut).
pub struct LogFiles {
    dir: PathBuf,
    /// Start LSNs of all files, ascending; the last is `current`.
    starts: Vec<u64>,
    /// Written from `current_len` on (never opened for appending: a reused file is longer).
    current: File,
    current_len: u64,
    roll_bytes: u64,
    /// Whether [`SPARE_FILE`] exists, a released file waiting to be the next one.
    spare: bool,
    /// Whether a released file is kept as the spare (a database's log) or deleted, and the
    /// file being written is given up once everything in it is released (a spool's, whose
    /// disk must get back what was forwarded).
    recycle: bool,
    /// Runs once in place of the next write's `writev` (tests of a failing disk).
    #[cfg(test)]
    write_fault: Option<WriteFault>,
}

#[cfg(test)]
type WriteFault = Box<dyn FnOnce(&mut File) -> std::io::Result<()> + Send>;

/// How many bytes of a spool's log file, all released, are worth a new file
/// ([`LogFiles::stop_recycling`]).
pub const RECLAIM_BYTES: u64 = 1 << 20;

/// The name a released log file waits under until it becomes the next one. Not a log
/// file's name ([`log::parse_file_name`] refuses it), so readers of the log never see it.
pub const SPARE_FILE: &str = "spare.log-recycled";

impl LogFiles {
    /// The position after the last byte written.
    pub fn end_lsn(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0) + self.current_len
    }

    /// Appends `frames` (whose first byte belongs at `start`, the current end) with one
    /// write and fsyncs them; returns how long the fsync took. A frame may come in several
    /// parts, one after the other in `frames`: only the bytes count here, except that the
    /// first part must begin with a whole frame header.
    ///
    /// The first frame goes to disk marked as the start of a write
    /// ([`log::STARTS_WRITE`]; its header is copied, `frames` are left as they are). Every
    /// writer of the log comes through here, one write at a time, each fsync'd before the
    /// next is made: that is what lets recovery tell a torn last write from corruption.
    ///
    /// A write that fails before its fsync is undone ([`LogWriteError::Undone`]): the file
    /// is cut back to the log's end, so the log is as it was.
    pub fn write<B: AsRef<[u8]>>(
        &mut self,
        start: u64,
        frames: &[B],
    ) -> Result<Duration, LogWriteError> {
        if start != self.end_lsn() {
            return Err(LogWriteError::Broken(StorageError::corrupt(
                "log",
                format!("write at LSN {start}, the log ends at {}", self.end_lsn()),
            )));
        }
        let mut head = [0u8; log::FRAME_HEADER];
        let mut parts: Vec<&[u8]> = Vec::with_capacity(frames.len() + 1);
        if let Some((first, rest)) = frames.split_first() {
            let first = first.as_ref();
            if first.len() < log::FRAME_HEADER {
                return Err(LogWriteError::Undone(StorageError::Encode(format!(
                    "a log write must begin with a frame header, not {} bytes",
                    first.len()
                ))));
            }
            head.copy_from_slice(&first[..log::FRAME_HEADER]);
            log::mark_starts_write(&mut head);
            parts.push(&head);
            parts.push(&first[log::FRAME_HEADER..]);
            parts.extend(rest.iter().map(|part| part.as_ref()));
            parts.retain(|part| !part.is_empty());
        }
        if self.current_len >= self.roll_bytes {
            self.roll(start).map_err(LogWriteError::Broken)?;
        }
        let path = self.current_path();
        #[cfg(test)]
        let written = match self.write_fault.take() {
            Some(fault) => fault(&mut self.current),
            None => write_all_vectored(&mut self.current, &parts),
        };
        #[cfg(not(test))]
        let written = write_all_vectored(&mut self.current, &parts);
        if let Err(e) = written {
            // Only a lack of space is undone: other errors (EIO) say the disk itself failed.
            let out_of_space = matches!(
                e.raw_os_error(),
                Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)
            );
            let failed = StorageError::io("write", &path, e);
            if !out_of_space {
                return Err(LogWriteError::Broken(failed));
            }
            return Err(match self.cut_back() {
                Ok(()) => LogWriteError::Undone(failed),
                Err(undo) => {
                    tracing::error!(error = %undo, "a failed log write could not be undone");
                    LogWriteError::Broken(failed)
                }
            });
        }
        let fsync_started = Instant::now();
        self.current
            .sync_data()
            .map_err(|e| LogWriteError::Broken(StorageError::io("fsync", &path, e)))?;
        let fsync = fsync_started.elapsed();
        self.current_len += frames.iter().map(|f| f.as_ref().len() as u64).sum::<u64>();
        Ok(fsync)
    }

    /// Cuts the current file back to the log's end and writes from there again, after a
    /// write that failed part-way (what it wrote is in the page cache only, unacknowledged).
    fn cut_back(&mut self) -> std::io::Result<()> {
        use std::io::{Seek, SeekFrom};
        self.current.set_len(self.current_len)?;
        // Durably: a crash must not bring back frames of a write its writers were told
        // stored nothing.
        self.current.sync_data()?;
        self.current.seek(SeekFrom::Start(self.current_len))?;
        Ok(())
    }

    fn current_path(&self) -> PathBuf {
        self.dir
            .join(log::file_name(self.starts.last().copied().unwrap_or(0)))
    }

    /// Starts the next file at `start`: the spare, renamed, if there is one (its old
    /// contents are overwritten from its first byte), or a new, empty file.
    fn roll(&mut self, start: u64) -> Result<(), StorageError> {
        let path = self.dir.join(log::file_name(start));
        self.current = if self.spare {
            self.spare = false;
            let spare = self.dir.join(SPARE_FILE);
            fs::rename(&spare, &path).map_err(|e| StorageError::io("rename", &spare, e))?;
            open_at(&path, 0)?
        } else {
            create_new(&path)?
        };
        // Until the directory is fsync'd, a crash may leave the rename or the new file
        // undone: either way the log ends at `start` after recovery, and nothing written
        // since has been acknowledged (the next fsync comes after this one).
        sync_dir(&self.dir)?;
        self.starts.push(start);
        self.current_len = 0;
        Ok(())
    }

    /// Reads the `len` bytes written at `lsn` (which must not span two files: a frame never
    /// does).
    pub fn read(&self, lsn: u64, len: usize) -> Result<Vec<u8>, StorageError> {
        use std::os::unix::fs::FileExt;
        let file_start = self.starts[..self.starts.partition_point(|&s| s <= lsn)]
            .last()
            .copied()
            .ok_or_else(|| {
                StorageError::corrupt("log", format!("LSN {lsn} is before the log's first file"))
            })?;
        let path = self.dir.join(log::file_name(file_start));
        let file = File::open(&path).map_err(|e| StorageError::io("open", &path, e))?;
        let mut buf = vec![0; len];
        file.read_exact_at(&mut buf, lsn - file_start)
            .map_err(|e| StorageError::io("read", &path, e))?;
        Ok(buf)
    }

    /// Cuts the log back to end at `lsn`: everything written from there on is removed
    /// (later files deleted, the file holding `lsn` shortened) and fsync'd.
    pub fn truncate(&mut self, lsn: u64) -> Result<(), StorageError> {
        if lsn >= self.end_lsn() {
            return Ok(());
        }
        while self.starts.len() > 1 && self.starts.last().is_some_and(|&s| s >= lsn) {
            let path = self.current_path();
            fs::remove_file(&path).map_err(|e| StorageError::io("delete", &path, e))?;
            self.starts.pop();
        }
        let start = self.starts.last().copied().unwrap_or(0);
        let path = self.current_path();
        let len = lsn.saturating_sub(start);
        cut_file(&path, len)?;
        sync_dir(&self.dir)?;
        self.current = open_at(&path, len)?;
        self.current_len = len;
        Ok(())
    }

    /// Deletes released files from now on instead of keeping one as the spare (deleting
    /// the spare there is), and gives up the file being written once it is all released
    /// ([`LogFiles::release_before`]): a spool's log, whose forwarded bytes must go back to
    /// its disk.
    pub fn stop_recycling(&mut self) -> Result<(), StorageError> {
        self.recycle = false;
        if self.spare {
            let spare = self.dir.join(SPARE_FILE);
            fs::remove_file(&spare).map_err(|e| StorageError::io("delete", &spare, e))?;
            self.spare = false;
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Releases the files that hold only bytes before `lsn`: the first becomes the spare
    /// if there is none (and the log recycles), the others are deleted. Without recycling,
    /// a file being written that holds [`RECLAIM_BYTES`] or more, all before `lsn`, is
    /// released too: the next write starts a new file.
    pub fn release_before(&mut self, lsn: u64) -> Result<(), StorageError> {
        let end = self.end_lsn();
        if !self.recycle && lsn >= end && self.current_len >= RECLAIM_BYTES {
            // A reclaim that fails (a full disk) leaves the file in use: the next release
            // tries again, and nothing released is lost.
            if let Err(e) = self.roll(end) {
                tracing::warn!(error = %e, "giving up a drained spool log file failed");
            }
        }
        let mut released = 0;
        while self.starts.len() > 1 && self.starts[1] <= lsn {
            let path = self.dir.join(log::file_name(self.starts[0]));
            if self.spare || !self.recycle {
                fs::remove_file(&path).map_err(|e| StorageError::io("delete", &path, e))?;
            } else {
                let spare = self.dir.join(SPARE_FILE);
                fs::rename(&path, &spare).map_err(|e| StorageError::io("rename", &path, e))?;
                self.spare = true;
            }
            self.starts.remove(0);
            released += 1;
        }
        if released > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }
}

impl Drop for LogFiles {
    /// Cuts a reused file's old contents after the log's end, so that a log closed cleanly
    /// reopens with nothing to cut, and recovery reports a cut only after a crash. Best
    /// effort: recovery would cut them anyway.
    fn drop(&mut self) {
        if self
            .current
            .metadata()
            .is_ok_and(|m| m.len() > self.current_len)
        {
            let _ = self.current.set_len(self.current_len);
        }
    }
}

/// Writes every buffer, in order, with as few `writev` calls as the kernel allows.
/// (`Write::write_all_vectored` is not stable yet.)
fn write_all_vectored<B: AsRef<[u8]>>(file: &mut File, buffers: &[B]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice> = buffers.iter().map(|b| IoSlice::new(b.as_ref())).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        match file.write_vectored(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn create_new(path: &Path) -> Result<File, StorageError> {
    OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(path)
        .map_err(|e| StorageError::io("create", path, e))
}

/// Opens the log file at `path` for writing from byte `at` on.
fn open_at(path: &Path, at: u64) -> Result<File, StorageError> {
    use std::io::{Seek, SeekFrom};
    let mut file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| StorageError::io("open", path, e))?;
    file.seek(SeekFrom::Start(at))
        .map_err(|e| StorageError::io("seek", path, e))?;
    Ok(file)
}

/// Shortens the file at `path` to `len` bytes, durably.
fn cut_file(path: &Path, len: u64) -> Result<(), StorageError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| StorageError::io("open", path, e))?;
    file.set_len(len)
        .and_then(|()| file.sync_all())
        .map_err(|e| StorageError::io("truncate", path, e))
}

/// The first LSNs of the log files in `dir`, ascending.
fn file_starts(dir: &Path) -> Result<Vec<u64>, StorageError> {
    let mut starts = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| StorageError::io("list", dir, e))? {
        let entry = entry.map_err(|e| StorageError::io("list", dir, e))?;
        if let Some(start) = log::parse_file_name(&entry.path()) {
            starts.push(start);
        }
    }
    starts.sort_unstable();
    Ok(starts)
}

/// A record read back from a log ([`read_records`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedRecord {
    pub lsn: u64,
    pub payload: Vec<u8>,
}

impl LoggedRecord {
    /// The LSN right after this record's frame: where the next record starts.
    pub fn end(&self) -> u64 {
        self.lsn + (log::FRAME_HEADER + self.payload.len()) as u64
    }
}

/// Reads the records of the log in `dir` from `from` (a record's LSN) until `until` (a
/// durable end, so no torn frame lies before it), about `max_bytes` of them: records stop
/// once `max_bytes` would be passed, but the first is read whatever its size. Every
/// frame's length, LSN and checksum are checked again: a frame that fails is corruption.
/// Takes no lock of the log: its writer only appends after `until`, and files are
/// deleted only behind the reader's hold ([`Wal::hold_from`]).
pub fn read_records(
    dir: &Path,
    from: u64,
    until: u64,
    max_bytes: usize,
) -> Result<Vec<LoggedRecord>, StorageError> {
    use std::os::unix::fs::FileExt;
    let corrupt = |detail: String| StorageError::corrupt("log", detail);
    let starts = file_starts(dir)?;
    let mut records = Vec::new();
    let mut at = from;
    let mut read = 0usize;
    while at < until && (records.is_empty() || read < max_bytes) {
        let i = starts.partition_point(|&s| s <= at);
        let file_start = i
            .checked_sub(1)
            .map(|i| starts[i])
            .ok_or_else(|| corrupt(format!("LSN {at} is before the log's first file")))?;
        let file_end = starts.get(i).copied().unwrap_or(u64::MAX).min(until);
        if at >= file_end {
            return Err(corrupt(format!(
                "no record starts at LSN {at} (a file starts at {file_end})"
            )));
        }
        let path = dir.join(log::file_name(file_start));
        let file = File::open(&path).map_err(|e| StorageError::io("open", &path, e))?;
        let budget = (max_bytes.saturating_sub(read) as u64).max(log::FRAME_HEADER as u64);
        let mut want = budget.min(file_end - at);
        let mut buf = vec![0; want as usize];
        file.read_exact_at(&mut buf, at - file_start)
            .map_err(|e| StorageError::io("read", &path, e))?;
        let first_len = buf
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64)
            .unwrap_or(0);
        let first_frame = log::FRAME_HEADER as u64 + first_len;
        if first_frame > want && first_frame <= file_end - at {
            // The first record alone is larger than the budget: read it whole.
            want = first_frame;
            buf = vec![0; want as usize];
            file.read_exact_at(&mut buf, at - file_start)
                .map_err(|e| StorageError::io("read", &path, e))?;
        }
        let (frames, _) = log::read_frames(&buf, at);
        let Some(&(last_lsn, last_payload)) = frames.last() else {
            return Err(corrupt(format!(
                "{} holds no valid record at LSN {at}, before its durable end {until}",
                path.display()
            )));
        };
        let next = last_lsn + (log::FRAME_HEADER + last_payload.len()) as u64;
        for (lsn, payload) in frames {
            records.push(LoggedRecord {
                lsn,
                payload: payload.to_vec(),
            });
        }
        read += (next - at) as usize;
        at = next;
    }
    Ok(records)
}

/// How many records the log in `dir` holds from `from` (a record's LSN) to `until` (a
/// durable end), found by hopping from header to header without reading payloads.
pub fn count_records(dir: &Path, from: u64, until: u64) -> Result<u64, StorageError> {
    use std::os::unix::fs::FileExt;
    let starts = file_starts(dir)?;
    let (mut at, mut records) = (from, 0u64);
    let mut open: Option<(u64, File)> = None;
    while at < until {
        let file_start = starts[..starts.partition_point(|&s| s <= at)]
            .last()
            .copied()
            .ok_or_else(|| {
                StorageError::corrupt("log", format!("LSN {at} is before the log's first file"))
            })?;
        if open.as_ref().is_none_or(|(start, _)| *start != file_start) {
            let path = dir.join(log::file_name(file_start));
            let file = File::open(&path).map_err(|e| StorageError::io("open", &path, e))?;
            open = Some((file_start, file));
        }
        let Some((_, file)) = &open else { break };
        let mut len = [0u8; 4];
        file.read_exact_at(&mut len, at - file_start)
            .map_err(|e| StorageError::io("read", dir.join(log::file_name(file_start)), e))?;
        let len = u32::from_le_bytes(len) as u64;
        if len == 0 || len > log::MAX_PAYLOAD as u64 {
            return Err(StorageError::corrupt(
                "log",
                format!("impossible record length {len} at LSN {at}"),
            ));
        }
        at += log::FRAME_HEADER as u64 + len;
        records += 1;
    }
    Ok(records)
}

/// What recovery found in the log.
pub struct Replayed {
    pub files: LogFiles,
    /// A description of the torn tail that was cut off, if there was one.
    pub truncated: Option<String>,
    /// A description of damage found among records before the replay point (reflected by
    /// a checkpoint, no longer needed), which replay skipped.
    pub ignored: Option<String>,
}

/// Reads every record at or after `from` in order, calling `visit(lsn, payload)`, cuts a
/// torn tail off the last file, and opens the log for writing after it.
///
/// Where the valid frames stop before the end of the log, recovery decides between a torn
/// tail and corruption ([`log::scan_after_damage`]):
/// - in any file but the last, it is corruption (files are only rolled after everything
///   before was fsync'd);
/// - in the last file, it is corruption when a valid frame that starts a later write
///   follows the damage ([`log::STARTS_WRITE`]): a write is made only once the one before
///   it is fsync'd, so the damaged write was durable, and acknowledged;
/// - otherwise the damage lies in the last write, which a crash can leave with some of its
///   pages on disk and others not: a torn tail, never acknowledged, cut off. (The old
///   contents of a reused file after the log's end look the same: their stored LSNs never
///   match their positions.)
///
/// Corruption fails with [`EngineError::CorruptLog`] and changes nothing: the caller says
/// what to do about it, and [`repair`] cuts such a log, keeping what it cuts.
///
/// What frames cannot show: damage inside the last write of a log that was closed cleanly
/// (no crash) looks exactly like a torn write, and is cut. So does damage followed only
/// by a torn last write whose first frame did not reach the disk. A log written before
/// writes were marked (log format 2 and older) has no marks: damage in its last file is
/// cut as a torn tail, as it always was.
///
/// Damage before `from` (among records a checkpoint reflects, so durable) is corruption
/// too, but those records are no longer needed: replay goes on from the first record it
/// needs if a valid frame starts there (reported in [`Replayed::ignored`]). A rolled file
/// is read only up to the next file's start: what lies beyond is a reused file's old
/// contents ([`LogFiles`]).
///
/// `expect_files` says a manifest exists: then an empty log directory means the log was
/// lost, which fails the open instead of silently starting a new log.
pub fn replay(
    dir: &Path,
    from: u64,
    expect_files: bool,
    roll_bytes: u64,
    visit: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<Replayed> {
    fs::create_dir_all(dir).map_err(|e| StorageError::io("create", dir, e))?;
    let starts = file_starts(dir)?;
    let spare = dir.join(SPARE_FILE).exists();
    if starts.is_empty() && expect_files {
        return Err(EngineError::Storage(StorageError::corrupt(
            "log",
            format!(
                "{} holds no log files, but the manifest needs records from LSN {from}",
                dir.display()
            ),
        )));
    }
    if starts.is_empty() {
        let current = create_new(&dir.join(log::file_name(from)))?;
        sync_dir(dir)?;
        return Ok(Replayed {
            files: LogFiles {
                dir: dir.to_path_buf(),
                starts: vec![from],
                current,
                current_len: 0,
                roll_bytes,
                spare,
                recycle: true,
                #[cfg(test)]
                write_fault: None,
            },
            truncated: None,
            ignored: None,
        });
    }
    let walked = walk(dir, &starts, from, visit)?;
    let truncated = match walked.torn {
        Some(torn) => {
            // Cut, not just written over: bytes of a lost write may hide a whole frame of
            // that write further on, which a shorter write here would bring back.
            cut_file(&torn.path, torn.valid_len)?;
            Some(format!(
                "cut {} from LSN {} on: {} bytes after the last valid record, the unfinished \
                 write of a crash or the old contents of a reused file ({}{})",
                torn.path.display(),
                torn.lsn,
                torn.file_len - torn.valid_len,
                torn.reason,
                match torn.records_after {
                    0 => String::new(),
                    n => format!("; {n} valid records of that write followed it"),
                },
            ))
        }
        None => None,
    };
    let end = walked.end;
    let last = *starts.last().unwrap_or(&0);
    let current = open_at(&dir.join(log::file_name(last)), end - last)?;
    Ok(Replayed {
        files: LogFiles {
            dir: dir.to_path_buf(),
            starts,
            current,
            current_len: end - last,
            roll_bytes,
            spare,
            recycle: true,
            #[cfg(test)]
            write_fault: None,
        },
        truncated,
        ignored: walked.ignored,
    })
}

/// Where the valid log ends ([`walk`]).
struct Walked {
    end: u64,
    /// The last file's torn tail, to be cut.
    torn: Option<TornTail>,
    /// Damage among records no longer needed, skipped.
    ignored: Option<String>,
}

struct TornTail {
    path: PathBuf,
    /// Where the damage starts in the file, and its LSN.
    valid_len: u64,
    lsn: u64,
    file_len: u64,
    reason: String,
    /// Valid frames of the torn write after the damage (none starts a write).
    records_after: u64,
}

/// Reads the log files `starts` of `dir` from `from` on, visiting every record, and finds
/// where the valid log ends: at the end of the last file, at a torn tail in it, or at
/// corruption ([`EngineError::CorruptLog`], with nothing changed). The rule is
/// [`replay`]'s.
fn walk(
    dir: &Path,
    starts: &[u64],
    from: u64,
    mut visit: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<Walked> {
    let corrupt = |detail: String| EngineError::Storage(StorageError::corrupt("log", detail));
    // Files wholly before `from` are left for release; replay starts in the file holding it.
    let first = starts.iter().rposition(|&s| s <= from).ok_or_else(|| {
        corrupt(format!(
            "replay must start at LSN {from} but the oldest log file starts at {}",
            starts.first().copied().unwrap_or(0)
        ))
    })?;
    let (mut torn, mut ignored) = (None, None);
    let mut end = starts[first];
    for (i, &start) in starts.iter().enumerate().skip(first) {
        if i > first && start != end {
            return Err(corrupt(format!(
                "log has a gap: LSN {end} to {start} is missing"
            )));
        }
        let path = dir.join(log::file_name(start));
        let bytes = fs::read(&path).map_err(|e| StorageError::io("read", &path, e))?;
        let next = starts.get(i + 1).copied();
        let log_bytes = match next {
            // Frames cannot run short of it: that would be a gap, found above next round.
            Some(next) => &bytes[..bytes.len().min((next - start) as usize)],
            None => &bytes[..],
        };
        let mut pos = 0;
        let valid = loop {
            let (frames, how) = log::read_frames(&log_bytes[pos..], start + pos as u64);
            for (lsn, payload) in frames {
                if lsn >= from {
                    visit(lsn, payload)?;
                }
            }
            let (valid_len, reason) = match how {
                FrameEnd::Clean => break log_bytes.len(),
                FrameEnd::Torn { valid_len, reason } => (valid_len, reason),
            };
            let damage = pos + valid_len;
            let damage_at = |evidence, after| {
                let damage = Damage {
                    file_start: start,
                    offset: damage,
                    reason: reason.clone(),
                    after,
                };
                Err(damage.into_error(dir, &starts[i + 1..], evidence))
            };
            if start + (damage as u64) < from {
                // Among records before the replay point: a checkpoint reflects them, so
                // they were durable, and none is needed. The log goes on from the first
                // record needed if a valid frame starts there: `from` itself, or `from - 1`
                // (a replica's checkpoint is one past the start of the last record it
                // applied), or if `from` is where the file ends (the embedded log's
                // checkpoint is the end of the last group it wrote: after a clean close,
                // the end of the log). A valid frame at its own position is a record start.
                let resume = [from, from - 1]
                    .into_iter()
                    .filter_map(|lsn| lsn.checked_sub(start))
                    .map(|at| at as usize)
                    .find(|&at| {
                        at > damage
                            && (at == log_bytes.len()
                                || log::frame_at(log_bytes, at, start).is_ok())
                    });
                if let Some(at) = resume {
                    ignored.get_or_insert_with(|| {
                        format!(
                            "{} is damaged at byte {damage} (LSN {}: {reason}), before LSN \
                             {from} where replay starts: records a checkpoint holds already, \
                             not needed to open, skipped (a spool's reader checks them again)",
                            path.display(),
                            start + damage as u64,
                        )
                    });
                    pos = at;
                    continue;
                }
                let after = log::scan_after_damage(log_bytes, start, damage);
                return damage_at(Evidence::BeforeReplayPoint { from }, after);
            }
            let after = log::scan_after_damage(log_bytes, start, damage);
            match (next, after.later_write) {
                (Some(_), _) => return damage_at(Evidence::NotLastFile, after),
                (None, Some(at)) => {
                    let lsn = start + at as u64;
                    return damage_at(Evidence::LaterWrite { lsn }, after);
                }
                (None, None) => {}
            }
            torn = Some(TornTail {
                path: path.clone(),
                valid_len: damage as u64,
                lsn: start + damage as u64,
                file_len: bytes.len() as u64,
                reason,
                records_after: after.records,
            });
            break damage;
        };
        end = start + valid as u64;
    }
    Ok(Walked { end, torn, ignored })
}

/// Damage found in the log file starting at `file_start`.
struct Damage {
    file_start: u64,
    offset: usize,
    reason: String,
    after: log::AfterDamage,
}

impl Damage {
    /// The error for this damage, `later` being the starts of the log files after its own.
    fn into_error(self, dir: &Path, later: &[u64], evidence: Evidence) -> EngineError {
        let (mut records, mut bytes) = (self.after.records, self.after.bytes);
        // Every record of the later files lies after the damage too (counted as far as
        // their frames chain; an unreadable file counts none).
        for (j, &start) in later.iter().enumerate() {
            let path = dir.join(log::file_name(start));
            let Ok(contents) = fs::read(&path) else {
                continue;
            };
            let limit = later
                .get(j + 1)
                .map_or(contents.len(), |&next| (next - start) as usize)
                .min(contents.len());
            let (frames, _) = log::read_frames(&contents[..limit], start);
            records += frames.len() as u64;
            bytes += frames
                .iter()
                .map(|(_, payload)| (log::FRAME_HEADER + payload.len()) as u64)
                .sum::<u64>();
        }
        EngineError::CorruptLog(Box::new(CorruptLog {
            file: dir.join(log::file_name(self.file_start)),
            offset: self.offset as u64,
            lsn: self.file_start + self.offset as u64,
            reason: self.reason,
            evidence,
            records_after: records,
            bytes_after: bytes,
            later_files: later
                .iter()
                .map(|&start| dir.join(log::file_name(start)))
                .collect(),
            advice: String::new(),
        }))
    }
}

/// What [`repair`] did to a corrupt log.
#[derive(Debug, Clone)]
pub struct RepairedLog {
    /// The corruption, and what lay after it.
    pub damage: CorruptLog,
    /// Every byte of the damaged file from the damage to its end, saved beside the log
    /// (`damaged-<LSN>.bin`, fsync'd), and how many.
    pub saved: PathBuf,
    pub saved_bytes: u64,
    /// The log files after the damaged one, moved aside whole (`damaged-<LSN>-<start>.bin`).
    pub moved: Vec<PathBuf>,
    /// A text beside them saying what they are (`damaged-<LSN>.txt`).
    pub note: PathBuf,
}

/// Cuts a corrupt log in `dir` (read from `from`, as [`replay`] reads it) at its damage,
/// after saving what it cuts: the damaged file's bytes from the damage to its end into
/// `damaged-<LSN>.bin` beside the log, later log files renamed `damaged-<LSN>-<start>.bin`,
/// and `damaged-<LSN>.txt` saying what they are; all fsync'd before the log is cut. The
/// records after the damage are not restored: they stay in those files.
///
/// Refuses to cut before `keep_before` (a manifest's checkpoint: records it relies on
/// would be gone, and new records would get positions it says are reflected). `Ok(None)`:
/// the log is not corrupt (a torn tail is left for recovery to cut). Running it again
/// after a crash in the middle finds the same damage and saves the same bytes again.
pub fn repair(dir: &Path, from: u64, keep_before: u64) -> Result<Option<RepairedLog>> {
    let starts = file_starts(dir)?;
    if starts.is_empty() {
        return Ok(None);
    }
    let damage = match walk(dir, &starts, from, |_, _| Ok(())) {
        Ok(_) => return Ok(None),
        Err(EngineError::CorruptLog(damage)) => *damage,
        Err(e) => return Err(e),
    };
    if damage.lsn < keep_before {
        return Err(EngineError::Storage(StorageError::corrupt(
            "log",
            format!(
                "{damage}. It cannot be repaired by cutting the log: the damage lies before \
                 the checkpoint at LSN {keep_before}, whose manifest relies on the records \
                 after it"
            ),
        )));
    }
    let lsn = damage.lsn;
    let bytes = fs::read(&damage.file).map_err(|e| StorageError::io("read", &damage.file, e))?;
    let cut = &bytes[(damage.offset as usize).min(bytes.len())..];
    let saved = dir.join(format!("damaged-{lsn:020}.bin"));
    fsutil::write_atomic(&saved, cut)?;
    let moves: Vec<(PathBuf, PathBuf)> = damage
        .later_files
        .iter()
        .zip(&starts[starts.len() - damage.later_files.len()..])
        .map(|(file, start)| {
            let to = dir.join(format!("damaged-{lsn:020}-{start:020}.bin"));
            (file.clone(), to)
        })
        .collect();
    let note = dir.join(format!("damaged-{lsn:020}.txt"));
    let moved: Vec<PathBuf> = moves.iter().map(|(_, to)| to.clone()).collect();
    fsutil::write_atomic(&note, repair_note(&damage, &saved, &moved).as_bytes())?;
    for (file, to) in &moves {
        fs::rename(file, to).map_err(|e| StorageError::io("rename", file, e))?;
    }
    cut_file(&damage.file, damage.offset)?;
    sync_dir(dir)?;
    Ok(Some(RepairedLog {
        saved_bytes: cut.len() as u64,
        damage,
        saved,
        moved,
        note,
    }))
}

/// The text saved beside what a repair cut.
fn repair_note(damage: &CorruptLog, saved: &Path, moved: &[PathBuf]) -> String {
    let name = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mut note = format!(
        "Saved by a repair of a corrupt log (`tidemark verify --repair`).\n\n\
         {damage}.\n\n\
         The log was cut at byte {} of {} (LSN {}), so that the database opens again.\n\
         {} holds every byte of that file from there to its end: the damaged record first,\n\
         then what followed it.\n",
        damage.offset,
        name(&damage.file),
        damage.lsn,
        name(saved),
    );
    if !moved.is_empty() {
        note.push_str(&format!(
            "The log files after it were moved aside whole: {}.\n",
            moved.iter().map(|p| name(p)).collect::<Vec<_>>().join(", ")
        ));
    }
    note.push_str(&format!(
        "\n{} valid records ({} bytes) were found after the damage. They had been\n\
         acknowledged to their writers, and they are NOT in the database any more: the\n\
         repair does not restore them.\n\n\
         Layout: log frames, all integers little-endian: u32 payload length | u32 CRC32C of\n\
         the payload | u64 LSN (its top bit marks the first frame of a write) | payload, one\n\
         command each (docs/ARCHITECTURE.md, \"Byte layouts\"). A frame's LSN is its position\n\
         in the log: the first byte of {} is at LSN {}, a moved file's at the LSN its name\n\
         ends with.\n",
        damage.records_after,
        damage.bytes_after,
        name(saved),
        damage.lsn,
    ));
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut frame = Vec::new();
        log::begin_frame(&mut frame);
        frame.extend_from_slice(payload);
        log::end_frame(&mut frame).unwrap();
        frame
    }

    fn replay_all(dir: &Path) -> (Vec<(u64, Vec<u8>)>, Replayed) {
        let mut seen = Vec::new();
        let replayed = replay(dir, 0, false, 100, |lsn, p| {
            seen.push((lsn, p.to_vec()));
            Ok(())
        })
        .unwrap();
        (seen, replayed)
    }

    /// Runs `body` while a log writer applies groups with `apply`, then stops the writer.
    fn with_writer<T: Send, R>(
        wal: &Wal<T>,
        apply: impl Fn(Vec<(u64, T)>, u64) + Send,
        body: impl FnOnce() -> R,
    ) -> R {
        std::thread::scope(|s| {
            let writer = s.spawn(|| wal.run_writer(apply));
            let outcome = body();
            wal.shut_down();
            let _ = writer.join();
            outcome
        })
    }

    #[test]
    fn group_commit_rolls_replays_and_releases() {
        let dir = tempfile::tempdir().unwrap();
        let (_, replayed) = replay_all(dir.path());
        let wal = Wal::new(replayed.files);
        let applied = Mutex::new(Vec::new());
        with_writer(
            &wal,
            |group, _| applied.lock().unwrap().extend(group),
            || {
                std::thread::scope(|s| {
                    for t in 0..4u8 {
                        let wal = &wal;
                        s.spawn(move || {
                            for i in 0..25u8 {
                                let payload = vec![t, i, 7, 7, 7, 7, 7, 7];
                                wal.commit(frame(&payload), payload.clone()).unwrap();
                            }
                        });
                    }
                });
            },
        );
        let applied = applied.into_inner().unwrap();
        assert_eq!(applied.len(), 100);
        assert!(
            applied.windows(2).all(|w| w[0].0 < w[1].0),
            "applied in LSN order"
        );
        assert!(wal.stats().groups <= 100, "{:?}", wal.stats().groups);
        assert!(matches!(
            wal.commit(frame(&[1]), vec![]),
            Err(EngineError::Closed)
        ));
        let files_before = fs::read_dir(dir.path()).unwrap().count();
        assert!(files_before > 3, "100-byte files must have rolled");
        let end = wal.end_lsn();
        drop(wal);

        let (seen, replayed) = replay_all(dir.path());
        assert_eq!(seen, applied);
        assert_eq!(replayed.files.end_lsn(), end);
        assert!(replayed.truncated.is_none());

        let wal = Wal::<()>::new(replayed.files);
        wal.release_before(applied[50].0).unwrap();
        assert!(fs::read_dir(dir.path()).unwrap().count() < files_before);
        let from = applied[50].0;
        let mut again = Vec::new();
        drop(wal);
        replay(dir.path(), from, true, 100, |lsn, _| {
            again.push(lsn);
            Ok(())
        })
        .unwrap();
        assert_eq!(again.first(), Some(&from));
        assert_eq!(again.len(), 50);
    }

    #[test]
    fn a_failed_write_is_undone_and_the_log_takes_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let (_, mut replayed) = replay_all(dir.path());
        let (writing, is_writing) = std::sync::mpsc::channel();
        let (go, may_fail) = std::sync::mpsc::channel::<()>();
        replayed.files.write_fault = Some(Box::new(move |file: &mut File| {
            // Part of the group reaches the file before the disk is full.
            file.write_all(b"half of a frame")?;
            writing.send(()).unwrap();
            may_fail.recv().unwrap();
            Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
        }));
        let wal = Wal::new(replayed.files);
        let applied = Mutex::new(Vec::new());
        let (first, second) = with_writer(
            &wal,
            |group, _| applied.lock().unwrap().extend(group),
            || {
                let first = wal.submit(frame(b"first"), b"first".to_vec()).unwrap();
                is_writing.recv().unwrap();
                // Queued while the first group is being written: it gets the LSN after it.
                let second = wal.submit(frame(b"second"), b"second".to_vec()).unwrap();
                go.send(()).unwrap();
                (first.wait(), second.wait())
            },
        );
        assert!(
            matches!(&first, Err(EngineError::LogWriteUndone(why)) if why.contains("write")),
            "{first:?}"
        );
        assert_eq!(
            second.unwrap(),
            0,
            "the next record takes the undone one's place"
        );
        assert_eq!(
            wal.failure(),
            None,
            "an undone write leaves the log writable"
        );
        assert_eq!(wal.end_lsn(), frame(b"second").len() as u64);
        let applied = applied.into_inner().unwrap();
        assert_eq!(applied, vec![(0, b"second".to_vec())]);
        drop(wal);

        let (seen, replayed) = replay_all(dir.path());
        assert_eq!(
            seen, applied,
            "the log holds what was acknowledged, nothing else"
        );
        assert!(replayed.truncated.is_none(), "{:?}", replayed.truncated);
    }

    #[test]
    fn a_write_that_fails_for_another_reason_than_space_poisons_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let (_, mut replayed) = replay_all(dir.path());
        replayed.files.write_fault = Some(Box::new(|_: &mut File| {
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        }));
        let wal = Wal::new(replayed.files);
        let outcome = with_writer(&wal, |_, _| {}, || wal.commit(frame(b"lost"), ()));
        assert!(
            matches!(outcome, Err(EngineError::LogFailed(_))),
            "{outcome:?}"
        );
        assert!(wal.failure().is_some_and(|f| f.contains("write")));
        assert!(matches!(
            wal.submit(frame(b"next"), ()),
            Err(EngineError::LogFailed(_))
        ));
    }

    #[test]
    fn a_panicking_apply_poisons_the_log_instead_of_hanging_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_, replayed) = replay_all(dir.path());
        let wal = Wal::new(replayed.files);
        assert_eq!(wal.failure(), None);
        with_writer(
            &wal,
            |_, _| panic!("apply failed"),
            || {
                assert!(matches!(
                    wal.commit(frame(&[1; 4]), ()),
                    Err(EngineError::LogFailed(_))
                ));
                assert!(matches!(
                    wal.commit(frame(&[2; 4]), ()),
                    Err(EngineError::LogFailed(_))
                ));
            },
        );
        // What readiness reports (`/ready` answers 503 read-only with it).
        assert!(wal.failure().is_some_and(|f| f.contains("panic")));
    }

    #[test]
    fn a_completion_is_awaited_without_a_thread_per_record() {
        let dir = tempfile::tempdir().unwrap();
        let (_, replayed) = replay_all(dir.path());
        let wal = Wal::new(replayed.files);
        let lsns = with_writer(
            &wal,
            |_, _| {},
            || {
                // Queue all of them first, then wait: one waiting thread, many records.
                let pending: Vec<Completion> = (0..50u8)
                    .map(|i| wal.submit(frame(&[i; 6]), ()).unwrap())
                    .collect();
                block_on(async {
                    let mut lsns = Vec::new();
                    for completion in pending {
                        lsns.push(completion.await.unwrap());
                    }
                    lsns
                })
            },
        );
        assert_eq!(lsns.len(), 50);
        assert!(lsns.windows(2).all(|w| w[0] < w[1]));
        assert!(
            wal.stats().groups < 50,
            "queued records share groups: {}",
            wal.stats().groups
        );
    }

    #[test]
    fn torn_tail_is_cut_and_appends_continue() {
        let dir = tempfile::tempdir().unwrap();
        let (_, replayed) = replay_all(dir.path());
        let wal = Wal::new(replayed.files);
        with_writer(
            &wal,
            |_, _| {},
            || {
                for i in 0..3u8 {
                    wal.commit(frame(&[i; 10]), ()).unwrap();
                }
            },
        );
        drop(wal);
        let path = dir.path().join(log::file_name(0));
        let mut bytes = fs::read(&path).unwrap();
        bytes.extend_from_slice(&[1, 2, 3]);
        fs::write(&path, &bytes).unwrap();

        let (seen, replayed) = replay_all(dir.path());
        assert_eq!(seen.len(), 3);
        assert!(replayed.truncated.is_some());
        let wal = Wal::new(replayed.files);
        with_writer(&wal, |_, _| {}, || wal.commit(frame(&[9; 10]), ()).unwrap());
        drop(wal);
        let (seen, replayed) = replay_all(dir.path());
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[3].1, vec![9; 10]);
        assert!(replayed.truncated.is_none());
    }

    /// `payload` framed at `lsn`, ready for [`LogFiles::write`].
    fn framed(lsn: u64, payload: &[u8]) -> Vec<u8> {
        let mut framed = frame(payload);
        log::set_frame_lsn(&mut framed, lsn);
        framed
    }

    fn append(files: &mut LogFiles, payload: &[u8]) -> u64 {
        let lsn = files.end_lsn();
        files.write(lsn, &[framed(lsn, payload)]).unwrap();
        lsn
    }

    /// A new log (100-byte files) holding a record `payload(i)` for each `i` below `n`, and
    /// the records as (LSN, payload).
    fn log_with(
        n: u8,
        payload: impl Fn(u8) -> Vec<u8>,
    ) -> (tempfile::TempDir, LogFiles, Vec<(u64, Vec<u8>)>) {
        let dir = tempfile::tempdir().unwrap();
        let (_, replayed) = replay_all(dir.path());
        let mut files = replayed.files;
        let written = (0..n)
            .map(|i| {
                let payload = payload(i);
                (append(&mut files, &payload), payload)
            })
            .collect();
        (dir, files, written)
    }

    /// Drops `files` as a crash would leave them: without cutting a reused file's old
    /// contents on the way out.
    fn crash(mut files: LogFiles) {
        files.current_len = u64::MAX;
        drop(files);
    }

    fn inode(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn a_released_file_becomes_the_next_one_and_its_old_bytes_are_never_read() {
        let (dir, mut files, mut written) = log_with(30, |i| vec![i; 40]);
        assert!(files.starts.len() >= 4, "{:?}", files.starts);
        let spare = dir.path().join(SPARE_FILE);
        assert!(!spare.exists());
        let (second, oldest) = (files.starts[1], files.starts[0]);
        let reused = inode(&dir.path().join(log::file_name(oldest)));
        files.release_before(files.starts[2]).unwrap();
        assert_eq!(inode(&spare), reused, "the oldest released file is kept");
        assert!(!dir.path().join(log::file_name(second)).exists());

        let first = files.starts[0];

        // Shorter records than before: the reused file's old frames lie across new ones.
        while spare.exists() {
            written.push((append(&mut files, &[7; 9]), vec![7; 9]));
        }
        let lsn = *files.starts.last().unwrap();
        let current = dir.path().join(log::file_name(lsn));
        assert_eq!(inode(&current), reused, "the spare became the next file");
        let end = files.end_lsn();
        assert!(fs::metadata(&current).unwrap().len() > end - lsn);
        crash(files);

        let mut seen = Vec::new();
        let replayed = replay(dir.path(), first, true, 100, |lsn, p| {
            seen.push((lsn, p.to_vec()));
            Ok(())
        })
        .unwrap();
        let kept: Vec<_> = written.into_iter().filter(|(l, _)| *l >= first).collect();
        assert_eq!(seen, kept);
        assert_eq!(replayed.files.end_lsn(), end);
        assert!(replayed.truncated.is_some(), "the old bytes were cut");
        assert_eq!(fs::metadata(&current).unwrap().len(), end - lsn);
        assert!(!spare.exists());
    }

    #[test]
    fn a_reused_file_closed_cleanly_reopens_with_nothing_to_cut() {
        let (dir, mut files, _) = log_with(30, |i| vec![i; 40]);
        files.release_before(files.starts[2]).unwrap();
        while dir.path().join(SPARE_FILE).exists() {
            append(&mut files, &[7; 9]);
        }
        let current = dir
            .path()
            .join(log::file_name(*files.starts.last().unwrap()));
        let (first, log_len) = (files.starts[0], files.current_len);
        assert!(fs::metadata(&current).unwrap().len() > log_len);
        drop(files);
        assert_eq!(fs::metadata(&current).unwrap().len(), log_len);
        let replayed = replay(dir.path(), first, true, 100, |_, _| Ok(())).unwrap();
        assert!(replayed.truncated.is_none(), "{:?}", replayed.truncated);
    }

    #[test]
    fn a_lost_write_never_returns_behind_a_shorter_one() {
        let dir = tempfile::tempdir().unwrap();
        let (_, replayed) = replay_all(dir.path());
        let mut files = replayed.files;
        append(&mut files, b"acknowledged");
        // The last write, two frames: the page of the second reached the disk, the first's
        // did not (a later write could not have: writes are made one fsync after another).
        let lost = files.end_lsn();
        let second = lost + (log::FRAME_HEADER + 20) as u64;
        files
            .write(lost, &[framed(lost, &[1; 20]), framed(second, &[2; 20])])
            .unwrap();
        drop(files);
        let path = dir.path().join(log::file_name(0));
        let mut bytes = fs::read(&path).unwrap();
        bytes[lost as usize..lost as usize + log::FRAME_HEADER + 20].fill(0);
        fs::write(&path, &bytes).unwrap();

        let (seen, replayed) = replay_all(dir.path());
        assert_eq!(seen.len(), 1);
        let mut files = replayed.files;
        assert_eq!(append(&mut files, &[3; 20]), lost);
        drop(files);
        let (seen, _) = replay_all(dir.path());
        let payloads: Vec<_> = seen.into_iter().map(|(_, p)| p).collect();
        assert_eq!(payloads, [b"acknowledged".to_vec(), vec![3; 20]]);
    }

    /// A record written: its LSN, its payload, and the index of the write it was in.
    type Written = (u64, Vec<u8>, usize);

    /// Writes each group of payloads with one write (as the log writer writes a group
    /// commit) and returns every record written.
    fn write_groups(files: &mut LogFiles, groups: &[Vec<Vec<u8>>]) -> Vec<Written> {
        let mut written = Vec::new();
        for (w, group) in groups.iter().enumerate() {
            let start = files.end_lsn();
            let mut lsn = start;
            let mut frames = Vec::new();
            for payload in group {
                frames.push(framed(lsn, payload));
                written.push((lsn, payload.clone(), w));
                lsn += (log::FRAME_HEADER + payload.len()) as u64;
            }
            files.write(start, &frames).unwrap();
        }
        written
    }

    /// Four writes of three small frames each, in one file; the file's path and bytes.
    fn four_writes() -> (tempfile::TempDir, PathBuf, Vec<u8>, Vec<Written>) {
        let dir = tempfile::tempdir().unwrap();
        let mut files = replay(dir.path(), 0, false, 1 << 20, |_, _| Ok(()))
            .unwrap()
            .files;
        let groups: Vec<Vec<Vec<u8>>> = (0..4u8)
            .map(|w| (0..3u8).map(|f| vec![w * 3 + f; 1 + f as usize]).collect())
            .collect();
        let written = write_groups(&mut files, &groups);
        drop(files);
        let path = dir.path().join(log::file_name(0));
        let bytes = fs::read(&path).unwrap();
        (dir, path, bytes, written)
    }

    type Records = Vec<(u64, Vec<u8>)>;

    /// Replays the log in `dir` from 0 (1 MiB files): the records, or the error.
    fn try_replay(dir: &Path) -> Result<(Records, Replayed)> {
        let mut seen = Vec::new();
        let replayed = replay(dir, 0, true, 1 << 20, |lsn, p| {
            seen.push((lsn, p.to_vec()));
            Ok(())
        })?;
        Ok((seen, replayed))
    }

    /// The frame holding byte `at` of the log, and where it starts.
    fn frame_of(written: &[Written], at: usize) -> (usize, u64) {
        let i = written.partition_point(|(lsn, _, _)| *lsn <= at as u64) - 1;
        (i, written[i].0)
    }

    /// Every one-bit flip (two bits per byte: 0x01 and 0x80, the write mark's bit at byte 15
    /// of a header) and every 4-byte overwrite, at every position of a log of four writes:
    /// damage that a later write follows is refused as corruption, with nothing cut; damage
    /// in the last write is a torn tail, cut there; a flipped write mark alone changes
    /// nothing.
    #[test]
    fn damage_before_the_last_write_is_corruption_and_in_it_a_torn_tail() {
        let (dir, path, original, written) = four_writes();
        let last_write = written.iter().find(|r| r.2 == 3).unwrap().0 as usize;
        let records = |n: usize| -> Vec<(u64, Vec<u8>)> {
            written[..n]
                .iter()
                .map(|(l, p, _)| (*l, p.clone()))
                .collect()
        };
        let mut damages: Vec<(String, Vec<u8>)> = Vec::new();
        for at in 0..original.len() {
            for mask in [0x01u8, 0x80] {
                let mut bytes = original.clone();
                bytes[at] ^= mask;
                damages.push((format!("flip {mask:#x} at {at}"), bytes));
            }
            let mut bytes = original.clone();
            let end = (at + 4).min(bytes.len());
            bytes[at..end].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef][..end - at]);
            damages.push((format!("4 bytes over {at}"), bytes));
        }
        let (mut corrupt, mut torn, mut unharmed) = (0, 0, 0);
        for (what, bytes) in damages {
            let changed: Vec<usize> = (0..bytes.len())
                .filter(|&i| bytes[i] != original[i])
                .collect();
            let Some(&first) = changed.first() else {
                continue;
            };
            fs::write(&path, &bytes).unwrap();
            let (frame, damage) = frame_of(&written, first);
            let mark_only = changed.len() == 1
                && first as u64 == damage + 15
                && bytes[first] ^ original[first] == 0x80;
            let outcome = try_replay(dir.path());
            if mark_only {
                // Not covered by the checksum: no record changes, nothing is cut.
                let (seen, replayed) = outcome.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(seen, records(written.len()), "{what}");
                assert!(replayed.truncated.is_none(), "{what}");
                unharmed += 1;
            } else if changed.iter().all(|&i| i < last_write) {
                match outcome {
                    Err(EngineError::CorruptLog(c)) => {
                        assert_eq!(c.lsn, damage, "{what}");
                        assert!(matches!(c.evidence, Evidence::LaterWrite { .. }), "{what}");
                        assert!(c.records_after >= 3, "{what}: {c}");
                    }
                    Err(e) => panic!("{what}: {e}"),
                    Ok(_) => {
                        panic!("{what}: damage before the last write was taken for a torn tail")
                    }
                }
                assert_eq!(fs::read(&path).unwrap(), bytes, "{what}: nothing is cut");
                corrupt += 1;
            } else {
                let (seen, replayed) = outcome.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(seen, records(frame), "{what}");
                assert!(replayed.truncated.is_some(), "{what}");
                assert_eq!(replayed.files.end_lsn(), damage, "{what}");
                assert_eq!(fs::metadata(&path).unwrap().len(), damage, "{what}: cut");
                torn += 1;
            }
        }
        assert!(
            corrupt > 0 && torn > 0 && unharmed > 0,
            "{corrupt} {torn} {unharmed}"
        );
    }

    /// The last write torn by a crash: its first frame's page never reached the disk but a
    /// later frame of the same write did, or the other way round. A torn tail either way.
    #[test]
    fn a_torn_last_write_is_cut_whichever_of_its_frames_landed() {
        let (dir, path, original, written) = four_writes();
        let last: Vec<_> = written.iter().filter(|r| r.2 == 3).collect();
        for lost in 0..last.len() {
            let mut bytes = original.clone();
            let at = last[lost].0 as usize;
            let len = log::FRAME_HEADER + last[lost].1.len();
            bytes[at..at + len].fill(0);
            fs::write(&path, &bytes).unwrap();
            let (seen, replayed) = try_replay(dir.path()).unwrap();
            let kept = written.len() - last.len() + lost;
            assert_eq!(seen.len(), kept, "frame {lost} of the last write lost");
            assert_eq!(replayed.files.end_lsn(), at as u64);
            let cut = replayed.truncated.unwrap();
            if lost + 1 < last.len() {
                assert!(
                    cut.contains("valid records of that write followed"),
                    "{cut}"
                );
            }
        }
    }

    /// A log written before writes were marked (format 2): damage anywhere in its last
    /// file is cut as a torn tail, as it always was.
    #[test]
    fn a_log_without_write_marks_is_cut_at_damage_as_before() {
        let (dir, path, mut original, written) = four_writes();
        for (lsn, _, _) in &written {
            original[*lsn as usize + 15] &= 0x7f;
        }
        let mut bytes = original.clone();
        let (lsn, payload, _) = &written[4];
        bytes[*lsn as usize + log::FRAME_HEADER] ^= 1;
        assert_eq!(payload.len(), 2);
        fs::write(&path, &bytes).unwrap();
        let (seen, replayed) = try_replay(dir.path()).unwrap();
        assert_eq!(seen.len(), 4);
        assert!(replayed.truncated.is_some());
        assert_eq!(replayed.files.end_lsn(), *lsn);
    }

    /// Damage in a file that is not the last is corruption whatever follows it.
    #[test]
    fn damage_in_a_file_before_the_last_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let (_, replayed) = replay_all(dir.path());
        let mut files = replayed.files;
        let written: Vec<u64> = (0..12u8).map(|i| append(&mut files, &[i; 30])).collect();
        assert!(files.starts.len() >= 3);
        let second = files.starts[1];
        drop(files);
        let path = dir.path().join(log::file_name(0));
        let mut bytes = fs::read(&path).unwrap();
        let damaged = written[1];
        bytes[damaged as usize + log::FRAME_HEADER + 3] ^= 4;
        fs::write(&path, &bytes).unwrap();
        let err = replay(dir.path(), 0, true, 100, |_, _| Ok(()))
            .err()
            .unwrap();
        let EngineError::CorruptLog(c) = err else {
            panic!("{err}")
        };
        assert_eq!(
            (c.lsn, c.evidence.clone()),
            (damaged, Evidence::NotLastFile)
        );
        assert_eq!(
            c.later_files.len(),
            fs::read_dir(dir.path()).unwrap().count() - 1
        );
        assert!(c.later_files[0].ends_with(log::file_name(second)));
        assert_eq!(c.records_after as usize, written.len() - 2);
        assert!(c.to_string().contains("not the last log file"), "{c}");
    }

    /// Damage among records before the replay point (a checkpoint reflects them): replay
    /// goes on from the first record it needs (at `from`, or at `from - 1` when `from` is a
    /// checkpoint: one past the last record applied); where no valid frame starts there, it
    /// is corruption, and nothing is cut.
    #[test]
    fn damage_before_the_replay_point_is_skipped_or_refused_never_cut() {
        let (dir, path, original, written) = four_writes();
        let needed = |from: u64| -> Vec<(u64, Vec<u8>)> {
            written
                .iter()
                .filter(|r| r.0 >= from)
                .map(|(l, p, _)| (*l, p.clone()))
                .collect()
        };
        let replay_from = |from: u64| {
            let mut seen = Vec::new();
            replay(dir.path(), from, true, 1 << 20, |lsn, p| {
                seen.push((lsn, p.to_vec()));
                Ok(())
            })
            .map(|r| (seen, r))
        };
        let mut bytes = original.clone();
        bytes[written[2].0 as usize + log::FRAME_HEADER] ^= 1; // in the first write

        // From a record, one past a record's position (a replica's checkpoint), or the end
        // of the log (the embedded log's checkpoint after a clean close).
        let end = original.len() as u64;
        for from in [written[5].0, written[4].0 + 1, written[3].0, end] {
            fs::write(&path, &bytes).unwrap();
            let (seen, replayed) = replay_from(from).unwrap();
            assert_eq!(seen, needed(from), "from {from}");
            assert!(replayed.truncated.is_none());
            assert!(replayed.ignored.unwrap().contains("skipped"));
            assert_eq!(replayed.files.end_lsn(), original.len() as u64);
        }
        // Lost from the damaged record to past the first one needed: refused, nothing cut.
        let from = written[4].0;
        bytes[written[2].0 as usize..from as usize + 3].fill(0);
        fs::write(&path, &bytes).unwrap();
        match replay_from(from) {
            Err(EngineError::CorruptLog(c)) => {
                assert_eq!(c.lsn, written[2].0);
                assert_eq!(c.evidence, Evidence::BeforeReplayPoint { from });
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("damage before the replay point was cut"),
        }
        assert_eq!(fs::read(&path).unwrap(), bytes);
    }

    /// The repair saves every byte it cuts (and moves later files aside), then the log
    /// replays the records before the damage; a second repair finds nothing to do.
    #[test]
    fn a_repair_saves_what_it_cuts_and_the_log_reopens() {
        let (dir, path, original, written) = four_writes();
        let damaged = &written[4]; // in the second write
        let mut bytes = original.clone();
        bytes[damaged.0 as usize + log::FRAME_HEADER] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert!(matches!(
            try_replay(dir.path()),
            Err(EngineError::CorruptLog(_))
        ));

        // Not before a checkpoint that relies on the records after the damage.
        let refused = repair(dir.path(), 0, damaged.0 + 1).unwrap_err();
        assert!(refused.to_string().contains("checkpoint"), "{refused}");
        assert_eq!(
            fs::read(&path).unwrap(),
            bytes,
            "a refused repair changes nothing"
        );

        let repaired = repair(dir.path(), 0, damaged.0).unwrap().unwrap();
        assert_eq!(repaired.damage.lsn, damaged.0);
        assert_eq!(
            repaired.saved,
            dir.path().join(format!("damaged-{:020}.bin", damaged.0))
        );
        assert_eq!(
            fs::read(&repaired.saved).unwrap(),
            &bytes[damaged.0 as usize..]
        );
        assert_eq!(
            repaired.saved_bytes,
            (bytes.len() - damaged.0 as usize) as u64
        );
        assert_eq!(repaired.damage.records_after, (written.len() - 5) as u64);
        assert!(repaired.moved.is_empty());
        let note = fs::read_to_string(&repaired.note).unwrap();
        assert!(note.contains("NOT in the database"), "{note}");
        assert_eq!(fs::metadata(&path).unwrap().len(), damaged.0);

        let (seen, replayed) = try_replay(dir.path()).unwrap();
        assert_eq!(seen.len(), 4);
        assert!(replayed.truncated.is_none());
        drop(replayed);
        assert!(repair(dir.path(), 0, 0).unwrap().is_none());
        // A torn tail is not for the repair: recovery cuts it.
        let mut files = replay(dir.path(), 0, true, 1 << 20, |_, _| Ok(()))
            .unwrap()
            .files;
        let end = files.end_lsn();
        append(&mut files, &[9; 9]);
        crash(files);
        let mut bytes = fs::read(&path).unwrap();
        bytes[end as usize + log::FRAME_HEADER] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert!(repair(dir.path(), 0, 0).unwrap().is_none());
        assert_eq!(fs::read(&path).unwrap(), bytes);
    }

    #[test]
    fn a_repair_moves_the_files_after_a_damaged_one_aside() {
        let dir = tempfile::tempdir().unwrap();
        let (_, replayed) = replay_all(dir.path());
        let mut files = replayed.files;
        let written: Vec<u64> = (0..12u8).map(|i| append(&mut files, &[i; 30])).collect();
        let later: Vec<u64> = files.starts[1..].to_vec();
        drop(files);
        let path = dir.path().join(log::file_name(0));
        let mut bytes = fs::read(&path).unwrap();
        bytes[written[1] as usize + log::FRAME_HEADER] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let originals: Vec<Vec<u8>> = later
            .iter()
            .map(|s| fs::read(dir.path().join(log::file_name(*s))).unwrap())
            .collect();
        let repaired = repair(dir.path(), 0, 0).unwrap().unwrap();
        assert_eq!(repaired.moved.len(), later.len());
        for ((moved, start), contents) in repaired.moved.iter().zip(&later).zip(&originals) {
            assert!(moved.ends_with(format!("damaged-{:020}-{start:020}.bin", written[1])));
            assert_eq!(&fs::read(moved).unwrap(), contents);
            assert!(!dir.path().join(log::file_name(*start)).exists());
        }
        let mut seen = Vec::new();
        let replayed = replay(dir.path(), 0, true, 100, |lsn, _| {
            seen.push(lsn);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, [written[0]]);
        assert_eq!(replayed.files.end_lsn(), written[1]);
    }

    #[test]
    fn a_rolled_file_longer_than_its_records_is_read_to_the_next_start() {
        let (dir, files, written) = log_with(12, |i| vec![i; 30]);
        let first = dir.path().join(log::file_name(0));
        // What a reused file that rolled before its old end looks like.
        let mut bytes = fs::read(&first).unwrap();
        bytes.extend_from_slice(&framed(bytes.len() as u64, b"never part of the log"));
        fs::write(&first, &bytes).unwrap();
        drop(files);
        let (seen, replayed) = replay_all(dir.path());
        assert_eq!(seen, written);
        assert!(replayed.truncated.is_none());

        // A rolled file that ends before its successor starts is a gap.
        let mut files = replayed.files;
        files
            .write(files.end_lsn(), &[framed(files.end_lsn(), &[9; 30])])
            .unwrap();
        drop(files);
        let len = written[1].0;
        let short = fs::OpenOptions::new().write(true).open(&first).unwrap();
        short.set_len(len).unwrap();
        let err = replay(dir.path(), 0, true, 100, |_, _| Ok(()))
            .err()
            .unwrap();
        assert!(err.to_string().contains("gap"), "{err}");
    }

    #[derive(Debug, Clone)]
    enum Step {
        Append(Vec<u8>),
        /// Several records written with one write, as a group commit writes them.
        Group(Vec<Vec<u8>>),
        /// Releases the files before the record at this index (modulo their number).
        Release(usize),
        Reopen,
        /// The process dies while these bytes are being written after the log's end.
        CrashWhileWriting(Vec<u8>),
        /// The process dies while a group is being written: all of it reaches the disk but
        /// the bytes at (offset, length) (modulo the group's size), where the file keeps
        /// what it held before.
        CrashInGroup(Vec<Vec<u8>>, usize, usize),
        /// A bit flips in a record (picked modulo their number) that a later write follows,
        /// at a byte of its frame (modulo its size): the log must refuse to open.
        Flip(usize, usize, u8),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        let payload = || proptest::collection::vec(any::<u8>(), 1..70);
        prop_oneof![
            6 => payload().prop_map(Step::Append),
            3 => proptest::collection::vec(payload(), 1..5).prop_map(Step::Group),
            2 => any::<usize>().prop_map(Step::Release),
            1 => Just(Step::Reopen),
            1 => proptest::collection::vec(any::<u8>(), 1..90).prop_map(Step::CrashWhileWriting),
            1 => (1usize..90).prop_map(|n| Step::CrashWhileWriting(vec![0; n])),
            2 => (proptest::collection::vec(payload(), 1..5), any::<usize>(), 1usize..200)
                .prop_map(|(group, at, len)| Step::CrashInGroup(group, at, len)),
            2 => (any::<usize>(), any::<usize>(), any::<u8>())
                .prop_map(|(record, at, bit)| Step::Flip(record, at, bit)),
        ]
    }

    /// The frames of `group`, the first at `start`, as one write puts them on disk.
    fn group_bytes(start: u64, group: &[Vec<u8>]) -> (Vec<u8>, Vec<(u64, Vec<u8>)>) {
        let (mut bytes, mut records) = (Vec::new(), Vec::new());
        for payload in group {
            let lsn = start + bytes.len() as u64;
            bytes.extend_from_slice(&framed(lsn, payload));
            records.push((lsn, payload.clone()));
        }
        log::mark_starts_write(&mut bytes);
        (bytes, records)
    }

    /// Every log file of `dir` and its bytes.
    fn log_contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut files: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| log::parse_file_name(p).is_some())
            .map(|p| {
                let bytes = fs::read(&p).unwrap();
                (p, bytes)
            })
            .collect();
        files.sort();
        files
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Against a model (the records written, in order, and the write each was in):
        /// whatever rolls, releases, reuse of released files, reopens, crashes mid-write
        /// (garbage after the end, or a group write with a part that never reached the
        /// disk) happen, the log replays exactly the records written since the release
        /// point, ends where they do, and is never taken for corrupt. A bit flipped in a
        /// record that a later write follows is always refused as corruption, with nothing
        /// cut.
        #[test]
        fn replay_returns_exactly_what_was_written(steps in proptest::collection::vec(step(), 1..80)) {
            use std::os::unix::fs::FileExt;
            let dir = tempfile::tempdir().unwrap();
            let mut files = replay(dir.path(), 0, false, 128, |_, _| Ok(())).unwrap().files;
            // (LSN, payload, the write it was in)
            let mut model: Vec<(u64, Vec<u8>, usize)> = Vec::new();
            let mut writes = 0usize;
            let mut from = 0;
            for step in steps {
                let mut crashed = false;
                match step {
                    Step::Append(payload) => {
                        model.push((append(&mut files, &payload), payload, writes));
                        writes += 1;
                        continue;
                    }
                    Step::Group(group) => {
                        let (bytes, records) = group_bytes(files.end_lsn(), &group);
                        files.write(files.end_lsn(), &[bytes]).unwrap();
                        model.extend(records.into_iter().map(|(l, p)| (l, p, writes)));
                        writes += 1;
                        continue;
                    }
                    Step::Release(i) => {
                        if let Some((lsn, _, _)) = model.get(i % model.len().max(1)) {
                            from = from.max(*lsn);
                            files.release_before(from).unwrap();
                        }
                        continue;
                    }
                    Step::Reopen => drop(files),
                    Step::CrashWhileWriting(bytes) => {
                        let (end, last) = (files.end_lsn(), *files.starts.last().unwrap());
                        crash(files);
                        let path = dir.path().join(log::file_name(last));
                        let file = fs::OpenOptions::new().write(true).open(path).unwrap();
                        file.write_all_at(&bytes, end - last).unwrap();
                        crashed = true;
                    }
                    Step::CrashInGroup(group, at, len) => {
                        let start = files.end_lsn();
                        let (bytes, records) = group_bytes(start, &group);
                        let mut hole = at % bytes.len();
                        if hole < log::FRAME_HEADER {
                            // A page holds a header whole or not at all: a first frame
                            // whose write mark alone is missing cannot happen.
                            hole = 0;
                        }
                        let hole = hole..(hole + len).min(bytes.len());
                        // Written (and rolled) as the writer does, then what the file held
                        // before comes back where the lost part is.
                        let rolls = files.current_len >= files.roll_bytes;
                        let before = if rolls {
                            None
                        } else {
                            let path = dir.path().join(log::file_name(*files.starts.last().unwrap()));
                            let mut old = vec![0; hole.len()];
                            let file = File::open(path).unwrap();
                            let mut got = 0;
                            while got < old.len() {
                                match file.read_at(&mut old[got..], files.current_len + (hole.start + got) as u64) {
                                    Ok(0) | Err(_) => break,
                                    Ok(n) => got += n,
                                }
                            }
                            Some(old)
                        };
                        files.write(start, std::slice::from_ref(&bytes)).unwrap();
                        let (last, end) = (*files.starts.last().unwrap(), files.end_lsn());
                        crash(files);
                        let path = dir.path().join(log::file_name(last));
                        let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
                        let old = before.unwrap_or_else(|| vec![0; hole.len()]);
                        file.write_all_at(&old, start - last + hole.start as u64).unwrap();
                        // The frames before the first one that did not land whole stay.
                        let on_disk = fs::read(&path).unwrap();
                        let on_disk = &on_disk[(start - last) as usize..(end - last) as usize];
                        let mut kept = 0;
                        for (lsn, payload) in &records {
                            let at = (lsn - start) as usize;
                            let len = log::FRAME_HEADER + payload.len();
                            let mut want = bytes[at..at + len].to_vec();
                            let mut got = on_disk[at..at + len].to_vec();
                            want[15] &= 0x7f;
                            got[15] &= 0x7f;
                            if want != got {
                                break;
                            }
                            kept += 1;
                        }
                        model.extend(records.into_iter().take(kept).map(|(l, p)| (l, p, writes)));
                        writes += 1;
                        crashed = true;
                    }
                    Step::Flip(record, at, bit) => {
                        let last_write = model.last().map(|r| r.2);
                        let candidates: Vec<_> = model
                            .iter()
                            .filter(|r| r.0 >= from && Some(r.2) != last_write)
                            .collect();
                        if candidates.is_empty() {
                            continue;
                        }
                        let (lsn, payload, _) = (*candidates[record % candidates.len()]).clone();
                        let starts = files.starts.clone();
                        drop(files);
                        let file_start = starts[starts.partition_point(|&s| s <= lsn) - 1];
                        let path = dir.path().join(log::file_name(file_start));
                        let offset = at % (log::FRAME_HEADER + payload.len());
                        let mask = match 1u8 << (bit % 8) {
                            0x80 if offset == 15 => 0x40, // the write mark: not damage
                            mask => mask,
                        };
                        let byte = lsn - file_start + offset as u64;
                        let flip = |path: &Path| {
                            let file = fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
                            let mut b = [0u8];
                            file.read_exact_at(&mut b, byte).unwrap();
                            file.write_all_at(&[b[0] ^ mask], byte).unwrap();
                        };
                        flip(&path);
                        let damaged = log_contents(dir.path());
                        match replay(dir.path(), from, true, 128, |_, _| Ok(())) {
                            Err(EngineError::CorruptLog(c)) => proptest::prop_assert_eq!(c.lsn, lsn),
                            Err(e) => proptest::prop_assert!(false, "{}", e),
                            Ok(_) => proptest::prop_assert!(false, "a flip at LSN {} + {} was taken for a torn tail", lsn, offset),
                        }
                        proptest::prop_assert!(log_contents(dir.path()) == damaged, "nothing is cut");
                        flip(&path);
                    }
                }
                let expected: Vec<_> = model
                    .iter()
                    .filter(|(l, _, _)| *l >= from)
                    .map(|(l, p, _)| (*l, p.clone()))
                    .collect();
                let end = model.last().map_or(0, |(l, p, _)| l + (log::FRAME_HEADER + p.len()) as u64);
                let mut seen = Vec::new();
                let replayed = replay(dir.path(), from, true, 128, |lsn, p| {
                    seen.push((lsn, p.to_vec()));
                    Ok(())
                });
                let replayed = replayed
                    .map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
                proptest::prop_assert_eq!(seen, expected);
                proptest::prop_assert_eq!(replayed.files.end_lsn(), end);
                // Only a crash leaves anything to cut.
                proptest::prop_assert!(crashed || replayed.truncated.is_none());
                files = replayed.files;
            }
        }
    }
}

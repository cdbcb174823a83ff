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
//! A failed write or fsync poisons the log: the kernel may have dropped the dirty pages, so
//! nothing after that point can be acknowledged until the database is reopened and replays
//! what actually reached the disk.

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
use tidemark_storage::fsutil::sync_dir;
use tidemark_storage::log::{self, FrameEnd};
use tidemark_storage::StorageError;

use crate::error::{EngineError, Result};
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
    /// to `apply` in LSN order, completes its records, and goes on until
    /// [`Wal::shut_down`] (after writing what was queued before it). Run it on a thread of
    /// its own; `apply` is never run concurrently with itself.
    pub fn run_writer(&self, apply: impl Fn(Vec<(u64, T)>)) {
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
                apply(items);
            }
            writing.armed = false;
            let mut q = self.queue();
            q.written_lsn = end;
            match outcome {
                Ok(_) => {
                    q.durable_lsn = end;
                    drop(q);
                    for (lsn, done) in waiters {
                        // A waiter that gave up (its task was dropped) needs no answer.
                        let _ = done.send(Ok(lsn));
                    }
                }
                Err(e) => {
                    let failure = e.to_string();
                    q.failure = Some(failure.clone());
                    drop(q);
                    fail(waiters, &failure);
                }
            }
        }
    }

    /// Stops the log writer once it has written everything queued so far; later records
    /// are refused with [`EngineError::Closed`].
    pub fn shut_down(&self) {
        self.queue().shut_down = true;
        self.queued.notify_all();
    }

    /// Writes and fsyncs `frames`, returning how long the fsync took.
    fn write(&self, start: u64, frames: &[Vec<u8>]) -> Result<Duration, StorageError> {
        let mut files = self.files.lock().ignore_poison();
        files.write(start, frames)
    }

    /// Why the log refuses writes, once a write or fsync has failed (until reopened).
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
}

/// The name a released log file waits under until it becomes the next one. Not a log
/// file's name ([`log::parse_file_name`] refuses it), so readers of the log never see it.
pub const SPARE_FILE: &str = "spare.log-recycled";

impl LogFiles {
    /// The position after the last byte written.
    pub fn end_lsn(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0) + self.current_len
    }

    /// Appends `frames` (whose first byte belongs at `start`, the current end) and fsyncs
    /// them; returns how long the fsync took. A frame may come in several parts, one after
    /// the other in `frames`: only the bytes count here.
    pub fn write<B: AsRef<[u8]>>(
        &mut self,
        start: u64,
        frames: &[B],
    ) -> Result<Duration, StorageError> {
        if start != self.end_lsn() {
            return Err(StorageError::corrupt(
                "log",
                format!("write at LSN {start}, the log ends at {}", self.end_lsn()),
            ));
        }
        if self.current_len >= self.roll_bytes {
            self.roll(start)?;
        }
        let path = self.current_path();
        write_all_vectored(&mut self.current, frames)
            .map_err(|e| StorageError::io("write", &path, e))?;
        let fsync_started = Instant::now();
        self.current
            .sync_data()
            .map_err(|e| StorageError::io("fsync", &path, e))?;
        let fsync = fsync_started.elapsed();
        self.current_len += frames.iter().map(|f| f.as_ref().len() as u64).sum::<u64>();
        Ok(fsync)
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

    /// Releases the files that hold only bytes before `lsn`: the first becomes the spare
    /// if there is none, the others are deleted.
    pub fn release_before(&mut self, lsn: u64) -> Result<(), StorageError> {
        let mut released = 0;
        while self.starts.len() > 1 && self.starts[1] <= lsn {
            let path = self.dir.join(log::file_name(self.starts[0]));
            if self.spare {
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
}

/// Reads every record at or after `from` in order, calling `visit(lsn, payload)`, cuts the
/// last file at its last valid record, and opens the log for writing after it.
///
/// A damaged record anywhere but in the last file is corruption, not a torn write (files
/// are only rolled after everything before was fsync'd), and fails the open. A rolled file
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
    mut visit: impl FnMut(u64, &[u8]) -> Result<()>,
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
            },
            truncated: None,
        });
    }
    let corrupt = |detail: String| EngineError::Storage(StorageError::corrupt("log", detail));
    // Files wholly before `from` are left for release; replay starts in the file holding it.
    let first = starts.iter().rposition(|&s| s <= from).ok_or_else(|| {
        corrupt(format!(
            "replay must start at LSN {from} but the oldest log file starts at {}",
            starts[0]
        ))
    })?;
    let mut truncated = None;
    let mut end = starts[first];
    for (i, &start) in starts.iter().enumerate().skip(first) {
        if start != end {
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
        let (frames, how) = log::read_frames(log_bytes, start);
        for (lsn, payload) in frames {
            if lsn >= from {
                visit(lsn, payload)?;
            }
        }
        let valid = match how {
            FrameEnd::Clean => log_bytes.len(),
            FrameEnd::Torn { valid_len, reason } => {
                if next.is_some() {
                    return Err(corrupt(format!(
                        "{} is damaged at byte {valid_len} ({reason}) and is not the last log file",
                        path.display()
                    )));
                }
                // Cut, not just written over: bytes of a lost write may hide a whole frame
                // of that write further on, which a shorter write here would bring back.
                cut_file(&path, valid_len as u64)?;
                truncated = Some(format!(
                    "cut {} from LSN {} on: {} bytes after the last valid record, the unfinished \
                     write of a crash or the old contents of a reused file ({reason})",
                    path.display(),
                    start + valid_len as u64,
                    bytes.len() - valid_len,
                ));
                valid_len
            }
        };
        end = start + valid as u64;
    }
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
        },
        truncated,
    })
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
        apply: impl Fn(Vec<(u64, T)>) + Send,
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
            |group| applied.lock().unwrap().extend(group),
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
    fn a_panicking_apply_poisons_the_log_instead_of_hanging_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_, replayed) = replay_all(dir.path());
        let wal = Wal::new(replayed.files);
        assert_eq!(wal.failure(), None);
        with_writer(
            &wal,
            |_| panic!("apply failed"),
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
            |_| {},
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
            |_| {},
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
        with_writer(&wal, |_| {}, || wal.commit(frame(&[9; 10]), ()).unwrap());
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
        let lost = append(&mut files, &[1; 20]);
        append(&mut files, &[2; 20]); // reached the disk, the write before it did not
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
        /// Releases the files before the record at this index (modulo their number).
        Release(usize),
        Reopen,
        /// The process dies while these bytes are being written after the log's end.
        CrashWhileWriting(Vec<u8>),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            6 => proptest::collection::vec(any::<u8>(), 1..70).prop_map(Step::Append),
            2 => any::<usize>().prop_map(Step::Release),
            1 => Just(Step::Reopen),
            1 => proptest::collection::vec(any::<u8>(), 1..90).prop_map(Step::CrashWhileWriting),
            1 => (1usize..90).prop_map(|n| Step::CrashWhileWriting(vec![0; n])),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Against a model (the records written, in order): whatever rolls, releases,
        /// reuse of released files, reopens and crashes mid-write happen, the log replays
        /// exactly the records written since the release point, and ends where they do.
        #[test]
        fn replay_returns_exactly_what_was_written(steps in proptest::collection::vec(step(), 1..80)) {
            use std::os::unix::fs::FileExt;
            let dir = tempfile::tempdir().unwrap();
            let mut files = replay(dir.path(), 0, false, 128, |_, _| Ok(())).unwrap().files;
            let mut model: Vec<(u64, Vec<u8>)> = Vec::new();
            let mut from = 0;
            for step in steps {
                match step {
                    Step::Append(payload) => model.push((append(&mut files, &payload), payload)),
                    Step::Release(i) => {
                        if let Some((lsn, _)) = model.get(i % model.len().max(1)) {
                            from = from.max(*lsn);
                            files.release_before(from).unwrap();
                        }
                    }
                    Step::Reopen | Step::CrashWhileWriting(_) => {
                        let end = files.end_lsn();
                        let last = *files.starts.last().unwrap();
                        let crashed = matches!(step, Step::CrashWhileWriting(_));
                        if crashed {
                            crash(files);
                        } else {
                            drop(files);
                        }
                        if let Step::CrashWhileWriting(bytes) = &step {
                            let path = dir.path().join(log::file_name(last));
                            let file = fs::OpenOptions::new().write(true).open(path).unwrap();
                            file.write_all_at(bytes, end - last).unwrap();
                        }
                        let mut seen = Vec::new();
                        let replayed = replay(dir.path(), from, true, 128, |lsn, p| {
                            seen.push((lsn, p.to_vec()));
                            Ok(())
                        })
                        .unwrap();
                        let expected: Vec<_> =
                            model.iter().filter(|(l, _)| *l >= from).cloned().collect();
                        proptest::prop_assert_eq!(seen, expected);
                        proptest::prop_assert_eq!(replayed.files.end_lsn(), end);
                        // Only a crash leaves anything to cut.
                        proptest::prop_assert!(crashed || replayed.truncated.is_none());
                        files = replayed.files;
                    }
                }
            }
        }
    }
}

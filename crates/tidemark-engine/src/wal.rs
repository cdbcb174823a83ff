//! The write-ahead log: one shared log per database, written with group commit.
//!
//! Every change is a record queued here with [`Wal::submit`], which assigns its LSN at once
//! and returns a [`Completion`]. One thread, the log writer ([`Wal::run_writer`]), takes
//! everything queued so far, writes it with one `writev` and one `fdatasync`, applies it in
//! LSN order, and completes every record it covered; records queued meanwhile form the next
//! group. So N concurrent appends to any number of streams cost one fsync, not N — and an
//! appender waits for its fsync without holding a thread: a completion is awaited in an
//! async task, or waited for on a thread ([`Completion::wait`]). The queue and its writer
//! are the storage layer's ([`GroupCommit`], which a cluster node's Raft log is written
//! through too); this module gives them the database's terms: its errors, completions, and
//! the marks behind which log files are released.
//!
//! A failed *write* (the disk is full, a quota is reached) is undone: the file is cut back
//! to where the group began, the group's records are refused as retryable, and the log
//! takes the next group — so writes resume by themselves once space returns. A failed
//! fsync, or a write that cannot be undone, poisons the log: the kernel may have dropped
//! the dirty pages, so nothing after that point can be acknowledged until the database is
//! reopened and replays what actually reached the disk.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use futures_channel::oneshot;
use tidemark_core::sync::IgnorePoison;
use tidemark_storage::group_commit::{Ack, GroupCommit, OnUndone, Refused};
use tidemark_storage::log_files::LogFiles;
use tidemark_storage::log_stats::LogStats;
use tidemark_storage::pace::WritePace;
use tidemark_storage::StorageError;

use crate::error::{EngineError, Result};

pub(crate) use tidemark_storage::log_read::{count_records, read_records, LoggedRecord};
pub(crate) use tidemark_storage::replay::{repair, replay, RepairedLog};

/// Queues records for the log writer, which writes them in groups and applies each group
/// in order.
pub struct Wal<T> {
    log: GroupCommit<Vec<u8>, T, Waiter>,
    marks: Mutex<ReleaseMarks>,
    /// Held while files behind the marks are deleted, outside `marks` (a spool's appenders
    /// read the marks for every append, and a paced deletion takes seconds).
    deleting: Mutex<()>,
}

/// Log files are deleted only behind both marks: what checkpoints reflect, and where a
/// reader of the log itself still reads (a spool's forwarder; nowhere otherwise).
struct ReleaseMarks {
    checkpointed: u64,
    held_from: u64,
}

/// Where the log writer answers a record: its [`Completion`]'s other end.
struct Waiter(oneshot::Sender<Result<u64>>);

impl Ack for Waiter {
    fn done(self, outcome: Result<u64, Refused>) {
        let outcome = outcome.map_err(|refused| match refused {
            Refused::Undone(why) => EngineError::LogWriteUndone(why),
            Refused::Failed(why) => EngineError::LogFailed(why),
            Refused::ShutDown => EngineError::Closed,
        });
        // A waiter that gave up (its task was dropped) needs no answer.
        let _ = self.0.send(outcome);
    }
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
        Wal {
            log: GroupCommit::new(files, OnUndone::TakeBack),
            marks: Mutex::new(ReleaseMarks {
                checkpointed: 0,
                held_from: u64::MAX,
            }),
            deleting: Mutex::new(()),
        }
    }

    /// The LSN the next record will get: every record before it is durable or queued.
    pub fn end_lsn(&self) -> u64 {
        self.log.end_lsn()
    }

    /// Queues one record, a frame finished with [`tidemark_storage::log::end_frame`],
    /// behind every record queued before it, and returns its completion. Only the LSN is
    /// written under the queue lock; the frame itself is never copied.
    pub fn submit(&self, frame: Vec<u8>, item: T) -> Result<Completion> {
        let (done, completion) = oneshot::channel();
        match self.log.submit([(frame, item)], Waiter(done)) {
            Ok(_) => Ok(Completion(completion)),
            Err(Refused::ShutDown) => Err(EngineError::Closed),
            Err(refused) => Err(EngineError::LogFailed(refused.to_string())),
        }
    }

    /// [`Wal::submit`], then waits for the record on this thread.
    #[cfg(test)]
    pub fn commit(&self, frame: Vec<u8>, item: T) -> Result<u64> {
        self.submit(frame, item)?.wait()
    }

    /// The log writer: writes and fsyncs whatever is queued as one group, passes the group
    /// to `apply` in LSN order (with the LSN right after it), completes its records, and
    /// goes on until [`Wal::shut_down`] (after writing what was queued before it). Run it on
    /// a thread of its own; `apply` is never run concurrently with itself.
    pub fn run_writer(&self, apply: impl Fn(Vec<(u64, T)>, u64)) {
        self.log.run_writer(apply)
    }

    /// Stops the log writer once it has written everything queued so far; later records
    /// are refused with [`EngineError::Closed`].
    pub fn shut_down(&self) {
        self.log.shut_down()
    }

    /// Why the log refuses writes, once an fsync (or a write that could not be undone)
    /// has failed (until reopened).
    pub fn failure(&self) -> Option<String> {
        self.log.failure()
    }

    /// The log's counters since it was opened.
    pub fn stats(&self) -> LogStats {
        self.log.stats()
    }

    /// Everything before this LSN is written and fsync'd (and applied).
    pub fn durable_lsn(&self) -> u64 {
        self.log.durable_lsn()
    }

    /// Notes that checkpoints reflect every record before `lsn`, and deletes the log files
    /// that hold only records before it and before the hold ([`Wal::hold_from`]), their
    /// blocks freed at `pace` (the checkpoint's: deleting is a background write too).
    pub fn release_before(&self, lsn: u64, pace: &WritePace) -> Result<(), StorageError> {
        self.move_marks(
            |marks| marks.checkpointed = marks.checkpointed.max(lsn),
            pace,
        )
    }

    /// Keeps the records from `lsn` on even once checkpoints reflect them, for a reader of
    /// the log itself; deletes the files wholly before both marks. The hold only moves
    /// forward.
    pub fn hold_from(&self, lsn: u64) -> Result<(), StorageError> {
        let hold = |marks: &mut ReleaseMarks| {
            marks.held_from = if marks.held_from == u64::MAX {
                lsn
            } else {
                marks.held_from.max(lsn)
            }
        };
        // A spool's forwarder: nothing it deletes is paced.
        self.move_marks(hold, &WritePace::default())
    }

    /// The first LSN the log's files still hold.
    pub fn first_lsn(&self) -> u64 {
        self.log.first_lsn()
    }

    /// Where the hold is ([`Wal::hold_from`]; `u64::MAX`: none).
    pub fn held_from(&self) -> u64 {
        self.marks.lock().ignore_poison().held_from
    }

    fn move_marks(
        &self,
        change: impl FnOnce(&mut ReleaseMarks),
        pace: &WritePace,
    ) -> Result<(), StorageError> {
        {
            let mut marks = self.marks.lock().ignore_poison();
            let before = (marks.checkpointed, marks.held_from);
            change(&mut marks);
            assert!(
                marks.checkpointed >= before.0
                    && (before.1 == u64::MAX || marks.held_from >= before.1),
                "release marks only move forward"
            );
        }
        // One deletion at a time, behind the marks as they are once it starts. A move made
        // while another deletes leaves its files to the next move (a checkpoint, the
        // forwarder's next step): kept a little longer, never lost, and nobody waits.
        let _deleting = match self.deleting.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
        };
        let release = {
            let marks = self.marks.lock().ignore_poison();
            marks.checkpointed.min(marks.held_from)
        };
        self.log.release_before(release, pace)
    }
}

/// The log a database's state is fed from, as the database sees it once a command is in
/// it: the embedded write-ahead log (`Wal`) or a replica's cluster's Raft log (which the
/// cluster writes, and which openraft replays after a restart). The database tells it what
/// its checkpoints cover and reports what it says of itself.
pub trait CommandLog: Send + Sync {
    /// Every position before `position` is reflected in a durable checkpoint: records
    /// before it will never be read again. What it deletes is paced at `pace`.
    fn checkpointed(&self, position: u64, pace: &WritePace) -> Result<(), StorageError>;
    /// Group commits, records, bytes and fsync latencies since the log was opened.
    fn stats(&self) -> LogStats;
    /// Why the log refuses writes, once a write or fsync failed (until restart).
    fn failure(&self) -> Option<String>;
}

impl<T: Send> CommandLog for Wal<T> {
    /// Deletes the log files that hold only records before `position`.
    fn checkpointed(&self, position: u64, pace: &WritePace) -> Result<(), StorageError> {
        self.release_before(position, pace)
    }

    fn stats(&self) -> LogStats {
        Wal::stats(self)
    }

    fn failure(&self) -> Option<String> {
        Wal::failure(self)
    }
}

#[cfg(test)]
mod tests {
    use std::fs::{self, File};
    use std::io::Write;
    use std::path::Path;

    use tidemark_storage::log;
    use tidemark_storage::replay::Replayed;

    use super::*;

    /// [`tidemark_storage::replay::replay`] with the errors of an open.
    fn replay(
        dir: &Path,
        from: u64,
        expect_files: bool,
        roll_bytes: u64,
        visit: impl FnMut(u64, &[u8]) -> Result<(), crate::OpenError>,
    ) -> Result<Replayed, crate::OpenError> {
        tidemark_storage::replay::replay(dir, from, expect_files, roll_bytes, visit)
    }

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
        wal.release_before(applied[50].0, &WritePace::default())
            .unwrap();
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
        replayed
            .files
            .fail_next_write(Box::new(move |file: &mut File| {
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
        replayed.files.fail_next_write(Box::new(|_: &mut File| {
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
}

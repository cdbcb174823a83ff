//! Group commit: the one queue through which a log is written, whoever owns it (a
//! database's write-ahead log, a cluster node's Raft log).
//!
//! Writers queue frames with [`GroupCommit::submit`], which gives each its LSN at once (its
//! place in the log) and is told through an [`Ack`] when the frames are durable. One
//! thread, the log writer ([`GroupCommit::run_writer`]), takes everything queued so far,
//! writes it with one `writev` and one `fdatasync` ([`LogFiles::write`]), hands the group's
//! items to the owner in LSN order, and only then acknowledges it; what is queued meanwhile
//! forms the next group. So N concurrent writers cost one fsync, not N. Truncations and
//! releases queue behind the writes before them and run in that order; a released file is
//! deleted by a second thread, the deleter ([`GroupCommit::run_deleter`]), so that no group
//! waits for the disk to free its blocks.
//!
//! A write that fails is either undone or fatal. One that failed before its fsync (a full
//! disk, a quota) is cut back by [`LogFiles::write`]; the queue then takes its LSNs back,
//! refuses its writers as retryable, and takes the next group ([`OnUndone::TakeBack`]), or
//! (for an owner that cannot move LSNs it has handed out) fails the log
//! ([`OnUndone::Fail`]). A failed fsync, or a write that cannot be undone, fails the log: the
//! kernel may have dropped the dirty pages, so nothing after that point is acknowledged
//! until the log is reopened and replays what actually reached the disk. The failure is
//! recorded in one place, [`GroupCommit::failure`].
//!
//! Must never know about: what a record says or what applying it means (the owner's
//! `apply` and [`Ack`] decide), async runtimes, Raft.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tidemark_core::sync::IgnorePoison;

use crate::log;
use crate::log_files::{LogFiles, LogWriteError, Released};
use crate::log_stats::{LogCounters, LogStats};
use crate::pace::WritePace;
use crate::StorageError;

/// A finished log frame ([`log::end_frame`]) as it waits in the queue: its header and the
/// start of its payload in one buffer, and possibly the rest of the payload in another
/// (written from there, so that a large payload is never copied into the frame).
pub trait Framed {
    /// The frame header, then as much of the payload as shares its buffer.
    fn head(&self) -> &[u8];
    fn head_mut(&mut self) -> &mut [u8];
    /// The rest of the payload; empty when `head` holds the whole frame.
    fn tail(&self) -> &[u8] {
        &[]
    }
}

impl Framed for Vec<u8> {
    fn head(&self) -> &[u8] {
        self
    }

    fn head_mut(&mut self) -> &mut [u8] {
        self
    }
}

fn frame_len(frame: &impl Framed) -> u64 {
    (frame.head().len() + frame.tail().len()) as u64
}

/// Told once how a submission (or a truncation) ended. Dropped without being told only if
/// the log writer unwinds from a panic while it holds it.
pub trait Ack {
    /// `Ok(lsn)`: durable from `lsn` (the submission's first frame, or where the log was
    /// cut) on; for a submission, after its items were applied.
    fn done(self, outcome: Result<u64, Refused>);
}

/// Why the log did not take a submission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The write failed before its fsync (a full disk, a quota) and was undone: nothing of
    /// it is in the log, which takes the next write. The same submission may succeed once
    /// space returns.
    #[error("{0}")]
    Undone(String),
    /// The log failed (an fsync, or a write that could not be undone): it acknowledges
    /// nothing more until it is reopened and recovered.
    #[error("{0}")]
    Failed(String),
    /// The log was shut down before the submission.
    #[error("the log is shut down")]
    ShutDown,
}

/// What a write that was undone ([`LogWriteError::Undone`]) does to the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUndone {
    /// The queue takes the group's LSNs back: submissions queued after it move down to
    /// follow what is really written, and the log goes on.
    TakeBack,
    /// The log fails, as for a failed fsync: for an owner that keeps the LSNs it was
    /// given (a Raft log's index of its entries). Such a log may be truncated through the
    /// queue; one that takes back may not (a truncation would have to move too).
    Fail,
}

/// The queue and its writer. `F`: a frame; `T`: what the owner applies once its frame is
/// durable; `A`: whom to tell.
pub struct GroupCommit<F, T, A> {
    queue: Mutex<Queue<F, T, A>>,
    /// Signalled when something is queued or the log shuts down.
    queued: Condvar,
    /// Signalled when the writer hands files to the deleter, or returns.
    detached_ready: Condvar,
    files: Mutex<LogFiles>,
    counters: LogCounters,
    on_undone: OnUndone,
}

struct Queue<F, T, A> {
    /// The LSN the next frame gets.
    next_lsn: u64,
    /// Where the next group starts: everything before it is written (or failed).
    written_lsn: u64,
    /// Everything before it is written and fsync'd.
    durable_lsn: u64,
    /// What waits for the writer, in the order it was asked for.
    ops: Vec<Op<F, T, A>>,
    /// Why the log refuses everything, once it failed.
    failure: Option<String>,
    shut_down: bool,
    /// Files the writer released, oldest first, for the deleter.
    detached: Option<Released>,
    /// The writer has returned: the deleter returns once `detached` is empty.
    writer_done: bool,
}

enum Op<F, T, A> {
    /// A frame at its LSN, and what to apply once it is durable.
    Append { lsn: u64, frame: F, item: T },
    /// The end of a submission: its frames (from `lsn` to `end`) come right before it.
    Ack { lsn: u64, end: u64, ack: A },
    /// Cut the log back to end at `lsn`.
    Truncate { lsn: u64, ack: A },
    /// Release the files wholly before `before` ([`LogFiles::detach_released`]), for the
    /// deleter to delete.
    Release { before: u64 },
}

impl<F, T, A> Op<F, T, A> {
    /// Whether the op is part of a group (frames and their acks), not a step of its own.
    fn in_group(&self) -> bool {
        matches!(self, Op::Append { .. } | Op::Ack { .. })
    }
}

/// What the writer takes from the queue at once: a group, or one step after it.
struct Taken<F, T, A> {
    /// Where the log was written to when it was taken.
    start: u64,
    ops: Vec<Op<F, T, A>>,
    failure: Option<String>,
}

/// A group of submissions, checked to lie from `start` to `end` with no gap or overlap.
struct Group<F, T, A> {
    start: u64,
    end: u64,
    frames: Vec<F>,
    items: Vec<(u64, T)>,
    /// Each submission's first LSN, its end, and whom to tell.
    acks: Vec<(u64, u64, A)>,
}

impl<F: Framed, T, A> Group<F, T, A> {
    /// The group of `ops`, which the writer took at `start`: each frame sits where its LSN
    /// says, the next right after it, and each submission's ack follows its frames.
    /// (Replay rejects a frame whose LSN is not its place; this keeps such a frame from
    /// being written.)
    fn of(start: u64, ops: Vec<Op<F, T, A>>) -> Group<F, T, A> {
        let mut group = Group {
            start,
            end: start,
            frames: Vec::with_capacity(ops.len()),
            items: Vec::with_capacity(ops.len()),
            acks: Vec::new(),
        };
        for op in ops {
            match op {
                Op::Append { lsn, frame, item } => {
                    assert_eq!(lsn, group.end, "a frame's LSN is not its place in the log");
                    debug_assert_eq!(
                        log::frame_lsn(frame.head()),
                        lsn,
                        "a queued frame carries its LSN"
                    );
                    group.end += frame_len(&frame);
                    group.frames.push(frame);
                    group.items.push((lsn, item));
                }
                Op::Ack { lsn, end, ack } => {
                    assert_eq!(
                        end, group.end,
                        "a submission is acknowledged after its frames"
                    );
                    assert!(lsn <= end, "a submission ends after it starts");
                    group.acks.push((lsn, end, ack));
                }
                Op::Truncate { .. } | Op::Release { .. } => {
                    unreachable!("a truncation or release is a step of its own")
                }
            }
        }
        group
    }
}

impl<F, T, A> Queue<F, T, A> {
    /// Why a new submission is refused, if it is.
    fn refusal(&self) -> Option<Refused> {
        match (&self.failure, self.shut_down) {
            (Some(failure), _) => Some(Refused::Failed(failure.clone())),
            (None, true) => Some(Refused::ShutDown),
            (None, false) => None,
        }
    }
}

impl<F: Framed, T, A> Queue<F, T, A> {
    /// Gives the log back the LSNs `start..end` of a group whose write was undone: the
    /// submissions queued after it move down to follow what is really written, so that the
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
        for op in &mut self.ops {
            match op {
                Op::Append { lsn, frame, .. } => {
                    assert!(*lsn >= end, "a frame queued after the group sits after it");
                    *lsn -= shift;
                    log::set_frame_lsn(frame.head_mut(), *lsn);
                }
                Op::Ack {
                    lsn, end: until, ..
                } => {
                    assert!(
                        *lsn >= end,
                        "a submission queued after the group sits after it"
                    );
                    *lsn -= shift;
                    *until -= shift;
                }
                Op::Truncate { .. } => {
                    unreachable!("a log that takes back undone writes is never truncated")
                }
                Op::Release { .. } => {}
            }
        }
        self.next_lsn -= shift;
    }

    /// Fails the log: from now on everything is refused with `failure`.
    fn fail(&mut self, failure: &str) {
        if self.failure.is_none() {
            tracing::error!(error = %failure, "a log failed; it acknowledges nothing more until reopened");
        }
        self.failure.get_or_insert_with(|| failure.to_string());
    }
}

impl<F: Framed, T, A: Ack> GroupCommit<F, T, A> {
    /// The queue of the log `files` (recovered, open for writing after their last record).
    pub fn new(files: LogFiles, on_undone: OnUndone) -> GroupCommit<F, T, A> {
        let end = files.end_lsn();
        GroupCommit {
            queue: Mutex::new(Queue {
                next_lsn: end,
                written_lsn: end,
                durable_lsn: end,
                ops: Vec::new(),
                failure: None,
                shut_down: false,
                detached: None,
                writer_done: false,
            }),
            queued: Condvar::new(),
            detached_ready: Condvar::new(),
            files: Mutex::new(files),
            counters: LogCounters::default(),
            on_undone,
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue<F, T, A>> {
        let q = self.queue.lock().ignore_poison();
        debug_assert!(
            q.durable_lsn <= q.written_lsn,
            "nothing is durable that was not written"
        );
        q
    }

    fn files(&self) -> MutexGuard<'_, LogFiles> {
        self.files.lock().ignore_poison()
    }

    /// The LSN the next frame will get: every frame before it is durable or queued.
    pub fn end_lsn(&self) -> u64 {
        self.queue().next_lsn
    }

    /// Everything before this LSN is written and fsync'd (and applied).
    pub fn durable_lsn(&self) -> u64 {
        self.queue().durable_lsn
    }

    /// Why the log refuses writes, once an fsync (or a write that could not be undone)
    /// failed (until reopened).
    pub fn failure(&self) -> Option<String> {
        self.queue().failure.clone()
    }

    /// Group commits, records, bytes and fsync latencies since the log was opened.
    pub fn stats(&self) -> LogStats {
        self.counters.snapshot()
    }

    /// The first LSN the log's files still hold.
    pub fn first_lsn(&self) -> u64 {
        self.files().first_lsn()
    }

    /// Reads the `len` bytes written at `lsn` ([`LogFiles::read`]).
    pub fn read(&self, lsn: u64, len: usize) -> Result<Vec<u8>, StorageError> {
        self.files().read(lsn, len)
    }

    /// Releases the files wholly before `lsn` at once ([`LogFiles::release_before`]), not
    /// behind what is queued, their blocks freed at `pace`: for an owner that knows nothing
    /// queued needs them.
    pub fn release_before(&self, lsn: u64, pace: &WritePace) -> Result<(), StorageError> {
        // Deleted without the files' lock, which the writer takes for every group.
        let released = self.files().detach_released(lsn)?;
        released.delete(pace).map_err(|(e, left)| {
            self.files().delete_later(left);
            e
        })
    }

    /// Queues `frames` (each finished with [`log::end_frame`], with what to apply once it
    /// is durable) behind everything queued before them, and returns the first one's LSN.
    /// `ack` is told once they are all durable and applied. Only the LSNs are written under
    /// the queue's lock; the frames themselves are never copied. A refused submission is
    /// told through `ack` too.
    pub fn submit(&self, frames: impl IntoIterator<Item = (F, T)>, ack: A) -> Result<u64, Refused> {
        let mut q = self.queue();
        if let Some(refused) = q.refusal() {
            drop(q);
            ack.done(Err(refused.clone()));
            return Err(refused);
        }
        let was_idle = q.ops.is_empty();
        let first = q.next_lsn;
        for (mut frame, item) in frames {
            assert!(
                frame.head().len() > log::FRAME_HEADER,
                "a queued frame is finished"
            );
            let lsn = q.next_lsn;
            log::set_frame_lsn(frame.head_mut(), lsn);
            q.next_lsn = lsn + frame_len(&frame);
            q.ops.push(Op::Append { lsn, frame, item });
        }
        let end = q.next_lsn;
        q.ops.push(Op::Ack {
            lsn: first,
            end,
            ack,
        });
        if was_idle {
            // The writer waits only on an empty queue.
            self.queued.notify_one();
        }
        Ok(first)
    }

    /// Queues a cut of the log back to end at `lsn` (at or before its end) behind
    /// everything queued before it: later submissions get LSNs from `lsn` on. `ack` is
    /// told once the cut is durable. Only for a log that fails on an undone write
    /// ([`OnUndone::Fail`]). A refused cut is told through `ack` too.
    pub fn truncate(&self, lsn: u64, ack: A) -> Result<(), Refused> {
        assert_eq!(
            self.on_undone,
            OnUndone::Fail,
            "a log that takes back undone writes is never truncated"
        );
        let mut q = self.queue();
        if let Some(refused) = q.refusal() {
            drop(q);
            ack.done(Err(refused.clone()));
            return Err(refused);
        }
        assert!(lsn <= q.next_lsn, "a log is cut back, never extended");
        let was_idle = q.ops.is_empty();
        q.next_lsn = lsn;
        q.ops.push(Op::Truncate { lsn, ack });
        if was_idle {
            self.queued.notify_one();
        }
        Ok(())
    }

    /// Queues a release of the files wholly before `before` behind everything queued
    /// before it; [`GroupCommit::run_deleter`], which an owner that releases this way must
    /// run, deletes them. A failure is logged (the next release tries again); a failed log
    /// releases nothing.
    pub fn release(&self, before: u64) {
        let mut q = self.queue();
        if q.refusal().is_some() {
            return;
        }
        let was_idle = q.ops.is_empty();
        q.ops.push(Op::Release { before });
        if was_idle {
            self.queued.notify_one();
        }
    }

    /// Stops the log writer once it has done everything queued so far; later submissions
    /// are refused ([`Refused::ShutDown`]).
    pub fn shut_down(&self) {
        self.queue().shut_down = true;
        self.queued.notify_all();
    }

    /// The log writer: writes and fsyncs whatever is queued as one group, passes the group's
    /// items to `apply` in LSN order (with the LSN right after the group), then acknowledges
    /// it; runs queued truncations and releases in their turn; goes on until
    /// [`GroupCommit::shut_down`] (after doing what was queued before it). Run it on a
    /// thread of its own; `apply` is never run concurrently with itself.
    pub fn run_writer(&self, mut apply: impl FnMut(Vec<(u64, T)>, u64)) {
        // Tells the deleter however the writer returns, unwinding included.
        let _done = WriterDone { log: self };
        while let Some(taken) = self.take() {
            let mut writing = Writing {
                log: self,
                armed: true,
            };
            let mut ops = taken.ops;
            match ops.first() {
                Some(op) if op.in_group() => {
                    let group = Group::of(taken.start, ops);
                    self.commit(group, taken.failure, &mut apply);
                }
                _ => match ops.pop() {
                    Some(Op::Truncate { lsn, ack }) => self.cut(lsn, ack, taken.failure),
                    Some(Op::Release { before }) if taken.failure.is_none() => {
                        self.detach(before);
                    }
                    _ => {}
                },
            }
            // Only now: a broken invariant above (`take_back`'s) fails the log too.
            writing.armed = false;
        }
    }

    /// The log's deleter: deletes the files the writer released ([`GroupCommit::release`]),
    /// oldest first, on a thread of its own beside the writer's, and returns once the writer
    /// has returned and nothing released is left. Deleting a 64 MiB file frees (and, on a
    /// disk mounted with `discard`, discards) its blocks, and with the directory's fsync
    /// took up to 130 ms here: on the writer's thread, every group queued behind it waited.
    /// Their blocks are freed at `pace` ([`Released::delete`]). A deletion that fails is
    /// logged and tried again, before anything newer, at the next release.
    pub fn run_deleter(&self, pace: &WritePace) {
        let mut left: Option<Released> = None;
        loop {
            let newer = {
                let mut q = self.queue();
                loop {
                    if let Some(released) = q.detached.take() {
                        break released;
                    }
                    if q.writer_done {
                        return;
                    }
                    q = self.detached_ready.wait(q).ignore_poison();
                }
            };
            let released = match left.take() {
                Some(older) => older.followed_by(newer),
                None => newer,
            };
            if let Err((e, rest)) = released.delete(pace) {
                tracing::warn!(error = %e, "deleting released log files failed; the next release tries again");
                left = Some(rest);
            }
        }
    }

    /// Takes the files wholly before `before` out of the log, on the writer's thread (its
    /// place in the queue), and hands them to the deleter.
    fn detach(&self, before: u64) {
        match self.files().detach_released(before) {
            Ok(released) => {
                let mut q = self.queue();
                q.detached = Some(match q.detached.take() {
                    Some(older) => older.followed_by(released),
                    None => released,
                });
                drop(q);
                self.detached_ready.notify_one();
            }
            Err(e) => tracing::warn!(error = %e, "releasing log files failed"),
        }
    }

    /// Waits for something queued and takes it: every group op at the queue's head, or the
    /// one step there. `None` once shut down with nothing left.
    fn take(&self) -> Option<Taken<F, T, A>> {
        let mut q = self.queue();
        while q.ops.is_empty() && !q.shut_down {
            q = self.queued.wait(q).ignore_poison();
        }
        if q.ops.is_empty() {
            return None; // shut down, nothing left
        }
        let in_group = q.ops.iter().take_while(|op| op.in_group()).count();
        let ops = match in_group {
            0 => vec![q.ops.remove(0)],
            n if n == q.ops.len() => std::mem::take(&mut q.ops),
            n => q.ops.drain(..n).collect(),
        };
        Some(Taken {
            start: q.written_lsn,
            ops,
            failure: q.failure.clone(),
        })
    }

    /// Writes a group, applies it and acknowledges it, or refuses it.
    fn commit(
        &self,
        group: Group<F, T, A>,
        failure: Option<String>,
        apply: &mut impl FnMut(Vec<(u64, T)>, u64),
    ) {
        let Group {
            start,
            end,
            frames,
            items,
            acks,
        } = group;
        if let Some(failure) = failure {
            // Queued before the failure was seen: refused, never written after it.
            self.queue().written_lsn = end;
            return refuse(acks, &Refused::Failed(failure));
        }
        if !frames.is_empty() {
            match self.write(start, &frames) {
                Ok(fsync) => {
                    self.counters.record_group(frames.len(), end - start, fsync);
                    drop(frames);
                    apply(items, end);
                }
                Err(LogWriteError::Undone(e)) if self.on_undone == OnUndone::TakeBack => {
                    self.queue().take_back(start, end);
                    tracing::warn!(error = %e, "a log write failed and was undone; its records are refused, the log takes the next write");
                    return refuse(acks, &Refused::Undone(e.to_string()));
                }
                Err(e) => {
                    let failure = e.to_string();
                    let mut q = self.queue();
                    q.written_lsn = end;
                    q.fail(&failure);
                    drop(q);
                    return refuse(acks, &Refused::Failed(failure));
                }
            }
        }
        let mut q = self.queue();
        assert_eq!(q.written_lsn, start, "groups are written one after another");
        q.written_lsn = end;
        q.durable_lsn = end;
        drop(q);
        for (lsn, until, ack) in acks {
            assert!(
                until <= end,
                "a submission is acknowledged only once fsync'd"
            );
            ack.done(Ok(lsn));
        }
    }

    /// Writes and fsyncs `frames` from `start`, returning how long the fsync took.
    fn write(&self, start: u64, frames: &[F]) -> Result<Duration, LogWriteError> {
        let parts: Vec<&[u8]> = frames
            .iter()
            .flat_map(|frame| [frame.head(), frame.tail()])
            .filter(|part| !part.is_empty())
            .collect();
        self.files().write(start, &parts)
    }

    /// Cuts the log back to end at `lsn`, or refuses to once it failed. A cut that fails
    /// fails the log: its files are in no known state.
    fn cut(&self, lsn: u64, ack: A, failure: Option<String>) {
        if let Some(failure) = failure {
            return ack.done(Err(Refused::Failed(failure)));
        }
        match self.files().truncate(lsn) {
            Ok(()) => {
                let mut q = self.queue();
                assert!(lsn <= q.written_lsn, "a cut lies inside what was written");
                q.written_lsn = lsn;
                q.durable_lsn = lsn;
                drop(q);
                ack.done(Ok(lsn));
            }
            Err(e) => {
                let failure = e.to_string();
                self.queue().fail(&failure);
                ack.done(Err(Refused::Failed(failure)));
            }
        }
    }
}

fn refuse<A: Ack>(acks: Vec<(u64, u64, A)>, refused: &Refused) {
    for (_, _, ack) in acks {
        ack.done(Err(refused.clone()));
    }
}

/// Marks the writer returned, for the deleter.
struct WriterDone<'a, F: Framed, T, A: Ack> {
    log: &'a GroupCommit<F, T, A>,
}

impl<F: Framed, T, A: Ack> Drop for WriterDone<'_, F, T, A> {
    fn drop(&mut self) {
        self.log.queue().writer_done = true;
        self.log.detached_ready.notify_all();
    }
}

/// Dropped while still armed only if the writer unwinds (a panic while writing or
/// applying): then it fails the log, so that everything queued and every later submission
/// is refused instead of waiting for a writer that is gone. (What the writer held learns
/// it from its dropped acks.)
struct Writing<'a, F: Framed, T, A: Ack> {
    log: &'a GroupCommit<F, T, A>,
    armed: bool,
}

impl<F: Framed, T, A: Ack> Drop for Writing<'_, F, T, A> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let failure = "a group commit was interrupted by a panic";
        let mut q = self.log.queue();
        q.fail(failure);
        let ops = std::mem::take(&mut q.ops);
        drop(q);
        for op in ops {
            if let Op::Ack { ack, .. } | Op::Truncate { ack, .. } = op {
                ack.done(Err(Refused::Failed(failure.to_string())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::mpsc;

    use super::*;
    use crate::replay::{replay, ReplayError};

    /// Tells a channel.
    struct Told(mpsc::Sender<Result<u64, Refused>>);

    impl Ack for Told {
        fn done(self, outcome: Result<u64, Refused>) {
            let _ = self.0.send(outcome);
        }
    }

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut frame = Vec::new();
        log::begin_frame(&mut frame);
        frame.extend_from_slice(payload);
        log::end_frame(&mut frame).unwrap();
        frame
    }

    fn open(dir: &Path, on_undone: OnUndone) -> GroupCommit<Vec<u8>, u8, Told> {
        let files = replay(dir, 0, false, 100, |_, _| Ok::<(), ReplayError>(()))
            .unwrap()
            .files;
        GroupCommit::new(files, on_undone)
    }

    fn records(dir: &Path) -> Vec<(u64, Vec<u8>)> {
        let mut seen = Vec::new();
        replay(dir, 0, true, 100, |lsn, p| {
            seen.push((lsn, p.to_vec()));
            Ok::<(), ReplayError>(())
        })
        .unwrap();
        seen
    }

    /// Files released through the queue leave the log on the writer's thread and the disk
    /// on the deleter's, oldest first: one that cannot be deleted is tried again at the next
    /// release before any newer one, and the deleter returns once the writer has and
    /// nothing released is left.
    #[test]
    fn released_files_are_deleted_by_the_deleter_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path(), OnUndone::Fail);
        let (tell, told) = mpsc::channel();
        let on_disk = || -> Vec<u64> {
            let mut lsns: Vec<u64> = std::fs::read_dir(dir.path())
                .unwrap()
                .filter_map(|e| log::parse_file_name(&e.unwrap().path()))
                .collect();
            lsns.sort();
            lsns
        };
        let lsns = std::thread::scope(|s| {
            // A failed assertion stops both threads, so that the scope ends.
            struct ShutDown<'a>(&'a GroupCommit<Vec<u8>, u8, Told>);
            impl Drop for ShutDown<'_> {
                fn drop(&mut self) {
                    self.0.shut_down();
                }
            }
            let _stop = ShutDown(&log);
            s.spawn(|| log.run_writer(|_, _| {}));
            let deleter = s.spawn(|| log.run_deleter(&WritePace::default()));
            // One at a time: a write rolls to a new file only between groups.
            let lsns: Vec<u64> = (0..6u8)
                .map(|i| {
                    log.submit([(frame(&[i; 120]), i)], Told(tell.clone()))
                        .unwrap();
                    told.recv().unwrap().unwrap()
                })
                .collect();
            assert_eq!(on_disk(), lsns, "a file per frame");
            // The first file released becomes the spare (a rename, on the writer's thread).
            log.release(lsns[1]);
            // The oldest file left cannot be deleted (a directory stands in its place).
            let oldest = dir.path().join(log::file_name(lsns[1]));
            while log.first_lsn() < lsns[1] {
                std::thread::sleep(Duration::from_millis(1));
            }
            let blocker = crate::replay::tests::blocked_deletion(&oldest);
            log.release(lsns[3]);
            while log.first_lsn() < lsns[3] {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                dir.path().join(log::file_name(lsns[2])).exists(),
                "nothing newer is deleted past a file left behind: no gap"
            );
            std::fs::remove_dir_all(&blocker).unwrap();
            log.release(lsns[5]);
            log.shut_down();
            deleter.join().unwrap();
            lsns
        });
        assert_eq!(log.first_lsn(), lsns[5]);
        assert_eq!(
            on_disk().first(),
            Some(&lsns[5]),
            "everything released is deleted before the deleter returns"
        );
    }

    /// Submissions of several frames, one without any, a truncation and a release, queued
    /// before the writer starts: done in the order queued, each submission told its first
    /// LSN once durable, the truncation's cut taking the place of what it cut.
    #[test]
    fn truncations_and_releases_run_in_their_turn() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path(), OnUndone::Fail);
        let (tell, told) = mpsc::channel();
        let first = log
            .submit([(frame(b"one"), 1), (frame(b"two"), 2)], Told(tell.clone()))
            .unwrap();
        let second = log
            .submit([(frame(b"three"), 3)], Told(tell.clone()))
            .unwrap();
        log.truncate(second, Told(tell.clone())).unwrap();
        assert_eq!(log.end_lsn(), second, "later frames go where the cut is");
        let empty = log.submit([], Told(tell.clone())).unwrap();
        let third = log.submit([(frame(b"four"), 4)], Told(tell)).unwrap();
        log.release(0);
        assert_eq!((first, empty, third), (0, second, second));
        let applied = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            s.spawn(|| log.run_writer(|group, end| applied.lock().unwrap().push((group, end))));
            let outcomes: Vec<_> = told.iter().take(5).collect();
            assert_eq!(
                outcomes,
                [Ok(first), Ok(second), Ok(second), Ok(second), Ok(third)]
            );
            log.shut_down();
        });
        let end = third + frame(b"four").len() as u64;
        assert_eq!(log.durable_lsn(), end);
        let applied = applied.into_inner().unwrap();
        let items: Vec<u8> = applied
            .iter()
            .flat_map(|(group, _)| group.iter().map(|(_, item)| *item))
            .collect();
        assert_eq!(items, [1, 2, 3, 4]);
        assert_eq!(applied.last().unwrap().1, end);
        let payloads: Vec<Vec<u8>> = records(dir.path()).into_iter().map(|r| r.1).collect();
        assert_eq!(
            payloads,
            [b"one".to_vec(), b"two".to_vec(), b"four".to_vec()]
        );
        assert!(matches!(
            log.submit([(frame(b"late"), 5)], Told(mpsc::channel().0)),
            Err(Refused::ShutDown)
        ));
    }

    /// A log that keeps the LSNs it handed out fails on an undone write instead of taking
    /// them back: everything after it is refused, through the ack and at submission.
    #[test]
    fn an_undone_write_fails_a_log_that_cannot_take_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = replay(dir.path(), 0, false, 100, |_, _| Ok::<(), ReplayError>(()))
            .unwrap()
            .files;
        files.fail_next_write(Box::new(|_| {
            Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
        }));
        let log: GroupCommit<Vec<u8>, u8, Told> = GroupCommit::new(files, OnUndone::Fail);
        let (tell, told) = mpsc::channel();
        log.submit([(frame(b"lost"), 1)], Told(tell.clone()))
            .unwrap();
        std::thread::scope(|s| {
            s.spawn(|| log.run_writer(|_, _| panic!("nothing is applied")));
            let outcome = told.recv().unwrap();
            assert!(
                matches!(&outcome, Err(Refused::Failed(why)) if why.contains("undone")),
                "{outcome:?}"
            );
            assert!(log.failure().is_some_and(|f| f.contains("undone")));
            assert!(matches!(
                log.submit([(frame(b"next"), 2)], Told(tell.clone())),
                Err(Refused::Failed(_))
            ));
            assert!(matches!(told.recv().unwrap(), Err(Refused::Failed(_))));
            assert!(matches!(
                log.truncate(0, Told(tell)),
                Err(Refused::Failed(_))
            ));
            log.shut_down();
        });
        assert_eq!(log.durable_lsn(), 0);
        assert!(records(dir.path()).is_empty());
    }
}

//! The files of a log: named by the LSN of their first byte, contiguous, the last one
//! open for writing. Writes (one `writev` and one `fdatasync` each, the first frame marked
//! as the start of a write), rolls to the next file, recycling of released files, reads of
//! a frame by position, truncation and release.
//!
//! Must never know about: what a record says, who writes it or when (the group-commit
//! queue, [`crate::group_commit`], decides that), threads.

use std::fs::{self, File, OpenOptions};
use std::io::{IoSlice, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::fsutil::{remove_file_paced, sync_dir};
use crate::log;
use crate::pace::WritePace;
use crate::StorageError;

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
    pub(crate) starts: Vec<u64>,
    /// Written from `current_len` on (never opened for appending: a reused file is longer).
    current: File,
    pub(crate) current_len: u64,
    pub(crate) roll_bytes: u64,
    /// Whether [`SPARE_FILE`] exists, a released file waiting to be the next one.
    spare: bool,
    /// Whether a released file is kept as the spare (a database's log) or deleted, and the
    /// file being written is given up once everything in it is released (a spool's, whose
    /// disk must get back what was forwarded).
    recycle: bool,
    /// Released files whose deletion failed ([`LogFiles::delete_later`]), oldest first:
    /// the next release deletes them before any newer one, so that the files on disk stay
    /// a run without gaps (a Raft log is read back from its oldest file on).
    undeleted: Option<Released>,
    /// Runs once in place of the next write's `writev` (tests of a failing disk).
    #[cfg(any(test, feature = "fault-injection"))]
    write_fault: Option<WriteFault>,
}

/// What a test puts in place of a write's `writev` ([`LogFiles::fail_next_write`]).
#[cfg(any(test, feature = "fault-injection"))]
pub type WriteFault = Box<dyn FnOnce(&mut File) -> std::io::Result<()> + Send>;

/// How many bytes of a spool's log file, all released, are worth a new file
/// ([`LogFiles::stop_recycling`]).
pub const RECLAIM_BYTES: u64 = 1 << 20;

/// The name a released log file waits under until it becomes the next one. Not a log
/// file's name ([`log::parse_file_name`] refuses it), so readers of the log never see it.
pub const SPARE_FILE: &str = "spare.log-recycled";

impl LogFiles {
    /// The log in `dir` whose files start at `starts` (ascending, at least one), the last
    /// one open as `current` and holding `current_len` bytes of the log.
    pub(crate) fn opened(
        dir: &Path,
        starts: Vec<u64>,
        current: File,
        current_len: u64,
        roll_bytes: u64,
    ) -> LogFiles {
        assert!(!starts.is_empty(), "an open log has a file to write");
        assert!(
            starts.windows(2).all(|w| w[0] < w[1]),
            "log files start in ascending order"
        );
        LogFiles {
            dir: dir.to_path_buf(),
            starts,
            current,
            current_len,
            roll_bytes,
            spare: dir.join(SPARE_FILE).exists(),
            recycle: true,
            undeleted: None,
            #[cfg(any(test, feature = "fault-injection"))]
            write_fault: None,
        }
    }

    /// The position after the last byte written.
    pub fn end_lsn(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0) + self.current_len
    }

    /// The first LSN the log's files still hold.
    pub fn first_lsn(&self) -> u64 {
        self.starts.first().copied().unwrap_or(0)
    }

    /// Runs `fault` once in place of the next write's `writev`: tests of a failing disk.
    #[cfg(any(test, feature = "fault-injection"))]
    pub fn fail_next_write(&mut self, fault: WriteFault) {
        self.write_fault = Some(fault);
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
        #[cfg(any(test, feature = "fault-injection"))]
        let written = match self.write_fault.take() {
            Some(fault) => fault(&mut self.current),
            None => write_all_vectored(&mut self.current, &parts),
        };
        #[cfg(not(any(test, feature = "fault-injection")))]
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
    /// released too: the next write starts a new file. Deleted at once, unpaced: a shared
    /// log releases in two steps ([`LogFiles::detach_released`], [`Released::delete`]).
    pub fn release_before(&mut self, lsn: u64) -> Result<(), StorageError> {
        let released = self.detach_released(lsn)?;
        released.delete(&WritePace::default()).map_err(|(e, left)| {
            self.delete_later(left);
            e
        })
    }

    /// Keeps released files whose deletion failed ([`Released::delete`]) for the next
    /// release to delete first.
    pub fn delete_later(&mut self, left: Released) {
        self.undeleted = Some(match self.undeleted.take() {
            None => left,
            Some(kept) => kept.followed_by(left),
        });
    }

    /// [`LogFiles::release_before`] in two steps: this one takes the released files out of
    /// the log (the spare is renamed at once, since the next file may need it), and the
    /// returned [`Released`] deletes the others and fsyncs the directory, for a caller that
    /// shares the log to do without holding it. Deleting a 64 MiB file and the directory
    /// fsync took up to 130 ms on this project's disk while a checkpoint wrote, and a log
    /// writer waiting for them held every append's acknowledgement.
    pub fn detach_released(&mut self, lsn: u64) -> Result<Released, StorageError> {
        let end = self.end_lsn();
        if !self.recycle && lsn >= end && self.current_len >= RECLAIM_BYTES {
            // A reclaim that fails (a full disk) leaves the file in use: the next release
            // tries again, and nothing released is lost.
            if let Err(e) = self.roll(end) {
                tracing::warn!(error = %e, "giving up a drained spool log file failed");
            }
        }
        let mut released = self.undeleted.take().unwrap_or_else(|| Released {
            dir: self.dir.clone(),
            doomed: Vec::new(),
            renamed: false,
        });
        while self.starts.len() > 1 && self.starts[1] <= lsn {
            let path = self.dir.join(log::file_name(self.starts[0]));
            if self.spare || !self.recycle {
                released.doomed.push(path);
            } else {
                let spare = self.dir.join(SPARE_FILE);
                fs::rename(&path, &spare).map_err(|e| StorageError::io("rename", &path, e))?;
                self.spare = true;
                released.renamed = true;
            }
            self.starts.remove(0);
        }
        Ok(released)
    }
}

/// Log files taken out of their log ([`LogFiles::detach_released`]), oldest first, to be
/// deleted. A deletion that fails hands the rest back ([`LogFiles::delete_later`]).
#[must_use = "released files are deleted by `Released::delete`"]
#[derive(Debug)]
pub struct Released {
    dir: PathBuf,
    doomed: Vec<PathBuf>,
    /// A file became the spare: the directory changed even if nothing is deleted.
    renamed: bool,
}

impl Released {
    /// These files and `newer`'s in one, oldest first, for one deletion.
    pub fn followed_by(mut self, newer: Released) -> Released {
        assert_eq!(self.dir, newer.dir, "released files of one log");
        self.doomed.extend(newer.doomed);
        self.renamed |= newer.renamed;
        // Two releases' files in one (a leftover may be named again): oldest first again.
        self.doomed.sort_by_key(|path| log::parse_file_name(path));
        self.doomed.dedup();
        self
    }

    /// Deletes the released files oldest first, their blocks freed at `pace`
    /// ([`remove_file_paced`]), then fsyncs the directory if anything changed in it. At
    /// the first file that cannot be deleted it stops, and returns the error with that file
    /// and the newer ones, for [`LogFiles::delete_later`]: deleting a newer file past an
    /// older one left behind would leave a gap in the log's files.
    pub fn delete(mut self, pace: &WritePace) -> Result<(), (StorageError, Released)> {
        let doomed = std::mem::take(&mut self.doomed);
        let mut deleted = 0;
        for path in &doomed {
            if let Err(e) = remove_file_paced(path, pace) {
                self.doomed = doomed[deleted..].to_vec();
                return Err((e, self));
            }
            deleted += 1;
        }
        if self.renamed || deleted > 0 {
            if let Err(e) = sync_dir(&self.dir) {
                return Err((e, self));
            }
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

pub(crate) fn create_new(path: &Path) -> Result<File, StorageError> {
    OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(path)
        .map_err(|e| StorageError::io("create", path, e))
}

/// Opens the log file at `path` for writing from byte `at` on.
pub(crate) fn open_at(path: &Path, at: u64) -> Result<File, StorageError> {
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
pub(crate) fn cut_file(path: &Path, len: u64) -> Result<(), StorageError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| StorageError::io("open", path, e))?;
    file.set_len(len)
        .and_then(|()| file.sync_all())
        .map_err(|e| StorageError::io("truncate", path, e))
}

/// The first LSNs of the log files in `dir`, ascending.
pub(crate) fn file_starts(dir: &Path) -> Result<Vec<u64>, StorageError> {
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

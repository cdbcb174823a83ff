//! Durable file replacement: write to a temporary name, fsync, rename, fsync the directory.
//! After [`write_atomic`] returns, a crash leaves either the old file or the new one, whole.
//! Also the small pieces of file-system plumbing the formats share: directory fsync, early
//! writeback, paced deletion, temporary files that delete themselves unless kept.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::pace::WritePace;
use crate::StorageError;

/// Replaces `path` with `bytes` atomically and durably.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let tmp = TempPath::new(path.with_extension("tmp"));
    let mut file =
        File::create(tmp.path()).map_err(|e| StorageError::io("create", tmp.path(), e))?;
    file.write_all(bytes)
        .map_err(|e| StorageError::io("write", tmp.path(), e))?;
    file.sync_all()
        .map_err(|e| StorageError::io("fsync", tmp.path(), e))?;
    drop(file);
    tmp.rename_to(path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Makes renames, creations and deletions in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StorageError::io("fsync directory", dir, e))
}

/// How much of a file [`remove_file_paced`] frees at a time.
pub const DELETE_STEP: u64 = 1 << 20;

/// What [`remove_file_paced`] adds to a file's name before it cuts it: no reader of a
/// directory takes such a name for one of its files.
pub const DELETING_SUFFIX: &str = ".deleting";

/// Deletes the file at `path` (gone already: done), freeing its blocks a [`DELETE_STEP`]
/// at a time at `pace`: renamed aside (`DELETING_SUFFIX`) and the rename made durable, cut
/// from its end, then unlinked once empty. Its directory's last fsync is the caller's.
///
/// Why: the blocks a deletion frees are journaled, and on a disk mounted with `discard`
/// (this project's machines are) discarded, in the journal commit that the next fsync of
/// any file waits for. Measured with `scripts/fsync-beside-segments.py` (docs/benchmarks.md
/// W5): 64 KiB log writes fsync'd at 46 MB/s beside a paced 64 MiB file written and then
/// unlinked at once had a p99 of 1.6–32 ms (p99.9 up to 98 ms); cut in 1 MiB steps at 92
/// or 400 MB/s first, 1.0–3.4 ms (p99.9 1.5–13.5), as with nothing deleted (1.1–1.3).
///
/// Renamed first because a crash part-way must not leave a shortened file under its own
/// name: a Raft log replays every file it finds, and would take a cut one for damage. The
/// owner of the directory deletes what a crash left renamed
/// ([`remove_interrupted_deletions`]) when it opens it.
pub fn remove_file_paced(path: &Path, pace: &WritePace) -> Result<(), StorageError> {
    let mut doomed = path.as_os_str().to_owned();
    doomed.push(DELETING_SUFFIX);
    let doomed = PathBuf::from(doomed);
    match fs::rename(path, &doomed) {
        Ok(()) => {}
        // Gone, or renamed aside by a deletion a crash interrupted: that one is finished
        // at the next open.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StorageError::io("delete", path, e)),
    }
    // Out of its owner's names from here on: a cut that fails only leaves the unlink to
    // free the file whole, and a file that cannot be unlinked is left to the next open.
    let _ = sync_dir(path.parent().unwrap_or(Path::new(".")))
        .and_then(|()| cut_in_steps(&doomed, pace));
    fs::remove_file(&doomed).map_err(|e| StorageError::io("delete", &doomed, e))
}

/// Cuts the file at `path` from its end to its first [`DELETE_STEP`], a step at a time at
/// `pace`.
fn cut_in_steps(path: &Path, pace: &WritePace) -> Result<(), StorageError> {
    let cut = || -> std::io::Result<()> {
        let file = fs::OpenOptions::new().write(true).open(path)?;
        let mut len = file.metadata()?.len();
        while len > DELETE_STEP {
            let shorter = (len - 1) / DELETE_STEP * DELETE_STEP;
            file.set_len(shorter)?;
            pace.wrote(len - shorter);
            len = shorter;
        }
        Ok(())
    };
    cut().map_err(|e| StorageError::io("cut", path, e))
}

/// Deletes the files of `dir` that a paced deletion ([`remove_file_paced`]) renamed aside
/// and a crash kept it from finishing; returns how many. Unpaced: a directory being opened
/// has nothing else to wait for.
pub fn remove_interrupted_deletions(dir: &Path) -> Result<usize, StorageError> {
    let mut removed = 0;
    for entry in fs::read_dir(dir).map_err(|e| StorageError::io("list", dir, e))? {
        let path = entry.map_err(|e| StorageError::io("list", dir, e))?.path();
        let is_doomed = path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.ends_with(DELETING_SUFFIX));
        if !is_doomed {
            continue;
        }
        // No longer any file of the directory's owner: one that cannot be deleted costs
        // only its space, and must not keep the directory from opening.
        match fs::remove_file(&path) {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!(path = %path.display(), error = %e,
                "a file renamed aside to be deleted could not be deleted; delete it by hand"),
        }
    }
    if removed > 0 {
        sync_dir(dir)?;
    }
    Ok(removed)
}

/// Asks the kernel to start writing `len` bytes of `file` from `offset` (`len` 0: to the
/// end) to disk without waiting for them, so that the fsync that follows finds them on
/// their way. Started early and in pieces, a large file's writeback does not reach the
/// disk as one burst at its fsync, where it would queue the write-ahead log's small fsyncs
/// behind it; started on many files before any is fsync'd, one journal commit covers most
/// of them.
///
/// Durability never depends on this call: only the fsync does, and it reports any I/O
/// error, so a failure here (or a file system without the call) is ignored. A no-op off
/// Linux.
pub fn start_writeback(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: the descriptor is open for as long as `file` is borrowed, and
        // sync_file_range reads no memory of this process.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// A file being written under a temporary name: deleted when dropped unless renamed into
/// place by [`TempPath::rename_to`] (a write that fails halfway leaves nothing behind, even
/// before the next restart's clean-up).
pub struct TempPath {
    path: PathBuf,
    renamed: bool,
}

impl TempPath {
    pub fn new(path: PathBuf) -> TempPath {
        TempPath {
            path,
            renamed: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn rename_to(mut self, target: &Path) -> Result<(), StorageError> {
        fs::rename(&self.path, target)
            .map_err(|e| StorageError::io("rename into place", target, e))?;
        self.renamed = true;
        Ok(())
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Bytes an unprivileged process may still write on the filesystem holding `path`.
#[cfg(unix)]
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: statvfs writes only into `stats`, a plain C struct, and reads the
    // NUL-terminated path, both valid for the call.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // the fields' types differ between platforms
    Ok((stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64))
}

#[cfg(not(unix))]
pub fn free_bytes(_path: &Path) -> std::io::Result<u64> {
    Ok(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_paced_deletion_frees_a_step_at_a_time_and_tolerates_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("doomed");
        fs::write(&path, vec![7u8; (4 * DELETE_STEP + 5) as usize]).unwrap();
        let pace = WritePace::default();
        // Four steps of 1 MiB at 40 MiB/s: the cuts take about 100 ms.
        pace.set_rate(40 * DELETE_STEP);
        let started = Instant::now();
        remove_file_paced(&path, &pace).unwrap();
        assert!(!path.exists());
        assert!(
            started.elapsed() >= Duration::from_millis(70),
            "the cuts went at the pace: {:?}",
            started.elapsed()
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "nothing left");
        remove_file_paced(&path, &pace).unwrap();
    }

    /// A crash during the cuts leaves the file renamed aside, never shortened under its
    /// name; opening the directory finishes the deletion.
    #[test]
    fn an_interrupted_deletion_is_finished_at_open_and_leaves_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let kept = dir.path().join("00000000000000000000.log");
        fs::write(&kept, b"kept").unwrap();
        let interrupted = dir
            .path()
            .join(format!("00000000000000000064.log{DELETING_SUFFIX}"));
        fs::write(&interrupted, b"half cut").unwrap();
        assert_eq!(remove_interrupted_deletions(dir.path()).unwrap(), 1);
        assert!(!interrupted.exists());
        assert_eq!(fs::read(&kept).unwrap(), b"kept");
        assert_eq!(remove_interrupted_deletions(dir.path()).unwrap(), 0);
    }
}

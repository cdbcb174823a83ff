//! Durable file replacement: write to a temporary name, fsync, rename, fsync the directory.
//! After [`write_atomic`] returns, a crash leaves either the old file or the new one, whole.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use crate::StorageError;

/// Replaces `path` with `bytes` atomically and durably.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let tmp = path.with_extension("tmp");
    let mut file = File::create(&tmp).map_err(|e| StorageError::io("create", &tmp, e))?;
    file.write_all(bytes)
        .map_err(|e| StorageError::io("write", &tmp, e))?;
    file.sync_all()
        .map_err(|e| StorageError::io("fsync", &tmp, e))?;
    drop(file);
    fs::rename(&tmp, path).map_err(|e| StorageError::io("rename into place", path, e))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Makes renames, creations and deletions in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StorageError::io("fsync directory", dir, e))
}

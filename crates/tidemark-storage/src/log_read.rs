//! Reading a live log's records back by position, without its writer's lock: a spool's
//! forwarder reads what the writer has made durable, and counts what is left.
//!
//! Must never know about: what a record says, or how the writer groups its writes.

use std::fs::File;
use std::path::Path;

use crate::log;
use crate::log_files::file_starts;
use crate::StorageError;

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
/// deleted only behind the reader's hold (which the log's owner keeps).
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

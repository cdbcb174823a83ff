//! Recovery of a log: replaying its records in order, telling a torn last write (cut off)
//! from corruption (refused, with what lies after the damage), and the repair that cuts a
//! corrupt log at its damage, saving what it cuts.
//!
//! Must never know about: what a record says (the caller's `visit` decides), checkpoints
//! or manifests (the caller says where replay starts and what must be kept).

use std::fs;
use std::path::{Path, PathBuf};

use crate::fsutil::{self, sync_dir};
use crate::log::{self, FrameEnd};
use crate::log_files::{create_new, cut_file, file_starts, open_at, LogFiles};
use crate::StorageError;

/// Why a log could not be replayed or repaired: its files could not be read or changed,
/// or it is corrupt (a typed answer, so that the caller can say what to do about it).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The log is damaged where a crash cannot have damaged it: records that were
    /// acknowledged lie after the damage. Nothing was changed.
    #[error("{0}")]
    Corrupt(Box<CorruptLog>),
}

/// Where a log is corrupt and why that is not a torn tail ([`ReplayError::Corrupt`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptLog {
    /// The damaged log file.
    pub file: PathBuf,
    /// Where in it the damage starts (the first frame that does not check out), and that
    /// position's LSN.
    pub offset: u64,
    pub lsn: u64,
    /// What is wrong with the frame there.
    pub reason: String,
    /// Why this cannot be the torn tail of a crash.
    pub evidence: Evidence,
    /// Valid records found after the damage (in its file, and in the log files after it),
    /// and their bytes.
    pub records_after: u64,
    pub bytes_after: u64,
    /// Log files after the damaged one: all of them lie after the damage.
    pub later_files: Vec<PathBuf>,
    /// What to do about it, in the terms of whoever opened the log (`tidemark verify
    /// --repair` for a data directory, rebuilding from its peers for a cluster node).
    pub advice: String,
}

/// Why damage in a log is corruption and not a torn tail ([`CorruptLog`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// A valid frame that starts a write follows the damage, at this LSN: the log writer
    /// issues a write only once the one before it is fsync'd, so the damaged write was
    /// durable, and acknowledged.
    LaterWrite { lsn: u64 },
    /// The damaged file is not the last one: files roll only once everything before is
    /// fsync'd.
    NotLastFile,
    /// The damage lies before the replay point `from`, among records a checkpoint
    /// reflects (so they were durable), and no valid frame starts where replay must go on.
    BeforeReplayPoint { from: u64 },
}

impl std::fmt::Display for CorruptLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the log is corrupt, not torn by a crash: {} is damaged at byte {} (LSN {}: {}), ",
            self.file.display(),
            self.offset,
            self.lsn,
            self.reason
        )?;
        match &self.evidence {
            Evidence::LaterWrite { lsn } => write!(
                f,
                "and a later write begins after it, at LSN {lsn} (a write is made only once \
                 the one before it is on disk, so the damaged one had been acknowledged)"
            )?,
            Evidence::NotLastFile => write!(
                f,
                "which is not the last log file ({} more follow; files roll only once \
                 everything before is on disk)",
                self.later_files.len()
            )?,
            Evidence::BeforeReplayPoint { from } => write!(
                f,
                "before LSN {from}, where replay starts (among records a checkpoint holds, \
                 so they had been on disk), and the records needed from there on cannot be \
                 found after it"
            )?,
        }
        write!(
            f,
            "; {} valid records ({} bytes) lie after the damage. Refusing to open rather \
             than drop acknowledged records",
            self.records_after, self.bytes_after
        )?;
        if !self.advice.is_empty() {
            write!(f, ". {}", self.advice)?;
        }
        Ok(())
    }
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
/// Corruption fails with [`ReplayError::Corrupt`] and changes nothing: the caller says
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
///
/// An error `visit` returns stops the replay and is returned as it is; the log's own
/// failures come as `E::from(ReplayError)`.
pub fn replay<E: From<ReplayError>>(
    dir: &Path,
    from: u64,
    expect_files: bool,
    roll_bytes: u64,
    visit: impl FnMut(u64, &[u8]) -> Result<(), E>,
) -> Result<Replayed, E> {
    let storage = |e: StorageError| E::from(ReplayError::Storage(e));
    fs::create_dir_all(dir).map_err(|e| storage(StorageError::io("create", dir, e)))?;
    // Released files a crash caught while they were being deleted (renamed aside first).
    crate::fsutil::remove_interrupted_deletions(dir).map_err(storage)?;
    let starts = file_starts(dir).map_err(storage)?;
    if starts.is_empty() && expect_files {
        return Err(storage(StorageError::corrupt(
            "log",
            format!(
                "{} holds no log files, but the manifest needs records from LSN {from}",
                dir.display()
            ),
        )));
    }
    if starts.is_empty() {
        let current = create_new(&dir.join(log::file_name(from))).map_err(storage)?;
        sync_dir(dir).map_err(storage)?;
        return Ok(Replayed {
            files: LogFiles::opened(dir, vec![from], current, 0, roll_bytes),
            truncated: None,
            ignored: None,
        });
    }
    let walked = walk(dir, &starts, from, visit)?;
    let truncated = match walked.torn {
        Some(torn) => Some(torn.cut().map_err(storage)?),
        None => None,
    };
    let end = walked.end;
    let last = *starts.last().unwrap_or(&0);
    assert!(end >= last, "the valid log ends in its last file");
    let current = open_at(&dir.join(log::file_name(last)), end - last).map_err(storage)?;
    Ok(Replayed {
        files: LogFiles::opened(dir, starts, current, end - last, roll_bytes),
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

impl TornTail {
    /// Cuts the tail off its file, and says what was cut.
    fn cut(self) -> Result<String, StorageError> {
        // Cut, not just written over: bytes of a lost write may hide a whole frame of that
        // write further on, which a shorter write here would bring back.
        cut_file(&self.path, self.valid_len)?;
        Ok(format!(
            "cut {} from LSN {} on: {} bytes after the last valid record, the unfinished \
             write of a crash or the old contents of a reused file ({}{})",
            self.path.display(),
            self.lsn,
            self.file_len - self.valid_len,
            self.reason,
            match self.records_after {
                0 => String::new(),
                n => format!("; {n} valid records of that write followed it"),
            },
        ))
    }
}

/// Reads the log files `starts` of `dir` from `from` on, visiting every record, and finds
/// where the valid log ends: at the end of the last file, at a torn tail in it, or at
/// corruption ([`ReplayError::Corrupt`], with nothing changed). The rule is [`replay`]'s.
fn walk<E: From<ReplayError>>(
    dir: &Path,
    starts: &[u64],
    from: u64,
    mut visit: impl FnMut(u64, &[u8]) -> Result<(), E>,
) -> Result<Walked, E> {
    let corrupt =
        |detail: String| E::from(ReplayError::Storage(StorageError::corrupt("log", detail)));
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
        let bytes = fs::read(&path)
            .map_err(|e| E::from(ReplayError::Storage(StorageError::io("read", &path, e))))?;
        let next = starts.get(i + 1).copied();
        let file = FileToWalk {
            path: &path,
            start,
            // Frames cannot run short of the next file's start: that would be a gap, found
            // above next round.
            bytes: match next {
                Some(next) => &bytes[..bytes.len().min((next - start) as usize)],
                None => &bytes[..],
            },
            last: next.is_none(),
        };
        let valid = match file.walk(from, &mut visit, &mut ignored)? {
            FileEnd::Clean => file.bytes.len(),
            FileEnd::Torn(tail) => {
                let valid = tail.valid_len as usize;
                torn = Some(tail);
                valid
            }
            FileEnd::Corrupt(damage, evidence) => {
                let error = damage.into_error(dir, &starts[i + 1..], evidence);
                return Err(E::from(ReplayError::Corrupt(Box::new(error))));
            }
        };
        end = start + valid as u64;
    }
    Ok(Walked { end, torn, ignored })
}

/// One log file as [`walk`] reads it.
struct FileToWalk<'a> {
    path: &'a Path,
    /// The LSN of its first byte.
    start: u64,
    /// Its bytes up to the next file's start.
    bytes: &'a [u8],
    /// Whether it is the last file (where a crash can leave a torn write).
    last: bool,
}

/// How the frames of a log file end ([`FileToWalk::walk`]).
enum FileEnd {
    Clean,
    /// The last file's torn tail, to be cut.
    Torn(TornTail),
    Corrupt(Damage, Evidence),
}

impl FileToWalk<'_> {
    /// Visits the file's records from `from` on, skipping damage before `from` where a
    /// needed record can be found after it (noted in `ignored`), and says how its frames
    /// end: the rule of [`replay`].
    fn walk<E>(
        &self,
        from: u64,
        visit: &mut impl FnMut(u64, &[u8]) -> Result<(), E>,
        ignored: &mut Option<String>,
    ) -> Result<FileEnd, E> {
        let (start, bytes) = (self.start, self.bytes);
        let mut pos = 0;
        loop {
            let (frames, how) = log::read_frames(&bytes[pos..], start + pos as u64);
            for (lsn, payload) in frames {
                if lsn >= from {
                    visit(lsn, payload)?;
                }
            }
            let (valid_len, reason) = match how {
                FrameEnd::Clean => return Ok(FileEnd::Clean),
                FrameEnd::Torn { valid_len, reason } => (valid_len, reason),
            };
            let damage = pos + valid_len;
            if start + (damage as u64) < from {
                if let Some(at) = self.resume_point(damage, from) {
                    ignored.get_or_insert_with(|| {
                        format!(
                            "{} is damaged at byte {damage} (LSN {}: {reason}), before LSN \
                             {from} where replay starts: records a checkpoint holds already, \
                             not needed to open, skipped (a spool's reader checks them again)",
                            self.path.display(),
                            start + damage as u64,
                        )
                    });
                    assert!(at > pos, "replay moves forward past damage");
                    pos = at;
                    continue;
                }
            }
            let after = log::scan_after_damage(bytes, start, damage);
            let evidence = if start + (damage as u64) < from {
                Some(Evidence::BeforeReplayPoint { from })
            } else {
                match (self.last, after.later_write) {
                    (false, _) => Some(Evidence::NotLastFile),
                    (true, Some(at)) => Some(Evidence::LaterWrite {
                        lsn: start + at as u64,
                    }),
                    (true, None) => None,
                }
            };
            return Ok(match evidence {
                Some(evidence) => FileEnd::Corrupt(
                    Damage {
                        file_start: start,
                        offset: damage,
                        reason,
                        after,
                    },
                    evidence,
                ),
                None => FileEnd::Torn(TornTail {
                    path: self.path.to_path_buf(),
                    valid_len: damage as u64,
                    lsn: start + damage as u64,
                    file_len: bytes.len() as u64,
                    reason,
                    records_after: after.records,
                }),
            });
        }
    }

    /// Where replay can go on after damage at `damage`, which lies among records before
    /// the replay point `from`: a checkpoint reflects them, so they were durable, and none
    /// is needed. The log goes on from the first record needed if a valid frame starts
    /// there: `from` itself, or `from - 1` (a replica's checkpoint is one past the start of
    /// the last record it applied), or if `from` is where the file ends (the embedded log's
    /// checkpoint is the end of the last group it wrote: after a clean close, the end of
    /// the log). A valid frame at its own position is a record start.
    fn resume_point(&self, damage: usize, from: u64) -> Option<usize> {
        [from, from - 1]
            .into_iter()
            .filter_map(|lsn| lsn.checked_sub(self.start))
            .map(|at| at as usize)
            .find(|&at| {
                at > damage
                    && (at == self.bytes.len() || log::frame_at(self.bytes, at, self.start).is_ok())
            })
    }
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
    fn into_error(self, dir: &Path, later: &[u64], evidence: Evidence) -> CorruptLog {
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
        CorruptLog {
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
        }
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
pub fn repair(dir: &Path, from: u64, keep_before: u64) -> Result<Option<RepairedLog>, ReplayError> {
    let starts = file_starts(dir)?;
    if starts.is_empty() {
        return Ok(None);
    }
    let damage = match walk(dir, &starts, from, |_, _| Ok::<(), ReplayError>(())) {
        Ok(_) => return Ok(None),
        Err(ReplayError::Corrupt(damage)) => *damage,
        Err(e) => return Err(e),
    };
    if damage.lsn < keep_before {
        return Err(ReplayError::Storage(StorageError::corrupt(
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
pub(crate) mod tests {
    use std::fs::File;

    use super::*;
    use crate::log_files::SPARE_FILE;
    use crate::pace::WritePace;

    type Result<T, E = ReplayError> = std::result::Result<T, E>;

    /// [`super::replay`] with the log's own errors.
    fn replay(
        dir: &Path,
        from: u64,
        expect_files: bool,
        roll_bytes: u64,
        visit: impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<Replayed> {
        super::replay(dir, from, expect_files, roll_bytes, visit)
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
    fn released_files_leave_the_log_at_once_and_the_disk_when_deleted() {
        let (dir, mut files, _) = log_with(30, |i| vec![i; 40]);
        assert!(files.starts.len() >= 4, "{:?}", files.starts);
        // The first file released becomes the spare; the next ones are deleted.
        files.release_before(files.starts[1]).unwrap();
        let doomed = dir.path().join(log::file_name(files.starts[0]));
        let next = files.starts[1];
        let released = files.detach_released(next).unwrap();
        assert_eq!(files.starts[0], next, "out of the log at once");
        assert!(doomed.exists(), "deleted only by `Released::delete`");
        // The log goes on meanwhile (a writer takes it between the two steps).
        let lsn = append(&mut files, &[7; 9]);
        released.delete(&WritePace::default()).unwrap();
        assert!(!doomed.exists());
        let frame = files.read(lsn, framed(lsn, &[7; 9]).len()).unwrap();
        assert!(frame.ends_with(&[7; 9]), "{frame:?}");
    }

    /// Makes `path` impossible to delete ([`crate::fsutil::remove_file_paced`] renames it
    /// aside first): a directory that is not empty where it would go. Returns it.
    pub(crate) fn blocked_deletion(path: &Path) -> PathBuf {
        let mut aside = path.as_os_str().to_owned();
        aside.push(crate::fsutil::DELETING_SUFFIX);
        let aside = PathBuf::from(aside);
        fs::create_dir(&aside).unwrap();
        fs::write(aside.join("in the way"), b"").unwrap();
        aside
    }

    #[test]
    fn a_released_file_that_cannot_be_deleted_is_retried_before_any_newer_one() {
        let (dir, mut files, _) = log_with(80, |i| vec![i; 40]);
        assert!(files.starts.len() >= 7, "{:?}", files.starts);
        files.release_before(files.starts[1]).unwrap(); // the spare
        let name = |lsn: u64| dir.path().join(log::file_name(lsn));
        let (oldest, newer) = (name(files.starts[0]), name(files.starts[1]));
        // The oldest cannot be deleted: a directory that is not empty stands where it would
        // be renamed aside to be cut.
        let blocker = blocked_deletion(&oldest);
        let released = files.detach_released(files.starts[2]).unwrap();
        let (_, left) = released.delete(&WritePace::default()).unwrap_err();
        assert!(newer.exists(), "nothing newer is deleted past it: no gap");
        files.delete_later(left);
        // The next release tries again, oldest first, and fails the same way.
        let third = name(files.starts[0]);
        let err = files.release_before(files.starts[1]).unwrap_err();
        assert!(err.to_string().contains("delete"), "{err}");
        assert!(newer.exists() && third.exists());
        // Once it can be, everything released goes, in order.
        fs::remove_dir_all(&blocker).unwrap();
        let first_kept = files.starts[0];
        files.release_before(files.starts[1]).unwrap();
        assert!(!oldest.exists() && !newer.exists() && !third.exists());
        assert!(!name(first_kept).exists());
        let on_disk: Vec<u64> = fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| log::parse_file_name(&e.unwrap().path()))
            .collect();
        assert_eq!(
            on_disk.iter().min(),
            files.starts.first(),
            "the files left are the log's own"
        );
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
                    Err(ReplayError::Corrupt(c)) => {
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
        let ReplayError::Corrupt(c) = err else {
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
            Err(ReplayError::Corrupt(c)) => {
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
            Err(ReplayError::Corrupt(_))
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
                            Err(ReplayError::Corrupt(c)) => proptest::prop_assert_eq!(c.lsn, lsn),
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

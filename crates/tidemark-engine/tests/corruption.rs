//! Damaged files give a clear error or a truncation at the last good record, never wrong
//! data.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tidemark_core::{BatchBuilder, EventBatch, Schema, Value};
use tidemark_engine::{Db, EngineError, Evidence, OpenError, Options, ScanRequest};
use tidemark_storage::manifest::Manifest;

fn batch(schema: &Arc<Schema>, range: std::ops::Range<i64>) -> EventBatch {
    let mut b = BatchBuilder::new(schema.clone(), 0);
    for ts in range {
        b.push_row(
            ts,
            None,
            &[Value::Long(ts * 3), Value::String(format!("v{}", ts % 4))],
        )
        .unwrap();
    }
    b.finish()
}

/// A database with 2000 flushed events and 3 batches of 100 only in the log; its segment
/// in a pack file when `packed`, else in a file of its own.
fn build(dir: &Path, packed: bool) {
    let options = Options {
        pack_below_bytes: if packed { usize::MAX } else { 0 },
        ..Options::default()
    };
    let db = Db::open(dir, options).unwrap();
    let schema = Arc::new(Schema::parse_spec("X:LONG,S:STRING").unwrap());
    db.create_stream("s", (*schema).clone()).unwrap();
    db.append("s", batch(&schema, 0..2000)).unwrap();
    db.flush().unwrap();
    for start in [2000, 2100, 2200] {
        db.append("s", batch(&schema, start..start + 100)).unwrap();
    }
}

/// Why a database could not be read back: its open failed, or its scan.
#[derive(Debug)]
enum Failure {
    Open(OpenError),
    Read(EngineError),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Open(e) => write!(f, "open: {e}"),
            Failure::Read(e) => write!(f, "read: {e}"),
        }
    }
}

/// Every event the scan returns, or why there are none.
fn read_all(dir: &Path) -> Result<Vec<(i64, Vec<Value>)>, Failure> {
    let db = Db::open(dir, Options::default()).map_err(Failure::Open)?;
    let mut out = Vec::new();
    let scan = db
        .scan("s", &ScanRequest::default())
        .map_err(Failure::Read)?;
    for b in scan {
        let b = b.map_err(Failure::Read)?;
        out.extend((0..b.len()).map(|r| (b.tstart()[r], b.row(r))));
    }
    Ok(out)
}

fn flip(path: &Path, offset_from_end: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    let i = bytes.len() - offset_from_end;
    bytes[i] ^= 0x20;
    std::fs::write(path, bytes).unwrap();
}

/// The one file in the database's `segments/`: a pack when `packed`.
fn segment_file(dir: &Path, packed: bool) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let ext = if packed { "pack" } else { "seg" };
    assert!(files[0].extension().is_some_and(|e| e == ext), "{files:?}");
    files[0].clone()
}

fn assert_correct_prefix(events: &[(i64, Vec<Value>)]) {
    for (i, (ts, row)) in events.iter().enumerate() {
        assert_eq!(*ts, i as i64);
        assert_eq!(
            row,
            &vec![Value::Long(ts * 3), Value::String(format!("v{}", ts % 4))]
        );
    }
}

#[test]
fn intact_database_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), true);
    let events = read_all(dir.path()).unwrap();
    assert_eq!(events.len(), 2300);
    assert_correct_prefix(&events);
}

#[test]
fn flipped_byte_in_segment_data_is_an_error() {
    for packed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path(), packed);
        let segment = segment_file(dir.path(), packed);
        let len = std::fs::metadata(&segment).unwrap().len() as usize;
        flip(&segment, len - 20); // inside the first block's timestamps
        let err = read_all(dir.path()).expect_err("damaged block was read");
        assert!(err.to_string().contains("checksum"), "{err}");
    }
}

#[test]
fn flipped_byte_in_segment_footer_fails_the_open() {
    for packed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path(), packed);
        flip(&segment_file(dir.path(), packed), 40);
        let err = read_all(dir.path()).expect_err("damaged footer was read");
        assert!(
            matches!(
                err,
                Failure::Open(OpenError::Failed(EngineError::Storage(_)))
            ),
            "{err}"
        );
        assert!(err.to_string().contains("segment"), "{err}");
    }
}

#[test]
fn flipped_byte_in_manifest_fails_the_open() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), true);
    flip(&dir.path().join("MANIFEST"), 10);
    let err = read_all(dir.path()).expect_err("damaged manifest was read");
    assert!(err.to_string().contains("manifest"), "{err}");
}

/// Damage inside the last write of a log closed cleanly looks exactly like a write torn by
/// a crash (docs/ARCHITECTURE.md, "Why an acknowledged event survives a crash"): it is cut.
#[test]
fn flipped_byte_in_log_tail_truncates_at_the_last_good_record() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), true);
    let wal = dir.path().join("wal");
    let log = last_log_file(&wal);
    flip(&log, 30); // inside the last record
    let events = read_all(dir.path()).unwrap();
    assert_eq!(
        events.len(),
        2200,
        "the damaged last batch is cut, the rest stays"
    );
    assert_correct_prefix(&events);
    // The log was truncated: new appends continue after the last good record.
    let db = Db::open(dir.path(), Options::default()).unwrap();
    let schema = Arc::new(Schema::parse_spec("X:LONG,S:STRING").unwrap());
    db.append("s", batch(&schema, 2200..2300)).unwrap();
    drop(db);
    let events = read_all(dir.path()).unwrap();
    assert_eq!(events.len(), 2300);
    assert_correct_prefix(&events);
}

/// The log records after the checkpoint of a database built by [`build`]: (LSN, frame
/// length) of each of its three logged batches, each written by its own group commit.
fn logged_batches(dir: &Path) -> (PathBuf, u64, Vec<(u64, usize)>) {
    let log = last_log_file(&dir.join("wal"));
    let start = tidemark_storage::log::parse_file_name(&log).unwrap();
    let bytes = std::fs::read(&log).unwrap();
    let checkpoint = Manifest::load(dir).unwrap().unwrap().checkpoint_lsn;
    let (frames, _) = tidemark_storage::log::read_frames(&bytes, start);
    let batches: Vec<(u64, usize)> = frames
        .iter()
        .filter(|(lsn, _)| *lsn >= checkpoint)
        .map(|(lsn, payload)| (*lsn, tidemark_storage::log::FRAME_HEADER + payload.len()))
        .collect();
    assert_eq!(batches.len(), 3);
    (log, start, batches)
}

/// A flipped byte in the middle of the log, past the checkpoint, with an acknowledged batch
/// after it (issue 42: the open cut it silently): the open is refused, naming the file, the
/// damage and the way out, and changes nothing; the repair saves every byte it cuts, and
/// the database then opens with every event before the damage.
#[test]
fn flipped_byte_in_the_middle_of_the_log_refuses_the_open_until_repaired() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), true);
    let (log, start, batches) = logged_batches(dir.path());
    let (lsn, len) = batches[1];
    let mut bytes = std::fs::read(&log).unwrap();
    bytes[(lsn - start) as usize + len / 2] ^= 0x20;
    std::fs::write(&log, &bytes).unwrap();

    let err = read_all(dir.path()).expect_err("mid-log damage was cut as a torn tail");
    let Failure::Open(OpenError::CorruptLog(corrupt)) = &err else {
        panic!("{err}")
    };
    assert_eq!((&corrupt.file, corrupt.lsn), (&log, lsn));
    assert_eq!(corrupt.offset, lsn - start);
    assert_eq!(corrupt.records_after, 1);
    assert!(matches!(
        corrupt.evidence,
        Evidence::LaterWrite { lsn: later } if later == batches[2].0
    ));
    let message = err.to_string();
    let advice = format!(
        "tidemark verify --repair --data-dir {}",
        dir.path().display()
    );
    assert!(
        message.contains(&log.display().to_string())
            && message.contains(&format!("at byte {}", lsn - start))
            && message.contains(&advice),
        "{message}"
    );
    assert_eq!(
        std::fs::read(&log).unwrap(),
        bytes,
        "a refused open cuts nothing"
    );

    let repaired = Db::repair_log(dir.path()).unwrap().expect("a corrupt log");
    assert_eq!(repaired.damage.lsn, lsn);
    assert_eq!(
        std::fs::read(&repaired.saved).unwrap(),
        &bytes[(lsn - start) as usize..]
    );
    assert!(repaired.saved.starts_with(dir.path().join("wal")));
    assert!(std::fs::read_to_string(&repaired.note)
        .unwrap()
        .contains("NOT in the database"));
    let events = read_all(dir.path()).unwrap();
    assert_eq!(events.len(), 2100, "everything before the damaged batch");
    assert_correct_prefix(&events);
    assert!(Db::repair_log(dir.path()).unwrap().is_none());

    // Appends go on after the cut, and survive a reopen.
    let db = Db::open(dir.path(), Options::default()).unwrap();
    let schema = Arc::new(Schema::parse_spec("X:LONG,S:STRING").unwrap());
    db.append("s", batch(&schema, 2100..2300)).unwrap();
    drop(db);
    let events = read_all(dir.path()).unwrap();
    assert_eq!(events.len(), 2300);
    assert_correct_prefix(&events);
}

/// A repair is refused while the database is open elsewhere (a running server holds it).
#[test]
fn a_repair_waits_for_the_directory_lock() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), true);
    let db = Db::open(dir.path(), Options::default()).unwrap();
    assert!(matches!(
        Db::repair_log(dir.path()),
        Err(OpenError::Locked(_))
    ));
    drop(db);
    assert!(
        Db::repair_log(dir.path()).unwrap().is_none(),
        "an intact log"
    );
}

#[test]
fn missing_segment_fails_the_open() {
    for packed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path(), packed);
        std::fs::remove_file(segment_file(dir.path(), packed)).unwrap();
        let err = read_all(dir.path()).expect_err("missing segment went unnoticed");
        let kind = if packed { "pack" } else { "segment" };
        assert!(err.to_string().contains(kind), "{err}");
    }
}

#[test]
fn lost_log_fails_the_open_instead_of_starting_over() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), true);
    let wal = dir.path().join("wal");
    for entry in std::fs::read_dir(&wal).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let err = read_all(dir.path()).expect_err("a lost log went unnoticed");
    assert!(err.to_string().contains("no log files"), "{err}");
}

#[test]
fn log_cut_before_the_checkpoint_fails_the_open() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), true);
    // A checkpoint now covers the three logged batches; then the log loses its end.
    Db::open(dir.path(), Options::default())
        .unwrap()
        .close()
        .unwrap();
    let log = last_log_file(&dir.path().join("wal"));
    let len = std::fs::metadata(&log).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let err = read_all(dir.path()).expect_err("a log shorter than the checkpoint went unnoticed");
    assert!(err.to_string().contains("checkpoint"), "{err}");
}

/// The log file with the highest start (a released file kept for reuse is not one).
fn last_log_file(wal: &Path) -> PathBuf {
    std::fs::read_dir(wal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension() == Some("log".as_ref()))
        .max()
        .unwrap()
}

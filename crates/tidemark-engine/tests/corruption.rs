//! Damaged files give a clear error or a truncation at the last good record, never wrong
//! data.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tidemark_core::{BatchBuilder, EventBatch, Schema, Value};
use tidemark_engine::{Db, EngineError, Options, ScanRequest};

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

/// Every event the scan returns, or the scan's error.
fn read_all(dir: &Path) -> Result<Vec<(i64, Vec<Value>)>, EngineError> {
    let db = Db::open(dir, Options::default())?;
    let mut out = Vec::new();
    for b in db.scan("s", &ScanRequest::default())? {
        let b = b?;
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
        assert!(matches!(err, EngineError::Storage(_)), "{err}");
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

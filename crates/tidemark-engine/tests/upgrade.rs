//! Data directories written by earlier builds: log format 1 is upgraded on open, format 2
//! (no write marks) is read as it is, a format newer than this build's is refused with both
//! versions named.
//!
//! `tests/fixtures/log-format-1` was written by the build before log format 2 (commit
//! 3bc8894): `streams create ticks` and `gone`, `put` of 2 events into ticks and `streams
//! retention ticks --max-age 3650d` (checkpointed into a segment), then through `serve`: 2
//! more events into ticks, `later` created with 1 event, `gone` dropped, and `kill -9`
//! (those four records only in the log, a flush's temporary file left behind).

use std::path::Path;

use tidemark_core::Value;
use tidemark_engine::{Db, OpenError, Options, ScanRequest};
use tidemark_storage::manifest::{Manifest, LOG_FORMAT};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/log-format-1");
    copy_dir(&fixture, dir.path());
    dir
}

fn column(db: &Db, stream: &str, field: usize) -> Vec<(i64, Value)> {
    let mut out = Vec::new();
    for batch in db.scan(stream, &ScanRequest::default()).unwrap() {
        let batch = batch.unwrap();
        for row in 0..batch.len() {
            out.push((batch.tstart()[row], batch.row(row)[field].clone()));
        }
    }
    out
}

fn check_contents(db: &Db) {
    assert_eq!(db.list_streams(), ["later", "ticks"], "gone was dropped");
    assert_eq!(
        column(db, "ticks", 1),
        [
            (1_700_000_000_000_000_000, Value::Double(189.5)),
            (1_700_000_001_000_000_000, Value::Double(402.25)),
            (1_700_000_002_000_000_000, Value::Double(190.0)),
            (1_700_000_003_000_000_000, Value::Null),
        ]
    );
    assert_eq!(
        db.stream_info("ticks").unwrap().retention.max_age_ns,
        Some(3650 * 86_400 * 1_000_000_000)
    );
    assert_eq!(
        column(db, "later", 1),
        [(1_700_000_004_000_000_000, Value::String("seven".into()))]
    );
}

#[test]
fn a_format_1_directory_is_upgraded_on_open_and_keeps_every_event() {
    let dir = fixture();
    let before = Manifest::load(dir.path()).unwrap().unwrap();
    assert_eq!(before.log_format, 1, "the fixture predates log formats");

    let db = Db::open(dir.path(), Options::default()).unwrap();
    check_contents(&db);
    let after = Manifest::load(dir.path()).unwrap().unwrap();
    assert_eq!(after.log_format, LOG_FORMAT);
    let old_log_end = std::fs::metadata(dir.path().join("wal/00000000000000000000.log"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(
        after.log_start() >= old_log_end,
        "replay starts past every record of the old format"
    );
    assert!(
        !dir.path().join("segments/000000000005.tmp").exists(),
        "the interrupted flush's file is gone"
    );

    // Events stored before streams had positions have none; the stream counts from its
    // replay point on, and a consumer reads what it counted.
    let request = |after| tidemark_engine::PositionRequest::after(after, 100);
    let schema = db.stream_schema("ticks").unwrap();
    let mut b = tidemark_core::BatchBuilder::new(schema.clone(), 1);
    let values: Vec<Value> = schema.fields().iter().map(|_| Value::Null).collect();
    b.push_row(1_700_000_009_000_000_000, None, &values)
        .unwrap();
    let given = db.append("ticks", b.finish()).unwrap().positions.unwrap();
    let read = db.read_positions("ticks", &request(None)).unwrap();
    assert_eq!(read.last_position(), Some(given.last));
    assert_eq!(read.next_position, given.last + 1);
    let caught_up = db
        .read_positions("ticks", &request(Some(given.last)))
        .unwrap();
    assert!(caught_up.events.is_empty());
    assert_eq!(
        column(&db, "ticks", 0).len(),
        5,
        "old events are read by time"
    );

    // Written in the new format after the old records, and all of it read back.
    db.create_stream("new", tidemark_core::Schema::parse_spec("A:LONG").unwrap())
        .unwrap();
    drop(db); // no flush: the new records are replayed from the log
    let db = Db::open(dir.path(), Options::default()).unwrap();
    check_contents_with_new(&db);
}

fn check_contents_with_new(db: &Db) {
    assert_eq!(db.list_streams(), ["later", "new", "ticks"]);
    assert_eq!(column(db, "ticks", 0).len(), 5);
}

/// Log format 2 had no write marks: a build of format 3 reads such a log as it is, and
/// says format 3 in the manifest before it writes its first marked frame (a format 2 build
/// would take those for torn frames and cut the log: it refuses a newer format instead).
#[test]
fn a_format_2_directory_is_read_as_it_is_and_marked_format_3_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let schema = tidemark_core::Schema::parse_spec("A:LONG").unwrap();
    let db = Db::open(dir.path(), Options::default()).unwrap();
    db.create_stream("s", schema.clone()).unwrap();
    for ts in 0..3 {
        let mut b = tidemark_core::BatchBuilder::new(std::sync::Arc::new(schema.clone()), 0);
        b.push_row(ts, None, &[Value::Long(ts)]).unwrap();
        db.append("s", b.finish()).unwrap();
    }
    drop(db);
    // What a build of format 2 left: the same frames without marks, manifest format 2.
    let wal = dir.path().join("wal");
    for entry in std::fs::read_dir(&wal).unwrap() {
        let path = entry.unwrap().path();
        let Some(start) = tidemark_storage::log::parse_file_name(&path) else {
            continue;
        };
        let mut bytes = std::fs::read(&path).unwrap();
        let mut at = 0;
        while at < bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            bytes[at + 15] &= 0x7f;
            at += tidemark_storage::log::FRAME_HEADER + len;
        }
        assert_eq!(
            tidemark_storage::log::read_frames(&bytes, start).1,
            tidemark_storage::log::FrameEnd::Clean
        );
        std::fs::write(&path, bytes).unwrap();
    }
    let mut manifest = Manifest::load(dir.path()).unwrap().unwrap();
    manifest.log_format = 2;
    manifest.store(dir.path()).unwrap();

    let db = Db::open(dir.path(), Options::default()).unwrap();
    assert_eq!(
        Manifest::load(dir.path()).unwrap().unwrap().log_format,
        LOG_FORMAT
    );
    assert_eq!(column(&db, "s", 0).len(), 3);
    let mut b = tidemark_core::BatchBuilder::new(std::sync::Arc::new(schema), 0);
    b.push_row(3, None, &[Value::Long(3)]).unwrap();
    db.append("s", b.finish()).unwrap();
    drop(db);
    let db = Db::open(dir.path(), Options::default()).unwrap();
    assert_eq!(column(&db, "s", 0).len(), 4);
}

#[test]
fn a_directory_of_a_newer_format_is_refused_naming_both_formats() {
    let dir = fixture();
    let mut manifest = Manifest::load(dir.path()).unwrap().unwrap();
    manifest.log_format = LOG_FORMAT + 1;
    manifest.store(dir.path()).unwrap();
    let error = match Db::open(dir.path(), Options::default()) {
        Err(e) => e,
        Ok(_) => panic!("a newer format was opened"),
    };
    assert!(matches!(error, OpenError::UnsupportedFormat { .. }));
    let message = error.to_string();
    assert!(
        message.contains(&format!("log format {}", LOG_FORMAT + 1))
            && message.contains(&format!("formats 1 to {LOG_FORMAT}")),
        "{message}"
    );
}

#[test]
fn a_new_directory_starts_in_this_builds_format() {
    let dir = tempfile::tempdir().unwrap();
    drop(Db::open(dir.path(), Options::default()).unwrap());
    let manifest = Manifest::load(dir.path())
        .unwrap()
        .expect("written at creation");
    assert_eq!(manifest.log_format, LOG_FORMAT);
}

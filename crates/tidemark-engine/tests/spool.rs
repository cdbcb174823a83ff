//! An embedded database's idempotent producers, and a database as a spool (the agent's):
//! what each keeps across checkpoints and reopens.

use tidemark_core::command::{self, Command};
use tidemark_core::{BatchBuilder, EventBatch, ProducerSeq, Schema, Value};
use tidemark_engine::{Db, Engine, EngineError, Options, ScanRequest, Spool, SpoolOptions};

fn schema() -> Schema {
    Schema::parse_spec("V:LONG").unwrap()
}

fn batch(first: i64, n: i64) -> EventBatch {
    let mut b = BatchBuilder::new(schema().into(), n as usize);
    for i in first..first + n {
        b.push_row(i * 1_000, None, &[Value::Long(i)]).unwrap();
    }
    b.finish()
}

fn tagged(sequence: u64, first: i64) -> Command<EventBatch> {
    Command::Append {
        name: "s".into(),
        batch: batch(first, 10),
        producer: Some(ProducerSeq {
            producer: 7,
            sequence,
            part: 0,
        }),
    }
}

fn events(db: &Engine) -> usize {
    db.scan("s", &ScanRequest::default())
        .unwrap()
        .map(|b| b.unwrap().len())
        .sum()
}

fn options() -> Options {
    Options {
        out_of_order_window_ns: None,
        log_file_bytes: 1 << 10,
        ..Options::default()
    }
}

#[test]
fn a_producers_retry_is_stored_once_across_checkpoints_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    db.create_stream("s", schema()).unwrap();
    db.submit(tagged(1, 0)).unwrap();
    db.submit(tagged(1, 0)).unwrap(); // the retry of a lost answer
    db.submit(tagged(2, 10)).unwrap();
    db.submit(tagged(1, 0)).unwrap(); // late
    assert_eq!(events(&db), 20);
    drop(db); // no flush: the log is replayed by the same rule

    let db = Db::open(dir.path(), options()).unwrap();
    assert_eq!(events(&db), 20);
    db.submit(tagged(2, 10)).unwrap();
    db.flush().unwrap(); // the table goes into the manifest; the log is released
    db.close().unwrap();

    let db = Db::open(dir.path(), options()).unwrap();
    db.submit(tagged(2, 10)).unwrap();
    db.submit(tagged(3, 20)).unwrap();
    assert_eq!(events(&db), 30);
    // An untagged append is never a retry.
    db.append("s", batch(0, 10)).unwrap();
    assert_eq!(events(&db), 40);
}

/// Checkpoints taken while tagged appends (and their retries) come in leave appends after
/// a stream's replay point and before the checkpoint: a replay must apply exactly the ones
/// that were applied, though the checkpointed table is past all their tags.
#[test]
fn appends_replayed_below_a_checkpoint_keep_their_first_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    db.create_stream("s", schema()).unwrap();
    let batches = 400i64;
    std::thread::scope(|s| {
        let db = &db;
        let writer = s.spawn(move || {
            for i in 0..batches {
                db.submit(tagged(i as u64 + 1, i * 10)).unwrap();
                db.submit(tagged(i as u64 + 1, i * 10)).unwrap(); // a retry
            }
        });
        while !writer.is_finished() {
            db.flush().unwrap();
        }
    });
    assert_eq!(events(&db), batches as usize * 10);
    drop(db); // no last flush: the log after the checkpoint is replayed
    let db = Db::open(dir.path(), options()).unwrap();
    assert_eq!(events(&db), batches as usize * 10);
    // And once more from the manifest that reopening wrote.
    db.flush().unwrap();
    db.submit(tagged(1, 0)).unwrap();
    drop(db);
    let db = Db::open(dir.path(), options()).unwrap();
    assert_eq!(events(&db), batches as usize * 10);
}

fn spool_limits(max_bytes: u64) -> SpoolOptions {
    SpoolOptions {
        max_bytes,
        min_free_bytes: 0,
    }
}

/// The appends a spool's records hold, as (sequence of first value, events).
fn spooled_appends(db: &Spool, from: u64) -> (Vec<i64>, u64) {
    let mut firsts = Vec::new();
    let mut end = from;
    loop {
        let records = db.read_spooled(end, 1000).unwrap();
        let Some(last) = records.last() else {
            return (firsts, end);
        };
        end = last.lsn + 16 + last.payload.len() as u64;
        for record in &records {
            if let Command::Append { batch, .. } = command::decode(&record.payload).unwrap() {
                let mut r = tidemark_storage::bytes::Reader::new(batch, "batch");
                let decoded =
                    tidemark_core::wire::decode_batch(&mut r, &std::sync::Arc::new(schema()))
                        .unwrap();
                firsts.push(match decoded.row(0)[0] {
                    Value::Long(v) => v,
                    ref other => panic!("{other:?}"),
                });
            }
        }
    }
}

#[test]
fn a_spool_logs_appends_keeps_them_until_released_and_refuses_beyond_its_cap() {
    let dir = tempfile::tempdir().unwrap();
    let db = Spool::open(dir.path(), options(), spool_limits(64 << 10)).unwrap();
    db.create_stream("s", schema()).unwrap();
    for i in 0..20 {
        db.append("s", batch(i * 10, 10)).unwrap();
    }
    assert_eq!(events(&db.engine()), 0, "a spool keeps no events");
    let (firsts, end) = spooled_appends(&db, db.spooled_start());
    assert_eq!(firsts, (0..20).map(|i| i * 10).collect::<Vec<_>>());
    assert_eq!(end, db.spooled_end());

    // A checkpoint releases nothing the reader has not released.
    db.checkpoint().unwrap();
    // Log files only: a released file may be kept as the next one under another name.
    let files = || {
        std::fs::read_dir(dir.path().join("wal"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("log".as_ref()))
            .count()
    };
    let before = files();
    assert!(before > 1, "1 KiB log files must have rolled");
    drop(db);
    let db = Spool::open(dir.path(), options(), spool_limits(64 << 10)).unwrap();
    assert_eq!(spooled_appends(&db, db.spooled_start()).0.len(), 20);

    // Released up to the 11th append: the files before it go at the next checkpoint.
    let records = db.read_spooled(db.spooled_start(), 1 << 20).unwrap();
    let eleventh = records[11].lsn; // records[0] is the create
    db.release_spooled_before(eleventh).unwrap();
    db.checkpoint().unwrap();
    assert!(files() < before);
    let (firsts, _) = spooled_appends(&db, eleventh);
    assert_eq!(firsts, (10..20).map(|i| i * 10).collect::<Vec<_>>());

    // The cap: refused (retryable) once the unreleased bytes reach it, taken again after.
    let refused = loop {
        match db.append("s", batch(0, 10)) {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(matches!(refused, EngineError::Overloaded(_)), "{refused}");
    assert!(db.spooled_bytes() >= 64 << 10);
    db.release_spooled_before(db.spooled_end()).unwrap();
    db.append("s", batch(0, 10)).unwrap();
}

/// Bytes of the spool's log directory: its log files and any spare.
fn log_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

#[test]
fn a_drained_spool_gives_its_log_space_back_and_keeps_no_spare() {
    let dir = tempfile::tempdir().unwrap();
    let options = || Options {
        // Files larger than what is written: only the reclaim can free the one in use.
        log_file_bytes: 64 << 20,
        ..options()
    };
    let db = Spool::open(dir.path(), options(), spool_limits(1 << 30)).unwrap();
    db.create_stream("s", schema()).unwrap();
    for i in 0..200 {
        db.append("s", batch(i * 1_000, 1_000)).unwrap();
    }
    let written = log_bytes(dir.path());
    assert!(written > 2 << 20, "{written}");

    db.release_spooled_before(db.spooled_end()).unwrap();
    db.checkpoint().unwrap();
    let drained = log_bytes(dir.path());
    assert!(
        drained < 64 << 10,
        "a drained spool keeps {drained} of {written} bytes"
    );
    assert!(!dir.path().join("wal").join("spare.log-recycled").exists());

    // The log goes on after the reclaim, across a reopen.
    db.append("s", batch(0, 10)).unwrap();
    drop(db);
    let db = Spool::open(dir.path(), options(), spool_limits(1 << 30)).unwrap();
    let (firsts, _) = spooled_appends(&db, db.spooled_start());
    assert_eq!(firsts, vec![0]);
    assert!(log_bytes(dir.path()) < 64 << 10);
}

#[test]
fn a_spool_refuses_appends_while_its_disk_keeps_less_than_its_reserve() {
    let dir = tempfile::tempdir().unwrap();
    let reserve = |min_free_bytes| SpoolOptions {
        max_bytes: 1 << 30,
        min_free_bytes,
    };
    let db = Spool::open(dir.path(), options(), reserve(u64::MAX)).unwrap();
    db.create_stream("s", schema()).unwrap();
    let refused = db.append("s", batch(0, 10)).unwrap_err();
    assert!(
        matches!(&refused, EngineError::Overloaded(why) if why.contains("free")),
        "{refused}"
    );
    assert_eq!(
        spooled_appends(&db, db.spooled_start()).0,
        Vec::<i64>::new()
    );
    drop(db);
    let db = Spool::open(dir.path(), options(), reserve(1)).unwrap();
    db.append("s", batch(0, 10)).unwrap();
}

//! Replicas: a database whose log is its cluster's. Re-applying the whole log after a
//! restart (with or without checkpoints in between) and opening an exported checkpoint must
//! each give every event exactly once.

use std::sync::Arc;

use tidemark_core::wire::encode_batch;
use tidemark_core::{BatchBuilder, Schema, Value};
use tidemark_engine::{
    Command, CommandLog, Engine, EngineError, LogStats, Options, PositionRequest, Replica,
    ScanRequest,
};
use tidemark_storage::pace::WritePace;
use tidemark_storage::StorageError;

/// The cluster's log, as a replica sees it: written and replayed elsewhere.
struct ClusterLog;

impl CommandLog for ClusterLog {
    fn checkpointed(&self, _position: u64, _pace: &WritePace) -> Result<(), StorageError> {
        Ok(())
    }
    fn stats(&self) -> LogStats {
        LogStats::default()
    }
    fn failure(&self) -> Option<String> {
        None
    }
}

fn open(dir: impl AsRef<std::path::Path>, options: Options) -> Replica {
    Replica::open(dir, options, Arc::new(ClusterLog)).unwrap()
}

fn schema() -> Schema {
    Schema::parse_spec("SYMBOL:STRING,PRICE:FLOAT").unwrap()
}

/// The log a cluster would hold: position i is entry i.
fn log() -> Vec<Vec<u8>> {
    let schema = Arc::new(schema());
    (0..40)
        .map(|i| {
            let mut b = BatchBuilder::new(schema.clone(), 0);
            for j in 0..25 {
                let ts = i * 100 + j;
                b.push_row(
                    ts,
                    None,
                    &[Value::String("AAPL".into()), Value::Float(ts as f32)],
                )
                .unwrap();
            }
            let mut body = Vec::new();
            encode_batch(&b.finish(), &mut body).unwrap();
            body
        })
        .collect()
}

/// Applies positions `range` of the log: 0 creates the stream, 20 clears it, 30 drops and 31
/// re-creates it, the rest append.
fn apply(db: &Replica, log: &[Vec<u8>], range: std::ops::Range<usize>) {
    for position in range {
        let command = match position {
            0 | 31 => Command::CreateStream {
                name: "ticks".into(),
                schema: schema(),
                evolving: false,
                partition: tidemark_core::Partition::DAY,
            },
            20 => Command::Clear {
                name: "ticks".into(),
            },
            30 => Command::DropStream {
                name: "ticks".into(),
            },
            _ => Command::Append {
                name: "ticks".into(),
                batch: log[position].as_slice(),
                producer: None,
            },
        };
        db.apply_replicated(position as u64, command).unwrap();
    }
}

fn timestamps(db: &Engine) -> Vec<i64> {
    let mut out = Vec::new();
    for batch in db.scan("ticks", &ScanRequest::default()).unwrap() {
        out.extend_from_slice(batch.unwrap().tstart());
    }
    out
}

/// Each event's (stream position, tstart), in position order.
fn positions(db: &Engine) -> Vec<(u64, i64)> {
    let request = PositionRequest::after(None, 100_000);
    let events = db.read_positions("ticks", &request).unwrap().events;
    (0..events.len())
        .map(|r| (events.position_at(r).unwrap(), events.tstart()[r]))
        .collect()
}

/// The positions of what log positions `..end` leave in the stream: the stream created
/// again at 31 counts from 0; before, the clear at 20 removed positions 0 to 474.
fn expected_positions(end: usize) -> Vec<(u64, i64)> {
    let first = if end > 31 { 32 } else { 21 };
    let counted_from = if end > 31 { 32 } else { 1 };
    let skipped = |p: usize| usize::from(p > 20 && first == 21);
    expected(end)
        .into_iter()
        .map(|ts| {
            let (entry, j) = ((ts / 100) as usize, (ts % 100) as u64);
            let before = (entry - counted_from - skipped(entry)) as u64 * 25;
            (before + j, ts)
        })
        .collect()
}

/// What positions `..end` leave in the stream.
fn expected(end: usize) -> Vec<i64> {
    let first = if end > 31 { 32 } else { 21 };
    (first..end.max(first))
        .filter(|&p| p != 30 && p != 31)
        .flat_map(|p| (0..25).map(move |j| p as i64 * 100 + j))
        .collect()
}

fn small() -> Options {
    Options {
        memtable_bytes: 4 << 10,
        ..Options::default()
    }
}

#[test]
fn reapplying_the_log_after_a_restart_gives_every_event_once() {
    let log = log();
    for flushed_at in [0, 10, 25, 31, 35, 40] {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = open(dir.path(), small());
            apply(&db, &log, 0..flushed_at);
            db.flush().unwrap();
            apply(&db, &log, flushed_at..40);
            assert_eq!(timestamps(&db), expected(40));
            assert_eq!(positions(&db), expected_positions(40));
            // Dropped without a flush: what came after `flushed_at` is only in memory
            // (and in the cluster's log).
        }
        let db = open(dir.path(), small());
        assert!(db.applied_position() >= flushed_at as u64);
        apply(&db, &log, 0..40);
        assert_eq!(timestamps(&db), expected(40), "flushed at {flushed_at}");
        // The same positions as before the restart, whatever the checkpoint held.
        assert_eq!(
            positions(&db),
            expected_positions(40),
            "flushed at {flushed_at}"
        );
        assert_eq!(db.applied_position(), 40);
    }
}

#[test]
fn an_exported_checkpoint_opens_as_a_replica_that_continues_the_log() {
    let log = log();
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path().join("a"), small());
    apply(&db, &log, 0..35);
    let export = dir.path().join("export");
    let exported = db.export_checkpoint(&export).unwrap();
    assert_eq!(exported.log_start, 35);
    assert!(exported.segments > 0 && exported.bytes > 0);
    apply(&db, &log, 35..40);
    drop(db);

    let copy = open(&export, small());
    assert_eq!(timestamps(&copy), expected(35));
    assert_eq!(positions(&copy), expected_positions(35));
    apply(&copy, &log, exported.log_start as usize..40);
    assert_eq!(timestamps(&copy), expected(40));
    assert_eq!(positions(&copy), expected_positions(40));
}

#[test]
fn replicas_report_command_errors() {
    // (A replica has no write API: `Replica` offers none, so no test is needed for it.)
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path(), Options::default());
    assert!(matches!(
        db.apply_replicated(
            0,
            Command::Clear {
                name: "nope".into()
            }
        ),
        Err(EngineError::UnknownStream(_))
    ));
    assert_eq!(
        db.applied_position(),
        1,
        "a failed command is still a position"
    );
    let other = Schema::parse_spec("X:INTEGER").unwrap();
    db.apply_replicated(
        1,
        Command::CreateStream {
            name: "ticks".into(),
            schema: schema(),
            evolving: false,
            partition: tidemark_core::Partition::DAY,
        },
    )
    .unwrap();
    assert!(matches!(
        db.apply_replicated(
            2,
            Command::CreateStream {
                name: "ticks".into(),
                schema: other,
                evolving: false,
                partition: tidemark_core::Partition::DAY,
            }
        ),
        Err(EngineError::StreamExists { .. })
    ));
    assert!(db
        .apply_replicated(
            3,
            Command::Append {
                name: "ticks".into(),
                batch: &[1, 2, 3],
                producer: None,
            }
        )
        .is_err());
    assert_eq!(db.applied_position(), 4);
}

/// The partition travels in the stream's CREATE, through the log's bytes, so every replica
/// cuts its flushes at the same boundaries and keeps the partition in its checkpoints
/// (a snapshot is one); a create with another partition is refused alike.
#[test]
fn a_replica_cuts_segments_at_the_partition_its_create_carried() {
    const HOUR: i64 = 3_600_000_000_000;
    let hourly = tidemark_core::Partition::new(HOUR).unwrap();
    let create = |partition| {
        tidemark_core::command::encode_to_vec(&Command::<&[u8]>::CreateStream {
            name: "ticks".into(),
            schema: schema(),
            evolving: false,
            partition,
        })
        .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path().join("a"), Options::default());
    let logged = create(hourly);
    db.apply_replicated(0, tidemark_core::command::decode(&logged).unwrap())
        .unwrap();
    let mut b = BatchBuilder::new(Arc::new(schema()), 0);
    for ts in [10, HOUR + 10, 2 * HOUR + 10, 2 * HOUR + 20] {
        b.push_row(ts, None, &[Value::String("AAPL".into()), Value::Float(1.0)])
            .unwrap();
    }
    let mut body = Vec::new();
    encode_batch(&b.finish(), &mut body).unwrap();
    let append = Command::Append {
        name: "ticks".into(),
        batch: body.as_slice(),
        producer: None,
    };
    db.apply_replicated(1, append).unwrap();
    let daily = create(tidemark_core::Partition::DAY);
    assert!(matches!(
        db.apply_replicated(2, tidemark_core::command::decode(&daily).unwrap()),
        Err(EngineError::StreamExists { existing, .. }) if existing == "partition 1h"
    ));
    let export = dir.path().join("export");
    db.export_checkpoint(&export).unwrap();
    for replica in [&db, &open(&export, Options::default())] {
        let info = replica.stream_info("ticks").unwrap();
        assert_eq!(info.partition, hourly);
        assert_eq!(info.segments, 3, "one per hour");
        assert_eq!(
            timestamps(replica),
            [10, HOUR + 10, 2 * HOUR + 10, 2 * HOUR + 20]
        );
    }
}

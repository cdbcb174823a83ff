//! The embedded API end to end: streams, appends, scans, aggregates, clear, drop, retention,
//! reopen, and every kind of refused input.

use std::sync::Arc;

use tidemark_core::{AggFn, BatchBuilder, EventBatch, Schema, Value};
use tidemark_engine::{
    AggregateRequest, Aggregation, CmpOp, Db, EngineError, OpenError, Options, Predicate,
    Retention, ScanRequest, SegmentOptions, TimeRange,
};

fn schema() -> Schema {
    Schema::parse_spec("SYMBOL:STRING,SECURITYTYPE:INTEGER,LASTTRADEPRICE:FLOAT").unwrap()
}

fn ticks(schema: &Arc<Schema>, timestamps: impl IntoIterator<Item = i64>) -> EventBatch {
    let mut b = BatchBuilder::new(schema.clone(), 0);
    for ts in timestamps {
        let symbol = ["AAPL", "MSFT", "GOOG"][(ts % 3) as usize];
        let price = if ts % 10 == 9 {
            Value::Null
        } else {
            Value::Float(ts as f32 / 10.0)
        };
        b.push_row(
            ts,
            None,
            &[
                Value::String(symbol.into()),
                Value::Integer((ts % 4) as i32),
                price,
            ],
        )
        .unwrap();
    }
    b.finish()
}

fn all_events(db: &Db, stream: &str, request: &ScanRequest) -> Vec<(i64, Vec<Value>)> {
    let mut out = Vec::new();
    for batch in db.scan(stream, request).unwrap() {
        let batch = batch.unwrap();
        for r in 0..batch.len() {
            out.push((batch.tstart()[r], batch.row(r)));
        }
    }
    out
}

fn small_options() -> Options {
    Options {
        memtable_bytes: 16 << 10,
        // These tests count segments; compaction has its own test.
        compact_min_segments: 0,
        segment: SegmentOptions {
            max_block_events: 100,
            min_block_events: 10,
            block_align_ns: 1000,
            group_size: 3,
            ..SegmentOptions::default()
        },
        ..Options::default()
    }
}

#[test]
fn append_scan_aggregate_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), small_options()).unwrap();
    db.create_stream("ticks", schema()).unwrap();
    db.create_stream("ticks", schema()).unwrap(); // idempotent
    let s = Arc::new(schema());
    for chunk in (0..5000).collect::<Vec<_>>().chunks(500) {
        let ack = db
            .append("ticks", ticks(&s, chunk.iter().copied()))
            .unwrap();
        assert_eq!(ack.events, 500);
    }
    db.flush().unwrap();
    db.append("ticks", ticks(&s, 5000..5100)).unwrap(); // stays in the memtable

    let info = db.stream_info("ticks").unwrap();
    assert_eq!(info.event_count, 5100);
    assert_eq!(info.time_range, Some((0, 5099)));
    assert_eq!(info.flushed_events, 5000);
    assert!(info.segments >= 1 && info.bytes_on_disk > 0);
    let per_event = info.compressed_bytes_per_event.unwrap();
    assert!(per_event < 13.0, "{per_event} bytes per event");

    let events = all_events(&db, "ticks", &ScanRequest::default());
    assert_eq!(events.len(), 5100);
    assert!(events.iter().enumerate().all(|(i, e)| e.0 == i as i64));

    let request = ScanRequest {
        range: TimeRange::new(100, 2999),
        fields: Some(vec!["lasttradeprice".into(), "SYMBOL".into()]),
        filter: vec![
            Predicate::Compare {
                field: "symbol".into(),
                op: CmpOp::Eq,
                value: Value::String("MSFT".into()),
            },
            Predicate::IsNotNull {
                field: "LASTTRADEPRICE".into(),
            },
        ],
        batch_size: 77,
    };
    let mut scan = db.scan("ticks", &request).unwrap();
    assert_eq!(scan.schema().fields()[0].name, "LASTTRADEPRICE");
    assert!(scan.all(|b| b.unwrap().len() <= 77));
    let filtered = all_events(&db, "ticks", &request);
    let expected: Vec<i64> = (100..3000).filter(|t| t % 3 == 1 && t % 10 != 9).collect();
    assert_eq!(filtered.iter().map(|e| e.0).collect::<Vec<_>>(), expected);
    assert_eq!(
        filtered[0].1,
        vec![Value::Float(10.0), Value::String("MSFT".into())]
    );

    let request = AggregateRequest {
        range: TimeRange::half_open(0, 5100),
        bucket_ns: Some(1000),
        aggregations: vec![
            Aggregation::count(),
            Aggregation::new(AggFn::Count, "LASTTRADEPRICE"),
            Aggregation::new(AggFn::Max, "LASTTRADEPRICE"),
            Aggregation::new(AggFn::Sum, "SECURITYTYPE"),
            Aggregation::new(AggFn::First, "LASTTRADEPRICE"),
            Aggregation::new(AggFn::Last, "SECURITYTYPE"),
        ],
    };
    let rows = db.aggregate("ticks", &request).unwrap();
    assert_eq!(rows.len(), 6);
    assert_eq!(rows[0].bucket_start, Some(0));
    assert_eq!(rows[0].values[0], Value::Long(1000));
    assert_eq!(rows[0].values[1], Value::Long(900));
    assert_eq!(rows[0].values[2], Value::Float(99.8));
    assert_eq!(rows[0].values[3], Value::Long(1500));
    assert_eq!(rows[0].values[4], Value::Float(0.0));
    assert_eq!(rows[0].values[5], Value::Integer(3));
    assert_eq!(rows[5].bucket_start, Some(5000));
    assert_eq!(rows[5].values[0], Value::Long(100));
    drop(db);

    // Reopen: the flushed segments and the replayed log give the same answers.
    let db = Db::open(dir.path(), small_options()).unwrap();
    assert_eq!(db.aggregate("ticks", &request).unwrap(), rows);
    assert_eq!(
        all_events(&db, "ticks", &ScanRequest::default()).len(),
        5100
    );
    db.close().unwrap();
}

#[test]
fn clear_drop_and_retention() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), small_options()).unwrap();
    let s = Arc::new(schema());
    db.create_stream("a", schema()).unwrap();
    db.create_stream("b", schema()).unwrap();
    db.append("a", ticks(&s, 0..1000)).unwrap();
    db.append("b", ticks(&s, 0..1000)).unwrap();
    db.flush().unwrap();
    db.append("a", ticks(&s, 1000..1100)).unwrap();
    db.clear("a").unwrap();
    assert_eq!(db.stream_info("a").unwrap().event_count, 0);
    assert!(all_events(&db, "a", &ScanRequest::default()).is_empty());
    db.append("a", ticks(&s, 0..10)).unwrap(); // the window restarts after a clear
    db.drop_stream("b").unwrap();
    assert_eq!(db.list_streams(), vec!["a".to_string()]);
    assert!(matches!(
        db.stream_info("b"),
        Err(EngineError::UnknownStream(_))
    ));
    db.create_stream("b", Schema::parse_spec("X:LONG").unwrap())
        .unwrap();
    db.flush().unwrap();
    drop(db);

    let db = Db::open(dir.path(), small_options()).unwrap();
    assert_eq!(db.stream_info("a").unwrap().event_count, 10);
    assert_eq!(db.stream_info("b").unwrap().event_count, 0);
    assert_eq!(db.list_streams(), vec!["a".to_string(), "b".to_string()]);

    // Retention by bytes keeps the newest segments within the limit.
    db.create_stream("r", schema()).unwrap();
    for i in 0..5 {
        db.append("r", ticks(&s, i * 1000..(i + 1) * 1000)).unwrap();
        db.flush().unwrap();
    }
    let before = db.stream_info("r").unwrap();
    assert_eq!(before.segments, 5);
    let limit = before.bytes_on_disk / 2;
    db.set_retention(
        "r",
        Retention {
            max_age_ns: None,
            max_bytes: Some(limit),
        },
    )
    .unwrap();
    db.flush().unwrap();
    let after = db.stream_info("r").unwrap();
    assert!(after.bytes_on_disk <= limit && after.segments < 5 && after.segments > 0);
    assert_eq!(
        after.time_range.map(|r| r.1),
        Some(4999),
        "the newest events stay"
    );
    // Retention by age: these events are from 1970, so all of them go.
    db.set_retention(
        "r",
        Retention {
            max_age_ns: Some(1_000_000_000),
            max_bytes: None,
        },
    )
    .unwrap();
    db.flush().unwrap();
    assert_eq!(db.stream_info("r").unwrap().event_count, 0);
    let files = std::fs::read_dir(dir.path().join("segments"))
        .unwrap()
        .count();
    assert_eq!(
        files,
        db.stream_info("a").unwrap().segments,
        "retired files are deleted"
    );
    assert!(db
        .set_retention(
            "r",
            Retention {
                max_age_ns: Some(0),
                max_bytes: None
            }
        )
        .is_err());
}

#[test]
fn refuses_bad_input_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), Options::default()).unwrap();
    let s = Arc::new(schema());
    for bad in ["", "a/b", "..", "tab\there"] {
        assert!(
            matches!(
                db.create_stream(bad, schema()),
                Err(EngineError::Invalid(_))
            ),
            "{bad:?}"
        );
    }
    db.create_stream("ticks", schema()).unwrap();
    assert!(matches!(
        db.create_stream("ticks", Schema::parse_spec("A:LONG").unwrap()),
        Err(EngineError::StreamExists { .. })
    ));
    assert!(matches!(
        db.append("nope", ticks(&s, 0..1)),
        Err(EngineError::UnknownStream(_))
    ));

    let other = Arc::new(
        Schema::parse_spec("SYMBOL:STRING,SECURITYTYPE:LONG,LASTTRADEPRICE:FLOAT").unwrap(),
    );
    let mut b = BatchBuilder::new(other, 1);
    b.push_row(1, None, &[Value::Null, Value::Null, Value::Null])
        .unwrap();
    assert!(matches!(
        db.append("ticks", b.finish()),
        Err(EngineError::Invalid(_))
    ));

    let mut b = BatchBuilder::new(s.clone(), 2);
    b.push_row(
        1,
        None,
        &[Value::String("ok".into()), Value::Null, Value::Null],
    )
    .unwrap();
    b.push_row(
        2,
        None,
        &[Value::String("x".repeat(70_000)), Value::Null, Value::Null],
    )
    .unwrap();
    assert!(matches!(
        db.append("ticks", b.finish()),
        Err(EngineError::ValueTooLong { row: 1, .. })
    ));

    let hour = 3_600_000_000_000i64;
    db.append("ticks", ticks(&s, [10 * hour])).unwrap();
    let late = db.append("ticks", ticks(&s, [10 * hour + 5, 8 * hour]));
    assert!(
        matches!(late, Err(EngineError::TooLate { row: 1, .. })),
        "{late:?}"
    );
    assert_eq!(
        db.stream_info("ticks").unwrap().event_count,
        1,
        "nothing of a refused batch is stored"
    );
    db.append("ticks", ticks(&s, [9 * hour + 1])).unwrap(); // within the window

    let bad_agg = AggregateRequest {
        range: TimeRange::ALL,
        bucket_ns: None,
        aggregations: vec![Aggregation::new(AggFn::Sum, "SYMBOL")],
    };
    assert!(matches!(
        db.aggregate("ticks", &bad_agg),
        Err(EngineError::InvalidRequest(_))
    ));
    let bad_filter = ScanRequest {
        filter: vec![Predicate::Compare {
            field: "SYMBOL".into(),
            op: CmpOp::Lt,
            value: Value::Long(3),
        }],
        ..ScanRequest::default()
    };
    assert!(db.scan("ticks", &bad_filter).is_err());
    let unknown_field = ScanRequest {
        fields: Some(vec!["nope".into()]),
        ..ScanRequest::default()
    };
    assert!(db.scan("ticks", &unknown_field).is_err());

    assert!(matches!(
        Db::open(dir.path(), Options::default()),
        Err(OpenError::Locked(_))
    ));
    drop(db);

    // A batch over max_batch_bytes is refused before it reaches the log: nothing of it is
    // stored, now or after a reopen.
    let other = tempfile::tempdir().unwrap();
    let limited = Options {
        max_batch_bytes: 10_000,
        ..Options::default()
    };
    let small = Db::open(other.path(), limited.clone()).unwrap();
    small.create_stream("ticks", schema()).unwrap();
    small.append("ticks", ticks(&s, 0..100)).unwrap();
    let big = small.append("ticks", ticks(&s, 0..1000));
    assert!(
        matches!(big, Err(EngineError::BatchTooLarge { max: 10_000, .. })),
        "{big:?}"
    );
    drop(small);
    let small = Db::open(other.path(), limited).unwrap();
    assert_eq!(small.stream_info("ticks").unwrap().event_count, 100);
    drop(small);
    let db = Db::open(dir.path(), Options::default()).unwrap();
    assert_eq!(db.stream_info("ticks").unwrap().event_count, 2);
}

#[test]
fn concurrent_appends_share_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), small_options()).unwrap();
    let s = Arc::new(schema());
    for i in 0..50 {
        db.create_stream(&format!("s{i}"), schema()).unwrap();
    }
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (db, s) = (&db, s.clone());
            scope.spawn(move || {
                for i in 0..100 {
                    let stream = format!("s{}", (t * 100 + i) % 50);
                    db.append(&stream, ticks(&s, [i as i64; 10])).unwrap();
                }
            });
        }
    });
    let total: u64 = (0..50)
        .map(|i| db.stream_info(&format!("s{i}")).unwrap().event_count)
        .sum();
    assert_eq!(total, 4000);
    let wal_files = std::fs::read_dir(dir.path().join("wal"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("log".as_ref()))
        .count();
    assert!(
        wal_files <= 2,
        "one shared log, not a file per stream ({wal_files} files)"
    );
}

#[test]
fn appends_wait_for_flushes_instead_of_growing_memory() {
    let dir = tempfile::tempdir().unwrap();
    // Every append exceeds the unflushed limit, so each one waits for a flush first.
    let options = Options {
        memtable_bytes: 1 << 10,
        max_unflushed_bytes: 2 << 10,
        ..small_options()
    };
    let db = Db::open(dir.path(), options).unwrap();
    db.create_stream("s", schema()).unwrap();
    let s = Arc::new(schema());
    for i in 0..20 {
        db.append("s", ticks(&s, i * 100..(i + 1) * 100)).unwrap();
    }
    let info = db.stream_info("s").unwrap();
    assert_eq!(info.event_count, 2000);
    assert!(
        info.segments >= 10,
        "flushes kept up with appends: {} segments",
        info.segments
    );
    assert_eq!(all_events(&db, "s", &ScanRequest::default()).len(), 2000);
}

/// [`small_options`] with compaction: runs of 4 segments below 10,000 events are merged.
fn compacting_options() -> Options {
    Options {
        compact_min_segments: 4,
        compact_small_events: 10_000,
        ..small_options()
    }
}

#[test]
fn small_segments_are_compacted_without_changing_answers() {
    let dir = tempfile::tempdir().unwrap();
    let options = compacting_options();
    let db = Db::open(dir.path(), options.clone()).unwrap();
    db.create_stream("s", schema()).unwrap();
    let s = Arc::new(schema());
    // Sixteen flushes of overlapping, out-of-order batches: ties and overlaps everywhere.
    for i in 0..16i64 {
        let start = (i % 4) * 100;
        db.append("s", ticks(&s, (start..start + 300).rev()))
            .unwrap();
        db.flush().unwrap();
    }
    let info = db.stream_info("s").unwrap();
    assert_eq!(info.event_count, 16 * 300);
    assert!(
        info.segments < 16,
        "{} segments after 16 flushes",
        info.segments
    );
    let files = std::fs::read_dir(dir.path().join("segments"))
        .unwrap()
        .count();
    assert_eq!(files, info.segments, "merged segments' files are deleted");

    let events = all_events(&db, "s", &ScanRequest::default());
    assert_eq!(events.len(), 4800);
    assert!(events.windows(2).all(|w| w[0].0 <= w[1].0));
    let request = AggregateRequest {
        range: TimeRange::ALL,
        bucket_ns: Some(50),
        aggregations: vec![
            Aggregation::count(),
            Aggregation::new(AggFn::First, "SECURITYTYPE"),
            Aggregation::new(AggFn::Sum, "LASTTRADEPRICE"),
        ],
    };
    let before = db.aggregate("s", &request).unwrap();
    drop(db);
    let db = Db::open(dir.path(), options).unwrap();
    assert_eq!(db.aggregate("s", &request).unwrap(), before);
    assert_eq!(all_events(&db, "s", &ScanRequest::default()), events);
}

#[test]
fn compaction_in_the_middle_keeps_insertion_order_of_ties() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(schema());
    // All events share one timestamp; SECURITYTYPE says which append they came from.
    let marked = |marker: i32, n: usize| {
        let mut b = BatchBuilder::new(s.clone(), n);
        for _ in 0..n {
            b.push_row(
                100,
                None,
                &[
                    Value::String("X".into()),
                    Value::Integer(marker),
                    Value::Null,
                ],
            )
            .unwrap();
        }
        b.finish()
    };
    let db = Db::open(dir.path(), small_options()).unwrap(); // compaction off
    db.create_stream("s", schema()).unwrap();
    for (marker, n) in [(1, 10), (2, 10), (3, 1000)] {
        db.append("s", marked(marker, n)).unwrap();
        db.flush().unwrap();
    }
    drop(db);
    // Now the two small segments before the big one are merged, in place.
    let options = Options {
        compact_min_segments: 2,
        compact_small_events: 100,
        ..small_options()
    };
    let db = Db::open(dir.path(), options).unwrap();
    db.flush().unwrap();
    assert_eq!(db.stream_info("s").unwrap().segments, 2);
    let markers: Vec<Value> = all_events(&db, "s", &ScanRequest::default())
        .into_iter()
        .map(|e| e.1[1].clone())
        .collect();
    let expected: Vec<Value> = [(1, 10), (2, 10), (3, 1000)]
        .iter()
        .flat_map(|&(m, n)| std::iter::repeat_n(Value::Integer(m), n))
        .collect();
    assert_eq!(markers, expected);
    let request = AggregateRequest {
        range: TimeRange::ALL,
        bucket_ns: None,
        aggregations: vec![
            Aggregation::new(AggFn::First, "SECURITYTYPE"),
            Aggregation::new(AggFn::Last, "SECURITYTYPE"),
        ],
    };
    assert_eq!(
        db.aggregate("s", &request).unwrap()[0].values,
        vec![Value::Integer(1), Value::Integer(3)]
    );
}

/// The files in a database's `segments/` folder with their sizes, by name.
fn segment_files(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            (name, e.metadata().unwrap().len())
        })
        .collect();
    files.sort();
    files
}

/// A flush of more streams than the flusher fsyncs as one group (256), then their
/// compactions (also more than a group): every stream keeps every event, across a reopen,
/// and no temporary file is left behind. With each segment in a file of its own, and with
/// the small segments sharing packs (the default): then the four flushes' packs are gone
/// once their segments are merged, and the merged segments share one.
#[test]
fn flushes_and_compactions_of_many_streams_keep_every_event() {
    for packed in [false, true] {
        let options = Options {
            pack_below_bytes: if packed { 1 << 20 } else { 0 },
            ..compacting_options()
        };
        many_streams_flush_and_compact(options, if packed { ".pack" } else { ".seg" });
    }
}

fn many_streams_flush_and_compact(options: Options, file_kind: &str) {
    const STREAMS: i64 = 300;
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options.clone()).unwrap();
    let s = Arc::new(schema());
    for stream in 0..STREAMS {
        db.create_stream(&format!("s{stream}"), schema()).unwrap();
    }
    for flush in 0..4 {
        for stream in 0..STREAMS {
            let first = flush * 10 + stream;
            db.append(&format!("s{stream}"), ticks(&s, first..first + 10))
                .unwrap();
        }
        db.flush().unwrap();
    }
    let expected = |stream: i64| -> Vec<i64> {
        let mut ts: Vec<i64> = (0..4)
            .flat_map(|flush| (flush * 10 + stream)..(flush * 10 + stream + 10))
            .collect();
        ts.sort();
        ts
    };
    let check = |db: &Db| {
        for stream in 0..STREAMS {
            let name = format!("s{stream}");
            let info = db.stream_info(&name).unwrap();
            assert_eq!(info.segments, 1, "{name}: its four flushes were merged");
            let events = all_events(db, &name, &ScanRequest::default());
            let ts: Vec<i64> = events.iter().map(|e| e.0).collect();
            assert_eq!(ts, expected(stream), "{name}");
        }
    };
    check(&db);
    let files = segment_files(dir.path());
    assert!(files.iter().all(|f| f.0.ends_with(file_kind)), "{files:?}");
    if file_kind == ".seg" {
        assert_eq!(files.len(), STREAMS as usize);
    } else {
        assert!(files.len() * 10 < STREAMS as usize, "{files:?}");
    }
    // Every byte left on disk belongs to a live segment: the flushed segments' packs were
    // deleted with the last segment in them.
    let live: u64 = (0..STREAMS)
        .map(|stream| db.stream_info(&format!("s{stream}")).unwrap().bytes_on_disk)
        .sum();
    assert_eq!(files.iter().map(|f| f.1).sum::<u64>(), live);
    drop(db);
    check(&Db::open(dir.path(), options).unwrap());
}

/// Ten streams flush into one pack; nine are dropped. The tenth's segment alone keeps the
/// pack, nine tenths dead, alive, until a checkpoint rewrites it elsewhere and the pack is
/// deleted with its last segment.
#[test]
fn a_mostly_dead_pack_is_rewritten_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        compact_min_segments: 4,
        memtable_bytes: 1 << 20, // no flush before the test asks for one
        ..small_options()
    };
    let db = Db::open(dir.path(), options.clone()).unwrap();
    let s = Arc::new(schema());
    for stream in 0..10 {
        db.create_stream(&format!("s{stream}"), schema()).unwrap();
    }
    for stream in 0..10 {
        db.append(&format!("s{stream}"), ticks(&s, 0..20)).unwrap();
    }
    db.flush().unwrap();
    let before = segment_files(dir.path());
    assert_eq!(before.len(), 1, "{before:?}");
    assert!(before[0].0.ends_with(".pack"));

    for stream in 1..10 {
        db.drop_stream(&format!("s{stream}")).unwrap();
    }
    // A checkpoint retires the dropped streams' segments; the next finds the pack mostly
    // dead and moves s0's segment out.
    db.flush().unwrap();
    db.flush().unwrap();

    let after = segment_files(dir.path());
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(after[0].0, before[0].0, "a new pack");
    assert_eq!(after[0].1, db.stream_info("s0").unwrap().bytes_on_disk);
    let check = |db: &Db| {
        let ts: Vec<i64> = all_events(db, "s0", &ScanRequest::default())
            .iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(ts, (0..20).collect::<Vec<_>>());
        assert_eq!(db.stream_info("s0").unwrap().segments, 1);
    };
    check(&db);
    drop(db);
    check(&Db::open(dir.path(), options).unwrap());
    assert_eq!(segment_files(dir.path()), after);
}

#[test]
fn each_stream_has_its_own_out_of_order_window_kept_across_replay_and_checkpoint() {
    const HOUR: i64 = 3_600_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let schema = Arc::new(schema());
    let newest = 1_700_000_000_000_000_000;
    let backfill = newest - 48 * HOUR;
    let open = || Db::open(dir.path(), Options::default()).unwrap();

    let db = open();
    for stream in ["live", "history"] {
        db.create_stream(stream, (*schema).clone()).unwrap();
        db.append(stream, ticks(&schema, [newest])).unwrap();
    }
    let info = db.stream_info("history").unwrap();
    assert_eq!(info.out_of_order_window_ns, Some(HOUR), "the default");
    assert!(!info.own_out_of_order_window);
    let refused = db.append("history", ticks(&schema, [backfill]));
    let Err(EngineError::TooLate { window_ns, .. }) = &refused else {
        panic!("a backfill two days back was not refused: {refused:?}");
    };
    assert_eq!(*window_ns, HOUR);
    let message = refused.unwrap_err().to_string();
    assert!(
        message.contains("streams window history --set"),
        "{message}"
    );
    assert!(matches!(
        db.set_out_of_order_window("history", Some(-1)),
        Err(EngineError::InvalidRequest(_))
    ));

    db.set_out_of_order_window("history", Some(7 * 24 * HOUR))
        .unwrap();
    db.append("history", ticks(&schema, [backfill])).unwrap();
    assert!(
        matches!(
            db.append("live", ticks(&schema, [backfill])),
            Err(EngineError::TooLate { .. })
        ),
        "the other stream keeps the default"
    );

    // Replayed from the log (no checkpoint), then read from the manifest (checkpointed).
    drop(db);
    let db = open();
    assert_eq!(
        db.stream_info("history").unwrap().out_of_order_window_ns,
        Some(7 * 24 * HOUR)
    );
    db.close().unwrap();
    let db = open();
    let info = db.stream_info("history").unwrap();
    assert_eq!(info.out_of_order_window_ns, Some(7 * 24 * HOUR));
    assert!(info.own_out_of_order_window);
    db.append("history", ticks(&schema, [backfill + 1]))
        .unwrap();
    assert_eq!(db.stream_info("history").unwrap().event_count, 3);

    db.set_out_of_order_window("history", Some(i64::MAX))
        .unwrap();
    db.append("history", ticks(&schema, [0])).unwrap();
    db.set_out_of_order_window("history", None).unwrap();
    assert!(!db.stream_info("history").unwrap().own_out_of_order_window);
    assert!(matches!(
        db.append("history", ticks(&schema, [backfill])),
        Err(EngineError::TooLate { .. })
    ));
}

/// An async caller runs a small append in place when nothing would block; a catalog change
/// (which waits for its fsync) comes back untouched for the blocking pool, and a refused
/// append is refused as `submit` would refuse it.
#[test]
fn try_submit_queued_runs_appends_in_place_and_hands_back_catalog_changes() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Arc::new(schema());
    let db = Db::open(dir.path(), Options::default()).unwrap();
    let create = tidemark_core::Command::CreateStream {
        name: "s".into(),
        schema: (*schema).clone(),
        evolving: false,
        partition: tidemark_core::Partition::DAY,
    };
    let Ok(Err(create)) = db.try_submit_queued(create) else {
        panic!("a catalog change was run in place");
    };
    db.submit(create).unwrap();
    let append = |stream: &str, ts: i64| tidemark_core::Command::Append {
        name: stream.into(),
        batch: ticks(&schema, [ts]),
        producer: None,
    };
    let Ok(Ok(pending)) = db.try_submit_queued(append("s", 1)) else {
        panic!("a small append with room was not queued");
    };
    assert_eq!(pending.wait().unwrap().events, 1);
    assert!(matches!(
        db.try_submit_queued(append("nope", 1)),
        Err(EngineError::UnknownStream(_))
    ));
    assert_eq!(db.stream_info("s").unwrap().event_count, 1);
}

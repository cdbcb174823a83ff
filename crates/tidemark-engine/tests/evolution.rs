//! Schemas that grow: fields added to an evolving stream read as null in every event stored
//! before (in segments, in memtables, in the log replayed on open, across compaction), and
//! the engine answers scans and aggregates as a simple model of the rows says it must.

use std::sync::Arc;

use tidemark_core::{AggFn, BatchBuilder, EventBatch, Field, FieldType, Schema, Value};
use tidemark_engine::{
    AggregateRequest, Aggregation, CmpOp, Db, EngineError, Options, Predicate, ScanRequest,
    SegmentOptions, TimeRange,
};

fn options() -> Options {
    Options {
        memtable_bytes: 16 << 10,
        compact_min_segments: 0,
        segment: SegmentOptions {
            max_block_events: 16,
            min_block_events: 4,
            block_align_ns: 1000,
            group_size: 2,
            ..SegmentOptions::default()
        },
        ..Options::default()
    }
}

fn first_schema() -> Schema {
    Schema::parse_spec("host:STRING,usage:DOUBLE").unwrap()
}

fn added() -> Vec<Field> {
    vec![
        Field::new("cores", FieldType::Long),
        Field::new("up", FieldType::Boolean),
    ]
}

/// The rows every answer is checked against: full rows under the newest schema.
#[derive(Default)]
struct Model {
    rows: Vec<(i64, Vec<Value>)>,
    width: usize,
}

impl Model {
    fn widen(&mut self, width: usize) {
        self.width = width;
        for (_, row) in &mut self.rows {
            row.resize(width, Value::Null);
        }
    }

    /// Events `range` (timestamps `100 * i`) built under `schema` and recorded in the model.
    fn batch(&mut self, schema: &Arc<Schema>, range: std::ops::Range<i64>) -> EventBatch {
        let mut b = BatchBuilder::new(schema.clone(), 0);
        for i in range {
            let mut row = vec![
                Value::String(format!("h{}", i % 3)),
                Value::Double(i as f64 / 4.0),
            ];
            if schema.len() > 2 {
                row.push(if i % 4 == 0 {
                    Value::Null
                } else {
                    Value::Long(i % 7)
                });
                row.push(Value::Boolean(i % 2 == 0));
            }
            b.push_row(100 * i, None, &row).unwrap();
            row.resize(self.width.max(row.len()), Value::Null);
            self.rows.push((100 * i, row));
        }
        b.finish()
    }

    fn matching(
        &self,
        keep: impl Fn(&[Value]) -> bool,
        fields: &[usize],
    ) -> Vec<(i64, Vec<Value>)> {
        let mut rows: Vec<_> = self
            .rows
            .iter()
            .filter(|(_, row)| keep(row))
            .map(|(ts, row)| (*ts, fields.iter().map(|&f| row[f].clone()).collect()))
            .collect();
        rows.sort_by_key(|r| r.0);
        rows
    }
}

fn scanned(db: &Db, request: &ScanRequest) -> Vec<(i64, Vec<Value>)> {
    let mut out = Vec::new();
    for batch in db.scan("cpu", request).unwrap() {
        let batch = batch.unwrap();
        for r in 0..batch.len() {
            out.push((batch.tstart()[r], batch.row(r)));
        }
    }
    out
}

/// Every answer of the database agrees with the model.
fn check(db: &Db, model: &Model, when: &str) {
    let all: Vec<usize> = (0..model.width).collect();
    assert_eq!(
        scanned(db, &ScanRequest::default()),
        model.matching(|_| true, &all),
        "{when}: all events"
    );
    let request = ScanRequest {
        fields: Some(vec!["cores".into(), "host".into()]),
        filter: vec![Predicate::IsNull {
            field: "cores".into(),
        }],
        ..ScanRequest::default()
    };
    assert_eq!(
        scanned(db, &request),
        model.matching(|r| r[2] == Value::Null, &[2, 0]),
        "{when}: cores is null"
    );
    let request = ScanRequest {
        fields: Some(vec!["up".into()]),
        filter: vec![Predicate::Compare {
            field: "cores".into(),
            op: CmpOp::Gt,
            value: Value::Long(2),
        }],
        ..ScanRequest::default()
    };
    assert_eq!(
        scanned(db, &request),
        model.matching(|r| matches!(r[2], Value::Long(c) if c > 2), &[3]),
        "{when}: cores > 2"
    );
    // Bucketed so that some buckets fold whole summaries and others read rows.
    let request = AggregateRequest {
        range: TimeRange::new(250, i64::MAX),
        bucket_ns: Some(1000),
        aggregations: vec![
            Aggregation::new(AggFn::Count, "cores"),
            Aggregation::new(AggFn::Max, "cores"),
            Aggregation::new(AggFn::Count, "usage"),
        ],
    };
    let answered: Vec<(i64, u64, Vec<Value>)> = db
        .aggregate("cpu", &request)
        .unwrap()
        .into_iter()
        .map(|row| (row.bucket_start.unwrap(), row.events, row.values))
        .collect();
    let mut expected: Vec<(i64, u64, Vec<Value>)> = Vec::new();
    for (ts, row) in model.matching(|_| true, &all) {
        if ts < 250 {
            continue;
        }
        let bucket = ts - ts.rem_euclid(1000);
        if expected.last().is_none_or(|e| e.0 != bucket) {
            expected.push((bucket, 0, vec![Value::Long(0), Value::Null, Value::Long(0)]));
        }
        let Some((_, events, values)) = expected.last_mut() else {
            unreachable!("pushed above")
        };
        *events += 1;
        if let Value::Long(c) = row[2] {
            values[0] = Value::Long(long(&values[0]) + 1);
            values[1] = Value::Long(match values[1] {
                Value::Long(m) => m.max(c),
                _ => c,
            });
        }
        values[2] = Value::Long(long(&values[2]) + 1);
    }
    assert_eq!(answered, expected, "{when}: aggregates");
}

fn long(value: &Value) -> i64 {
    match value {
        Value::Long(v) => *v,
        _ => 0,
    }
}

#[test]
fn fields_added_read_as_null_before_and_survive_flush_reopen_replay_and_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = Model {
        width: 2,
        ..Model::default()
    };
    let narrow = Arc::new(first_schema());
    let db = Db::open(dir.path(), options()).unwrap();
    db.create_evolving_stream("cpu", first_schema()).unwrap();
    db.append("cpu", model.batch(&narrow, 0..40)).unwrap();
    db.flush().unwrap(); // a segment of the first schema
    db.append("cpu", model.batch(&narrow, 40..50)).unwrap(); // a memtable batch of it

    db.add_fields("cpu", added()).unwrap();
    model.widen(4);
    let wide = db.stream_schema("cpu").unwrap();
    assert_eq!(
        wide.to_spec(),
        "host:STRING,usage:DOUBLE,cores:LONG,up:BOOLEAN"
    );
    assert!(db.stream_info("cpu").unwrap().evolving);
    check(&db, &model, "added, nothing new yet");

    db.append("cpu", model.batch(&wide, 50..70)).unwrap();
    // A writer that built its batch before the fields were added is still taken.
    db.append("cpu", model.batch(&narrow, 70..75)).unwrap();
    check(&db, &model, "mixed memtable");
    db.flush().unwrap();
    check(&db, &model, "flushed");

    drop(db);
    let db = Db::open(dir.path(), options()).unwrap();
    assert_eq!(db.stream_schema("cpu").unwrap(), wide);
    check(&db, &model, "reopened");

    // Replayed from the log: an append, fields added, appends of both widths.
    db.append("cpu", model.batch(&wide, 75..80)).unwrap();
    db.add_fields("cpu", vec![Field::new("note", FieldType::String)])
        .unwrap();
    model.widen(5);
    let wider = db.stream_schema("cpu").unwrap();
    db.append("cpu", model.batch(&narrow, 80..85)).unwrap();
    db.append("cpu", model.batch(&wide, 85..90)).unwrap();
    drop(db);
    let db = Db::open(dir.path(), options()).unwrap();
    assert_eq!(db.stream_schema("cpu").unwrap(), wider);
    check(&db, &model, "replayed");
    db.flush().unwrap();
    drop(db);

    // Segments of three widths merged into one.
    let compacting = Options {
        compact_min_segments: 2,
        compact_small_events: 1_000,
        ..options()
    };
    let db = Db::open(dir.path(), compacting).unwrap();
    let before = db.stream_info("cpu").unwrap().segments;
    db.flush().unwrap();
    let after = db.stream_info("cpu").unwrap().segments;
    assert!(after < before, "{before} segments compacted into {after}");
    check(&db, &model, "compacted");
    drop(db);
    let db = Db::open(dir.path(), options()).unwrap();
    check(&db, &model, "compacted and reopened");
}

#[test]
fn a_strict_stream_and_a_retyped_field_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    db.create_stream("strict", first_schema()).unwrap();
    let error = db.add_fields("strict", added()).unwrap_err();
    assert!(error.to_string().contains("strict schema"), "{error}");
    // Fields it already has are no change at all, strict or not.
    db.add_fields("strict", vec![Field::new("USAGE", FieldType::Double)])
        .unwrap();
    assert_eq!(*db.stream_schema("strict").unwrap(), first_schema());
    // A strict stream takes only batches of its own schema.
    let mut model = Model::default();
    let narrower = Arc::new(Schema::parse_spec("host:STRING").unwrap());
    let mut b = BatchBuilder::new(narrower, 1);
    b.push_row(1, None, &[Value::String("h".into())]).unwrap();
    assert!(db.append("strict", b.finish()).is_err());

    db.create_evolving_stream("cpu", first_schema()).unwrap();
    let error = db
        .add_fields(
            "cpu",
            vec![
                Field::new("cores", FieldType::Long),
                Field::new("usage", FieldType::String),
            ],
        )
        .unwrap_err();
    assert!(matches!(error, EngineError::Invalid(_)), "{error:?}");
    assert!(error.to_string().contains("\"usage\" is DOUBLE"), "{error}");
    for bad in ["tstart", "", "a:b"] {
        assert!(db
            .add_fields("cpu", vec![Field::new(bad, FieldType::Long)])
            .is_err());
    }
    assert!(db.add_fields("cpu", Vec::new()).is_err());
    assert!(db.add_fields("nope", added()).is_err());
    assert_eq!(*db.stream_schema("cpu").unwrap(), first_schema());
    // And a batch with a field the stream lacks is refused, not widened the other way.
    let wide = Arc::new(first_schema().with_added(&added()).unwrap());
    model.width = 4;
    assert!(db.append("cpu", model.batch(&wide, 0..3)).is_err());
}

/// What a random history does to an evolving stream.
#[derive(Debug, Clone)]
enum Op {
    /// Events `count` long, built under the first `width` fields of the schema (clamped).
    Append {
        width: usize,
        count: usize,
    },
    AddField,
    Flush,
    Reopen,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (2usize..8, 1usize..40).prop_map(|(width, count)| Op::Append { width, count }),
        2 => Just(Op::AddField),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

/// The value of field `field` of the event at `ts`: host, usage, then LONG fields with nulls.
fn value_of(field: usize, ts: i64) -> Value {
    match field {
        0 => Value::String(format!("h{}", ts % 3)),
        1 => Value::Double(ts as f64 / 8.0),
        _ if (ts + field as i64) % 3 == 0 => Value::Null,
        _ => Value::Long(ts * field as i64),
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// Any interleaving of appends of any width, fields added, flushes and reopens reads
    /// back as the model of full rows says (events stored before a field read it as null).
    #[test]
    fn any_history_of_growth_reads_as_the_model(ops in proptest::collection::vec(op(), 1..30)) {
        let dir = tempfile::tempdir().unwrap();
        let open = || Db::open(dir.path(), Options { compact_min_segments: 2, compact_small_events: 500, ..options() }).unwrap();
        let mut db = open();
        db.create_evolving_stream("cpu", first_schema()).unwrap();
        let mut model = Model { width: 2, ..Model::default() };
        let mut next_ts = 0i64;
        for op in ops {
            match op {
                Op::Append { width, count } => {
                    let schema = db.stream_schema("cpu").unwrap();
                    let width = width.min(schema.len());
                    let prefix = Arc::new(Schema::new(schema.fields()[..width].to_vec()).unwrap());
                    let mut b = BatchBuilder::new(prefix, count);
                    for _ in 0..count {
                        // Out of order within a batch, inside the window.
                        let ts = next_ts + if next_ts % 2 == 0 { 1 } else { -1 };
                        next_ts += 1;
                        let row: Vec<Value> = (0..width).map(|f| value_of(f, ts)).collect();
                        b.push_row(ts, None, &row).unwrap();
                        let mut full = row;
                        full.resize(model.width, Value::Null);
                        model.rows.push((ts, full));
                    }
                    db.append("cpu", b.finish()).unwrap();
                }
                Op::AddField => {
                    let name = format!("f{}", model.width);
                    db.add_fields("cpu", vec![Field::new(name, FieldType::Long)]).unwrap();
                    let width = model.width + 1;
                    model.widen(width);
                }
                Op::Flush => db.flush().unwrap(),
                Op::Reopen => {
                    drop(db);
                    db = open();
                }
            }
        }
        let all: Vec<usize> = (0..model.width).collect();
        let mut expected = model.matching(|_| true, &all);
        let mut scanned_rows = scanned(&db, &ScanRequest::default());
        // Equal timestamps keep insertion order in both; sort only by time for the check.
        expected.sort_by_key(|r| r.0);
        scanned_rows.sort_by_key(|r| r.0);
        proptest::prop_assert_eq!(scanned_rows, expected);
        let last = model.width - 1;
        let last_name = db.stream_schema("cpu").unwrap().fields()[last].name.clone();
        let nulls = ScanRequest {
            filter: vec![Predicate::IsNull { field: last_name.clone() }],
            ..ScanRequest::default()
        };
        let mut expected = model.matching(|r| r[last].is_null(), &all);
        let mut scanned_rows = scanned(&db, &nulls);
        expected.sort_by_key(|r| r.0);
        scanned_rows.sort_by_key(|r| r.0);
        proptest::prop_assert_eq!(scanned_rows, expected);
        let request = AggregateRequest {
            range: TimeRange::ALL,
            bucket_ns: None,
            aggregations: vec![Aggregation::new(AggFn::Count, &last_name)],
        };
        let counted = db.aggregate("cpu", &request).unwrap()[0].values[0].clone();
        let non_null = model.rows.iter().filter(|(_, r)| !r[last].is_null()).count() as i64;
        proptest::prop_assert_eq!(counted, Value::Long(non_null));
    }
}

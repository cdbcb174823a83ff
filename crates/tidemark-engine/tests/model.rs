//! Property test: the engine against a plain in-memory model.
//!
//! Random interleavings of in-order and out-of-order appends (with many equal timestamps),
//! flushes, clears, reopens, scans with filters, bucketed aggregates and reads by position
//! must give exactly the model's answers; named consumers that read, commit, disconnect
//! before committing and resume through reopens and clears find their committed position
//! and, after it, exactly the model's next events or the gap by name. Tiny memtables, blocks and groups make every read path run: group
//! summaries, block summaries, partly covered blocks, memtable batches, and merges of
//! overlapping segments.

use std::sync::Arc;

use proptest::prelude::*;
use tidemark_core::{AggFn, BatchBuilder, FieldType, Schema, Value};
use tidemark_engine::{
    AggregateRequest, Aggregation, CmpOp, Db, EngineError, Options, PositionRequest, Positions,
    Predicate, ScanRequest, SegmentOptions, TimeRange,
};

const STREAMS: [&str; 2] = ["alpha", "beta"];

fn schema() -> Schema {
    Schema::parse_spec("V:LONG,F:DOUBLE,S:STRING").unwrap()
}

/// One event of the model: tstart, tend, then V, F, S (each nullable).
#[derive(Debug, Clone)]
struct Event {
    ts: i64,
    tend: Option<i64>,
    values: Vec<Value>,
}

#[derive(Debug, Clone)]
enum Op {
    Append {
        stream: usize,
        events: Vec<Event>,
        /// Sent after the stream's newest event, as a metrics agent does (small batches
        /// in order grow the memtable's last batch).
        in_order: bool,
    },
    Flush,
    Reopen,
    Clear {
        stream: usize,
    },
    Scan {
        stream: usize,
        range: (i64, i64),
        filter: Option<(CmpOp, i64)>,
        null_filter: bool,
    },
    Aggregate {
        stream: usize,
        range: (i64, i64),
        bucket: Option<i64>,
    },
    /// Reads by position after `after` (`None`: from the earliest held), as a consumer does.
    Read {
        stream: usize,
        after: Option<u64>,
        limit: usize,
        /// A few events' bytes at times, so that reads are cut by bytes, not only by count.
        max_bytes: usize,
    },
    /// A named consumer reads after its committed position and, unless it disconnects
    /// first (`commit` false), commits what it read.
    Consume {
        stream: usize,
        consumer: usize,
        limit: usize,
        max_bytes: usize,
        commit: bool,
    },
}

const CONSUMERS: [&str; 2] = ["billing", "audit"];

fn event() -> impl Strategy<Value = Event> {
    let v = prop_oneof![1 => Just(Value::Null), 4 => (-50i64..50).prop_map(Value::Long)];
    let f = prop_oneof![
        1 => Just(Value::Null),
        1 => Just(Value::Double(f64::NAN)),
        1 => Just(Value::Double(-0.0)),
        6 => (-100i32..100).prop_map(|x| Value::Double(f64::from(x) / 4.0)),
    ];
    let s = prop_oneof![1 => Just(Value::Null), 3 => "[ab]{0,2}".prop_map(Value::String)];
    (0i64..400, proptest::option::of(0i64..5), v, f, s).prop_map(|(ts, dur, v, f, s)| Event {
        ts,
        tend: dur.map(|d| ts + d),
        values: vec![v, f, s],
    })
}

fn op() -> impl Strategy<Value = Op> {
    let stream = 0..STREAMS.len();
    let range = (0i64..700, 0i64..700).prop_map(|(a, b)| (a.min(b), a.max(b)));
    let cmp = proptest::sample::select(vec![
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ]);
    prop_oneof![
        8 => (stream.clone(), proptest::collection::vec(event(), 1..40), any::<bool>())
            .prop_map(|(stream, mut events, sorted)| {
                // Sorted batches take the engine's per-bucket fast paths.
                if sorted {
                    events.sort_by_key(|e| e.ts);
                }
                Op::Append { stream, events, in_order: false }
            }),
        4 => (stream.clone(), proptest::collection::vec(event(), 1..4))
            .prop_map(|(stream, events)| Op::Append { stream, events, in_order: true }),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        1 => stream.clone().prop_map(|stream| Op::Clear { stream }),
        3 => (stream.clone(), range.clone(), proptest::option::of((cmp, -50i64..50)), any::<bool>())
            .prop_map(|(stream, range, filter, null_filter)| Op::Scan { stream, range, filter, null_filter }),
        3 => (stream.clone(), range, proptest::option::of(prop_oneof![Just(1i64), Just(7), Just(50), Just(1000)]))
            .prop_map(|(stream, range, bucket)| Op::Aggregate { stream, range, bucket }),
        3 => (stream.clone(), proptest::option::of(0u64..300), 1usize..50, max_bytes())
            .prop_map(|(stream, after, limit, max_bytes)| Op::Read { stream, after, limit, max_bytes }),
        4 => (stream, 0..CONSUMERS.len(), 1usize..30, max_bytes(), proptest::bool::weighted(0.8))
            .prop_map(|(stream, consumer, limit, max_bytes, commit)| Op::Consume { stream, consumer, limit, max_bytes, commit }),
    ]
}

/// A read's byte bound: the default, or a few events' worth (an event is 32 bytes and its
/// string's length, as the engine counts them).
fn max_bytes() -> impl Strategy<Value = usize> {
    prop_oneof![2 => Just(PositionRequest::DEFAULT_MAX_BYTES), 1 => 16usize..400]
}

/// What the engine counts an event of the model against a read's bytes: 8 bytes for the
/// timestamp and each field, and a string's length.
fn event_bytes(e: &Event) -> usize {
    let text = match &e.values[2] {
        Value::String(s) => s.len(),
        _ => 0,
    };
    8 * (1 + e.values.len()) + text
}

fn options() -> Options {
    Options {
        memtable_bytes: 8192,
        out_of_order_window_ns: None,
        // Merge tiny segments all the time, so compaction runs under every operation mix.
        compact_min_segments: 2,
        compact_small_events: 100,
        // Some segments in packs and some in files of their own, in one stream.
        pack_below_bytes: 1024,
        segment: SegmentOptions {
            max_block_events: 7,
            min_block_events: 2,
            block_align_ns: 10,
            group_size: 2,
            ..SegmentOptions::default()
        },
        ..Options::default()
    }
}

/// The model's answer to an aggregate of one field over events in (ts, insertion) order.
fn model_agg(func: AggFn, ty: FieldType, values: &[(i64, Value)]) -> Value {
    let present: Vec<&Value> = values
        .iter()
        .map(|(_, v)| v)
        .filter(|v| !v.is_null())
        .collect();
    let num = |v: &Value| match v {
        Value::Long(x) => *x as f64,
        Value::Double(x) => *x,
        _ => unreachable!(),
    };
    let total = |a: &&Value, b: &&Value| num(a).total_cmp(&num(b));
    match func {
        AggFn::Count => Value::Long(present.len() as i64),
        _ if present.is_empty() => Value::Null,
        AggFn::Min => present.iter().copied().min_by(total).unwrap().clone(),
        AggFn::Max => present.iter().copied().max_by(total).unwrap().clone(),
        AggFn::First => present[0].clone(),
        AggFn::Last => present[present.len() - 1].clone(),
        AggFn::Sum if ty == FieldType::Long => {
            Value::Long(present.iter().map(|v| num(v) as i64).sum())
        }
        AggFn::Sum => Value::Double(present.iter().map(|v| num(v)).sum()),
        AggFn::Avg => {
            Value::Double(present.iter().map(|v| num(v)).sum::<f64>() / present.len() as f64)
        }
    }
}

fn close_enough(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Double(x), Value::Double(y)) if !x.is_nan() && !y.is_nan() => {
            (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0)
        }
        _ => a.same_as(b),
    }
}

fn passes(e: &Event, filter: Option<(CmpOp, i64)>, null_filter: bool) -> bool {
    if null_filter && !e.values[2].is_null() {
        return false;
    }
    let Some((op, lit)) = filter else { return true };
    let Value::Long(v) = e.values[0] else {
        return false;
    };
    match op {
        CmpOp::Eq => v == lit,
        CmpOp::Ne => v != lit,
        CmpOp::Lt => v < lit,
        CmpOp::Le => v <= lit,
        CmpOp::Gt => v > lit,
        CmpOp::Ge => v >= lit,
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut db = Some(Db::open(dir.path(), options()).unwrap());
    let schema = Arc::new(schema());
    for name in STREAMS {
        db.as_ref()
            .unwrap()
            .create_stream(name, (*schema).clone())
            .unwrap();
    }
    // The model: each stream's events in insertion order, and the position each was given
    // (positions count every event appended, cleared ones too).
    let mut model: Vec<Vec<Event>> = vec![Vec::new(); STREAMS.len()];
    let mut positions: Vec<Vec<u64>> = vec![Vec::new(); STREAMS.len()];
    let mut next_position = vec![0u64; STREAMS.len()];
    // Each named consumer's committed position. A consumer that resumes after it and gets
    // exactly the model's next events (`check_read`), or the gap by name, sees each event
    // once and in order; one that disconnects before committing reads them again.
    let mut commits = vec![[None::<u64>; CONSUMERS.len()]; STREAMS.len()];
    for op in ops {
        let d = db.as_ref().unwrap();
        match op {
            Op::Append {
                stream,
                mut events,
                in_order,
            } => {
                if in_order {
                    let newest = model[stream].iter().map(|e| e.ts).max().unwrap_or(0);
                    for e in &mut events {
                        let length = e.tend.map(|end| end - e.ts);
                        e.ts = newest + e.ts % 5;
                        e.tend = length.map(|l| e.ts + l);
                    }
                    events.sort_by_key(|e| e.ts);
                }
                let mut b = BatchBuilder::new(schema.clone(), events.len());
                for e in &events {
                    b.push_row(e.ts, e.tend, &e.values).unwrap();
                }
                let ack = d.append(STREAMS[stream], b.finish()).unwrap();
                let first = next_position[stream];
                next_position[stream] += events.len() as u64;
                let last = next_position[stream] - 1;
                prop_assert_eq!(ack.positions, Some(Positions { first, last }));
                positions[stream].extend(first..=last);
                model[stream].extend(events);
            }
            Op::Flush => d.flush().unwrap(),
            Op::Reopen => {
                drop(db.take());
                db = Some(Db::open(dir.path(), options()).unwrap());
            }
            Op::Clear { stream } => {
                d.clear(STREAMS[stream]).unwrap();
                model[stream].clear();
                positions[stream].clear();
            }
            Op::Scan {
                stream,
                range,
                filter,
                null_filter,
            } => {
                let mut request = ScanRequest {
                    range: TimeRange::new(range.0, range.1),
                    batch_size: 5,
                    ..ScanRequest::default()
                };
                if let Some((op, lit)) = filter {
                    request.filter.push(Predicate::Compare {
                        field: "v".into(),
                        op,
                        value: Value::Long(lit),
                    });
                }
                if null_filter {
                    request.filter.push(Predicate::IsNull { field: "S".into() });
                }
                let mut got = Vec::new();
                for batch in d.scan(STREAMS[stream], &request).unwrap() {
                    let batch = batch.unwrap();
                    for r in 0..batch.len() {
                        got.push((batch.tstart()[r], batch.tend_at(r), batch.row(r)));
                    }
                }
                let mut expected: Vec<&Event> = model[stream]
                    .iter()
                    .filter(|e| {
                        range.0 <= e.ts && e.ts <= range.1 && passes(e, filter, null_filter)
                    })
                    .collect();
                expected.sort_by_key(|e| e.ts); // stable: insertion order on ties
                prop_assert_eq!(got.len(), expected.len(), "scan {:?} {:?}", range, filter);
                for (g, e) in got.iter().zip(&expected) {
                    prop_assert_eq!(g.0, e.ts);
                    prop_assert_eq!(g.1, e.tend);
                    for (a, b) in g.2.iter().zip(&e.values) {
                        prop_assert!(a.same_as(b), "{:?} != {:?} at ts {}", a, b, e.ts);
                    }
                }
            }
            Op::Aggregate {
                stream,
                range,
                bucket,
            } => {
                let mut aggregations =
                    vec![Aggregation::count(), Aggregation::new(AggFn::Count, "S")];
                for f in AggFn::ALL {
                    aggregations.push(Aggregation::new(f, "V"));
                    aggregations.push(Aggregation::new(f, "F"));
                }
                let request = AggregateRequest {
                    range: TimeRange::new(range.0, range.1),
                    bucket_ns: bucket,
                    aggregations: aggregations.clone(),
                };
                let rows = d.aggregate(STREAMS[stream], &request).unwrap();
                let mut in_range: Vec<&Event> = model[stream]
                    .iter()
                    .filter(|e| range.0 <= e.ts && e.ts <= range.1)
                    .collect();
                in_range.sort_by_key(|e| e.ts);
                let key = |ts: i64| bucket.map(|w| ts - ts.rem_euclid(w));
                let mut keys: Vec<Option<i64>> = in_range.iter().map(|e| key(e.ts)).collect();
                keys.dedup();
                if bucket.is_none() {
                    keys = vec![None];
                }
                prop_assert_eq!(rows.len(), keys.len());
                for (row, k) in rows.iter().zip(keys) {
                    prop_assert_eq!(row.bucket_start, k);
                    let events: Vec<&&Event> = in_range
                        .iter()
                        .filter(|e| bucket.is_none() || key(e.ts) == k)
                        .collect();
                    for (agg, got) in aggregations.iter().zip(&row.values) {
                        let expected = match agg.field.as_deref() {
                            None => Value::Long(events.len() as i64),
                            Some(name) => {
                                let (index, ty) = match name {
                                    "V" => (0, FieldType::Long),
                                    "F" => (1, FieldType::Double),
                                    _ => (2, FieldType::String),
                                };
                                let values: Vec<(i64, Value)> = events
                                    .iter()
                                    .map(|e| (e.ts, e.values[index].clone()))
                                    .collect();
                                model_agg(agg.func, ty, &values)
                            }
                        };
                        prop_assert!(
                            close_enough(got, &expected),
                            "{:?} of {:?} in {:?}: got {:?}, model {:?}",
                            agg.func,
                            agg.field,
                            k,
                            got,
                            expected
                        );
                    }
                }
            }
            Op::Read {
                stream,
                after,
                limit,
                max_bytes,
            } => {
                let held = Held {
                    events: &model[stream],
                    positions: &positions[stream],
                    next: next_position[stream],
                };
                check_read(d, stream, after, limit, max_bytes, &held)?;
            }
            Op::Consume {
                stream,
                consumer,
                limit,
                max_bytes,
                commit,
            } => {
                let name = CONSUMERS[consumer];
                let committed = d.consumer_position(STREAMS[stream], name).unwrap();
                // Commits outlive reopens and clears.
                prop_assert_eq!(committed, commits[stream][consumer], "{}", name);
                let held = Held {
                    events: &model[stream],
                    positions: &positions[stream],
                    next: next_position[stream],
                };
                let read_to = match check_read(d, stream, committed, limit, max_bytes, &held)? {
                    ReadOutcome::Refused => {
                        prop_assert!(
                            false,
                            "{} committed {:?}, a position it cannot resume from",
                            name,
                            committed
                        );
                        None
                    }
                    // Told of the gap by name (checked against the model): the consumer goes
                    // on after it.
                    ReadOutcome::Removed { earliest_held } => {
                        Some(earliest_held.unwrap_or(held.next) - 1)
                    }
                    ReadOutcome::Events(read) => read.last().copied(),
                };
                if let (true, Some(position)) = (commit, read_to) {
                    d.commit_position(STREAMS[stream], name, Some(position))
                        .unwrap();
                    commits[stream][consumer] = Some(position);
                }
            }
        }
    }
    Ok(())
}

/// What a stream holds in the model.
struct Held<'a> {
    events: &'a [Event],
    positions: &'a [u64],
    next: u64,
}

/// What a read by position answered, once checked against the model.
enum ReadOutcome {
    /// `after` was a position the stream had not given.
    Refused,
    /// Positions from the one asked for on were removed before they were read; the
    /// earliest the stream still holds.
    Removed { earliest_held: Option<u64> },
    /// The positions read, in order.
    Events(Vec<u64>),
}

/// Reads `stream` by position after `after` and checks the answer against the model.
fn check_read(
    d: &Db,
    stream: usize,
    after: Option<u64>,
    limit: usize,
    max_bytes: usize,
    held: &Held<'_>,
) -> Result<ReadOutcome, TestCaseError> {
    let request = PositionRequest {
        max_bytes,
        ..PositionRequest::after(after, limit)
    };
    let answer = d.read_positions(STREAMS[stream], &request);
    let next = held.next;
    if after.is_some_and(|a| a >= next) {
        prop_assert!(
            matches!(answer, Err(EngineError::InvalidRequest(_))),
            "{:?}",
            answer
        );
        return Ok(ReadOutcome::Refused);
    }
    let start = match after {
        Some(a) => a + 1,
        None => held.positions.first().copied().unwrap_or(next),
    };
    // Positions are held from the last clear on, consecutively.
    let removed = start < next && held.positions.first().is_none_or(|&first| start < first);
    if removed {
        match answer {
            Err(EngineError::PositionsRemoved {
                from,
                earliest_held,
                next_position,
                ..
            }) => {
                prop_assert_eq!(from, start);
                prop_assert_eq!(earliest_held, held.positions.first().copied());
                prop_assert_eq!(next_position, next);
                return Ok(ReadOutcome::Removed { earliest_held });
            }
            other => {
                prop_assert!(false, "{:?} after {:?}", other, after);
                unreachable!()
            }
        }
    }
    let answer = answer.unwrap();
    prop_assert_eq!(answer.next_position, next);
    let skip = held.positions.iter().take_while(|&&p| p < start).count();
    let mut expected: Vec<(u64, &Event)> = held
        .positions
        .iter()
        .copied()
        .zip(held.events)
        .skip(skip)
        .take(limit)
        .collect();
    // The first events that fit `max_bytes` (at least one).
    let mut bytes = 0usize;
    let fit = expected
        .iter()
        .enumerate()
        .take_while(|(i, (_, e))| {
            bytes += event_bytes(e);
            *i == 0 || bytes <= max_bytes
        })
        .count();
    expected.truncate(fit);
    let events = &answer.events;
    prop_assert_eq!(
        events.len(),
        expected.len(),
        "read after {:?} (max_bytes {}): engine {:?}, model {:?}",
        after,
        max_bytes,
        (0..events.len())
            .map(|r| (events.position_at(r), events.row(r)))
            .collect::<Vec<_>>(),
        expected
            .iter()
            .map(|(p, e)| (*p, event_bytes(e), &e.values))
            .collect::<Vec<_>>()
    );
    for (r, (position, e)) in expected.iter().enumerate() {
        prop_assert_eq!(events.position_at(r), Some(*position));
        prop_assert_eq!(events.tstart()[r], e.ts);
        prop_assert_eq!(events.tend_at(r), e.tend);
        for (a, b) in events.row(r).iter().zip(&e.values) {
            prop_assert!(a.same_as(b), "{:?} != {:?} at {}", a, b, position);
        }
    }
    Ok(ReadOutcome::Events(
        expected.iter().map(|(p, _)| *p).collect(),
    ))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn engine_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops)?;
    }
}

//! Consuming a stream: reads by position hold at most what they are allowed, and named
//! consumers' committed positions are durable (a logged command), survive restarts and
//! clears, go with their stream, and are refused where they could not be resumed from.

use tidemark_core::{BatchBuilder, Schema, Value};
use tidemark_engine::{ConsumerInfo, Db, EngineError, Options, PositionRequest};

fn append(db: &Db, n: i64) {
    let schema = db.stream_schema("s").unwrap();
    let mut b = BatchBuilder::new(schema, n as usize);
    for i in 0..n {
        b.push_row(1_000 + i, None, &[Value::Long(i)]).unwrap();
    }
    db.append("s", b.finish()).unwrap();
}

fn consumer(name: &str, position: u64, behind: u64) -> ConsumerInfo {
    ConsumerInfo {
        name: name.into(),
        position,
        behind,
    }
}

#[test]
fn committed_positions_survive_restarts_and_clears_and_go_with_their_stream() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema::parse_spec("V:LONG").unwrap();
    {
        let db = Db::open(dir.path(), Options::default()).unwrap();
        db.create_stream("s", schema.clone()).unwrap();
        append(&db, 10);
        db.commit_position("s", "billing", Some(3)).unwrap();
        db.commit_position("s", "audit", Some(9)).unwrap();
        // Moving back is allowed: a consumer may replay.
        db.commit_position("s", "billing", Some(4)).unwrap();
        assert_eq!(
            db.consumers("s").unwrap(),
            [consumer("audit", 9, 0), consumer("billing", 4, 5)]
        );
        // Dropped without a flush: the commits are replayed from the log.
    }
    let db = Db::open(dir.path(), Options::default()).unwrap();
    assert_eq!(db.consumer_position("s", "billing").unwrap(), Some(4));
    db.flush().unwrap();
    drop(db);
    // From the manifest this time.
    let db = Db::open(dir.path(), Options::default()).unwrap();
    assert_eq!(db.consumer_position("s", "audit").unwrap(), Some(9));

    // A clear removes events, not consumers (nor positions).
    db.clear("s").unwrap();
    append(&db, 2);
    assert_eq!(
        db.consumers("s").unwrap(),
        [consumer("audit", 9, 2), consumer("billing", 4, 7)]
    );

    // Forgotten, and forgetting an unknown one changes nothing.
    db.commit_position("s", "billing", None).unwrap();
    db.commit_position("s", "nobody", None).unwrap();
    assert_eq!(db.consumer_position("s", "billing").unwrap(), None);

    // Dropped with the stream; a stream created again has none.
    db.drop_stream("s").unwrap();
    db.create_stream("s", schema).unwrap();
    assert!(db.consumers("s").unwrap().is_empty());
}

#[test]
fn commits_the_stream_could_not_resume_from_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), Options::default()).unwrap();
    db.create_stream("s", Schema::parse_spec("V:LONG").unwrap())
        .unwrap();
    append(&db, 5);
    let refused = |consumer: &str, position| {
        matches!(
            db.commit_position("s", consumer, Some(position)),
            Err(EngineError::InvalidRequest(_) | EngineError::Invalid(_))
        )
    };
    assert!(refused("c", 5), "a position not given yet");
    assert!(refused("a/b", 1), "a name with a path separator");
    assert!(refused("", 1), "an empty name");
    assert!(matches!(
        db.commit_position("nope", "c", Some(0)),
        Err(EngineError::UnknownStream(_))
    ));
    for i in 0..1024 {
        db.commit_position("s", &format!("c{i}"), Some(0)).unwrap();
    }
    assert!(refused("one-too-many", 0), "past the most a stream keeps");
    db.commit_position("s", "c7", Some(4)).unwrap();
    assert_eq!(db.consumers("s").unwrap().len(), 1024);
}

#[test]
fn a_read_by_position_answers_at_most_its_bytes_and_a_larger_event_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), Options::default()).unwrap();
    let schema = Schema::parse_spec("S:STRING").unwrap();
    db.create_stream("s", schema).unwrap();
    let stream_schema = db.stream_schema("s").unwrap();
    let mut b = BatchBuilder::new(stream_schema, 6);
    for (i, len) in [1000, 1000, 1000, 5000, 10, 10].into_iter().enumerate() {
        b.push_row(i as i64, None, &[Value::String("x".repeat(len))])
            .unwrap();
    }
    db.append("s", b.finish()).unwrap();
    let read = |after, max_bytes| {
        let request = PositionRequest {
            after,
            limit: 100,
            max_bytes,
        };
        let events = db.read_positions("s", &request).unwrap().events;
        (0..events.len())
            .map(|r| events.position_at(r).unwrap())
            .collect::<Vec<_>>()
    };
    // Each 1,000-byte event counts 1,016 bytes: two fit in 3,000.
    assert_eq!(read(None, 3000), [0, 1]);
    // One larger than the whole allowance comes alone, never not at all.
    assert_eq!(read(Some(2), 3000), [3]);
    assert_eq!(read(Some(3), 3000), [4, 5]);
    assert_eq!(read(None, usize::MAX).len(), 6);
}

/// Retention drops segments by age, so old events appended after newer ones leave a gap in
/// the middle of the positions: a read stops before it, and the next one is told.
#[test]
fn a_gap_retention_left_is_never_jumped_over() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        out_of_order_window_ns: None,
        ..Options::default()
    };
    let db = Db::open(dir.path(), options).unwrap();
    db.create_stream("s", Schema::parse_spec("V:LONG").unwrap())
        .unwrap();
    let now = tidemark_core::time::now_ns();
    let day = 86_400_000_000_000i64;
    for start in [now - 60_000_000_000, now - 10 * day, now - 30_000_000_000] {
        let schema = db.stream_schema("s").unwrap();
        let mut b = BatchBuilder::new(schema, 5);
        for i in 0..5 {
            b.push_row(start + i, None, &[Value::Long(i)]).unwrap();
        }
        db.append("s", b.finish()).unwrap();
        db.flush().unwrap();
    }
    db.set_retention(
        "s",
        tidemark_engine::Retention {
            max_age_ns: Some(2 * day),
            max_bytes: None,
        },
    )
    .unwrap();
    db.flush().unwrap();
    let read = |after| db.read_positions("s", &PositionRequest::after(after, 100));
    let first = read(None).unwrap();
    assert_eq!(first.last_position(), Some(4), "up to the gap");
    match read(Some(4)) {
        Err(EngineError::PositionsRemoved {
            from,
            earliest_held,
            ..
        }) => assert_eq!((from, earliest_held), (5, Some(10))),
        other => panic!("{other:?}"),
    }
    let rest = read(Some(9)).unwrap();
    assert_eq!(rest.events.len(), 5);
    assert_eq!(rest.last_position(), Some(14));
}

#[test]
fn a_read_from_a_time_starts_at_the_first_event_appended_at_or_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), Options::default()).unwrap();
    db.create_stream("s", Schema::parse_spec("V:LONG").unwrap())
        .unwrap();
    let append_at = |times: &[i64]| {
        let mut b = BatchBuilder::new(db.stream_schema("s").unwrap(), times.len());
        for &t in times {
            b.push_row(t, None, &[Value::Long(t)]).unwrap();
        }
        db.append("s", b.finish()).unwrap();
    };
    append_at(&(1_000..1_010).collect::<Vec<_>>()); // positions 0..=9
    db.flush().unwrap();
    append_at(&(2_000..2_010).collect::<Vec<_>>()); // 10..=19, in memory
    append_at(&[1_500]); // 20: appended late, older than 10..=19
    let expect = [
        (0, 0),
        (1_005, 5),
        (1_010, 10),
        (1_500, 10),
        (2_005, 15),
        (3_000, 21), // none that late: the next position
    ];
    for (time, first) in expect {
        assert_eq!(db.first_position_from("s", time).unwrap(), first, "{time}");
    }
    // The same answers from segments alone (the late event in a block after the others).
    db.flush().unwrap();
    for (time, first) in expect {
        assert_eq!(db.first_position_from("s", time).unwrap(), first, "{time}");
    }
    // From a time, the read goes on in position order: the late event comes last.
    let after = db.first_position_from("s", 2_008).unwrap().checked_sub(1);
    let read = db
        .read_positions("s", &PositionRequest::after(after, 100))
        .unwrap();
    let positions: Vec<_> = (0..read.events.len())
        .filter_map(|r| read.events.position_at(r))
        .collect();
    assert_eq!(positions, [18, 19, 20]);
    assert!(matches!(
        db.first_position_from("nope", 0),
        Err(EngineError::UnknownStream(_))
    ));
}

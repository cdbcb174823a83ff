//! The SQL subset against a real database: answers checked against values computed here
//! from the events that were appended, and the summary path against the scan path.

use proptest::prelude::*;
use tidemark_core::{BatchBuilder, Schema, Value};
use tidemark_engine::{Db, Options};
use tidemark_query::sql::{run_sql, SqlError, SqlLimits};

const MINUTE: i64 = 60_000_000_000;

/// `count` events one second apart from `MINUTE`: SYMBOL cycles A, B, C; PRICE = i; N = i % 7
/// (null every 10th event).
fn db_with(count: i64) -> (tempfile::TempDir, Db) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), Options::default()).unwrap();
    let schema = Schema::parse_spec("SYMBOL:STRING,PRICE:DOUBLE,N:INTEGER").unwrap();
    db.create_stream("ticks", schema.clone()).unwrap();
    let mut b = BatchBuilder::new(schema.into(), count as usize);
    for i in 0..count {
        let symbol = ["A", "B", "C"][(i % 3) as usize];
        let n = if i % 10 == 9 {
            Value::Null
        } else {
            Value::Integer((i % 7) as i32)
        };
        b.push_row(
            MINUTE + i * 1_000_000_000,
            None,
            &[Value::String(symbol.into()), Value::Double(i as f64), n],
        )
        .unwrap();
    }
    db.append("ticks", b.finish()).unwrap();
    (dir, db)
}

fn sql(db: &Db, text: &str) -> Result<Vec<Vec<Value>>, SqlError> {
    run_sql(db, text, 10 * MINUTE, SqlLimits::default()).map(|t| t.rows)
}

#[test]
fn rows_with_time_range_filter_order_and_limit() {
    let (_dir, db) = db_with(200);
    let rows = sql(
        &db,
        "SELECT ts, price FROM ticks WHERE ts >= 61000000000 AND ts < 65000000000 AND symbol = 'B'",
    )
    .unwrap();
    // Events 1..=4 are in range; of those, 1 and 4 are B.
    assert_eq!(
        rows,
        vec![
            vec![Value::Long(MINUTE + 1_000_000_000), Value::Double(1.0)],
            vec![Value::Long(MINUTE + 4_000_000_000), Value::Double(4.0)]
        ]
    );

    let rows = sql(&db, "SELECT price FROM ticks ORDER BY ts DESC LIMIT 3").unwrap();
    assert_eq!(
        rows,
        vec![
            vec![Value::Double(199.0)],
            vec![Value::Double(198.0)],
            vec![Value::Double(197.0)]
        ]
    );

    let rows = sql(&db, "SELECT * FROM ticks WHERE n IS NULL LIMIT 2").unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0][3], Value::Null);
    assert_eq!(rows[0][2], Value::Double(9.0));

    let rows = sql(
        &db,
        "SELECT price FROM ticks WHERE price BETWEEN 10 AND 12 AND symbol IN ('A', 'C')",
    )
    .unwrap();
    assert_eq!(
        rows,
        vec![vec![Value::Double(11.0)], vec![Value::Double(12.0)]]
    );

    // `now()` just after the last event (i = 199): events 171..=199 are in the last 30 s.
    let now = MINUTE + 200 * 1_000_000_000;
    let count = |q: &str| run_sql(&db, q, now, SqlLimits::default()).unwrap().rows;
    assert_eq!(
        count("SELECT count(*) FROM ticks WHERE ts > now() - INTERVAL '30 seconds'"),
        vec![vec![Value::Long(29)]]
    );
    assert_eq!(
        count("SELECT count(*) FROM ticks WHERE ts > now() - INTERVAL '30' SECOND"),
        vec![vec![Value::Long(29)]]
    );
}

#[test]
fn bucketed_and_grouped_aggregates() {
    let (_dir, db) = db_with(180); // three minutes
    let rows = sql(&db, "SELECT time_bucket('1 minute', ts) AS minute, max(price), count(*), avg(n) FROM ticks GROUP BY minute").unwrap();
    assert_eq!(rows.len(), 3);
    for (m, row) in rows.iter().enumerate() {
        let m = m as i64;
        assert_eq!(row[0], Value::Long(MINUTE * (m + 1)));
        assert_eq!(row[1], Value::Double((m * 60 + 59) as f64));
        assert_eq!(row[2], Value::Long(60));
        let ns: Vec<i64> = (m * 60..m * 60 + 60)
            .filter(|i| i % 10 != 9)
            .map(|i| i % 7)
            .collect();
        assert_eq!(
            row[3],
            Value::Double(ns.iter().sum::<i64>() as f64 / ns.len() as f64)
        );
    }

    let rows = sql(&db, "SELECT symbol, count(*), sum(price), first(price), last(price) FROM ticks WHERE ts < 120000000000 GROUP BY symbol").unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(
        rows[1],
        vec![
            Value::String("B".into()),
            Value::Long(20),
            Value::Double((1..60).step_by(3).sum::<i64>() as f64),
            Value::Double(1.0),
            Value::Double(58.0)
        ]
    );

    let rows = sql(&db, "SELECT time_bucket('1m', ts), symbol, min(price) FROM ticks GROUP BY 1, 2 ORDER BY 1 DESC LIMIT 2").unwrap();
    assert_eq!(rows[0][0], Value::Long(3 * MINUTE));
    assert_eq!(rows.len(), 2);

    let rows = sql(
        &db,
        "SELECT percentile(price, 0.5), approx_percentile(price, 0.99) FROM ticks",
    )
    .unwrap();
    let (Value::Double(p50), Value::Double(p99)) = (&rows[0][0], &rows[0][1]) else {
        panic!("{rows:?}")
    };
    assert!((p50 - 89.5).abs() < 3.0, "p50 {p50}");
    assert!((p99 - 178.2).abs() < 4.0, "p99 {p99}");

    // No events: one row, count 0 and null for the rest.
    let rows = sql(
        &db,
        "SELECT count(*), max(price) FROM ticks WHERE ts > now()",
    )
    .unwrap();
    assert_eq!(rows, vec![vec![Value::Long(0), Value::Null]]);
}

#[test]
fn unsupported_and_invalid_sql_names_the_part() {
    let (_dir, db) = db_with(10);
    for (query, part) in [
        ("SELECT a FROM ticks JOIN other ON true", "JOIN"),
        ("SELECT price FROM ticks WHERE price > 1 OR price < 0", "OR"),
        ("SELECT DISTINCT symbol FROM ticks", "DISTINCT"),
        (
            "SELECT symbol, count(*) FROM ticks GROUP BY symbol HAVING count(*) > 1",
            "HAVING",
        ),
        ("DELETE FROM ticks", "DELETE"),
        ("SELECT price FROM ticks ORDER BY price", "ORDER BY price"),
        ("SELECT price FROM ticks LIMIT 1 OFFSET 2", "OFFSET"),
        (
            "SELECT price FROM ticks UNION SELECT price FROM ticks",
            "UNION",
        ),
        ("SELECT price FROM (SELECT price FROM ticks)", "subqueries"),
        (
            "SELECT price FROM ticks WHERE symbol NOT IN ('A')",
            "NOT IN",
        ),
    ] {
        let err = sql(&db, query).unwrap_err();
        assert!(matches!(err, SqlError::Unsupported(_)), "{query}: {err}");
        assert!(err.to_string().contains(part), "{query}: {err}");
    }
    for query in [
        "SELECT nope FROM ticks",
        "SELECT symbol, max(price) FROM ticks",
        "SELECT max(symbol) FROM ticks",
        "SELECT price FROM ticks WHERE n = 'seven'",
        "SELECT price FROM ticks WHERE ts > 'yesterday-ish'",
        "SELECT percentile(price, 2) FROM ticks",
    ] {
        assert!(
            matches!(sql(&db, query), Err(SqlError::Invalid(_))),
            "{query}"
        );
    }
    assert!(matches!(
        sql(&db, "SELEC price FROM ticks"),
        Err(SqlError::Syntax(_))
    ));
    assert!(matches!(
        sql(&db, "SELECT price FROM nope"),
        Err(SqlError::Engine(_))
    ));
    let capped = run_sql(
        &db,
        "SELECT price FROM ticks",
        0,
        SqlLimits {
            max_rows: 5,
            ..SqlLimits::default()
        },
    );
    assert!(matches!(capped, Err(SqlError::Invalid(m)) if m.contains("LIMIT")));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Block summaries and the row-by-row path give the same answers: a filter that every
    /// event passes forces the scan path.
    #[test]
    fn summaries_agree_with_the_scan(count in 1i64..400, from in 0i64..300, len in 1i64..300, width in 1i64..120) {
        let (_dir, db) = db_with(count);
        db.flush().unwrap();
        let (lo, hi) = (MINUTE + from * 1_000_000_000, MINUTE + (from + len) * 1_000_000_000);
        let select = format!("SELECT time_bucket('{width}s', ts), count(*), count(n), sum(n), min(price), max(price), avg(price), first(n), last(n) FROM ticks WHERE ts BETWEEN {lo} AND {hi}");
        let by_summaries = sql(&db, &format!("{select} GROUP BY 1")).unwrap();
        let by_scan = sql(&db, &format!("{select} AND price > -1 GROUP BY 1")).unwrap();
        prop_assert_eq!(by_summaries, by_scan);
    }
}

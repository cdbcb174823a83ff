//! SQL's writes against a real database: an INSERT's values cast as PostgreSQL casts them,
//! a COPY's rows read as its formats write them, the events stored as they would be
//! answered, and what either refuses (named, nothing stored).

use tidemark_core::{Schema, Value};
use tidemark_engine::{Db, EngineError, Options};
use tidemark_query::Times;
use tidemark_sql::write::{self, CopyIn};
use tidemark_sql::{query_all, render, BadValue, SqlError, SqlOptions};

const SPEC: &str = "SYMBOL:STRING,PRICE:DOUBLE,N:INTEGER,B:BYTE,F:FLOAT,OK:BOOLEAN,RAW:BYTES";

fn db() -> (tempfile::TempDir, Db) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), Options::default()).unwrap();
    db.create_stream("ticks", Schema::parse_spec(SPEC).unwrap())
        .unwrap();
    (dir, db)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs the INSERT `sql` (at most `max_bytes`) and appends its rows: how many.
fn insert_at_most(db: &Db, sql: &str, max_bytes: usize) -> Result<usize, SqlError> {
    // On a query thread, as the server runs it (planning recurses as deep as a statement
    // chains).
    let runtime = tidemark_sql::runtime::query_runtime().unwrap();
    let (db_on, sql_on) = (tidemark_engine::Engine::clone(db), sql.to_owned());
    let rows = runtime
        .block_on(runtime.spawn(async move {
            let mut reserve = |_: usize| true;
            write::insert(
                &db_on,
                &sql_on,
                SqlOptions::default(),
                max_bytes,
                &mut reserve,
            )
            .await
        }))
        .unwrap()?;
    let events = rows.events.len();
    if events > 0 {
        db.append(&rows.stream, rows.events)?;
    }
    Ok(events)
}

fn insert(db: &Db, sql: &str) -> Result<usize, SqlError> {
    insert_at_most(db, sql, 1 << 20)
}

/// COPY `sql` of `data`, appended: how many rows.
fn copy(db: &Db, sql: &str, data: &str) -> Result<usize, SqlError> {
    let rows = CopyIn::new(db, sql)?.rows(data.as_bytes())?;
    let events = rows.events.len();
    if events > 0 {
        db.append(&rows.stream, rows.events)?;
    }
    Ok(events)
}

fn rows_of(db: &Db, sql: &str) -> Vec<Vec<Value>> {
    let (_, batches) = runtime()
        .block_on(query_all(db, sql, SqlOptions::default()))
        .unwrap();
    batches
        .iter()
        .flat_map(|b| render::rows(b, Times::Nanoseconds).unwrap())
        .collect()
}

const SECOND: i64 = 1_000_000_000;
/// 2024-01-01T00:00:00Z in nanoseconds.
const NEW_YEAR: i64 = 1_704_067_200 * SECOND;

fn everything(db: &Db) -> Vec<Vec<Value>> {
    rows_of(
        db,
        "SELECT tstart, tend, symbol, price, n, b, f, ok, raw FROM ticks ORDER BY tstart",
    )
}

#[test]
fn insert_casts_values_as_postgresql_does() {
    // (DEFAULT is NULL: a stream's fields have no other default.)
    let (_dir, db) = db();
    let inserted = insert(
        &db,
        "INSERT INTO ticks (tstart, tend, symbol, price, n, b, f, ok, raw) VALUES \
         ('2024-01-01 00:00:00+00', '2024-01-01T00:00:01Z', 'AAPL', 1, 2.5, 100, 1.25, true, '\\x00ff'), \
         ('2024-01-01 00:00:02', DEFAULT, NULL, 2.5, -2.5, -128, default, 'f', 'ab')",
    )
    .unwrap();
    assert_eq!(inserted, 2);
    assert_eq!(
        everything(&db),
        vec![
            vec![
                Value::Long(NEW_YEAR),
                Value::Long(NEW_YEAR + SECOND),
                Value::String("AAPL".into()),
                Value::Double(1.0),
                // A literal 2.5 is numeric in PostgreSQL: ties round away from zero.
                Value::Integer(3),
                Value::Byte(100),
                Value::Float(1.25),
                Value::Boolean(true),
                Value::Bytes(vec![0, 255]),
            ],
            vec![
                Value::Long(NEW_YEAR + 2 * SECOND),
                Value::Null,
                Value::Null,
                Value::Double(2.5),
                Value::Integer(-3),
                Value::Byte(-128),
                Value::Null,
                Value::Boolean(false),
                Value::Bytes(b"ab".to_vec()),
            ],
        ]
    );
}

#[test]
fn insert_fills_the_first_columns_without_a_list_and_names_as_queries_do() {
    let (_dir, db) = db();
    assert_eq!(
        insert(
            &db,
            "INSERT INTO TICKS VALUES ('2024-01-01T00:00:00Z', NULL, 'A', 7)"
        )
        .unwrap(),
        1
    );
    assert_eq!(
        insert(
            &db,
            "insert into public.ticks (TSTART, Symbol) values ('2024-01-01T00:00:01Z', 'B')"
        )
        .unwrap(),
        1
    );
    assert_eq!(
        rows_of(&db, "SELECT symbol, price FROM ticks ORDER BY tstart"),
        vec![
            vec![Value::String("A".into()), Value::Double(7.0)],
            vec![Value::String("B".into()), Value::Null],
        ]
    );
}

/// A thousand rows of every column in one INSERT (as pgjdbc's rewritten batches and pandas'
/// `method="multi"` send): typed, they are longer than one statement may be, and are run in
/// parts, all stored or none. A row over the bounds by itself is refused.
#[test]
fn a_long_insert_is_stored_whole() {
    let (_dir, db) = db();
    let rows: Vec<String> = (0..1000)
        .map(|i| {
            format!(
                "('2024-01-01T00:{:02}:{:02}Z', NULL, 'S{i}', {i}.5, {}, 1, NULL, TRUE, NULL)",
                i / 60,
                i % 60,
                i % 7
            )
        })
        .collect();
    let sql = format!("INSERT INTO ticks VALUES {}", rows.join(", "));
    assert_eq!(insert(&db, &sql).unwrap(), 1000);
    assert_eq!(
        rows_of(
            &db,
            "SELECT count(*), sum(n), min(symbol), max(price) FROM ticks"
        ),
        vec![vec![
            Value::Long(1000),
            Value::Long((0..1000).map(|i| i % 7).sum()),
            Value::String("S0".into()),
            Value::Double(999.5)
        ]]
    );
    // Within the bounds as written (963 operators), over them once each value is typed.
    let long_row = format!(
        "INSERT INTO ticks VALUES (now(), NULL, 'x', {}, 1, 1, 1, TRUE, NULL)",
        vec!["1"; 961].join(" + ")
    );
    assert!(matches!(
        insert(&db, &long_row),
        Err(SqlError::TooComplex(_))
    ));
}

/// A statement just within the bound on its text, of long strings: typed, its values are
/// longer than one statement may be, and are run in parts by their bytes too.
#[test]
fn an_insert_of_long_strings_near_the_text_bound_is_stored() {
    let (_dir, db) = db();
    let row = |long: &str, i: usize| format!("('2024-01-01T00:00:{:02}Z', '{long}')", i % 60);
    let head = "INSERT INTO ticks (tstart, symbol) VALUES ";
    // 100 rows filling the statement to 200 bytes short of its bound: typing adds more.
    let per_row = (tidemark_sql::bounds::MAX_SQL_BYTES - head.len() - 200) / 100;
    let long = "y".repeat(per_row - row("", 0).len() - 2);
    let rows: Vec<String> = (0..100).map(|i| row(&long, i)).collect();
    let sql = format!("{head}{}", rows.join(", "));
    let bound = tidemark_sql::bounds::MAX_SQL_BYTES;
    assert!(
        sql.len() < bound && sql.len() > bound - 400,
        "{}",
        sql.len()
    );
    assert_eq!(insert(&db, &sql).unwrap(), 100);
}

/// The caller's budget is asked for each batch: refused, the INSERT is overloaded.
#[test]
fn an_insert_the_budget_refuses_stores_nothing() {
    let (_dir, db) = db();
    let mut reserve = |_: usize| false;
    let refused = runtime().block_on(write::insert(
        &db,
        "INSERT INTO ticks (tstart) VALUES (now())",
        SqlOptions::default(),
        1 << 20,
        &mut reserve,
    ));
    assert!(
        matches!(refused, Err(SqlError::Engine(EngineError::Overloaded(_)))),
        "{refused:?}"
    );
}

#[test]
fn insert_select_copies_from_a_query() {
    let (_dir, db) = db();
    insert(
        &db,
        "INSERT INTO ticks (tstart, symbol, price) VALUES \
         ('2024-01-01T00:00:00Z', 'A', 1), ('2024-01-01T00:00:01Z', 'B', 2), \
         ('2024-01-01T00:00:02Z', 'A', 3)",
    )
    .unwrap();
    let copied = insert(
        &db,
        "INSERT INTO ticks (tstart, symbol, price) \
         SELECT tstart + INTERVAL '1 hour', lower(symbol), price * 10 FROM ticks WHERE symbol = 'A'",
    )
    .unwrap();
    assert_eq!(copied, 2);
    assert_eq!(
        rows_of(
            &db,
            "SELECT symbol, price FROM ticks WHERE tstart >= '2024-01-01T01:00:00Z' ORDER BY tstart"
        ),
        vec![
            vec![Value::String("a".into()), Value::Double(10.0)],
            vec![Value::String("a".into()), Value::Double(30.0)],
        ]
    );
    // A query with no rows inserts nothing.
    assert_eq!(
        insert(
            &db,
            "INSERT INTO ticks (tstart) SELECT tstart FROM ticks WHERE false"
        )
        .unwrap(),
        0
    );
}

#[test]
fn insert_refusals_name_what_is_wrong_and_store_nothing() {
    let (_dir, db) = db();
    let refusal = |sql: &str| insert(&db, sql).expect_err(sql);
    let out_of_range =
        refusal("INSERT INTO ticks (tstart, b) VALUES ('2024-01-01T00:00:00Z', 300)");
    assert!(
        matches!(&out_of_range, SqlError::OutOfRange(m) if m.contains("tinyint out of range")),
        "{out_of_range:?}"
    );
    let no_start = refusal("INSERT INTO ticks (tstart, symbol) VALUES (NULL, 'A')");
    assert!(no_start.to_string().contains("tstart"), "{no_start}");
    let no_start = refusal("INSERT INTO ticks (symbol) VALUES ('A')");
    assert!(no_start.to_string().contains("tstart"), "{no_start}");
    let no_start = refusal("INSERT INTO ticks (tstart, symbol) VALUES (DEFAULT, 'A')");
    assert!(no_start.to_string().contains("tstart"), "{no_start}");
    let unknown = refusal("INSERT INTO ticks (tstart, volume) VALUES (now(), 1)");
    assert!(
        unknown.to_string().contains("\"volume\"") && unknown.to_string().contains("SYMBOL"),
        "{unknown}"
    );
    let twice = refusal("INSERT INTO ticks (tstart, symbol, SYMBOL) VALUES (now(), 'a', 'b')");
    assert!(twice.to_string().contains("twice"), "{twice}");
    let more = refusal("INSERT INTO ticks (tstart) VALUES (now(), 1)");
    assert!(more.to_string().contains("more expressions"), "{more}");
    let fewer = refusal("INSERT INTO ticks (tstart, price) VALUES (now())");
    assert!(fewer.to_string().contains("more target columns"), "{fewer}");
    let text = refusal("INSERT INTO ticks (tstart, price) VALUES (now(), 'a lot')");
    assert!(
        matches!(text, SqlError::BadValue(BadValue::InvalidText, _)),
        "{text:?}"
    );
    let bytes = refusal("INSERT INTO ticks (tstart, raw) VALUES (now(), '\\x0')");
    assert!(bytes.to_string().contains("BYTEA"), "{bytes}");
    for (sql, part) in [
        (
            "INSERT INTO ticks (tstart) VALUES (now()) ON CONFLICT DO NOTHING",
            "ON CONFLICT",
        ),
        (
            "INSERT INTO ticks (tstart) VALUES (now()) RETURNING tstart",
            "RETURNING",
        ),
        ("INSERT INTO ticks DEFAULT VALUES", "DEFAULT VALUES"),
        (
            "INSERT INTO ticks (tstart, price) VALUES (now(), (SELECT max(price) FROM ticks))",
            "subquery in VALUES",
        ),
        (
            "INSERT INTO ticks (tstart, price) VALUES (now(), 1 + (SELECT 1.5))",
            "subquery in VALUES",
        ),
    ] {
        let e = refusal(sql);
        assert!(
            matches!(&e, SqlError::Unsupported(m) if m.contains(part)),
            "{sql}: {e:?}"
        );
    }
    assert!(matches!(
        refusal("INSERT INTO nope (tstart) VALUES (now())"),
        SqlError::Engine(EngineError::UnknownStream(_))
    ));
    let large = insert_at_most(
        &db,
        "INSERT INTO ticks (tstart, symbol) SELECT now(), repeat('x', 1000) FROM generate_series(1, 100)",
        10_000,
    )
    .expect_err("over the bound");
    assert!(matches!(large, SqlError::TooLarge(_)), "{large:?}");
    assert!(everything(&db).is_empty());
}

#[test]
fn copy_reads_csv_and_text_as_psql_sends_them() {
    let (_dir, db) = db();
    let csv = "tstart,symbol,price,n,raw\n\
               2024-01-01 00:00:00+00,AAPL,1.5,,\\x01\n\
               2024-01-01T00:00:01Z,\"A,B\",,2,\n";
    assert_eq!(
        copy(
            &db,
            "COPY ticks (tstart, symbol, price, n, raw) FROM STDIN WITH (FORMAT csv, HEADER)",
            csv
        )
        .unwrap(),
        2
    );
    let text = "2024-01-01 00:00:02.5\tMSFT\t\\N\tt\n";
    assert_eq!(
        copy(
            &db,
            "copy TICKS (tstart, Symbol, price, ok) from stdin",
            text
        )
        .unwrap(),
        1
    );
    assert_eq!(
        rows_of(
            &db,
            "SELECT tstart, symbol, price, n, ok, raw FROM ticks ORDER BY tstart"
        ),
        vec![
            vec![
                Value::Long(NEW_YEAR),
                Value::String("AAPL".into()),
                Value::Double(1.5),
                Value::Null,
                Value::Null,
                Value::Bytes(vec![1]),
            ],
            vec![
                Value::Long(NEW_YEAR + SECOND),
                Value::String("A,B".into()),
                Value::Null,
                Value::Integer(2),
                Value::Null,
                Value::Null,
            ],
            vec![
                Value::Long(NEW_YEAR + 2 * SECOND + SECOND / 2),
                Value::String("MSFT".into()),
                Value::Null,
                Value::Null,
                Value::Boolean(true),
                Value::Null,
            ],
        ]
    );
}

#[test]
fn copy_refusals_name_the_row_and_store_nothing() {
    let (_dir, db) = db();
    let refusal = |sql: &str, data: &str| copy(&db, sql, data).expect_err(data).to_string();
    let sql = "COPY ticks (tstart, price) FROM STDIN WITH (FORMAT csv)";
    let bad = refusal(sql, "2024-01-01T00:00:00Z,1\n2024-01-01T00:00:01Z,lots\n");
    assert!(
        bad.contains("row 2") && bad.contains("PRICE") && bad.contains("\"lots\""),
        "{bad}"
    );
    let time = refusal(sql, "yesterday,1\n");
    assert!(time.contains("row 1") && time.contains("tstart"), "{time}");
    let short = refusal(sql, "2024-01-01T00:00:00Z\n");
    assert!(short.contains("line 1: missing data"), "{short}");
    let null_start = refusal(sql, ",1\n");
    assert!(null_start.contains("tstart"), "{null_start}");
    assert!(matches!(
        CopyIn::new(&db, "COPY ticks FROM STDIN WITH (FORMAT binary)"),
        Err(SqlError::Unsupported(_))
    ));
    assert!(matches!(
        CopyIn::new(&db, "COPY ticks TO STDOUT"),
        Err(SqlError::Unsupported(_))
    ));
    assert!(matches!(
        CopyIn::new(&db, "COPY nope FROM STDIN"),
        Err(SqlError::Engine(EngineError::UnknownStream(_)))
    ));
    assert!(everything(&db).is_empty());
}

/// Issue 46 review: a statement within the bounds on chains and nesting runs on a query
/// thread without overflowing its stack (a chain of 250 `+` overflowed tokio's default).
#[test]
fn a_long_chain_within_the_bounds_runs_on_a_query_thread() {
    let (_dir, db) = db();
    let runtime = tidemark_sql::runtime::query_runtime().unwrap();
    let sql = format!(
        "SELECT 1{} FROM ticks",
        "+1".repeat(tidemark_sql::bounds::MAX_OPERATORS - 10)
    );
    let answered = runtime
        .block_on(runtime.spawn(async move {
            query_all(&db, &sql, SqlOptions::default())
                .await
                .map(|_| ())
        }))
        .unwrap();
    assert!(answered.is_ok(), "{answered:?}");
}

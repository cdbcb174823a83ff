//! The PostgreSQL wire listener, driven by the real clients: psql 15 (Debian's
//! `postgresql-client`, over TLS with the test CA), and psycopg 3, psycopg2 and
//! `pandas.read_sql` (requirements-test.txt; `tests/python/pg_clients.py` drives them).
//! Events are written through the line protocol and read back through each client.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{metrics_text_with, post, run_python_script, TestServer};
use serde_json::{json, Value as Json};
use tidemark_server::config::{Pg, Tls};

const READ_TOKEN: &str = "pg-read-token-0123456789";
const WRITE_TOKEN: &str = "pg-write-token-0123456789";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tls")
        .join(name)
}

fn start(tls: bool) -> TestServer {
    let server = TestServer::start(|c| {
        c.auth.read_token = Some(READ_TOKEN.into());
        c.auth.write_token = Some(WRITE_TOKEN.into());
        c.pg = Some(Pg::at("127.0.0.1:0".parse().unwrap()));
        if tls {
            c.tls = Some(Tls {
                cert: fixture("cert.pem"),
                key: fixture("key.pem"),
            });
        }
    });
    if !tls {
        let written = post(
            &server,
            "/write?precision=s",
            &[("Authorization", &format!("Token {WRITE_TOKEN}"))],
            b"cpu,host=a usage=1.5,n=3i 1700000000\ncpu,host=b usage=2.5,n=4i 1700000001\n",
        );
        assert_eq!(written.status, 204, "{}", written.body);
    }
    server
}

#[test]
fn psycopg_psycopg2_and_pandas_read_unchanged() {
    let server = start(false);
    let pg = server.pg.unwrap();
    let (host, port) = (pg.ip().to_string(), pg.port().to_string());
    let printed = run_python_script("pg_clients.py", &[&host, &port, READ_TOKEN]);
    let got: Json = serde_json::from_slice(&printed).unwrap();
    // Typed parameters (a float, a string, a timezone-aware datetime) select the second event;
    // its time comes back as a datetime at the same instant.
    assert_eq!(
        got["psycopg_rows"],
        json!([["b", 2.5, 4, "2023-11-14T22:13:21+00:00"]])
    );
    assert_eq!(got["psycopg_count_int_param"], json!(1));
    assert_eq!(got["psycopg_injection"], json!(0));
    assert_eq!(got["psycopg_prepared"], json!([1, 1, 0]));
    assert_eq!(got["psycopg_unknown_stream"][0], json!("42P01"));
    assert_eq!(
        got["psycopg_errors"],
        json!({
            "unknown_column": ["42703", "UndefinedColumn"],
            "unknown_function": ["42883", "UndefinedFunction"],
            "not_a_number": ["22P02", "InvalidTextRepresentation"],
            "division_by_zero": ["22012", "DivisionByZero"],
            "syntax": ["42601", "SyntaxError"],
        })
    );
    assert_eq!(got["psycopg_catalog"], json!(["cpu"]));
    assert!(
        got["psycopg_bad_password"]
            .as_str()
            .is_some_and(|e| e.contains("Password authentication failed")),
        "{}",
        got["psycopg_bad_password"]
    );
    assert_eq!(got["psycopg2_rows"], json!([["b", 2.5]]));
    assert_eq!(got["psycopg2_columns"], json!(["host", "usage"]));
    assert_eq!(
        got["pandas_psycopg2"]["columns"],
        json!(["host", "usage", "n"])
    );
    assert_eq!(got["pandas_psycopg2"]["usage_sum"], json!(4.0));
    assert_eq!(got["pandas_psycopg"]["rows"], json!(1));
    assert_eq!(
        got["pandas_psycopg"]["first_time"],
        json!("2023-11-14T22:13:21+00:00")
    );
    let metrics = metrics_text_with(&server, Some(READ_TOKEN));
    let answered = metrics
        .lines()
        .find(|l| {
            l.starts_with(
                r#"tidemark_protocol_requests_total{protocol="postgresql",outcome="answered"}"#,
            )
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(answered >= 10, "{metrics}");
}

/// Issue 43: where DataFusion's answers differ from PostgreSQL's, psycopg gets
/// PostgreSQL's: lists bound as parameters compared with `= ANY(%s)` and `<> ALL(%s)`
/// (strings, integers, floats; text and binary format), integer casts that round,
/// `to_char` templates, fractions of a second in `extract(epoch ...)`.
#[test]
fn psycopg_gets_postgresqls_answers() {
    let server = start(false);
    let pg = server.pg.unwrap();
    let (host, port) = (pg.ip().to_string(), pg.port().to_string());
    let printed = run_python_script("pg_postgres_answers.py", &[&host, &port, READ_TOKEN]);
    let got: Json = serde_json::from_slice(&printed).unwrap();
    assert_eq!(got["any_strings"], json!([["b"]]));
    assert_eq!(got["any_ints"], json!([["b"]]));
    assert_eq!(got["all_floats"], json!([["a"]]));
    assert_eq!(got["any_empty"], json!([[0]]));
    assert_eq!(got["any_null_element"], json!([[1]]));
    assert_eq!(got["any_binary"], json!([["a"]]));
    assert_eq!(got["literal_arrays"], json!([[2]]));
    // usage 1.5 and 2.5 (doubles) round to even: 2 and 2.
    assert_eq!(got["casts"], json!([[3, -3, 3, 2], [3, -3, 3, 2]]));
    assert_eq!(
        got["out_of_range"],
        json!(["22003", "integer out of range"])
    );
    assert_eq!(
        got["to_char"],
        json!([
            ["2023-11-14 22:13:20", "Tuesday 14th Nov"],
            ["2023-11-14 22:13:21", "Tuesday 14th Nov"]
        ])
    );
    assert_eq!(got["epoch"], json!([[1.25]]));
    assert_eq!(got["psycopg2_any_all"], json!([[1]]));
}

/// psql with `args`, connecting to `server` with `sslmode`; its output and whether it
/// succeeded.
fn psql(server: &TestServer, sslmode: &str, password: &str, args: &[&str]) -> (bool, String) {
    let pg = server.pg.unwrap();
    let conninfo = format!(
        "host=localhost port={} user=analyst dbname=tidemark sslmode={sslmode} sslrootcert={}",
        pg.port(),
        fixture("ca.pem").display()
    );
    let output = Command::new("psql")
        .arg(conninfo)
        .args(["--no-psqlrc", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .args(args)
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10")
        .output()
        .expect("psql (Debian's postgresql-client) must be installed: .ci/run installs it");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[test]
fn psql_reads_streams_and_a_wrong_password_is_refused() {
    let server = start(false);
    let (ok, out) = psql(
        &server,
        "disable",
        READ_TOKEN,
        &[
            "-c",
            "SELECT host, usage, tstart FROM cpu ORDER BY tstart; SELECT count(*) FROM cpu",
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "a|1.5|2023-11-14 22:13:20.000000+00",
            "b|2.5|2023-11-14 22:13:21.000000+00",
            "2"
        ]
    );
    let (ok, out) = psql(&server, "disable", READ_TOKEN, &["-c", "SHOW TABLES"]);
    assert!(ok && out.contains("|public|cpu|BASE TABLE"), "{out}");
    let (ok, out) = psql(&server, "disable", "wrong", &["-c", "SELECT 1"]);
    assert!(
        !ok && out.contains("Password authentication failed"),
        "{out}"
    );
}

/// Issue 46: psql's `\d` family reads `pg_catalog` (PostgreSQL 15's own queries, with
/// `OPERATOR(pg_catalog.~)`, `::regclass`, `ARRAY(SELECT ...)`): streams are tables of
/// schema `public` with their fields typed as PostgreSQL names them.
#[test]
fn psql_describes_streams() {
    let server = start(false);
    let describe = |command: &str| {
        let (ok, out) = psql(&server, "disable", READ_TOKEN, &["-c", command]);
        assert!(ok, "{command}: {out}");
        out
    };
    assert_eq!(describe(r"\dt").trim(), "public|cpu|table|postgres");
    assert_eq!(describe(r"\d").trim(), "public|cpu|table|postgres");
    assert_eq!(
        describe(r"\d cpu").lines().collect::<Vec<_>>(),
        [
            "tstart|timestamp with time zone||not null|",
            "tend|timestamp with time zone|||",
            "host|text|||",
            "usage|double precision|||",
            "n|bigint|||",
        ]
    );
    // Verbose: storage and statistics columns, and the table's options (an array
    // `pg_class.reloptions`, NULL here, joined with `||` to an `ARRAY(SELECT ...)` of an
    // `unnest` of the outer row's).
    assert_eq!(
        describe(r"\d+ cpu").lines().collect::<Vec<_>>(),
        [
            "tstart|timestamp with time zone||not null||plain|||",
            "tend|timestamp with time zone||||plain|||",
            "host|text||||extended|||",
            "usage|double precision||||plain|||",
            "n|bigint||||plain|||",
        ]
    );
    assert!(describe(r"\l").lines().any(|l| l.starts_with("tidemark|")));
    assert_eq!(describe(r"\dn").trim(), "public|postgres");
    // The schema's privileges: `array_to_string` of the array `nspacl` (NULL: the defaults);
    // the types' (`typacl`): none outside pg_catalog, as in PostgreSQL.
    assert_eq!(describe(r"\dn+").trim(), "public|postgres||");
    assert_eq!(describe(r"\dT+").trim(), "");
    // Settings are accepted and not kept: RESET as SET is, with its own tag.
    assert_eq!(describe("RESET timezone").trim(), "RESET");
    assert_eq!(describe("RESET ALL").trim(), "RESET");
    // Completion of `SELECT * FROM cp<TAB>`: psql 15's query keeps the relations outside
    // `pg_catalog`'s namespace, whose oid it looks up by name.
    assert_eq!(
        describe(
            r"SELECT c.relname, NULL::pg_catalog.text FROM pg_catalog.pg_class c WHERE c.relkind IN ('r', 'S', 'v', 'm', 'f', 'p') AND (c.relname) LIKE 'cp%' AND pg_catalog.pg_table_is_visible(c.oid) AND c.relnamespace <> (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'pg_catalog')
UNION ALL
SELECT NULL::pg_catalog.text, n.nspname FROM pg_catalog.pg_namespace n WHERE n.nspname LIKE 'cp%' AND n.nspname NOT LIKE E'pg\_%'
LIMIT 1000"
        )
        .trim(),
        "cpu|"
    );
    // Roles: one query with ARRAY(SELECT ...) correlated to each role.
    describe(r"\du");
    // Sizes are unknown (blank), and there are no functions outside pg_catalog.
    assert_eq!(
        describe(r"\dt+").trim(),
        "public|cpu|table|postgres|permanent|||"
    );
    assert!(describe(r"\l+").lines().any(|l| l.starts_with("tidemark|")));
    assert_eq!(describe(r"\df").trim(), "");
    // As PostgreSQL answers it: no such relation.
    let (_, out) = psql(&server, "disable", READ_TOKEN, &["-c", r"\d nope"]);
    assert!(
        out.contains(r#"Did not find any relation named "nope""#),
        "{out}"
    );
}

/// Issue 46: psql writes with the write token: `INSERT` (multi-row) and `\copy` of a CSV
/// file with a header and of a text file, each all or nothing, durable before it answers;
/// a refused row stores none of its COPY; the read token only reads.
#[test]
fn psql_inserts_and_copies_with_the_write_token() {
    let server = start(false);
    let count = || {
        let (ok, out) = psql(
            &server,
            "disable",
            READ_TOKEN,
            &["-c", "SELECT count(*) FROM cpu"],
        );
        assert!(ok, "{out}");
        out.trim().parse::<u64>().unwrap()
    };
    let write = |command: &str| psql(&server, "disable", WRITE_TOKEN, &["-c", command]);
    let (ok, out) = write(
        "INSERT INTO cpu (tstart, host, usage, n) VALUES \
         ('2023-11-14 22:13:30+00', 'c', 3.5, 5), ('2023-11-14 22:13:31+00', 'd', 4.5, 6)",
    );
    assert!(ok && out.trim() == "INSERT 0 2", "{out}");
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("cpu.csv");
    std::fs::write(
        &csv,
        "tstart,host,usage\n2023-11-14 22:13:40+00,\"e, east\",5.5\n2023-11-14T22:13:41Z,f,\n",
    )
    .unwrap();
    let (ok, out) = write(&format!(
        "\\copy cpu (tstart, host, usage) FROM '{}' WITH (FORMAT csv, HEADER)",
        csv.display()
    ));
    assert!(ok && out.trim() == "COPY 2", "{out}");
    let text = dir.path().join("cpu.tsv");
    std::fs::write(&text, "2023-11-14 22:13:50+00\tg\t\\N\n").unwrap();
    let (ok, out) = write(&format!(
        "\\copy cpu (tstart, host, n) FROM '{}'",
        text.display()
    ));
    assert!(ok && out.trim() == "COPY 1", "{out}");
    assert_eq!(count(), 7);
    let (ok, out) = psql(
        &server,
        "disable",
        READ_TOKEN,
        &[
            "-c",
            "SELECT host, usage FROM cpu WHERE tstart >= '2023-11-14 22:13:40+00' ORDER BY tstart",
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(out.lines().collect::<Vec<_>>(), ["e, east|5.5", "f|", "g|"]);
    // One bad value refuses its whole COPY, naming its row.
    std::fs::write(
        &csv,
        "tstart,usage\n2023-11-14 22:14:00+00,1\n2023-11-14 22:14:01+00,lots\n",
    )
    .unwrap();
    let (ok, out) = write(&format!(
        "\\copy cpu (tstart, usage) FROM '{}' WITH (FORMAT csv, HEADER)",
        csv.display()
    ));
    assert!(
        !ok && out.contains("row 2") && out.contains("\"lots\""),
        "{out}"
    );
    assert_eq!(count(), 7);
    // The read token reads only.
    for command in [
        "INSERT INTO cpu (tstart) VALUES (now())".to_string(),
        format!(
            "\\copy cpu (tstart, usage) FROM '{}' WITH (FORMAT csv, HEADER)",
            csv.display()
        ),
    ] {
        let (ok, out) = psql(&server, "disable", READ_TOKEN, &["-c", &command]);
        assert!(
            !ok && out.contains("needs the write token"),
            "{command}: {out}"
        );
    }
    assert_eq!(count(), 7);
}

/// Issue 46: SQLAlchemy 2 over psycopg 3 and psycopg2 connects (version(), settings, the
/// type lookups of its first connection), reflects the streams (schemas with `LIKE ...
/// ESCAPE '/'`, columns with correlated subqueries) and reads through
/// `pandas.read_sql(sql, engine)` without pandas' warning; Grafana's catalog queries
/// (tests/fixtures/grafana_catalog_queries.sql, from its source) answer; with the write
/// token, `DataFrame.to_sql(..., if_exists="append")` appends.
#[test]
fn sqlalchemy_pandas_and_grafana_browse_streams() {
    let server = start(false);
    let pg = server.pg.unwrap();
    let (host, port) = (pg.ip().to_string(), pg.port().to_string());
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let queries = fixtures.join("grafana_catalog_queries.sql");
    let printed = run_python_script(
        "pg_tools.py",
        &[
            &host,
            &port,
            READ_TOKEN,
            "cpu",
            queries.to_str().unwrap(),
            WRITE_TOKEN,
        ],
    );
    let got: Json = serde_json::from_slice(&printed).unwrap();
    for driver in ["psycopg", "psycopg2"] {
        let got = &got[driver];
        assert_eq!(got["connect"], json!([[16, 6], 2]), "{driver}: {got}");
        assert_eq!(
            got["read_sql"],
            json!({"rows": 2, "columns": ["tstart", "tend", "host", "usage", "n"], "warnings": []}),
            "{driver}: {got}"
        );
        assert_eq!(got["schemas"], json!(["public"]), "{driver}: {got}");
        assert_eq!(got["tables"], json!(["cpu"]), "{driver}: {got}");
        assert_eq!(got["has_table"], json!([true, false]), "{driver}: {got}");
        assert_eq!(
            got["columns"],
            json!([
                ["tstart", "TIMESTAMP", false],
                ["tend", "TIMESTAMP", true],
                ["host", "TEXT", true],
                ["usage", "DOUBLE PRECISION", true],
                ["n", "BIGINT", true]
            ]),
            "{driver}: {got}"
        );
        assert_eq!(
            got["reflected"],
            json!(["tstart", "tend", "host", "usage", "n"]),
            "{driver}: {got}"
        );
    }
    let grafana = &got["grafana"];
    // Every query of the fixtures answers: Grafana shows an error for any that does not.
    let refused: Vec<_> = grafana
        .as_object()
        .map(|queries| {
            queries
                .iter()
                .filter(|(_, a)| a.get("error").is_some())
                .collect()
        })
        .unwrap_or_default();
    assert!(refused.is_empty(), "refused: {refused:?}");
    assert_eq!(grafana["get_version"], json!([["1600"]]), "{grafana}");
    assert_eq!(grafana["get_timescaledb_version"], json!([]), "{grafana}");
    for picker in ["show_schemas", "backend_schema_list"] {
        assert_eq!(grafana[picker], json!([["public"]]), "{picker}: {grafana}");
    }
    for picker in ["show_tables", "show_tables_in_schema", "backend_table_list"] {
        assert_eq!(grafana[picker], json!([["cpu"]]), "{picker}: {grafana}");
    }
    // The column picker (it splits search_path with string_to_array and compares schemas
    // with `user`), the older query builder's table list, and the backend's values of a
    // column of `"public"."cpu"`.
    let first_column = |rows: &Json| {
        rows.as_array()
            .map(|rows| rows.iter().map(|row| row[0].clone()).collect::<Vec<_>>())
    };
    assert_eq!(
        grafana["get_columns"],
        json!([
            ["tstart", "timestamp with time zone"],
            ["tend", "timestamp with time zone"],
            ["host", "text"],
            ["usage", "double precision"],
            ["n", "bigint"],
        ]),
        "{grafana}"
    );
    // The older builder's time columns, picked by their PostgreSQL type (times, and numbers
    // as epochs), and the backend's column list with udt_name.
    assert_eq!(
        first_column(&grafana["legacy_time_columns"]),
        Some(["n", "tend", "tstart", "usage"].map(|c| json!(c)).to_vec()),
        "{grafana}"
    );
    assert_eq!(
        grafana["backend_column_list"].as_array().map(|rows| rows
            .iter()
            .map(|r| [r[0].clone(), r[2].clone()])
            .collect::<Vec<_>>()),
        Some(
            [
                ["tstart", "timestamptz"],
                ["tend", "timestamptz"],
                ["host", "text"],
                ["usage", "float8"],
                ["n", "int8"],
            ]
            .map(|[c, t]| [json!(c), json!(t)])
            .to_vec()
        ),
        "{grafana}"
    );
    assert_eq!(grafana["legacy_table_list"], json!([["cpu"]]), "{grafana}");
    // The older builder's first guess: the stream, its first time column and its first
    // DOUBLE field; and the aggregates of one float8 it offers.
    assert_eq!(
        grafana["legacy_find_metric_table"],
        json!([["cpu", "tstart", "usage"]]),
        "{grafana}"
    );
    let aggregates = first_column(&grafana["legacy_aggregate_functions"]).unwrap_or_default();
    for aggregate in ["avg", "max", "min", "stddev", "sum"] {
        assert!(
            aggregates.contains(&json!(aggregate)),
            "{aggregate}: {grafana}"
        );
    }
    assert!(
        first_column(&grafana["backend_column_values"]).is_some_and(|rows| !rows.is_empty()),
        "{grafana}"
    );
    // pandas' to_sql appends through INSERT, and the rows read back as written.
    for driver in ["psycopg", "psycopg2"] {
        let got = &got[format!("to_sql_{driver}")];
        assert_eq!(
            got["read_back"],
            json!([
                ["2023-11-14T22:15:00+00:00", 7.5],
                ["2023-11-14T22:15:01+00:00", 8.5]
            ]),
            "{driver}: {got}"
        );
    }
    // A ROLLBACK cannot undo the INSERT before it: it warns, once, and the row stays.
    assert_eq!(
        got["rollback"]["notices"],
        json!([[
            "WARNING",
            "01000",
            "ROLLBACK cannot undo the 1 events this transaction stored: Tidemark stores each \
             INSERT and COPY when it answers it (docs/sql.md, \"Transactions\")"
        ]])
    );
    assert_eq!(got["rollback"]["stayed"], json!(1));
}

/// Issue 46: pgjdbc's DatabaseMetaData (what DBeaver and Metabase browse with) lists the
/// schema, the streams and their columns typed as PostgreSQL names them, finds no keys or
/// indexes, runs a prepared query and, with the write token, a prepared INSERT (tests/java/PgJdbc.java, with Java's source launcher
/// against `peers/install.sh pgjdbc`'s driver).
#[test]
fn pgjdbc_browses_and_queries_streams() {
    let server = start(false);
    let pg = server.pg.unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let libs = root.join(".peers/pgjdbc/libs");
    assert!(
        libs.is_dir(),
        "pgjdbc is missing: `peers/install.sh pgjdbc` downloads it (.ci/run does)"
    );
    let output = Command::new("java")
        .arg("-cp")
        .arg(format!("{}/*", libs.display()))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/java/PgJdbc.java"))
        .args([
            &pg.ip().to_string(),
            &pg.port().to_string(),
            READ_TOKEN,
            "cpu",
            WRITE_TOKEN,
        ])
        .output()
        .expect("java (a JDK 17 or later) must be installed: .ci/run installs it");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let got: Json = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(got["error"], Json::Null, "{got}");
    assert_eq!(got["major"], json!(16));
    // As PostgreSQL's pgjdbc lists them: the catalog's own schema too.
    assert_eq!(got["schemas"], json!(["pg_catalog", "public"]));
    assert_eq!(got["tables"], json!(["cpu"]));
    assert_eq!(
        got["columns"],
        json!([
            "tstart:timestamptz:93:NO",
            "tend:timestamptz:93:YES",
            "host:text:12:YES",
            "usage:float8:8:YES",
            "n:int8:-5:YES"
        ])
    );
    assert_eq!(got["primary_keys"], json!([]));
    assert_eq!(got["indexes"], json!([]));
    // Bound as a double: usage 2.5 of the two events is over 2.
    assert_eq!(got["count_usage_over_2"], json!(1));
    // A prepared INSERT, once and as a batch of two, with the write token.
    assert_eq!(got["inserted"], json!(1));
    assert_eq!(got["batched"], json!(2));
    assert_eq!(got["count_jdbc"], json!(3));
}

#[test]
fn with_tls_configured_psql_connects_over_tls_only() {
    let server = start(true);
    let (ok, out) = psql(&server, "verify-full", READ_TOKEN, &["-c", "SELECT 40 + 2"]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "42");
    let (ok, out) = psql(&server, "disable", READ_TOKEN, &["-c", "SELECT 1"]);
    assert!(!ok && out.contains("TLS connections only"), "{out}");
}

/// A PostgreSQL startup message (protocol 3.0) for `user`.
fn startup_message(user: &str) -> Vec<u8> {
    let mut body = 196_608i32.to_be_bytes().to_vec();
    for part in ["user", user, "database", "tidemark", ""] {
        body.extend_from_slice(part.as_bytes());
        body.push(0);
    }
    let mut message = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    message.extend(body);
    message
}

/// Reads messages up to ReadyForQuery ('Z'): their types and bodies, or `None` if the
/// connection ends first.
fn read_until_ready(socket: &mut std::net::TcpStream) -> Option<Vec<(u8, Vec<u8>)>> {
    use std::io::Read;
    let mut messages = Vec::new();
    loop {
        let mut head = [0u8; 5];
        socket.read_exact(&mut head).ok()?;
        let length = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
        let mut body = vec![0u8; (length - 4).max(0) as usize];
        socket.read_exact(&mut body).ok()?;
        messages.push((head[0], body));
        if head[0] == b'Z' {
            return Some(messages);
        }
    }
}

/// The bytes the server holds for appends in flight, from `/metrics`.
fn bytes_in_flight(server: &TestServer) -> u64 {
    let metrics = metrics_text_with(server, None);
    metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix("tidemark_ingest_bytes_in_flight")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no bytes in flight in\n{metrics}"))
}

/// Issue 46 review: a COPY's data is held on the append budget only while its COPY is under
/// way. Another statement in its place and a closed connection let go of it at once (well
/// before the silence watcher could), data that stops coming for `limits.read_timeout_ms`
/// after that; the session goes on, and nothing is stored.
#[test]
fn an_unfinished_copy_lets_go_of_its_budget() {
    use std::time::{Duration, Instant};
    let server = TestServer::start(|c| {
        c.pg = Some(Pg::at("127.0.0.1:0".parse().unwrap()));
        c.limits.read_timeout_ms = 2_000;
    });
    let created = post(
        &server,
        "/v1/streams",
        &[("Content-Type", "application/json")],
        br#"{"name": "t", "schema": "S:STRING"}"#,
    );
    assert_eq!(created.status, 201, "{}", created.body);
    let query = |raw: &mut Raw, text: &str| raw.send(b'Q', format!("{text}\0").as_bytes());
    let row = format!("2024-01-01T00:00:00Z\t{}\n", "x".repeat(100_000));
    // Starts a COPY, sends 1 MB of its data and waits until the server holds all of it.
    let begin_copy = |raw: &mut Raw| {
        query(raw, "COPY t (tstart, s) FROM STDIN");
        // CopyInResponse asks for the data; no ReadyForQuery until the COPY ends.
        assert_eq!(raw.read().map(|m| m.0), Some(b'G'));
        for _ in 0..10 {
            raw.send(b'd', row.as_bytes());
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while bytes_in_flight(&server) < 1_000_000 {
            assert!(
                Instant::now() < deadline,
                "the COPY's data is on the budget"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // Whether the budget is free again within `within`.
    let released_within = |within: Duration| {
        let deadline = Instant::now() + within;
        while bytes_in_flight(&server) != 0 {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    };
    // Another statement instead of CopyDone: pgwire refuses it and leaves COPY mode; the
    // next statement lets go of the COPY before it is answered.
    let mut raw = Raw::session(&server, None);
    begin_copy(&mut raw);
    query(&mut raw, "SELECT 1");
    let answer = raw.until_ready().unwrap();
    assert!(answer.iter().any(|(kind, _)| *kind == b'E'), "{answer:?}");
    query(&mut raw, "SELECT count(*) FROM t");
    let answer = raw.until_ready().unwrap();
    assert!(
        answer
            .iter()
            .any(|(kind, body)| *kind == b'D' && body.ends_with(b"0")),
        "{answer:?}"
    );
    assert_eq!(
        bytes_in_flight(&server),
        0,
        "a statement lets go of the COPY"
    );
    // Data that stops coming: let go of after the read timeout; the COPY is then refused.
    begin_copy(&mut raw);
    assert!(
        !released_within(Duration::from_millis(500)),
        "held while it may still come"
    );
    assert!(
        released_within(Duration::from_secs(5)),
        "a silent COPY lets go of its data"
    );
    raw.send(b'c', b"");
    let answer = raw.until_ready().unwrap();
    let refusal = answer
        .iter()
        .find(|(kind, _)| *kind == b'E')
        .expect("the COPY is refused");
    assert!(
        String::from_utf8_lossy(&refusal.1).contains("stopped coming"),
        "{answer:?}"
    );
    // A connection closed mid-COPY lets go of it with its session.
    begin_copy(&mut raw);
    drop(raw);
    assert!(
        released_within(Duration::from_millis(1_000)),
        "a closed connection lets go of its COPY"
    );
    let counted = post(
        &server,
        "/v1/query",
        &[("Content-Type", "application/json")],
        br#"{"sql": "SELECT count(*) FROM t"}"#,
    );
    assert!(counted.body.contains("[[0]]"), "{}", counted.body);
}

#[test]
fn a_malformed_message_ends_its_connection_and_nothing_else() {
    use std::io::{Read, Write};
    let server = TestServer::start(|c| c.pg = Some(Pg::at("127.0.0.1:0".parse().unwrap())));
    let pg = server.pg.unwrap();
    let connect = || {
        let mut socket = std::net::TcpStream::connect(pg).unwrap();
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        socket.write_all(&startup_message("fuzz")).unwrap();
        assert!(read_until_ready(&mut socket).is_some());
        socket
    };
    let mut healthy = connect();
    for malformed in [
        &b"E\0\0\0\0"[..],      // a length below the 4 bytes it counts itself
        b"E\0\0\0\x04\xf1",     // an Execute without its fields
        b"Q\xff\xff\xff\xff",   // a negative length
        b"Q\0\0\0\x09SELECT 1", // a query without its terminating NUL
        b"\x01\0\0\0\x04",      // no such message
    ] {
        let mut socket = connect();
        socket.write_all(malformed).unwrap();
        let _ = socket.write_all(b"S\0\0\0\x04");
        // Refused with an error, or closed: either way never answered as a statement, and
        // the server goes on.
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest);
        assert!(
            !rest.windows(2).any(|w| w == b"T\0"),
            "{malformed:?}: {rest:?}"
        );
    }
    // Queries still run, on a connection opened before and on a new one.
    for socket in [&mut healthy, &mut connect()] {
        socket.write_all(b"Q\0\0\0\x0eSELECT 42\0").unwrap();
        let answer = read_until_ready(socket).unwrap();
        // A DataRow of one column: the text "42".
        assert!(
            answer.contains(&(b'D', b"\0\x01\0\0\0\x0242".to_vec())),
            "{answer:?}"
        );
    }
    let (ok, out) = psql(&server, "disable", "", &["-c", "SELECT 40 + 2"]);
    assert!(ok && out.trim() == "42", "{out}");
}

// What one client may hold: message sizes, slots, idle time, named statements.

/// A raw PostgreSQL connection, for what no client library sends on purpose.
struct Raw(std::net::TcpStream);

impl Raw {
    /// Connects and sends the startup message, with a 10 s read timeout.
    fn start(server: &TestServer) -> Raw {
        use std::io::Write;
        let mut socket = std::net::TcpStream::connect(server.pg.unwrap()).unwrap();
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        socket.write_all(&startup_message("raw")).unwrap();
        Raw(socket)
    }

    /// Starts and authenticates with `password` (none if the server asks none).
    fn session(server: &TestServer, password: Option<&str>) -> Raw {
        let mut raw = Raw::start(server);
        if let Some(password) = password {
            assert_eq!(raw.read().map(|m| m.0), Some(b'R'), "asked for a password");
            raw.send(b'p', &[password.as_bytes(), b"\0"].concat());
        }
        let answer = raw.until_ready().expect("authenticated");
        assert!(answer.iter().all(|(kind, _)| *kind != b'E'), "{answer:?}");
        raw
    }

    fn send(&mut self, kind: u8, body: &[u8]) {
        use std::io::Write;
        let mut message = vec![kind];
        message.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        message.extend_from_slice(body);
        self.0.write_all(&message).unwrap();
    }

    /// The next message, or `None` once the connection is closed (or silent for 10 s).
    fn read(&mut self) -> Option<(u8, Vec<u8>)> {
        use std::io::Read;
        let mut head = [0u8; 5];
        self.0.read_exact(&mut head).ok()?;
        let length = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
        let mut body = vec![0u8; (length - 4).max(0) as usize];
        self.0.read_exact(&mut body).ok()?;
        Some((head[0], body))
    }

    fn until_ready(&mut self) -> Option<Vec<(u8, Vec<u8>)>> {
        read_until_ready(&mut self.0)
    }

    /// The error the server sends before it closes the connection, and that it closed.
    fn closing_error(&mut self) -> String {
        let mut error = None;
        while let Some((kind, body)) = self.read() {
            if kind == b'E' {
                error = Some(String::from_utf8_lossy(&body).into_owned());
            }
        }
        use std::io::Read;
        let mut rest = [0u8; 1];
        assert!(
            matches!(self.0.read(&mut rest), Ok(0)),
            "the connection is closed"
        );
        error.expect("an ErrorResponse before the close")
    }
}

/// A Parse message's body: a statement `name` for `sql`, with `types` (OIDs).
fn parse_body(name: &str, sql: &str, types: &[u32]) -> Vec<u8> {
    let mut body = [name.as_bytes(), b"\0", sql.as_bytes(), b"\0"].concat();
    body.extend_from_slice(&(types.len() as i16).to_be_bytes());
    for ty in types {
        body.extend_from_slice(&ty.to_be_bytes());
    }
    body
}

/// A Bind message's body for the unnamed portal of statement `name`: parameters in `format`
/// (0 text, 1 binary), results in text.
fn bind_body(name: &str, format: i16, params: &[&[u8]]) -> Vec<u8> {
    let mut body = [b"\0", name.as_bytes(), b"\0"].concat();
    body.extend_from_slice(&1i16.to_be_bytes());
    body.extend_from_slice(&format.to_be_bytes());
    body.extend_from_slice(&(params.len() as i16).to_be_bytes());
    for p in params {
        body.extend_from_slice(&(p.len() as i32).to_be_bytes());
        body.extend_from_slice(p);
    }
    body.extend_from_slice(&0i16.to_be_bytes());
    body
}

fn with_pg(configure: impl FnOnce(&mut Pg)) -> TestServer {
    TestServer::start(|c| {
        c.auth.read_token = Some(READ_TOKEN.into());
        let mut pg = Pg::at("127.0.0.1:0".parse().unwrap());
        configure(&mut pg);
        c.pg = Some(pg);
    })
}

#[test]
fn before_authentication_only_a_small_password_is_read() {
    let server = with_pg(|_| {});
    // A query claiming a gigabyte, before the password: refused from its header (pgwire
    // alone would buffer the whole gigabyte first).
    let mut raw = Raw::start(&server);
    assert_eq!(raw.read().map(|m| m.0), Some(b'R'));
    use std::io::Write;
    raw.0.write_all(b"Q\x3f\xff\xff\xff").unwrap();
    let _ = raw.0.write_all(&vec![b'x'; 1 << 20]);
    let error = raw.closing_error();
    assert!(error.contains("before authentication"), "{error}");
    // A password message over 10,000 bytes is refused the same way.
    let mut raw = Raw::start(&server);
    assert_eq!(raw.read().map(|m| m.0), Some(b'R'));
    raw.0.write_all(b"p\0\x10\0\0").unwrap();
    let error = raw.closing_error();
    assert!(error.contains("over the limit of 10000 bytes"), "{error}");
    // The right password still opens a session.
    let mut raw = Raw::session(&server, Some(READ_TOKEN));
    raw.send(b'Q', b"SELECT 42\0");
    assert!(raw.until_ready().unwrap().iter().any(|(k, _)| *k == b'D'));
}

#[test]
fn a_session_message_over_the_limit_is_refused_from_its_header() {
    let server = with_pg(|pg| pg.max_message_bytes = 1 << 20);
    let mut raw = Raw::session(&server, Some(READ_TOKEN));
    // Up to the limit passes.
    let long = format!("SELECT length('{}')\0", "x".repeat(500_000));
    raw.send(b'Q', long.as_bytes());
    let answer = raw.until_ready().unwrap();
    assert!(
        answer.contains(&(b'D', b"\0\x01\0\0\0\x06500000".to_vec())),
        "{answer:?}"
    );
    use std::io::Write;
    raw.0.write_all(b"Q\0\x20\0\0").unwrap();
    let error = raw.closing_error();
    assert!(error.contains("pg.max_message_bytes"), "{error}");
    assert!(error.contains("54000"), "{error}");
}

#[test]
fn silent_connections_cannot_lock_out_a_client_with_the_password() {
    // More silent starters than the listener has slots of both kinds together (320), and
    // than it had connections before starters had slots of their own (256).
    let server = with_pg(|_| {});
    let silent: Vec<Raw> = (0..340).map(|_| Raw::start(&server)).collect();
    let (ok, out) = psql(&server, "disable", READ_TOKEN, &["-c", "SELECT 40 + 2"]);
    assert!(ok && out.trim() == "42", "{out}");
    drop(silent);
}

#[test]
fn a_connection_must_authenticate_in_time_and_a_session_ends_when_idle() {
    let server = with_pg(|pg| {
        pg.startup_timeout_ms = 300;
        pg.idle_timeout_ms = 300;
    });
    let mut starter = Raw::start(&server);
    assert_eq!(starter.read().map(|m| m.0), Some(b'R'));
    let error = starter.closing_error();
    assert!(error.contains("pg.startup_timeout_ms"), "{error}");
    let mut session = Raw::session(&server, Some(READ_TOKEN));
    let error = session.closing_error();
    assert!(error.contains("57P05") && error.contains("idle"), "{error}");
}

#[test]
fn sessions_beyond_the_limit_are_refused_and_starters_do_not_count() {
    let server = with_pg(|pg| pg.max_connections = 2);
    let _sessions = [
        Raw::session(&server, Some(READ_TOKEN)),
        Raw::session(&server, Some(READ_TOKEN)),
    ];
    let _starters: Vec<Raw> = (0..5).map(|_| Raw::start(&server)).collect();
    let (ok, out) = psql(&server, "disable", READ_TOKEN, &["-c", "SELECT 1"]);
    assert!(!ok && out.contains("too many clients"), "{out}");
}

#[test]
fn named_statements_of_a_session_are_bounded_and_can_be_closed() {
    let server = with_pg(|pg| pg.max_prepared = 3);
    let mut raw = Raw::session(&server, Some(READ_TOKEN));
    for name in ["s1", "s2", "s3"] {
        raw.send(b'P', &parse_body(name, "SELECT 1", &[]));
    }
    raw.send(b'S', b"");
    let answer = raw.until_ready().unwrap();
    assert_eq!(answer.iter().filter(|(k, _)| *k == b'1').count(), 3);
    raw.send(b'P', &parse_body("s4", "SELECT 1", &[]));
    raw.send(b'S', b"");
    let answer = raw.until_ready().unwrap();
    let error = answer.iter().find(|(k, _)| *k == b'E').expect("refused");
    assert!(String::from_utf8_lossy(&error.1).contains("pg.max_prepared"));
    // Closing one makes room; the session went on.
    raw.send(b'C', b"Ss1\0");
    raw.send(b'P', &parse_body("s4", "SELECT 1", &[]));
    raw.send(b'S', b"");
    let answer = raw.until_ready().unwrap();
    assert!(answer.iter().all(|(k, _)| *k != b'E'), "{answer:?}");
    assert!(answer.iter().any(|(k, _)| *k == b'1'), "{answer:?}");
    // DEALLOCATE (what psycopg sends when its cache evicts one) makes room too.
    raw.send(b'Q', b"DEALLOCATE s2\0");
    let answer = raw.until_ready().unwrap();
    assert!(answer.iter().all(|(k, _)| *k != b'E'), "{answer:?}");
    raw.send(b'P', &parse_body("s5", "SELECT 1", &[]));
    raw.send(b'S', b"");
    let answer = raw.until_ready().unwrap();
    assert!(answer.iter().all(|(k, _)| *k != b'E'), "{answer:?}");
    raw.send(b'Q', b"DEALLOCATE s2\0");
    let answer = raw.until_ready().unwrap();
    assert!(
        answer.iter().any(|(k, _)| *k == b'E'),
        "s2 is gone: {answer:?}"
    );
}

#[test]
fn bind_takes_exactly_the_parameters_and_booleans_of_one_byte() {
    let server = with_pg(|_| {});
    let mut raw = Raw::session(&server, Some(READ_TOKEN));
    let error_of = |raw: &mut Raw| -> Option<String> {
        raw.send(b'E', b"\0\0\0\0\0");
        raw.send(b'S', b"");
        let answer = raw.until_ready().unwrap();
        answer
            .iter()
            .find(|(k, _)| *k == b'E')
            .map(|(_, body)| String::from_utf8_lossy(body).into_owned())
    };
    raw.send(b'P', &parse_body("", "SELECT $1::text", &[]));
    raw.send(b'B', &bind_body("", 0, &[b"a", b"b"]));
    let error = error_of(&mut raw).expect("two parameters for one are refused");
    assert!(
        error.contains("supplies 2 parameters") && error.contains("08P01"),
        "{error}"
    );
    raw.send(b'P', &parse_body("", "SELECT $1", &[16]));
    raw.send(b'B', &bind_body("", 1, &[&[2]]));
    let error = error_of(&mut raw).expect("a binary boolean of 2 is refused");
    assert!(error.contains("22P03"), "{error}");
    raw.send(b'P', &parse_body("", "SELECT $1", &[16]));
    raw.send(b'B', &bind_body("", 1, &[&[1]]));
    assert_eq!(error_of(&mut raw), None);
}

#[test]
fn a_message_must_end_where_its_length_says() {
    use std::io::Write;
    let server = with_pg(|_| {});
    // A startup message whose declared length also covers a query after its parameters:
    // pgwire's decoder stops at the parameters' end and would read the query as a message
    // of its own, one the gate never framed.
    let mut body = 196_608i32.to_be_bytes().to_vec();
    body.extend_from_slice(b"user\0raw\0\0");
    body.extend_from_slice(b"Q\0\0\0\x0dSELECT 42\0");
    let mut message = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    message.extend(body);
    let mut socket = std::net::TcpStream::connect(server.pg.unwrap()).unwrap();
    socket
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    socket.write_all(&message).unwrap();
    let mut raw = Raw(socket);
    let error = raw.closing_error();
    assert!(error.contains("08P01"), "{error}");
}

#[test]
fn a_portal_is_charged_the_statement_it_keeps_alive() {
    let server = with_pg(|pg| pg.max_prepared_bytes = 1 << 20);
    let mut raw = Raw::session(&server, Some(READ_TOKEN));
    let sql = format!("SELECT '{}'", "x".repeat(300_000));
    raw.send(b'P', &parse_body("", &sql, &[]));
    let bind = |portal: &str| {
        let mut body = [portal.as_bytes(), b"\0\0"].concat();
        body.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        body
    };
    for portal in ["p1", "p2", "p3"] {
        raw.send(b'B', &bind(portal));
    }
    raw.send(b'S', b"");
    let answer = raw.until_ready().unwrap();
    assert!(answer.iter().all(|(k, _)| *k != b'E'), "{answer:?}");
    raw.send(b'B', &bind("p4"));
    raw.send(b'S', b"");
    let answer = raw.until_ready().unwrap();
    let error = answer.iter().find(|(k, _)| *k == b'E').expect("refused");
    assert!(String::from_utf8_lossy(&error.1).contains("pg.max_prepared_bytes"));
}

/// An offset that is not whole hours (Kathmandu +05:45, St John's -03:30, India +05:30)
/// reaches psycopg whole, in text and in binary format: the instant it reads is the one
/// stored. Text used to carry `+05` alone, which psycopg read as an instant 45 minutes late.
#[test]
fn psycopg_reads_offsets_of_half_and_quarter_hours_at_the_right_instant() {
    let server = start(false);
    let pg = server.pg.unwrap();
    let (host, port) = (pg.ip().to_string(), pg.port().to_string());
    let printed = run_python_script("pg_time_zones.py", &[&host, &port, READ_TOKEN]);
    let got: Json = serde_json::from_slice(&printed).unwrap();
    // psycopg hands timestamptz values back in its session's zone: what must hold is that
    // each is the stored instant, 1700000000 and 1700000001 seconds after the epoch.
    for format in ["text", "binary"] {
        for zone in [
            "Asia/Kathmandu",
            "America/St_Johns",
            "Asia/Kolkata",
            "Europe/Paris",
            "UTC",
        ] {
            let key = format!("{format} {zone}");
            let instants: Vec<i64> = got[&key]
                .as_array()
                .unwrap_or_else(|| panic!("{key}: {got}"))
                .iter()
                .map(|t| instant(t.as_str().unwrap()))
                .collect();
            assert_eq!(instants, [1_700_000_000, 1_700_000_001], "{key}: {got}");
        }
    }
    // psql shows the text as sent: the offset as PostgreSQL writes it, minutes when it has
    // any (1900 in Kathmandu was local mean time, +05:41:16: seconds too).
    let (ok, out) = psql(
        &server,
        "disable",
        READ_TOKEN,
        &[
            "-c",
            "SELECT tstart AT TIME ZONE 'Asia/Kathmandu', tstart AT TIME ZONE 'America/St_Johns', \
             tstart AT TIME ZONE 'Europe/Paris', tstart AT TIME ZONE 'UTC' \
             FROM cpu ORDER BY tstart LIMIT 1",
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(
        out.trim(),
        "2023-11-15 03:58:20.000000+05:45|2023-11-14 18:43:20.000000-03:30|\
         2023-11-14 23:13:20.000000+01|2023-11-14 22:13:20.000000+00"
    );
}

/// Seconds since the epoch of an ISO 8601 time with an offset (`…T03:58:20+05:45`).
fn instant(text: &str) -> i64 {
    let (local, offset) = text.split_at(text.len() - 6);
    let sign = if offset.starts_with('-') { -1 } else { 1 };
    let offset_seconds = sign
        * (offset[1..3].parse::<i64>().unwrap() * 3600 + offset[4..6].parse::<i64>().unwrap() * 60);
    let (date, time) = local.split_once('T').unwrap();
    let d: Vec<i64> = date.split('-').map(|p| p.parse().unwrap()).collect();
    let t: Vec<i64> = time.split(':').map(|p| p.parse().unwrap()).collect();
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m) = if d[1] <= 2 {
        (d[0] - 1, d[1] + 9)
    } else {
        (d[0], d[1] - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d[2] - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + t[0] * 3600 + t[1] * 60 + t[2] - offset_seconds
}

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
        c.pg = Some(Pg {
            listen: "127.0.0.1:0".parse().unwrap(),
        });
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
    assert_eq!(got["psycopg_catalog"][0], json!("0A000"));
    assert!(got["psycopg_catalog"][1]
        .as_str()
        .unwrap()
        .contains("pg_catalog.pg_class"));
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
fn psql_reads_streams_and_is_told_what_it_cannot_do() {
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
    // \dt reads pg_catalog: refused, naming it and where the streams are listed.
    let (ok, out) = psql(&server, "disable", READ_TOKEN, &["-c", r"\dt"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("pg_catalog.pg_class") && out.contains("SHOW TABLES"),
        "{out}"
    );
    let (ok, out) = psql(&server, "disable", "wrong", &["-c", "SELECT 1"]);
    assert!(
        !ok && out.contains("Password authentication failed"),
        "{out}"
    );
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

#[test]
fn a_malformed_message_ends_its_connection_and_nothing_else() {
    use std::io::{Read, Write};
    let server = TestServer::start(|c| {
        c.pg = Some(Pg {
            listen: "127.0.0.1:0".parse().unwrap(),
        })
    });
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

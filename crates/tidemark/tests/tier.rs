//! Tiering through the real server: `tidemark serve` with a `[tier]` section pointing at
//! S3Proxy 4.1.0 on 127.0.0.1 (it checks SigV4 signatures; `peers/install.sh s3proxy`),
//! the credentials in the AWS environment variables as every S3 tool reads them.
//!
//! Old events move to the bucket; SQL answers the same before and after; `/v1/tier`,
//! `/metrics` and `tidemark tier status` report it; a server killed (SIGKILL) and started
//! again while the bucket is down answers queries that need tiered data with 503 naming
//! the segment, never a partial answer, and answers them again once the bucket is back.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{start_with_env, Process};
use serde_json::{json, Value as Json};
use tidemark_client::{ClientError, HttpClient};
use tidemark_tier::s3proxy::{S3Proxy, ACCESS_KEY, BUCKET, SECRET};

const SECOND: i64 = 1_000_000_000;

/// A configuration serving `dir/data` that tiers to S3Proxy.
fn config_at(dir: &Path, proxy: &S3Proxy) -> std::path::PathBuf {
    let path = dir.join("tidemark.toml");
    std::fs::write(
        &path,
        format!(
            "data_dir = \"{}\"\nhttp = \"127.0.0.1:0\"\nbinary = \"127.0.0.1:0\"\n\n\
             [tier]\nurl = \"s3://{BUCKET}/server\"\nendpoint = \"{}\"\nregion = \"us-east-1\"\n\
             after = \"1h\"\ncheck_every = \"100ms\"\n",
            dir.join("data").display(),
            proxy.endpoint
        ),
    )
    .unwrap();
    path
}

/// The AWS environment with S3Proxy's test key.
const CREDENTIALS: [(&str, &str); 2] = [
    ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
    ("AWS_SECRET_ACCESS_KEY", SECRET),
];

fn serve(config: &Path) -> (Process, HttpClient) {
    let server = start_with_env(
        &["serve", "--config", config.to_str().unwrap()],
        &CREDENTIALS,
    );
    let client = HttpClient::new(&server.http, None);
    (server, client)
}

fn tier(client: &HttpClient) -> Json {
    client.request("GET", "/v1/tier", None).unwrap()
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn query(client: &HttpClient, sql: &str) -> Result<Json, ClientError> {
    client
        .query_with_times(sql, "ns")
        .map(|answer| answer["rows"].clone())
}

#[test]
fn old_events_move_to_the_bucket_and_sql_answers_the_same() {
    let Some(mut proxy) = S3Proxy::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config_at(dir.path(), &proxy);
    let (mut server, client) = serve(&config);

    client
        .request(
            "POST",
            "/v1/streams",
            Some((
                "application/json",
                json!({"name": "ticks", "schema": "SYMBOL:STRING,PRICE:DOUBLE"})
                    .to_string()
                    .into_bytes(),
            )),
        )
        .unwrap();
    // Two days old: due for the bucket as soon as it is in a segment.
    let start = tidemark_core::time::now_ns() - 2 * 86_400 * SECOND;
    let ndjson: String = (0..6000)
        .map(|i| {
            format!(
                "{{\"tstart\": {}, \"SYMBOL\": \"{}\", \"PRICE\": {}}}\n",
                start + i * SECOND,
                ["AAPL", "MSFT"][i as usize % 2],
                i as f64 / 8.0
            )
        })
        .collect();
    client
        .request(
            "POST",
            "/v1/streams/ticks/events",
            Some(("application/x-ndjson", ndjson.into_bytes())),
        )
        .unwrap();
    let by_symbol = "SELECT SYMBOL, count(*), sum(PRICE), min(tstart), max(tstart) FROM ticks GROUP BY SYMBOL ORDER BY SYMBOL";
    let rows = "SELECT tstart, SYMBOL, PRICE FROM ticks ORDER BY tstart";
    let expected_by_symbol = query(&client, by_symbol).unwrap();
    let expected_rows = query(&client, rows).unwrap();
    assert_eq!(expected_rows.as_array().unwrap().len(), 6000);

    // The flusher writes the segment within 10 s of a quiet stream; then it moves.
    wait_for("the segment to move", Duration::from_secs(60), || {
        tier(&client)["tieredSegments"] == 1
    });
    let status = tier(&client);
    assert_eq!(status["url"], format!("s3://{BUCKET}/server"));
    assert_eq!(status["pendingSegments"], 0);
    assert_eq!(status["lastError"], Json::Null);
    assert_eq!(query(&client, by_symbol).unwrap(), expected_by_symbol);
    assert_eq!(query(&client, rows).unwrap(), expected_rows);
    assert!(tier(&client)["readRequests"].as_u64().unwrap() > 0);

    let metrics = client.request("GET", "/metrics", None).unwrap();
    let metrics = metrics.as_str().unwrap();
    assert!(
        metrics.contains("tidemark_tier_tiered_segments 1"),
        "{metrics}"
    );
    assert!(metrics.contains("tidemark_tier_failing 0"), "{metrics}");

    let printed = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["tier", "status", "--server", &server.http])
        .output()
        .unwrap();
    assert!(printed.status.success(), "{printed:?}");
    let printed = String::from_utf8(printed.stdout).unwrap();
    assert!(
        printed.contains("in the bucket     1 segments"),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("s3://{BUCKET}/server")),
        "{printed}"
    );

    // A crash, and the bucket down when the server comes back: its cache is cold, so a
    // query that reads tiered blocks is refused as unavailable, naming the segment.
    server.kill();
    proxy.stop();
    let (_server, client) = serve(&config);
    match query(&client, rows) {
        // 503, whose code the API calls `unavailable`.
        Err(ClientError::Refused { code, message }) => {
            assert_eq!(code, "unavailable", "{message}");
            assert!(message.contains("tiered segment"), "{message}");
        }
        other => panic!("a query of tiered data with the bucket down answered {other:?}"),
    }
    wait_for("the failure to show", Duration::from_secs(30), || {
        tier(&client)["lastError"].is_string() || tier(&client)["failures"] != 0
    });
    proxy.restart();
    wait_for(
        "queries once the bucket is back",
        Duration::from_secs(30),
        || query(&client, rows).is_ok_and(|answer| answer == expected_rows),
    );
    assert_eq!(query(&client, by_symbol).unwrap(), expected_by_symbol);
}

fn create_stream(client: &HttpClient, name: &str) {
    client
        .request(
            "POST",
            "/v1/streams",
            Some((
                "application/json",
                json!({"name": name, "schema": "SYMBOL:STRING,PRICE:DOUBLE"})
                    .to_string()
                    .into_bytes(),
            )),
        )
        .unwrap();
}

fn append(client: &HttpClient, stream: &str, first_ns: i64, events: i64) {
    let ndjson: String = (0..events)
        .map(|i| {
            format!(
                "{{\"tstart\": {}, \"SYMBOL\": \"AAPL\", \"PRICE\": {i}}}\n",
                first_ns + i * SECOND
            )
        })
        .collect();
    client
        .request(
            "POST",
            &format!("/v1/streams/{stream}/events"),
            Some(("application/x-ndjson", ndjson.into_bytes())),
        )
        .unwrap();
}

/// Issue 43, item 2: a graceful stop (SIGTERM) right after streams were created uploads the
/// manifest copy, so `tidemark restore` brings back every stream, and every moved event,
/// not the copy of the last round.
#[test]
fn a_graceful_stop_uploads_the_manifest_so_a_restore_has_every_stream() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config_at(dir.path(), &proxy);
    let (mut server, client) = serve(&config);

    // One stream of old events, moved to the bucket (the copy then names it)...
    create_stream(&client, "moved");
    let old = tidemark_core::time::now_ns() - 2 * 86_400 * SECOND;
    append(&client, "moved", old, 500);
    wait_for("the segment to move", Duration::from_secs(60), || {
        tier(&client)["tieredSegments"] == 1
    });
    // ...then two more, one with recent events, and a stop at once: no round has uploaded
    // a manifest naming them.
    create_stream(&client, "recent");
    create_stream(&client, "empty");
    append(
        &client,
        "recent",
        tidemark_core::time::now_ns() - 60 * SECOND,
        10,
    );
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(60),
            "the server did not stop within 60 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "the server stopped with {status}");

    let restored = dir.path().join("restored");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args([
            "restore",
            "--from",
            &format!("s3://{BUCKET}/server"),
            "--endpoint",
            &proxy.endpoint,
            "--region",
            "us-east-1",
            "--data-dir",
            restored.to_str().unwrap(),
        ])
        .envs(CREDENTIALS)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let printed = String::from_utf8(output.stdout).unwrap();
    assert!(
        printed.contains(": 3 streams, 1 segments, 500 events,"),
        "{printed}"
    );
    let newest = tidemark_core::time::format_instant(old + 499 * SECOND);
    assert!(
        printed.contains(&format!("  moved: events up to {newest}")),
        "{printed}"
    );
    for stream in ["recent", "empty"] {
        assert!(
            printed.contains(&format!(
                "  {stream}: no events (none had moved to the bucket)"
            )),
            "{printed}"
        );
    }
}

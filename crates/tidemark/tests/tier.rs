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
use tidemark_testkit::s3proxy::{S3Proxy, ACCESS_KEY, BUCKET, SECRET};

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

/// Runs the `tidemark` command line against `server`; its standard output.
fn tidemark(server: &Process, args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(args)
        .args(["--server", &server.http])
        .output()
        .unwrap();
    assert!(output.status.success(), "tidemark {args:?}: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// Issue 43, item 1: `put ticks two-days-old.csv`, then `put ticks now.csv`, then live
/// writes that go on. Both files land in one memtable; its flush cuts it at the stream's
/// day partitions, so the backfill's segment is two days old as a whole and moves to the
/// bucket at the next tiering round after the flush, while the live events stay local and
/// a query of today reads nothing from the bucket. (Before, both were one segment, whose
/// newest event kept the backfill local for another day.)
#[test]
fn a_backfill_beside_live_events_moves_while_live_writes_continue() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config_at(dir.path(), &proxy);
    let (server, client) = serve(&config);
    tidemark(
        &server,
        &[
            "streams",
            "create",
            "ticks",
            "--schema",
            "SYMBOL:STRING,PRICE:DOUBLE",
        ],
    );
    let info = tidemark(&server, &["streams", "info", "ticks"]);
    assert!(info.contains("partition:   1d"), "{info}");

    const DAY: i64 = 86_400 * SECOND;
    let now = tidemark_core::time::now_ns();
    // An hour into the UTC day two days ago: the backfill's 500 seconds lie in that day.
    let backfill = (now.div_euclid(DAY) - 2) * DAY + 3600 * SECOND;
    let csv = |first: i64, events: i64| -> String {
        let rows: String = (0..events)
            .map(|i| format!("{},AAPL,{i}\n", first + i * SECOND))
            .collect();
        format!("tstart,SYMBOL,PRICE\n{rows}")
    };
    let old_csv = dir.path().join("two-days-old.csv");
    std::fs::write(&old_csv, csv(backfill, 500)).unwrap();
    let now_csv = dir.path().join("now.csv");
    std::fs::write(&now_csv, csv(now - 60 * SECOND, 50)).unwrap();
    tidemark(&server, &["put", "ticks", old_csv.to_str().unwrap()]);
    tidemark(&server, &["put", "ticks", now_csv.to_str().unwrap()]);

    // Live writes go on all along, a few events every 100 ms.
    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = {
        let (http, writing) = (server.http.clone(), writing.clone());
        std::thread::spawn(move || {
            let client = HttpClient::new(&http, None);
            let mut written = 0;
            while writing.load(std::sync::atomic::Ordering::SeqCst) {
                append(&client, "ticks", tidemark_core::time::now_ns(), 5);
                written += 5;
                std::thread::sleep(Duration::from_millis(100));
            }
            written
        })
    };

    // The flusher writes segments at least every 10 s (`after` is 1 h, `check_every`
    // 100 ms): the backfill's is due as soon as it exists.
    let started = Instant::now();
    wait_for("the backfill to move", Duration::from_secs(30), || {
        tier(&client)["tieredSegments"] == 1
    });
    eprintln!(
        "the backfill moved {:?} after it was written",
        started.elapsed()
    );
    // Only the backfill: the live events' segments stay local, round after round.
    std::thread::sleep(Duration::from_secs(2));
    let status = tier(&client);
    assert_eq!(status["tieredSegments"], 1, "{status}");
    assert_eq!(status["pendingSegments"], 0, "{status}");
    assert_eq!(status["lastError"], Json::Null, "{status}");

    // A query of today reads nothing from the bucket; one of the backfill's day does.
    let today = now.div_euclid(DAY) * DAY;
    let reads = |status: &Json| (status["readRequests"].clone(), status["cacheHits"].clone());
    let before = reads(&tier(&client));
    let live = query(
        &client,
        &format!("SELECT tstart, PRICE FROM ticks WHERE tstart >= {today} ORDER BY tstart"),
    )
    .unwrap();
    assert!(live.as_array().unwrap().len() >= 50);
    assert_eq!(
        reads(&tier(&client)),
        before,
        "today's query read the bucket"
    );
    let old = query(
        &client,
        &format!("SELECT tstart, PRICE FROM ticks WHERE tstart < {today} ORDER BY tstart"),
    )
    .unwrap();
    assert_eq!(old.as_array().unwrap().len(), 500);
    assert_ne!(reads(&tier(&client)), before);

    writing.store(false, std::sync::atomic::Ordering::SeqCst);
    let written = writer.join().unwrap();
    let count = query(&client, "SELECT count(*) FROM ticks").unwrap();
    assert_eq!(count[0][0], json!(500 + 50 + written), "{count}");
}

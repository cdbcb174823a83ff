//! InfluxData's real Python clients write to Tidemark unchanged: `influxdb-client` (the 2.x
//! API: batching write API, gzip, `Token` auth) and `influxdb` (the 1.x API: ping, write
//! with millisecond precision, the token as password). `tests/python/influx_clients.py`
//! drives them; this test reads every point back through SQL. The clients come from
//! requirements-test.txt (`make test` installs them in .venv).

mod common;

use common::{call, run_python_script, TestServer};
use serde_json::{json, Value as Json};

const TOKEN: &str = "influx-write-token-0123456789";

fn sql(server: &TestServer, query: &str) -> Json {
    let client = tidemark_client::HttpClient::new(&server.url(), Some(TOKEN));
    call(
        &client,
        "POST",
        "/v1/query",
        Some(json!({"sql": query, "time": "ns"})),
    )
    .unwrap()["rows"]
        .clone()
}

#[test]
fn the_influxdb_python_clients_write_unchanged() {
    let server = TestServer::start(|c| c.auth.write_token = Some(TOKEN.into()));
    run_python_script("influx_clients.py", &[&server.url(), TOKEN]);
    // 2,000 batched points and one written synchronously, which added a field.
    let expected_usage: f64 = (0..2000).map(|i| f64::from(i) / 2.0).sum::<f64>() - 1.0;
    assert_eq!(
        sql(
            &server,
            "SELECT count(*), count(DISTINCT host), sum(usage), sum(cores), count(up) FROM v2_cpu"
        ),
        json!([[
            2001,
            5,
            expected_usage,
            (0..2000).map(|i| i % 8).sum::<i64>(),
            1
        ]])
    );
    assert_eq!(
        sql(
            &server,
            "SELECT tstart, host, usage, cores, note FROM v2_cpu ORDER BY tstart LIMIT 2"
        ),
        json!([
            [1_700_000_000_000_000_000i64, "h0", 0.0, 0, "point 0 ü"],
            [1_700_000_000_001_000_000i64, "h1", 0.5, 1, "point 1 ü"]
        ])
    );
    // The 1.x client's milliseconds, as nanoseconds.
    assert_eq!(
        sql(
            &server,
            "SELECT count(*), min(tstart), max(tstart), sum(reading), count(DISTINCT room) FROM v1_temp"
        ),
        json!([[
            500,
            1_700_000_000_000_000_000i64,
            1_700_000_000_499_000_000i64,
            (0..500).sum::<i64>(),
            5
        ]])
    );
}

/// influxdb-client's `health()` reads `/health` into its `HealthCheck` model, which needs a
/// `name` and a `status` ("pass" or "fail"); a health check that does not fit it reports
/// `fail`, which is what monitors built on the client alert on.
#[test]
fn the_influxdb_client_health_check_passes() {
    let server = TestServer::start(|c| c.auth.write_token = Some(TOKEN.into()));
    let printed = run_python_script("influx_health.py", &[&server.url()]);
    let health: Json = serde_json::from_slice(&printed).unwrap();
    assert_eq!(health["status"], "pass", "{health}");
    assert_eq!(health["name"], "tidemark", "{health}");
    assert_eq!(health["version"], env!("CARGO_PKG_VERSION"), "{health}");
    assert!(
        health["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{health}"
    );
    assert_eq!(health["ping"], true, "{health}");
}

//! Prometheus remote write and remote read against a real server: samples stored as
//! streams of labels and values, read back through SQL and through remote read with every
//! matcher type, stale markers kept bit for bit, refusals as Prometheus acts on them — and
//! the real Prometheus (Debian's 2.42) writing to Tidemark while a second one reads it back
//! through `remote_read`, compared with the first one's own TSDB.
//!
//! Without `prometheus` the last test fails under CI (`CI` set; `.ci/run` installs Debian's
//! `prometheus` package) and is skipped with the reason elsewhere.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{call, free_port, hold_write_budget, post, Answer, TestServer};
use serde_json::{json, Value as Json};
use tidemark_protocol::prometheus::{
    self, Label, LabelMatcher, Query, ReadRequest, ReadResponse, Sample, TimeSeries, WriteRequest,
};

/// Prometheus's stale marker: a NaN with its own payload.
const STALE_NAN: u64 = 0x7ff0_0000_0000_0002;

fn series(labels: &[(&str, &str)], samples: &[(i64, f64)]) -> TimeSeries {
    TimeSeries {
        labels: labels
            .iter()
            .map(|&(name, value)| Label {
                name: name.into(),
                value: value.into(),
            })
            .collect(),
        samples: samples
            .iter()
            .map(|&(timestamp, value)| Sample { value, timestamp })
            .collect(),
        exemplars: vec![],
        histograms: vec![],
    }
}

const WRITE_HEADERS: [(&str, &str); 3] = [
    ("Content-Encoding", "snappy"),
    ("Content-Type", "application/x-protobuf"),
    ("X-Prometheus-Remote-Write-Version", "0.1.0"),
];

fn remote_write(server: &TestServer, timeseries: Vec<TimeSeries>) -> Answer {
    let body = prometheus::encode(&WriteRequest {
        timeseries,
        metadata: vec![],
    });
    post(server, "/api/v1/write", &WRITE_HEADERS, &body)
}

fn matcher(name: &str, kind: i32, value: &str) -> LabelMatcher {
    LabelMatcher {
        r#type: kind,
        name: name.into(),
        value: value.into(),
    }
}

fn remote_read(server: &TestServer, queries: Vec<Query>) -> ReadResponse {
    let body = prometheus::encode(&ReadRequest {
        queries,
        accepted_response_types: vec![0],
    });
    let answer = post(server, "/api/v1/read", &WRITE_HEADERS, &body);
    assert_eq!(answer.status, 200, "{}", answer.body);
    prometheus::decode_read_response(&answer.bytes, 64 << 20).unwrap()
}

fn query(start: i64, end: i64, matchers: Vec<LabelMatcher>) -> Query {
    Query {
        start_timestamp_ms: start,
        end_timestamp_ms: end,
        matchers,
    }
}

/// Each series of a query's answer as `name{label=value,...}` and its samples.
fn shown(response: &ReadResponse, query: usize) -> Vec<(String, Vec<(i64, f64)>)> {
    response.results[query]
        .timeseries
        .iter()
        .map(|s| {
            let labels: Vec<String> = s
                .labels
                .iter()
                .map(|l| format!("{}={}", l.name, l.value))
                .collect();
            let samples = s.samples.iter().map(|x| (x.timestamp, x.value)).collect();
            (labels.join(","), samples)
        })
        .collect()
}

fn sql(server: &TestServer, query: &str) -> Json {
    call(
        &server.client(),
        "POST",
        "/v1/query",
        Some(json!({"sql": query, "time": "ns"})),
    )
    .unwrap()["rows"]
        .clone()
}

#[test]
fn samples_become_streams_that_sql_and_remote_read_read_back() {
    let server = TestServer::start(|_| {});
    let stale = f64::from_bits(STALE_NAN);
    let answer = remote_write(
        &server,
        vec![
            series(
                &[
                    ("__name__", "http_requests_total"),
                    ("code", "200"),
                    ("job", "api"),
                ],
                &[(1_000, 1.0), (2_000, 3.0)],
            ),
            series(
                &[
                    ("__name__", "http_requests_total"),
                    ("code", "500"),
                    ("job", "api"),
                ],
                &[(1_000, 7.0), (2_000, stale)],
            ),
            // An empty label is no label.
            series(
                &[
                    ("__name__", "http_requests_total"),
                    ("code", ""),
                    ("job", "web"),
                ],
                &[(1_500, 2.0)],
            ),
            series(&[("__name__", "up"), ("job", "api")], &[(1_000, 1.0)]),
        ],
    );
    assert_eq!(answer.status, 204, "{}", answer.body);
    assert_eq!(
        sql(
            &server,
            "SELECT ts, code, job, value FROM http_requests_total WHERE NOT isnan(value) ORDER BY ts, code"
        ),
        json!([
            [1_000_000_000, "200", "api", 1.0],
            [1_000_000_000, "500", "api", 7.0],
            [1_500_000_000, null, "web", 2.0],
            [2_000_000_000, "200", "api", 3.0],
        ])
    );
    let info = call(
        &server.client(),
        "GET",
        "/v1/streams/http_requests_total",
        None,
    )
    .unwrap();
    assert_eq!(info["evolving"], json!(true));

    let (eq, ne, re, nre) = (0, 1, 2, 3);
    let name = |n: &str| matcher("__name__", eq, n);
    let response = remote_read(
        &server,
        vec![
            query(
                0,
                10_000,
                vec![name("http_requests_total"), matcher("code", eq, "500")],
            ),
            query(
                0,
                10_000,
                vec![name("http_requests_total"), matcher("code", ne, "200")],
            ),
            query(
                0,
                10_000,
                vec![
                    matcher("__name__", re, "http_.*|up"),
                    matcher("job", eq, "api"),
                ],
            ),
            query(
                0,
                10_000,
                vec![name("http_requests_total"), matcher("code", nre, "[25]00")],
            ),
            // `code=""` selects the series without a code; the range is inclusive.
            query(
                1_500,
                1_500,
                vec![name("http_requests_total"), matcher("code", eq, "")],
            ),
            query(0, 10_000, vec![name("no_such_metric")]),
            query(1_001, 1_999, vec![name("up")]),
        ],
    );
    assert_eq!(response.results.len(), 7);
    let five_hundred = shown(&response, 0);
    assert_eq!(five_hundred.len(), 1);
    assert_eq!(
        five_hundred[0].0,
        "__name__=http_requests_total,code=500,job=api"
    );
    let samples = &response.results[0].timeseries[0].samples;
    assert_eq!(
        samples[0],
        Sample {
            value: 7.0,
            timestamp: 1_000
        }
    );
    assert_eq!(samples[1].timestamp, 2_000);
    assert_eq!(
        samples[1].value.to_bits(),
        STALE_NAN,
        "the stale marker, bit for bit"
    );
    assert_eq!(
        shown(&response, 1)
            .iter()
            .map(|s| s.0.as_str())
            .collect::<Vec<_>>(),
        [
            "__name__=http_requests_total,code=500,job=api",
            "__name__=http_requests_total,job=web",
        ]
    );
    assert_eq!(
        shown(&response, 2)
            .iter()
            .map(|s| s.0.as_str())
            .collect::<Vec<_>>(),
        [
            "__name__=http_requests_total,code=200,job=api",
            "__name__=http_requests_total,code=500,job=api",
            "__name__=up,job=api",
        ]
    );
    assert_eq!(
        shown(&response, 3),
        [(
            "__name__=http_requests_total,job=web".to_string(),
            vec![(1_500, 2.0)]
        )]
    );
    assert_eq!(shown(&response, 4), shown(&response, 3));
    assert!(shown(&response, 5).is_empty());
    assert!(shown(&response, 6).is_empty());
}

#[test]
fn refusals_say_which_series_and_pushing_back_is_a_retried_503() {
    let server = TestServer::start(|c| {
        c.limits.max_body_bytes = 64 << 10;
        c.limits.max_in_flight_bytes = 64 << 10;
    });
    let status_and_message = |answer: Answer| {
        let body: Json = serde_json::from_slice(&answer.bytes).unwrap_or(Json::Null);
        (
            answer.status,
            body["message"].as_str().unwrap_or_default().to_string(),
        )
    };
    let cases = [
        (
            series(&[("job", "x")], &[(1, 1.0)]),
            "time series 2: it has no metric name",
        ),
        (
            series(&[("__name__", "m"), ("value", "x")], &[(1, 1.0)]),
            "time series 2: label \"value\" cannot be stored",
        ),
        (
            series(&[("__name__", "m"), ("a:b", "x")], &[(1, 1.0)]),
            "time series 2: stream \"m\": ",
        ),
    ];
    for (bad, expected) in cases {
        let good = series(&[("__name__", "fine")], &[(1, 1.0)]);
        let (status, message) = status_and_message(remote_write(&server, vec![good, bad]));
        assert_eq!(status, 400, "{message}");
        assert!(message.contains(expected), "{message:?} lacks {expected:?}");
    }
    let mut with_exemplar = series(&[("__name__", "m")], &[(1, 1.0)]);
    with_exemplar.exemplars.push(vec![]);
    let (status, message) = status_and_message(remote_write(&server, vec![with_exemplar]));
    assert_eq!(
        (status, message.contains("send_exemplars")),
        (400, true),
        "{message}"
    );
    let (status, message) = status_and_message(post(
        &server,
        "/api/v1/write",
        &WRITE_HEADERS,
        b"not snappy",
    ));
    assert_eq!(
        (status, message.contains("snappy")),
        (400, true),
        "{message}"
    );
    let gzip = post(
        &server,
        "/api/v1/write",
        &[("Content-Encoding", "gzip")],
        b"x",
    );
    assert_eq!(gzip.status, 415);
    // A small body that says it inflates past the body limit.
    let big = series(&[("__name__", &"m".repeat(100 << 10))], &[(1, 1.0)]);
    assert_eq!(remote_write(&server, vec![big]).status, 413);
    // Few wire bytes, many decoded: 2,000 empty series are 4 KB on the wire and about
    // 200 KB of structs once decoded (admitted before decoding, so refused from the walk).
    let (status, message) =
        status_and_message(remote_write(&server, vec![TimeSeries::default(); 2000]));
    assert_eq!(
        (status, message.contains("decoded")),
        (413, true),
        "{message}"
    );
    // Few wire bytes, many as rows: each of 100 samples repeats a 1,000-byte label.
    let samples: Vec<(i64, f64)> = (0..100).map(|i| (i, 1.0)).collect();
    let repeated = series(&[("__name__", "m"), ("big", &"x".repeat(1000))], &samples);
    let (status, message) = status_and_message(remote_write(&server, vec![repeated]));
    assert_eq!(
        (status, message.contains("as rows")),
        (413, true),
        "{message}"
    );
    // A read may carry a bounded number of matchers (each `=~` is compiled).
    let many = (0..65)
        .map(|i| matcher("l", 2, &format!("v{i}.*")))
        .collect();
    let body = prometheus::encode(&ReadRequest {
        queries: vec![query(0, 1, many)],
        accepted_response_types: vec![],
    });
    let (status, message) =
        status_and_message(post(&server, "/api/v1/read", &WRITE_HEADERS, &body));
    assert_eq!(
        (status, message.contains("65 label matchers")),
        (400, true),
        "{message}"
    );
    // Nothing of a refused request was stored.
    let streams = call(&server.client(), "GET", "/v1/streams", None).unwrap();
    assert_eq!(streams, json!([]), "no stream created");

    // A slow writer holds the whole write budget: the next request gets 503, not 429.
    let slow = hold_write_budget(&server, (64 << 10) - 1);
    let answer = remote_write(&server, vec![series(&[("__name__", "m")], &[(1, 1.0)])]);
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(answer.retry_after.is_some());
    drop(slow);
}

/// A Prometheus server, stopped (by its PID) when dropped.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    fn start(program: &Path, dir: &Path, name: &str, config: &str) -> Prometheus {
        let port = free_port();
        let config = config.replace("{port}", &port.to_string());
        let config_file = dir.join(format!("{name}.yml"));
        std::fs::write(&config_file, config).unwrap();
        let child = Command::new(program)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join(name).display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let prometheus = Prometheus { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while prometheus.get("/-/ready").is_none() {
            assert!(
                Instant::now() < deadline,
                "prometheus {name} not ready in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        prometheus
    }

    fn get(&self, path: &str) -> Option<String> {
        let agent: ureq::Agent = ureq::Agent::config_builder().build().into();
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        agent
            .get(&url)
            .call()
            .ok()?
            .body_mut()
            .read_to_string()
            .ok()
    }

    /// The `result` of an instant query at `time` (seconds).
    fn query(&self, promql: &str, time: f64) -> Json {
        let encoded: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", promql)
            .append_pair("time", &format!("{time:.3}"))
            .finish();
        let text = self
            .get(&format!("/api/v1/query?{encoded}"))
            .expect("a query answer");
        let answer: Json = serde_json::from_str(&text).unwrap();
        assert_eq!(answer["status"], "success", "{answer}");
        answer["data"]["result"].clone()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn prometheus_reads_back_through_remote_read_what_its_own_tsdb_holds() {
    let program = Path::new("/usr/bin/prometheus");
    if !program.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "prometheus is missing: .ci/run installs Debian's prometheus package"
        );
        eprintln!("skipped: no /usr/bin/prometheus (apt-get install prometheus)");
        return;
    }
    let server = TestServer::start(|_| {});
    let dir = tempfile::tempdir().unwrap();
    let url = server.url();
    // One scrapes itself every second and remote-writes to Tidemark...
    let writer = Prometheus::start(
        program,
        dir.path(),
        "writer",
        &format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: self\n    \
             static_configs:\n      - targets: ['127.0.0.1:{{port}}']\nremote_write:\n  - url: \
             {url}/api/v1/write\n    queue_config:\n      batch_send_deadline: 500ms\n"
        ),
    );
    // ...the other holds nothing and reads everything from Tidemark.
    let reader = Prometheus::start(
        program,
        dir.path(),
        "reader",
        &format!("remote_read:\n  - url: {url}/api/v1/read\n    read_recent: true\n"),
    );
    let queries = [
        "prometheus_http_requests_total{handler=\"/metrics\"}[10s]",
        "up[10s]",
        "{__name__=~\"prometheus_tsdb_head_(series|chunks)\", job!=\"other\"}[10s]",
        "{__name__=~\"go_gc_duration_seconds.*\", quantile!~\"0|1\"}[10s]",
    ];
    // Written samples arrive within a second or so: compared once every series the
    // queries touch has reached the instant compared at.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut compared = 0;
    while compared < queries.len() {
        assert!(
            Instant::now() < deadline,
            "{compared} of {} queries agreed",
            queries.len()
        );
        std::thread::sleep(Duration::from_millis(500));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let at = now - 3.0;
        compared = 0;
        for promql in queries {
            let own = writer.query(promql, at);
            let samples = own.as_array().map_or(0, |s| {
                s.iter()
                    .map(|x| x["values"].as_array().map_or(0, Vec::len))
                    .sum()
            });
            if samples < 8 || reader.query(promql, at) != own {
                break;
            }
            compared += 1;
        }
    }
    // And for the record: Tidemark holds the series as streams SQL reads too.
    let rows = sql(&server, "SELECT count(*) FROM up WHERE job = 'self'");
    assert!(rows[0][0].as_u64().unwrap() >= 8, "{rows}");
}

//! The InfluxDB write routes against a real server: streams created and grown by writes,
//! values as SQL reads them back, all-or-nothing refusals naming the line, gzip, tokens in
//! every place InfluxDB clients put them. (The real InfluxDB clients and a real InfluxDB
//! server are run against the same routes by `tests/python/test_influx.py`.)

mod common;

use std::io::Write as _;

use common::{call, hold_write_budget, metrics_text, post as send, TestServer};
use serde_json::{json, Value as Json};

fn sql(server: &TestServer, query: &str) -> Json {
    call(
        &server.client(),
        "POST",
        "/v1/query",
        Some(json!({"sql": query, "time": "ns"})),
    )
    .unwrap()
}

fn schema_of(server: &TestServer, stream: &str) -> Vec<(String, String)> {
    let info = call(
        &server.client(),
        "GET",
        &format!("/v1/streams/{stream}"),
        None,
    )
    .unwrap();
    info["schema"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["type"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn line_protocol_creates_and_grows_streams_and_reads_back_through_sql() {
    let server = TestServer::start(|_| {});
    let first = "cpu,host=a,region=eu usage=0.5,cores=4i,up=true 1000\n\
                 cpu,host=b usage=0.75 2000\n\
                 # a comment, then a blank line\n\
                 \n\
                 mem,host=a used=10u,note=\"all \\\"fine\\\"\" 1500\n";
    let answer = send(
        &server,
        "/api/v2/write?org=o&bucket=b",
        &[],
        first.as_bytes(),
    );
    assert_eq!(answer.status, 204, "{}", answer.body);
    assert_eq!(
        schema_of(&server, "cpu"),
        [
            ("host", "STRING"),
            ("region", "STRING"),
            ("usage", "DOUBLE"),
            ("cores", "LONG"),
            ("up", "BOOLEAN")
        ]
        .map(|(n, t)| (n.to_string(), t.to_string()))
    );
    let info = call(&server.client(), "GET", "/v1/streams/cpu", None).unwrap();
    assert_eq!(info["evolving"], true);
    // A later write brings a field the stream lacks: it grows, earlier events read null.
    let second = "cpu,host=c,rack=r1 usage=1,temp=40.5 3000\n";
    let answer = send(
        &server,
        "/write?db=telegraf&precision=ns",
        &[],
        second.as_bytes(),
    );
    assert_eq!(answer.status, 204, "{}", answer.body);
    let rows = sql(
        &server,
        "SELECT tstart, host, region, usage, cores, up, rack, temp FROM cpu ORDER BY tstart",
    );
    assert_eq!(
        rows["rows"],
        json!([
            [1000, "a", "eu", 0.5, 4, true, null, null],
            [2000, "b", null, 0.75, null, null, null, null],
            [3000, "c", null, 1.0, null, null, "r1", 40.5]
        ])
    );
    let rows = sql(&server, "SELECT tstart, host, used, note FROM mem");
    assert_eq!(rows["rows"], json!([[1500, "a", 10, "all \"fine\""]]));
    // Seconds, and 1.x's minutes.
    let answer = send(&server, "/write?precision=s", &[], b"ticks v=1 2\n");
    assert_eq!(answer.status, 204, "{}", answer.body);
    let answer = send(&server, "/write?precision=m", &[], b"ticks v=2 1\n");
    assert_eq!(answer.status, 204, "{}", answer.body);
    let rows = sql(&server, "SELECT tstart, v FROM ticks ORDER BY tstart");
    assert_eq!(
        rows["rows"],
        json!([[2_000_000_000i64, 1.0], [60_000_000_000i64, 2.0]])
    );
    // 2.x has no minutes.
    let answer = send(&server, "/api/v2/write?precision=m", &[], b"ticks v=3 1\n");
    assert_eq!(answer.status, 400, "{}", answer.body);
}

#[test]
fn a_refused_request_stores_nothing_and_names_the_line() {
    let server = TestServer::start(|_| {});
    assert_eq!(
        send(&server, "/write", &[], b"cpu,host=a usage=0.5 1\n").status,
        204
    );
    let count = |server: &TestServer| sql(server, "SELECT count(*) FROM cpu")["rows"][0][0].clone();
    let cases: [(&str, &str, &str); 7] = [
        // A type conflict with the stream, after a good line for another measurement.
        ("mem used=1i 5\ncpu usage=\"high\" 6\n", "line 2", "usage"),
        // A conflict between two lines of the request.
        ("cpu temp=1 5\ncpu temp=2i 6\n", "line 2", "temp"),
        // A syntax error.
        ("cpu usage=1 5\ncpu usage= 6\n", "line 2", ""),
        // A tag and a field of one name.
        ("cpu,load=x load=1 5\n", "line 1", "load"),
        // A name Tidemark cannot take.
        ("cpu a:b=1 5\n", "line 1", "a:b"),
        // Beyond LONG.
        ("cpu big=9223372036854775808u 5\n", "line 1", "big"),
        // Older than the stream's out-of-order window (an hour) allows, found by the store.
        (
            "cpu usage=1 7200000000000\ncpu usage=2 2\n",
            "line 2",
            "window",
        ),
    ];
    for (body, line, field) in cases {
        for (path, v2) in [("/write", false), ("/api/v2/write", true)] {
            let answer = send(&server, path, &[], body.as_bytes());
            assert_eq!(answer.status, 400, "{body:?}: {}", answer.body);
            let error: Json = serde_json::from_str(&answer.body).unwrap();
            let message = if v2 {
                assert_eq!(error["code"], "invalid");
                assert_eq!(error["line"].to_string(), line.trim_start_matches("line "));
                error["message"].as_str().unwrap().to_string()
            } else {
                error["error"].as_str().unwrap().to_string()
            };
            assert!(message.contains(line), "{body:?}: {message}");
            assert!(message.contains(field), "{body:?}: {message}");
        }
    }
    assert_eq!(count(&server), json!(1));
    assert_eq!(
        schema_of(&server, "cpu"),
        [("host", "STRING"), ("usage", "DOUBLE")].map(|(n, t)| (n.to_string(), t.to_string()))
    );
    let streams = call(&server.client(), "GET", "/v1/streams", None).unwrap();
    assert_eq!(
        streams.as_array().unwrap().len(),
        1,
        "no stream created: {streams}"
    );
    // A native stream keeps its schema unless created evolving.
    call(
        &server.client(),
        "POST",
        "/v1/streams",
        Some(json!({"name": "strict", "schema": "v:DOUBLE"})),
    )
    .unwrap();
    assert_eq!(send(&server, "/write", &[], b"strict v=1 1\n").status, 204);
    let answer = send(&server, "/write", &[], b"strict v=1,w=2 2\n");
    assert_eq!(answer.status, 400);
    assert!(answer.body.contains("strict schema"), "{}", answer.body);
}

#[test]
fn one_write_reaches_a_bounded_number_of_streams_and_names_fold_case() {
    let server = TestServer::start(|_| {});
    let limit = tidemark_server::ingest::MAX_STREAMS_PER_WRITE;
    let too_many: String = (0..=limit).map(|i| format!("m{i} v=1 1\n")).collect();
    let answer = send(&server, "/write", &[], too_many.as_bytes());
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(
        answer.body.contains(&format!("line {}", limit + 1)),
        "{}",
        answer.body
    );
    let streams = call(&server.client(), "GET", "/v1/streams", None).unwrap();
    assert_eq!(streams, json!([]), "nothing created");
    // Fields past a schema's limit are refused before anything of the request is stored.
    let wide: String = (0..1_025).map(|i| format!(",f{i}=1")).collect();
    let body = format!("ok v=1 1\nwide v=1{wide} 2\n");
    let answer = send(&server, "/write", &[], body.as_bytes());
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(
        answer.body.contains("line 2") && answer.body.contains("1024"),
        "{}",
        answer.body
    );
    let streams = call(&server.client(), "GET", "/v1/streams", None).unwrap();
    assert_eq!(streams, json!([]), "nothing created");
    // One field however the rows spell it; spelled twice in one row it is refused.
    let answer = send(
        &server,
        "/write",
        &[],
        b"c Usage=1 1\nc usage=2 2\nc USAGE=3 3\n",
    );
    assert_eq!(answer.status, 204, "{}", answer.body);
    assert_eq!(
        schema_of(&server, "c"),
        [("Usage".to_string(), "DOUBLE".to_string())]
    );
    assert_eq!(
        sql(&server, "SELECT sum(usage) FROM c")["rows"],
        json!([[6.0]])
    );
    let answer = send(
        &server,
        "/write",
        &[],
        b"c usage=1 4\nc,USAGE=x usage=2 5\n",
    );
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.body.contains("line 2"), "{}", answer.body);
}

#[test]
fn what_sparse_lines_take_as_columns_is_admitted_before_it_is_taken() {
    let server = TestServer::start(|c| {
        c.limits.max_body_bytes = 1 << 20;
        c.limits.max_in_flight_bytes = 4 << 20;
    });
    // 60,000 lines of 1,000 field names: under a MB of body, but every line holds a null
    // (a bit) for each field the others bring (7.5 MB as columns).
    let sparse: String = (0..60_000)
        .map(|i| format!("m f{}=1 {}\n", i % 1000, i + 1))
        .collect();
    assert!(sparse.len() < 1 << 20);
    let answer = send(&server, "/write", &[], sparse.as_bytes());
    assert_eq!(answer.status, 413, "{}", answer.body);
    assert!(answer.body.contains("as columns"), "{}", answer.body);
    let streams = call(&server.client(), "GET", "/v1/streams", None).unwrap();
    assert_eq!(streams, json!([]), "nothing created");
    // Fewer field names fit (2,000 lines x 100 fields: well under a MB as columns).
    let fitting: String = (0..2_000)
        .map(|i| format!("m f{}=1 {}\n", i % 100, i + 1))
        .collect();
    let answer = send(&server, "/write", &[], fitting.as_bytes());
    assert_eq!(answer.status, 204, "{}", answer.body);
    assert_eq!(
        sql(&server, "SELECT count(*) FROM m")["rows"],
        json!([[2000]])
    );
}

#[test]
fn a_sparse_write_is_charged_a_bit_per_absent_field_and_reads_back() {
    // The limits under which 20,000 lines of 1,000 field names were refused when a null
    // cost its type's default value and a flag (180 MB as columns): as bits, 2.5 MB.
    let server = TestServer::start(|c| {
        c.limits.max_body_bytes = 1 << 20;
        c.limits.max_in_flight_bytes = 4 << 20;
    });
    let sparse: String = (0..20_000)
        .map(|i| format!("m f{}={i} {}\n", i % 1000, i + 1))
        .collect();
    let answer = send(&server, "/write", &[], sparse.as_bytes());
    assert_eq!(answer.status, 204, "{}", answer.body);
    // f7 holds 7, 1007, ..., 19007; f999 holds 999, ..., 19999.
    assert_eq!(
        sql(
            &server,
            "SELECT count(*), count(f7), sum(f7), count(f999), max(f999) FROM m"
        )["rows"],
        json!([[20000, 20, 190140.0, 20, 19999.0]])
    );
    assert_eq!(
        sql(
            &server,
            "SELECT f6, f7, f8 FROM m WHERE f7 IS NOT NULL OR f8 = 12008 ORDER BY tstart LIMIT 3"
        )["rows"],
        json!([
            [null, 7.0, null],
            [null, 1007.0, null],
            [null, 2007.0, null]
        ])
    );
}

#[test]
fn a_write_to_a_wide_stream_is_admitted_with_its_nulls_before_the_stream_changes() {
    let server = TestServer::start(|c| {
        c.limits.max_body_bytes = 1 << 20;
        c.limits.max_in_flight_bytes = 4 << 20;
    });
    let wide: Vec<String> = (0..1000).map(|i| format!("f{i}=1")).collect();
    let first = format!("wide {} 1\n", wide.join(","));
    let answer = send(&server, "/write", &[], first.as_bytes());
    assert_eq!(answer.status, 204, "{}", answer.body);
    // 40,000 events of one new field: each holds a null (a bit) for the stream's 1,000
    // others (5 MB).
    let narrow: String = (0..40_000)
        .map(|i| format!("wide g=1 {}\n", i + 2))
        .collect();
    let answer = send(&server, "/write", &[], narrow.as_bytes());
    assert_eq!(answer.status, 413, "{}", answer.body);
    let fields = schema_of(&server, "wide");
    assert!(
        fields.iter().all(|(name, _)| name != "g"),
        "g was not added"
    );
    assert_eq!(
        fields
            .iter()
            .filter(|(name, _)| name.starts_with('f'))
            .count(),
        1000
    );
}

#[test]
fn gzip_bodies_are_inflated_within_the_body_limit() {
    let server = TestServer::start(|c| c.limits.max_body_bytes = 64 << 10);
    let gzip = |text: &[u8]| {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(text).unwrap();
        encoder.finish().unwrap()
    };
    let lines: String = (0..100).map(|i| format!("g,k=v{i} x={i} {i}\n")).collect();
    let answer = send(
        &server,
        "/api/v2/write",
        &[("Content-Encoding", "gzip")],
        &gzip(lines.as_bytes()),
    );
    assert_eq!(answer.status, 204, "{}", answer.body);
    assert_eq!(
        sql(&server, "SELECT count(*), sum(x) FROM g")["rows"],
        json!([[100, 4950.0]])
    );
    // A small body that inflates past the limit is refused, not inflated without end.
    let bomb = gzip(&vec![b'#'; 1 << 20]);
    assert!(bomb.len() < 64 << 10);
    let answer = send(
        &server,
        "/api/v2/write",
        &[("Content-Encoding", "gzip")],
        &bomb,
    );
    assert_eq!(answer.status, 413, "{}", answer.body);
    let answer = send(
        &server,
        "/write",
        &[("Content-Encoding", "br")],
        b"g x=1 1\n",
    );
    assert_eq!(answer.status, 415, "{}", answer.body);
}

#[test]
fn tokens_are_taken_where_influxdb_clients_send_them() {
    const WRITE: &str = "write-token-0123456789";
    let server = TestServer::start(|c| c.auth.write_token = Some(WRITE.into()));
    let line = b"t v=1 1\n";
    let basic = format!("Basic {}", base64_of(&format!("anyone:{WRITE}")));
    let token = format!("Token {WRITE}");
    let bearer = format!("Bearer {WRITE}");
    for (path, headers) in [
        ("/api/v2/write", vec![("Authorization", token.as_str())]),
        ("/api/v2/write", vec![("Authorization", bearer.as_str())]),
        ("/write", vec![("Authorization", basic.as_str())]),
        ("/write?u=anyone&p=write-token-0123456789", vec![]),
    ] {
        let answer = send(&server, path, &headers, line);
        assert_eq!(answer.status, 204, "{path} {headers:?}: {}", answer.body);
    }
    let wrong = format!("Token not-{WRITE}");
    for (path, headers) in [
        ("/api/v2/write", vec![]),
        ("/api/v2/write", vec![("Authorization", wrong.as_str())]),
        // The query password is 1.x's, taken on its route only.
        ("/api/v2/write?p=write-token-0123456789", vec![]),
        ("/write?p=wrong", vec![]),
    ] {
        let answer = send(&server, path, &headers, line);
        assert_eq!(answer.status, 401, "{path} {headers:?}: {}", answer.body);
    }
}

#[test]
fn back_pressure_is_a_429_with_retry_after_in_influxdbs_shape() {
    let server = TestServer::start(|c| {
        c.limits.max_body_bytes = 64 << 10;
        c.limits.max_in_flight_bytes = 64 << 10;
        c.limits.retry_after_ms = 1500;
    });
    // A slow writer holds most of the write budget with a body still arriving.
    let slow = hold_write_budget(&server, 60 << 10);
    let metrics = || metrics_text(&server);
    let lines: String = (0..1000).map(|i| format!("bp v={i} {i}\n")).collect();
    for (path, key) in [("/write", "error"), ("/api/v2/write", "message")] {
        let answer = send(&server, path, &[], lines.as_bytes());
        assert_eq!(answer.status, 429, "{}", answer.body);
        assert_eq!(answer.retry_after.as_deref(), Some("2"));
        let error: Json = serde_json::from_str(&answer.body).unwrap();
        assert!(error[key].as_str().unwrap().contains("retry"), "{error}");
    }
    assert!(
        metrics().contains(
            "tidemark_protocol_requests_total{protocol=\"influx_line\",outcome=\"refused\"} 2"
        ),
        "{}",
        metrics()
    );
    drop(slow);
}

fn base64_of(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

//! The HTTP API against a real server: the ChronicleDB-compatible flow (replicated and
//! embedded), the native API, bad input, limits, auth, metrics and the OpenAPI document.

mod common;

use common::{append, call, create, TestServer};
use serde_json::{json, Value as Json};
use tidemark_client::HttpClient;

fn w1_schema() -> Json {
    json!([
        {"name": "SYMBOL", "type": "STRING", "properties": {}},
        {"name": "SECURITYTYPE", "type": "INTEGER", "properties": {}},
        {"name": "LASTTRADEPRICE", "type": "FLOAT", "properties": {}}
    ])
}

fn chronicle_flow(client: &HttpClient, base: &str, measure: &str) {
    let streams = format!("{base}/streams");
    let created = call(
        client,
        "POST",
        &streams,
        Some(json!({"streamName": "ticks", "schema": w1_schema()})),
    );
    assert_eq!(created.unwrap()["streamName"], "ticks");
    // Same schema again (names in another case): fine. Another schema: 409. Bad: 400.
    let lower = json!([{"name": "symbol", "type": "STRING"}, {"name": "securitytype", "type": "INTEGER"}, {"name": "lasttradeprice", "type": "FLOAT"}]);
    call(
        client,
        "POST",
        &streams,
        Some(json!({"streamName": "ticks", "schema": lower})),
    )
    .unwrap();
    let other = call(
        client,
        "POST",
        &streams,
        Some(json!({"streamName": "ticks", "schema": [{"name": "X", "type": "LONG"}]})),
    );
    assert_eq!(other.unwrap_err().0, "stream_exists");
    for bad in [
        json!({"streamName": "x", "schema": [{"name": "A", "type": "DECIMAL"}]}),
        json!({"streamName": "x", "schema": [{"name": "tstart", "type": "LONG"}]}),
        json!({"streamName": "x"}),
        json!({"streamName": "a/b", "schema": []}),
    ] {
        let err = call(client, "POST", &streams, Some(bad.clone())).unwrap_err();
        assert_eq!(err.0, "bad_request", "{bad}: {err:?}");
    }
    assert_eq!(
        call(client, "GET", &streams, None).unwrap(),
        json!(["ticks"])
    );

    let events = json!({"events": [
        {"SYMBOL": "A", "SECURITYTYPE": 1, "LASTTRADEPRICE": 2.5, "tstart": 100},
        {"symbol": "B", "securityType": 2, "lastTradePrice": 4.5, "tstart": 200, "tend": 250},
        {"SYMBOL": "A", "SECURITYTYPE": 3, "LASTTRADEPRICE": 1.5, "TSTART": 300}
    ]});
    call(
        client,
        "POST",
        &format!("{streams}/ticks/events"),
        Some(events),
    )
    .unwrap();
    // A batch is all or nothing: the second event lacks tstart, so neither is stored.
    let half_bad = json!({"events": [
        {"SYMBOL": "C", "SECURITYTYPE": 1, "LASTTRADEPRICE": 9.0, "tstart": 400},
        {"SYMBOL": "C", "SECURITYTYPE": 1, "LASTTRADEPRICE": 9.0}
    ]});
    let err = call(
        client,
        "POST",
        &format!("{streams}/ticks/events"),
        Some(half_bad),
    )
    .unwrap_err();
    assert!(err.1.contains("tstart"), "{err:?}");

    let info = call(client, "GET", &format!("{streams}/ticks/info"), None).unwrap();
    assert_eq!(info["eventCount"], 3);
    assert_eq!(info["timeInterval"], json!({"lower": 100, "upper": 300}));
    assert_eq!(info["schema"][2]["type"], "FLOAT");

    let aggregate = |func: &str, query: &str| {
        call(
            client,
            "GET",
            &format!("{streams}/ticks/aggregates/{func}{query}"),
            None,
        )
        .unwrap()
    };
    assert_eq!(aggregate("COUNT", ""), json!(3));
    assert_eq!(aggregate("MAX/LASTTRADEPRICE", ""), json!(4.5));
    assert_eq!(
        aggregate("MIN/lasttradeprice", "?rangeStart=150&rangeEnd=300"),
        json!(1.5)
    );
    assert_eq!(
        aggregate(
            "SUM/SECURITYTYPE",
            "?rangeStart=100&rangeEnd=300&lowerInclusive=false&upperInclusive=false"
        ),
        json!(2)
    );
    assert_eq!(
        aggregate("COUNT/SYMBOL", "?rangeStart=100&rangeEnd=200"),
        json!(2)
    );
    assert_eq!(
        aggregate("MAX/LASTTRADEPRICE", "?rangeStart=1000&rangeEnd=2000"),
        Json::Null
    );
    assert_eq!(aggregate("COUNT", "?rangeStart=1000"), json!(0));
    let err = call(
        client,
        "GET",
        &format!("{streams}/ticks/aggregates/MEDIAN/SYMBOL"),
        None,
    )
    .unwrap_err();
    assert_eq!(err.0, "bad_request");
    let err = call(
        client,
        "GET",
        &format!("{streams}/ticks/aggregates/MAX/NOPE"),
        None,
    )
    .unwrap_err();
    assert_eq!(err.0, "bad_request");
    let err = call(client, "GET", &format!("{streams}/nope/info"), None).unwrap_err();
    assert_eq!(err.0, "unknown_stream");

    // Two-step clear: the token is single-use; a made-up one is refused.
    let request = call(client, "DELETE", &format!("{streams}/ticks/events"), None).unwrap();
    assert_eq!(request["streamName"], "ticks");
    let confirm = format!("{base}/clear-request-confirmation");
    let refused = call(
        client,
        "POST",
        &confirm,
        Some(json!({"streamName": "ticks", "token": "0123"})),
    )
    .unwrap_err();
    assert_eq!(refused.1, "No valid clear request provided");
    // A confirmation naming another stream is refused and leaves the token valid for its own.
    let mut mistaken = request.clone();
    mistaken["streamName"] = json!("other");
    let refused = call(client, "POST", &confirm, Some(mistaken)).unwrap_err();
    assert_eq!(refused.1, "No valid clear request provided");
    call(client, "POST", &confirm, Some(request.clone())).unwrap();
    let again = call(client, "POST", &confirm, Some(request)).unwrap_err();
    assert_eq!(again.1, "No valid clear request provided");
    let info = call(client, "GET", &format!("{streams}/ticks/info"), None).unwrap();
    assert_eq!(info["eventCount"], 0);

    let measured = call(
        client,
        "GET",
        &format!("{measure}/insert-events/25000?batchSize=1000"),
        None,
    )
    .unwrap();
    assert_eq!(
        (
            measured["eventCount"].as_u64(),
            measured["batches"].as_u64()
        ),
        (Some(25_000), Some(25))
    );
    assert_eq!(measured["bufferSize"], 1000);
    assert!(measured["timeElapsed"].as_f64().unwrap() > 0.0);
    let info = call(
        client,
        "GET",
        &format!("{streams}/demo_event_store/info"),
        None,
    )
    .unwrap();
    assert_eq!(info["eventCount"], 25_000);
}

#[test]
fn chronicledb_flow_on_both_stores() {
    let server = TestServer::start(|_| {});
    let client = server.client();
    let measure = "/api/sys-info/performance/measure/event-store";
    chronicle_flow(&client, "/api/event-store", measure);
    // The embedded store is a separate namespace: same names, separate data.
    chronicle_flow(
        &client,
        "/api/event-store/embedded",
        &format!("{measure}/embedded"),
    );
    let info = call(
        &client,
        "GET",
        "/api/event-store/streams/demo_event_store/info",
        None,
    )
    .unwrap();
    assert_eq!(info["eventCount"], 25_000);

    // A stream created with a partition of its own (native API) is, to ChronicleDB's create
    // (which knows no partitions), the stream it asks for when the schema matches.
    call(
        &client,
        "POST",
        "/v1/streams",
        Some(json!({"name": "hourly", "schema": "V:LONG", "partition": "6h"})),
    )
    .unwrap();
    let again = call(
        &client,
        "POST",
        "/api/event-store/streams",
        Some(json!({"streamName": "hourly", "schema": [{"name": "V", "type": "LONG"}]})),
    );
    assert_eq!(again.unwrap()["streamName"], "hourly");
    // A partition that is none is refused naming the field and what a partition may be.
    for (partition, says) in [
        (json!(3_600_000_000_000i64), "\"partition\""),
        (json!("5h"), "invalid partition 5h"),
        (json!("abc"), "whole hours"),
    ] {
        let refused = call(
            &client,
            "POST",
            "/v1/streams",
            Some(json!({"name": "odd", "schema": "V:LONG", "partition": partition})),
        )
        .unwrap_err();
        assert_eq!(refused.0, "bad_request", "{partition}: {refused:?}");
        assert!(refused.1.contains(says), "{partition}: {refused:?}");
    }

    let sys = call(&client, "GET", "/api/sys-info", None).unwrap();
    assert_eq!(sys["nodeId"], 1);
    assert_eq!(sys["role"], "standalone");
    assert!(
        sys["uptimeMs"].is_u64() && sys["hostname"].is_string() && sys["dataDirectory"].is_string()
    );
}

#[test]
fn native_api_appends_queries_and_refuses_bad_input() {
    let server = TestServer::start(|c| c.limits.max_body_bytes = 64 * 1024);
    let client = server.client();
    let created = client.create_stream("m", "HOST:STRING,CPU:DOUBLE").unwrap();
    assert_eq!(created["eventCount"], 0);
    let ndjson = "{\"tstart\": 1000, \"HOST\": \"a\", \"CPU\": 0.5}\n\n{\"tstart\": 2000, \"host\": \"b\", \"cpu\": 0.75}\n";
    let answer = client
        .request(
            "POST",
            "/v1/streams/m/events",
            Some(("application/x-ndjson", ndjson.into())),
        )
        .unwrap();
    assert_eq!(answer["events"], 2);
    let array = json!([{"tstart": 3000, "HOST": "a", "CPU": null}]);
    call(&client, "POST", "/v1/streams/m/events", Some(array)).unwrap();

    let rows = client
        .query("SELECT HOST, max(CPU), count(*) FROM m GROUP BY HOST ORDER BY HOST")
        .unwrap();
    assert_eq!(
        rows,
        json!({"columns": ["HOST", "max(CPU)", "count(*)"], "rows": [["a", 0.5, 2], ["b", 0.75, 1]]})
    );
    let csv = ureq_text(
        &server,
        "/v1/query",
        "text/csv",
        json!({"sql": "SELECT ts, CPU FROM m ORDER BY ts DESC LIMIT 2"}),
    );
    assert_eq!(
        csv, "ts,CPU\n1970-01-01T00:00:00.000003000Z,\n1970-01-01T00:00:00.000002000Z,0.75\n",
        "timestamps are timestamps in every format"
    );
    let arrow = ureq_bytes(
        &server,
        "/v1/query",
        "application/vnd.apache.arrow.stream",
        json!({"sql": "SELECT HOST, count(*) FROM m GROUP BY HOST"}),
    );
    // An IPC stream starts with the continuation marker and ends with the end-of-stream marker.
    assert_eq!(&arrow[..4], &[0xff, 0xff, 0xff, 0xff]);
    assert_eq!(
        &arrow[arrow.len() - 8..],
        &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]
    );

    for (body, code, needle) in [
        ("[{\"HOST\": \"a\", \"CPU\": 1}]", "bad_request", "tstart"),
        (
            "[{\"tstart\": 1, \"HOST\": 5, \"CPU\": 1}]",
            "bad_request",
            "HOST",
        ),
        (
            "[{\"tstart\": 1, \"HOST\": \"a\", \"CPU\": 1, \"EXTRA\": 2}]",
            "bad_request",
            "EXTRA",
        ),
        ("[{\"tstart\": 1,", "bad_request", "malformed JSON"),
        (
            "{\"tstart\": 1, \"HOST\": \"a\", \"CPU\": 1}\nnot json",
            "bad_request",
            "line 2",
        ),
    ] {
        let err = client
            .request(
                "POST",
                "/v1/streams/m/events",
                Some(("application/json", body.into())),
            )
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(code) && text.contains(needle),
            "{body}: {text}"
        );
    }
    let err = call(
        &client,
        "POST",
        "/v1/query",
        Some(json!({"sql": "DELETE FROM m WHERE CPU > 1 OR CPU < 0"})),
    )
    .unwrap_err();
    assert_eq!(err.0, "unsupported_sql");
    assert!(err.1.contains("DELETE"), "{}", err.1);
    let err = call(&client, "POST", "/v1/streams/nope/events", Some(json!([]))).unwrap_err();
    assert_eq!(err.0, "unknown_stream");
    let big = format!(
        "[{}]",
        vec!["{\"tstart\": 1, \"HOST\": \"a\", \"CPU\": 1}"; 3000].join(",")
    );
    let err = client
        .request(
            "POST",
            "/v1/streams/m/events",
            Some(("application/json", big.into_bytes())),
        )
        .unwrap_err();
    assert!(err.to_string().contains("too_large"), "{err}");
    let err = call(&client, "GET", "/v1/nothing", None).unwrap_err();
    assert_eq!(err.0, "not_found");

    let info = call(&client, "GET", "/v1/streams/m", None).unwrap();
    assert_eq!(info["eventCount"], 3, "refused batches stored nothing");
    let retention = call(
        &client,
        "PUT",
        "/v1/streams/m/retention",
        Some(json!({"maxAge": "7d"})),
    )
    .unwrap();
    assert_eq!(
        retention["retention"]["maxAgeNs"],
        7 * 86_400_000_000_000i64
    );
    call(&client, "POST", "/v1/streams/m/clear", None).unwrap();
    assert_eq!(
        call(&client, "GET", "/v1/streams/m", None).unwrap()["eventCount"],
        0
    );
    call(&client, "DELETE", "/v1/streams/m", None).unwrap();
    assert_eq!(
        call(&client, "GET", "/v1/streams", None).unwrap(),
        json!([])
    );

    assert_metrics(
        &server,
        &[
            "tidemark_events_appended_total 3",
            "tidemark_rejected_requests_total{reason=\"too_large\"} 1",
            "tidemark_log_fsync_seconds_count",
        ],
    );
    assert_eq!(
        call(&client, "GET", "/health", None).unwrap()["status"],
        "pass"
    );
    assert_eq!(
        call(&client, "GET", "/ready", None).unwrap()["status"],
        "ready"
    );
}

/// A path of the OpenAPI document with its parameters filled in.
fn example_path(path: &str) -> String {
    path.replace("{stream}", "nope")
        .replace("{func}", "COUNT")
        .replace("{attribute}", "X")
        .replace("{count}", "1")
        .replace("{id}", "9")
        .replace("{path}", "js/main.js")
}

/// Every route the OpenAPI document lists answers (no 404 "no such route", no 405).
#[test]
fn the_openapi_document_matches_the_routes() {
    let server = TestServer::start(|_| {});
    let client = server.client();
    let doc = call(&client, "GET", "/v1/openapi.json", None).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 20);
    for (path, methods) in paths {
        let concrete = example_path(path);
        for method in methods.as_object().unwrap().keys() {
            let method = method.to_ascii_uppercase();
            match call(&client, &method, &concrete, Some(json!({}))) {
                Ok(_) => {}
                Err((code, message)) => assert!(
                    code != "not_found" && code != "method_not_allowed",
                    "{method} {path}: {code} {message}"
                ),
            }
        }
    }
}

#[test]
fn tokens_guard_reads_and_writes() {
    const READ: &str = "read-token-0123456789";
    const WRITE: &str = "write-token-0123456789";
    let server = TestServer::start(|c| {
        c.auth.read_token = Some(READ.into());
        c.auth.write_token = Some(WRITE.into());
    });
    let anonymous = server.client();
    let reader = HttpClient::new(&server.url(), Some(READ));
    let writer = HttpClient::new(&server.url(), Some(WRITE));
    let wrong = HttpClient::new(&server.url(), Some("not-the-token-at-all"));
    assert_eq!(
        call(&anonymous, "GET", "/health", None).unwrap()["status"],
        "pass"
    );
    assert_eq!(
        call(&anonymous, "GET", "/v1/streams", None).unwrap_err().0,
        "unauthorized"
    );
    assert_eq!(
        call(&wrong, "GET", "/v1/streams", None).unwrap_err().0,
        "unauthorized"
    );
    assert_eq!(
        reader.create_stream("s", "A:LONG").unwrap_err().to_string(),
        "refused (unauthorized): this route needs the write token"
    );
    writer.create_stream("s", "A:LONG").unwrap();
    call(&reader, "GET", "/v1/streams/s", None).unwrap();
    call(&writer, "GET", "/v1/streams/s", None).unwrap();
    call(
        &reader,
        "POST",
        "/v1/query",
        Some(json!({"sql": "SELECT count(*) FROM s"})),
    )
    .unwrap();
    // Issue 46: SQL's INSERT through the query route takes the write token, and is
    // answered with the events stored and their positions.
    let insert = json!({"sql": "INSERT INTO s (tstart, a) VALUES (1000, 7), (2000, 8)"});
    assert_eq!(
        call(&reader, "POST", "/v1/query", Some(insert.clone()))
            .unwrap_err()
            .0,
        "unauthorized"
    );
    assert_eq!(
        call(&writer, "POST", "/v1/query", Some(insert)).unwrap(),
        json!({"columns": ["events", "first_position", "last_position"], "rows": [[2, 0, 1]]})
    );
    assert_eq!(
        call(
            &reader,
            "POST",
            "/v1/query",
            Some(json!({"sql": "SELECT sum(a) FROM s"}))
        )
        .unwrap()["rows"],
        json!([[15]])
    );
    let copy = json!({"sql": "COPY s FROM STDIN"});
    assert_eq!(
        call(&writer, "POST", "/v1/query", Some(copy))
            .unwrap_err()
            .0,
        "unsupported_sql"
    );
    let measure = "/api/sys-info/performance/measure/event-store/insert-events/10";
    assert_eq!(
        call(&reader, "GET", measure, None).unwrap_err().0,
        "unauthorized"
    );
    call(&writer, "GET", measure, None).unwrap();
    assert_eq!(
        call(&reader, "DELETE", "/v1/streams/s", None)
            .unwrap_err()
            .0,
        "unauthorized"
    );
}

fn ureq_text(server: &TestServer, path: &str, accept: &str, body: Json) -> String {
    String::from_utf8(ureq_bytes(server, path, accept, body)).unwrap()
}

fn ureq_bytes(server: &TestServer, path: &str, accept: &str, body: Json) -> Vec<u8> {
    ureq_response(server, path, accept, body)
        .body_mut()
        .read_to_vec()
        .unwrap()
}

/// A successful answer to GET `path` (`body` null) or POST `body` there, read by the caller.
fn ureq_response(
    server: &TestServer,
    path: &str,
    accept: &str,
    body: Json,
) -> ureq::http::Response<ureq::Body> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let url = format!("{}{path}", server.url());
    let response = if body.is_null() {
        agent.get(&url).header("Accept", accept).call().unwrap()
    } else {
        agent
            .post(&url)
            .header("Accept", accept)
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes())
            .unwrap()
    };
    assert_eq!(response.status(), 200);
    response
}

/// Every route the OpenAPI document lists, tried with no token, a wrong token, the read
/// token and the write token: a route lets in exactly what its declared `security` says
/// (none: open; readToken or writeToken: read; writeToken only: write). A route added
/// without its level declared, or whose guard is lost, fails here.
#[test]
fn every_route_lets_in_exactly_the_tokens_its_document_declares() {
    const READ: &str = "read-token-0123456789";
    const WRITE: &str = "write-token-0123456789";
    let server = TestServer::start(|c| {
        c.auth.read_token = Some(READ.into());
        c.auth.write_token = Some(WRITE.into());
    });
    let clients = [
        ("no token", server.client()),
        (
            "a wrong token",
            HttpClient::new(&server.url(), Some("wrong-token-0123456789")),
        ),
        ("the read token", HttpClient::new(&server.url(), Some(READ))),
        (
            "the write token",
            HttpClient::new(&server.url(), Some(WRITE)),
        ),
    ];
    let doc = call(&clients[3].1, "GET", "/v1/openapi.json", None).unwrap();
    let mut checked = 0;
    for (path, methods) in doc["paths"].as_object().unwrap() {
        let concrete = example_path(path);
        for (method, operation) in methods.as_object().unwrap() {
            let schemes: Vec<&str> = operation["security"]
                .as_array()
                .unwrap_or_else(|| panic!("{method} {path} declares no security"))
                .iter()
                .flat_map(|s| s.as_object().unwrap().keys().map(String::as_str))
                .collect();
            // Which of the four clients the route must let in.
            let allowed = match schemes.as_slice() {
                [] => [true, true, true, true],
                ["readToken", "writeToken"] => [false, false, true, true],
                ["writeToken"] => [false, false, false, true],
                other => panic!("{method} {path}: unknown security {other:?}"),
            };
            let method = method.to_ascii_uppercase();
            for ((who, client), allowed) in clients.iter().zip(allowed) {
                let answer = call(client, &method, &concrete, Some(json!({})));
                let refused = matches!(&answer, Err((code, _)) if code == "unauthorized");
                assert_eq!(!refused, allowed, "{method} {path} with {who}: {answer:?}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 4 * 30, "{checked} checks");
}

#[test]
fn a_backfill_widens_its_streams_out_of_order_window_through_the_api() {
    let server = TestServer::start(|_| {});
    let client = server.client();
    create(&server, "history", "N:LONG");
    let events = "/v1/streams/history/events";
    let newest = 1_700_000_000_000_000_000i64;
    let backfill = newest - 2 * 86_400_000_000_000;
    call(
        &client,
        "POST",
        events,
        Some(json!([{"tstart": newest, "N": 1}])),
    )
    .unwrap();
    let refused = call(
        &client,
        "POST",
        events,
        Some(json!([{"tstart": backfill, "N": 2}])),
    );
    let (code, message) = refused.unwrap_err();
    assert_eq!(code, "bad_request");
    assert!(message.contains("out-of-order-window"), "{message}");

    let window = "/v1/streams/history/out-of-order-window";
    let info = call(&client, "PUT", window, Some(json!({"window": "30d"}))).unwrap();
    assert_eq!(
        info["outOfOrderWindow"],
        json!({"ns": 30 * 86_400_000_000_000i64, "text": "30d", "isDefault": false})
    );
    call(
        &client,
        "POST",
        events,
        Some(json!([{"tstart": backfill, "N": 2}])),
    )
    .unwrap();
    let info = call(&client, "GET", "/v1/streams/history", None).unwrap();
    assert_eq!(info["eventCount"], 2);

    let info = call(&client, "PUT", window, Some(json!({"window": "unlimited"}))).unwrap();
    assert_eq!(info["outOfOrderWindow"]["text"], "unlimited");
    let info = call(&client, "PUT", window, Some(json!({"window": "default"}))).unwrap();
    assert_eq!(info["outOfOrderWindow"]["isDefault"], true);
    assert_eq!(info["outOfOrderWindow"]["text"], "1h");
    for bad in [
        json!({"window": "soon"}),
        json!({"window": "-1h"}),
        json!({}),
    ] {
        let err = call(&client, "PUT", window, Some(bad.clone())).unwrap_err();
        assert_eq!(err.0, "bad_request", "{bad}");
    }
    let err = call(
        &client,
        "PUT",
        "/v1/streams/nope/out-of-order-window",
        Some(json!({"window": "1h"})),
    )
    .unwrap_err();
    assert_eq!(err.0, "unknown_stream");
}

/// Issue 21: a result of over a million rows streams, as CSV, through a server whose
/// per-query memory bound (`max_result_bytes`, 1 MiB here) is far below the answer's 20 MB:
/// rows are written batch by batch, never gathered.
#[test]
fn a_result_of_over_a_million_rows_streams_as_csv_in_bounded_memory() {
    const EVENTS: i64 = 1_100_000;
    let server = TestServer::start(|config| config.limits.max_result_bytes = 1 << 20);
    create(&server, "ticks", "SYMBOL:STRING,PRICE:DOUBLE");
    for chunk in 0..EVENTS / 100_000 + 1 {
        let lines: String = (chunk * 100_000..((chunk + 1) * 100_000).min(EVENTS))
            .map(|i| {
                format!(
                    "{{\"tstart\": {}, \"SYMBOL\": \"S{}\", \"PRICE\": {i}}}\n",
                    1_000 + i,
                    i % 7
                )
            })
            .collect();
        append(&server, "ticks", &lines).unwrap();
    }
    let mut response = ureq_response(
        &server,
        "/v1/query",
        "text/csv",
        json!({"sql": "SELECT ts, symbol, price FROM ticks", "time": "ns"}),
    );
    let reader = std::io::BufReader::new(response.body_mut().as_reader());
    let (mut rows, mut bytes, mut last) = (0i64, 0usize, String::new());
    for line in std::io::BufRead::lines(reader) {
        let line = line.unwrap();
        bytes += line.len() + 1;
        if rows > 0 {
            let expected = format!("{},S{},{}.0", 1_000 + rows - 1, (rows - 1) % 7, rows - 1);
            assert_eq!(line, expected, "row {rows} in time order");
        } else {
            assert_eq!(
                line, "ts,SYMBOL,PRICE",
                "bare columns keep the names of the fields"
            );
        }
        rows += 1;
        last = line;
    }
    assert_eq!(
        rows - 1,
        EVENTS,
        "every event, after the header; the last: {last}"
    );
    assert!(
        bytes > 16 << 20,
        "an answer far over the 1 MiB bound: {bytes} bytes"
    );
}

/// A dashboard's statement sent again is not planned again: `/metrics` counts it as moved
/// (W2's kind: its only use of `now()` is its summary range), its answer follows the new
/// events, and a statement with `now()` in its select list is reused but optimized.
#[test]
fn statements_sent_again_use_the_plans_kept_of_them() {
    let server = TestServer::start(|_| {});
    create(&server, "m", "cpu:DOUBLE");
    let now = tidemark_core::time::now_ns();
    let events = |from: i64, count: i64| {
        (from..from + count)
            .map(|i| {
                json!({"tstart": now - 600_000_000_000 + i * 1_000_000_000, "cpu": i}).to_string()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    append(&server, "m", &events(0, 10)).unwrap();
    let client = server.client();
    let moving =
        json!({"sql": "SELECT count(*), max(cpu) FROM m WHERE ts >= now() - INTERVAL '1 hour'"});
    let reused = json!({"sql": "SELECT now() > to_timestamp(0) AS later, count(*) FROM m"});
    let ask = |body: &Json| {
        call(&client, "POST", "/v1/query", Some(body.clone())).unwrap()["rows"].clone()
    };
    assert_eq!(ask(&moving), json!([[10, 9.0]]));
    assert_eq!(ask(&reused), json!([[true, 10]]));
    append(&server, "m", &events(10, 5)).unwrap();
    assert_eq!(ask(&moving), json!([[15, 14.0]]));
    assert_eq!(ask(&moving), json!([[15, 14.0]]));
    assert_eq!(ask(&reused), json!([[true, 15]]));
    assert_metrics(
        &server,
        &[
            "tidemark_sql_statements_total{plan=\"afresh\"} 2",
            "tidemark_sql_statements_total{plan=\"moved\"} 2",
            "tidemark_sql_statements_total{plan=\"reused\"} 1",
        ],
    );
}

/// `/metrics` has each of `lines`.
fn assert_metrics(server: &TestServer, lines: &[&str]) {
    let metrics = ureq_text(server, "/metrics", "text/plain", Json::Null);
    for line in lines {
        assert!(metrics.contains(line), "{line} missing from\n{metrics}");
    }
}

/// Issue 43 (9): a single server answered every append with `"duplicate": false`, a retry
/// too, while docs/server.md and docs/cluster.md say its answer has no such field (its
/// engine applies a tagged retry once but does not tell it apart). The answer is
/// `{events, lsn}`, and the retry is still stored once.
#[test]
fn a_single_servers_append_answer_has_no_duplicate_field() {
    let server = TestServer::start(|_| {});
    let client = server.client();
    call(
        &client,
        "POST",
        "/v1/streams",
        Some(json!({"name": "p", "schema": "N:LONG"})),
    )
    .unwrap();
    let body = br#"[{"tstart": 1, "N": 1}]"#;
    for attempt in 0..2 {
        let answer = common::post(
            &server,
            "/v1/streams/p/events",
            &[
                ("Tidemark-Producer", "7/1"),
                ("Content-Type", "application/json"),
            ],
            body,
        );
        assert_eq!(answer.status, 200, "{}", answer.body);
        let answer: Json = serde_json::from_slice(&answer.bytes).unwrap();
        let keys: Vec<&String> = answer.as_object().unwrap().keys().collect();
        // The retry gets no positions: its first attempt was given them.
        let positions = ["firstPosition", "lastPosition"];
        let expected: Vec<&str> = ["events", "lsn"]
            .into_iter()
            .chain(positions.into_iter().filter(|_| attempt == 0))
            .collect();
        assert_eq!(keys, expected, "{answer}");
    }
    assert_eq!(
        call(&client, "GET", "/v1/streams/p", None).unwrap()["eventCount"],
        1
    );
}

/// The value of a `/metrics` line that starts with `prefix`.
fn metric_value(server: &TestServer, prefix: &str) -> u64 {
    let metrics = ureq_text(server, "/metrics", "text/plain", Json::Null);
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(prefix)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{prefix} missing from\n{metrics}"))
}

/// Issue 44: a body that is not JSON and a malformed `Tidemark-Producer` header were refused
/// 400 but never counted in `tidemark_rejected_requests_total`; every refusal is counted now,
/// in the one layer every answer leaves through.
#[test]
fn a_bad_json_body_and_a_bad_producer_header_are_counted_as_rejected() {
    let server = TestServer::start(|_| {});
    let client = server.client();
    client.create_stream("m", "X:DOUBLE").unwrap();
    const BAD: &str = "tidemark_rejected_requests_total{reason=\"bad_request\"} ";
    assert_eq!(metric_value(&server, BAD), 0);

    let not_json = common::post(
        &server,
        "/v1/streams",
        &[("Content-Type", "application/json")],
        b"{\"name\": ",
    );
    assert_eq!(not_json.status, 400, "{}", not_json.body);
    assert!(
        not_json.body.contains("malformed JSON"),
        "{}",
        not_json.body
    );
    assert_eq!(metric_value(&server, BAD), 1);

    let bad_tag = common::post(
        &server,
        "/v1/streams/m/events",
        &[
            ("Tidemark-Producer", "seven"),
            ("Content-Type", "application/json"),
        ],
        br#"[{"tstart": 1, "X": 1}]"#,
    );
    assert_eq!(bad_tag.status, 400, "{}", bad_tag.body);
    assert!(
        bad_tag.body.contains("Tidemark-Producer"),
        "{}",
        bad_tag.body
    );
    assert_eq!(metric_value(&server, BAD), 2);
    // Counted once each, not again where the handler maps its own refusals.
    assert_eq!(
        call(&client, "GET", "/v1/streams/m", None).unwrap()["eventCount"],
        0
    );
    assert_eq!(metric_value(&server, BAD), 2);
}

/// Clear requests awaiting confirmation are bounded (`limits.max_pending_clears`): one more
/// is refused 429 `overloaded`, and confirming one makes room.
#[test]
fn pending_clear_requests_are_bounded() {
    let server = TestServer::start(|c| c.limits.max_pending_clears = 2);
    let client = server.client();
    let streams = "/api/event-store/streams";
    call(
        &client,
        "POST",
        streams,
        Some(json!({"streamName": "c", "schema": [{"name": "X", "type": "DOUBLE"}]})),
    )
    .unwrap();
    let request = || call(&client, "DELETE", &format!("{streams}/c/events"), None);
    let first = request().unwrap();
    request().unwrap();
    let (code, message) = request().unwrap_err();
    assert_eq!(code, "overloaded", "{message}");
    assert!(message.contains("max_pending_clears"), "{message}");
    call(
        &client,
        "POST",
        "/api/event-store/clear-request-confirmation",
        Some(first),
    )
    .unwrap();
    request().unwrap();
}

/// The console (docs/console.md): its page and files open without a token on a server that
/// has tokens, gzipped for a client that takes gzip, answered 304 for a current copy; the
/// page with a policy that keeps it to this server and out of frames.
#[test]
fn the_console_is_served_to_anyone_gzipped_with_etags() {
    let server = TestServer::start(|c| {
        c.auth.read_token = Some("read-token-0123456789".into());
    });
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let get = |path: &str, headers: &[(&str, &str)]| {
        let mut request = agent.get(format!("{}{path}", server.url()));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.call().unwrap()
    };
    let header = |response: &ureq::http::Response<ureq::Body>, name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };

    let mut page = get("/", &[]);
    assert_eq!(page.status(), 200);
    assert_eq!(
        header(&page, "content-type").unwrap(),
        "text/html; charset=utf-8"
    );
    let csp = header(&page, "content-security-policy").unwrap();
    assert!(
        csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert_eq!(header(&page, "x-frame-options").unwrap(), "DENY");
    assert!(page
        .body_mut()
        .read_to_string()
        .unwrap()
        .contains("/console/js/main.js"));

    let plain = get("/console/js/query.js", &[])
        .body_mut()
        .read_to_vec()
        .unwrap();
    let mut zipped = get("/console/js/query.js", &[("Accept-Encoding", "gzip, br")]);
    assert_eq!(header(&zipped, "content-encoding").unwrap(), "gzip");
    assert_eq!(header(&zipped, "cache-control").unwrap(), "no-cache");
    let compressed = zipped.body_mut().read_to_vec().unwrap();
    assert!(compressed.len() < plain.len());
    let mut unzipped = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(&compressed[..]),
        &mut unzipped,
    )
    .unwrap();
    assert_eq!(unzipped, plain);

    // A copy the client holds is answered 304, per encoding: the gzipped file's tag is not
    // the plain file's.
    let etag = header(&zipped, "etag").unwrap();
    let gzip_current = [
        ("Accept-Encoding", "gzip"),
        ("If-None-Match", etag.as_str()),
    ];
    let current = get("/console/js/query.js", &gzip_current);
    assert_eq!(current.status(), 304);
    assert_eq!(header(&current, "cache-control").unwrap(), "no-cache");
    assert_eq!(header(&current, "etag").unwrap(), etag);
    let plain_etag = header(&get("/console/js/query.js", &[]), "etag").unwrap();
    assert_ne!(plain_etag, etag);
    assert_eq!(
        get("/console/js/query.js", &[("If-None-Match", &etag)]).status(),
        200
    );
    let stale = get(
        "/console/js/query.js",
        &[("If-None-Match", "\"0000000000000000\"")],
    );
    assert_eq!(stale.status(), 200);

    let library = get("/console/vendor/uplot-1.6.32/uPlot.iife.min.js", &[]);
    assert_eq!(
        header(&library, "cache-control").unwrap(),
        "public, max-age=31536000, immutable"
    );
    for missing in ["/console/nope.js", "/console/../Cargo.toml", "/console/"] {
        assert_eq!(get(missing, &[]).status(), 404, "{missing}");
    }
    // The data stays behind the token.
    assert_eq!(get("/v1/streams", &[]).status(), 401);
}

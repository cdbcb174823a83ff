//! What a hostile or careless client must not be able to do to the server: crash it with
//! one statement, lock every writer out with silent connections, hold it open at shutdown,
//! exhaust its memory with one answer, or get wrong values stored. Each test reproduces a
//! finding of a probe of the server (issue 18) and failed before its fix.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{append, call, create, TestServer};
use serde_json::json;
use tidemark_protocol::{decode_frame, ErrorCode, Request, Response};

use tidemark_core::time::now_ns;

fn query(server: &TestServer, sql: &str) -> Result<serde_json::Value, (String, String)> {
    call(
        &server.client(),
        "POST",
        "/v1/query",
        Some(json!({ "sql": sql })),
    )
}

fn connect(addr: SocketAddr) -> TcpStream {
    let socket = TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    socket
}

/// Reads until the server closes the connection (or the socket's read timeout fails it).
fn read_until_closed(socket: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut answer = Vec::new();
    socket.read_to_end(&mut answer)?;
    Ok(answer)
}

fn is_alive(server: &TestServer) -> bool {
    call(&server.client(), "GET", "/health", None).is_ok()
}

#[test]
fn one_long_expression_is_refused_and_the_server_lives_on() {
    let server = TestServer::start(|_| {});
    create(&server, "t", "I:LONG");
    let sum = format!("SELECT 1{} FROM t", "+1".repeat(3000));
    let conjunction = format!("SELECT I FROM t WHERE I = 1{}", " AND I = 1".repeat(5000));
    let nested = format!("SELECT {}I{} FROM t", "(".repeat(500), ")".repeat(500));
    for sql in [&sum, &conjunction, &nested] {
        let (code, message) = query(&server, sql).unwrap_err();
        assert_eq!(code, "bad_sql", "{message}");
        assert!(message.contains("too complex"), "{message}");
        assert!(message.len() < 1000, "the error echoes the statement");
    }
    assert!(is_alive(&server));
}

#[test]
fn connections_that_announce_large_requests_and_send_nothing_hold_nothing() {
    let server = TestServer::start(|config| {
        config.limits.max_body_bytes = 1 << 20;
        config.limits.max_in_flight_bytes = 4 << 20;
    });
    create(&server, "t", "I:LONG");
    // Binary: a header declaring a 1 MiB APPEND, then silence; eight of them announce
    // twice the whole budget.
    let mut binary = Vec::new();
    for id in 0..8u64 {
        let mut socket = connect(server.binary);
        let mut header = Vec::new();
        header.extend_from_slice(&((1u32 << 20) - 64).to_le_bytes());
        header.extend_from_slice(&[1, 0x03, 0, 0]);
        header.extend_from_slice(&id.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        socket.write_all(&header).unwrap();
        binary.push(socket);
    }
    // HTTP: bodies announced by Content-Length, never sent, on an append and on a query.
    let mut http = Vec::new();
    for path in ["/v1/streams/t/events", "/v1/query"] {
        for _ in 0..4 {
            let mut socket = connect(server.http);
            write!(
                socket,
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                (1 << 20) - 1
            )
            .unwrap();
            http.push(socket);
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let ts = now_ns();
    append(&server, "t", &format!("{{\"tstart\": {ts}, \"I\": 1}}")).unwrap();
    let rows = query(&server, "SELECT count(*) FROM t").unwrap();
    assert_eq!(rows["rows"][0][0], 1);
    drop((binary, http));
}

#[test]
fn stalled_headers_bodies_and_frames_time_out() {
    let server = TestServer::start(|config| config.limits.read_timeout_ms = 300);
    let mut headers = connect(server.http);
    headers
        .write_all(b"POST /v1/query HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut body = connect(server.http);
    body.write_all(b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"sql\":")
        .unwrap();
    let mut frame = connect(server.binary);
    let mut ping = Vec::new();
    Request::Ping.encode(1, &mut ping).unwrap();
    frame.write_all(&ping[..10]).unwrap();

    // Each is closed by the server long before the sockets' own 20 s read timeout.
    let started = Instant::now();
    read_until_closed(&mut headers).expect("unfinished headers are closed");
    let answer = String::from_utf8_lossy(&read_until_closed(&mut body).unwrap()).to_string();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(read_until_closed(&mut frame).unwrap().is_empty());
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(is_alive(&server));
}

#[test]
fn shutdown_does_not_wait_for_a_client_that_never_finishes() {
    let server = TestServer::start(|config| {
        config.limits.read_timeout_ms = 600_000;
        config.limits.shutdown_grace_ms = 300;
    });
    let mut stuck = connect(server.http);
    stuck
        .write_all(b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .unwrap();
    let mut binary = connect(server.binary);
    binary.write_all(&[40, 0, 0, 0, 1]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    drop(server); // stops the server and joins its thread
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_query_holding_more_than_the_result_budget_is_refused_and_a_long_answer_streams() {
    let server = TestServer::start(|config| config.limits.max_result_bytes = 64 << 10);
    create(&server, "t", "S:STRING");
    let ts = now_ns();
    let value = "x".repeat(4000);
    let events: String = (0..100)
        .map(|i| format!("{{\"tstart\": {}, \"S\": \"{value}\"}}\n", ts + i))
        .collect();
    append(&server, "t", &events).unwrap();
    // A sort must hold every row: more than the budget.
    let (code, message) = query(&server, "SELECT * FROM t ORDER BY S, tstart DESC").unwrap_err();
    assert_eq!(code, "too_large");
    assert!(message.contains("more memory"), "{message}");
    // A scan streams: its answer is larger than the budget, and whole.
    let all = query(&server, "SELECT * FROM t").unwrap();
    assert_eq!(all["rows"].as_array().unwrap().len(), 100);
    // Within the budget it is answered.
    let rows = query(&server, "SELECT * FROM t LIMIT 5").unwrap();
    assert_eq!(rows["rows"].as_array().unwrap().len(), 5);
    assert_eq!(
        rows["columns"][0], "tstart",
        "the time column has the name events and scans give it"
    );
}

#[test]
fn a_far_future_timestamp_is_refused_and_does_not_poison_the_stream() {
    let server = TestServer::start(|_| {});
    create(&server, "t", "I:LONG");
    for future in [4_102_444_800_000_000_000i64, i64::MAX] {
        let error =
            append(&server, "t", &format!("{{\"tstart\": {future}, \"I\": 1}}")).unwrap_err();
        assert!(error.contains("ahead of this server's clock"), "{error}");
    }
    let ts = now_ns();
    append(&server, "t", &format!("{{\"tstart\": {ts}, \"I\": 1}}")).unwrap();
    // A refused millisecond timestamp says what it looks like.
    let error = append(
        &server,
        "t",
        &format!("{{\"tstart\": {}, \"I\": 1}}", ts / 1_000_000),
    )
    .unwrap_err();
    assert!(error.contains("looks like milliseconds"), "{error}");
}

#[test]
fn values_are_never_silently_changed() {
    let server = TestServer::start(|_| {});
    create(&server, "t", "I:LONG,F:FLOAT");
    let ts = now_ns();
    let refused = [
        format!("{{\"tstart\": {ts}, \"I\": 1, \"F\": 1e300}}"),
        format!("{{\"tstart\": {ts}, \"I\": 1, \"I\": 2, \"F\": 1}}"),
        format!("{{\"tstart\": {ts}, \"tstart\": {ts}, \"I\": 1, \"F\": 1}}"),
        format!("[{{\"tstart\": {ts}, \"I\": 1, \"F\": 1, \"F\": 2}}]"),
    ];
    for body in &refused {
        let error = append(&server, "t", body).unwrap_err();
        assert!(
            error.contains("out of its range") || error.contains("given twice"),
            "{body}: {error}"
        );
    }
    let chronicle = server.client().request(
        "POST",
        "/api/event-store/streams/t/events",
        Some((
            "application/json",
            format!("{{\"events\": [], \"events\": [{{\"tstart\": {ts}, \"I\": 1, \"F\": 1}}]}}")
                .into_bytes(),
        )),
    );
    assert!(chronicle.unwrap_err().to_string().contains("given twice"));
    let count = query(&server, "SELECT count(*) FROM t").unwrap();
    assert_eq!(
        count["rows"][0][0], 0,
        "nothing of the refused bodies is stored"
    );
}

#[test]
fn names_that_hide_or_imitate_are_refused_and_errors_do_not_echo_whole_inputs() {
    let server = TestServer::start(|_| {});
    let client = server.client();
    for (name, schema) in [
        ("ticks\u{200B}", "A:LONG"),
        ("\u{202E}skcit", "A:LONG"),
        ("u\u{0308}ber", "A:LONG"),
        ("ticks", "ts:LONG"),
    ] {
        let refused = call(
            &client,
            "POST",
            "/v1/streams",
            Some(json!({"name": name, "schema": schema})),
        );
        assert!(refused.is_err(), "{name:?} {schema:?} accepted");
    }
    let long = "n".repeat(10_000);
    let (_, message) = call(
        &client,
        "POST",
        "/v1/streams",
        Some(json!({"name": long, "schema": "A:LONG"})),
    )
    .unwrap_err();
    assert!(message.len() < 1000, "{} bytes", message.len());
}

/// Sends `request` on a fresh binary connection and reads one answer (its request id too).
fn binary_answer(socket: &mut TcpStream, request: &[u8]) -> (u64, Response) {
    socket.write_all(request).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok(Some((frame, _))) = decode_frame(&buf, 1 << 20) {
            return (frame.request_id, Response::decode(&frame).unwrap());
        }
        let n = socket.read(&mut chunk).unwrap();
        assert!(n > 0, "closed without an answer");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn the_binary_protocol_does_what_its_document_says() {
    let server = TestServer::start(|_| {});
    let mut socket = connect(server.binary);
    // Without tokens configured, AUTH is accepted and changes nothing.
    let mut auth = Vec::new();
    Request::Auth { token: "anything" }
        .encode(5, &mut auth)
        .unwrap();
    assert!(matches!(
        binary_answer(&mut socket, &auth),
        (5, Response::Ack { .. })
    ));
    // A well-framed APPEND with a bad body: BAD_REQUEST for its id, the connection goes on.
    let mut append = Vec::new();
    Request::Ping.encode(6, &mut append).unwrap();
    append[5] = 0x03;
    append[0] += 1;
    append.push(0);
    let crc = crc32c::crc32c(&append[20..]);
    append[16..20].copy_from_slice(&crc.to_le_bytes());
    match binary_answer(&mut socket, &append) {
        (6, Response::Error { code, .. }) => assert_eq!(code, ErrorCode::BadRequest),
        other => panic!("{other:?}"),
    }
    let mut ping = Vec::new();
    Request::Ping.encode(7, &mut ping).unwrap();
    assert!(matches!(
        binary_answer(&mut socket, &ping),
        (7, Response::Ack { .. })
    ));
    // A bad checksum: ERROR with request id 0, then the connection is closed.
    let mut bad = ping.clone();
    bad[16] ^= 0xff;
    match binary_answer(&mut socket, &bad) {
        (0, Response::Error { code, .. }) => assert_eq!(code, ErrorCode::MalformedFrame),
        other => panic!("{other:?}"),
    }
    assert!(read_until_closed(&mut socket).unwrap().is_empty());
}

/// A query that would run for hours is stopped at `limits.query_timeout_ms`, whether it is
/// still planning its first rows or streaming them; the server answers the next one.
#[test]
fn a_query_running_past_its_timeout_is_stopped() {
    let server = TestServer::start(|config| config.limits.query_timeout_ms = 300);
    let (code, message) = query(
        &server,
        "SELECT count(*) FROM generate_series(1, 1000000000000000)",
    )
    .unwrap_err();
    assert_eq!(code, "query_timeout", "{message}");
    assert!(message.contains("300ms"), "{message}");
    // The first rows come at once; the rest would take hours: the answer is cut short.
    let cut = server.client().request(
        "POST",
        "/v1/query",
        Some((
            "application/json",
            json!({"sql": "SELECT value FROM generate_series(1, 1000000000000000)"})
                .to_string()
                .into_bytes(),
        )),
    );
    assert!(cut.is_err(), "a stopped answer must not look whole");
    let answer = query(&server, "SELECT 1 + 1 AS two").unwrap();
    assert_eq!(answer["rows"][0][0], 2);
}

#[test]
fn a_bytes_value_copied_from_an_answer_finds_its_event() {
    let server = TestServer::start(|_| {});
    create(&server, "t", "RAW:BYTES");
    let ts = now_ns();
    append(
        &server,
        "t",
        &format!("{{\"tstart\": {ts}, \"RAW\": \"AAE=\"}}"),
    )
    .unwrap();
    let printed = query(&server, "SELECT RAW FROM t").unwrap()["rows"][0][0].clone();
    assert_eq!(printed, "AAE=");
    // SQL compares BYTES with binary literals (the base64 form is for reading answers).
    let sql = "SELECT count(*) FROM t WHERE RAW = X'0001'";
    assert_eq!(query(&server, sql).unwrap()["rows"][0][0], 1);
}

/// The built-in insert benchmark writes through the write budget like every append: a
/// batch larger than the whole budget is refused up front instead of bypassing it, and one
/// that fits is admitted batch by batch.
#[test]
fn the_builtin_benchmark_writes_through_admission_control() {
    let server = TestServer::start(|config| {
        config.limits.max_in_flight_bytes = 256 << 10;
        config.limits.max_body_bytes = 256 << 10;
    });
    let client = server.client();
    let measure = "/api/sys-info/performance/measure/event-store/insert-events";
    let (code, message) = call(
        &client,
        "GET",
        &format!("{measure}/20000?batchSize=20000"),
        None,
    )
    .unwrap_err();
    assert_eq!(code, "bad_request");
    assert!(message.contains("write budget"), "{message}");
    let measured = call(
        &client,
        "GET",
        &format!("{measure}/20000?batchSize=1000"),
        None,
    )
    .unwrap();
    assert_eq!(measured["eventCount"], 20000);
    assert_eq!(measured["batches"], 20);
    // Every batch's bytes were let go once it was stored.
    let metrics = client.request("GET", "/metrics", None).unwrap();
    let text = metrics.as_str().unwrap_or_default().to_string();
    assert!(
        text.lines()
            .any(|l| l.trim() == "tidemark_ingest_bytes_in_flight 0"),
        "{text}"
    );
}

// Issue 42: what SQL queries take from the server (items 3, 4 and 5).

/// Sends `sql` to `/v1/query` on a connection of its own, and returns the connection
/// without reading the answer (dropping it is the client leaving).
fn send_query(server: &TestServer, sql: &str) -> TcpStream {
    let body = json!({ "sql": sql }).to_string();
    let mut socket = connect(server.http);
    write!(
        socket,
        "POST /v1/query HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    socket
}

/// The status and body of the answer on `socket` (sent by [`send_query`]), or an error if it
/// does not come within `within`.
fn read_answer(socket: &mut TcpStream, within: Duration) -> std::io::Result<(u16, String)> {
    socket.set_read_timeout(Some(within))?;
    let answer = String::from_utf8_lossy(&read_until_closed(socket)?).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    Ok((status, body))
}

/// Waits (at most `within`) until `/metrics` has the line `line`.
fn wait_for_metric(server: &TestServer, line: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let text = common::metrics_text(server);
        if text.lines().any(|l| l == line) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {line:?} after {within:?}:\n{}",
            text.lines()
                .filter(|l| l.starts_with("tidemark_sql"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Hours of work inside one function call: levenshtein of two 250,000-character strings
/// (62.5 billion cells), computed while the statement is planned.
const LONG_COMPUTATION: &str = "SELECT levenshtein(repeat('a', 250000), repeat('b', 250000))";

/// Issue 42 (5): long computations inside a function, from as many clients as the query
/// runtime has workers, once held every worker: another client's `SELECT 1` waited for them.
/// Now they run off the workers and a few at a time, other clients are answered meanwhile,
/// and a computation stops as soon as its client leaves.
#[test]
fn long_computations_leave_other_clients_answered_and_stop_when_their_clients_leave() {
    let server = TestServer::start(|_| {});
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let long: Vec<TcpStream> = (0..workers)
        .map(|_| send_query(&server, LONG_COMPUTATION))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let asked = Instant::now();
    let mut other = send_query(&server, "SELECT 1 AS one");
    let (status, body) = read_answer(&mut other, Duration::from_secs(20))
        .expect("another client's SELECT 1 answered while the long computations run");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"rows\":[[1]]"), "{body}");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "SELECT 1 took {:?}",
        asked.elapsed()
    );
    // The long ones were still running: their clients are still there.
    wait_for_metric(
        &server,
        &format!("tidemark_sql_queries_running {workers}"),
        Duration::from_secs(1),
    );
    drop(long);
    wait_for_metric(
        &server,
        "tidemark_sql_queries_running 0",
        Duration::from_secs(10),
    );
}

/// Issue 42 (5): the query timeout did not stop work inside one function call: a long
/// computation ran on, and its client waited, long past `limits.query_timeout_ms`.
#[test]
fn a_long_computation_stops_at_the_query_timeout() {
    let server = TestServer::start(|config| config.limits.query_timeout_ms = 1000);
    let asked = Instant::now();
    let mut client = send_query(&server, LONG_COMPUTATION);
    let (status, body) = read_answer(&mut client, Duration::from_secs(30))
        .expect("the long computation answered with its timeout");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("query_timeout"), "{body}");
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "answered after {:?}",
        asked.elapsed()
    );
    wait_for_metric(
        &server,
        "tidemark_sql_queries_running 0",
        Duration::from_secs(5),
    );
}

/// Issue 42 (4): string functions allocated whatever their arguments asked for:
/// `length(repeat('x', 2000000000))` took the server past 6 GB. Now a value a function
/// would make beyond `limits.max_value_bytes` is refused before it is made.
#[test]
fn functions_cannot_make_values_beyond_the_bound() {
    let server = TestServer::start(|_| {});
    for sql in [
        "SELECT length(repeat('x', 2000000000))",
        "SELECT length(lpad('x', 2000000000))",
        "SELECT length(rpad('x', 2000000000, 'é'))",
        "SELECT length(replace(repeat('x', 100000), 'x', repeat('y', 1000)))",
        "SELECT length(concat(repeat('x', 10000000), repeat('y', 10000000)))",
        "SELECT length(repeat('x', 10000000) || repeat('y', 10000000))",
        "SELECT length(repeat('x', 9000000) || repeat('y', 9000000) || 'z')",
        "SELECT length(repeat(CAST(value AS VARCHAR), 10000000)) FROM generate_series(1, 10)",
    ] {
        let asked = Instant::now();
        let (code, message) = query(&server, sql).unwrap_err();
        assert_eq!(code, "too_large", "{sql}: {message}");
        assert!(
            message.contains("limits.max_value_bytes"),
            "{sql}: {message}"
        );
        // Refused before the value is made, not after: a generous bound (the machine may be
        // busy), far below what making and measuring gigabytes takes.
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "{sql}: refused after {:?}",
            asked.elapsed()
        );
    }
    // A batch of values each within the bound, together more than a query may hold.
    let (code, message) = query(
        &server,
        "SELECT length(repeat(CAST(value AS VARCHAR), 1000000)) FROM generate_series(100, 199)",
    )
    .unwrap_err();
    assert_eq!(code, "too_large", "{message}");
    assert!(message.contains("limits.max_result_bytes"), "{message}");
    // Aggregated strings count against the query's memory.
    let (code, message) = query(
        &server,
        "SELECT length(string_agg(repeat('x', 1000000), ',')) FROM generate_series(1, 200)",
    )
    .unwrap_err();
    assert_eq!(code, "too_large", "{message}");
    // Ordinary uses are answered.
    let answer = query(
        &server,
        "SELECT repeat('ab', 3), length(repeat('x', 1000000)), lpad('7', 3, '0'), \
         concat('a', 'b'), replace('abc', 'b', 'xyz'), levenshtein('kitten', 'sitting'), \
         length(string_agg(repeat('x', 1000), ',')) FROM generate_series(1, 10)",
    )
    .unwrap();
    assert_eq!(
        answer["rows"][0],
        json!(["ababab", 1000000, "007", "ab", "axyzc", 3, 10009])
    );
}

/// Issue 42 (3): sorts and aggregates beyond `limits.max_result_bytes` spilled through
/// DataFusion's disk manager (100 GB a query) into TMPDIR, until the data disk filled, and a
/// spill over DataFusion's bound was answered `bad_sql`. Now spill files go to
/// `query-spill/` in the data directory within one budget for all queries, never below a
/// reserve of free disk, refused with `too_large` or `resources_exhausted` naming the limit.
#[test]
fn queries_spill_within_the_servers_budget_and_never_below_the_disk_reserve() {
    // About 56 MB to sort in batches of 1 MB, over two partitions or more: more than a
    // sort may hold of a query's 64 MiB (the other operators have their share).
    let sort = "SELECT length(v) AS n FROM (SELECT repeat(CAST(value AS VARCHAR), 20) AS v \
                FROM generate_series(1000000, 1249999)) ORDER BY v DESC";
    let body = json!({ "sql": sort }).to_string();
    let ask = |server: &TestServer| {
        common::post(
            server,
            "/v1/query",
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
    };
    // The spill needs ~56 MB of disk; the default reserve (2 GiB) would make this test
    // depend on the free space of the machine running it, so the spilling servers keep
    // 64 MiB and the reserve's own refusal is tested with an unreachable one below.
    let small_reserve = 64 << 20;
    // Within the budget: the sort spills into the data directory and is answered.
    let server = TestServer::start(|config| config.limits.min_free_disk_bytes = small_reserve);
    let answer = ask(&server);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let rows: serde_json::Value = serde_json::from_slice(&answer.bytes).unwrap();
    assert_eq!(rows["rows"].as_array().unwrap().len(), 250_000);
    let spill_dir = server.dir.path().join("query-spill");
    assert!(
        spill_dir.is_dir(),
        "spill files go inside the data directory"
    );
    wait_for_metric(
        &server,
        "tidemark_sql_spill_bytes 0",
        Duration::from_secs(5),
    );
    // Past the budget: too large, saying which limit.
    let server = TestServer::start(|config| {
        config.limits.query_spill_bytes = 1 << 20;
        config.limits.min_free_disk_bytes = small_reserve;
    });
    let answer = ask(&server);
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.body.contains("too_large"), "{}", answer.body);
    assert!(
        answer.body.contains("limits.query_spill_bytes"),
        "{}",
        answer.body
    );
    // Below the reserve of free disk: refused, to be retried once space returns; queries
    // that need not spill are answered.
    let server = TestServer::start(|config| config.limits.min_free_disk_bytes = u64::MAX);
    let answer = ask(&server);
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(
        answer.body.contains("resources_exhausted"),
        "{}",
        answer.body
    );
    assert!(
        answer.body.contains("limits.min_free_disk_bytes"),
        "{}",
        answer.body
    );
    assert!(answer.retry_after.is_some());
    assert_eq!(query(&server, "SELECT 1 + 1").unwrap()["rows"][0][0], 2);
}

/// Issue 42 (3): every query took what it needed with no bound over all of them. Now at
/// most `limits.max_concurrent_queries` run at once, and one more is refused at once with a
/// hint to retry.
#[test]
fn queries_beyond_the_concurrent_bound_are_refused_to_retry() {
    let server = TestServer::start(|config| {
        config.limits.max_concurrent_queries = 1;
        config.limits.query_timeout_ms = 20_000;
    });
    let long = send_query(
        &server,
        "SELECT count(*) FROM generate_series(1, 1000000000000000)",
    );
    wait_for_metric(
        &server,
        "tidemark_sql_queries_running 1",
        Duration::from_secs(5),
    );
    let refused = common::post(
        &server,
        "/v1/query",
        &[("Content-Type", "application/json")],
        br#"{"sql": "SELECT 1"}"#,
    );
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(
        refused.body.contains("resources_exhausted"),
        "{}",
        refused.body
    );
    assert!(
        refused.body.contains("limits.max_concurrent_queries"),
        "{}",
        refused.body
    );
    assert!(refused.retry_after.is_some());
    drop(long);
    wait_for_metric(
        &server,
        "tidemark_sql_queries_running 0",
        Duration::from_secs(10),
    );
    assert_eq!(query(&server, "SELECT 1 + 1").unwrap()["rows"][0][0], 2);
}

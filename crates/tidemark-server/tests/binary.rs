//! The binary protocol against a real server: pipelined appends, refusals, auth, and
//! back-pressure under overload without losing an event.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use common::{call, TestServer};
use tidemark_client::{
    BinaryClient, ClientError, FullBuffer, Producer, ProducerOptions, Transport,
};
use tidemark_core::{BatchBuilder, EventBatch, Schema, Value};
use tidemark_protocol::{decode_frame, ErrorCode, Request, Response};

fn schema() -> Arc<Schema> {
    Arc::new(Schema::parse_spec("SYMBOL:STRING,PRICE:DOUBLE").unwrap())
}

/// `n` events starting at `first` (its tstart and PRICE), with SYMBOL "S".
fn batch(first: i64, n: i64) -> EventBatch {
    let mut b = BatchBuilder::new(schema(), n as usize);
    for i in first..first + n {
        b.push_row(
            i,
            None,
            &[Value::String("S".into()), Value::Double(i as f64)],
        )
        .unwrap();
    }
    b.finish()
}

fn event_count(server: &TestServer, stream: &str) -> u64 {
    call(
        &server.client(),
        "GET",
        &format!("/v1/streams/{stream}"),
        None,
    )
    .unwrap()["eventCount"]
        .as_u64()
        .unwrap()
}

#[test]
fn pipelined_appends_are_acknowledged_in_log_order() {
    let server = TestServer::start(|_| {});
    server
        .client()
        .create_stream("s", "SYMBOL:STRING,PRICE:DOUBLE")
        .unwrap();
    let client = BinaryClient::connect(server.binary, None).unwrap();
    client.ping().unwrap();
    let pending: Vec<_> = (0..50)
        .map(|i| client.send_append("s", &batch(i * 100, 100)).unwrap())
        .collect();
    let mut lsns: Vec<u64> = pending.into_iter().map(|p| p.wait().unwrap().lsn).collect();
    let sent = lsns.clone();
    lsns.sort_unstable();
    lsns.dedup();
    assert_eq!(
        lsns.len(),
        sent.len(),
        "every batch has its own log position"
    );
    assert_eq!(event_count(&server, "s"), 5000);

    // The server reports its own share of a round trip: some time, never more than the whole.
    let started = std::time::Instant::now();
    let ack = client.append("s", &batch(5000, 1)).unwrap();
    let round_trip = started.elapsed();
    let server_time = ack.server_time.expect("binary acks carry the service time");
    assert!(server_time > std::time::Duration::ZERO);
    assert!(
        server_time <= round_trip,
        "{server_time:?} > {round_trip:?}"
    );
    let sum = server.client().query("SELECT sum(PRICE) FROM s").unwrap();
    assert_eq!(
        sum["rows"][0][0],
        serde_json::json!((0..5001).sum::<i64>() as f64)
    );
}

/// An append's ACK says the positions its events were given, as the HTTP answer does: none
/// for a TAGGED_APPEND the server recognises as a retry (its first attempt was given them).
/// An APPEND that does not ask (an older client's) gets the plain ACK of twenty bytes.
#[test]
fn acks_say_the_positions_the_events_were_given() {
    let server = TestServer::start(|_| {});
    server
        .client()
        .create_stream("s", "SYMBOL:STRING,PRICE:DOUBLE")
        .unwrap();
    let client = BinaryClient::connect(server.binary, None).unwrap();
    let (n, m) = (3, 5);
    let first = client.append("s", &batch(0, n as i64)).unwrap();
    assert_eq!((first.events, first.positions), (n, Some((0, n - 1))));
    let second = client.send_append("s", &batch(10, m as i64)).unwrap();
    let second = second.wait().unwrap();
    assert_eq!((second.events, second.positions), (m, Some((n, n + m - 1))));

    let tagged = |client: &BinaryClient| {
        client
            .send_append_tagged("s", &batch(20, 2), Some((7, 1)))
            .unwrap()
            .wait()
            .unwrap()
    };
    let next = n + m;
    assert_eq!(tagged(&client).positions, Some((next, next + 1)));
    // The same tag again, on another connection as a client after a lost answer would:
    // stored once, and no positions, as over HTTP.
    let again = BinaryClient::connect(server.binary, None).unwrap();
    assert_eq!(tagged(&again).positions, None);
    let http_retry = server
        .client()
        .append_tagged("s", &batch(20, 2), Some((7, 1)))
        .unwrap();
    assert_eq!(http_retry.positions, None);
    assert_eq!(event_count(&server, "s"), next + 2);
    // HTTP and binary count the same positions.
    let http = server.client().append("s", &batch(30, 1)).unwrap();
    assert_eq!(http.positions, Some((next + 2, next + 2)));

    // On the wire: the flag asks, and the ACK that carries positions says so in its own
    // flags; without it, the ACK is the old twenty bytes and no flag.
    let mut socket = TcpStream::connect(server.binary).unwrap();
    for (ask, flags, body_len, positions) in [
        (false, 0, 20, None),
        (true, 1, 36, Some((next + 4, next + 4))),
    ] {
        let mut frame = Vec::new();
        tidemark_protocol::encode_append(9, "s", &batch(40, 1), None, ask, &mut frame).unwrap();
        socket.write_all(&frame).unwrap();
        let answer = read_one_frame(&mut socket);
        let (frame, _) = decode_frame(&answer, 1 << 20).unwrap().unwrap();
        assert_eq!((frame.flags, frame.body.len()), (flags, body_len), "{ask}");
        match Response::decode(&frame).unwrap() {
            Response::Ack {
                events: 1,
                positions: got,
                ..
            } => assert_eq!(got, positions, "{ask}"),
            other => panic!("{other:?}"),
        }
    }
}

/// The bytes of the next frame `socket` receives.
fn read_one_frame(socket: &mut TcpStream) -> Vec<u8> {
    let mut buf = vec![0u8; 4];
    socket.read_exact(&mut buf).unwrap();
    let len = tidemark_protocol::frame_len(&buf, 1 << 20)
        .unwrap()
        .unwrap();
    buf.resize(len, 0);
    socket.read_exact(&mut buf[4..]).unwrap();
    buf
}

#[test]
fn refusals_name_the_problem_and_keep_the_connection() {
    let server = TestServer::start(|_| {});
    server
        .client()
        .create_stream("s", "SYMBOL:STRING,PRICE:DOUBLE")
        .unwrap();
    server
        .client()
        .create_stream("swapped", "PRICE:DOUBLE,SYMBOL:STRING")
        .unwrap();
    let client = BinaryClient::connect(server.binary, None).unwrap();
    let refused = |stream: &str| match client.append(stream, &batch(0, 3)) {
        Err(ClientError::Refused { code, .. }) => code,
        other => panic!("{other:?}"),
    };
    assert_eq!(refused("nope"), "unknown_stream");
    assert_eq!(refused("swapped"), "schema_mismatch");
    // Too late for the out-of-order window: a bad request, and nothing stored.
    client.append("s", &batch(10_000_000_000_000, 1)).unwrap();
    assert_eq!(refused("s"), "bad_request");
    assert_eq!(event_count(&server, "s"), 1);
    client.ping().unwrap();
}

#[test]
fn damaged_frames_get_an_error_and_a_closed_connection() {
    let server = TestServer::start(|c| c.limits.max_body_bytes = 1 << 20);
    let answer_to = |bytes: &[u8]| -> Response {
        let mut socket = TcpStream::connect(server.binary).unwrap();
        socket.write_all(bytes).unwrap();
        let mut buf = Vec::new();
        socket.read_to_end(&mut buf).unwrap(); // the server closes after the answer
        let (frame, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
        Response::decode(&frame).unwrap()
    };
    let mut ping = Vec::new();
    Request::Ping.encode(7, &mut ping).unwrap();
    let mut bad_crc = ping.clone();
    bad_crc[16] ^= 0xff;
    let mut bad_version = ping.clone();
    bad_version[4] = 99;
    let huge = [0xff, 0xff, 0xff, 0x7f];
    for (bytes, code) in [
        (&bad_crc[..], ErrorCode::MalformedFrame),
        (&bad_version[..], ErrorCode::UnsupportedVersion),
        (&huge[..], ErrorCode::TooLarge),
    ] {
        match answer_to(bytes) {
            Response::Error { code: got, message } => assert_eq!(got, code, "{message}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn appends_need_the_write_token() {
    const WRITE: &str = "write-token-0123456789";
    let server = TestServer::start(|c| c.auth.write_token = Some(WRITE.into()));
    let admin = tidemark_client::HttpClient::new(&server.url(), Some(WRITE));
    admin
        .create_stream("s", "SYMBOL:STRING,PRICE:DOUBLE")
        .unwrap();
    let anonymous = BinaryClient::connect(server.binary, None).unwrap();
    assert!(
        matches!(anonymous.append("s", &batch(0, 1)), Err(ClientError::Refused { code, .. }) if code == "unauthorized")
    );
    assert!(
        matches!(BinaryClient::connect(server.binary, Some("wrong-token-0123456789")), Err(ClientError::Refused { code, .. }) if code == "unauthorized")
    );
    let writer = BinaryClient::connect(server.binary, Some(WRITE)).unwrap();
    writer.append("s", &batch(0, 2)).unwrap();
    assert_eq!(
        call(&admin, "GET", "/v1/streams/s", None).unwrap()["eventCount"],
        2
    );
}

/// With tokens configured, a connection that never presents one is closed after the read
/// timeout (it would otherwise hold one of `limits.max_binary_connections` for ever); one
/// that presented a token stays open however long it idles.
#[test]
fn a_connection_without_a_token_is_closed_and_one_with_a_token_is_kept() {
    const WRITE: &str = "write-token-0123456789";
    let server = TestServer::start(|c| {
        c.auth.write_token = Some(WRITE.into());
        c.limits.read_timeout_ms = 300;
    });
    tidemark_client::HttpClient::new(&server.url(), Some(WRITE))
        .create_stream("s", "SYMBOL:STRING,PRICE:DOUBLE")
        .unwrap();
    let writer = BinaryClient::connect(server.binary, Some(WRITE)).unwrap();
    let mut anonymous = TcpStream::connect(server.binary).unwrap();
    anonymous
        .set_read_timeout(Some(std::time::Duration::from_secs(15)))
        .unwrap();
    let mut answer = Vec::new();
    anonymous.read_to_end(&mut answer).unwrap();
    let (frame, _) = decode_frame(&answer, 1 << 20).unwrap().expect("an answer");
    assert_eq!(frame.request_id, 0);
    match Response::decode(&frame).unwrap() {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::Unauthorized);
            assert!(message.contains("limits.read_timeout_ms"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    std::thread::sleep(std::time::Duration::from_millis(600));
    writer.append("s", &batch(0, 3)).unwrap();
}

/// Far more bytes in flight than the server admits: it answers TRY_LATER / 429, the
/// producers retry, and every event arrives exactly once.
#[test]
fn overload_pushes_back_and_loses_nothing() {
    let server = TestServer::start(|c| {
        c.limits.max_body_bytes = 256 * 1024;
        c.limits.max_in_flight_bytes = 256 * 1024;
        c.limits.retry_after_ms = 5;
    });
    server
        .client()
        .create_stream("s", "SYMBOL:STRING,PRICE:DOUBLE")
        .unwrap();
    let binary: Arc<dyn Transport> = Arc::new(BinaryClient::connect(server.binary, None).unwrap());
    let http: Arc<dyn Transport> = Arc::new(server.client());
    const PER_PRODUCER: i64 = 40_000;
    let producers: Vec<_> = (0..6)
        .map(|p| {
            let transport = if p % 2 == 0 {
                binary.clone()
            } else {
                http.clone()
            };
            std::thread::spawn(move || {
                let producer = Producer::new(
                    transport,
                    "s",
                    schema(),
                    ProducerOptions {
                        buffer_bytes: 100 * 1024,
                        max_in_flight: 4,
                        full: FullBuffer::Block,
                        ..ProducerOptions::default()
                    },
                );
                producer
                    .push_batch(&batch(p * PER_PRODUCER, PER_PRODUCER), 0)
                    .unwrap();
                producer.close().unwrap()
            })
        })
        .collect();
    let acknowledged: u64 = producers.into_iter().map(|p| p.join().unwrap()).sum();
    assert_eq!(acknowledged, 6 * PER_PRODUCER as u64);
    let metrics = server.client().request("GET", "/metrics", None);
    let text = match metrics {
        Ok(serde_json::Value::String(text)) => text,
        other => panic!("{other:?}"),
    };
    let rejected: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("tidemark_rejected_requests_total{reason=\"overloaded\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        rejected > 0,
        "the test did not overload the server:\n{text}"
    );
    // Exactly once: the count and the sum of distinct PRICEs match what was sent.
    let answer = server
        .client()
        .query("SELECT count(*), sum(PRICE), min(PRICE), max(PRICE) FROM s")
        .unwrap();
    let n = 6 * PER_PRODUCER;
    assert_eq!(
        answer["rows"][0],
        serde_json::json!([n, (0..n).sum::<i64>() as f64, 0.0, (n - 1) as f64])
    );
}

#[test]
fn a_nonblocking_producer_says_would_block_when_full() {
    let server = TestServer::start(|_| {});
    server
        .client()
        .create_stream("s", "SYMBOL:STRING,PRICE:DOUBLE")
        .unwrap();
    let transport: Arc<dyn Transport> =
        Arc::new(BinaryClient::connect(server.binary, None).unwrap());
    let producer = Producer::new(
        transport,
        "s",
        schema(),
        ProducerOptions {
            buffer_bytes: 64,
            max_in_flight: 1,
            full: FullBuffer::WouldBlock,
            ..ProducerOptions::default()
        },
    );
    let (mut pushed, mut would_block) = (0i64, 0);
    while pushed < 2000 {
        match producer.push(
            pushed,
            None,
            &[Value::String("S".into()), Value::Double(1.0)],
        ) {
            Ok(()) => pushed += 1,
            Err(ClientError::WouldBlock) => would_block += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        would_block > 0,
        "a 64-byte buffer with one batch in flight must fill up"
    );
    assert_eq!(producer.close().unwrap(), 2000);
    assert_eq!(event_count(&server, "s"), 2000);
}

/// Connections past `limits.max_binary_connections` are answered `ERROR UNAVAILABLE` (request
/// id 0) and closed; the ones within it are served, and a connection that closes makes room.
#[test]
fn connections_past_the_bound_are_refused_with_unavailable() {
    let server = TestServer::start(|c| c.limits.max_binary_connections = 2);
    let mut ping = Vec::new();
    Request::Ping.encode(7, &mut ping).unwrap();
    let served = |socket: &mut TcpStream| -> Response {
        socket.write_all(&ping).unwrap();
        let mut buf = [0u8; 64];
        let mut read = 0;
        loop {
            let n = socket.read(&mut buf[read..]).unwrap();
            assert!(n > 0, "the connection closed unanswered");
            read += n;
            if let Ok(Some((frame, _))) = decode_frame(&buf[..read], 1 << 20) {
                assert_eq!(frame.request_id, 7);
                return Response::decode(&frame).unwrap();
            }
        }
    };
    let mut first = TcpStream::connect(server.binary).unwrap();
    let mut second = TcpStream::connect(server.binary).unwrap();
    // Answered: both are being served (and counted as open) before the third comes.
    assert!(matches!(served(&mut first), Response::Ack { .. }));
    assert!(matches!(served(&mut second), Response::Ack { .. }));

    let mut third = TcpStream::connect(server.binary).unwrap();
    let mut buf = Vec::new();
    third.read_to_end(&mut buf).unwrap(); // the server closes after the answer
    let (frame, _) = decode_frame(&buf, 1 << 20).unwrap().unwrap();
    assert_eq!(frame.request_id, 0);
    match Response::decode(&frame).unwrap() {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::Unavailable);
            assert!(message.contains("max_binary_connections"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let metrics = common::metrics_text(&server);
    assert!(
        metrics.contains("tidemark_rejected_requests_total{reason=\"unavailable\"} 1"),
        "{metrics}"
    );

    // A connection that closes gives its place back.
    drop(first);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut next = TcpStream::connect(server.binary).unwrap();
        next.write_all(&ping).unwrap();
        let mut buf = [0u8; 256];
        let n = next.read(&mut buf).unwrap();
        let (frame, _) = decode_frame(&buf[..n], 1 << 20).unwrap().unwrap();
        if frame.request_id == 7 {
            assert!(matches!(
                Response::decode(&frame).unwrap(),
                Response::Ack { .. }
            ));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no room after a close"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(matches!(served(&mut second), Response::Ack { .. }));
}

//! Consuming a stream over HTTP against a real server: appends say the positions they were
//! given, a read after a position answers what follows it, a long poll answers as soon as
//! something arrives, a follow streams appends as they become durable (NDJSON and
//! Server-Sent Events), and removed positions are refused naming where to go on.

mod common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use common::{append, call, create, TestServer};
use serde_json::{json, Value as Json};

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// The answer to GET `path` with `accept`: status, the next-position header, and the body.
fn get(server: &TestServer, path: &str, accept: &str) -> (u16, Option<u64>, String) {
    let mut response = agent()
        .get(format!("{}{path}", server.url()))
        .header("Accept", accept)
        .call()
        .unwrap();
    let next = response
        .headers()
        .get("tidemark-next-position")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let status = response.status().as_u16();
    (status, next, response.body_mut().read_to_string().unwrap())
}

/// The (position, PRICE) of each NDJSON line of a read.
fn events(body: &str) -> Vec<(u64, i64)> {
    body.lines()
        .map(|line| serde_json::from_str::<Json>(line).unwrap())
        .map(|line| {
            let position = line["position"].as_u64().unwrap();
            (position, line["event"]["PRICE"].as_i64().unwrap())
        })
        .collect()
}

fn ticks(prices: std::ops::Range<i64>) -> String {
    prices
        .map(|p| json!({"tstart": 1_000_000 + p, "PRICE": p}).to_string() + "\n")
        .collect()
}

#[test]
fn appends_say_their_positions_and_reads_resume_after_them() {
    let server = TestServer::start(|_| {});
    create(&server, "t", "PRICE:LONG");
    let first = append(&server, "t", &ticks(0..3)).unwrap();
    assert_eq!(
        (&first["firstPosition"], &first["lastPosition"]),
        (&json!(0), &json!(2))
    );
    let second = append(&server, "t", &ticks(3..8)).unwrap();
    assert_eq!(
        (&second["firstPosition"], &second["lastPosition"]),
        (&json!(3), &json!(7))
    );

    let (status, next, body) = get(&server, "/v1/streams/t/events?after=1&limit=4", "*/*");
    assert_eq!((status, next), (200, Some(8)));
    assert_eq!(events(&body), [(2, 2), (3, 3), (4, 4), (5, 5)]);
    // From the start, and after the last: caught up is an empty answer.
    let (_, _, body) = get(&server, "/v1/streams/t/events?after=0&limit=100", "*/*");
    assert_eq!(events(&body).len(), 7);
    let (status, _, body) = get(&server, "/v1/streams/t/events?after=7", "*/*");
    assert_eq!((status, body.as_str()), (200, ""));
    // A position the stream never gave is refused, not waited for.
    let (status, _, body) = get(&server, "/v1/streams/t/events?after=8", "*/*");
    assert_eq!(status, 400, "{body}");
    // A scan parameter in a read by position is named; a start is said once.
    let (status, _, body) = get(&server, "/v1/streams/t/events?after=1&to=0", "*/*");
    assert_eq!(status, 400);
    assert!(body.contains("scan by time"), "{body}");
    let (status, _, body) = get(&server, "/v1/streams/t/events?after=1&from=0", "*/*");
    assert_eq!(status, 400);
    assert!(body.contains("once"), "{body}");

    // A clear removes events, never positions: a reader behind it is told where to go on.
    call(&server.client(), "POST", "/v1/streams/t/clear", None).unwrap();
    append(&server, "t", &ticks(8..10)).unwrap();
    let (status, _, body) = get(&server, "/v1/streams/t/events?after=3", "*/*");
    assert_eq!(status, 410, "{body}");
    let refusal: Json = serde_json::from_str(&body).unwrap();
    assert_eq!(refusal["error"], "positions_removed");
    let message = refusal["message"].as_str().unwrap();
    assert!(message.contains("from position 4 to 7"), "{message}");
    assert!(message.contains("read after 7"), "{message}");
    let (_, _, body) = get(&server, "/v1/streams/t/events?after=7", "*/*");
    assert_eq!(events(&body), [(8, 8), (9, 9)]);
}

#[test]
fn a_long_poll_answers_as_soon_as_an_append_is_durable() {
    let server = TestServer::start(|_| {});
    create(&server, "t", "PRICE:LONG");
    append(&server, "t", &ticks(0..1)).unwrap();
    let url = server.url();
    let appender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let client = tidemark_client::HttpClient::new(&url, None);
        let body = ticks(1..3).into_bytes();
        client
            .request(
                "POST",
                "/v1/streams/t/events",
                Some(("application/x-ndjson", body)),
            )
            .unwrap();
    });
    let started = Instant::now();
    let (status, _, body) = get(&server, "/v1/streams/t/events?after=0&wait=20000", "*/*");
    appender.join().unwrap();
    assert_eq!(status, 200);
    assert_eq!(events(&body), [(1, 1), (2, 2)]);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "answered on the append"
    );
    // Nothing arrives: the poll answers empty once its wait is over.
    let (status, _, body) = get(&server, "/v1/streams/t/events?after=2&wait=200", "*/*");
    assert_eq!((status, body.as_str()), (200, ""));
}

/// Reads lines of a follow until `until` says stop; each line parsed.
fn follow_lines(reader: &mut impl BufRead, mut until: impl FnMut(&[Json]) -> bool) -> Vec<Json> {
    let mut lines = Vec::new();
    while !until(&lines) {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the follow ended");
        lines.push(serde_json::from_str(&line).unwrap());
    }
    lines
}

#[test]
fn a_follow_streams_every_append_once_in_order_and_ends_when_its_stream_is_dropped() {
    let server = TestServer::start(|_| {});
    create(&server, "t", "PRICE:LONG");
    append(&server, "t", &ticks(0..2)).unwrap();
    let response = agent()
        .get(format!(
            "{}/v1/streams/t/events?follow=true&after=0",
            server.url()
        ))
        .call()
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let mut reader = BufReader::new(response.into_body().into_reader());
    // What was there, then each append as it comes, from several writers.
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let url = server.url();
            std::thread::spawn(move || {
                let client = tidemark_client::HttpClient::new(&url, None);
                for batch in 0..10 {
                    let first = 2 + w * 100 + batch * 10;
                    let body = ticks(first..first + 10).into_bytes();
                    client
                        .request(
                            "POST",
                            "/v1/streams/t/events",
                            Some(("application/x-ndjson", body)),
                        )
                        .unwrap();
                }
            })
        })
        .collect();
    let lines = follow_lines(&mut reader, |lines| {
        lines.iter().filter(|l| l.get("position").is_some()).count() == 301
    });
    writers.into_iter().for_each(|w| w.join().unwrap());
    let positions: Vec<u64> = lines
        .iter()
        .filter_map(|l| l["position"].as_u64())
        .collect();
    assert_eq!(
        positions,
        (1..=301).collect::<Vec<_>>(),
        "every event once, in order"
    );
    let mut prices: Vec<i64> = lines
        .iter()
        .filter_map(|l| l["event"]["PRICE"].as_i64())
        .collect();
    prices.sort_unstable();
    let mut expected: Vec<i64> = (0..3)
        .flat_map(|w| 2 + w * 100..2 + w * 100 + 100)
        .chain([1])
        .collect();
    expected.sort_unstable();
    assert_eq!(prices, expected);

    // The stream dropped: the follow says so and ends.
    call(&server.client(), "DELETE", "/v1/streams/t", None).unwrap();
    let last = follow_lines(&mut reader, |lines| !lines.is_empty());
    assert_eq!(last[0]["error"], "unknown_stream", "{last:?}");
    let mut rest = String::new();
    assert_eq!(reader.read_line(&mut rest).unwrap(), 0, "ended: {rest}");
}

#[test]
fn server_sent_events_carry_positions_as_ids_and_resume_after_the_last_event_id() {
    let server = TestServer::start(|_| {});
    create(&server, "t", "PRICE:LONG");
    append(&server, "t", &ticks(0..5)).unwrap();
    let response = agent()
        .get(format!("{}/v1/streams/t/events", server.url()))
        .header("Accept", "text/event-stream")
        .header("Last-Event-ID", "2")
        .call()
        .unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let body = response.into_body().read_to_string().unwrap();
    let ids: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .collect();
    assert_eq!(ids, ["3", "4"]);
    assert!(
        body.contains("data: {\"tstart\":1000003,\"PRICE\":3}"),
        "{body}"
    );
}

#[test]
fn follows_past_the_bound_are_refused_and_a_slot_frees_when_its_client_leaves() {
    let server = TestServer::start(|config| config.limits.max_subscriptions = 1);
    create(&server, "t", "PRICE:LONG");
    let path = format!("{}/v1/streams/t/events?follow=true", server.url());
    let first = agent().get(&path).call().unwrap();
    assert_eq!(first.status(), 200);
    let refused = agent().get(&path).call().unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().get("retry-after").is_some());
    drop(first);
    // The follow notices its client left (at the latest on its next heartbeat or append).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        append(&server, "t", &ticks(0..1)).unwrap();
        let again = agent().get(&path).call().unwrap();
        if again.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the slot was never freed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_named_consumer_commits_its_position_and_a_read_by_its_name_resumes_after_it() {
    let server = TestServer::start(|_| {});
    create(&server, "t", "PRICE:LONG");
    append(&server, "t", &ticks(0..10)).unwrap();
    let client = server.client();
    // Never committed: it starts from the earliest event held.
    let (_, _, body) = get(
        &server,
        "/v1/streams/t/events?consumer=billing&limit=4",
        "*/*",
    );
    assert_eq!(events(&body), [(0, 0), (1, 1), (2, 2), (3, 3)]);
    let path = "/v1/streams/t/consumers/billing";
    let answer = call(&client, "POST", path, Some(json!({"position": 3}))).unwrap();
    assert_eq!(answer, json!({"name": "billing", "position": 3}));
    let (_, _, body) = get(
        &server,
        "/v1/streams/t/events?consumer=billing&limit=2",
        "*/*",
    );
    assert_eq!(events(&body), [(4, 4), (5, 5)]);
    // An explicit `after` wins over the name.
    let (_, _, body) = get(
        &server,
        "/v1/streams/t/events?consumer=billing&after=8",
        "*/*",
    );
    assert_eq!(events(&body), [(9, 9)]);

    let listed = call(&client, "GET", "/v1/streams/t/consumers", None).unwrap();
    assert_eq!(
        listed,
        json!([{"name": "billing", "position": 3, "behind": 6}])
    );
    let info = call(&client, "GET", "/v1/streams/t", None).unwrap();
    assert_eq!(info["nextPosition"], 10);
    assert_eq!(info["consumers"][0]["name"], "billing");

    // A position the stream has not given, a name with a path separator: refused.
    let (code, message) = call(&client, "POST", path, Some(json!({"position": 10}))).unwrap_err();
    assert_eq!(code, "bad_request", "{message}");
    assert!(message.contains("has not given position 10"), "{message}");
    let (code, _) = call(&client, "POST", path, Some(json!({"position": -1}))).unwrap_err();
    assert_eq!(code, "bad_request");

    // Forgotten: 404 for it, and a read by its name starts from the earliest again.
    call(&client, "DELETE", path, None).unwrap();
    let (code, _) = call(&client, "GET", path, None).unwrap_err();
    assert_eq!(code, "unknown_consumer");
    let (_, _, body) = get(
        &server,
        "/v1/streams/t/events?consumer=billing&limit=1",
        "*/*",
    );
    assert_eq!(events(&body), [(0, 0)]);
}

#[test]
fn metrics_say_how_far_behind_each_consumer_is_and_how_many_follow() {
    let server = TestServer::start(|_| {});
    create(&server, "t", "PRICE:LONG");
    append(&server, "t", &ticks(0..5)).unwrap();
    let client = server.client();
    call(
        &client,
        "POST",
        "/v1/streams/t/consumers/audit",
        Some(json!({"position": 1})),
    )
    .unwrap();
    let follow = agent()
        .get(format!("{}/v1/streams/t/events?follow=true", server.url()))
        .call()
        .unwrap();
    let (_, _, text) = get(&server, "/metrics", "*/*");
    assert!(
        text.contains(
            "tidemark_consumer_behind_positions{namespace=\"replicated\",stream=\"t\",consumer=\"audit\"} 3"
        ),
        "{text}"
    );
    assert!(text.contains("tidemark_subscriptions 1"), "{text}");
    drop(follow);
}

/// A read stops at about 4 MiB of values; a follow reads the rest at once rather than wait
/// for an append that may never come.
#[test]
fn a_follow_behind_by_more_than_one_reads_worth_catches_up_without_new_appends() {
    let server = TestServer::start(|_| {});
    create(&server, "big", "S:STRING");
    // 100 events of 60,000-byte values (the server's limit is 64 KiB a value): 6 MB.
    let value = "x".repeat(60_000);
    let body: String = (0..100)
        .map(|i| json!({"tstart": 1_000 + i, "S": value}).to_string() + "\n")
        .collect();
    append(&server, "big", &body).unwrap();
    let (_, _, one) = get(
        &server,
        "/v1/streams/big/events?consumer=new&limit=1000",
        "*/*",
    );
    let cut = one.lines().count();
    assert!(
        (1..100).contains(&cut),
        "one read answers about 4 MiB: {cut} events"
    );
    let response = agent()
        .get(format!(
            "{}/v1/streams/big/events?follow=true",
            server.url()
        ))
        .call()
        .unwrap();
    let mut reader = BufReader::new(response.into_body().into_reader());
    let lines = follow_lines(&mut reader, |lines| lines.len() == 100);
    let positions: Vec<u64> = lines
        .iter()
        .map(|l| l["position"].as_u64().unwrap())
        .collect();
    assert_eq!(positions, (0..100).collect::<Vec<_>>());
}

/// The (position, PRICE) pairs of Arrow record batches of a read by position.
fn arrow_events(batches: &[arrow_array::RecordBatch]) -> Vec<(i64, i64)> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    batches
        .iter()
        .flat_map(|b| {
            let positions = b
                .column_by_name("position")
                .unwrap()
                .as_primitive::<Int64Type>();
            let prices = b
                .column_by_name("PRICE")
                .unwrap()
                .as_primitive::<Int64Type>();
            (0..b.num_rows()).map(move |r| (positions.value(r), prices.value(r)))
        })
        .collect()
}

#[test]
fn an_arrow_answer_gives_each_event_its_position_and_a_follow_sends_batches_as_they_come() {
    let server = TestServer::start(|_| {});
    create(&server, "t", "PRICE:LONG");
    append(&server, "t", &ticks(0..5)).unwrap();
    let arrow = "application/vnd.apache.arrow.stream";
    let read = |query: &str| {
        let mut response = agent()
            .get(format!("{}/v1/streams/t/events?{query}", server.url()))
            .header("Accept", arrow)
            .call()
            .unwrap();
        assert_eq!(response.status(), 200, "{query}");
        assert_eq!(response.headers()["content-type"], arrow);
        let body = response.body_mut().read_to_vec().unwrap();
        let reader = arrow_ipc::reader::StreamReader::try_new(&body[..], None).unwrap();
        let names: Vec<String> = reader
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["position", "tstart", "tend", "PRICE"]);
        let batches: Vec<_> = reader.map(Result::unwrap).collect();
        arrow_events(&batches)
    };
    let all: Vec<(i64, i64)> = (0..5).map(|p| (p, p)).collect();
    assert_eq!(read("after=earliest"), all);
    assert_eq!(read("after=1&limit=2"), all[2..4]);
    // From a time: the first event appended that starts at or after it.
    assert_eq!(read("from=1000003&wait=0"), all[3..]);
    assert_eq!(read("from=1970-01-01T00:00:00.001000003Z&wait=0"), all[3..]);
    assert_eq!(read("from=9000000&wait=0"), []);

    // A follow: a batch per read, as appends come.
    let response = agent()
        .get(format!(
            "{}/v1/streams/t/events?after=3&follow=true",
            server.url()
        ))
        .header("Accept", arrow)
        .call()
        .unwrap();
    let mut follow =
        arrow_ipc::reader::StreamReader::try_new(response.into_body().into_reader(), None).unwrap();
    let first = follow.next().unwrap().unwrap();
    assert_eq!(arrow_events(&[first]), [(4, 4)]);
    append(&server, "t", &ticks(5..8)).unwrap();
    let next = follow.next().unwrap().unwrap();
    assert_eq!(arrow_events(&[next]), [(5, 5), (6, 6), (7, 7)]);
    // The stream dropped: the answer ends (without the end-of-stream marker: an Arrow
    // reader may take it for an end), and asking again says why.
    call(&server.client(), "DELETE", "/v1/streams/t", None).unwrap();
    assert!(follow.all(|b| b.is_err()));
    let (status, _, body) = get(&server, "/v1/streams/t/events?after=7&follow=true", arrow);
    assert_eq!(status, 404, "{body}");
}

#[test]
fn follows_end_when_the_server_stops_saying_so() {
    let mut server = TestServer::start(|c| c.limits.shutdown_grace_ms = 60_000);
    create(&server, "t", "PRICE:LONG");
    append(&server, "t", &ticks(0..2)).unwrap();
    let response = agent()
        .get(format!("{}/v1/streams/t/events?follow=true", server.url()))
        .call()
        .unwrap();
    let mut reader = BufReader::new(response.into_body().into_reader());
    assert_eq!(follow_lines(&mut reader, |lines| lines.len() == 2).len(), 2);
    // A long poll waiting meanwhile is answered (empty), not dropped after the grace.
    let url = format!("{}/v1/streams/t/events?after=1&wait=60000", server.url());
    let poll = std::thread::spawn(move || {
        let mut answer = agent().get(url).call().unwrap();
        let status = answer.status().as_u16();
        (status, answer.body_mut().read_to_string().unwrap())
    });
    std::thread::sleep(Duration::from_millis(300));
    server.stop();
    assert_eq!(poll.join().unwrap(), (200, String::new()));
    // The follow was told (not held open until the grace ran out, then dropped).
    let last = follow_lines(&mut reader, |lines| !lines.is_empty());
    assert_eq!(last[0]["error"], "unavailable", "{last:?}");
    let mut rest = String::new();
    assert_eq!(reader.read_line(&mut rest).unwrap(), 0, "ended: {rest}");
}

/// A raw binary-protocol connection, to see exactly what the server sends and when.
struct Raw(std::net::TcpStream);

impl Raw {
    fn connect(server: &TestServer) -> Raw {
        let socket = std::net::TcpStream::connect(server.binary).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Raw(socket)
    }

    fn send(&mut self, id: u64, request: tidemark_protocol::Request<'_>) {
        use std::io::Write;
        let mut frame = Vec::new();
        request.encode(id, &mut frame).unwrap();
        self.0.write_all(&frame).unwrap();
    }

    /// The next frame: its request id, answer and length; `None` if nothing comes within
    /// `wait`.
    fn receive(&mut self, wait: Duration) -> Option<(u64, tidemark_protocol::Response, usize)> {
        use std::io::Read;
        self.0.set_read_timeout(Some(wait)).unwrap();
        let mut head = [0u8; 4];
        match self.0.read_exact(&mut head) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None
            }
            Err(e) => panic!("{e}"),
        }
        self.0
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let len = u32::from_le_bytes(head) as usize + 4;
        let mut frame = head.to_vec();
        frame.resize(len, 0);
        self.0.read_exact(&mut frame[4..]).unwrap();
        let (frame, _) = tidemark_protocol::decode_frame(&frame, usize::MAX)
            .unwrap()
            .unwrap();
        let answer = tidemark_protocol::Response::decode(&frame).unwrap();
        Some((frame.request_id, answer, len))
    }

    /// The positions and PRICEs of the next EVENTS frame of subscription `id`.
    fn events(&mut self, id: u64) -> (Vec<(u64, i64)>, usize) {
        let Some((got, tidemark_protocol::Response::Events { events, .. }, len)) =
            self.receive(Duration::from_secs(20))
        else {
            panic!("no EVENTS frame");
        };
        assert_eq!(got, id);
        let prices = (0..events.len())
            .map(|r| {
                let tidemark_core::Value::Long(price) = events.column(0).value(r) else {
                    panic!("PRICE is a LONG")
                };
                (events.position_at(r).unwrap(), price)
            })
            .collect();
        (prices, len)
    }
}

#[test]
fn a_subscription_sends_no_more_than_its_credit_follows_appends_and_ends_when_asked() {
    use tidemark_protocol::{Request, Response, Start};
    let server = TestServer::start(|_| {});
    create(&server, "t", "PRICE:LONG");
    append(&server, "t", &ticks(0..100)).unwrap();
    let mut raw = Raw::connect(&server);
    // One byte of credit: one frame of one event, then nothing until more is granted.
    let subscribe = Request::Subscribe {
        stream: "t",
        start: Start::After(9),
        credit: 1,
        follow: true,
    };
    raw.send(7, subscribe);
    let (first, _) = raw.events(7);
    assert_eq!(first, [(10, 10)]);
    assert!(
        raw.receive(Duration::from_millis(300)).is_none(),
        "sent past its credit"
    );
    raw.send(7, Request::Credit { bytes: 1 << 20 });
    let mut received = Vec::new();
    while received.len() < 89 {
        received.extend(raw.events(7).0);
    }
    let expected: Vec<(u64, i64)> = (11..100).map(|p| (p, p as i64)).collect();
    assert_eq!(received, expected, "each event once, in order");
    // Following: appends come as they become durable.
    append(&server, "t", &ticks(100..103)).unwrap();
    let (next, _) = raw.events(7);
    assert_eq!(next, [(100, 100), (101, 101), (102, 102)]);
    // Credit for no subscription changes nothing; UNSUBSCRIBE ends it with an ACK.
    raw.send(8, Request::Credit { bytes: 1 });
    raw.send(7, Request::Unsubscribe);
    let (id, answer, _) = raw.receive(Duration::from_secs(20)).unwrap();
    assert_eq!(id, 7);
    assert!(matches!(answer, Response::Ack { .. }), "{answer:?}");
}

#[test]
fn a_consumer_resumes_by_name_and_is_told_of_removed_positions() {
    use tidemark_client::{ClientError, Consumer, ConsumerOptions, StartAt};
    let server = TestServer::start(|_| {});
    create(&server, "t", "PRICE:LONG");
    append(&server, "t", &ticks(0..50)).unwrap();
    let servers = [server.binary.to_string()];
    let options = ConsumerOptions {
        name: Some("billing".into()),
        start: StartAt::Committed,
        follow: false,
        credit_bytes: 256, // several frames
        ..ConsumerOptions::default()
    };
    let mut consumer = Consumer::new(&servers, "t", options.clone());
    let mut positions = Vec::new();
    while let Some(batch) = consumer.next_batch().unwrap() {
        positions.extend((0..batch.len()).map(|r| batch.position_at(r).unwrap()));
        if positions.len() >= 30 {
            break;
        }
    }
    consumer.commit().unwrap();
    let committed = consumer.position().unwrap();
    assert_eq!(positions, (0..=committed).collect::<Vec<_>>());
    drop(consumer);
    // By name: after what was committed, to the end, then done (it does not follow).
    let rest: Vec<u64> = Consumer::new(&servers, "t", options)
        .map(Result::unwrap)
        .flat_map(|b| (0..b.len()).map(move |r| b.position_at(r).unwrap()))
        .collect();
    assert_eq!(rest, (committed + 1..50).collect::<Vec<_>>());
    let listed = call(&server.client(), "GET", "/v1/streams/t/consumers", None).unwrap();
    assert_eq!(listed[0]["position"], json!(committed));

    // Events removed before they were read: an error naming the earliest held.
    call(&server.client(), "POST", "/v1/streams/t/clear", None).unwrap();
    append(&server, "t", &ticks(50..52)).unwrap();
    let after = ConsumerOptions {
        start: StartAt::After(10),
        follow: false,
        ..ConsumerOptions::default()
    };
    let mut consumer_after_10 = Consumer::new(&servers, "t", after);
    match consumer_after_10.next_batch() {
        Err(ClientError::Refused { code, message }) => {
            assert_eq!(code, "gone");
            assert!(message.contains("50"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Asked again, the same refusal: a consumer never ends in silence.
    assert!(matches!(
        consumer_after_10.next_batch(),
        Err(ClientError::Refused { .. })
    ));
}

#[test]
fn a_subscription_never_reads_on_into_a_stream_created_again_and_its_id_stays_taken() {
    use tidemark_protocol::{ErrorCode, Request, Response, Start};
    let server = TestServer::start(|_| {});
    create(&server, "t", "PRICE:LONG");
    append(&server, "t", &ticks(0..5)).unwrap();
    let mut raw = Raw::connect(&server);
    let subscribe = |credit| Request::Subscribe {
        stream: "t",
        start: Start::Earliest,
        credit,
        follow: true,
    };
    raw.send(1, subscribe(1));
    assert_eq!(raw.events(1).0, [(0, 0)]);
    // Dropped and created again while the subscription waits for credit: the new stream
    // counts from 0 again, and its events are not the old one's.
    call(&server.client(), "DELETE", "/v1/streams/t", None).unwrap();
    create(&server, "t", "PRICE:LONG");
    append(&server, "t", &ticks(100..110)).unwrap();
    raw.send(1, Request::Credit { bytes: 1 << 20 });
    let (id, answer, _) = raw.receive(Duration::from_secs(20)).unwrap();
    assert_eq!(id, 1);
    assert!(
        matches!(
            answer,
            Response::Error {
                code: ErrorCode::UnknownStream,
                ..
            }
        ),
        "{answer:?}"
    );
    // An id stays taken while its subscription runs: using it again closes.
    raw.send(2, subscribe(0));
    raw.send(2, subscribe(0));
    let mut last = None;
    while let Some((id, answer, _)) = raw.receive(Duration::from_secs(20)) {
        last = Some((id, answer));
        if matches!(last, Some((0, _))) {
            break;
        }
    }
    let Some((0, Response::Error { code, message })) = last else {
        panic!("{last:?}");
    };
    assert_eq!(code, ErrorCode::MalformedFrame, "{message}");
}

/// The consumer as an async stream, on a runtime of the test's own: it hands out every
/// event once, in order, follows appends made while it waits, commits what was handed out
/// (a consumer of that name resumes after it), and a dropped stream ends its subscription
/// on the server.
#[test]
fn a_consumer_stream_follows_commits_and_ends_its_subscription_when_dropped() {
    use tidemark_client::{Consumer, ConsumerOptions, StartAt};
    let server = TestServer::start(|_| {});
    create(&server, "t", "PRICE:LONG");
    append(&server, "t", &ticks(0..40)).unwrap();
    let servers = [server.binary.to_string()];
    let options = ConsumerOptions {
        name: Some("async".into()),
        start: StartAt::Committed,
        credit_bytes: 256, // several frames
        ..ConsumerOptions::default()
    };
    let subscriptions = || {
        let (_, _, text) = get(&server, "/metrics", "*/*");
        text.lines()
            .find_map(|l| l.strip_prefix("tidemark_subscriptions "))
            .map(|n| n.parse::<u64>().unwrap())
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut stream = Consumer::new(&servers, "t", options.clone()).into_stream();
    let mut positions = Vec::new();
    runtime.block_on(async {
        while positions.len() < 40 {
            let batch = stream.next().await.unwrap().unwrap();
            positions.extend((0..batch.len()).map(|r| batch.position_at(r).unwrap()));
        }
        // Waiting, it follows: an append made now arrives.
        let appended = std::thread::spawn({
            let url = server.url();
            move || {
                let agent = agent();
                agent
                    .post(format!("{url}/v1/streams/t/events"))
                    .send(ticks(40..45))
                    .unwrap();
            }
        });
        while positions.len() < 45 {
            let batch = stream.next().await.unwrap().unwrap();
            positions.extend((0..batch.len()).map(|r| batch.position_at(r).unwrap()));
        }
        appended.join().unwrap();
        stream.commit().await.unwrap();
    });
    assert_eq!(positions, (0..45).collect::<Vec<_>>());
    assert_eq!(stream.position(), Some(44));
    assert_eq!(subscriptions(), Some(1));
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    while subscriptions() != Some(0) {
        assert!(
            Instant::now() < deadline,
            "the subscription outlived its stream"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // By name, after what was committed: only what came since.
    append(&server, "t", &ticks(45..47)).unwrap();
    let rest = Consumer::new(
        &servers,
        "t",
        ConsumerOptions {
            follow: false,
            ..options
        },
    )
    .map(Result::unwrap)
    .flat_map(|b| (0..b.len()).map(move |r| b.position_at(r).unwrap()))
    .collect::<Vec<_>>();
    assert_eq!(rest, [45, 46]);

    // A refusal is the stream's last item.
    let mut unknown = Consumer::new(&servers, "nope", ConsumerOptions::default()).into_stream();
    runtime.block_on(async {
        assert!(matches!(unknown.next().await, Some(Err(_))));
        assert!(unknown.next().await.is_none());
    });
}

//! `tidemark agent` between producers and a server, with real processes on 127.0.0.1:
//! kill -9 of the upstream or of the agent under load, an outage longer than the spool
//! holds, a torn spool tail, refused records. Every event a producer had acknowledged by
//! the agent must be upstream exactly once in the end; no event may be there twice.

mod common;

use std::collections::HashSet;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use tidemark_client::{ClientError, HttpClient};

/// Every acknowledged id is upstream, and no id twice.
fn check(upstream: &Process, acknowledged: &[(u64, u64)]) {
    let client = HttpClient::new(&upstream.http, None);
    let answer = client.query(&format!("SELECT ID FROM {STREAM}")).unwrap();
    let ids: Vec<u64> = answer["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_u64().unwrap())
        .collect();
    let distinct: HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), ids.len(), "an event is stored twice");
    for &(first, n) in acknowledged {
        for id in first..first + n {
            assert!(distinct.contains(&id), "acknowledged event {id} is missing");
        }
    }
    assert!(!acknowledged.is_empty());
}

#[test]
fn an_upstream_killed_under_load_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = upstream(&dir.path().join("upstream"), port);
    let agent = agent(&dir.path().join("spool"), port, &[]);
    create_stream(&agent);
    let acknowledged: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    for cycle in 0..2u64 {
        let producers = Producers::start(&agent.http, cycle * 1_000_000_000, acknowledged.clone());
        producers.wait_for_acks(40);
        server.kill(); // SIGKILL, mid-forward
        let acked_at_kill = acknowledged.lock().unwrap().len();
        std::thread::sleep(Duration::from_secs(5));
        let down = status(&agent);
        assert_eq!(down["upstream"], "down", "{down}");
        // And why: what the last attempt met.
        assert!(
            down["upstreamError"]
                .as_str()
                .is_some_and(|e| !e.is_empty()),
            "{down}"
        );
        assert!(
            acknowledged.lock().unwrap().len() > acked_at_kill,
            "the agent takes writes while the upstream is down"
        );
        assert!(down["spooledBatches"].as_u64().unwrap() > 0, "{down}");
        server = upstream(&dir.path().join("upstream"), port);
        producers.wait_for_acks(20); // the backlog drains while new writes come in
        producers.stop();
        drained(&agent);
        check(&server, &acknowledged.lock().unwrap());
    }
}

#[test]
fn an_agent_killed_under_load_and_a_torn_spool_tail_lose_and_duplicate_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let port = free_port();
    let server = upstream(&dir.path().join("upstream"), port);
    let mut agent = agent(&spool, port, &[]);
    create_stream(&agent);
    let acknowledged: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    for cycle in 0..3u64 {
        let producers = Producers::start(&agent.http, cycle * 1_000_000_000, acknowledged.clone());
        producers.wait_for_acks(60);
        agent.kill(); // SIGKILL, mid-spool and mid-forward
        producers.stop();
        if cycle == 1 {
            // A write torn by the kill: garbage after the last whole record.
            let last = std::fs::read_dir(spool.join("wal"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension() == Some("log".as_ref()))
                .max()
                .unwrap();
            let mut file = std::fs::OpenOptions::new().append(true).open(last).unwrap();
            file.write_all(&[0x40, 0, 0, 0, 1, 2, 3, 4, 5]).unwrap();
        }
        agent = self::agent(&spool, port, &[]);
    }
    let status = drained(&agent);
    assert_eq!(status["deadLetters"], 0, "{status}");
    check(&server, &acknowledged.lock().unwrap());
}

#[test]
fn an_outage_longer_than_the_spool_holds_is_pushed_back_then_drained() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port(); // nothing listens there yet
    let agent = agent(
        &dir.path().join("spool"),
        port,
        &["--spool-max-bytes", "200000"],
    );
    create_stream(&agent);
    let acknowledged: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let producers = Producers::start(&agent.http, 0, acknowledged.clone());
    let started = Instant::now();
    while producers.refused_for_space.load(Ordering::Relaxed) == 0 {
        assert!(started.elapsed() < Duration::from_secs(30), "never refused");
        std::thread::sleep(Duration::from_millis(20));
    }
    let full = status(&agent);
    assert!(full["spooledBytes"].as_u64().unwrap() >= 200_000, "{full}");
    let server = upstream(&dir.path().join("upstream"), port);
    producers.wait_for_acks(20);
    let refused = producers.stop();
    assert!(refused > 0);
    drained(&agent);
    check(&server, &acknowledged.lock().unwrap());
}

#[test]
fn a_record_the_upstream_refuses_is_a_dead_letter_and_the_rest_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = upstream(&dir.path().join("upstream"), port);
    HttpClient::new(&server.http, None)
        .create_stream("other", "A:LONG")
        .unwrap();
    let agent = agent(&dir.path().join("spool"), port, &[]);
    let producer = HttpClient::new(&agent.http, None);
    producer.create_stream("other", "B:DOUBLE").unwrap(); // upstream: another schema
    producer
        .request(
            "POST",
            "/v1/streams/other/events",
            Some(("application/json", br#"[{"tstart": 1, "B": 1.5}]"#.to_vec())),
        )
        .unwrap();
    create_stream(&agent);
    let acknowledged: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let producers = Producers::start(&agent.http, 0, acknowledged.clone());
    producers.wait_for_acks(20);
    producers.stop();
    let status = drained(&agent);
    assert_eq!(
        status["deadLetters"], 2,
        "the create and the append: {status}"
    );
    assert!(
        status["lastDeadLetter"]
            .as_str()
            .is_some_and(|s| s.contains("schema")),
        "{status}"
    );
    let kept = std::fs::read_dir(dir.path().join("spool/dead-letters"))
        .unwrap()
        .count();
    assert_eq!(kept, 4, "a record and its reason each");
    check(&server, &acknowledged.lock().unwrap());
    // Reads are the upstream's.
    let read = producer.request("GET", &format!("/v1/streams/{STREAM}/events"), None);
    assert!(
        matches!(&read, Err(ClientError::Refused { code, .. }) if code == "not_served"),
        "{read:?}"
    );
    // Refused in front of the API, and counted as the API's own refusals are.
    let metrics = get_text(&agent.http, "/metrics");
    let not_found = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tidemark_rejected_requests_total{reason=\"not_found\"} "))
        .and_then(|n| n.trim().parse::<u64>().ok());
    assert_eq!(not_found, Some(1), "{metrics}");
}

/// The body of a GET of `path` from the HTTP listener at `url` (`http://host:port`).
fn get_text(url: &str, path: &str) -> String {
    use std::io::Read;
    let addr = url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

#[test]
fn a_producers_retry_through_the_binary_protocol_is_forwarded_once() {
    use tidemark_client::BinaryClient;
    use tidemark_core::{BatchBuilder, Schema, Value};
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = upstream(&dir.path().join("upstream"), port);
    let agent = agent(&dir.path().join("spool"), port, &[]);
    create_stream(&agent);
    let schema = std::sync::Arc::new(Schema::parse_spec(SCHEMA).unwrap());
    let batch = |first: u64| {
        let mut b = BatchBuilder::new(schema.clone(), 10);
        for id in first..first + 10 {
            b.push_row(
                id as i64,
                None,
                &[Value::Long(id as i64), Value::Integer(0)],
            )
            .unwrap();
        }
        b.finish()
    };
    let producer = BinaryClient::connect(agent.binary.as_str(), None).unwrap();
    let tagged = |first: u64, sequence: u64| {
        producer
            .send_append_tagged(STREAM, &batch(first), Some((99, sequence)))
            .unwrap()
            .wait()
            .unwrap()
    };
    tagged(0, 1);
    tagged(0, 1); // the retry of an answer the producer did not get
    tagged(10, 2);
    drained(&agent);
    check(&server, &[(0, 20)]);
    let stored = HttpClient::new(&server.http, None)
        .query(&format!("SELECT COUNT(*) FROM {STREAM}"))
        .unwrap();
    assert_eq!(stored["rows"][0][0], 20, "{stored}");
}

#[test]
fn line_protocol_through_the_agent_creates_and_grows_the_stream_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = upstream(&dir.path().join("upstream"), port);
    let agent = agent(&dir.path().join("spool"), port, &[]);
    let producer = HttpClient::new(&agent.http, None);
    for lines in [
        "cpu,host=a usage=1.5 1000000000\n",
        "cpu,host=b usage=2.5,temp=40i 2000000000\n", // a field the stream lacks
    ] {
        let answer = producer.request(
            "POST",
            "/write?db=metrics",
            Some(("text/plain", lines.as_bytes().to_vec())),
        );
        // 204 without a body, which the client may not read as JSON.
        assert!(
            matches!(answer, Ok(_) | Err(ClientError::Protocol(_))),
            "{answer:?}"
        );
    }
    drained(&agent);
    let rows = HttpClient::new(&server.http, None)
        .query("SELECT host, usage, temp FROM cpu ORDER BY tstart")
        .unwrap();
    assert_eq!(
        rows["rows"],
        serde_json::json!([["a", 1.5, null], ["b", 2.5, 40]]),
        "{rows}"
    );
}

//! `tidemark agent` between producers and a server, with real processes on 127.0.0.1:
//! kill -9 of the upstream or of the agent under load, an outage longer than the spool
//! holds, a torn spool tail, refused records. Every event a producer had acknowledged by
//! the agent must be upstream exactly once in the end; no event may be there twice.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_client::{ClientError, HttpClient};

const STREAM: &str = "events";
const SCHEMA: &str = "ID:LONG,WRITER:INTEGER";

/// A child process killed (SIGKILL) when dropped.
struct Process {
    child: Child,
    /// The HTTP and binary addresses it printed.
    http: String,
    binary: String,
}

impl Process {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `tidemark ARGS` and reads the addresses from the first line it prints.
fn start(args: &[&str]) -> Process {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |marker: &str| {
        words
            .iter()
            .position(|w| *w == marker)
            .and_then(|i| words.get(i + 1))
            .unwrap_or_else(|| panic!("no {marker} address in {line:?}"))
            .to_string()
    };
    Process {
        http: after("HTTP"),
        binary: after("binary"),
        child,
    }
}

/// A port free now, so that a restarted upstream comes back where the agent looks.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn upstream(dir: &Path, binary_port: u16) -> Process {
    let binary = format!("127.0.0.1:{binary_port}");
    let dir = dir.to_str().unwrap();
    start(&[
        "serve",
        "--http",
        "127.0.0.1:0",
        "--binary",
        &binary,
        "--data-dir",
        dir,
    ])
}

fn agent(spool: &Path, binary_port: u16, extra: &[&str]) -> Process {
    let upstream = format!("127.0.0.1:{binary_port}");
    let spool = spool.to_str().unwrap();
    let mut args = vec![
        "agent",
        "--upstream",
        &upstream,
        "--spool-dir",
        spool,
        "--http",
        "127.0.0.1:0",
        "--binary",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    start(&args)
}

/// Producers writing NDJSON batches of ids to the agent at `url`, each its own id range,
/// recording what the agent acknowledged.
struct Producers {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    acknowledged: Arc<Mutex<Vec<(u64, u64)>>>,
    refused_for_space: Arc<AtomicU64>,
}

impl Producers {
    fn start(url: &str, first_id: u64, acknowledged: Arc<Mutex<Vec<(u64, u64)>>>) -> Producers {
        let stop = Arc::new(AtomicBool::new(false));
        let refused_for_space = Arc::new(AtomicU64::new(0));
        let threads = (0..3u64)
            .map(|w| {
                let (url, stop, acknowledged, refused) = (
                    url.to_string(),
                    stop.clone(),
                    acknowledged.clone(),
                    refused_for_space.clone(),
                );
                let mut id = first_id + w * 100_000_000;
                std::thread::spawn(move || {
                    let client = HttpClient::new(&url, None);
                    let base = 1_700_000_000_000_000_000i64;
                    while !stop.load(Ordering::Relaxed) {
                        let n = 50;
                        let body: String = (id..id + n)
                            .map(|i| {
                                format!(
                                    "{{\"tstart\": {}, \"ID\": {i}, \"WRITER\": {w}}}\n",
                                    base + i as i64
                                )
                            })
                            .collect();
                        match client.request(
                            "POST",
                            &format!("/v1/streams/{STREAM}/events"),
                            Some(("application/x-ndjson", body.into_bytes())),
                        ) {
                            Ok(_) => acknowledged.lock().unwrap().push((id, n)),
                            Err(ClientError::TryLater { .. }) => {
                                // Not stored: the same ids go again.
                                refused.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(Duration::from_millis(20));
                                continue;
                            }
                            // The agent is gone: the outcome is unknown, so not counted.
                            Err(_) => break,
                        }
                        id += n;
                    }
                })
            })
            .collect();
        Producers {
            stop,
            threads,
            acknowledged,
            refused_for_space,
        }
    }

    fn wait_for_acks(&self, more: usize) {
        let before = self.acknowledged.lock().unwrap().len();
        let started = Instant::now();
        while self.acknowledged.lock().unwrap().len() < before + more
            && started.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().unwrap();
        }
        self.refused_for_space.load(Ordering::Relaxed)
    }
}

fn status(agent: &Process) -> serde_json::Value {
    let client = HttpClient::new(&agent.http, None);
    client.request("GET", "/agent/status", None).unwrap()
}

/// Waits until the agent has forwarded everything it spooled.
fn drained(agent: &Process) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let status = status(agent);
        if status["spooledBatches"] == 0 && status["upstream"] == "up" {
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the spool does not drain: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

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

fn create_stream(agent: &Process) {
    HttpClient::new(&agent.http, None)
        .create_stream(STREAM, SCHEMA)
        .unwrap();
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

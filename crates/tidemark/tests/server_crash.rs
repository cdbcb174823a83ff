//! kill -9 of `tidemark serve` under HTTP load: every event acknowledged with a 200 is there,
//! exactly once, after the server restarts on the same data directory; a follower resumes
//! through the kills. Also: subscribers that stop reading cost the server what they granted,
//! not what the stream grows by.
//!
//! `TIDEMARK_SERVER_KILLS` sets the number of kill/restart cycles (default 3).

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_client::HttpClient;

/// Starts the server on ephemeral ports (`common::start` reads its addresses).
fn serve(dir: &Path) -> common::Process {
    let dir = dir.to_str().unwrap();
    common::start(&[
        "serve",
        "--http",
        "127.0.0.1:0",
        "--binary",
        "127.0.0.1:0",
        "--data-dir",
        dir,
    ])
}

#[test]
fn every_acknowledged_event_survives_kill_9() {
    let kills: usize = std::env::var("TIDEMARK_SERVER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let dir = tempfile::tempdir().unwrap();
    let acknowledged: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let mut next_id = 0u64;
    for cycle in 0..kills {
        let mut server = serve(dir.path());
        let client = HttpClient::new(&server.http, None);
        client
            .create_stream("events", "ID:LONG,WRITER:INTEGER")
            .unwrap();
        check(&client, &acknowledged.lock().unwrap(), cycle);

        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..3u64)
            .map(|w| {
                let (url, stop, acknowledged) =
                    (server.http.clone(), stop.clone(), acknowledged.clone());
                // Each writer owns a disjoint range of ids.
                let mut id = next_id + w * 100_000_000;
                std::thread::spawn(move || {
                    let client = HttpClient::new(&url, None);
                    let base = 1_700_000_000_000_000_000i64;
                    while !stop.load(Ordering::Relaxed) {
                        let n = 50;
                        let mut body = String::new();
                        for i in id..id + n {
                            body.push_str(&format!(
                                "{{\"tstart\": {}, \"ID\": {i}, \"WRITER\": {w}}}\n",
                                base + i as i64
                            ));
                        }
                        match client.request(
                            "POST",
                            "/v1/streams/events/events",
                            Some(("application/x-ndjson", body.into_bytes())),
                        ) {
                            Ok(_) => acknowledged.lock().unwrap().push((id, n)),
                            // The server is gone: its outcome is unknown, so it is not counted.
                            Err(_) => break,
                        }
                        id += n;
                    }
                })
            })
            .collect();
        let started = Instant::now();
        let before = acknowledged.lock().unwrap().len();
        while acknowledged.lock().unwrap().len() < before + 40
            && started.elapsed() < Duration::from_secs(20)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        server.kill(); // SIGKILL
        stop.store(true, Ordering::Relaxed);
        for writer in writers {
            writer.join().unwrap();
        }
        next_id += 3 * 100_000_000;
    }
    let mut server = serve(dir.path());
    let client = HttpClient::new(&server.http, None);
    check(&client, &acknowledged.lock().unwrap(), kills);
    server.kill();
    assert!(acknowledged.lock().unwrap().len() >= 40 * kills);
}

/// Every acknowledged id is present, and no id twice.
fn check(client: &HttpClient, acknowledged: &[(u64, u64)], cycle: usize) {
    let answer = client.query("SELECT ID FROM events").unwrap();
    let rows = answer["rows"].as_array().unwrap();
    let ids: Vec<u64> = rows.iter().map(|r| r[0].as_u64().unwrap()).collect();
    let distinct: HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        ids.len(),
        "cycle {cycle}: an event is stored twice"
    );
    for &(first, n) in acknowledged {
        for id in first..first + n {
            assert!(
                distinct.contains(&id),
                "cycle {cycle}: acknowledged event {id} is missing"
            );
        }
    }
}

/// A consumer following the stream through kill -9 of the server: it reconnects to the
/// restarted server after the last position it received and, in the end, has seen every
/// position once, in order, with the event that position was acknowledged with.
#[test]
fn a_follower_resumes_after_kill_9_and_sees_every_acknowledged_event_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = serve(dir.path());
    HttpClient::new(&server.http, None)
        .create_stream("events", "ID:LONG")
        .unwrap();
    let url = Arc::new(Mutex::new(server.http.clone()));
    // (position, ID) as the follower received them.
    let seen: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let follower = {
        let (url, seen, stop) = (url.clone(), seen.clone(), stop.clone());
        std::thread::spawn(move || follow(&url, &seen, &stop))
    };
    // (first position, first ID, events) of each acknowledged append.
    let mut acknowledged: Vec<(u64, u64, u64)> = Vec::new();
    let mut id = 0u64;
    for cycle in 0..3 {
        let client = HttpClient::new(&server.http, None);
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(700) {
            let n = 20;
            let body: String = (id..id + n)
                .map(|i| {
                    format!(
                        "{{\"tstart\": {}, \"ID\": {i}}}\n",
                        1_700_000_000_000_000_000u64 + i
                    )
                })
                .collect();
            let answer = client
                .request(
                    "POST",
                    "/v1/streams/events/events",
                    Some(("application/x-ndjson", body.into_bytes())),
                )
                .unwrap();
            acknowledged.push((answer["firstPosition"].as_u64().unwrap(), id, n));
            id += n;
        }
        if cycle < 2 {
            server.kill(); // SIGKILL, the follower mid-read
            server = serve(dir.path());
            *url.lock().unwrap() = server.http.clone();
        }
    }
    let last = acknowledged.last().map(|&(p, _, n)| p + n - 1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.lock().unwrap().last().map(|s| s.0) < Some(last) {
        assert!(Instant::now() < deadline, "the follower never caught up");
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    server.kill();
    follower.join().unwrap();
    let seen = seen.lock().unwrap();
    let positions: Vec<u64> = seen.iter().map(|s| s.0).collect();
    assert_eq!(
        positions,
        (0..positions.len() as u64).collect::<Vec<_>>(),
        "every position once, in order"
    );
    for &(first, first_id, n) in &acknowledged {
        for k in 0..n {
            assert_eq!(seen[(first + k) as usize], (first + k, first_id + k));
        }
    }
}

/// Follows `events` at whatever server `url` names, after the last position in `seen`,
/// reconnecting when the server goes away, until `stop`.
fn follow(url: &Mutex<String>, seen: &Mutex<Vec<(u64, u64)>>, stop: &AtomicBool) {
    use std::io::BufRead;
    while !stop.load(Ordering::Relaxed) {
        let client = HttpClient::new(&url.lock().unwrap(), None);
        let mut params = vec![("follow", "true".to_string())];
        if let Some(&(last, _)) = seen.lock().unwrap().last() {
            params.push(("after", last.to_string()));
        }
        let Ok(mut lines) = client.read_positions("events", &params) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let mut line = String::new();
        loop {
            line.clear();
            // A line cut short by the kill is not a line.
            match lines.read_line(&mut line) {
                Ok(n) if n > 0 && line.ends_with('\n') => {}
                _ => break,
            }
            let line: serde_json::Value = serde_json::from_str(&line).unwrap();
            if let Some(position) = line["position"].as_u64() {
                let id = line["event"]["ID"].as_u64().unwrap();
                seen.lock().unwrap().push((position, id));
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
        }
    }
}

/// The server's resident memory, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// Twenty binary-protocol subscribers grant all the credit they may and then never read,
/// while 100 MB are appended: each holds the server to its credit (8 MiB) and one read,
/// not to the stream (unbounded, they would hold 2 GB), and every append goes through.
#[test]
fn subscribers_that_stop_reading_cost_their_credit_not_the_stream() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path());
    let client = HttpClient::new(&server.http, None);
    client.create_stream("big", "PAYLOAD:STRING").unwrap();
    let stalled: Vec<std::net::TcpStream> = (0..20)
        .map(|i| {
            let mut socket = std::net::TcpStream::connect(&server.binary).unwrap();
            let mut frame = Vec::new();
            tidemark_protocol::Request::Subscribe {
                stream: "big",
                start: tidemark_protocol::Start::Earliest,
                credit: u32::MAX,
                follow: true,
            }
            .encode(i, &mut frame)
            .unwrap();
            socket.write_all(&frame).unwrap();
            socket
        })
        .collect();
    let before = rss(server.child.id());
    let schema = std::sync::Arc::new(tidemark_core::Schema::parse_spec("PAYLOAD:STRING").unwrap());
    let payload = "x".repeat(1000);
    for b in 0..100i64 {
        let mut batch = tidemark_core::BatchBuilder::new(schema.clone(), 1000);
        for e in 0..1000i64 {
            let value = tidemark_core::Value::String(payload.clone());
            batch
                .push_row(1_700_000_000_000_000_000 + b * 1000 + e, None, &[value])
                .unwrap();
        }
        client.append("big", &batch.finish()).unwrap();
    }
    let grown = rss(server.child.id()).saturating_sub(before);
    // The figure docs/consuming.md quotes (`-- --nocapture` shows it).
    eprintln!("20 stalled subscribers, 100 MB appended: the server grew by {grown} bytes");
    assert!(
        grown < 1_000_000_000,
        "the server grew by {grown} bytes with 20 stalled subscribers"
    );
    drop(stalled);
}

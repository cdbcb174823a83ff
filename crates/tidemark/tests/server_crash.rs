//! kill -9 of `tidemark serve` under HTTP load: every event acknowledged with a 200 is there,
//! exactly once, after the server restarts on the same data directory.
//!
//! `TIDEMARK_SERVER_KILLS` sets the number of kill/restart cycles (default 3).

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_client::HttpClient;

struct Serving {
    child: Child,
    url: String,
}

/// Starts the server on ephemeral ports and reads its address from the first line it prints.
fn serve(dir: &Path) -> Serving {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--binary",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    Serving { child, url }
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
        let client = HttpClient::new(&server.url, None);
        client
            .create_stream("events", "ID:LONG,WRITER:INTEGER")
            .unwrap();
        check(&client, &acknowledged.lock().unwrap(), cycle);

        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..3u64)
            .map(|w| {
                let (url, stop, acknowledged) =
                    (server.url.clone(), stop.clone(), acknowledged.clone());
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
        server.child.kill().unwrap(); // SIGKILL
        server.child.wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        for writer in writers {
            writer.join().unwrap();
        }
        next_id += 3 * 100_000_000;
    }
    let mut server = serve(dir.path());
    let client = HttpClient::new(&server.url, None);
    check(&client, &acknowledged.lock().unwrap(), kills);
    server.child.kill().unwrap();
    server.child.wait().unwrap();
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

//! What the agent's process tests share (`agent.rs`, and the cluster test that forwards
//! to a cluster): the agent and server processes, producers writing ids to an agent and
//! recording what it acknowledged, the agent's status.
#![allow(dead_code)] // each test crate uses its part

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_client::{ClientError, HttpClient};

pub const STREAM: &str = "events";
pub const SCHEMA: &str = "ID:LONG,WRITER:INTEGER";

/// A child process killed (SIGKILL) when dropped.
pub struct Process {
    pub child: Child,
    /// The HTTP and binary addresses it printed.
    pub http: String,
    pub binary: String,
}

impl Process {
    pub fn kill(&mut self) {
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
pub fn start(args: &[&str]) -> Process {
    start_with_env(args, &[])
}

/// [`start`] with more environment variables (credentials, say).
pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tidemark"));
    command.args(args).envs(env.iter().copied());
    start_command(command)
}

/// Starts `command`, which runs `tidemark` in the end (through a wrapper that `exec`s it,
/// say), and reads the addresses from the first line it prints.
pub fn start_command(mut command: Command) -> Process {
    let mut child = command
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
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn upstream(dir: &Path, binary_port: u16) -> Process {
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

/// An agent forwarding to the server whose binary protocol is on `binary_port`.
pub fn agent(spool: &Path, binary_port: u16, extra: &[&str]) -> Process {
    agent_to(spool, &format!("127.0.0.1:{binary_port}"), extra)
}

/// An agent forwarding to `upstream` (`HOST:PORT[,HOST:PORT...]`).
pub fn agent_to(spool: &Path, upstream: &str, extra: &[&str]) -> Process {
    let spool = spool.to_str().unwrap();
    let mut args = vec![
        "agent",
        "--upstream",
        upstream,
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
pub struct Producers {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pub acknowledged: Arc<Mutex<Vec<(u64, u64)>>>,
    pub refused_for_space: Arc<AtomicU64>,
}

impl Producers {
    pub fn start(url: &str, first_id: u64, acknowledged: Arc<Mutex<Vec<(u64, u64)>>>) -> Producers {
        Producers::start_on(url, STREAM, first_id, acknowledged)
    }

    /// Producers writing to `stream`.
    pub fn start_on(
        url: &str,
        stream: &'static str,
        first_id: u64,
        acknowledged: Arc<Mutex<Vec<(u64, u64)>>>,
    ) -> Producers {
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
                            &format!("/v1/streams/{stream}/events"),
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

    pub fn wait_for_acks(&self, more: usize) {
        let before = self.acknowledged.lock().unwrap().len();
        let started = Instant::now();
        while self.acknowledged.lock().unwrap().len() < before + more
            && started.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().unwrap();
        }
        self.refused_for_space.load(Ordering::Relaxed)
    }
}

pub fn status(agent: &Process) -> serde_json::Value {
    let client = HttpClient::new(&agent.http, None);
    client.request("GET", "/agent/status", None).unwrap()
}

/// Waits until the agent has forwarded everything it spooled.
pub fn drained(agent: &Process) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let status = status(agent);
        if status["spooledBatches"] == 0 && status["upstream"] == "up" {
            assert!(status.get("upstreamError").is_none(), "{status}");
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the spool does not drain: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn create_stream(agent: &Process) {
    create_stream_named(agent, STREAM);
}

pub fn create_stream_named(agent: &Process, stream: &str) {
    HttpClient::new(&agent.http, None)
        .create_stream(stream, SCHEMA)
        .unwrap();
}

//! A full disk under a real server and a real agent: each runs in a mount namespace of its
//! own (`unshare`) on a small tmpfs, and the test fills that filesystem through
//! `/proc/PID/root`. A write that meets the full disk is refused as retryable and stores
//! nothing; once space returns, writes are taken again without a restart. The agent refuses
//! (429) before its disk is full and gives forwarded space back.

mod common;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use tidemark_client::{ClientError, HttpClient};

/// `tidemark ARGS` in a private mount namespace where `dir` is a tmpfs of `mib` MiB
/// (`{dir}` in `args` stands for it).
fn on_small_disk(dir: &Path, mib: u32, args: &[&str]) -> Process {
    let dir = dir.to_str().unwrap();
    let mut command = Command::new("unshare");
    // Root needs no user namespace; anyone else gets one in which they are root.
    if !is_root() {
        command.arg("--map-root-user");
    }
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o size={mib}m tidemark-disk-full \"$0\" && exec \"$@\""
        ))
        .arg(dir)
        .arg(env!("CARGO_BIN_EXE_tidemark"))
        .args(args.iter().map(|a| a.replace("{dir}", dir)));
    start_command(command)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next().map(|uid| uid == "0"))
        .unwrap()
}

/// `dir` as the process sees it, from outside its mount namespace.
fn seen_by(process: &Process, dir: &Path) -> PathBuf {
    PathBuf::from(format!("/proc/{}/root", process.child.id())).join(dir.strip_prefix("/").unwrap())
}

/// Writes `path` until the filesystem holding it is full.
fn fill(path: &Path) -> File {
    let mut file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(path)
        .unwrap();
    for chunk in [1 << 20, 4 << 10, 512] {
        while file.write_all(&vec![7u8; chunk]).is_ok() {}
    }
    file
}

fn ndjson(first: u64, n: u64) -> Vec<u8> {
    let base = 1_700_000_000_000_000_000i64;
    let pad = "x".repeat(200);
    (first..first + n)
        .map(|i| {
            format!(
                "{{\"tstart\": {}, \"ID\": {i}, \"PAD\": \"{pad}\"}}\n",
                base + i as i64
            )
        })
        .collect::<String>()
        .into_bytes()
}

fn append(client: &HttpClient, stream: &str, first: u64, n: u64) -> Result<(), ClientError> {
    client
        .request(
            "POST",
            &format!("/v1/streams/{stream}/events"),
            Some(("application/x-ndjson", ndjson(first, n))),
        )
        .map(|_| ())
}

fn count(client: &HttpClient, stream: &str) -> u64 {
    client
        .query(&format!("SELECT count(*) FROM {stream}"))
        .unwrap()["rows"][0][0]
        .as_u64()
        .unwrap()
}

#[test]
fn a_server_refuses_writes_on_a_full_disk_and_takes_them_again_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let server = on_small_disk(
        dir.path(),
        32,
        &[
            "serve",
            "--http",
            "127.0.0.1:0",
            "--binary",
            "127.0.0.1:0",
            "--data-dir",
            "{dir}/data",
        ],
    );
    let client = HttpClient::new(&server.http, None);
    client
        .create_stream("events", "ID:LONG,PAD:STRING")
        .unwrap();
    append(&client, "events", 0, 100).unwrap();

    let filler = seen_by(&server, dir.path()).join("filler");
    let file = fill(&filler);
    let refused = append(&client, "events", 100, 500).unwrap_err();
    let message = refused.to_string();
    assert!(
        message.contains("retry once the disk has space"),
        "a full disk is said as such: {message}"
    );
    assert!(
        matches!(&refused, ClientError::Refused { code, .. } if code == "unavailable"),
        "a 503, which the agent and clients retry: {refused:?}"
    );
    // Nothing of the refused write is stored, and the server is not read-only.
    assert_eq!(count(&client, "events"), 100);
    let ready = client.request("GET", "/ready", None);
    assert!(ready.is_ok(), "{ready:?}");

    drop(file);
    std::fs::remove_file(&filler).unwrap();
    append(&client, "events", 100, 500).unwrap();
    assert_eq!(count(&client, "events"), 600);
}

/// Bytes of the spool's log files (and any spare) in `spool`.
fn log_bytes(spool: &Path) -> u64 {
    std::fs::read_dir(spool.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

#[test]
fn an_agent_refuses_before_its_disk_is_full_and_gives_forwarded_space_back() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let reserve = 8 << 20;
    let agent = on_small_disk(
        dir.path(),
        48,
        &[
            "agent",
            "--upstream",
            &format!("127.0.0.1:{port}"),
            "--spool-dir",
            "{dir}/spool",
            "--http",
            "127.0.0.1:0",
            "--binary",
            "127.0.0.1:0",
            "--spool-min-free-bytes",
            &reserve.to_string(),
        ],
    );
    let client = HttpClient::new(&agent.http, None);
    client
        .create_stream("events", "ID:LONG,PAD:STRING")
        .unwrap();
    let spool = seen_by(&agent, dir.path()).join("spool");

    // The upstream is down: the spool grows until the agent refuses for its disk.
    let mut next = 0;
    let refused = loop {
        match append(&client, "events", next, 500) {
            Ok(()) => next += 500,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(&refused, ClientError::TryLater { message, .. } if message.contains("free")),
        "{refused:?}"
    );
    let free = fs_free(&spool);
    assert!(
        free > reserve / 2,
        "the agent stopped with {free} bytes free"
    );
    let spooled = log_bytes(&spool);
    assert!(spooled > 16 << 20, "{spooled}");

    // The upstream comes: everything is forwarded, and the spool's disk gets it back.
    let upstream_dir = tempfile::tempdir().unwrap();
    let server = upstream(upstream_dir.path(), port);
    let upstream = HttpClient::new(&server.http, None);
    let started = Instant::now();
    while log_bytes(&spool) > 1 << 20 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the spool still holds {} bytes",
            log_bytes(&spool)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(count(&upstream, "events"), next);
    append(&client, "events", next, 500).unwrap();
}

fn fs_free(path: &Path) -> u64 {
    tidemark_storage::fsutil::free_bytes(path).unwrap()
}

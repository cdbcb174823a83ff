//! The systems Tidemark is measured against, run for real on 127.0.0.1: how to find them, start
//! them on free ports in a scratch directory, and stop them (by the PID we started, never
//! anything else). A peer that is not installed or does not start is *skipped with its
//! reason* — never faked, never estimated. `peers/install.sh` installs them from this
//! machine's package registries.

pub mod influxdb;
pub mod kafka;
pub mod nats;
pub mod prometheus;
pub mod questdb;
pub mod redis;
pub mod syslog_ng;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The peers the harness knows.
pub const ALL: [&str; 5] = ["kafka", "questdb", "redis", "prometheus", "nats"];

/// Which peers to run: `all`, `none`, or a comma-separated list.
pub fn parse_selection(text: &str) -> Result<Vec<String>, String> {
    match text.trim() {
        "all" => return Ok(ALL.iter().map(|p| p.to_string()).collect()),
        "none" | "" => return Ok(Vec::new()),
        _ => {}
    }
    let mut chosen = Vec::new();
    for name in text.split(',').map(|n| n.trim().to_ascii_lowercase()) {
        if !ALL.contains(&name.as_str()) {
            return Err(format!(
                "unknown peer {name:?} (known: {}, all, none)",
                ALL.join(", ")
            ));
        }
        if !chosen.contains(&name) {
            chosen.push(name);
        }
    }
    Ok(chosen)
}

/// Why a peer did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{peer} skipped: {reason}")]
pub struct Skipped {
    pub peer: String,
    pub reason: String,
}

impl Skipped {
    pub fn new(peer: &str, reason: impl Into<String>) -> Skipped {
        Skipped {
            peer: peer.into(),
            reason: reason.into(),
        }
    }
}

/// Requests sent ahead of their answers, as the Redis and NATS adapters drive their peers:
/// the answers are collected every `per_round_trip` requests and once at the end, so that
/// a round trip carries as many events as a client with that buffer would send.
pub struct Pipeline {
    pending: usize,
    per_round_trip: usize,
}

impl Pipeline {
    pub fn new(per_round_trip: usize) -> Pipeline {
        Pipeline {
            pending: 0,
            per_round_trip: per_round_trip.max(1),
        }
    }

    /// Counts one request sent; when a round trip is full, `collect(n)` reads the answers
    /// of the `n` requests sent since the last collection.
    pub fn sent(
        &mut self,
        collect: impl FnOnce(usize) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        self.pending += 1;
        if self.pending == self.per_round_trip {
            self.finish(collect)
        } else {
            Ok(())
        }
    }

    /// Collects the answers still outstanding.
    pub fn finish(
        &mut self,
        collect: impl FnOnce(usize) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        collect(std::mem::take(&mut self.pending))
    }
}

/// The path of `program` on PATH (or in `.peers/bin` of the working directory), if any.
pub fn find_program(program: &str) -> Option<PathBuf> {
    let local = Path::new(".peers/bin").join(program);
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::iter::once(local)
        .chain(std::env::split_paths(&path).map(|dir| dir.join(program)))
        .chain(["/usr/sbin", "/usr/bin", "/usr/local/bin"].map(|d| Path::new(d).join(program)))
        .find(|candidate| candidate.is_file())
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until something accepts connections on `addr`.
pub fn wait_for_port(addr: SocketAddr, timeout: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < timeout {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A peer process this harness started; killed (by its PID) when dropped.
pub struct PeerProcess {
    name: String,
    child: Child,
}

impl PeerProcess {
    /// Starts `command` with its output in `log` and waits for `addr` to accept connections.
    pub fn start(
        name: &str,
        mut command: Command,
        log: &Path,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<PeerProcess, Skipped> {
        let out = std::fs::File::create(log)
            .map_err(|e| Skipped::new(name, format!("cannot create {}: {e}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(|e| Skipped::new(name, e.to_string()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| Skipped::new(name, format!("cannot start: {e}")))?;
        let mut process = PeerProcess {
            name: name.into(),
            child,
        };
        if !wait_for_port(addr, timeout) {
            let exited = process.child.try_wait().ok().flatten();
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let tail: String = tail.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
            return Err(Skipped::new(
                name,
                match exited {
                    Some(status) => format!("exited at start ({status}): {tail}"),
                    None => format!("did not listen on {addr} within {timeout:?}: {tail}"),
                },
            ));
        }
        Ok(process)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        if self.child.kill().is_err() {
            eprintln!("could not stop {} (pid {})", self.name, self.child.id());
        }
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections() {
        assert_eq!(parse_selection("all").unwrap().len(), 5);
        assert!(parse_selection("none").unwrap().is_empty());
        assert_eq!(
            parse_selection("redis, Kafka,redis").unwrap(),
            vec!["redis", "kafka"]
        );
        assert!(parse_selection("mysql").unwrap_err().contains("mysql"));
    }

    #[test]
    fn a_missing_program_is_a_skip_with_its_reason() {
        assert_eq!(find_program("surely-not-a-program-tidemark"), None);
        let dir = tempfile::tempdir().unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port().unwrap())
            .parse()
            .unwrap();
        let skipped = PeerProcess::start(
            "ghost",
            Command::new("/nonexistent/ghost"),
            &dir.path().join("log"),
            addr,
            Duration::from_millis(100),
        )
        .err()
        .unwrap();
        assert_eq!(skipped.peer, "ghost");
        assert!(skipped.reason.contains("cannot start"), "{skipped}");
        // A program that exits at once is reported with its exit.
        let skipped = PeerProcess::start(
            "quitter",
            Command::new("true"),
            &dir.path().join("log2"),
            addr,
            Duration::from_millis(300),
        )
        .err()
        .unwrap();
        assert!(
            skipped.reason.contains("exited") || skipped.reason.contains("did not listen"),
            "{skipped}"
        );
    }
}

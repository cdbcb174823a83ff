//! Kafka 4.1 (KRaft, one node) as a W1 peer, driven by Kafka's own `ProducerPerformance`
//! tool: records of the W1 payload size, batches of the same bytes as Tidemark's, `acks=all`.
//! The tool times from the first send to the last acknowledgement and reports records/s.
//! Durability: by default Kafka acknowledges from the page cache (the OS cache level);
//! `log.flush.interval.messages=1` makes the broker fsync every append before acknowledging
//! (Tidemark's level).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;

use super::{find_program, free_port, PeerProcess, Skipped};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    EveryAppend,
    OsCache,
}

impl Flush {
    pub fn name(self) -> &'static str {
        match self {
            Flush::EveryAppend => "flush-every-append",
            Flush::OsCache => "os-cache",
        }
    }
}

/// The jars that `peers/install.sh kafka` puts in `.peers/kafka/libs`.
pub fn find_libs() -> Option<PathBuf> {
    let libs = Path::new(".peers/kafka/libs");
    libs.join("kafka-tools-4.1.0.jar")
        .is_file()
        .then(|| libs.to_path_buf())
}

/// A single-node Kafka started for the benchmark.
pub struct Kafka {
    _process: PeerProcess,
    java: PathBuf,
    classpath: String,
    bootstrap: String,
}

impl Kafka {
    pub fn start(dir: &Path, flush: Flush) -> Result<Kafka, Skipped> {
        let skip = |reason: String| Skipped::new("kafka", reason);
        let libs = find_libs()
            .ok_or_else(|| skip("Kafka is not installed (peers/install.sh kafka)".into()))?;
        let java = find_program("java").ok_or_else(|| skip("no java on PATH".into()))?;
        let libs = std::fs::canonicalize(libs).map_err(|e| skip(e.to_string()))?;
        let classpath = format!("{}/*", libs.display());
        let (port, controller) = (
            free_port().map_err(|e| skip(e.to_string()))?,
            free_port().map_err(|e| skip(e.to_string()))?,
        );
        let data = dir.join("data");
        std::fs::create_dir_all(&data).map_err(|e| skip(e.to_string()))?;
        let mut properties = format!(
            "process.roles=broker,controller\nnode.id=1\n\
             controller.quorum.bootstrap.servers=127.0.0.1:{controller}\n\
             listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
             controller.listener.names=CONTROLLER\n\
             listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
             log.dirs={}\nnum.partitions=1\noffsets.topic.replication.factor=1\n\
             transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n",
            data.display()
        );
        if flush == Flush::EveryAppend {
            properties.push_str("log.flush.interval.messages=1\n");
        }
        let config = dir.join("server.properties");
        std::fs::write(&config, properties).map_err(|e| skip(e.to_string()))?;
        // A cluster id is 16 bytes in URL-safe base64; it only has to be unique here.
        let id: Vec<u8> = (0..16).map(|_| fastrand::u8(..)).collect();
        let cluster_id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id);
        let formatted = Command::new(&java)
            .args([
                "-cp",
                &classpath,
                "kafka.tools.StorageTool",
                "format",
                "-t",
                &cluster_id,
                "-c",
            ])
            .arg(&config)
            .arg("--standalone")
            .output()
            .map_err(|e| skip(format!("formatting the storage: {e}")))?;
        if !formatted.status.success() {
            return Err(skip(format!(
                "formatting the storage failed: {}",
                String::from_utf8_lossy(&formatted.stderr).trim()
            )));
        }
        let mut command = Command::new(&java);
        command
            .args(["-Xmx1g", "-cp", &classpath, "kafka.Kafka"])
            .arg(&config);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let process = PeerProcess::start(
            "kafka",
            command,
            &dir.join("kafka.log"),
            addr,
            Duration::from_secs(60),
        )?;
        Ok(Kafka {
            _process: process,
            java,
            classpath,
            bootstrap: addr.to_string(),
        })
    }

    /// Runs `ProducerPerformance` for `records` records of `record_size` bytes to a new
    /// `topic`; returns the tool's records per second.
    pub fn producer_performance(
        &self,
        topic: &str,
        records: usize,
        record_size: usize,
        batch_bytes: usize,
    ) -> Result<f64, String> {
        let output = Command::new(&self.java)
            .args([
                "-Xmx1g",
                "-cp",
                &self.classpath,
                "org.apache.kafka.tools.ProducerPerformance",
            ])
            .args(["--topic", topic, "--num-records", &records.to_string()])
            .args([
                "--record-size",
                &record_size.to_string(),
                "--throughput",
                "-1",
            ])
            .args([
                "--producer-props",
                &format!("bootstrap.servers={}", self.bootstrap),
                "acks=all",
            ])
            .arg(format!("batch.size={batch_bytes}"))
            .args([
                "linger.ms=10",
                &format!("buffer.memory={}", (batch_bytes * 8).max(32 << 20)),
            ])
            .output()
            .map_err(|e| format!("running ProducerPerformance: {e}"))?;
        let text = String::from_utf8_lossy(&output.stdout);
        parse_rate(&text).ok_or_else(|| {
            format!(
                "no result from ProducerPerformance: {} {}",
                text.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            )
        })
    }
}

/// The records/s of the summary line: `1000000 records sent, 333111.3 records/sec (...)`.
pub fn parse_rate(output: &str) -> Option<f64> {
    let line = output
        .lines()
        .rev()
        .find(|l| l.contains(" records sent, "))?;
    let rate = line.split(", ").nth(1)?.split(" records/sec").next()?;
    rate.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_tools_summary_line() {
        let output = "12 records sent, 2.4 records/sec\n1000000 records sent, 333111.3 records/sec (6.67 MB/sec), 21.97 ms avg latency, 723.00 ms max latency.\n";
        assert_eq!(parse_rate(output), Some(333_111.3));
        assert_eq!(parse_rate("nothing"), None);
    }
}

//! Kafka 4.1 (KRaft, one node) as a W1 and W3 peer, driven by Kafka's own
//! `ProducerPerformance` tool with `acks=all`: W1 sends records of the W1 payload size in
//! batches of the same bytes as Tidemark's; W3 sends 64 KiB records to topics of 1, 100 and
//! 2000 partitions at a target rate. The tool times from the first send to the last
//! acknowledgement and reports records/s and latency percentiles.
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
    process: PeerProcess,
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
            process,
            java,
            classpath,
            bootstrap: addr.to_string(),
        })
    }

    /// The broker's process, for its CPU and memory.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// `host:port` of the broker's PLAINTEXT listener, for clients the harness runs.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The `java` that runs the broker, and the classpath of Kafka's jars (`<libs>/*`), to
    /// run clients with the same ones.
    pub fn java(&self) -> (&Path, &str) {
        (&self.java, &self.classpath)
    }

    /// Creates `topic` with `partitions` partitions (replication factor 1).
    pub fn create_topic(&self, topic: &str, partitions: usize) -> Result<(), String> {
        self.topic_command(&[
            "--create",
            "--topic",
            topic,
            "--partitions",
            &partitions.to_string(),
            "--replication-factor",
            "1",
        ])
    }

    /// Deletes `topic` and its data (the broker removes the files shortly after).
    pub fn delete_topic(&self, topic: &str) -> Result<(), String> {
        self.topic_command(&["--delete", "--topic", topic])
    }

    fn topic_command(&self, args: &[&str]) -> Result<(), String> {
        let output = Command::new(&self.java)
            .args([
                "-cp",
                &self.classpath,
                "org.apache.kafka.tools.TopicCommand",
                "--bootstrap-server",
                &self.bootstrap,
            ])
            .args(args)
            .output()
            .map_err(|e| format!("running TopicCommand: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "TopicCommand {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(())
    }

    /// Runs `ProducerPerformance` once; returns its summary line.
    pub fn producer_performance(&self, run: &ProducerRun<'_>) -> Result<ProducerSummary, String> {
        let throughput = run
            .records_per_second
            .map_or("-1".to_string(), |r| format!("{r:.3}"));
        let output = Command::new(&self.java)
            .args([
                "-Xmx1g",
                "-cp",
                &self.classpath,
                "org.apache.kafka.tools.ProducerPerformance",
            ])
            .args([
                "--topic",
                run.topic,
                "--num-records",
                &run.records.to_string(),
            ])
            .args(["--record-size", &run.record_size.to_string()])
            .args(["--throughput", &throughput])
            .arg("--producer-props")
            .args(producer_props(&self.bootstrap, run))
            .output()
            .map_err(|e| format!("running ProducerPerformance: {e}"))?;
        let text = String::from_utf8_lossy(&output.stdout);
        parse_summary(&text).ok_or_else(|| {
            format!(
                "no result from ProducerPerformance: {} {}",
                text.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            )
        })
    }
}

/// The producer's properties for `run`: `acks=all` always; batching as `run.batching` says.
pub fn producer_props(bootstrap: &str, run: &ProducerRun<'_>) -> Vec<String> {
    let mut props = vec![format!("bootstrap.servers={bootstrap}"), "acks=all".into()];
    if let Batching::Bytes {
        batch_bytes,
        linger_ms,
    } = run.batching
    {
        props.push(format!("batch.size={batch_bytes}"));
        props.push(format!("linger.ms={linger_ms}"));
        props.push(format!("buffer.memory={}", (batch_bytes * 8).max(32 << 20)));
        props.push(format!(
            "max.request.size={}",
            (batch_bytes.max(run.record_size) * 2).max(1 << 20)
        ));
    }
    props
}

/// How the producer batches records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    /// Kafka's producer defaults (4.x: `batch.size` 16 KiB, `linger.ms` 5), as its users
    /// and its published figures run it.
    ToolDefaults,
    /// Batches of `batch_bytes` (Tidemark's client buffer, for a like-for-like run).
    Bytes { batch_bytes: usize, linger_ms: u32 },
}

/// One `ProducerPerformance` run.
#[derive(Debug, Clone)]
pub struct ProducerRun<'a> {
    pub topic: &'a str,
    pub records: usize,
    pub record_size: usize,
    pub batching: Batching,
    /// The tool's `--throughput` cap; `None` sends as fast as it can.
    pub records_per_second: Option<f64>,
}

/// The tool's final summary line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProducerSummary {
    pub records_per_second: f64,
    pub avg_ms: f64,
    pub max_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
}

/// Reads the summary line: `1000000 records sent, 333111.3 records/sec (6.67 MB/sec), 21.97 ms
/// avg latency, 723.00 ms max latency, 5 ms 50th, 80 ms 95th, 600 ms 99th, 700 ms 99.9th.`
pub fn parse_summary(output: &str) -> Option<ProducerSummary> {
    let line = output
        .lines()
        .rev()
        .find(|l| l.contains(" records sent, ") && l.contains("99.9th"))?;
    let parts: Vec<&str> = line.trim_end_matches('.').split(", ").collect();
    let number = |suffix: &str| -> Option<f64> {
        let part = parts.iter().find(|p| p.ends_with(suffix))?;
        part.split_whitespace().next()?.parse().ok()
    };
    let rate = parts
        .get(1)?
        .split(" records/sec")
        .next()?
        .trim()
        .parse()
        .ok()?;
    Some(ProducerSummary {
        records_per_second: rate,
        avg_ms: number("ms avg latency")?,
        max_ms: number("ms max latency")?,
        p50_ms: number("ms 50th")?,
        p95_ms: number("ms 95th")?,
        p99_ms: number("ms 99th")?,
        p999_ms: number("ms 99.9th")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batching_sets_the_producer_props_or_leaves_the_defaults() {
        let run = |batching| ProducerRun {
            topic: "t",
            records: 10,
            record_size: 19,
            batching,
            records_per_second: None,
        };
        let defaults = producer_props("127.0.0.1:9", &run(Batching::ToolDefaults));
        assert_eq!(defaults, ["bootstrap.servers=127.0.0.1:9", "acks=all"]);
        let sized = producer_props(
            "127.0.0.1:9",
            &run(Batching::Bytes {
                batch_bytes: 1 << 20,
                linger_ms: 10,
            }),
        );
        for prop in ["acks=all", "batch.size=1048576", "linger.ms=10"] {
            assert!(sized.iter().any(|p| p == prop), "{prop} in {sized:?}");
        }
        // The buffer holds several batches, a request at least one.
        assert!(sized.iter().any(|p| p == "buffer.memory=33554432"));
        assert!(sized.iter().any(|p| p == "max.request.size=2097152"));
    }

    #[test]
    fn reads_the_tools_summary_line() {
        let output = "12 records sent, 2.4 records/sec (0.00 MB/sec), 3.0 ms avg latency, 9.0 ms max latency.\n\
            1000000 records sent, 333111.3 records/sec (6.67 MB/sec), 21.97 ms avg latency, 723.00 ms max latency, 5 ms 50th, 80 ms 95th, 600 ms 99th, 700 ms 99.9th.\n";
        assert_eq!(
            parse_summary(output),
            Some(ProducerSummary {
                records_per_second: 333_111.3,
                avg_ms: 21.97,
                max_ms: 723.0,
                p50_ms: 5.0,
                p95_ms: 80.0,
                p99_ms: 600.0,
                p999_ms: 700.0,
            })
        );
        assert_eq!(parse_summary("nothing"), None);
        // The progress lines lack percentiles: not mistaken for the summary.
        assert_eq!(parse_summary(output.lines().next().unwrap()), None);
    }
}

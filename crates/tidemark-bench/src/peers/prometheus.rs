//! Prometheus 2.x as a W2 peer: started with its remote-write receiver on (points arrive as
//! remote_write requests: protobuf, snappy-compressed) and its admin API (a TSDB snapshot
//! writes what it holds as a compressed block, whose size gives bits per point). Queries
//! go to the HTTP API's `query_range`.
//!
//! Durability: Prometheus appends to its write-ahead log without an fsync per request (the
//! OS cache), so a crash may lose the last seconds.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value as Json;

use super::{find_program, free_port, PeerProcess, Skipped};

use tidemark_protocol::prometheus as prompb;

/// One sample of each of `series` of one host at `unix_ms`, as a snappy-compressed
/// remote-write body.
pub fn write_request(host: &str, series: &[String], values: &[f64], unix_ms: i64) -> Vec<u8> {
    let request = prompb::WriteRequest {
        timeseries: series
            .iter()
            .zip(values)
            .map(|(name, &value)| prompb::TimeSeries {
                labels: vec![
                    prompb::Label {
                        name: "__name__".into(),
                        value: name.clone(),
                    },
                    prompb::Label {
                        name: "host".into(),
                        value: host.into(),
                    },
                ],
                samples: vec![prompb::Sample {
                    value,
                    timestamp: unix_ms,
                }],
                exemplars: vec![],
                histograms: vec![],
            })
            .collect(),
        metadata: vec![],
    };
    prompb::encode(&request)
}

/// A remote-write request that was not stored.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RemoteWriteError {
    /// Pushed back (5xx with a `Retry-After`, in seconds): send it again after that.
    #[error("remote write pushed back ({status}): retry after {retry_after:?}")]
    PushedBack { status: u16, retry_after: Duration },
    #[error("remote write answered {status}: {message}")]
    Refused { status: u16, message: String },
    #[error("remote write: {0}")]
    Transport(String),
}

/// Sends one remote-write body to `base`/api/v1/write (Prometheus or Tidemark), with the
/// headers remote write 1.0 sends.
pub fn remote_write(
    agent: &ureq::Agent,
    base: &str,
    token: Option<&str>,
    body: &[u8],
) -> Result<(), RemoteWriteError> {
    let mut request = agent
        .post(format!("{base}/api/v1/write"))
        .header("Content-Type", "application/x-protobuf")
        .header("Content-Encoding", "snappy")
        .header("X-Prometheus-Remote-Write-Version", "0.1.0");
    if let Some(token) = token {
        request = request.header("Authorization", format!("Bearer {token}"));
    }
    let mut response = request
        .send(body)
        .map_err(|e| RemoteWriteError::Transport(e.to_string()))?;
    let status = response.status().as_u16();
    if (200..300).contains(&status) {
        return Ok(());
    }
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if let (500..=599, Some(seconds)) = (status, retry_after) {
        return Err(RemoteWriteError::PushedBack {
            status,
            retry_after: Duration::from_secs(seconds),
        });
    }
    let message = response.body_mut().read_to_string().unwrap_or_default();
    Err(RemoteWriteError::Refused {
        status,
        message: message.trim().to_string(),
    })
}

/// A prometheus server started for the benchmark.
pub struct Prometheus {
    process: PeerProcess,
    base: String,
    data: PathBuf,
    agent: ureq::Agent,
}

impl Prometheus {
    /// Starts prometheus on a free port with its TSDB in `dir/data`.
    pub fn start(dir: &Path) -> Result<Prometheus, Skipped> {
        let skipped = |reason: String| Skipped::new("prometheus", reason);
        let program = find_program("prometheus").ok_or_else(|| {
            skipped("prometheus is not installed (peers/install.sh prometheus)".into())
        })?;
        let port = free_port().map_err(|e| skipped(e.to_string()))?;
        let data = dir.join("data");
        std::fs::create_dir_all(&data).map_err(|e| skipped(e.to_string()))?;
        let config = dir.join("prometheus.yml");
        // No scrape targets: every point arrives by remote write.
        std::fs::write(&config, "global:\n  scrape_interval: 1m\n")
            .map_err(|e| skipped(e.to_string()))?;
        let mut command = Command::new(program);
        command
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .args([
                "--web.enable-remote-write-receiver",
                "--web.enable-admin-api",
            ])
            // Keep everything the run writes (the default 15 days would too; stated so).
            .arg("--storage.tsdb.retention.time=30d");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let process = PeerProcess::start(
            "prometheus",
            command,
            &dir.join("prometheus.log"),
            addr,
            Duration::from_secs(30),
        )?;
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        let prometheus = Prometheus {
            process,
            base: format!("http://127.0.0.1:{port}"),
            data,
            agent,
        };
        prometheus.wait_ready().map_err(skipped)?;
        Ok(prometheus)
    }

    fn wait_ready(&self) -> Result<(), String> {
        for _ in 0..300 {
            let ready = self.agent.get(format!("{}/-/ready", self.base)).call();
            if ready.is_ok_and(|r| r.status().as_u16() == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err("not ready within 30 s".into())
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// A new connection (HTTP agent) for one writer thread.
    pub fn agent(&self) -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into()
    }

    /// Its HTTP API's base URL (`http://127.0.0.1:PORT`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Runs a PromQL range query; answers the most points any series came back with.
    pub fn query_range(
        &self,
        promql: &str,
        start_s: i64,
        end_s: i64,
        step_s: u64,
    ) -> Result<usize, String> {
        let mut response = self
            .agent
            .get(format!("{}/api/v1/query_range", self.base))
            .query("query", promql)
            .query("start", start_s.to_string())
            .query("end", end_s.to_string())
            .query("step", step_s.to_string())
            .call()
            .map_err(|e| format!("query: {e}"))?;
        let text = response
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| format!("query answer: {e}"))?;
        let answer: Json =
            serde_json::from_str(&text).map_err(|e| format!("query answer is not JSON: {e}"))?;
        if answer["status"] != "success" {
            return Err(format!("query failed: {}", text.trim()));
        }
        let result = answer["data"]["result"]
            .as_array()
            .ok_or("query answer without result")?;
        Ok(result
            .iter()
            .filter_map(|series| series["values"].as_array().map(Vec::len))
            .max()
            .unwrap_or(0))
    }

    /// Snapshots the TSDB (the head written out as a compressed block) and answers the
    /// snapshot's size in bytes.
    pub fn snapshot_bytes(&self) -> Result<u64, String> {
        let mut response = self
            .agent
            .post(format!("{}/api/v1/admin/tsdb/snapshot", self.base))
            .send_empty()
            .map_err(|e| format!("snapshot: {e}"))?;
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let answer: Json =
            serde_json::from_str(&text).map_err(|e| format!("snapshot answer: {e}: {text}"))?;
        let name = answer["data"]["name"]
            .as_str()
            .ok_or_else(|| format!("snapshot failed: {}", text.trim()))?;
        dir_bytes(&self.data.join("snapshots").join(name))
            .map_err(|e| format!("snapshot size: {e}"))
    }
}

/// What `promtool tsdb bench write` measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromtoolWrite {
    pub samples: u64,
    pub samples_per_second: f64,
}

/// The label-set file `promtool tsdb bench write` reads: one `{"name":"value",..}` per line.
/// Its reader splits on `,` and `:` without unquoting, so names and values must hold neither
/// (the recorder's names are `[a-z0-9_]`, hosts `hostNNN`).
pub fn promtool_labels<'a>(series: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    series
        .into_iter()
        .map(|(host, name)| format!("{{\"__name__\":\"{name}\",\"host\":\"{host}\"}}\n"))
        .collect()
}

/// Runs Prometheus's own write benchmark, `promtool tsdb bench write`, over `labels` (from
/// [`promtool_labels`]): each label set gets `scrapes` samples, appended to a TSDB inside
/// the promtool process — no HTTP, no remote-write decoding, no fsync per append — so it is
/// Prometheus's ingest ceiling on this machine. The values are the tool's own counters
/// (+1000 a scrape, 30 s apart), not the recording's. The tool scrapes in steps of 100:
/// `scrapes` is rounded up to one.
pub fn promtool_bench_write(
    dir: &Path,
    labels: &str,
    scrapes: u32,
) -> Result<PromtoolWrite, Skipped> {
    let skipped = |reason: String| Skipped::new("promtool", reason);
    let program = find_program("promtool")
        .ok_or_else(|| skipped("promtool is not installed (peers/install.sh prometheus)".into()))?;
    std::fs::create_dir_all(dir).map_err(|e| skipped(e.to_string()))?;
    let labels_file = dir.join("series.json");
    std::fs::write(&labels_file, labels).map_err(|e| skipped(e.to_string()))?;
    let output = Command::new(program)
        .args(["tsdb", "bench", "write"])
        .arg(format!("--out={}", dir.join("out").display()))
        .arg(format!("--metrics={}", labels.lines().count()))
        .arg(format!("--scrapes={}", scrapes.div_ceil(100).max(1) * 100))
        .arg(&labels_file)
        .output()
        .map_err(|e| skipped(format!("cannot run promtool: {e}")))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let result = parse_promtool_write(&stdout).ok_or_else(|| {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        skipped(format!(
            "no result from promtool ({}): {} {}",
            output.status,
            stdout.trim(),
            tail.join(" | ")
        ))
    });
    std::fs::remove_dir_all(dir.join("out")).ok();
    result
}

/// Reads promtool's ` > total samples: N` and ` > samples/sec: X` lines.
pub fn parse_promtool_write(output: &str) -> Option<PromtoolWrite> {
    let value = |key: &str| {
        output
            .lines()
            .find_map(|line| line.trim().strip_prefix("> ")?.strip_prefix(key))
            .map(str::trim)
    };
    Some(PromtoolWrite {
        samples: value("total samples:")?.parse().ok()?,
        samples_per_second: value("samples/sec:")?.parse().ok()?,
    })
}

/// The bytes of every file under `dir`.
pub fn dir_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            total += dir_bytes(&entry.path())?;
        } else if kind.is_file() {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_request_decodes_back_to_the_samples() {
        let series = vec!["cpu_user".to_string(), "mem_memfree".to_string()];
        let body = write_request("host007", &series, &[1.5, 42.0], 1_700_000_000_000);
        let request = prompb::decode_write(&body, 1 << 20).expect("a remote-write body");
        assert_eq!(request.timeseries.len(), 2);
        let second = &request.timeseries[1];
        let labels: Vec<(&str, &str)> = second
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(labels, [("__name__", "mem_memfree"), ("host", "host007")]);
        assert_eq!(
            second.samples,
            [prompb::Sample {
                value: 42.0,
                timestamp: 1_700_000_000_000
            }]
        );
    }

    #[test]
    fn promtool_labels_are_one_label_set_a_line() {
        let text = promtool_labels([("host000", "cpu_user"), ("host001", "mem_free")]);
        assert_eq!(
            text,
            "{\"__name__\":\"cpu_user\",\"host\":\"host000\"}\n\
             {\"__name__\":\"mem_free\",\"host\":\"host001\"}\n"
        );
        // Each line is JSON, as the tool's format says.
        for line in text.lines() {
            let labels: Json = serde_json::from_str(line).expect("json");
            assert!(labels["__name__"].is_string() && labels["host"].is_string());
        }
    }

    #[test]
    fn reads_promtools_figures() {
        let output = ">> start stage=readData\n>> completed stage=readData duration=53.452µs\n\
            >> start stage=ingestScrapes\ningestion completed\n\
            >> completed stage=ingestScrapes duration=27.228148ms\n > total samples: 400\n \
            > samples/sec: 14678.120738184709\n>> start stage=stopStorage\n";
        assert_eq!(
            parse_promtool_write(output),
            Some(PromtoolWrite {
                samples: 400,
                samples_per_second: 14678.120738184709
            })
        );
        // A run that died before its figures has none.
        assert_eq!(
            parse_promtool_write(">> start stage=ingestScrapes\npanic: boom\n"),
            None
        );
        assert_eq!(
            parse_promtool_write(" > total samples: many\n > samples/sec: 1\n"),
            None
        );
    }

    /// With promtool installed, every label set gets every scrape (rounded up to 100);
    /// without it, a skip that says how to install it.
    #[test]
    fn promtool_writes_every_series_or_is_skipped_with_its_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        let labels = promtool_labels([("host000", "cpu_user"), ("host000", "cpu_idle")]);
        match promtool_bench_write(dir.path(), &labels, 30) {
            Ok(write) => {
                assert_eq!(write.samples, 2 * 100);
                assert!(write.samples_per_second > 0.0);
                assert!(!dir.path().join("out").exists(), "its TSDB is removed");
            }
            Err(skipped) => {
                assert!(find_program("promtool").is_none(), "{skipped}");
                assert!(skipped.reason.contains("install.sh"), "{skipped}");
            }
        }
    }

    #[test]
    fn dir_bytes_counts_nested_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a"), [0u8; 10]).expect("write");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub/b"), [0u8; 5]).expect("write");
        assert_eq!(dir_bytes(dir.path()).expect("size"), 15);
    }
}

//! W4 `pipeline` (`../shared/workloads.md`): producer threads send 3,000-byte messages
//! through a local `tidemark agent` to an upstream — one `tidemark serve`, or a cluster of
//! them ([`Upstream`]) — each its own process.
//! A step runs N producers to the end, waits until the agent has forwarded everything, then
//! reads the upstream back and checks every producer's sequence numbers: lost and
//! duplicated messages are counted, never assumed. With an outage the upstream (a cluster's
//! leader) is killed (SIGKILL) a third of the way through and started again after the given
//! time.
//!
//! Latencies: produce → agent acknowledgement per request (a request carries
//! `batch_messages` messages), and produce → readable upstream for producer 0's messages,
//! found by polling the upstream's `max(SEQ)` every 10 ms (so it is 10 ms coarse).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_client::{BinaryClient, ClientError, HttpClient};
use tidemark_core::{BatchBuilder, EventBatch, Schema, Value};

use crate::latency::{Latencies, LatencySummary};
use crate::peers::syslog_ng::{CountingSink, SyslogNg};
use crate::peers::{free_port, PeerProcess};
use crate::process::{Sampler, Usage};

pub const STREAM: &str = "pipeline";
const SCHEMA: &str = "PRODUCER:INTEGER,SEQ:LONG,PAYLOAD:BYTES";

#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// The `tidemark` executable whose `serve` and `agent` are measured.
    pub program: PathBuf,
    /// Where each step's data directories and logs go (cleared per step).
    pub work_dir: PathBuf,
    pub messages_per_producer: u64,
    /// Bytes of random payload per message (plus its producer and sequence number).
    pub message_bytes: usize,
    /// Messages per produce request.
    pub batch_messages: u64,
    /// Where upstreams keep their data (a directory per step under it); `None`: in the
    /// step's directory, on the agent's disk.
    pub upstream_dir: Option<PathBuf>,
}

impl PipelineConfig {
    /// The directory of a step's upstream (its data in `upstream/`, its log next to it):
    /// the step's own, or one of the same name under `upstream_dir`, made empty.
    fn upstream_root(&self, step_dir: &Path) -> Result<PathBuf, String> {
        let Some(root) = &self.upstream_dir else {
            return Ok(step_dir.to_path_buf());
        };
        let dir = root.join(step_dir.file_name().unwrap_or_default());
        fresh_dir(&dir)?;
        Ok(dir)
    }
}

/// What one step measured.
#[derive(Debug, Clone)]
pub struct StepReport {
    pub producers: usize,
    pub outage: Option<Duration>,
    pub messages: u64,
    /// From the first request until every producer had its last message acknowledged.
    pub produce_seconds: f64,
    /// From then until the agent had forwarded everything.
    pub drain_seconds: f64,
    pub messages_per_second: f64,
    /// Payload megabytes (10^6) per second produced.
    pub megabytes_per_second: f64,
    /// The most the agent's spool held not yet forwarded (sampled every 50 ms).
    pub spool_peak_bytes: u64,
    /// Requests the agent refused for its spool's size (sent again until taken).
    pub refused_requests: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub ack: Option<LatencySummary>,
    pub readable: Option<LatencySummary>,
    /// The agent's CPU (cores) and peak RSS over the step, drain included.
    pub agent: Option<Usage>,
}

impl StepReport {
    /// Whether the agent's spool held more than one forward's worth at some point: the
    /// upstream fell behind (or was down) and the backlog grew.
    pub fn spooled(&self) -> bool {
        self.spool_peak_bytes > 8 << 20
    }

    /// A step's timing and rates, its other figures empty.
    fn timed(
        config: &PipelineConfig,
        producers: usize,
        outage: Option<Duration>,
        produce_seconds: f64,
        drain_seconds: f64,
    ) -> StepReport {
        let messages = config.messages_per_producer * producers as u64;
        let payload_bytes = messages as f64 * config.message_bytes as f64;
        StepReport {
            producers,
            outage,
            messages,
            produce_seconds,
            drain_seconds,
            messages_per_second: messages as f64 / produce_seconds,
            megabytes_per_second: payload_bytes / produce_seconds / 1e6,
            spool_peak_bytes: 0,
            refused_requests: 0,
            lost: 0,
            duplicated: 0,
            ack: None,
            readable: None,
            agent: None,
        }
    }

    /// Payload megabytes per second from the first message produced until the last was
    /// forwarded: what reached the upstream, not only the agent.
    pub fn delivered_megabytes_per_second(&self) -> f64 {
        self.megabytes_per_second * self.produce_seconds
            / (self.produce_seconds + self.drain_seconds)
    }
}

/// Where the agent forwards in a step, started fresh for it.
pub trait Upstream: Send {
    /// The binary addresses the agent is given (every node of a cluster).
    fn binary_addrs(&self) -> Vec<String>;
    /// An HTTP URL that reads what has been committed (a cluster's leader).
    fn http_url(&self) -> Result<String, String>;
    /// Kills (SIGKILL) the process the agent writes to: the server, a cluster's leader.
    fn kill(&mut self) -> Result<(), String>;
    /// Starts again what [`Upstream::kill`] killed, on its data.
    fn restart(&mut self) -> Result<(), String>;
}

/// Starts a step's upstream with its data under the directory given.
pub type StartUpstream = dyn Fn(&Path) -> Result<Box<dyn Upstream>, String> + Sync;

/// One `tidemark serve`.
pub struct ServerUpstream {
    config: PipelineConfig,
    dir: PathBuf,
    http: u16,
    binary: u16,
    process: Option<PeerProcess>,
}

impl ServerUpstream {
    pub fn start(config: &PipelineConfig, dir: &Path) -> Result<Box<dyn Upstream>, String> {
        let port = || free_port().map_err(|e| format!("no free port: {e}"));
        let mut server = ServerUpstream {
            config: config.clone(),
            dir: dir.to_path_buf(),
            http: port()?,
            binary: port()?,
            process: None,
        };
        server.restart()?;
        Ok(Box::new(server))
    }
}

impl Upstream for ServerUpstream {
    fn binary_addrs(&self) -> Vec<String> {
        vec![format!("127.0.0.1:{}", self.binary)]
    }

    fn http_url(&self) -> Result<String, String> {
        Ok(format!("http://127.0.0.1:{}", self.http))
    }

    fn kill(&mut self) -> Result<(), String> {
        drop(self.process.take()); // SIGKILL
        Ok(())
    }

    fn restart(&mut self) -> Result<(), String> {
        assert!(self.process.is_none(), "the server is running already");
        self.process = Some(start_server(
            &self.config,
            &self.dir,
            self.http,
            self.binary,
        )?);
        Ok(())
    }
}

/// Runs one step: `producers` threads through a fresh agent to a fresh upstream.
pub fn run_step(
    config: &PipelineConfig,
    producers: usize,
    outage: Option<Duration>,
    start_upstream: &StartUpstream,
) -> Result<StepReport, String> {
    assert!(producers > 0 && config.batch_messages > 0);
    let dir = config.work_dir.join(format!("producers-{producers}"));
    fresh_dir(&dir)?;
    let ports = Ports::free()?;
    let upstream_root = config.upstream_root(&dir)?;
    let upstream = start_upstream(&upstream_root.join("upstream"))?;
    let agent = start_agent(config, &dir, &ports, &upstream.binary_addrs())?;
    let upstream = Arc::new(Mutex::new(upstream));
    let agent_http = format!("http://127.0.0.1:{}", ports.agent_http);
    let upstream_http =
        || -> Result<String, String> { upstream.lock().map_err(|e| e.to_string())?.http_url() };
    HttpClient::new(&agent_http, None)
        .create_stream(STREAM, SCHEMA)
        .map_err(|e| format!("creating the stream through the agent: {e}"))?;

    let sampler = Sampler::start(agent.pid());
    let stop_watching = Arc::new(AtomicBool::new(false));
    let spool_peak = Arc::new(AtomicU64::new(0));
    let watcher = watch_spool(&agent_http, stop_watching.clone(), spool_peak.clone());
    let produced: Arc<Mutex<Vec<Produced>>> = Arc::default();
    let prober = probe_readable(&upstream_http()?, produced.clone(), stop_watching.clone());
    let acked = Arc::new(AtomicU64::new(0));
    let total = config.messages_per_producer * producers as u64;
    let outage_thread = outage.map(|down_for| {
        let (upstream, acked) = (upstream.clone(), acked.clone());
        std::thread::spawn(move || -> Result<(), String> {
            while acked.load(Ordering::Relaxed) < total / 3 {
                std::thread::sleep(Duration::from_millis(5));
            }
            upstream.lock().map_err(|e| e.to_string())?.kill()?;
            std::thread::sleep(down_for);
            upstream.lock().map_err(|e| e.to_string())?.restart()
        })
    });

    let started = Instant::now();
    let agent_binary = SocketAddr::from(([127, 0, 0, 1], ports.agent_binary));
    let outcomes: Vec<Result<(Latencies, u64), String>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..producers)
            .map(|p| {
                let (acked, produced) = (&acked, &produced);
                s.spawn(move || produce(config, agent_binary, p as i32, acked, produced))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a producer panicked".into()))
            })
            .collect()
    });
    let produce_seconds = started.elapsed().as_secs_f64();
    let mut ack = Latencies::new();
    let mut refused_requests = 0;
    for outcome in outcomes {
        let (latencies, refused) = outcome?;
        ack.merge(&latencies);
        refused_requests += refused;
    }
    // The drain counts from the last acknowledgement: an upstream still down then is part
    // of the time it takes to deliver.
    let drained_at = Instant::now();
    if let Some(thread) = outage_thread {
        thread.join().map_err(|_| "the outage thread panicked")??;
    }
    wait_until_forwarded(&agent_http, Duration::from_secs(600))?;
    let drain_seconds = drained_at.elapsed().as_secs_f64();
    stop_watching.store(true, Ordering::Relaxed);
    let agent_usage = sampler.finish();
    let readable = prober
        .join()
        .map_err(|_| "the readability prober panicked")?;
    let _ = watcher.join();
    let (lost, duplicated) =
        count_lost_and_duplicated(&upstream_http()?, producers, config.messages_per_producer)?;
    drop(agent);
    drop(upstream);
    finish_step_dir(&[&dir, &upstream_root], lost, duplicated);
    Ok(StepReport {
        spool_peak_bytes: spool_peak.load(Ordering::Relaxed),
        refused_requests,
        lost,
        duplicated,
        ack: ack.summary(),
        readable: readable.summary(),
        agent: agent_usage,
        ..StepReport::timed(config, producers, outage, produce_seconds, drain_seconds)
    })
}

/// Where syslog-ng forwards in a W4 step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyslogTarget {
    /// A counting HTTP sink in the harness: syslog-ng's forwarding alone.
    CountingSink,
    /// `tidemark serve`'s InfluxDB line-protocol route: the same durable store the agent
    /// forwards to, so the two pipelines do the same work end to end.
    Tidemark,
}

impl SyslogTarget {
    pub fn name(self) -> &'static str {
        match self {
            SyslogTarget::CountingSink => "syslog-ng → sink",
            SyslogTarget::Tidemark => "syslog-ng → tidemark",
        }
    }
}

/// The same step through syslog-ng: producers write lines to its TCP source, and it
/// forwards them through its reliable disk buffer to `target`. The outage is the target
/// unavailable for its duration (the sink answering 503, or the server killed with SIGKILL
/// and started again). There is no acknowledgement to producers (syslog over TCP has
/// none), so `ack` is `None`; `agent` is syslog-ng's CPU and RSS, and the spool peak its
/// disk buffer's size.
pub fn run_syslog_ng_step(
    config: &PipelineConfig,
    producers: usize,
    outage: Option<Duration>,
    target: SyslogTarget,
) -> Result<StepReport, String> {
    let dir = config.work_dir.join(format!(
        "syslog-ng-{}-{producers}",
        match target {
            SyslogTarget::CountingSink => "sink",
            SyslogTarget::Tidemark => "tidemark",
        }
    ));
    fresh_dir(&dir)?;
    let upstream_root = config.upstream_root(&dir)?;
    let epoch = Instant::now();
    let ports = Ports::free()?;
    let upstream_http = format!("http://127.0.0.1:{}", ports.upstream_http);
    let (sink, upstream, url) = match target {
        SyslogTarget::CountingSink => {
            let sink = CountingSink::start(producers, config.messages_per_producer, epoch)
                .map_err(|e| format!("the counting sink: {e}"))?;
            let url = format!("http://{}/", sink.addr);
            (Some(Arc::new(sink)), None, url)
        }
        SyslogTarget::Tidemark => {
            let upstream = start_upstream(config, &upstream_root, &ports)?;
            let url = format!("{upstream_http}/write?db=w4&precision=ns");
            (None, Some(upstream), url)
        }
    };
    let upstream = Arc::new(Mutex::new(upstream));
    let syslog = SyslogNg::start(&dir, &url).map_err(|e| e.to_string())?;
    let sampler = Sampler::start(syslog.pid());
    let stop_watching = Arc::new(AtomicBool::new(false));
    let buffer_peak = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (dir, stop, peak) = (
            dir.join("disk-buffer"),
            stop_watching.clone(),
            buffer_peak.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(dir_bytes(&dir), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let produced: Arc<Mutex<Vec<Produced>>> = Arc::default();
    let prober = (target == SyslogTarget::Tidemark)
        .then(|| probe_readable(&upstream_http, produced.clone(), stop_watching.clone()));
    let sent = Arc::new(AtomicU64::new(0));
    let total = config.messages_per_producer * producers as u64;
    let outage_thread = outage.map(|down_for| {
        let (config, upstream_root, sink, upstream, sent) = (
            config.clone(),
            upstream_root.clone(),
            sink.clone(),
            upstream.clone(),
            sent.clone(),
        );
        std::thread::spawn(move || -> Result<(), String> {
            while sent.load(Ordering::Relaxed) < total / 3 {
                std::thread::sleep(Duration::from_millis(5));
            }
            if let Some(sink) = &sink {
                sink.set_down(true);
                std::thread::sleep(down_for);
                sink.set_down(false);
                return Ok(());
            }
            drop(upstream.lock().map_err(|e| e.to_string())?.take()); // SIGKILL
            std::thread::sleep(down_for);
            let restarted = start_upstream(&config, &upstream_root, &ports)?;
            *upstream.lock().map_err(|e| e.to_string())? = Some(restarted);
            Ok(())
        })
    });
    let started = Instant::now();
    let outcomes: Vec<Result<(), String>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..producers)
            .map(|p| {
                let (sent, produced) = (&sent, &produced);
                let line = Line {
                    producer: p,
                    target,
                    epoch,
                };
                s.spawn(move || produce_lines(config, syslog.addr, line, sent, produced))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a producer panicked".into()))
            })
            .collect()
    });
    let produce_seconds = started.elapsed().as_secs_f64();
    outcomes.into_iter().collect::<Result<Vec<()>, String>>()?;
    // The drain counts from the last acknowledgement: an upstream still down then is part
    // of the time it takes to deliver.
    let drained_at = Instant::now();
    if let Some(thread) = outage_thread {
        thread.join().map_err(|_| "the outage thread panicked")??;
    }
    let arrived = || match &sink {
        Some(sink) => sink.distinct(),
        None => stored_messages(&upstream_http).unwrap_or(0),
    };
    // Until every message arrived, or nothing more arrives for 30 s.
    let (mut last, mut progressed) = (arrived(), Instant::now());
    while last < total && progressed.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
        let now = arrived();
        if now > last {
            (last, progressed) = (now, Instant::now());
        }
    }
    let drain_seconds = drained_at.elapsed().as_secs_f64();
    stop_watching.store(true, Ordering::Relaxed);
    let usage = sampler.finish();
    let _ = watcher.join();
    let (lost, duplicated, readable) = match (&sink, prober) {
        (Some(sink), _) => {
            let (lost, duplicated) = sink.lost_and_duplicated();
            (lost, duplicated, sink.arrivals().summary())
        }
        (None, prober) => {
            let readable = prober
                .map(|p| p.join().map_err(|_| "the readability prober panicked"))
                .transpose()?;
            let (lost, duplicated) =
                count_lost_and_duplicated(&upstream_http, producers, config.messages_per_producer)?;
            (lost, duplicated, readable.and_then(|r| r.summary()))
        }
    };
    drop(syslog);
    drop(upstream.lock().map_err(|e| e.to_string())?.take());
    finish_step_dir(&[&dir, &upstream_root], lost, duplicated);
    Ok(StepReport {
        spool_peak_bytes: buffer_peak.load(Ordering::Relaxed),
        lost,
        duplicated,
        readable,
        agent: usage,
        ..StepReport::timed(config, producers, outage, produce_seconds, drain_seconds)
    })
}

/// The messages the server holds (distinct or not).
fn stored_messages(upstream_http: &str) -> Option<u64> {
    let answer = HttpClient::new(upstream_http, None)
        .query(&format!("SELECT count(*) FROM {STREAM}"))
        .ok()?;
    answer["rows"][0][0].as_u64()
}

/// How one producer's messages are written as syslog lines.
#[derive(Clone, Copy)]
struct Line {
    producer: usize,
    target: SyslogTarget,
    /// Produce times in the sink's lines count from here.
    epoch: Instant,
}

/// One producer to syslog-ng, `batch_messages` lines per write, each with random letters
/// and digits as payload: `P S T PAYLOAD` for the sink (T: produce time in µs since the
/// epoch), InfluxDB line protocol for Tidemark (`pipeline producer=Pi,seq=Si,payload="…" ns`,
/// the stream's fields read back like the agent's).
fn produce_lines(
    config: &PipelineConfig,
    addr: SocketAddr,
    line: Line,
    sent: &AtomicU64,
    produced: &Mutex<Vec<Produced>>,
) -> Result<(), String> {
    use std::io::Write;
    const LETTERS: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let producer = line.producer;
    let mut connection =
        std::net::TcpStream::connect(addr).map_err(|e| format!("producer {producer}: {e}"))?;
    let _ = connection.set_nodelay(true);
    let mut payload = vec![0u8; config.message_bytes];
    let mut lines = Vec::new();
    let mut seq = 0u64;
    while seq < config.messages_per_producer {
        let n = config
            .batch_messages
            .min(config.messages_per_producer - seq);
        lines.clear();
        let started = Instant::now();
        let produced_us = line.epoch.elapsed().as_micros();
        let now_ns = tidemark_query::time::now_ns();
        for s in seq..seq + n {
            fastrand::fill(&mut payload);
            let letters = payload.iter().map(|b| LETTERS[(b % 62) as usize]);
            match line.target {
                SyslogTarget::CountingSink => {
                    lines.extend_from_slice(format!("{producer} {s} {produced_us} ").as_bytes());
                    lines.extend(letters);
                }
                SyslogTarget::Tidemark => {
                    lines.extend_from_slice(
                        format!("{STREAM} producer={producer}i,seq={s}i,payload=\"").as_bytes(),
                    );
                    lines.extend(letters);
                    lines.extend_from_slice(format!("\" {now_ns}").as_bytes());
                }
            }
            lines.push(b'\n');
        }
        connection
            .write_all(&lines)
            .map_err(|e| format!("producer {producer}: {e}"))?;
        seq += n;
        sent.fetch_add(n, Ordering::Relaxed);
        if producer == 0 {
            if let Ok(mut produced) = produced.lock() {
                produced.push(Produced {
                    last_seq: seq - 1,
                    at: started,
                    event_ns: now_ns,
                });
            }
        }
    }
    Ok(())
}

/// `dir`, emptied or made.
fn fresh_dir(dir: &Path) -> Result<(), String> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("clearing {}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))
}

/// Removes a step's data and logs (in `dirs`, which may name one twice), unless it lost or
/// duplicated messages: then they stay for whoever looks into it.
fn finish_step_dir(dirs: &[&Path], lost: u64, duplicated: u64) {
    for (i, dir) in dirs.iter().enumerate() {
        if dirs[..i].contains(dir) {
            continue;
        }
        if lost == 0 && duplicated == 0 {
            std::fs::remove_dir_all(dir).ok();
        } else {
            println!(
                "  ({lost} lost, {duplicated} duplicated: the step's data and logs are kept in {})",
                dir.display()
            );
        }
    }
}

/// Bytes of the files in `dir` (not recursive).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum()
}

#[derive(Debug, Clone, Copy)]
struct Ports {
    upstream_http: u16,
    upstream_binary: u16,
    agent_http: u16,
    agent_binary: u16,
}

impl Ports {
    fn free() -> Result<Ports, String> {
        let port = || free_port().map_err(|e| format!("no free port: {e}"));
        Ok(Ports {
            upstream_http: port()?,
            upstream_binary: port()?,
            agent_http: port()?,
            agent_binary: port()?,
        })
    }
}

fn start_upstream(
    config: &PipelineConfig,
    dir: &Path,
    ports: &Ports,
) -> Result<PeerProcess, String> {
    start_server(
        config,
        &dir.join("upstream"),
        ports.upstream_http,
        ports.upstream_binary,
    )
}

/// `tidemark serve` with its data in `data_dir` (its log next to it).
fn start_server(
    config: &PipelineConfig,
    data_dir: &Path,
    http: u16,
    binary: u16,
) -> Result<PeerProcess, String> {
    let args = [
        "serve".into(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--http".into(),
        format!("127.0.0.1:{http}"),
        "--binary".into(),
        format!("127.0.0.1:{binary}"),
    ];
    start_tidemark(
        config,
        "tidemark upstream",
        &args,
        &data_dir.with_extension("log"),
        binary,
    )
}

fn start_agent(
    config: &PipelineConfig,
    dir: &Path,
    ports: &Ports,
    upstream: &[String],
) -> Result<PeerProcess, String> {
    let spool = dir.join("spool");
    let args = [
        "agent".into(),
        "--upstream".into(),
        upstream.join(","),
        "--spool-dir".into(),
        spool.display().to_string(),
        "--http".into(),
        format!("127.0.0.1:{}", ports.agent_http),
        "--binary".into(),
        format!("127.0.0.1:{}", ports.agent_binary),
    ];
    start_tidemark(
        config,
        "tidemark agent",
        &args,
        &dir.join("agent.log"),
        ports.agent_binary,
    )
}

/// Runs `tidemark ARGS` with its output in `log`, ready once `binary_port` takes connections.
fn start_tidemark(
    config: &PipelineConfig,
    name: &str,
    args: &[String],
    log: &Path,
    binary_port: u16,
) -> Result<PeerProcess, String> {
    let mut command = Command::new(&config.program);
    command.args(args);
    PeerProcess::start(
        name,
        command,
        log,
        SocketAddr::from(([127, 0, 0, 1], binary_port)),
        Duration::from_secs(60),
    )
    .map_err(|e| e.to_string())
}

/// One producer: its messages in requests of `batch_messages`, each sent when the one
/// before was acknowledged (a request the agent refuses for space is sent again after its
/// hint). Returns the acknowledgement latencies and how many requests were refused.
fn produce(
    config: &PipelineConfig,
    agent: SocketAddr,
    producer: i32,
    acked: &AtomicU64,
    produced: &Mutex<Vec<Produced>>,
) -> Result<(Latencies, u64), String> {
    let client =
        BinaryClient::connect(agent, None).map_err(|e| format!("producer {producer}: {e}"))?;
    let schema = std::sync::Arc::new(Schema::parse_spec(SCHEMA).map_err(|e| e.to_string())?);
    let mut latencies = Latencies::new();
    let mut refused = 0;
    let mut payload = vec![0u8; config.message_bytes];
    let mut seq = 0u64;
    while seq < config.messages_per_producer {
        let n = config
            .batch_messages
            .min(config.messages_per_producer - seq);
        let event_ns = tidemark_query::time::now_ns();
        let batch = messages(&schema, producer, seq, n, event_ns, &mut payload)?;
        let started = Instant::now();
        loop {
            match client.send_append(STREAM, &batch).and_then(|p| p.wait()) {
                Ok(_) => break,
                Err(ClientError::TryLater { retry_after, .. }) => {
                    refused += 1;
                    std::thread::sleep(retry_after.max(Duration::from_millis(1)));
                }
                Err(e) => return Err(format!("producer {producer}: {e}")),
            }
        }
        latencies.record(started.elapsed());
        seq += n;
        acked.fetch_add(n, Ordering::Relaxed);
        if producer == 0 {
            if let Ok(mut produced) = produced.lock() {
                produced.push(Produced {
                    last_seq: seq - 1,
                    at: started,
                    event_ns,
                });
            }
        }
    }
    Ok((latencies, refused))
}

/// `n` messages of `producer` from sequence `first` at time `now` (ns since the epoch),
/// each with fresh random payload.
fn messages(
    schema: &std::sync::Arc<Schema>,
    producer: i32,
    first: u64,
    n: u64,
    now: i64,
    payload: &mut [u8],
) -> Result<EventBatch, String> {
    let mut batch = BatchBuilder::new(schema.clone(), n as usize);
    for seq in first..first + n {
        fastrand::fill(payload);
        batch
            .push_row(
                now,
                None,
                &[
                    Value::Integer(producer),
                    Value::Long(seq as i64),
                    Value::Bytes(payload.to_vec()),
                ],
            )
            .map_err(|e| e.to_string())?;
    }
    Ok(batch.finish())
}

/// Samples the agent's spool every 50 ms, keeping the largest size seen.
fn watch_spool(
    agent_http: &str,
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    let client = HttpClient::new(agent_http, None);
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if let Ok(status) = client.request("GET", "/agent/status", None) {
                let bytes = status["spooledBytes"].as_u64().unwrap_or(0);
                peak.fetch_max(bytes, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
}

/// A request of producer 0's, acknowledged: what the readable probe looks for.
#[derive(Debug, Clone, Copy)]
struct Produced {
    /// Its last message's sequence number.
    last_seq: u64,
    /// When it was sent.
    at: Instant,
    /// Its messages' event time.
    event_ns: i64,
}

/// Polls the upstream for producer 0's highest sequence and records, for each of its
/// requests that became readable, how long after it was produced. Each poll reads only
/// producer 0's sequence numbers since the oldest request not yet seen (by event time),
/// through the events route rather than SQL, so that the probe costs the processes being
/// measured little: SQL's `max(SEQ)` over the whole stream every 10 ms took ~0.3 of the two
/// cores by 180,000 messages, and even over a bounded range ~0.15 (its planning).
fn probe_readable(
    upstream_http: &str,
    produced: Arc<Mutex<Vec<Produced>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Latencies> {
    let client = HttpClient::new(upstream_http, None);
    std::thread::spawn(move || {
        let mut latencies = Latencies::new();
        let mut seen = 0usize;
        let oldest_unseen = |seen: usize| {
            produced
                .lock()
                .ok()
                .and_then(|p| p.get(seen).map(|r| r.event_ns))
        };
        let highest_seq_since = |since_ns: i64| {
            let params = [
                ("from", since_ns.to_string()),
                ("fields", "SEQ".to_string()),
                ("where", "PRODUCER = 0".to_string()),
            ];
            let csv = client.scan(STREAM, &params, true).ok()?;
            // `ts,SEQ` rows after a header.
            csv.lines()
                .filter_map(|row| row.rsplit(',').next()?.trim().parse::<u64>().ok())
                .max()
        };
        loop {
            let stopping = stop.load(Ordering::Relaxed);
            if let Some(max) = oldest_unseen(seen).and_then(highest_seq_since) {
                let now = Instant::now();
                let unseen = produced.lock().map(|p| p[seen..].to_vec());
                for request in unseen.unwrap_or_default() {
                    if request.last_seq > max {
                        break;
                    }
                    latencies.record(now.duration_since(request.at));
                    seen += 1;
                }
            }
            if stopping {
                return latencies;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

fn wait_until_forwarded(agent_http: &str, timeout: Duration) -> Result<(), String> {
    let client = HttpClient::new(agent_http, None);
    let started = Instant::now();
    loop {
        let status = client
            .request("GET", "/agent/status", None)
            .map_err(|e| format!("the agent's status: {e}"))?;
        if status["spooledBatches"] == 0 {
            return Ok(());
        }
        if started.elapsed() > timeout {
            return Err(format!(
                "the agent did not forward everything within {timeout:?}: {status}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads every producer's sequence numbers back from the upstream: how many of the
/// `per_producer` each sent are missing, and how many are there more than once. (One
/// producer at a time: counting distinct values of all of them at once needs more memory
/// than a query may take.)
fn count_lost_and_duplicated(
    upstream_http: &str,
    producers: usize,
    per_producer: u64,
) -> Result<(u64, u64), String> {
    let client = HttpClient::new(upstream_http, None);
    let (mut lost, mut duplicated) = (0, 0);
    for producer in 0..producers {
        let answer = client
            .query(&format!(
                "SELECT SEQ FROM {STREAM} WHERE PRODUCER = {producer}"
            ))
            .map_err(|e| format!("reading producer {producer}'s messages back: {e}"))?;
        let mut seen = vec![false; per_producer as usize];
        for row in answer["rows"].as_array().into_iter().flatten() {
            let seq = row[0]
                .as_u64()
                .filter(|&s| s < per_producer)
                .ok_or_else(|| format!("producer {producer} never sent sequence {}", row[0]))?;
            if std::mem::replace(&mut seen[seq as usize], true) {
                duplicated += 1;
            }
        }
        lost += seen.iter().filter(|s| !**s).count() as u64;
    }
    Ok((lost, duplicated))
}

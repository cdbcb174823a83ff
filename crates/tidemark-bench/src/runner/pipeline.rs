//! `tidemark bench pipeline`: W4, producers → `tidemark agent` → `tidemark serve` (or a local
//! cluster of them), each its own process, at several producer counts and optionally
//! through an upstream outage.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::chart::{draw_bars, Bar};
use crate::summary::{append_summary, Figure};
use crate::w4::{
    run_step, run_syslog_ng_step, PipelineConfig, ServerUpstream, StepReport, SyslogTarget,
    Upstream,
};
use anyhow::{bail, Context, Result};
use tidemark_client::HttpClient;

use crate::local_cluster::LocalCluster;

#[derive(clap::Args)]
pub struct PipelineArgs {
    /// Producer threads per step [default: 3,4,6,8,10,16; with --quick: 3,8].
    #[arg(long, value_delimiter = ',')]
    producers: Vec<usize>,
    /// Messages each producer sends [default: 100000; with --quick: 5000].
    #[arg(long)]
    messages: Option<u64>,
    /// Bytes of random payload per message.
    #[arg(long, default_value_t = 3_000)]
    message_bytes: usize,
    /// Messages per produce request.
    #[arg(long, default_value_t = 10)]
    batch: u64,
    /// Where the agent forwards: one server, or a local cluster of --nodes nodes (the agent
    /// is given every node and follows the leader).
    #[arg(long, value_enum, default_value_t = Target::Server)]
    target: Target,
    /// Nodes of the cluster, with --target cluster.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Adds a step (at the largest producer count) whose upstream (a cluster's leader) is
    /// killed with SIGKILL a third of the way through and started again this many seconds
    /// later.
    #[arg(long)]
    outage: Option<u64>,
    /// Smaller defaults: the run takes a minute or two.
    #[arg(long)]
    quick: bool,
    /// Peers to run each step through too: syslog-ng (its disk-buffered http()
    /// destination, into Tidemark's line-protocol route and into a counting sink), all or
    /// none. Not installed: skipped with the reason
    /// (peers/install.sh syslog-ng).
    #[arg(long, default_value = "none")]
    peers: String,
    /// Where the upstream keeps its data [default: with the steps' data under --out]. A
    /// directory on another disk keeps the agent's fsyncs from queueing behind the
    /// server's writes, as when the agent and its upstream are different machines.
    #[arg(long)]
    upstream_dir: Option<PathBuf>,
    /// Directory for pipeline.csv and summary.csv (and the steps' data while they run).
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

impl PipelineArgs {
    pub fn defaults(quick: bool, peers: &str, out: PathBuf) -> PipelineArgs {
        PipelineArgs {
            producers: Vec::new(),
            messages: None,
            message_bytes: 3_000,
            batch: 10,
            target: Target::Server,
            nodes: 3,
            outage: Some(5),
            quick,
            peers: peers.to_string(),
            upstream_dir: None,
            out,
        }
    }
}

pub fn run(args: PipelineArgs) -> Result<()> {
    let steps = match (args.producers.is_empty(), args.quick) {
        (false, _) => args.producers.clone(),
        (true, true) => vec![3, 8],
        (true, false) => vec![3, 4, 6, 8, 10, 16],
    };
    if steps.contains(&0) || args.batch == 0 {
        bail!("--producers and --batch must be above 0");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let config = PipelineConfig {
        program: std::env::current_exe().context("finding the tidemark executable")?,
        work_dir: args.out.join("pipeline-data"),
        messages_per_producer: args
            .messages
            .unwrap_or(if args.quick { 5_000 } else { 100_000 }),
        message_bytes: args.message_bytes,
        batch_messages: args.batch,
        upstream_dir: args.upstream_dir.clone(),
    };
    let mut plan: Vec<(usize, Option<Duration>)> = steps.iter().map(|&p| (p, None)).collect();
    if let Some(seconds) = args.outage {
        let largest = steps.iter().copied().max().unwrap_or(3);
        plan.push((largest, Some(Duration::from_secs(seconds))));
    }
    println!(
        "W4 pipeline: {} messages of {} bytes per producer, {} per request, producers → agent → server",
        config.messages_per_producer, config.message_bytes, config.batch_messages
    );
    let with_syslog_ng = match args.peers.as_str() {
        "none" => false,
        "syslog-ng" | "all" => true,
        other => bail!("unknown peer {other:?}: W4's peers are syslog-ng, all or none"),
    };
    if args.target == Target::Cluster && !(1..=9).contains(&args.nodes) {
        bail!("--nodes takes 1 to 9");
    }
    let nodes = args.nodes;
    let (system, start_upstream): (&str, Box<crate::w4::StartUpstream>) = match args.target {
        Target::Server => {
            let config = config.clone();
            (
                "tidemark",
                Box::new(move |dir| ServerUpstream::start(&config, dir)),
            )
        }
        Target::Cluster => (
            "tidemark cluster",
            Box::new(move |dir| ClusterUpstream::start(nodes, dir)),
        ),
    };
    let mut reports = Vec::new();
    for (producers, outage) in plan {
        let report = run_step(&config, producers, outage, &*start_upstream)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("the step with {producers} producers"))?;
        print_row(system, &report);
        reports.push((system, report));
        if with_syslog_ng {
            for target in [SyslogTarget::Tidemark, SyslogTarget::CountingSink] {
                match run_syslog_ng_step(&config, producers, outage, target) {
                    Ok(report) => {
                        print_row(target.name(), &report);
                        reports.push((target.name(), report));
                    }
                    Err(e) => println!("{}, {producers} producers: {e}", target.name()),
                }
            }
        }
    }
    // Empty unless a step kept its data for a look at what it lost.
    std::fs::remove_dir(&config.work_dir).ok();
    write_csv(&args.out, &reports)?;
    draw_chart(&args.out, &reports)?;
    let summary = append_summary(&args.out, &figures(&reports))?;
    println!(
        "figures: {}, {} and {}",
        args.out.join("pipeline.csv").display(),
        args.out.join("pipeline.png").display(),
        summary.display()
    );
    // Tidemark must lose and duplicate nothing; a peer's losses are its figures.
    let faulty: Vec<String> = reports
        .iter()
        .filter(|(name, r)| *name == system && (r.lost > 0 || r.duplicated > 0))
        .map(|(_, r)| {
            format!(
                "{}: {} lost, {} duplicated",
                step_name(r),
                r.lost,
                r.duplicated
            )
        })
        .collect();
    if !faulty.is_empty() {
        bail!("messages lost or duplicated: {}", faulty.join("; "));
    }
    Ok(())
}

fn step_name(report: &StepReport) -> String {
    match report.outage {
        Some(outage) => format!(
            "{} producers, upstream down {} s",
            report.producers,
            outage.as_secs()
        ),
        None => format!("{} producers", report.producers),
    }
}

fn print_row(system: &str, r: &StepReport) {
    let ms = |s: Option<f64>| s.map_or("-".to_string(), |v| format!("{v:.1}"));
    println!(
        "{system:<20} {:<34} {:>9.0} msg/s {:>7.1} MB/s ({:>6.1} MB/s delivered)  drain {:>5.1} s  spool peak {:>6.1} MB{}  lost {} dup {}  ack p50/p99/p99.9 {}/{}/{} ms  readable p50/p99 {}/{} ms  agent {} cores, {} MB RSS",
        step_name(r),
        r.messages_per_second,
        r.megabytes_per_second,
        r.delivered_megabytes_per_second(),
        r.drain_seconds,
        r.spool_peak_bytes as f64 / 1e6,
        if r.spooled() { " (spooled)" } else { "" },
        r.lost,
        r.duplicated,
        ms(r.ack.map(|a| a.p50_ms)),
        ms(r.ack.map(|a| a.p99_ms)),
        ms(r.ack.map(|a| a.p999_ms)),
        ms(r.readable.map(|a| a.p50_ms)),
        ms(r.readable.map(|a| a.p99_ms)),
        r.agent.map_or("-".into(), |u| format!("{:.2}", u.cores)),
        r.agent.map_or("-".into(), |u| format!("{:.0}", u.peak_rss_bytes as f64 / 1e6)),
    );
}

fn write_csv(out: &std::path::Path, reports: &[(&str, StepReport)]) -> Result<()> {
    let path = out.join("pipeline.csv");
    let mut text = String::from(
        "system,producers,outage_s,messages,produce_s,drain_s,msgs_per_s,mb_per_s,delivered_mb_per_s,spool_peak_bytes,refused_requests,lost,duplicated,ack_p50_ms,ack_p99_ms,ack_p999_ms,readable_p50_ms,readable_p99_ms,readable_p999_ms,agent_cores,agent_peak_rss_bytes\n",
    );
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    for (system, r) in reports {
        text.push_str(&format!(
            "{system},{},{},{},{:.3},{:.3},{:.0},{:.2},{:.2},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            r.producers,
            r.outage.map_or(String::new(), |o| o.as_secs().to_string()),
            r.messages,
            r.produce_seconds,
            r.drain_seconds,
            r.messages_per_second,
            r.megabytes_per_second,
            r.delivered_megabytes_per_second(),
            r.spool_peak_bytes,
            r.refused_requests,
            r.lost,
            r.duplicated,
            opt(r.ack.map(|a| a.p50_ms)),
            opt(r.ack.map(|a| a.p99_ms)),
            opt(r.ack.map(|a| a.p999_ms)),
            opt(r.readable.map(|a| a.p50_ms)),
            opt(r.readable.map(|a| a.p99_ms)),
            opt(r.readable.map(|a| a.p999_ms)),
            opt(r.agent.map(|u| u.cores)),
            r.agent
                .map_or(String::new(), |u| u.peak_rss_bytes.to_string()),
        ));
    }
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

fn figures(reports: &[(&str, StepReport)]) -> Vec<Figure> {
    let mut figures = Vec::new();
    for (system, r) in reports {
        let variant = step_name(r);
        let mut add = |metric: &str, value: f64, unit: &str| {
            figures.push(Figure::new("W4", system, &variant, metric, value, unit));
        };
        add("messages_per_second", r.messages_per_second, "msg/s");
        add("megabytes_per_second", r.megabytes_per_second, "MB/s");
        add(
            "delivered_megabytes_per_second",
            r.delivered_megabytes_per_second(),
            "MB/s",
        );
        add("spool_peak_bytes", r.spool_peak_bytes as f64, "bytes");
        add("lost", r.lost as f64, "messages");
        add("duplicated", r.duplicated as f64, "messages");
        if let Some(ack) = r.ack {
            add("ack_p99_ms", ack.p99_ms, "ms");
        }
        if let Some(readable) = r.readable {
            add("readable_p99_ms", readable.p99_ms, "ms");
        }
        if let Some(agent) = r.agent {
            add("agent_cores", agent.cores, "cores");
            add("agent_peak_rss_bytes", agent.peak_rss_bytes as f64, "bytes");
        }
    }
    figures
}

/// `pipeline.png`: delivered MB/s of every step, each system its colour (labels short
/// enough for 21 bars: T the agent, S→T syslog-ng into Tidemark, S→s syslog-ng into the
/// sink; the producer count; `o` the outage step).
fn draw_chart(out: &std::path::Path, reports: &[(&str, StepReport)]) -> Result<()> {
    let bars: Vec<Bar> = reports
        .iter()
        .map(|(system, r)| {
            let (short, group) = match *system {
                "tidemark" => ("T", 0),
                "tidemark cluster" => ("TC", 0),
                s if s == SyslogTarget::Tidemark.name() => ("S→T", 1),
                _ => ("S→s", 2),
            };
            let outage = if r.outage.is_some() { "o" } else { "" };
            Bar {
                label: format!("{short} {}{outage}", r.producers),
                group,
                value: r.delivered_megabytes_per_second(),
            }
        })
        .collect();
    draw_bars(
        &out.join("pipeline.png"),
        "W4 MB/s delivered — T: tidemark agent (TC: to a cluster), S→T: syslog-ng → tidemark, S→s: syslog-ng → sink",
        "MB/s",
        &bars,
    )
    .context("drawing pipeline.png")
}

/// Where the agent forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    Server,
    Cluster,
}

/// A local cluster as a step's upstream: the agent is given every node; an outage kills
/// the leader of the moment.
struct ClusterUpstream {
    cluster: LocalCluster,
    killed: Option<u64>,
}

impl ClusterUpstream {
    fn start(nodes: u64, dir: &Path) -> Result<Box<dyn Upstream>, String> {
        let started = || -> Result<LocalCluster> {
            let config = tidemark_cluster::ClusterConfig::on_free_ports(nodes)?;
            let mut cluster = LocalCluster::start(config, dir, true)?;
            cluster.wait_for_leader(Duration::from_secs(30))?;
            Ok(cluster)
        };
        let cluster = started().map_err(|e| format!("the cluster upstream: {e:#}"))?;
        Ok(Box::new(ClusterUpstream {
            cluster,
            killed: None,
        }))
    }

    /// The leader as a running node sees it, and as it sees itself (asked in turn; a new
    /// one is waited for). Asking the named leader too matters: a follower may still name
    /// a leader that was killed and is starting again, not yet answering.
    fn leader(&self) -> Result<&tidemark_cluster::NodeConfig, String> {
        let leader_seen_by = |node: &tidemark_cluster::NodeConfig| -> Option<u64> {
            let client = HttpClient::with_timeout(
                &format!("http://{}", node.http),
                None,
                Some(Duration::from_secs(2)),
            );
            let status = client.request("GET", "/v1/cluster", None).ok()?;
            status["leader"].as_u64()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for node in &self.cluster.config.nodes {
                if Some(node.id) == self.killed {
                    continue;
                }
                let leader = leader_seen_by(node)
                    .filter(|&id| Some(id) != self.killed)
                    .and_then(|id| self.cluster.config.node(id))
                    .filter(|leader| leader_seen_by(leader) == Some(leader.id));
                if let Some(leader) = leader {
                    return Ok(leader);
                }
            }
            if Instant::now() > deadline {
                return Err("the cluster has had no leader for 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Upstream for ClusterUpstream {
    fn binary_addrs(&self) -> Vec<String> {
        self.cluster
            .config
            .nodes
            .iter()
            .map(|n| n.binary.clone())
            .collect()
    }

    fn http_url(&self) -> Result<String, String> {
        Ok(format!("http://{}", self.leader()?.http))
    }

    fn kill(&mut self) -> Result<(), String> {
        let leader = self.leader()?.id;
        self.cluster.kill(leader).map_err(|e| format!("{e:#}"))?;
        self.killed = Some(leader);
        Ok(())
    }

    fn restart(&mut self) -> Result<(), String> {
        let id = self.killed.take().ok_or("no node was killed")?;
        self.cluster.restart(id).map_err(|e| format!("{e:#}"))
    }
}

//! `tidemark bench insert`: W1 against the embedded, server and cluster targets and the peers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::chart::{self, LogChart};
use crate::peers::kafka::Flush;
use crate::peers::questdb::CommitMode;
use crate::peers::redis::Fsync;
use crate::peers::Skipped;
use crate::summary::{append_summary, Figure};
use crate::w1::{self, ChartX, InsertConfig, InsertReport, Trial};
use crate::w1_peers::{self, KafkaBatches, PeerInsertConfig};
use crate::w1_server::{self, human_bytes, parse_bytes, Protocol, ServerInsertConfig};
use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use tidemark_client::FullBuffer;
use tidemark_engine::Options;
use tidemark_server::Config;

use crate::background_server::BackgroundServer;

use crate::local_cluster::LocalCluster;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Target {
    Embedded,
    Server,
    Cluster,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProtocolArg {
    Http,
    Binary,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BufferArg {
    Blocking,
    NonBlocking,
}

#[derive(clap::Args)]
pub struct InsertArgs {
    #[arg(long, value_enum, default_value = "embedded")]
    target: Target,
    /// Event counts, comma-separated [default: 1,100,10000,1000000,10000000; with --quick:
    /// 1,100,10000,1000000].
    #[arg(long, value_delimiter = ',')]
    events: Option<Vec<usize>>,
    /// Trials per count [default: 10; with --quick: 3].
    #[arg(long)]
    trials: Option<usize>,
    /// Smaller defaults, so that every workload of `bench all --quick` ends in minutes.
    #[arg(long)]
    quick: bool,
    /// Embedded target: events per appended batch.
    #[arg(long, default_value_t = 10_000)]
    batch: usize,
    /// Embedded target: concurrent appenders (their appends share fsyncs).
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Cluster target: node counts, comma-separated (a cluster of each is started on
    /// 127.0.0.1, measured, and stopped).
    #[arg(long, value_delimiter = ',', default_value = "3")]
    nodes: Vec<u64>,
    /// Server target: the protocol the client speaks.
    #[arg(long, value_enum, default_value = "binary")]
    protocol: ProtocolArg,
    /// Server target: client buffer sizes, comma-separated (1KB, 10KB, 100KB, 1MB, 10MB).
    #[arg(long, value_delimiter = ',', default_value = "1MB")]
    buffer_size: Vec<String>,
    /// Server target: what a full client buffer does.
    #[arg(long, value_enum, default_value = "blocking")]
    buffer: BufferArg,
    /// Server target: batches in flight at once.
    #[arg(long, default_value_t = 4)]
    in_flight: usize,
    /// Server target: an already running server's HTTP address (with --binary-addr);
    /// without it, a server is started in this process on ephemeral ports.
    #[arg(long, requires = "binary_addr")]
    server: Option<String>,
    /// That server's binary protocol address, host:port.
    #[arg(long)]
    binary_addr: Option<SocketAddr>,
    /// Peers to run the same workload against: kafka,questdb,redis,prometheus,nats, all
    /// or none. A peer that is not installed is skipped with the reason.
    #[arg(long, default_value = "none")]
    peers: String,
    /// Directory for insert.csv (a database it creates goes in DIR/data and is removed after).
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

impl InsertArgs {
    /// The defaults of `bench insert --target TARGET`, for `bench all`.
    pub fn defaults(target: Target, quick: bool, peers: &str, out: PathBuf) -> InsertArgs {
        InsertArgs {
            target,
            events: None,
            trials: None,
            quick,
            batch: 10_000,
            writers: 4,
            nodes: vec![3],
            protocol: ProtocolArg::Binary,
            buffer_size: vec!["1MB".into()],
            buffer: BufferArg::Blocking,
            in_flight: 4,
            server: None,
            binary_addr: None,
            peers: peers.into(),
            out,
        }
    }
}

pub fn run(args: InsertArgs) -> Result<()> {
    let InsertArgs {
        target,
        events,
        trials,
        quick,
        batch,
        writers,
        nodes,
        protocol,
        buffer_size,
        buffer,
        in_flight,
        server,
        binary_addr,
        peers,
        out,
    } = args;
    let events = events.unwrap_or_else(|| match quick {
        true => vec![1, 100, 10_000, 1_000_000],
        false => vec![1, 100, 10_000, 1_000_000, 10_000_000],
    });
    let trials = trials.unwrap_or(if quick { 3 } else { 10 });
    let peers = crate::peers::parse_selection(&peers).map_err(anyhow::Error::msg)?;
    if events.is_empty() || trials == 0 || batch == 0 {
        bail!("--events, --trials and --batch must be positive");
    }
    let data_dir = out.join("data");
    if data_dir.exists() {
        std::fs::remove_dir_all(&data_dir)
            .with_context(|| format!("clearing {}", data_dir.display()))?;
    }
    match target {
        Target::Embedded => {
            let config = InsertConfig {
                event_counts: events.clone(),
                trials,
                batch_size: batch,
                writers,
                data_dir: data_dir.clone(),
                options: Options::default(),
                progress: true,
            };
            let report = w1::run_embedded(&config)?;
            std::fs::remove_dir_all(&data_dir).ok();
            let csv = write_trials(&out, &report.trials)?;
            println!("W1 insert, target embedded, batches of {batch} events, {writers} appenders, durable (fsync'd) acknowledgements");
            print_embedded(&report);
            println!("trials written to {} (chart: insert.png)", csv.display());
            let peer_config = PeerInsertConfig {
                event_counts: events,
                trials,
                batch_size: batch,
                work_dir: out.join("peers"),
                progress: true,
            };
            compare_with_peers(&peers, &peer_config, &report.trials, &out)?;
        }
        Target::Server | Target::Cluster => {
            let buffer_sizes = buffer_size
                .iter()
                .map(|s| parse_bytes(s).map_err(anyhow::Error::msg))
                .collect::<Result<Vec<_>>>()?;
            let base = ServerInsertConfig {
                http: server.clone().unwrap_or_default(),
                binary: binary_addr.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
                token: std::env::var("TIDEMARK_TOKEN").ok(),
                protocol: match protocol {
                    ProtocolArg::Http => Protocol::Http,
                    ProtocolArg::Binary => Protocol::Binary,
                },
                event_counts: events.clone(),
                trials,
                buffer_sizes: buffer_sizes.clone(),
                full: match buffer {
                    BufferArg::Blocking => FullBuffer::Block,
                    BufferArg::NonBlocking => FullBuffer::WouldBlock,
                },
                max_in_flight: in_flight,
                progress: true,
            };
            if target == Target::Cluster {
                return run_cluster(&base, &nodes, &data_dir, &out);
            }
            let trials_run = match server {
                Some(_) => w1_server::run_server(&base)?,
                None => with_local_server(&data_dir, move |http, binary| {
                    Ok(w1_server::run_server(&ServerInsertConfig {
                        http,
                        binary,
                        ..base
                    })?)
                })?,
            };
            std::fs::remove_dir_all(&data_dir).ok();
            let csv = write_trials(&out, &trials_run)?;
            let largest = events.iter().copied().max().unwrap_or(0);
            println!("W1 insert, target server over {}, {} buffer, {in_flight} batches in flight, acknowledged once durable (fsync'd)", trials_run.first().map_or("", |t| t.target.as_str()), trials_run.first().map_or("", |t| t.buffer_type.as_str()));
            print_summary(&trials_run);
            print_physical_limit(&out, largest, &trials_run)?;
            println!("trials written to {} (chart: insert.png)", csv.display());
            // Peers get batches of as many events as the first buffer size holds.
            let per_event = w1::nominal_batch_bytes(10_000) as f64 / 10_000.0;
            let batch_size = buffer_sizes
                .first()
                .map_or(1, |&b| ((b as f64 / per_event) as usize).max(1));
            let peer_config = PeerInsertConfig {
                event_counts: events,
                trials,
                batch_size,
                work_dir: out.join("peers"),
                progress: true,
            };
            let first_buffer: Vec<Trial> = trials_of_first_buffer(&trials_run);
            compare_with_peers(&peers, &peer_config, &first_buffer, &out)?;
        }
    }
    Ok(())
}

/// W1 against clusters of each size in `nodes` (processes on 127.0.0.1, writing to the
/// leader), next to a single server measured in the same run.
fn run_cluster(
    base: &ServerInsertConfig,
    nodes: &[u64],
    data_dir: &Path,
    out: &Path,
) -> Result<()> {
    if nodes.iter().any(|&n| !(1..=9).contains(&n)) {
        bail!("--nodes takes node counts from 1 to 9");
    }
    let single_config = base.clone();
    let mut all = with_local_server(data_dir, move |http, binary| {
        Ok(w1_server::run_server(&ServerInsertConfig {
            http,
            binary,
            ..single_config
        })?)
    })?;
    std::fs::remove_dir_all(data_dir).ok();
    for &n in nodes {
        let dir = out.join(format!("cluster-{n}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        let mut cluster = LocalCluster::start(
            tidemark_cluster::ClusterConfig::on_free_ports(n)?,
            &dir,
            true,
        )?;
        let status = cluster.wait_for_leader(std::time::Duration::from_secs(30))?;
        let leader = status["leader"].as_u64().unwrap_or(1);
        let node = cluster
            .config
            .node(leader)
            .with_context(|| format!("the leader {leader} is not in the configuration"))?;
        let mut trials = w1_server::run_server(&ServerInsertConfig {
            http: format!("http://{}", node.http),
            binary: node.binary.parse()?,
            ..base.clone()
        })?;
        for t in &mut trials {
            t.target = format!("cluster/{}", t.target);
            t.node_count = n as usize;
        }
        all.extend(trials);
        drop(cluster);
        std::fs::remove_dir_all(&dir).ok();
    }
    let csv = write_trials(out, &all)?;
    println!("W1 insert on clusters, acknowledged once committed (fsync'd on a quorum), next to one server (fsync'd) in the same run");
    println!(
        "{:>14}  {:>5}  {:>8}  {:>10}  {:>14}  {:>14}  {:>9}",
        "target", "nodes", "buffer", "events", "median ev/s", "max ev/s", "vs server"
    );
    let single: Vec<Trial> = all
        .iter()
        .filter(|t| !t.target.starts_with("cluster"))
        .cloned()
        .collect();
    let reference = w1::summarise(&single);
    let mut figures = Vec::new();
    for n in std::iter::once(1).chain(nodes.iter().map(|&n| n as usize)) {
        let of: Vec<Trial> = all
            .iter()
            .filter(|t| {
                (n == 1) != t.target.starts_with("cluster") && (n == 1 || t.node_count == n)
            })
            .cloned()
            .collect();
        for s in w1::summarise(&of) {
            let server = reference
                .iter()
                .find(|r| r.buffer_bytes == s.buffer_bytes && r.event_count == s.event_count)
                .map_or(f64::NAN, |r| {
                    s.median_events_per_second / r.median_events_per_second
                });
            let label = if n == 1 { "server" } else { "cluster" };
            println!(
                "{label:>14}  {n:>5}  {:>8}  {:>10}  {:>14.0}  {:>14.0}  {:>8.0}%",
                human_bytes(s.buffer_bytes),
                s.event_count,
                s.median_events_per_second,
                s.max_events_per_second,
                100.0 * server
            );
            figures.push(Figure::new(
                "W1",
                "tidemark",
                &format!(
                    "{label} {n} nodes, {} buffer, {} events",
                    human_bytes(s.buffer_bytes),
                    s.event_count
                ),
                "median_events_per_second",
                s.median_events_per_second,
                "events/s",
            ));
        }
    }
    append_summary(out, &figures)?;
    println!("trials written to {} (chart: insert.png)", csv.display());
    Ok(())
}

/// Writes `DIR/insert.csv` and the chart of its medians, `DIR/insert.png`.
fn write_trials(out: &Path, trials: &[Trial]) -> Result<PathBuf> {
    let csv = w1::write_csv(out, trials)?;
    let (x_axis, series) = w1::chart_series(trials);
    let (x_label, x_ticks): (&str, fn(f64) -> String) = match x_axis {
        ChartX::BufferBytes => ("client buffer size", |b| {
            format!("{}B", chart::short_number(b))
        }),
        ChartX::EventCount => ("events per trial", chart::short_number),
    };
    chart::draw(
        &out.join("insert.png"),
        &LogChart {
            title: "W1 insert: median events/s, acknowledged once durable",
            x_label,
            y_label: "events/s",
            x_ticks,
            series: &series,
        },
    )?;
    Ok(csv)
}

/// Runs `work` against a server started in this process on ephemeral ports.
fn with_local_server<T>(
    data_dir: &Path,
    work: impl FnOnce(String, SocketAddr) -> Result<T>,
) -> Result<T> {
    let config = Config {
        data_dir: data_dir.to_path_buf(),
        http: "127.0.0.1:0".parse()?,
        binary: "127.0.0.1:0".parse()?,
        ..Config::default()
    };
    let server = BackgroundServer::start(config, Options::default())?;
    let outcome = work(
        format!("http://{}", server.http_addr()),
        server.binary_addr(),
    );
    server.stop()?;
    outcome
}

/// Runs the selected peers on the same workload, prints each next to Tidemark with the
/// ratio, and appends every figure to `DIR/summary.csv`.
fn compare_with_peers(
    peers: &[String],
    config: &PeerInsertConfig,
    tidemark: &[Trial],
    out: &Path,
) -> Result<()> {
    let mut all: Vec<(String, Vec<Trial>)> =
        vec![("fsync per group commit".into(), tidemark.to_vec())];
    for peer in peers {
        let runs: Vec<(String, Result<Vec<Trial>, Skipped>)> = match peer.as_str() {
            "redis" => [Fsync::Always, Fsync::EverySec]
                .into_iter()
                .map(|fsync| {
                    (
                        redis_durability(fsync).into(),
                        w1_peers::run_redis(config, fsync),
                    )
                })
                .collect(),
            "kafka" => [Flush::EveryAppend, Flush::OsCache]
                .into_iter()
                .flat_map(|flush| KafkaBatches::BOTH.map(|batches| (flush, batches)))
                .map(|(flush, batches)| {
                    (
                        format!("{}{}", kafka_durability(flush), batches.describe()),
                        w1_peers::run_kafka(config, flush, batches),
                    )
                })
                .collect(),
            "questdb" => [CommitMode::Sync, CommitMode::NoSync]
                .into_iter()
                .map(|mode| {
                    (
                        questdb_durability(mode).into(),
                        w1_peers::run_questdb(config, mode),
                    )
                })
                .collect(),
            "nats" => vec![(
                "os cache (JetStream file storage, synced every 2 min)".into(),
                w1_peers::run_nats(config),
            )],
            other => {
                println!("{other} skipped: the harness has no W1 adapter for it yet");
                continue;
            }
        };
        for (durability, outcome) in runs {
            match outcome {
                Ok(trials) => all.push((durability, trials)),
                Err(skipped) => println!("{skipped}"),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&config.work_dir);
    let tidemark_medians = w1::summarise(tidemark);
    let mut figures = Vec::new();
    if all.len() > 1 {
        println!("\nW1 side by side (same events, counts and trials; {} events per batch / round trip; client and server on the same 2 cores):", config.batch_size);
        println!(
            "{:<28}  {:<40}  {:>10}  {:>14}  {:>14}",
            "system", "durability", "events", "median ev/s", "tidemark/peer"
        );
    }
    for (durability, trials) in &all {
        let target = trials.first().map_or("?", |t| t.target.as_str());
        // Tidemark's own rows are named by their target (embedded, server-binary, ...).
        let (system, durability) = match target {
            "embedded" | "server-binary" | "server-http" => {
                ("tidemark", format!("{target}, {durability}"))
            }
            peer => (peer, durability.clone()),
        };
        for s in w1::summarise(trials) {
            let ours = tidemark_medians
                .iter()
                .find(|t| t.event_count == s.event_count)
                .map_or(0.0, |t| t.median_events_per_second);
            let ratio = ours / s.median_events_per_second.max(1e-9);
            if all.len() > 1 {
                // Tidemark's own rows are the reference: no ratio.
                let ratio = match system {
                    "tidemark" => "—".to_string(),
                    _ => format!("{ratio:.2}x"),
                };
                println!(
                    "{system:<28}  {durability:<40}  {:>10}  {:>14.0}  {ratio:>14}",
                    s.event_count, s.median_events_per_second
                );
            }
            let variant = format!("{} events, {durability}", s.event_count);
            figures.push(Figure::new(
                "W1",
                system,
                &variant,
                "median_events_per_second",
                s.median_events_per_second,
                "events/s",
            ));
            figures.push(Figure::new(
                "W1",
                system,
                &variant,
                "max_events_per_second",
                s.max_events_per_second,
                "events/s",
            ));
            if system != "tidemark" {
                figures.push(Figure::new(
                    "W1",
                    system,
                    &variant,
                    "tidemark_over_peer",
                    ratio,
                    "x",
                ));
            }
        }
    }
    let path = append_summary(out, &figures)?;
    println!("figures appended to {}", path.display());
    Ok(())
}

fn trials_of_first_buffer(trials: &[Trial]) -> Vec<Trial> {
    let first = trials.first().map(|t| t.buffer_size_in_bytes);
    trials
        .iter()
        .filter(|t| Some(t.buffer_size_in_bytes) == first)
        .cloned()
        .collect()
}

fn redis_durability(fsync: Fsync) -> &'static str {
    match fsync {
        Fsync::Always => "fsync before each reply",
        Fsync::EverySec => "OS cache (fsync each 1 s)",
    }
}

fn kafka_durability(flush: Flush) -> &'static str {
    match flush {
        Flush::EveryAppend => "fsync per append (acks=all)",
        Flush::OsCache => "OS cache (acks=all)",
    }
}

fn questdb_durability(mode: CommitMode) -> &'static str {
    match mode {
        CommitMode::Sync => "fsync per commit, until visible",
        CommitMode::NoSync => "OS cache, until visible",
    }
}

fn print_summary(trials: &[Trial]) {
    println!(
        "{:>8}  {:>10}  {:>6}  {:>14}  {:>14}  {:>12}",
        "buffer", "events", "trials", "median ev/s", "max ev/s", "median ms"
    );
    for s in w1::summarise(trials) {
        println!(
            "{:>8}  {:>10}  {:>6}  {:>14.0}  {:>14.0}  {:>12.3}",
            human_bytes(s.buffer_bytes),
            s.event_count,
            s.trials,
            s.median_events_per_second,
            s.max_events_per_second,
            s.median_ms
        );
    }
}

/// The same payload as the largest count, written with an fsync per 1 MB.
fn print_physical_limit(out: &Path, largest: usize, trials: &[Trial]) -> Result<()> {
    let sample = w1::generate(10_000.min(largest.max(1)), 10_000, 0, 0);
    let per_event = sample
        .first()
        .map_or(20.0, |b| w1::payload_bytes(b) as f64 / b.len() as f64);
    let total = (per_event * largest as f64) as usize;
    let took = crate::disk::sequential_fsync(&out.join("data"), total, 1 << 20)?;
    std::fs::remove_dir_all(out.join("data")).ok();
    let limit = largest as f64 / took.as_secs_f64();
    let best = w1::summarise(trials)
        .iter()
        .filter(|s| s.event_count == largest)
        .map(|s| s.median_events_per_second)
        .fold(0.0, f64::max);
    println!(
        "fsync baseline: the same {:.0} MB written sequentially with one fsync per MB took {:.0} ms ({limit:.0} events/s); the best median is {}",
        total as f64 / 1e6,
        took.as_secs_f64() * 1e3,
        against_baseline(best, limit)
    );
    Ok(())
}

/// A rate next to the fsync baseline: a fraction of it, or a multiple when group commit
/// (many batches per fsync) beats one fsync per chunk, which is a reference, not a bound.
fn against_baseline(rate: f64, baseline: f64) -> String {
    if baseline <= 0.0 || !rate.is_finite() {
        return "not comparable (no baseline measured)".to_string();
    }
    let ratio = rate / baseline;
    if ratio <= 1.0 {
        format!("{:.0}% of it", 100.0 * ratio)
    } else {
        format!("{ratio:.1}× it (group commit makes fewer fsyncs than one per chunk)")
    }
}

fn print_embedded(report: &InsertReport) {
    print_summary(&report.trials);
    if let Some(b) = report.compressed_bytes_per_event {
        println!("compressed size: {b:.2} bytes per event on disk");
    }
    let largest = report.query_events;
    let (bytes, took) = report.physical_limit;
    let limit_rate = largest as f64 / took.as_secs_f64();
    let best_median = w1::summarise(&report.trials)
        .iter()
        .filter(|s| s.event_count == largest)
        .map(|s| s.median_events_per_second)
        .next()
        .unwrap_or(0.0);
    println!(
        "fsync baseline: {:.0} MB of payload written sequentially with one fsync per batch took {:.0} ms ({:.0} MB/s, {:.0} events/s); Tidemark's median is {}",
        bytes as f64 / 1e6,
        took.as_secs_f64() * 1e3,
        bytes as f64 / 1e6 / took.as_secs_f64(),
        limit_rate,
        against_baseline(best_median, limit_rate)
    );
    for (what, (events, took)) in [
        ("all events", report.full_scan),
        ("the last minute", report.minute_scan),
    ] {
        println!(
            "scan of {what} (all fields, flushed): {events} events in {:.1} ms ({:.0} events/s)",
            took.as_secs_f64() * 1e3,
            events as f64 / took.as_secs_f64()
        );
    }
    println!("flushing the {largest} events of the last trial into compressed segments took {:.0} ms after the last acknowledgement", report.flush_after_ingest.as_secs_f64() * 1e3);
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!(
        "max(LASTTRADEPRICE) over the last hour in 1-minute buckets, {} events: {:.3} ms first / {:.3} ms median (right after ingest), {:.3} ms / {:.3} ms (flushed)",
        report.query_events,
        ms(report.query_latency_unflushed.0),
        ms(report.query_latency_unflushed.1),
        ms(report.query_latency_flushed.0),
        ms(report.query_latency_flushed.1)
    );
}

#[cfg(test)]
mod tests {
    use super::against_baseline;

    #[test]
    fn a_rate_above_the_baseline_is_a_multiple_not_a_percentage() {
        assert_eq!(against_baseline(50.0, 100.0), "50% of it");
        assert!(against_baseline(921.0, 100.0).starts_with("9.2× it"));
        assert!(against_baseline(1.0, 0.0).contains("not comparable"));
    }
}

//! `tidemark bench append`: W3 against a Tidemark server process started for every step
//! (fresh data directory, so each step starts empty and the server's CPU and RSS are its
//! own), and against Kafka with as many partitions as streams.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::chart::{self, LogChart};
use crate::disk::sequential_fsync;
use crate::peers::kafka::Flush;
use crate::summary::{append_summary, Figure};
use crate::w3::{self, AppendConfig, Measured, Rate, StepReport, BATCH_BYTES};
use crate::w3_peers;
use anyhow::{bail, Context, Result};
use tidemark_query::time::{format_instant, now_ns};

#[derive(clap::Args)]
pub struct AppendArgs {
    /// Stream counts, comma-separated (each batch goes to a random one) [default:
    /// 1,100,2000; with --quick: 1,100].
    #[arg(long, value_delimiter = ',')]
    streams: Option<Vec<usize>>,
    /// Target rates in MB/s of payload, comma-separated, or max [default: 100,250,max;
    /// with --quick: 100,max].
    #[arg(long, value_delimiter = ',')]
    rate: Option<Vec<String>>,
    /// Client connections.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 4)]
    in_flight: usize,
    /// Measured seconds per step [default: 10; with --quick: 3].
    #[arg(long)]
    duration: Option<u64>,
    /// Seconds of warm-up before each step's measurement [default: 2; with --quick: 1].
    #[arg(long)]
    warmup: Option<u64>,
    /// Smaller defaults, so that every workload of `bench all --quick` ends in minutes.
    #[arg(long)]
    quick: bool,
    /// Peers to run the same steps against: kafka (the others have no W3 adapter), all or
    /// none. A peer that is not installed is skipped with the reason.
    #[arg(long, default_value = "none")]
    peers: String,
    /// Directory for append.csv, summary.csv/.md and the charts (servers' data go in
    /// DIR/data, removed after).
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

const TIDEMARK_DURABILITY: &str = "fsync per batch (group commit)";

impl AppendArgs {
    /// The defaults of `bench append`, for `bench all`.
    pub fn defaults(quick: bool, peers: &str, out: PathBuf) -> AppendArgs {
        AppendArgs {
            streams: None,
            rate: None,
            clients: 4,
            in_flight: 4,
            duration: None,
            warmup: None,
            quick,
            peers: peers.into(),
            out,
        }
    }
}

pub fn run(args: AppendArgs) -> Result<()> {
    let quick = args.quick;
    let streams = args.streams.clone().unwrap_or_else(|| match quick {
        true => vec![1, 100],
        false => vec![1, 100, 2000],
    });
    let rate = args.rate.clone().unwrap_or_else(|| {
        let rates: &[&str] = if quick {
            &["100", "max"]
        } else {
            &["100", "250", "max"]
        };
        rates.iter().map(|r| r.to_string()).collect()
    });
    let duration = args.duration.unwrap_or(if quick { 3 } else { 10 });
    let warmup = args.warmup.unwrap_or(if quick { 1 } else { 2 });
    let peers = crate::peers::parse_selection(&args.peers).map_err(anyhow::Error::msg)?;
    let rates = rate
        .iter()
        .map(|r| Rate::parse(r).map_err(anyhow::Error::msg))
        .collect::<Result<Vec<_>>>()?;
    if streams.is_empty() || streams.contains(&0) || rates.is_empty() {
        bail!("--streams and --rate need at least one value each, streams above 0");
    }
    if args.clients == 0 || args.in_flight == 0 || duration == 0 {
        bail!("--clients, --in-flight and --duration must be positive");
    }
    let config = AppendConfig {
        clients: args.clients,
        in_flight: args.in_flight,
        warmup: Duration::from_secs(warmup),
        duration: Duration::from_secs(duration),
        progress: true,
    };
    let measured_on = format!(
        "{} {}-core",
        format_instant(now_ns()),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let data_dir = args.out.join("data");
    let mut rows: Vec<Measured> = Vec::new();
    for &stream_count in &streams {
        for &rate in &rates {
            let report = super::with_server_process(&data_dir, |server| {
                Ok(w3::run_step(&config, server, stream_count, rate)?)
            })?;
            rows.push(Measured {
                system: "tidemark".into(),
                durability: TIDEMARK_DURABILITY.into(),
                report,
            });
        }
    }
    for peer in &peers {
        if peer != "kafka" {
            println!("{peer} skipped: the harness has no W3 adapter for it");
            continue;
        }
        for flush in [Flush::EveryAppend, Flush::OsCache] {
            let durability = match flush {
                Flush::EveryAppend => "fsync per append (log.flush.interval.messages=1)",
                Flush::OsCache => "os cache, no fsync (Kafka's default)",
            };
            match w3_peers::run_kafka(
                &args.out.join("peers"),
                flush,
                &streams,
                &rates,
                config.duration,
            ) {
                Err(skipped) => println!("{skipped}"),
                Ok(steps) => {
                    for step in steps {
                        match step {
                            Ok(report) => rows.push(Measured {
                                system: "kafka".into(),
                                durability: durability.into(),
                                report,
                            }),
                            Err(e) => println!("kafka step failed: {e}"),
                        }
                    }
                }
            }
        }
    }
    let limit = physical_limit(&args.out)?;
    write_csv(&args.out, &rows, &measured_on)?;
    print_table(&rows, &limit);
    append_summary(&args.out, &figures(&rows, &limit))?;
    draw_charts(&args.out, &rows)?;
    println!(
        "steps written to {}, charts to append-throughput.png and append-p99.png",
        args.out.join("append.csv").display()
    );
    Ok(())
}

/// The same bytes written sequentially in 64 KiB chunks, each fsync'd: MB/s and one fsync.
struct PhysicalLimit {
    mb_per_s: f64,
    fsync_ms: f64,
}

fn physical_limit(out: &Path) -> Result<PhysicalLimit> {
    const TOTAL: usize = 256 << 20;
    let took = sequential_fsync(out, TOTAL, BATCH_BYTES).context("measuring the disk")?;
    Ok(PhysicalLimit {
        mb_per_s: TOTAL as f64 / 1e6 / took.as_secs_f64(),
        fsync_ms: took.as_secs_f64() * 1000.0 / (TOTAL / BATCH_BYTES) as f64,
    })
}

fn write_csv(out: &Path, rows: &[Measured], measured_on: &str) -> Result<()> {
    let rows = rows.iter().map(|row| w3::csv_row(row, measured_on));
    crate::csv_file::write(out, "append.csv", w3::CSV_HEADER, rows)?;
    Ok(())
}

fn print_table(rows: &[Measured], limit: &PhysicalLimit) {
    println!(
        "W3 append: 64 KiB batches to a random stream (Kafka: partition); physical limit {:.0} MB/s of fsync'd 64 KiB writes, one fsync {:.2} ms",
        limit.mb_per_s, limit.fsync_ms
    );
    println!(
        "{:>8} {:>5} {:>8} {:>8} {:>6} {:>25} {:>25} {:>6} {:>7} {:>8}  durability",
        "system",
        "strm",
        "target",
        "MB/s",
        "limit",
        "e2e avg/p95/p99/p99.9 ms",
        "server avg/p99/p99.9 ms",
        "cores",
        "RSS MB",
        "tm/peer"
    );
    for Measured {
        system,
        durability,
        report: r,
    } in rows
    {
        let e = &r.end_to_end;
        let server = r.server.map_or("-".to_string(), |s| {
            format!("{:.2}/{:.2}/{:.2}", s.avg_ms, s.p99_ms, s.p999_ms)
        });
        let (cores, rss) = r.usage.map_or(("-".into(), "-".into()), |u| {
            (
                format!("{:.2}", u.cores),
                format!("{:.0}", u.peak_rss_bytes as f64 / 1e6),
            )
        });
        let behind = if r.behind > 0 {
            format!(" (fell behind: {} unsent)", r.behind)
        } else {
            String::new()
        };
        // Throughput of Tidemark's step at the same streams and rate over this one's.
        let ratio = match tidemark_twin(rows, r).filter(|_| system != "tidemark") {
            Some(ours) => format!(
                "{:.2}x",
                ours.achieved_mb_per_s / r.achieved_mb_per_s.max(1e-9)
            ),
            None => "—".into(),
        };
        println!(
            "{system:>8} {:>5} {:>8} {:>8.1} {:>5.0}% {:>25} {:>25} {cores:>6} {rss:>7} {ratio:>8}  {durability}{behind}",
            r.streams,
            r.rate.label(),
            r.achieved_mb_per_s,
            100.0 * r.achieved_mb_per_s / limit.mb_per_s,
            format!(
                "{:.2}/{:.2}/{:.2}/{:.2}",
                e.avg_ms, e.p95_ms, e.p99_ms, e.p999_ms
            ),
            server,
        );
    }
}

/// Tidemark's row at the same stream count and rate as a peer's row.
fn tidemark_twin<'a>(rows: &'a [Measured], peer: &StepReport) -> Option<&'a StepReport> {
    rows.iter()
        .find(|m| {
            m.system == "tidemark" && m.report.streams == peer.streams && m.report.rate == peer.rate
        })
        .map(|m| &m.report)
}

fn figures(rows: &[Measured], limit: &PhysicalLimit) -> Vec<Figure> {
    let mut figures = vec![
        Figure::new(
            "W3",
            "disk",
            "sequential 64 KiB writes, fsync each",
            "throughput",
            limit.mb_per_s,
            "MB/s",
        ),
        Figure::new(
            "W3",
            "disk",
            "one 64 KiB write + fsync",
            "latency",
            limit.fsync_ms,
            "ms",
        ),
    ];
    for Measured {
        system,
        durability,
        report: r,
    } in rows
    {
        let unit = if system == "kafka" {
            "partitions"
        } else {
            "streams"
        };
        let variant = format!("{} {unit}, {}, {durability}", r.streams, r.rate.label());
        let mut figure = |metric: &str, value: f64, unit: &str| {
            figures.push(Figure::new("W3", system, &variant, metric, value, unit))
        };
        figure("throughput", r.achieved_mb_per_s, "MB/s");
        figure(
            "fraction_of_physical_limit",
            r.achieved_mb_per_s / limit.mb_per_s,
            "x",
        );
        figure("avg_e2e_ms", r.end_to_end.avg_ms, "ms");
        figure("p95_e2e_ms", r.end_to_end.p95_ms, "ms");
        figure("p99_e2e_ms", r.end_to_end.p99_ms, "ms");
        figure("p999_e2e_ms", r.end_to_end.p999_ms, "ms");
        if let Some(s) = r.server {
            figure("avg_server_ms", s.avg_ms, "ms");
            figure("p95_server_ms", s.p95_ms, "ms");
            figure("p99_server_ms", s.p99_ms, "ms");
            figure("p999_server_ms", s.p999_ms, "ms");
        }
        if let Some(u) = r.usage {
            figure("server_cpu_cores", u.cores, "cores");
            figure("server_rss_mb", u.peak_rss_bytes as f64 / 1e6, "MB");
        }
        if let Some(ours) = tidemark_twin(rows, r).filter(|_| system != "tidemark") {
            figure(
                "tidemark_over_peer_throughput",
                ours.achieved_mb_per_s / r.achieved_mb_per_s.max(1e-9),
                "x",
            );
            figure(
                "tidemark_over_peer_p99_e2e",
                ours.end_to_end.p99_ms / r.end_to_end.p99_ms.max(1e-9),
                "x",
            );
        }
    }
    figures
}

fn draw_charts(out: &Path, rows: &[Measured]) -> Result<()> {
    let streams = |n: f64| format!("{n:.0}");
    chart::draw(
        &out.join("append-throughput.png"),
        &LogChart {
            title: "W3 append: achieved MB/s of 64 KiB batches",
            x_label: "streams (Kafka: partitions)",
            y_label: "MB/s",
            x_ticks: streams,
            series: &w3::chart_series(rows, |r| r.achieved_mb_per_s),
        },
    )?;
    chart::draw(
        &out.join("append-p99.png"),
        &LogChart {
            title: "W3 append: p99 end-to-end latency",
            x_label: "streams (Kafka: partitions)",
            y_label: "ms",
            x_ticks: streams,
            series: &w3::chart_series(rows, |r| r.end_to_end.p99_ms),
        },
    )?;
    Ok(())
}

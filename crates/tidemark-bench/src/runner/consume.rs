//! `tidemark bench consume`: W5 ([`crate::w5`]) against a Tidemark server process (a fresh
//! one per latency step, one for catch-up, one for idle subscriptions) and the peers' consumers
//! (Kafka, Redis Streams, NATS JetStream), at half the disk's limit measured in the same run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tidemark_query::output::csv_cell;
use tidemark_query::time::{format_instant, now_ns};

use crate::chart::{self, LogChart, Series};
use crate::disk::{sequential_fsync, sequential_read};
use crate::summary::{append_summary, Figure};
use crate::w5::{self, CatchUpStep, ConsumePlan, LatencyStep, SystemReport, BATCH_BYTES};
use crate::w5_peers;

#[derive(clap::Args)]
pub struct ConsumeArgs {
    /// Stream counts of the live-latency steps, comma-separated (each batch goes to a
    /// random one; one consumer follows them all) [default: 1,100,2000; with --quick: 1,100].
    #[arg(long, value_delimiter = ',')]
    streams: Option<Vec<usize>>,
    /// Target rate of the latency steps in MB/s of payload [default: half of what the disk
    /// does for fsync'd sequential 64 KiB writes, measured first].
    #[arg(long)]
    rate: Option<f64>,
    /// Measured seconds per latency step [default: 10; with --quick: 3].
    #[arg(long)]
    duration: Option<u64>,
    /// Seconds of warm-up before each latency step's measurement [default: 2; with --quick: 1].
    #[arg(long)]
    warmup: Option<u64>,
    /// MB of payload in the stream the catch-up consumers read [default: 1000; with
    /// --quick: 128].
    #[arg(long)]
    catch_up_mb: Option<u64>,
    /// Catch-up consumer counts, comma-separated, all reading the same stream at once
    /// [default: 1,10,100; with --quick: 1,10].
    #[arg(long, value_delimiter = ',')]
    consumers: Option<Vec<usize>>,
    /// Idle subscriptions whose memory is measured [default: 1000; with --quick: 256].
    #[arg(long)]
    idle: Option<usize>,
    /// Smaller defaults, so that `bench all --quick` ends in minutes.
    #[arg(long)]
    quick: bool,
    /// Peers to run the same steps against: kafka, redis, nats (comma-separated), all or
    /// none. A peer that is not installed is skipped with the reason.
    #[arg(long, default_value = "none")]
    peers: String,
    /// Directory for consume.csv, summary.csv/.md and the charts (servers' data go in
    /// DIR/data, removed after).
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

const TIDEMARK_DURABILITY: &str = "fsync per batch (group commit)";
/// `limits.max_subscriptions` when the configuration does not set it.
const DEFAULT_MAX_SUBSCRIPTIONS: usize = 1024;
/// The Tidemark stream the catch-up consumers read.
const CATCH_UP_STREAM: &str = "w5_catch_up";

impl ConsumeArgs {
    /// The defaults of `bench consume`, for `bench all`.
    pub fn defaults(quick: bool, peers: &str, out: PathBuf) -> ConsumeArgs {
        ConsumeArgs {
            streams: None,
            rate: None,
            duration: None,
            warmup: None,
            catch_up_mb: None,
            consumers: None,
            idle: None,
            quick,
            peers: peers.into(),
            out,
        }
    }

    fn plan(&self, disk_mb_per_s: f64) -> Result<ConsumePlan> {
        let quick = self.quick;
        let plan = ConsumePlan {
            stream_counts: self.streams.clone().unwrap_or_else(|| match quick {
                true => vec![1, 100],
                false => vec![1, 100, 2000],
            }),
            target_mb_per_s: self.rate.unwrap_or(disk_mb_per_s / 2.0),
            warmup: Duration::from_secs(self.warmup.unwrap_or(if quick { 1 } else { 2 })),
            duration: Duration::from_secs(self.duration.unwrap_or(if quick { 3 } else { 10 })),
            catch_up_bytes: self.catch_up_mb.unwrap_or(if quick { 128 } else { 1000 }) * 1_000_000,
            consumer_counts: self.consumers.clone().unwrap_or_else(|| match quick {
                true => vec![1, 10],
                false => vec![1, 10, 100],
            }),
            idle_subscriptions: self.idle.unwrap_or(if quick { 256 } else { 1000 }),
        };
        if plan.stream_counts.is_empty() || plan.stream_counts.contains(&0) {
            bail!("--streams needs at least one count, each above 0");
        }
        if plan.consumer_counts.is_empty() || plan.consumer_counts.contains(&0) {
            bail!("--consumers needs at least one count, each above 0");
        }
        if !(plan.target_mb_per_s.is_finite() && plan.target_mb_per_s > 0.0) {
            bail!("--rate must be a positive number of MB/s");
        }
        if plan.duration.is_zero() || plan.catch_up_bytes == 0 || plan.idle_subscriptions == 0 {
            bail!("--duration, --catch-up-mb and --idle must be positive");
        }
        Ok(plan)
    }
}

/// What the machine itself does, measured in the same run: the references every figure is
/// quoted against.
struct Limits {
    /// Sequential 64 KiB writes, each fsync'd (W3's physical limit).
    fsync_write_mb_per_s: f64,
    /// A file of the catch-up size read back sequentially right after it was written (so
    /// from the page cache, as the catch-up streams are read).
    cached_read_mb_per_s: f64,
}

fn measure_limits(out: &Path, catch_up_bytes: u64) -> Result<Limits> {
    const WRITTEN: usize = 256 << 20;
    let took = sequential_fsync(out, WRITTEN, BATCH_BYTES).context("measuring the disk")?;
    let read = catch_up_bytes.min(4 << 30) as usize;
    let read_took = sequential_read(out, read, 1 << 20).context("measuring reads")?;
    Ok(Limits {
        fsync_write_mb_per_s: WRITTEN as f64 / 1e6 / took.as_secs_f64(),
        cached_read_mb_per_s: read as f64 / 1e6 / read_took.as_secs_f64(),
    })
}

pub fn run(args: ConsumeArgs) -> Result<()> {
    let peers = crate::peers::parse_selection(&args.peers).map_err(anyhow::Error::msg)?;
    let catch_up_bytes = args.plan(1.0)?.catch_up_bytes;
    let limits = measure_limits(&args.out, catch_up_bytes)?;
    let plan = args.plan(limits.fsync_write_mb_per_s)?;
    let measured_on = format!(
        "{} {}-core",
        format_instant(now_ns()),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "W5 consume: disk {:.0} MB/s of fsync'd 64 KiB writes, latency steps at {:.0} MB/s; cached sequential read {:.0} MB/s",
        limits.fsync_write_mb_per_s, plan.target_mb_per_s, limits.cached_read_mb_per_s
    );
    let mut reports = vec![run_tidemark(&args.out.join("data"), &plan)?];
    for peer in &peers {
        let dir = args.out.join("peers");
        let ran = match peer.as_str() {
            "kafka" => w5_peers::kafka::run(&dir, &plan),
            "redis" => w5_peers::redis::run(&dir, &plan),
            "nats" => w5_peers::nats::run(&dir, &plan),
            other => {
                println!("{other} skipped: the harness has no W5 adapter for it");
                continue;
            }
        };
        match ran {
            Ok(peer_reports) => reports.extend(peer_reports),
            Err(skipped) => println!("{skipped}"),
        }
    }
    write_csv(&args.out, &reports, &measured_on)?;
    print_tables(&reports, &limits);
    append_summary(&args.out, &figures(&reports, &limits))?;
    draw_charts(&args.out, &reports)?;
    println!(
        "steps written to {}, charts to consume-latency.png and consume-fanout.png",
        args.out.join("consume.csv").display()
    );
    Ok(())
}

fn run_tidemark(data_dir: &Path, plan: &ConsumePlan) -> Result<SystemReport> {
    let mut latency = Vec::new();
    for &streams in &plan.stream_counts {
        let config = subscriptions_config(streams);
        let step = super::with_configured_server(data_dir, config.as_deref(), |server| {
            Ok(w5::tidemark_latency(server, plan, streams, true)?)
        });
        latency.push(step.map_err(|e| format!("{e:#}")));
    }
    let mut catch_up = Vec::new();
    let mut idle = None;
    let most_consumers = plan.consumer_counts.iter().copied().max().unwrap_or(1);
    let config = subscriptions_config(most_consumers);
    super::with_configured_server(data_dir, config.as_deref(), |server| {
        let batches = plan.catch_up_batches();
        let bar = crate::w1::progress_bar_in(true, 1, "filling the catch-up stream", "streams");
        w5::tidemark_fill(server, CATCH_UP_STREAM, batches)?;
        bar.finish_and_clear();
        for &consumers in &plan.consumer_counts {
            catch_up.push(
                w5::tidemark_catch_up(server, CATCH_UP_STREAM, batches, consumers)
                    .map_err(|e| e.to_string()),
            );
        }
        Ok(())
    })?;
    // On a server of its own: one that has just served gigabytes holds freed memory its
    // allocator hands to the next allocations, and would show the subscriptions as free.
    let config = subscriptions_config(plan.idle_subscriptions);
    super::with_configured_server(data_dir, config.as_deref(), |server| {
        idle = Some(w5::tidemark_idle(server, plan.idle_subscriptions).map_err(|e| e.to_string()));
        Ok(())
    })?;
    Ok(SystemReport {
        system: "tidemark".into(),
        durability: TIDEMARK_DURABILITY.into(),
        latency,
        catch_up,
        idle,
    })
}

/// The server's configuration for `subscriptions` at once, when more than its default
/// allows: one subscription follows one stream, so a consumer of more streams (or more
/// consumers) than the limit needs it raised, as its operator would.
fn subscriptions_config(subscriptions: usize) -> Option<String> {
    (subscriptions > DEFAULT_MAX_SUBSCRIPTIONS)
        .then(|| format!("[limits]\nmax_subscriptions = {}\n", subscriptions + 64))
}

const CSV_HEADER: &str = "system,durability,step,streams,consumers,target_mb_per_s,mb_per_s,\
count,avg_ms,p50_ms,p95_ms,p99_ms,p999_ms,max_ms,behind,server_cores,server_rss_mb,\
bytes_per_subscription,error,measured_on";

fn write_csv(out: &Path, reports: &[SystemReport], measured_on: &str) -> Result<()> {
    let mut rows = Vec::new();
    for report in reports {
        let head = format!(
            "{},{}",
            csv_cell(&report.system),
            csv_cell(&report.durability)
        );
        let usage = |u: Option<crate::process::Usage>| {
            u.map_or(",".to_string(), |u| {
                format!("{:.3},{:.1}", u.cores, u.peak_rss_bytes as f64 / 1e6)
            })
        };
        for step in &report.latency {
            rows.push(match step {
                Ok(s) => {
                    let l = s.latency.map_or(",,,,,,".to_string(), |l| {
                        format!(
                            "{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3}",
                            l.count, l.avg_ms, l.p50_ms, l.p95_ms, l.p99_ms, l.p999_ms, l.max_ms
                        )
                    });
                    format!(
                        "{head},latency,{},1,{:.1},{:.1},{l},{},{},,,{}",
                        s.streams,
                        s.target_mb_per_s,
                        s.delivered_mb_per_s,
                        s.behind,
                        usage(s.usage),
                        csv_cell(measured_on)
                    )
                }
                Err(e) => format!(
                    "{head},latency,,,,,,,,,,,,,,,,{},{}",
                    csv_cell(e),
                    csv_cell(measured_on)
                ),
            });
        }
        for step in &report.catch_up {
            rows.push(match step {
                Ok(s) => format!(
                    "{head},catch_up,1,{},,{:.1},,,,,,,,,{},,,{}",
                    s.consumers,
                    s.aggregate_mb_per_s,
                    usage(s.usage),
                    csv_cell(measured_on)
                ),
                Err(e) => format!(
                    "{head},catch_up,,,,,,,,,,,,,,,,{},{}",
                    csv_cell(e),
                    csv_cell(measured_on)
                ),
            });
        }
        match &report.idle {
            Some(Ok(idle)) => rows.push(format!(
                "{head},idle,1,{},,,,,,,,,,,,,{:.0},,{}",
                idle.subscriptions,
                idle.bytes_per_subscription,
                csv_cell(measured_on)
            )),
            Some(Err(e)) => rows.push(format!(
                "{head},idle,,,,,,,,,,,,,,,,{},{}",
                csv_cell(e),
                csv_cell(measured_on)
            )),
            None => {}
        }
    }
    crate::csv_file::write(out, "consume.csv", CSV_HEADER, rows)?;
    Ok(())
}

fn print_tables(reports: &[SystemReport], limits: &Limits) {
    println!("\nlive latency: due → received by the consumer, 64 KiB batches to a random stream");
    println!(
        "{:>8} {:>5} {:>7} {:>9} {:>32} {:>7} {:>6} {:>7}  durability",
        "system",
        "strm",
        "target",
        "delivered",
        "p50/p99/p99.9/max ms",
        "behind",
        "cores",
        "RSS MB"
    );
    for report in reports {
        for step in &report.latency {
            match step {
                Ok(s) => {
                    let l = s.latency.map_or("nothing arrived".to_string(), |l| {
                        format!(
                            "{:.2}/{:.2}/{:.2}/{:.2}",
                            l.p50_ms, l.p99_ms, l.p999_ms, l.max_ms
                        )
                    });
                    let (cores, rss) = s.usage.map_or(("-".into(), "-".into()), |u| {
                        (
                            format!("{:.2}", u.cores),
                            format!("{:.0}", u.peak_rss_bytes as f64 / 1e6),
                        )
                    });
                    println!(
                        "{:>8} {:>5} {:>7.0} {:>9.1} {l:>32} {:>7} {cores:>6} {rss:>7}  {}",
                        report.system,
                        s.streams,
                        s.target_mb_per_s,
                        s.delivered_mb_per_s,
                        s.behind,
                        report.durability
                    );
                }
                Err(e) => println!("{:>8} latency step failed: {e}", report.system),
            }
        }
    }
    println!(
        "\ncatch-up: consumers reading one stream from its start at once (cached sequential read here: {:.0} MB/s)",
        limits.cached_read_mb_per_s
    );
    println!(
        "{:>8} {:>9} {:>12} {:>14} {:>9}",
        "system", "consumers", "aggregate MB/s", "of cached read", "tm/peer"
    );
    for report in reports {
        for step in &report.catch_up {
            match step {
                Ok(s) => {
                    let ratio = tidemark_catch_up(reports, s.consumers)
                        .filter(|_| report.system != "tidemark")
                        .map_or("—".to_string(), |ours| {
                            format!("{:.2}x", ours.aggregate_mb_per_s / s.aggregate_mb_per_s)
                        });
                    println!(
                        "{:>8} {:>9} {:>14.0} {:>13.0}% {ratio:>9}",
                        report.system,
                        s.consumers,
                        s.aggregate_mb_per_s,
                        100.0 * s.aggregate_mb_per_s / limits.cached_read_mb_per_s
                    );
                }
                Err(e) => println!("{:>8} catch-up step failed: {e}", report.system),
            }
        }
    }
    println!("\nidle subscriptions: the server's resident memory per subscription");
    for report in reports {
        match &report.idle {
            Some(Ok(idle)) => println!(
                "{:>8} {:>6} subscriptions: {:.0} bytes each",
                report.system, idle.subscriptions, idle.bytes_per_subscription
            ),
            Some(Err(e)) => println!("{:>8} idle step failed: {e}", report.system),
            None => {}
        }
    }
}

/// Tidemark's catch-up step with `consumers` consumers.
fn tidemark_catch_up(reports: &[SystemReport], consumers: usize) -> Option<&CatchUpStep> {
    reports
        .iter()
        .filter(|r| r.system == "tidemark")
        .flat_map(|r| r.catch_up.iter().flatten())
        .find(|s| s.consumers == consumers)
}

/// Tidemark's latency step at `streams` streams.
fn tidemark_latency(reports: &[SystemReport], streams: usize) -> Option<&LatencyStep> {
    reports
        .iter()
        .filter(|r| r.system == "tidemark")
        .flat_map(|r| r.latency.iter().flatten())
        .find(|s| s.streams == streams)
}

fn figures(reports: &[SystemReport], limits: &Limits) -> Vec<Figure> {
    let mut figures = vec![
        Figure::new(
            "W5",
            "disk",
            "sequential 64 KiB writes, fsync each",
            "throughput",
            limits.fsync_write_mb_per_s,
            "MB/s",
        ),
        Figure::new(
            "W5",
            "disk",
            "sequential read of a just-written file (page cache)",
            "throughput",
            limits.cached_read_mb_per_s,
            "MB/s",
        ),
    ];
    for report in reports {
        let system = report.system.as_str();
        for s in report.latency.iter().flatten() {
            let variant = format!(
                "{} streams at {:.0} MB/s, {}",
                s.streams, s.target_mb_per_s, report.durability
            );
            let mut figure = |metric: &str, value: f64, unit: &str| {
                figures.push(Figure::new("W5", system, &variant, metric, value, unit))
            };
            figure("delivered", s.delivered_mb_per_s, "MB/s");
            if let Some(l) = s.latency {
                figure("p50_e2e_ms", l.p50_ms, "ms");
                figure("p99_e2e_ms", l.p99_ms, "ms");
                figure("p999_e2e_ms", l.p999_ms, "ms");
            }
            if let Some(u) = s.usage {
                figure("server_cpu_cores", u.cores, "cores");
                figure("server_rss_mb", u.peak_rss_bytes as f64 / 1e6, "MB");
            }
            let ours = tidemark_latency(reports, s.streams).filter(|_| system != "tidemark");
            if let (Some(ours), Some(theirs)) = (ours.and_then(|o| o.latency), s.latency) {
                figure(
                    "tidemark_over_peer_p99_e2e",
                    ours.p99_ms / theirs.p99_ms.max(1e-9),
                    "x",
                );
            }
        }
        for s in report.catch_up.iter().flatten() {
            let variant = format!(
                "{} consumers of {:.0} MB",
                s.consumers,
                s.stream_bytes as f64 / 1e6
            );
            let mut figure = |metric: &str, value: f64, unit: &str| {
                figures.push(Figure::new("W5", system, &variant, metric, value, unit))
            };
            figure("aggregate_read", s.aggregate_mb_per_s, "MB/s");
            figure(
                "fraction_of_cached_read",
                s.aggregate_mb_per_s / limits.cached_read_mb_per_s,
                "x",
            );
            if let Some(ours) =
                tidemark_catch_up(reports, s.consumers).filter(|_| system != "tidemark")
            {
                figure(
                    "tidemark_over_peer_aggregate",
                    ours.aggregate_mb_per_s / s.aggregate_mb_per_s.max(1e-9),
                    "x",
                );
            }
        }
        if let Some(Ok(idle)) = &report.idle {
            figures.push(Figure::new(
                "W5",
                system,
                &format!("{} idle subscriptions", idle.subscriptions),
                "memory_per_subscription",
                idle.bytes_per_subscription,
                "bytes",
            ));
        }
    }
    figures
}

fn draw_charts(out: &Path, reports: &[SystemReport]) -> Result<()> {
    let label = |r: &SystemReport| format!("{}, {}", r.system, r.durability);
    let latency: Vec<Series> = reports
        .iter()
        .map(|r| Series {
            label: label(r),
            points: r
                .latency
                .iter()
                .flatten()
                .filter_map(|s| Some((s.streams as f64, s.latency?.p99_ms)))
                .collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    chart::draw(
        &out.join("consume-latency.png"),
        &LogChart {
            title: "W5 consume: p99 latency, due to received, at half the disk's limit",
            x_label: "streams (Kafka: partitions, Redis: keys, NATS: subjects)",
            y_label: "ms",
            x_ticks: |n| format!("{n:.0}"),
            series: &latency,
        },
    )?;
    let fanout: Vec<Series> = reports
        .iter()
        .map(|r| Series {
            label: r.system.clone(),
            points: r
                .catch_up
                .iter()
                .flatten()
                .map(|s| (s.consumers as f64, s.aggregate_mb_per_s))
                .collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    chart::draw(
        &out.join("consume-fanout.png"),
        &LogChart {
            title: "W5 consume: catch-up, aggregate MB/s of consumers reading one stream",
            x_label: "consumers",
            y_label: "MB/s",
            x_ticks: |n| format!("{n:.0}"),
            series: &fanout,
        },
    )?;
    Ok(())
}

//! `tidemark bench metrics` (W2): recorded host metrics replayed into a Tidemark server
//! process over its binary protocol, into another fed Prometheus remote-write requests
//! (`tidemark-rw`), and into Prometheus with the same requests, then the two queries; and `tidemark bench record-metrics`,
//! which records this host's /proc once a second into the kind of file W2 replays.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::chart::{self, Bar};
use crate::host_metrics::{self, Recording};
use crate::peers::prometheus::{promtool_bench_write, promtool_labels, Prometheus, PromtoolWrite};
use crate::peers::Skipped;
use crate::summary::{append_summary, Figure};
use crate::w1::progress_bar_in;
use crate::w2::{
    replay, time_queries, IngestReport, Layout, Query, QueryTiming, ReplayConfig, Stored,
    TidemarkMetrics, DEFAULT_POINTS_PER_SECOND, SHIPPED_RECORDING,
};
use crate::w2_peers::{PrometheusMetrics, TidemarkRemoteWrite};
use anyhow::{bail, Context, Result};
use tidemark_query::output::csv_cell;
use tidemark_query::time::{format_instant, now_ns};

#[derive(clap::Args)]
pub struct RecordArgs {
    /// How long to record, in seconds (one row a second).
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// The gzip'd CSV to write.
    #[arg(long, default_value = "host-metrics.csv.gz")]
    out: PathBuf,
}

pub fn record(args: RecordArgs) -> Result<()> {
    let series = host_metrics::sample().context("reading /proc")?.len();
    println!(
        "recording {series} series of this host once a second for {} s into {}",
        args.seconds,
        args.out.display()
    );
    let bar = progress_bar_in(true, args.seconds as usize, "recording", "s");
    host_metrics::record(args.seconds, &args.out, |taken| bar.set_position(taken))
        .with_context(|| format!("recording into {}", args.out.display()))?;
    bar.finish();
    Ok(())
}

#[derive(clap::Args)]
pub struct MetricsArgs {
    /// Live points a second (one per series per second): the recording's series times as
    /// many hosts as make this number.
    #[arg(long, default_value_t = DEFAULT_POINTS_PER_SECOND)]
    points_per_second: usize,
    /// Seconds of history backfilled (as fast as the target takes it) before the live part,
    /// so the queries over the last hour have data [default: 3600; with --quick: 300].
    #[arg(long)]
    history: Option<u64>,
    /// Live seconds, at the wall clock's pace [default: 60; with --quick: 15].
    #[arg(long)]
    duration: Option<u64>,
    /// Consecutive runs of each query after the first (their median is reported) [default:
    /// 20; with --quick: 5].
    #[arg(long)]
    query_runs: Option<usize>,
    /// Sending threads, each with one connection and a share of the hosts.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// A recording from `bench record-metrics` [default: the one shipped with Tidemark].
    #[arg(long)]
    recording: Option<PathBuf>,
    /// Smaller defaults, so that every workload of `bench all --quick` ends in minutes.
    #[arg(long)]
    quick: bool,
    /// Peers to run the same replay against: prometheus (the others have no W2 adapter; it
    /// also runs `promtool tsdb bench write` over the same series), all or none. A peer
    /// that is not installed is skipped with the reason.
    #[arg(long, default_value = "none")]
    peers: String,
    /// Directory for metrics.csv, summary.csv/.md and the charts metrics-*.png (the
    /// servers' data go in DIR/data and DIR/peers, removed after).
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

impl MetricsArgs {
    /// The defaults of `bench metrics`, for `bench all`.
    pub fn defaults(quick: bool, peers: &str, out: PathBuf) -> MetricsArgs {
        MetricsArgs {
            points_per_second: DEFAULT_POINTS_PER_SECOND,
            history: None,
            duration: None,
            query_runs: None,
            workers: 4,
            recording: None,
            quick,
            peers: peers.into(),
            out,
        }
    }
}

/// One system's figures.
struct Row {
    system: &'static str,
    durability: &'static str,
    ingest: IngestReport,
    stored: Stored,
    queries: Vec<QueryTiming>,
}

/// Tidemark fed Prometheus remote-write requests (a stream per series) rather than its
/// binary protocol (a stream per host).
const TIDEMARK_REMOTE_WRITE: &str = "tidemark-rw";

/// Whether a row is Tidemark's (the others are peers, compared with it).
fn is_tidemark(row: &Row) -> bool {
    row.system == "tidemark" || row.system == TIDEMARK_REMOTE_WRITE
}

const TIDEMARK_DURABILITY: &str = "fsync per request (group commit)";
const PROMETHEUS_DURABILITY: &str = "os cache (WAL without fsync per request)";

pub fn run(args: MetricsArgs) -> Result<()> {
    let quick = args.quick;
    let history = args.history.unwrap_or(if quick { 300 } else { 3600 });
    let duration = args.duration.unwrap_or(if quick { 15 } else { 60 });
    let query_runs = args.query_runs.unwrap_or(if quick { 5 } else { 20 });
    if duration == 0 || args.workers == 0 || args.points_per_second == 0 {
        bail!("--duration, --workers and --points-per-second must be positive");
    }
    let peers = crate::peers::parse_selection(&args.peers).map_err(anyhow::Error::msg)?;
    let recording = match &args.recording {
        Some(path) => Recording::load(path)
            .with_context(|| format!("reading the recording {}", path.display()))?,
        None => Recording::read(SHIPPED_RECORDING).context("reading the shipped recording")?,
    };
    let rows_recorded = recording.rows.len();
    let layout = Layout::new(recording, args.points_per_second);
    println!(
        "W2 metrics: {} series recorded over {rows_recorded} s, replayed as {} hosts = {} points/s; \
         {history} s of history backfilled, then {duration} s live",
        layout.series(),
        layout.hosts(),
        layout.points_per_second()
    );
    let config = ReplayConfig {
        history: Duration::from_secs(history),
        duration: Duration::from_secs(duration),
        workers: args.workers,
        progress: true,
    };
    let queries = Query::both(&layout);
    let measured_on = format!(
        "{} {}-core",
        format_instant(now_ns()),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let mut rows = Vec::new();
    let tidemark = super::with_server_process(&args.out.join("data"), |server| {
        let target = TidemarkMetrics::create(server.clone(), &layout)?;
        let ingest = replay(&target, &layout, &config)?;
        let timings = time_queries(&target, &queries, query_runs)?;
        let stored = target.stored(&layout)?;
        Ok(Row {
            system: "tidemark",
            durability: TIDEMARK_DURABILITY,
            ingest,
            stored,
            queries: timings,
        })
    })?;
    rows.push(tidemark);
    // The same server fed what Prometheus is fed: the same remote-write requests.
    let remote_write = super::with_server_process(&args.out.join("data"), |server| {
        let target = TidemarkRemoteWrite::new(server.clone());
        let ingest = replay(&target, &layout, &config)?;
        let timings = time_queries(&target, &queries, query_runs)?;
        let stored = target.stored(&layout)?;
        Ok(Row {
            system: TIDEMARK_REMOTE_WRITE,
            durability: TIDEMARK_DURABILITY,
            ingest,
            stored,
            queries: timings,
        })
    })?;
    rows.push(remote_write);
    let mut promtool = None;
    for peer in &peers {
        if peer != "prometheus" {
            println!("{peer} skipped: the harness has no W2 adapter for it");
            continue;
        }
        match run_prometheus(
            &args.out.join("peers"),
            &layout,
            &config,
            &queries,
            query_runs,
        ) {
            Ok(Ok(row)) => rows.push(row),
            Ok(Err(e)) => println!("prometheus failed: {e:#}"),
            Err(skipped) => println!("{skipped}"),
        }
        let scrapes = if quick { 100 } else { 300 };
        match run_promtool(&args.out.join("peers"), &layout, scrapes) {
            Ok(run) => promtool = Some(run),
            Err(skipped) => println!("{skipped}"),
        }
    }
    print_table(&rows);
    print_ratios(&rows);
    if let Some(run) = &promtool {
        print_promtool(run, &rows);
    }
    write_csv(&args.out, &rows, &measured_on)?;
    let mut summary = figures(&rows);
    if let Some(run) = &promtool {
        summary.extend(promtool_figures(run, &rows));
    }
    append_summary(&args.out, &summary)?;
    draw_charts(&args.out, &rows)?;
    println!(
        "written: {}, summary.csv/.md and the charts metrics-*.png",
        args.out.join("metrics.csv").display()
    );
    Ok(())
}

/// Prometheus through the same replay; `Err` when it could not start (skipped), `Ok(Err)`
/// when it failed while running.
fn run_prometheus(
    dir: &Path,
    layout: &Layout,
    config: &ReplayConfig,
    queries: &[Query],
    query_runs: usize,
) -> std::result::Result<Result<Row>, Skipped> {
    let dir = dir.join("prometheus");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| Skipped::new("prometheus", e.to_string()))?;
    }
    let target = PrometheusMetrics {
        prometheus: Prometheus::start(&dir)?,
    };
    let row = (|| {
        let ingest = replay(&target, layout, config)?;
        let timings = time_queries(&target, queries, query_runs)?;
        let bytes = target
            .prometheus
            .snapshot_bytes()
            .map_err(anyhow::Error::msg)?;
        Ok(Row {
            system: "prometheus",
            durability: PROMETHEUS_DURABILITY,
            stored: Stored {
                bytes,
                points: ingest.points,
            },
            ingest,
            queries: timings,
        })
    })();
    drop(target);
    std::fs::remove_dir_all(&dir).ok();
    Ok(row)
}

/// Prometheus's own write benchmark over the same label sets.
struct PromtoolRun {
    series: usize,
    result: PromtoolWrite,
}

fn run_promtool(dir: &Path, layout: &Layout, scrapes: u32) -> Result<PromtoolRun, Skipped> {
    let hosts: Vec<String> = (0..layout.hosts()).map(Layout::host_name).collect();
    let labels = promtool_labels(hosts.iter().flat_map(|host| {
        layout
            .series_names()
            .iter()
            .map(move |name| (host.as_str(), name.as_str()))
    }));
    let series = layout.points_per_second();
    println!("promtool tsdb bench write: {series} series x {scrapes} scrapes, in one process");
    let result = promtool_bench_write(&dir.join("promtool"), &labels, scrapes);
    std::fs::remove_dir_all(dir.join("promtool")).ok();
    Ok(PromtoolRun {
        series,
        result: result?,
    })
}

impl PromtoolRun {
    fn variant(&self) -> String {
        format!(
            "promtool tsdb bench write, {} series x {} scrapes, in-process TSDB (no network, no fsync per append), synthetic counters",
            self.series,
            self.result.samples / self.series.max(1) as u64
        )
    }
}

/// Tidemark's backfill rate (over the network, fsync'd) over promtool's in-process one:
/// above 1, Tidemark ingests faster.
fn promtool_ratio(run: &PromtoolRun, rows: &[Row]) -> Option<f64> {
    let tidemark = rows.iter().find(|r| r.system == "tidemark")?;
    (run.result.samples_per_second > 0.0)
        .then(|| tidemark.ingest.backfill_points_per_second / run.result.samples_per_second)
}

fn print_promtool(run: &PromtoolRun, rows: &[Row]) {
    println!(
        "{}: {} samples, {:.0} samples/s",
        run.variant(),
        run.result.samples,
        run.result.samples_per_second
    );
    if let Some(ratio) = promtool_ratio(run, rows) {
        println!(
            "tidemark backfill (binary protocol, fsync'd) / promtool in-process ingest: {ratio:.2}x (above 1: Tidemark faster)"
        );
    }
}

fn promtool_figures(run: &PromtoolRun, rows: &[Row]) -> Vec<Figure> {
    let variant = run.variant();
    let mut figures = vec![Figure::new(
        "W2",
        "prometheus",
        &variant,
        "ingest_points_per_second",
        run.result.samples_per_second,
        "points/s",
    )];
    if let Some(ratio) = promtool_ratio(run, rows) {
        figures.push(Figure::new(
            "W2",
            "prometheus",
            &variant,
            "tidemark_backfill_over_peer_ingest_points_per_second",
            ratio,
            "x",
        ));
    }
    figures
}

fn print_table(rows: &[Row]) {
    println!(
        "{:>10} {:>10} {:>10} {:>22} {:>6} {:>7} {:>6} {:>17} {:>17}  durability",
        "system",
        "live pt/s",
        "backfill",
        "lag avg/p99/max ms",
        "cores",
        "RSS MB",
        "bit/pt",
        "q 1h first/next",
        "q 7x1d first/next"
    );
    for row in rows {
        let r = &row.ingest;
        let (cores, rss) = r.usage.map_or(("-".into(), "-".into()), |u| {
            (
                format!("{:.2}", u.cores),
                format!("{:.0}", u.peak_rss_bytes as f64 / 1e6),
            )
        });
        let bits = row
            .stored
            .bits_per_point()
            .map_or("-".into(), |b| format!("{b:.2}"));
        let query = |i: usize| {
            row.queries.get(i).map_or("-".into(), |q| {
                format!("{:.1}/{:.1} ms", ms(q.first), ms(q.consecutive))
            })
        };
        println!(
            "{:>10} {:>10.0} {:>10} {:>22} {cores:>6} {rss:>7} {bits:>6} {:>17} {:>17}  {}",
            row.system,
            r.live_points_per_second,
            crate::chart::short_number(r.backfill_points_per_second),
            format!(
                "{:.1}/{:.1}/{:.1}",
                r.lag.avg_ms, r.lag.p99_ms, r.lag.max_ms
            ),
            query(0),
            query(1),
            row.durability
        );
    }
}

/// The figures compared across systems, lower is better for each: (name, value).
fn compared(row: &Row) -> Vec<(&'static str, Option<f64>)> {
    let query = |i: usize| row.queries.get(i).map(|q| ms(q.consecutive));
    vec![
        ("server_cpu_cores", row.ingest.usage.map(|u| u.cores)),
        (
            "server_rss",
            row.ingest.usage.map(|u| u.peak_rss_bytes as f64),
        ),
        ("bits_per_point", row.stored.bits_per_point()),
        ("lag_p99", Some(row.ingest.lag.p99_ms)),
        ("q_1series_1h", query(0)),
        ("q_7series_1d", query(1)),
    ]
}

/// Tidemark's figure over the peer's, for each compared figure both have.
fn ratios(tidemark: &Row, peer: &Row) -> Vec<(&'static str, f64)> {
    compared(tidemark)
        .into_iter()
        .zip(compared(peer))
        .filter_map(|((name, ours), (_, theirs))| match (ours, theirs) {
            (Some(ours), Some(theirs)) if theirs > 0.0 => Some((name, ours / theirs)),
            _ => None,
        })
        .collect()
}

fn print_ratios(rows: &[Row]) {
    for tidemark in rows.iter().filter(|r| is_tidemark(r)) {
        for peer in rows.iter().filter(|r| !is_tidemark(r)) {
            let text: Vec<String> = ratios(tidemark, peer)
                .iter()
                .map(|(name, ratio)| format!("{name} {ratio:.2}x"))
                .collect();
            println!(
                "{} / {} (below 1: Tidemark uses less or answers sooner): {}",
                tidemark.system,
                peer.system,
                text.join(", ")
            );
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

const CSV_HEADER: &str = "system,durability,hosts,series,points,live_points_per_second,backfill_points_per_second,lag_avg_ms,lag_p99_ms,lag_max_ms,server_cpu_cores,server_rss_mb,stored_bytes,stored_points,bits_per_point,q_1series_1h_first_ms,q_1series_1h_ms,q_1series_1h_rows,q_7series_1d_first_ms,q_7series_1d_ms,q_7series_1d_rows,measured_on";

fn write_csv(out: &Path, rows: &[Row], measured_on: &str) -> Result<()> {
    let lines = rows.iter().map(|row| {
        let r = &row.ingest;
        let optional = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
        let mut cells = vec![
            row.system.to_string(),
            csv_cell(row.durability),
            r.hosts.to_string(),
            r.series.to_string(),
            r.points.to_string(),
            format!("{:.0}", r.live_points_per_second),
            format!("{:.0}", r.backfill_points_per_second),
            format!("{:.3}", r.lag.avg_ms),
            format!("{:.3}", r.lag.p99_ms),
            format!("{:.3}", r.lag.max_ms),
            optional(r.usage.map(|u| u.cores)),
            optional(r.usage.map(|u| u.peak_rss_bytes as f64 / 1e6)),
            row.stored.bytes.to_string(),
            row.stored.points.to_string(),
            optional(row.stored.bits_per_point()),
        ];
        for q in &row.queries {
            cells.push(format!("{:.3}", ms(q.first)));
            cells.push(format!("{:.3}", ms(q.consecutive)));
            cells.push(q.rows.to_string());
        }
        cells.push(csv_cell(measured_on));
        cells.join(",")
    });
    crate::csv_file::write(out, "metrics.csv", CSV_HEADER, lines)?;
    Ok(())
}

fn draw_charts(out: &Path, rows: &[Row]) -> Result<()> {
    let bar = |label: String, group: usize, value: f64| Bar {
        label,
        group,
        value,
    };
    let bits: Vec<Bar> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, row)| Some(bar(row.system.into(), i, row.stored.bits_per_point()?)))
        .collect();
    if !bits.is_empty() {
        chart::draw_bars(
            &out.join("metrics-bits-per-point.png"),
            "W2: bits per point on disk (same series, same points)",
            "bits per point",
            &bits,
        )?;
    }
    let mut lag = Vec::new();
    let mut queries = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let l = &row.ingest.lag;
        for (name, value) in [("avg", l.avg_ms), ("p99", l.p99_ms), ("max", l.max_ms)] {
            lag.push(bar(format!("{} {name}", row.system), i, value));
        }
        for q in &row.queries {
            let name = match q.query {
                Query::OneSeriesHour { .. } => "1x1h",
                Query::SevenSeriesDay { .. } => "7x1d",
            };
            queries.push(bar(format!("{} {name} first", row.system), i, ms(q.first)));
            queries.push(bar(format!("{} {name}", row.system), i, ms(q.consecutive)));
        }
    }
    chart::draw_bars(
        &out.join("metrics-lag.png"),
        "W2: ingest lag, live at 54,000 points/s (from a point's second to its acknowledgement)",
        "ms",
        &lag,
    )?;
    chart::draw_bars(
        &out.join("metrics-queries.png"),
        "W2: max of 1 series in 1 m buckets over 1 h; of 7 series in 1 h buckets over 1 day",
        "ms (first run; median of the next)",
        &queries,
    )?;
    Ok(())
}

fn figures(rows: &[Row]) -> Vec<Figure> {
    let mut figures = Vec::new();
    for row in rows {
        let r = &row.ingest;
        let variant = format!(
            "{} hosts x {} series, {}",
            r.hosts, r.series, row.durability
        );
        let mut figure = |metric: &str, value: f64, unit: &str| {
            figures.push(Figure::new("W2", row.system, &variant, metric, value, unit))
        };
        figure(
            "live_points_per_second",
            r.live_points_per_second,
            "points/s",
        );
        figure(
            "backfill_points_per_second",
            r.backfill_points_per_second,
            "points/s",
        );
        figure("lag_avg_ms", r.lag.avg_ms, "ms");
        figure("lag_p99_ms", r.lag.p99_ms, "ms");
        figure("lag_max_ms", r.lag.max_ms, "ms");
        if let Some(u) = r.usage {
            figure("server_cpu_cores", u.cores, "cores");
            figure("server_rss_mb", u.peak_rss_bytes as f64 / 1e6, "MB");
        }
        if let Some(bits) = row.stored.bits_per_point() {
            figure("bits_per_point", bits, "bits");
        }
        for q in &row.queries {
            figure(&format!("{}_first_ms", q.query.key()), ms(q.first), "ms");
            figure(&format!("{}_ms", q.query.key()), ms(q.consecutive), "ms");
        }
        if !is_tidemark(row) {
            for tidemark in rows.iter().filter(|r| is_tidemark(r)) {
                // tidemark_over_peer_*: fed its binary protocol; tidemark_rw_over_peer_*:
                // fed the peer's own remote-write requests.
                let prefix = tidemark.system.replace('-', "_");
                for (name, ratio) in ratios(tidemark, row) {
                    figure(&format!("{prefix}_over_peer_{name}"), ratio, "x");
                }
            }
        }
    }
    figures
}

//! W1 `insert`: event-store ingest, as in ChronicleDB on a Raft.
//!
//! Events of stream `demo_event_store` (`SYMBOL: STRING, SECURITYTYPE: INTEGER,
//! LASTTRADEPRICE: FLOAT`) with timestamps 0.1 ms apart and random values, appended in
//! batches; each trial is timed from the first append until the last one is acknowledged,
//! i.e. durable (fsync'd). The stream is cleared between trials. Batches are generated
//! before the clock starts: the benchmark measures the store, not the generator.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tidemark_core::sync::IgnorePoison;
use tidemark_core::{AggFn, ColumnData, EventBatch, VarBinary};
use tidemark_engine::{
    AggregateRequest, Aggregation, Db, EngineError, OpenError, Options, ScanRequest, TimeRange,
};
use tidemark_query::time::{format_instant, now_ns};

use crate::chart::Series;
use crate::stats::{max, median};

pub use tidemark_core::workload::w1::{generate, schema, EVENT_SPACING_NS, STREAM};

/// The payload of one full batch of `batch_size` events, the same for every trial (the CSV's
/// buffer size where the batch is counted in events).
pub fn nominal_batch_bytes(batch_size: usize) -> usize {
    generate(batch_size, batch_size, 0, 0)
        .first()
        .map_or(0, payload_bytes)
}

/// The three W1 columns of a batch (SYMBOL, SECURITYTYPE, LASTTRADEPRICE), for the peer
/// adapters that render events their own way, indexed by row; `None` for a batch of another
/// schema or with nulls (whose columns hold the valid rows' values only).
pub fn columns(batch: &EventBatch) -> Option<(&VarBinary, &[i32], &[f32])> {
    if batch.columns().iter().take(3).any(|c| c.null_count() > 0) {
        return None;
    }
    match (
        batch.column(0).data(),
        batch.column(1).data(),
        batch.column(2).data(),
    ) {
        (ColumnData::String(s), ColumnData::Integer(t), ColumnData::Float(p)) => Some((s, t, p)),
        _ => None,
    }
}

/// The payload bytes of a W1 batch: tstart (8), SECURITYTYPE (4), LASTTRADEPRICE (4) and
/// the SYMBOL's bytes for every event.
pub fn payload_bytes(batch: &EventBatch) -> usize {
    let symbols = match batch.column(0).data() {
        ColumnData::String(s) => s.data_len(),
        _ => 0,
    };
    batch.len() * 16 + symbols
}

#[derive(Debug, Clone)]
pub struct InsertConfig {
    pub event_counts: Vec<usize>,
    pub trials: usize,
    pub batch_size: usize,
    /// Threads appending concurrently (their appends share fsyncs).
    pub writers: usize,
    pub data_dir: PathBuf,
    pub options: Options,
    /// Show progress bars on the terminal.
    pub progress: bool,
}

/// One trial: a row of `insert.csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    pub target: String,
    pub node_count: usize,
    pub buffer_type: String,
    pub buffer_size_in_bytes: usize,
    pub event_count: usize,
    pub trial: usize,
    pub duration_ms: f64,
    pub events_per_second: f64,
    pub measured_on: String,
}

pub const CSV_HEADER: &str = "target,node_count,buffer_type,buffer_size_in_bytes,event_count,trial,duration_in_ms,events_per_second,measured_on";

impl Trial {
    /// A trial of `event_count` events that took `elapsed` until the last was durable.
    pub fn timed(
        target: String,
        buffer_type: &str,
        buffer_size_in_bytes: usize,
        event_count: usize,
        trial: usize,
        elapsed: Duration,
        measured_on: &str,
    ) -> Trial {
        let seconds = elapsed.as_secs_f64();
        Trial {
            target,
            node_count: 1,
            buffer_type: buffer_type.to_string(),
            buffer_size_in_bytes,
            event_count,
            trial,
            duration_ms: seconds * 1e3,
            events_per_second: if seconds > 0.0 {
                event_count as f64 / seconds
            } else {
                0.0
            },
            measured_on: measured_on.to_string(),
        }
    }

    pub fn csv_row(&self) -> String {
        format!(
            "{},{},{},{},{},{},{:.3},{:.0},{}",
            self.target,
            self.node_count,
            self.buffer_type,
            self.buffer_size_in_bytes,
            self.event_count,
            self.trial,
            self.duration_ms,
            self.events_per_second,
            self.measured_on
        )
    }
}

/// What a W1 run found besides the trials.
#[derive(Debug, Clone)]
pub struct InsertReport {
    pub trials: Vec<Trial>,
    /// Segment bytes per event after the largest trial, flushed.
    pub compressed_bytes_per_event: Option<f64>,
    /// Max of LASTTRADEPRICE over the last hour in 1-minute buckets, after the largest
    /// trial: (first call, median of 20 calls) right after ingest and after a flush.
    pub query_latency_unflushed: (Duration, Duration),
    pub query_latency_flushed: (Duration, Duration),
    pub query_events: usize,
    /// How long the flush (compression into segments) of the largest trial took after its
    /// last acknowledgement.
    pub flush_after_ingest: Duration,
    /// Scanning every event of the largest trial after the flush: (events, time).
    pub full_scan: (u64, Duration),
    /// Scanning the last minute of events after the flush: (events, time).
    pub minute_scan: (u64, Duration),
    /// The same payload bytes as the largest trial, written sequentially with an fsync per
    /// batch: (bytes, time).
    pub physical_limit: (usize, Duration),
}

/// Why an embedded W1 run failed: opening its database, or working with it.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedRunError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Runs W1 against an embedded database in `config.data_dir`.
pub fn run_embedded(config: &InsertConfig) -> Result<InsertReport, EmbeddedRunError> {
    let db = Db::open(&config.data_dir, config.options.clone())?;
    db.create_stream(STREAM, schema())?;
    let measured_on = format!("{} {}-core", format_instant(now_ns()), cores());
    let mut trials = Vec::new();
    let largest = config.event_counts.iter().copied().max().unwrap_or(0);
    let buffer_bytes = nominal_batch_bytes(config.batch_size);
    for &count in &config.event_counts {
        for trial in 1..=config.trials {
            db.clear(STREAM)?;
            let batches = generate(count, config.batch_size, now_ns(), trial as u64);
            let bar = progress_bar(
                config.progress,
                count,
                &format!("{count} events, trial {trial}/{}", config.trials),
            );
            let elapsed = append_all(&db, batches, config.writers, &bar)?;
            bar.finish_and_clear();
            trials.push(Trial::timed(
                "embedded".into(),
                "blocking",
                buffer_bytes,
                count,
                trial,
                elapsed,
                &measured_on,
            ));
        }
    }
    // The stream now holds the last trial of the last count; measure queries on the largest.
    if config.event_counts.last() != Some(&largest) {
        db.clear(STREAM)?;
        let bar = progress_bar(config.progress, largest, "loading for the query benchmark");
        append_all(
            &db,
            generate(largest, config.batch_size, now_ns(), 0),
            config.writers,
            &bar,
        )?;
        bar.finish_and_clear();
    }
    let query_latency_unflushed = query_latency(&db)?;
    let flushing = Instant::now();
    db.flush()?;
    let flush_after_ingest = flushing.elapsed();
    let query_latency_flushed = query_latency(&db)?;
    let now = now_ns();
    let full_scan = scan_time(&db, TimeRange::ALL)?;
    let minute_scan = scan_time(&db, TimeRange::half_open(now - 60_000_000_000, now + 1))?;
    let compressed_bytes_per_event = db.stream_info(STREAM)?.compressed_bytes_per_event;
    db.clear(STREAM)?;
    db.close()?;
    let sample = generate(
        config.batch_size.min(largest.max(1)),
        config.batch_size,
        0,
        0,
    );
    let batch_bytes = sample.first().map_or(1, payload_bytes);
    let total_bytes = batch_bytes * largest.div_ceil(config.batch_size.max(1));
    let physical = crate::disk::sequential_fsync(&config.data_dir, total_bytes, batch_bytes)
        .map_err(|e| EngineError::InvalidRequest(format!("measuring the disk: {e}")))?;
    Ok(InsertReport {
        trials,
        compressed_bytes_per_event,
        query_latency_unflushed,
        query_latency_flushed,
        query_events: largest,
        flush_after_ingest,
        full_scan,
        minute_scan,
        physical_limit: (total_bytes, physical),
    })
}

/// Appends every batch from `writers` threads; returns the time until the last ack.
fn append_all(
    db: &Db,
    batches: Vec<EventBatch>,
    writers: usize,
    bar: &ProgressBar,
) -> Result<Duration, EngineError> {
    let queue: Vec<Mutex<Option<EventBatch>>> =
        batches.into_iter().map(|b| Mutex::new(Some(b))).collect();
    let next = AtomicUsize::new(0);
    let failure: Mutex<Option<EngineError>> = Mutex::new(None);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..writers.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(slot) = queue.get(i) else { break };
                let Some(batch) = slot.lock().ignore_poison().take() else {
                    break;
                };
                match db.append(STREAM, batch) {
                    Ok(ack) => bar.inc(ack.events as u64),
                    Err(e) => {
                        failure.lock().ignore_poison().get_or_insert(e);
                        next.store(queue.len(), Ordering::Relaxed);
                        break;
                    }
                }
            });
        }
    });
    let elapsed = started.elapsed();
    match failure.into_inner().ignore_poison() {
        Some(e) => Err(e),
        None => Ok(elapsed),
    }
}

/// The W1 query: max of LASTTRADEPRICE over the last hour in 1-minute buckets. Returns the
/// first call's latency and the median of 20 more.
pub fn query_latency(db: &Db) -> Result<(Duration, Duration), EngineError> {
    let now = now_ns();
    let request = AggregateRequest {
        range: TimeRange::half_open(now - 3_600_000_000_000, now + 1),
        bucket_ns: Some(60_000_000_000),
        aggregations: vec![Aggregation::new(AggFn::Max, "LASTTRADEPRICE")],
    };
    let timed = || -> Result<Duration, EngineError> {
        let started = Instant::now();
        let rows = db.aggregate(STREAM, &request)?;
        std::hint::black_box(rows);
        Ok(started.elapsed())
    };
    let first = timed()?;
    let rest = (0..20)
        .map(|_| timed().map(|d| d.as_secs_f64()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((first, Duration::from_secs_f64(median(&rest).unwrap_or(0.0))))
}

/// Scans `range` of the W1 stream, all fields; returns (events, time).
fn scan_time(db: &Db, range: TimeRange) -> Result<(u64, Duration), EngineError> {
    let started = Instant::now();
    let request = ScanRequest {
        range,
        ..ScanRequest::default()
    };
    let mut events = 0u64;
    for batch in db.scan(STREAM, &request)? {
        events += batch?.len() as u64;
    }
    Ok((events, started.elapsed()))
}

pub(crate) fn progress_bar(enabled: bool, total: usize, message: &str) -> ProgressBar {
    progress_bar_in(enabled, total, message, "events")
}

/// A progress bar counting `unit`s.
pub fn progress_bar_in(enabled: bool, total: usize, message: &str, unit: &str) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total as u64);
    if let Ok(style) = ProgressStyle::with_template(&format!(
        "{{msg:28}} [{{bar:30}}] {{human_pos}}/{{human_len}} {unit} ({{per_sec}})"
    )) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message.to_string());
    bar
}

pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Writes `insert.csv` into `dir`.
pub fn write_csv(dir: &Path, trials: &[Trial]) -> std::io::Result<PathBuf> {
    crate::csv_file::write(
        dir,
        "insert.csv",
        CSV_HEADER,
        trials.iter().map(Trial::csv_row),
    )
}

/// The trials of one (buffer size, event count), summarised.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub buffer_bytes: usize,
    pub event_count: usize,
    pub trials: usize,
    pub median_events_per_second: f64,
    pub max_events_per_second: f64,
    pub median_ms: f64,
}

/// Median and max events/s per buffer size and event count, in the order they were run.
pub fn summarise(trials: &[Trial]) -> Vec<Summary> {
    let mut keys: Vec<(usize, usize)> = trials
        .iter()
        .map(|t| (t.buffer_size_in_bytes, t.event_count))
        .collect();
    keys.dedup();
    keys.into_iter()
        .map(|(buffer_bytes, event_count)| {
            let of: Vec<&Trial> = trials
                .iter()
                .filter(|t| t.event_count == event_count && t.buffer_size_in_bytes == buffer_bytes)
                .collect();
            let rates: Vec<f64> = of.iter().map(|t| t.events_per_second).collect();
            let ms: Vec<f64> = of.iter().map(|t| t.duration_ms).collect();
            Summary {
                buffer_bytes,
                event_count,
                trials: of.len(),
                median_events_per_second: median(&rates).unwrap_or(0.0),
                max_events_per_second: max(&rates).unwrap_or(0.0),
                median_ms: median(&ms).unwrap_or(0.0),
            }
        })
        .collect()
}

/// What the x axis of the W1 chart shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChartX {
    BufferBytes,
    EventCount,
}

/// The median events/s of `trials` as chart lines: one per (target, node count, event
/// count) over the buffer size when several buffer sizes ran, otherwise one per (target,
/// node count) over the event count. Lines keep the order their first trial ran in.
pub fn chart_series(trials: &[Trial]) -> (ChartX, Vec<Series>) {
    let mut buffers: Vec<usize> = trials.iter().map(|t| t.buffer_size_in_bytes).collect();
    buffers.sort_unstable();
    buffers.dedup();
    let x_axis = if buffers.len() > 1 {
        ChartX::BufferBytes
    } else {
        ChartX::EventCount
    };
    let line_of = |t: &Trial| {
        let nodes = match t.node_count {
            1 => String::new(),
            n => format!(", {n} nodes"),
        };
        match x_axis {
            ChartX::BufferBytes => format!(
                "{}{nodes}, {} events",
                t.target,
                crate::chart::short_number(t.event_count as f64)
            ),
            ChartX::EventCount => format!("{}{nodes}", t.target),
        }
    };
    let mut series: Vec<Series> = Vec::new();
    for t in trials {
        let label = line_of(t);
        if !series.iter().any(|s| s.label == label) {
            series.push(Series {
                label,
                points: Vec::new(),
            });
        }
    }
    for line in &mut series {
        let of: Vec<Trial> = trials
            .iter()
            .filter(|t| line_of(t) == line.label)
            .cloned()
            .collect();
        line.points = summarise(&of)
            .into_iter()
            .map(|s| {
                let x = match x_axis {
                    ChartX::BufferBytes => s.buffer_bytes,
                    ChartX::EventCount => s.event_count,
                };
                (x as f64, s.median_events_per_second)
            })
            .collect();
    }
    (x_axis, series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_w1_events() {
        let batches = generate(25, 10, 1_000_000_000, 1);
        assert_eq!(
            batches.iter().map(EventBatch::len).collect::<Vec<_>>(),
            vec![10, 10, 5]
        );
        let last = &batches[2];
        assert_eq!(last.tstart()[4], 1_000_000_000);
        assert_eq!(
            batches[0].tstart()[1] - batches[0].tstart()[0],
            EVENT_SPACING_NS
        );
        let per_event = payload_bytes(&batches[0]) as f64 / 10.0;
        assert!(
            (18.0..24.0).contains(&per_event),
            "{per_event} bytes per event"
        );
        assert!(generate(0, 10, 0, 1).is_empty());
    }

    #[test]
    fn runs_and_writes_csv() {
        let dir = tempfile::tempdir().unwrap();
        let config = InsertConfig {
            event_counts: vec![1, 1000],
            trials: 2,
            batch_size: 100,
            writers: 2,
            data_dir: dir.path().join("data"),
            options: Options::default(),
            progress: false,
        };
        let report = run_embedded(&config).unwrap();
        assert_eq!(report.trials.len(), 4);
        assert!(report.trials.iter().all(|t| t.events_per_second > 0.0));
        assert!(report.compressed_bytes_per_event.is_some_and(|b| b > 0.0));
        let path = write_csv(dir.path(), &report.trials).unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        assert_eq!(text.lines().count(), 5);
        assert!(text.starts_with(CSV_HEADER));
        let summary = summarise(&report.trials);
        assert_eq!(
            summary
                .iter()
                .map(|s| (s.event_count, s.trials))
                .collect::<Vec<_>>(),
            vec![(1, 2), (1000, 2)]
        );
    }

    #[test]
    fn chart_lines_per_target_and_node_count() {
        let trial = |target: &str, nodes, buffer, events, eps| Trial {
            target: target.into(),
            node_count: nodes,
            buffer_type: "blocking".into(),
            buffer_size_in_bytes: buffer,
            event_count: events,
            trial: 1,
            duration_ms: 1.0,
            events_per_second: eps,
            measured_on: String::new(),
        };
        let trials = [
            trial("server-binary", 1, 1_000, 10, 1.0),
            trial("server-binary", 1, 1_000_000, 10, 3.0),
            trial("server-binary", 1, 1_000_000, 10, 5.0),
            trial("cluster/server-binary", 3, 1_000, 10, 0.5),
            trial("cluster/server-binary", 3, 1_000_000, 10, 2.0),
        ];
        let (x, series) = chart_series(&trials);
        assert_eq!(x, ChartX::BufferBytes);
        assert_eq!(series.len(), 2);
        assert_eq!(series[0].label, "server-binary, 10 events");
        assert_eq!(series[0].points, vec![(1e3, 1.0), (1e6, 4.0)], "medians");
        assert_eq!(series[1].label, "cluster/server-binary, 3 nodes, 10 events");

        // One buffer size: the event count is the x axis.
        let (x, series) = chart_series(&[
            trial("embedded", 1, 0, 100, 7.0),
            trial("embedded", 1, 0, 10_000, 9.0),
        ]);
        assert_eq!(x, ChartX::EventCount);
        assert_eq!(series[0].label, "embedded");
        assert_eq!(series[0].points, vec![(100.0, 7.0), (10_000.0, 9.0)]);
    }
}

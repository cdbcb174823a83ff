//! W3 `append`: record batches of 64 KiB, each to a random one of S streams, from N clients
//! (binary-protocol connections) with M requests in flight each, at fixed target rates and
//! at the maximum. Reports achieved MB/s, end-to-end latency (client: from the moment the
//! request was *due* to its durable acknowledgement) and server-side latency (the service
//! time the server puts in every ACK), both as HDR histograms, and the server's CPU and RSS.
//!
//! At a fixed rate every in-flight slot sends on its own schedule and latency is measured
//! from the scheduled time, not from the actual send: a slow answer that delays the next
//! request is counted against the server (no coordinated omission).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidemark_client::{BinaryClient, ClientError, HttpClient};
use tidemark_core::{BatchBuilder, EventBatch, Schema, Value};
use tidemark_query::time::now_ns;

use tidemark_query::output::csv_cell;

use crate::chart::Series;
use crate::latency::{Latencies, LatencySummary};
use crate::process::{Sampler, Usage};

/// Payload bytes per batch, as in the published benchmark.
pub const BATCH_BYTES: usize = 64 * 1024;
/// Each batch holds this many records (events) of `BATCH_BYTES / RECORDS_PER_BATCH` bytes.
pub const RECORDS_PER_BATCH: usize = 64;
const RECORD_BYTES: usize = BATCH_BYTES / RECORDS_PER_BATCH;

/// The stream schema: an opaque payload per record, like a Kafka record's value.
pub fn schema() -> Schema {
    Schema::parse_spec("PAYLOAD:BYTES").expect("constant schema")
}

pub fn stream_name(index: usize) -> String {
    format!("w3_{index:04}")
}

/// A target rate of payload bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    Max,
    MegabytesPerSecond(f64),
}

impl Rate {
    /// `max` or a positive number of MB/s (10^6 bytes).
    pub fn parse(text: &str) -> Result<Rate, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("max") {
            return Ok(Rate::Max);
        }
        match text.parse::<f64>() {
            Ok(mb) if mb.is_finite() && mb > 0.0 => Ok(Rate::MegabytesPerSecond(mb)),
            _ => Err(format!(
                "rate {text:?}: expected MB/s (a positive number) or max"
            )),
        }
    }

    pub fn label(self) -> String {
        match self {
            Rate::Max => "max".into(),
            Rate::MegabytesPerSecond(mb) => format!("{mb} MB/s"),
        }
    }

    /// Seconds between two sends of one in-flight slot, `None` at max.
    fn slot_interval(self, slots: usize) -> Option<Duration> {
        match self {
            Rate::Max => None,
            Rate::MegabytesPerSecond(mb) => {
                let batches_per_second = mb * 1e6 / BATCH_BYTES as f64;
                Some(Duration::from_secs_f64(slots as f64 / batches_per_second))
            }
        }
    }
}

/// How every step is driven.
#[derive(Debug, Clone)]
pub struct AppendConfig {
    /// Connections.
    pub clients: usize,
    /// Requests in flight per connection.
    pub in_flight: usize,
    pub warmup: Duration,
    pub duration: Duration,
    pub progress: bool,
}

/// The server a step runs against.
#[derive(Debug, Clone)]
pub struct ServerTarget {
    pub http: String,
    pub binary: SocketAddr,
    pub token: Option<String>,
    /// For its CPU and RSS (none: not reported).
    pub pid: Option<u32>,
}

/// One (streams, rate) step.
#[derive(Debug, Clone)]
pub struct StepReport {
    pub streams: usize,
    pub rate: Rate,
    pub clients: usize,
    pub in_flight: usize,
    /// Batches acknowledged of those due in the measured window.
    pub batches: u64,
    pub achieved_mb_per_s: f64,
    /// TRY_LATER answers (the request was sent again after the hint).
    pub try_later: u64,
    /// Requests due in the window that were not sent by its end: the target rate was more
    /// than the server (or this client) could do.
    pub behind: u64,
    pub end_to_end: LatencySummary,
    pub server: Option<LatencySummary>,
    pub usage: Option<Usage>,
}

/// Runs one step: creates `streams` streams (if missing), then sends for the warm-up and
/// the measured duration at `rate`.
pub fn run_step(
    config: &AppendConfig,
    server: &ServerTarget,
    streams: usize,
    rate: Rate,
) -> Result<StepReport, ClientError> {
    if config.clients == 0 || config.in_flight == 0 || config.duration.is_zero() || streams == 0 {
        return Err(ClientError::Protocol(
            "streams, clients, in-flight and duration must be positive".into(),
        ));
    }
    let http = HttpClient::new(&server.http, server.token.as_deref());
    let spec = schema().to_spec();
    let bar =
        crate::w1::progress_bar_in(config.progress, streams, "creating W3 streams", "streams");
    for i in 0..streams {
        http.create_stream(&stream_name(i), &spec)?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let connections = (0..config.clients)
        .map(|_| BinaryClient::connect(server.binary, server.token.as_deref()))
        .collect::<Result<Vec<_>, _>>()?;
    measure(config, server, &connections, &Payload::new(), streams, rate)
}

/// What one in-flight slot measured.
#[derive(Default)]
struct SlotResult {
    end_to_end: Latencies,
    server: Latencies,
    batches: u64,
    try_later: u64,
    behind: u64,
    last_ack: Option<Instant>,
}

fn measure(
    config: &AppendConfig,
    server: &ServerTarget,
    connections: &[BinaryClient],
    payload: &Payload,
    streams: usize,
    rate: Rate,
) -> Result<StepReport, ClientError> {
    let slots = config.clients * config.in_flight;
    let interval = rate.slot_interval(slots);
    let begin = Instant::now() + Duration::from_millis(50);
    let measured_from = begin + config.warmup;
    let end = measured_from + config.duration;
    let bar = crate::w1::progress_bar_in(
        config.progress,
        (config.warmup + config.duration).as_secs() as usize,
        &format!("W3 {streams} streams, {}", rate.label()),
        "s",
    );
    let mut sampler = None;
    let results: Vec<Result<SlotResult, ClientError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..slots)
            .map(|slot| {
                let connection = &connections[slot % connections.len()];
                // Slots start spread over one interval, so a fixed rate is smooth.
                let phase = interval.map_or(Duration::ZERO, |i| i * slot as u32 / slots as u32);
                scope.spawn(move || {
                    run_slot(
                        connection,
                        payload,
                        streams,
                        slot as u64,
                        Schedule {
                            first: begin + phase,
                            interval,
                            measured_from,
                            end,
                        },
                    )
                })
            })
            .collect();
        std::thread::sleep(measured_from.saturating_duration_since(Instant::now()));
        sampler = server.pid.map(Sampler::start);
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(250).min(end - Instant::now()));
            bar.set_position(begin.elapsed().as_secs());
        }
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ClientError::Protocol("a client thread panicked".into()))
                })
            })
            .collect()
    });
    bar.finish_and_clear();
    let usage = sampler.and_then(Sampler::finish);
    let mut total = SlotResult::default();
    for result in results {
        let slot = result?;
        total.end_to_end.merge(&slot.end_to_end);
        total.server.merge(&slot.server);
        total.batches += slot.batches;
        total.try_later += slot.try_later;
        total.behind += slot.behind;
        total.last_ack = total.last_ack.max(slot.last_ack);
    }
    let end_to_end = total.end_to_end.summary().ok_or_else(|| {
        ClientError::Protocol(format!(
            "no batch was acknowledged in the measured window ({streams} streams, {})",
            rate.label()
        ))
    })?;
    // Requests due before the end but answered after it stretch the window.
    let window = total.last_ack.map_or(end, |last| last.max(end)) - measured_from;
    Ok(StepReport {
        streams,
        rate,
        clients: config.clients,
        in_flight: config.in_flight,
        batches: total.batches,
        achieved_mb_per_s: (total.batches * BATCH_BYTES as u64) as f64 / 1e6 / window.as_secs_f64(),
        try_later: total.try_later,
        behind: total.behind,
        end_to_end,
        server: total.server.summary(),
        usage,
    })
}

#[derive(Clone, Copy)]
struct Schedule {
    first: Instant,
    /// `None`: send the next request as soon as the last is answered (max rate).
    interval: Option<Duration>,
    measured_from: Instant,
    end: Instant,
}

/// One in-flight slot: sends a batch, waits for its acknowledgement, repeats.
fn run_slot(
    connection: &BinaryClient,
    payload: &Payload,
    streams: usize,
    seed: u64,
    schedule: Schedule,
) -> Result<SlotResult, ClientError> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut result = SlotResult::default();
    let names: Vec<String> = (0..streams).map(stream_name).collect();
    // A batch's first event starts at the wall-clock time it was due, so a consumer of the
    // stream (W5) can tell how long after that it arrived.
    let origin = (Instant::now(), now_ns());
    let wall_ns = |at: Instant| match at.checked_duration_since(origin.0) {
        Some(after) => origin.1.saturating_add(after.as_nanos() as i64),
        None => origin.1.saturating_sub((origin.0 - at).as_nanos() as i64),
    };
    let mut due = schedule.first;
    loop {
        let now = Instant::now();
        if schedule.interval.is_none() {
            due = now.max(schedule.first);
        }
        if due >= schedule.end {
            break;
        }
        if now >= schedule.end {
            // Fell behind a fixed rate: what is still due is not sent, only counted.
            if let Some(interval) = schedule.interval {
                let due_in_window = due.max(schedule.measured_from);
                result.behind += ((schedule.end - due_in_window).as_secs_f64()
                    / interval.as_secs_f64())
                .ceil() as u64;
            }
            break;
        }
        std::thread::sleep(due.saturating_duration_since(now));
        let batch = payload.batch(&mut rng, wall_ns(due));
        let stream = &names[rng.usize(..streams)];
        let ack = loop {
            match connection.append(stream, &batch) {
                Ok(ack) => break ack,
                Err(ClientError::TryLater { retry_after, .. }) => {
                    result.try_later += 1;
                    std::thread::sleep(retry_after.min(Duration::from_millis(20)));
                }
                Err(e) => return Err(e),
            }
        };
        let answered = Instant::now();
        if due >= schedule.measured_from {
            result.end_to_end.record(answered - due);
            if let Some(server) = ack.server_time {
                result.server.record(server);
            }
            result.batches += 1;
            result.last_ack = Some(answered);
        }
        if let Some(interval) = schedule.interval {
            due += interval;
        }
    }
    Ok(result)
}

/// Random uppercase letters (as Kafka's `ProducerPerformance` sends), cut into records at
/// random offsets so that batches differ and compression sees realistic, not repeated, data.
pub(crate) struct Payload {
    pool: Vec<u8>,
    schema: Arc<Schema>,
}

impl Payload {
    pub(crate) fn new() -> Payload {
        let mut rng = fastrand::Rng::with_seed(64);
        Payload {
            pool: (0..4 * BATCH_BYTES).map(|_| rng.u8(b'A'..=b'Z')).collect(),
            schema: Arc::new(schema()),
        }
    }

    pub(crate) fn batch(&self, rng: &mut fastrand::Rng, first_ns: i64) -> EventBatch {
        let mut builder = BatchBuilder::new(self.schema.clone(), RECORDS_PER_BATCH);
        for i in 0..RECORDS_PER_BATCH {
            let at = rng.usize(..self.pool.len() - RECORD_BYTES);
            let record = Value::Bytes(self.pool[at..at + RECORD_BYTES].to_vec());
            // One field of the schema's only type: cannot be refused.
            let _ = builder.push_row(first_ns + i as i64, None, &[record]);
        }
        builder.finish()
    }
}

/// A step's report with the system and durability level it ran at.
#[derive(Debug, Clone)]
pub struct Measured {
    pub system: String,
    pub durability: String,
    pub report: StepReport,
}

/// Chart lines of `metric` over the stream (partition) count: one line per system,
/// durability level and rate, in the order they ran.
pub fn chart_series(rows: &[Measured], metric: fn(&StepReport) -> f64) -> Vec<Series> {
    let label = |m: &Measured| format!("{}, {}, {}", m.system, m.report.rate.label(), m.durability);
    let mut series: Vec<Series> = Vec::new();
    for row in rows {
        let label = label(row);
        let point = (row.report.streams as f64, metric(&row.report));
        match series.iter_mut().find(|s| s.label == label) {
            Some(line) => line.points.push(point),
            None => series.push(Series {
                label,
                points: vec![point],
            }),
        }
    }
    series
}

/// The columns of `append.csv`, one row per step and system.
pub const CSV_HEADER: &str = "system,durability,streams,target_mb_per_s,clients,in_flight,batches,\
achieved_mb_per_s,try_later,behind,e2e_avg_ms,e2e_p95_ms,e2e_p99_ms,e2e_p999_ms,\
server_avg_ms,server_p95_ms,server_p99_ms,server_p999_ms,server_cpu_cores,server_rss_mb,measured_on";

/// One CSV row of `report` (empty cells for what a system does not report).
pub fn csv_row(row: &Measured, measured_on: &str) -> String {
    let Measured {
        system,
        durability,
        report,
    } = row;
    let opt = |v: Option<f64>, digits: usize| v.map_or(String::new(), |v| format!("{v:.digits$}"));
    let e = &report.end_to_end;
    let server = report.server.as_ref();
    [
        csv_cell(system),
        csv_cell(durability),
        report.streams.to_string(),
        match report.rate {
            Rate::Max => "max".into(),
            Rate::MegabytesPerSecond(mb) => mb.to_string(),
        },
        report.clients.to_string(),
        report.in_flight.to_string(),
        report.batches.to_string(),
        format!("{:.1}", report.achieved_mb_per_s),
        report.try_later.to_string(),
        report.behind.to_string(),
        format!("{:.3}", e.avg_ms),
        format!("{:.3}", e.p95_ms),
        format!("{:.3}", e.p99_ms),
        format!("{:.3}", e.p999_ms),
        opt(server.map(|s| s.avg_ms), 3),
        opt(server.map(|s| s.p95_ms), 3),
        opt(server.map(|s| s.p99_ms), 3),
        opt(server.map(|s| s.p999_ms), 3),
        opt(report.usage.map(|u| u.cores), 2),
        opt(report.usage.map(|u| u.peak_rss_bytes as f64 / 1e6), 1),
        csv_cell(measured_on),
    ]
    .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_pace() {
        assert_eq!(Rate::parse("max"), Ok(Rate::Max));
        assert_eq!(Rate::parse(" 250 "), Ok(Rate::MegabytesPerSecond(250.0)));
        for bad in ["0", "-5", "fast", "NaN"] {
            assert!(Rate::parse(bad).is_err(), "{bad}");
        }
        // 100 MB/s = 1525.9 batches/s; 16 slots each send every 16/1525.9 s.
        let interval = Rate::MegabytesPerSecond(100.0).slot_interval(16).unwrap();
        assert!((interval.as_secs_f64() - 16.0 * 65_536.0 / 1e8).abs() < 1e-9);
        assert_eq!(Rate::Max.slot_interval(16), None);
    }

    #[test]
    fn batches_hold_64_kib_of_payload() {
        let payload = Payload::new();
        let mut rng = fastrand::Rng::with_seed(1);
        let a = payload.batch(&mut rng, 1_000);
        let b = payload.batch(&mut rng, 2_000);
        assert_eq!(a.len(), RECORDS_PER_BATCH);
        let bytes: usize = (0..a.len())
            .map(|row| match &a.row(row)[0] {
                Value::Bytes(bytes) => bytes.len(),
                other => panic!("{other:?}"),
            })
            .sum();
        assert_eq!(bytes, BATCH_BYTES);
        assert_eq!(a.tstart()[0], 1_000);
        assert_ne!(a.row(0), b.row(0), "batches differ");
    }

    #[test]
    fn csv_rows_match_the_header() {
        let latency = LatencySummary {
            count: 10,
            avg_ms: 1.5,
            p50_ms: 1.0,
            p95_ms: 2.0,
            p99_ms: 3.0,
            p999_ms: 4.25,
            max_ms: 5.0,
        };
        let report = StepReport {
            streams: 100,
            rate: Rate::MegabytesPerSecond(250.0),
            clients: 4,
            in_flight: 4,
            batches: 38_147,
            achieved_mb_per_s: 249.96,
            try_later: 0,
            behind: 3,
            end_to_end: latency,
            server: Some(latency),
            usage: Some(Usage {
                cores: 1.234,
                peak_rss_bytes: 123_400_000,
            }),
        };
        let columns = CSV_HEADER.split(',').count();
        let mut measured = Measured {
            system: "tidemark".into(),
            durability: "fsync per batch".into(),
            report,
        };
        let row = csv_row(&measured, "2026-11-22 2-core");
        assert_eq!(row.split(',').count(), columns, "{row}");
        assert_eq!(
            row,
            "tidemark,fsync per batch,100,250,4,4,38147,250.0,0,3,1.500,2.000,3.000,4.250,\
             1.500,2.000,3.000,4.250,1.23,123.4,2026-11-22 2-core"
        );
        // Kafka: no server-side latency; a comma in a cell is quoted.
        measured.system = "kafka".into();
        measured.durability = "os cache, no fsync".into();
        measured.report.server = None;
        measured.report.rate = Rate::Max;
        let row = csv_row(&measured, "x");
        assert!(
            row.starts_with("kafka,\"os cache, no fsync\",100,max,"),
            "{row}"
        );
        assert!(
            row.contains(",3,1.500,2.000,3.000,4.250,,,,,1.23,"),
            "{row}"
        );

        // Chart lines: one per system, rate and durability, over the stream count.
        let mut wide = measured.clone();
        wide.report.streams = 2000;
        wide.report.achieved_mb_per_s = 100.0;
        let lines = chart_series(&[measured, wide], |r| r.achieved_mb_per_s);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].label, "kafka, max, os cache, no fsync");
        assert_eq!(lines[0].points, vec![(100.0, 249.96), (2000.0, 100.0)]);
    }
}

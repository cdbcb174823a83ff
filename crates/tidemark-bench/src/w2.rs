//! W2 `metrics`: real host metrics (a [`Recording`] of /proc) replayed as many hosts at a
//! fixed number of points a second, one point per series per second, batched only across
//! series (one request per host per second, never across time); then the two queries of
//! `workloads.md`, timed first and consecutive.
//!
//! The replay first backfills `history` (timestamps from `now - history`) as fast as the
//! target takes it, so the queries over the last hour and day have data, then keeps pace
//! with the wall clock for `duration`: that live part is where CPU, RSS and ingest lag are
//! measured. Targets (Tidemark's server, Prometheus) implement [`MetricsTarget`].

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tidemark_client::{BinaryClient, ClientError, HttpClient};
use tidemark_core::batch::BatchBuilder;
use tidemark_core::schema::{Field, FieldType, Schema};
use tidemark_core::Value;

use crate::host_metrics::{Recording, RecordingError};
use crate::latency::{Latencies, LatencySummary};
use crate::process::{Sampler, Usage};
use crate::w3::ServerTarget;

/// The recording shipped with Tidemark: this kind of machine's /proc, once a second.
pub static SHIPPED_RECORDING: &[u8] = include_bytes!("../data/host-metrics.csv.gz");

/// Points a second of workloads.md's W2.
pub const DEFAULT_POINTS_PER_SECOND: usize = 54_000;

#[derive(Debug, thiserror::Error)]
pub enum W2Error {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Recording(#[from] RecordingError),
    #[error("{0}")]
    Target(String),
}

/// Which series of which host go where: `hosts` copies of the recording, each started at
/// a different row so that the hosts do not send the same values at the same second.
#[derive(Debug, Clone)]
pub struct Layout {
    recording: Arc<Recording>,
    hosts: usize,
}

impl Layout {
    /// As many hosts as make `points_per_second` (rounded to whole hosts, at least one).
    pub fn new(recording: Recording, points_per_second: usize) -> Layout {
        let series = recording.series().max(1);
        let hosts = ((points_per_second + series / 2) / series).max(1);
        Layout {
            recording: Arc::new(recording),
            hosts,
        }
    }

    pub fn hosts(&self) -> usize {
        self.hosts
    }

    pub fn series(&self) -> usize {
        self.recording.series()
    }

    pub fn series_names(&self) -> &[String] {
        &self.recording.names
    }

    pub fn points_per_second(&self) -> usize {
        self.hosts * self.series()
    }

    pub fn host_name(host: usize) -> String {
        format!("host{host:03}")
    }

    /// Host `host`'s values at replay second `second` (the recording wraps around).
    pub fn values(&self, host: usize, second: u64) -> &[f64] {
        let rows = self.recording.rows.len();
        let stride = rows / self.hosts.max(1);
        let row = (second as usize + host * stride.max(1)) % rows;
        &self.recording.rows[row]
    }

    /// A host's stream: one FLOAT64 field per series.
    pub fn schema(&self) -> Schema {
        let fields = self
            .series_names()
            .iter()
            .map(|name| Field::new(name.clone(), FieldType::Double))
            .collect();
        // Names were checked when the recording was read: unique, [a-z0-9_], at most 1000.
        Schema::new(fields).unwrap_or_else(|_| unreachable_schema())
    }

    /// The 7 series the queries ask for: those that change most often in the recording
    /// (ties by name), so the maxima are not all constants.
    pub fn query_series(&self) -> Vec<String> {
        let rows = &self.recording.rows;
        let mut changes: Vec<(usize, &String)> = self
            .series_names()
            .iter()
            .enumerate()
            .map(|(j, name)| (rows.windows(2).filter(|w| w[0][j] != w[1][j]).count(), name))
            .collect();
        changes.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
        changes
            .into_iter()
            .take(7)
            .map(|(_, n)| n.clone())
            .collect()
    }
}

#[cold]
fn unreachable_schema() -> Schema {
    // Schema::new only refuses what Recording::read already refused.
    Schema::new(vec![Field::new("value", FieldType::Double)]).unwrap_or_else(|e| panic!("{e}"))
}

/// Where the points go.
pub trait MetricsTarget: Sync {
    /// A connection of one replay worker.
    type Connection: Send;
    fn connect(&self) -> Result<Self::Connection, W2Error>;
    /// Sends each of `hosts`' points of replay second `second` (timestamp `unix_s`) and
    /// returns once the target has accepted all of them (durably, where it promises that).
    fn send_second(
        &self,
        connection: &mut Self::Connection,
        layout: &Layout,
        hosts: &[usize],
        second: u64,
        unix_s: i64,
    ) -> Result<(), W2Error>;
    /// The server process, for CPU and RSS.
    fn pid(&self) -> Option<u32>;
    /// Runs `query`; answers how many rows (buckets) came back.
    fn query(&self, query: &Query) -> Result<usize, W2Error>;
}

/// How the replay runs.
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    /// Backfilled before the live part, as fast as the target takes it.
    pub history: Duration,
    /// Live, at the wall clock's pace.
    pub duration: Duration,
    /// Threads, each with its own connection and a share of the hosts.
    pub workers: usize,
    pub progress: bool,
}

/// What the replay measured.
#[derive(Debug, Clone)]
pub struct IngestReport {
    pub hosts: usize,
    pub series: usize,
    /// Points sent and accepted in all (backfill and live).
    pub points: u64,
    /// How long the backfill took to catch up with the wall clock, and its rate.
    pub backfill: Duration,
    pub backfill_points_per_second: f64,
    /// Live: points accepted a second over the live window.
    pub live_points_per_second: f64,
    /// From a second's timestamp to the moment all of a worker's points of it were accepted.
    pub lag: LatencySummary,
    /// Server CPU and RSS over the live part.
    pub usage: Option<Usage>,
}

/// Replays `layout` into `target`: backfill, then live.
pub fn replay<T: MetricsTarget>(
    target: &T,
    layout: &Layout,
    config: &ReplayConfig,
) -> Result<IngestReport, W2Error> {
    if config.workers == 0 || config.duration.is_zero() {
        return Err(W2Error::Target(
            "workers and duration must be positive".into(),
        ));
    }
    let workers = config.workers.min(layout.hosts());
    let history_s = config.history.as_secs() as i64;
    let first_unix_s = unix_now().as_secs() as i64 - history_s;
    let shared = Shared {
        stop_at: AtomicI64::new(i64::MAX),
        caught_up: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
        sent_seconds: AtomicU64::new(0),
    };
    let connections = (0..workers)
        .map(|_| target.connect())
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let bar = crate::w1::progress_bar_in(
        config.progress,
        (history_s as u64 * workers as u64).max(1) as usize,
        "W2 backfill",
        "host-group seconds",
    );
    let outcome = std::thread::scope(|scope| {
        let handles: Vec<_> = connections
            .into_iter()
            .enumerate()
            .map(|(w, mut connection)| {
                let hosts: Vec<usize> = (w..layout.hosts()).step_by(workers).collect();
                let shared = &shared;
                scope.spawn(move || {
                    let result = run_worker(
                        target,
                        &mut connection,
                        layout,
                        &hosts,
                        first_unix_s,
                        shared,
                    );
                    if result.is_err() {
                        shared.failed.store(true, Ordering::Relaxed);
                    }
                    result
                })
            })
            .collect();
        // Backfill: until every worker keeps pace with the clock.
        while shared.caught_up.load(Ordering::Relaxed) < workers
            && !shared.failed.load(Ordering::Relaxed)
        {
            bar.set_position(shared.sent_seconds.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(100));
        }
        bar.finish_and_clear();
        let backfill = started.elapsed();
        let backfill_points = shared.sent_seconds.load(Ordering::Relaxed) as f64
            * layout.points_per_second() as f64
            / workers as f64;
        let live_from = Instant::now();
        let live_unix_s = unix_now().as_secs() as i64 + 1;
        shared.stop_at.store(
            live_unix_s + config.duration.as_secs() as i64,
            Ordering::Relaxed,
        );
        let sampler = target.pid().map(Sampler::start);
        let live_bar = crate::w1::progress_bar_in(
            config.progress && !shared.failed.load(Ordering::Relaxed),
            config.duration.as_secs() as usize,
            &format!("W2 live, {} points/s", layout.points_per_second()),
            "s",
        );
        let results: Vec<Result<WorkerResult, W2Error>> = handles
            .into_iter()
            .map(|h| {
                while !h.is_finished() {
                    live_bar.set_position(live_from.elapsed().as_secs());
                    std::thread::sleep(Duration::from_millis(100));
                }
                h.join()
                    .unwrap_or_else(|_| Err(W2Error::Target("a replay thread panicked".into())))
            })
            .collect();
        live_bar.finish_and_clear();
        let usage = sampler.and_then(Sampler::finish);
        (
            results,
            backfill,
            backfill_points,
            live_from.elapsed(),
            usage,
        )
    });
    let (results, backfill, backfill_points, live, usage) = outcome;
    let mut lag = Latencies::new();
    let mut points = 0;
    let mut live_points = 0;
    for result in results {
        let worker = result?;
        lag.merge(&worker.lag);
        points += worker.points;
        live_points += worker.live_points;
    }
    let lag = lag
        .summary()
        .ok_or_else(|| W2Error::Target("no live second was sent".into()))?;
    Ok(IngestReport {
        hosts: layout.hosts(),
        series: layout.series(),
        points,
        backfill,
        backfill_points_per_second: backfill_points / backfill.as_secs_f64().max(1e-9),
        live_points_per_second: live_points as f64 / live.as_secs_f64().max(1e-9),
        lag,
        usage,
    })
}

struct Shared {
    /// The first timestamp not to send (set once every worker caught up).
    stop_at: AtomicI64,
    caught_up: AtomicUsize,
    failed: AtomicBool,
    sent_seconds: AtomicU64,
}

struct WorkerResult {
    lag: Latencies,
    points: u64,
    live_points: u64,
}

fn run_worker<T: MetricsTarget>(
    target: &T,
    connection: &mut T::Connection,
    layout: &Layout,
    hosts: &[usize],
    first_unix_s: i64,
    shared: &Shared,
) -> Result<WorkerResult, W2Error> {
    let mut result = WorkerResult {
        lag: Latencies::new(),
        points: 0,
        live_points: 0,
    };
    let points_per_second = (hosts.len() * layout.series()) as u64;
    let mut paced = false;
    for second in 0u64.. {
        let unix_s = first_unix_s + second as i64;
        if unix_s >= shared.stop_at.load(Ordering::Relaxed) || shared.failed.load(Ordering::Relaxed)
        {
            break;
        }
        let due = UNIX_EPOCH + Duration::from_secs(unix_s as u64);
        if let Ok(wait) = due.duration_since(SystemTime::now()) {
            if !paced {
                paced = true;
                shared.caught_up.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(wait);
        }
        target.send_second(connection, layout, hosts, second, unix_s)?;
        result.points += points_per_second;
        if paced {
            result
                .lag
                .record(SystemTime::now().duration_since(due).unwrap_or_default());
            result.live_points += points_per_second;
        } else {
            shared.sent_seconds.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(result)
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// The two queries of W2.
#[derive(Debug, Clone, PartialEq)]
pub enum Query {
    /// Max of one series in 1-minute buckets over the last hour.
    OneSeriesHour { host: String, series: String },
    /// Max of 7 series in 1-hour buckets over the last day.
    SevenSeriesDay { host: String, series: Vec<String> },
}

impl Query {
    /// Both queries, on the first host.
    pub fn both(layout: &Layout) -> Vec<Query> {
        let series = layout.query_series();
        let host = Layout::host_name(0);
        vec![
            Query::OneSeriesHour {
                host: host.clone(),
                series: series.first().cloned().unwrap_or_default(),
            },
            Query::SevenSeriesDay { host, series },
        ]
    }

    pub fn label(&self) -> &'static str {
        match self {
            Query::OneSeriesHour { .. } => "max of 1 series, 1 m buckets, last hour",
            Query::SevenSeriesDay { .. } => "max of 7 series, 1 h buckets, last day",
        }
    }

    /// Short name for CSV and summary rows.
    pub fn key(&self) -> &'static str {
        match self {
            Query::OneSeriesHour { .. } => "q_1series_1h",
            Query::SevenSeriesDay { .. } => "q_7series_1d",
        }
    }

    /// The query in Tidemark's SQL.
    pub fn sql(&self) -> String {
        let (bucket, range, host, series): (_, _, _, &[String]) = match self {
            Query::OneSeriesHour { host, series } => {
                ("1 minute", "1 hour", host, std::slice::from_ref(series))
            }
            Query::SevenSeriesDay { host, series } => ("1 hour", "1 day", host, series),
        };
        let maxima: Vec<String> = series.iter().map(|s| format!("max(\"{s}\")")).collect();
        format!(
            "SELECT time_bucket('{bucket}', ts) AS bucket, {} FROM \"{host}\" \
             WHERE ts >= now() - INTERVAL '{range}' GROUP BY bucket",
            maxima.join(", ")
        )
    }
}

/// One query's timings.
#[derive(Debug, Clone)]
pub struct QueryTiming {
    pub query: Query,
    pub first: Duration,
    /// Median of the consecutive runs after the first.
    pub consecutive: Duration,
    pub rows: usize,
}

/// Times each query: once (first), then `runs` more (their median).
pub fn time_queries<T: MetricsTarget>(
    target: &T,
    queries: &[Query],
    runs: usize,
) -> Result<Vec<QueryTiming>, W2Error> {
    let mut timings = Vec::new();
    for query in queries {
        let started = Instant::now();
        let rows = target.query(query)?;
        let first = started.elapsed();
        if rows == 0 {
            return Err(W2Error::Target(format!(
                "{} answered no rows",
                query.label()
            )));
        }
        let mut times: Vec<f64> = Vec::with_capacity(runs);
        for _ in 0..runs {
            let started = Instant::now();
            target.query(query)?;
            times.push(started.elapsed().as_secs_f64());
        }
        let consecutive = crate::stats::median(&times).map_or(first, Duration::from_secs_f64);
        timings.push(QueryTiming {
            query: query.clone(),
            first,
            consecutive,
            rows,
        });
    }
    Ok(timings)
}

/// A Tidemark server: one stream per host, points over the binary protocol, queries in SQL
/// over HTTP.
pub struct TidemarkMetrics {
    server: ServerTarget,
    http: HttpClient,
    schema: Arc<Schema>,
}

impl TidemarkMetrics {
    /// Creates the hosts' streams.
    pub fn create(server: ServerTarget, layout: &Layout) -> Result<TidemarkMetrics, W2Error> {
        let http = HttpClient::new(&server.http, server.token.as_deref());
        let schema = layout.schema();
        let spec = schema.to_spec();
        for host in 0..layout.hosts() {
            http.create_stream(&Layout::host_name(host), &spec)?;
        }
        Ok(TidemarkMetrics {
            server,
            http,
            schema: Arc::new(schema),
        })
    }

    /// Segment bytes and the points in them, over every host's stream.
    pub fn stored(&self, layout: &Layout) -> Result<Stored, W2Error> {
        let mut stored = Stored::default();
        for host in 0..layout.hosts() {
            let info = self.http.stream_info(&Layout::host_name(host))?;
            let number = |key: &str| {
                info[key]
                    .as_u64()
                    .ok_or_else(|| W2Error::Target(format!("stream info has no {key}: {info}")))
            };
            stored.bytes += number("bytesOnDisk")?;
            stored.points += number("flushedEvents")? * layout.series() as u64;
        }
        Ok(stored)
    }
}

/// What is on disk, and how many points it holds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stored {
    pub bytes: u64,
    pub points: u64,
}

impl Stored {
    pub fn bits_per_point(&self) -> Option<f64> {
        (self.points > 0).then(|| self.bytes as f64 * 8.0 / self.points as f64)
    }
}

impl MetricsTarget for TidemarkMetrics {
    type Connection = BinaryClient;

    fn connect(&self) -> Result<BinaryClient, W2Error> {
        Ok(BinaryClient::connect(
            self.server.binary,
            self.server.token.as_deref(),
        )?)
    }

    fn send_second(
        &self,
        connection: &mut BinaryClient,
        layout: &Layout,
        hosts: &[usize],
        second: u64,
        unix_s: i64,
    ) -> Result<(), W2Error> {
        let ts = unix_s * 1_000_000_000;
        let mut pending = Vec::with_capacity(hosts.len());
        for &host in hosts {
            let values: Vec<Value> = layout
                .values(host, second)
                .iter()
                .map(|&v| Value::Double(v))
                .collect();
            let mut builder = BatchBuilder::new(self.schema.clone(), 1);
            builder
                .push_row(ts, None, &values)
                .map_err(|e| W2Error::Target(e.to_string()))?;
            let batch = builder.finish();
            let stream = Layout::host_name(host);
            let ack = connection.send_append(&stream, &batch)?;
            pending.push((stream, batch, ack));
        }
        for (stream, batch, ack) in pending {
            let mut answer = ack.wait();
            // Pushed back: send again after the hint, as a client must.
            while let Err(ClientError::TryLater { retry_after, .. }) = answer {
                std::thread::sleep(retry_after.min(Duration::from_millis(50)));
                answer = connection.append(&stream, &batch);
            }
            answer?;
        }
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        self.server.pid
    }

    fn query(&self, query: &Query) -> Result<usize, W2Error> {
        let answer = self.http.query(&query.sql())?;
        answer["rows"]
            .as_array()
            .map(Vec::len)
            .ok_or_else(|| W2Error::Target(format!("query answer without rows: {answer}")))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;

    fn recording(series: usize, rows: usize) -> Recording {
        Recording {
            names: (0..series).map(|j| format!("s{j}")).collect(),
            times: (0..rows as i64).collect(),
            // Series j changes j times over the recording: s{series-1} changes most.
            rows: (0..rows)
                .map(|i| (0..series).map(|j| ((i * j) / rows) as f64).collect())
                .collect(),
        }
    }

    #[test]
    fn layout_spreads_hosts_over_the_recording() {
        let layout = Layout::new(recording(10, 100), 54_000);
        assert_eq!(layout.hosts(), 5400);
        assert_eq!(layout.points_per_second(), 54_000);
        let layout = Layout::new(recording(365, 100), 54_000);
        assert_eq!(layout.hosts(), 148, "rounded to whole hosts");
        let layout = Layout::new(recording(8, 10), 16);
        assert_eq!(layout.hosts(), 2);
        // Host 1 starts half-way through the 10 rows; both wrap around.
        assert_eq!(layout.values(0, 3), recording(8, 10).rows[3].as_slice());
        assert_eq!(layout.values(1, 3), recording(8, 10).rows[8].as_slice());
        assert_eq!(layout.values(1, 7), recording(8, 10).rows[2].as_slice());
        assert_eq!(layout.schema().len(), 8);
        assert_eq!(
            Layout::new(recording(3, 5), 1).hosts(),
            1,
            "at least one host"
        );
    }

    #[test]
    fn queries_ask_for_the_series_that_change_most() {
        let layout = Layout::new(recording(10, 100), 100);
        assert_eq!(
            layout.query_series(),
            ["s9", "s8", "s7", "s6", "s5", "s4", "s3"]
        );
        let queries = Query::both(&layout);
        assert_eq!(
            queries[0].sql(),
            "SELECT time_bucket('1 minute', ts) AS bucket, max(\"s9\") FROM \"host000\" \
             WHERE ts >= now() - INTERVAL '1 hour' GROUP BY bucket"
        );
        assert!(queries[1].sql().contains("max(\"s9\"), max(\"s8\")"));
        assert!(queries[1].sql().contains("INTERVAL '1 day'"));
        let (promql, range, step) = queries[0].promql();
        assert_eq!(promql, "max_over_time(s9{host=\"host000\"}[1m])");
        assert_eq!((range, step), (3600, 60));
        assert_eq!(
            queries[0].remote_write_sql(),
            "SELECT 's9' AS series, time_bucket('1 minute', ts) AS bucket, max(value) FROM \"s9\" \
             WHERE host = 'host000' AND ts >= now() - INTERVAL '1 hour' GROUP BY bucket"
        );
        assert_eq!(
            queries[1].remote_write_sql().matches(" UNION ALL ").count(),
            6
        );
        let (promql, range, step) = queries[1].promql();
        assert_eq!(promql.matches("max_over_time").count(), 7);
        assert_eq!(promql.matches(" or ").count(), 6);
        assert_eq!((range, step), (86_400, 3600));
    }

    /// Keeps what it is sent, per (host, unix second).
    #[derive(Default)]
    struct Model {
        sent: Mutex<HashMap<(usize, i64), Vec<f64>>>,
        order_broken: AtomicBool,
    }

    impl MetricsTarget for Model {
        type Connection = HashMap<usize, i64>;

        fn connect(&self) -> Result<Self::Connection, W2Error> {
            Ok(HashMap::new())
        }

        fn send_second(
            &self,
            last_sent: &mut Self::Connection,
            layout: &Layout,
            hosts: &[usize],
            second: u64,
            unix_s: i64,
        ) -> Result<(), W2Error> {
            let mut sent = self
                .sent
                .lock()
                .map_err(|_| W2Error::Target("poisoned".into()))?;
            for &host in hosts {
                if last_sent
                    .insert(host, unix_s)
                    .is_some_and(|before| before >= unix_s)
                {
                    self.order_broken.store(true, Ordering::Relaxed);
                }
                let values = layout.values(host, second).to_vec();
                if sent.insert((host, unix_s), values).is_some() {
                    return Err(W2Error::Target(format!(
                        "host {host} second {unix_s} twice"
                    )));
                }
            }
            Ok(())
        }

        fn pid(&self) -> Option<u32> {
            None
        }

        fn query(&self, _: &Query) -> Result<usize, W2Error> {
            Ok(self.sent.lock().map_or(0, |s| s.len()))
        }
    }

    #[test]
    fn replay_sends_every_host_every_second_once_in_order() {
        let layout = Layout::new(recording(4, 20), 12);
        let model = Model::default();
        let config = ReplayConfig {
            history: Duration::from_secs(5),
            duration: Duration::from_secs(2),
            workers: 2,
            progress: false,
        };
        let report = replay(&model, &layout, &config).expect("replay");
        assert!(
            !model.order_broken.load(Ordering::Relaxed),
            "a host went back in time"
        );
        let sent = model.sent.lock().expect("lock");
        let seconds: std::collections::BTreeSet<i64> = sent.keys().map(|k| k.1).collect();
        let (first, last) = (
            *seconds.first().expect("sent"),
            *seconds.last().expect("sent"),
        );
        assert_eq!(seconds.len() as i64, last - first + 1, "no second skipped");
        assert!(
            seconds.len() >= 7,
            "history and live: {} seconds",
            seconds.len()
        );
        for host in 0..layout.hosts() {
            for &second in &seconds {
                let values = &sent[&(host, second)];
                assert_eq!(values, layout.values(host, (second - first) as u64));
            }
        }
        assert_eq!(report.points, (sent.len() * layout.series()) as u64);
        assert_eq!(report.hosts, 3);
        assert!(
            report.lag.max_ms < 1000.0,
            "an in-memory target keeps pace: {:?}",
            report.lag
        );
        assert!(report.live_points_per_second > 0.0);
    }

    #[test]
    fn queries_that_answer_nothing_are_errors() {
        let layout = Layout::new(recording(4, 20), 12);
        let empty = Model::default();
        assert!(time_queries(&empty, &Query::both(&layout), 2).is_err());
        let config = ReplayConfig {
            history: Duration::from_secs(2),
            duration: Duration::from_secs(1),
            workers: 1,
            progress: false,
        };
        replay(&empty, &layout, &config).expect("replay");
        let timings = time_queries(&empty, &Query::both(&layout), 3).expect("timed");
        assert_eq!(timings.len(), 2);
        assert!(timings.iter().all(|t| t.rows > 0));
    }

    #[test]
    fn bits_per_point_needs_points() {
        assert_eq!(Stored::default().bits_per_point(), None);
        let stored = Stored {
            bytes: 100,
            points: 400,
        };
        assert_eq!(stored.bits_per_point(), Some(2.0));
    }

    #[test]
    fn the_shipped_recording_reads() {
        let recording = Recording::read(SHIPPED_RECORDING).expect("shipped recording");
        assert!(recording.series() >= 100, "{} series", recording.series());
        assert!(!recording.rows.is_empty());
    }
}

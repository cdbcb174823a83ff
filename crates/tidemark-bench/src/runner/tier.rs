//! `tidemark bench tier`: W1's events spread over a day two days ago, in an embedded
//! database that tiers to S3Proxy on 127.0.0.1 (the S3-compatible server the tests use,
//! `peers/install.sh s3proxy`). Measures the upload throughput (from the flush's end until
//! every segment is in the bucket), bytes in the bucket per event, a per-minute aggregate of
//! the whole day (requests to the bucket: 0 expected, block summaries answer it), and a cold
//! and a warm 1-minute scan (the cold one after a reopen and its first tier round, with an
//! empty cache).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::s3proxy::{S3Proxy, S3ProxyError, SECRET};
use crate::summary::{append_summary, Figure};
use anyhow::{bail, Context, Result};
use tidemark_core::workload::w1;
use tidemark_core::AggFn;
use tidemark_engine::{
    AggregateRequest, Aggregation, Db, Options, ScanRequest, TierOptions, TierStatus, TimeRange,
};
use tidemark_tier::BlockingBucket;

const DAY_NS: i64 = 86_400_000_000_000;
const MINUTE_NS: i64 = 60_000_000_000;

/// How long S3Proxy is warmed up before anything is timed (see `warm_up`).
const WARM_UP: Duration = Duration::from_secs(4);

#[derive(clap::Args)]
pub struct TierArgs {
    /// Events, spread evenly over one day [default: 60000000, about 90 MB in a dozen
    /// segments: enough uploads for a throughput; with --quick: 1000000].
    #[arg(long)]
    events: Option<usize>,
    /// Smaller defaults: the run takes well under a minute.
    #[arg(long)]
    quick: bool,
    /// Directory for summary.csv and summary.md.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

impl TierArgs {
    pub fn defaults(quick: bool, out: PathBuf) -> TierArgs {
        TierArgs {
            events: None,
            quick,
            out,
        }
    }
}

pub fn run(args: TierArgs) -> Result<()> {
    let events = args
        .events
        .unwrap_or(if args.quick { 1_000_000 } else { 60_000_000 });
    let proxy = match S3Proxy::start() {
        Ok(proxy) => proxy,
        Err(S3ProxyError::NotInstalled(_)) => {
            return Err(super::Unavailable {
                missing: "S3Proxy is not installed".into(),
                install: "peers/install.sh s3proxy".into(),
            }
            .into())
        }
        Err(e) => return Err(e.into()),
    };
    let bucket = BlockingBucket::new(proxy.bucket("bench", SECRET)?)?;
    warm_up(&BlockingBucket::new(proxy.bucket("warm-up", SECRET)?)?)?;
    let dir = tempfile::tempdir()?;
    let options = |after: Duration| Options {
        tier: Some(TierOptions {
            bucket: bucket.clone(),
            after,
            cache_bytes: 256 << 20,
            interval: Duration::from_millis(20),
        }),
        ..Options::default()
    };
    // Ingested first with nothing due (`after` of ten years), so that the upload is timed
    // alone when the database reopens with an `after` of an hour.
    let db = Db::open(dir.path(), options(Duration::from_secs(10 * 365 * 86_400)))?;
    db.create_stream(w1::STREAM, w1::schema())?;
    // From a minute's start three days ago, so every minute's block starts on its minute.
    let start = (tidemark_core::time::now_ns() - 3 * DAY_NS) / MINUTE_NS * MINUTE_NS;
    let spacing = DAY_NS / events.max(1) as i64;
    let end = start + (events.max(1) as i64 - 1) * spacing;
    println!("bench tier: {events} W1 events over one day, into a database that tiers to S3Proxy");
    for batch in w1::generate_spaced(events, 10_000, end, 7, spacing) {
        db.append(w1::STREAM, batch)?;
    }
    db.close()?;

    // Wall: from the open until every segment is in the bucket and recorded (the thread's
    // first round: the manifest's copy, the sweep's listing, stubs, checkpoints included);
    // uploading: the uploads alone, each verified.
    let opened = Instant::now();
    let db = Db::open(dir.path(), options(Duration::from_secs(3600)))?;
    let uploaded = wait(&db, Duration::from_secs(600), |s| {
        s.pending_segments == 0 && s.tiered_segments > 0
    })?;
    let wall_seconds = opened.elapsed().as_secs_f64();
    let mb = uploaded.uploaded_bytes as f64 / 1e6;
    let upload_mb_s = mb / uploaded.upload_time.as_secs_f64().max(1e-9);
    let wall_mb_s = mb / wall_seconds;
    let bytes_per_event = uploaded.tiered_bytes as f64 / events as f64;
    println!(
        "  uploaded {} segments, {mb:.1} MB: {upload_mb_s:.1} MB/s uploading, {wall_mb_s:.1} MB/s from open to recorded ({wall_seconds:.2} s); {bytes_per_event:.2} bytes/event in the bucket",
        uploaded.uploaded_segments,
    );
    drop(db);

    // Reopened: the cache is empty, the footers come from the stubs. The tier thread's first
    // round (the manifest published, the bucket swept for orphans) ends first, so that the
    // cold scan's request is timed alone, not beside the open's PUT and LIST.
    let db = Db::open(dir.path(), options(Duration::from_secs(3600)))?;
    wait(&db, Duration::from_secs(60), |s| s.rounds > 0)?;
    let day = AggregateRequest {
        range: TimeRange {
            min: start,
            max: end,
        },
        bucket_ns: Some(MINUTE_NS),
        aggregations: vec![
            Aggregation::new(AggFn::Max, "LASTTRADEPRICE"),
            Aggregation::new(AggFn::Count, "LASTTRADEPRICE"),
        ],
    };
    let before = status(&db)?.requests;
    let timer = Instant::now();
    let minutes = db.aggregate(w1::STREAM, &day)?;
    let aggregate_ms = timer.elapsed().as_secs_f64() * 1e3;
    let aggregate_requests = status(&db)?.requests - before;
    let counted: i64 = minutes
        .iter()
        .filter_map(|row| match row.values[1] {
            tidemark_core::Value::Long(n) => Some(n),
            _ => None,
        })
        .sum();
    if counted != events as i64 {
        bail!("the day's aggregate counted {counted} events of {events}");
    }
    println!(
        "  1-day aggregate, {} one-minute buckets: {aggregate_ms:.1} ms, {aggregate_requests} requests to the bucket",
        minutes.len()
    );

    let middle = (start + end) / 2 / MINUTE_NS * MINUTE_NS;
    let minute = ScanRequest {
        range: TimeRange {
            min: middle,
            max: middle + MINUTE_NS - 1,
        },
        ..ScanRequest::default()
    };
    let scan = |label: &str| -> Result<(f64, u64, usize)> {
        let before = status(&db)?.requests;
        let timer = Instant::now();
        let mut rows = 0;
        for batch in db.scan(w1::STREAM, &minute)? {
            rows += batch?.len();
        }
        let ms = timer.elapsed().as_secs_f64() * 1e3;
        let requests = status(&db)?.requests - before;
        println!("  {label} 1-minute scan: {rows} events in {ms:.2} ms, {requests} requests");
        Ok((ms, requests, rows))
    };
    let (cold_ms, cold_requests, rows) = scan("cold")?;
    let (warm_ms, warm_requests, _) = scan("warm")?;
    if rows == 0 {
        bail!("the 1-minute scan found no events");
    }

    let variant = format!("{events} events over a day, S3Proxy on 127.0.0.1");
    let figure = |metric: &str, value: f64, unit: &str| {
        Figure::new("tier", "tidemark", &variant, metric, value, unit)
    };
    let csv = append_summary(
        &args.out,
        &[
            figure("upload_mb_per_second", upload_mb_s, "MB/s"),
            figure("open_to_recorded_mb_per_second", wall_mb_s, "MB/s"),
            figure("bucket_bytes_per_event", bytes_per_event, "bytes"),
            figure("day_aggregate_ms", aggregate_ms, "ms"),
            figure(
                "day_aggregate_requests",
                aggregate_requests as f64,
                "requests",
            ),
            figure("cold_minute_scan_ms", cold_ms, "ms"),
            figure(
                "cold_minute_scan_requests",
                cold_requests as f64,
                "requests",
            ),
            figure("warm_minute_scan_ms", warm_ms, "ms"),
            figure(
                "warm_minute_scan_requests",
                warm_requests as f64,
                "requests",
            ),
        ],
    )
    .with_context(|| format!("writing {}", args.out.display()))?;
    println!("figures: {}", csv.display());
    Ok(())
}

/// S3Proxy's one-time costs, paid before anything is timed (a real S3 has neither): its
/// JVM compiles its hot paths over its first few hundred requests (its CPU per 5 MiB PUT
/// falls from ~35 to ~21 ms over 250 of them: peers/s3proxy/get_latency.py), and its first GET of an object whose name has
/// an extension (`.seg`) makes the JDK load and parse `/etc/mime.types` (~50 ms, seen with
/// strace), which would otherwise land on the cold scan. So the warm-up runs for seconds,
/// with objects named as segments and read as a scan reads them.
fn warm_up(bucket: &BlockingBucket) -> Result<()> {
    let object: bytes::Bytes = (0..5u32 << 20).map(|i| (i % 251) as u8).collect();
    let name = |round: usize| format!("object-{}.seg", round % 4);
    let started = Instant::now();
    let mut rounds = 0;
    while rounds < 20 || started.elapsed() < WARM_UP {
        bucket.put(&name(rounds), object.clone())?;
        bucket.get_range(&name(rounds), 1 << 20..2 << 20)?;
        rounds += 1;
    }
    for round in 0..4 {
        bucket.delete(&name(round))?;
    }
    Ok(())
}

fn status(db: &Db) -> Result<TierStatus> {
    db.tier_status().context("the database does not tier")
}

/// Waits until `done` holds for the tier's status; fails with the last error after `timeout`.
fn wait(db: &Db, timeout: Duration, done: impl Fn(&TierStatus) -> bool) -> Result<TierStatus> {
    let started = Instant::now();
    loop {
        let s = status(db)?;
        if done(&s) {
            return Ok(s);
        }
        if started.elapsed() > timeout {
            bail!("tiering did not finish in {timeout:?}: {s:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

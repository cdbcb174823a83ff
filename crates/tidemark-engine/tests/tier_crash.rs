//! Crash test of tiering: a child process appends old events (due for the bucket at once),
//! flushes often, and creates, fills and drops scratch streams, while its tiering thread
//! uploads, records and deletes; the parent kills it with SIGKILL at a random moment, many
//! times. After every kill the database reopens with every acknowledged batch exactly once,
//! and once its first tiering round has run (it sweeps) the bucket holds exactly the
//! objects the manifest names, each with its stub, and nothing else: nothing lost, nothing
//! orphaned. Against S3Proxy on 127.0.0.1 (`peers/install.sh s3proxy`).
//!
//! `TIDEMARK_TIER_KILLS` sets the number of kills (default 8).

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidemark_core::{BatchBuilder, Schema, Value};
use tidemark_engine::{Db, Options, ScanRequest, SegmentOptions, TierOptions};
use tidemark_storage::manifest::{stub_path, Manifest};
use tidemark_testkit::s3proxy::{credentials, S3Proxy, BUCKET, SECRET};
use tidemark_tier::{BlockingBucket, Bucket, TierLocation};

const BATCH: usize = 50;
const PREFIX: &str = "crash";

fn bucket(endpoint: &str) -> BlockingBucket {
    let location = TierLocation::parse(&format!("s3://{BUCKET}/{PREFIX}"))
        .unwrap()
        .with_endpoint(endpoint)
        .with_region("us-east-1");
    BlockingBucket::new(Bucket::open(location, Some(credentials(SECRET))).unwrap()).unwrap()
}

fn options(endpoint: &str) -> Options {
    // Small memtables: flushes, packs and moves all through a run.
    Options {
        memtable_bytes: 32 << 10,
        out_of_order_window_ns: None,
        pack_below_bytes: 16 << 10,
        segment: SegmentOptions {
            max_block_events: 256,
            ..SegmentOptions::default()
        },
        tier: Some(TierOptions {
            bucket: bucket(endpoint),
            after: Duration::from_secs(3600),
            cache_bytes: 1 << 20,
            interval: Duration::from_millis(10),
        }),
        ..Options::default()
    }
}

fn schema() -> Schema {
    Schema::parse_spec("BATCH:LONG,I:INTEGER").unwrap()
}

/// Three days ago, in steps of a millisecond per batch: every event is due at once.
fn timestamp(run: u64, seq: u64, i: usize) -> i64 {
    let base =
        tidemark_core::time::now_ns() / 1_000_000_000 * 1_000_000_000 - 3 * 86_400_000_000_000;
    base + ((run * 1_000_000 + seq) * 1_000_000) as i64 + i as i64
}

fn batch(schema: &Arc<Schema>, id: i64, run: u64, seq: u64) -> tidemark_core::EventBatch {
    let mut b = BatchBuilder::new(schema.clone(), BATCH);
    for i in 0..BATCH {
        b.push_row(
            timestamp(run, seq, i),
            None,
            &[Value::Long(id), Value::Integer(i as i32)],
        )
        .unwrap();
    }
    b.finish()
}

/// The child: appends, flushes and drops until killed.
#[test]
#[ignore = "run by tiering_survives_kills_without_loss_or_orphans as a child process"]
fn tier_crash_child() {
    let (Ok(dir), Ok(endpoint), Ok(run)) = (
        std::env::var("TIDEMARK_TIER_CRASH_DIR"),
        std::env::var("TIDEMARK_TIER_ENDPOINT"),
        std::env::var("TIDEMARK_TIER_RUN"),
    ) else {
        return;
    };
    let run: u64 = run.parse().unwrap();
    let dir = Path::new(&dir);
    let db = Db::open(dir.join("db"), options(&endpoint)).unwrap();
    db.create_stream("s", schema()).unwrap();
    let schema = Arc::new(schema());
    let mut acks = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("acks-{run}")))
        .unwrap();
    for seq in 0.. {
        let id = ((run << 32) | seq) as i64;
        db.append("s", batch(&schema, id, run, seq)).unwrap();
        // Written (not fsync'd) after the ack: a killed process's writes survive.
        writeln!(acks, "{id}").unwrap();
        if seq % 20 == 19 {
            db.flush().unwrap();
        }
        if seq % 50 == 49 {
            // A stream whose segments move and whose drop then deletes their objects.
            let scratch = format!("scratch-{run}-{seq}");
            db.create_stream(&scratch, (*schema).clone()).unwrap();
            db.append(&scratch, batch(&schema, -1, run, seq)).unwrap();
            db.flush().unwrap();
            std::thread::sleep(Duration::from_millis(30));
            db.drop_stream(&scratch).unwrap();
        }
    }
}

#[test]
fn tiering_survives_kills_without_loss_or_orphans() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let kills: u64 = std::env::var("TIDEMARK_TIER_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(8);
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = fastrand::Rng::with_seed(11);
    let mut moved = 0;
    let mut acknowledged = 0;
    for run in 0..kills {
        let mut child = Command::new(&exe)
            .args([
                "tier_crash_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TIDEMARK_TIER_CRASH_DIR", dir.path())
            .env("TIDEMARK_TIER_ENDPOINT", &proxy.endpoint)
            .env("TIDEMARK_TIER_RUN", run.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.u64(300..1500)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let (batches, tiered) = verify(dir.path(), &proxy, run);
        acknowledged = batches;
        moved = moved.max(tiered);
    }
    // Guards against runs that never got far: the test would prove nothing.
    assert!(
        acknowledged >= kills as usize * 20,
        "only {acknowledged} batches acknowledged"
    );
    assert!(moved > 0, "no segment ever moved to the bucket");
    eprintln!("{kills} kills: {acknowledged} acknowledged batches all present once; up to {moved} segments in the bucket, no orphans");
}

/// Reopens the database: every acknowledged batch once (reading tiered segments from the
/// bucket); after its first tiering round the bucket and the manifest agree. Returns the
/// acknowledged batches and the tiered segments.
fn verify(dir: &Path, proxy: &S3Proxy, last_run: u64) -> (usize, usize) {
    let mut acked = BTreeSet::new();
    for run in 0..=last_run {
        let text = std::fs::read_to_string(dir.join(format!("acks-{run}"))).unwrap_or_default();
        // The last line may be torn by the kill: only whole lines count.
        for line in text.lines() {
            if let Ok(id) = line.parse::<i64>() {
                acked.insert(id);
            }
        }
    }
    let db = Db::open(dir.join("db"), options(&proxy.endpoint)).unwrap();
    let mut events: HashMap<i64, usize> = HashMap::new();
    for batch in db.scan("s", &ScanRequest::default()).unwrap() {
        let batch = batch.unwrap();
        for r in 0..batch.len() {
            if let Value::Long(id) = batch.row(r)[0] {
                *events.entry(id).or_default() += 1;
            }
        }
    }
    for id in &acked {
        assert_eq!(
            events.get(id),
            Some(&BATCH),
            "run {last_run}: acknowledged batch {id:#x} is not there whole and once"
        );
    }
    assert!(
        events.values().all(|&n| n == BATCH),
        "run {last_run}: a batch is torn or doubled"
    );
    // Moves, deletes of dropped streams' objects and the sweep run in the background: they
    // must bring the bucket to exactly what the manifest names.
    let objects = |db: &Db| {
        let manifest = Manifest::load(&dir.join("db")).unwrap().unwrap();
        let named: BTreeSet<String> = manifest.tiered.values().map(|t| t.object.clone()).collect();
        let stored: BTreeSet<String> = bucket(&proxy.endpoint)
            .list()
            .unwrap()
            .into_iter()
            .map(|o| o.name)
            .filter(|name| name.starts_with("segments/"))
            .collect();
        let status = db.tier_status().unwrap();
        (manifest, named, stored, status)
    };
    let started = Instant::now();
    let (manifest, named) = loop {
        let (manifest, named, stored, status) = objects(&db);
        if status.rounds > 0 && status.pending_segments == 0 && stored == named {
            break (manifest, named);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "run {last_run}: the bucket holds {:?} more and {:?} fewer segment objects than the manifest names ({status:?})",
            stored.difference(&named).collect::<Vec<_>>(),
            named.difference(&stored).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    for id in manifest.tiered.keys() {
        assert!(stub_path(&dir.join("db"), *id).exists(), "stub of {id}");
    }
    drop(db);
    (acked.len(), named.len())
}

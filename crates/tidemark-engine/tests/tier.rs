//! Tiering end to end against a real S3-compatible server: S3Proxy 4.1.0 on 127.0.0.1,
//! which checks SigV4 signatures (`peers/install.sh s3proxy`; under CI a missing S3Proxy
//! fails the test, elsewhere it is skipped with the reason).
//!
//! Old segments move to the bucket and read back exactly as before (scans and aggregates,
//! after a reopen too); aggregates that summaries answer make no request; reads go through
//! the cache; a bucket that is down makes uploads wait and tiered reads fail with a clear
//! error, never a partial answer; a tampered object is a checksum error; retention deletes
//! objects; the sweeper deletes objects no segment names.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidemark_core::{AggFn, BatchBuilder, EventBatch, Schema, Value};
use tidemark_engine::{
    AggregateRequest, Aggregation, Db, EngineError, Options, Retention, ScanRequest,
    SegmentOptions, TierOptions, TierStatus, TimeRange,
};
use tidemark_testkit::s3proxy::{S3Proxy, SECRET};
use tidemark_tier::{BlockingBucket, StoredObject};

const MINUTE: i64 = 60_000_000_000;
const DAY: i64 = 24 * 60 * MINUTE;

fn schema() -> Arc<Schema> {
    Arc::new(Schema::parse_spec("SYMBOL:STRING,PRICE:DOUBLE,QTY:LONG").unwrap())
}

/// `n` events one second apart from `start`.
fn events(start: i64, n: i64) -> EventBatch {
    let mut b = BatchBuilder::new(schema(), n as usize);
    for i in 0..n {
        let symbol = ["AAPL", "MSFT", "GOOG"][(i % 3) as usize];
        let qty = if i % 17 == 0 {
            Value::Null
        } else {
            Value::Long(i)
        };
        b.push_row(
            start + i * 1_000_000_000,
            None,
            &[
                Value::String(symbol.into()),
                Value::Double(i as f64 / 4.0),
                qty,
            ],
        )
        .unwrap();
    }
    b.finish()
}

fn bucket(proxy: &S3Proxy, prefix: &str) -> BlockingBucket {
    BlockingBucket::new(proxy.bucket(prefix, SECRET)).unwrap()
}

fn options(bucket: BlockingBucket) -> Options {
    Options {
        compact_min_segments: 0,
        // A file per segment, so that a tiered one's local file goes at once (in a pack it
        // goes with the pack: compaction rewrites what is still live in a mostly dead one).
        pack_below_bytes: 0,
        out_of_order_window_ns: None,
        // Blocks cut at every minute (60 to 100 events each here): per-minute aggregates
        // are answered from block summaries alone.
        segment: SegmentOptions {
            max_block_events: 1000,
            min_block_events: 10,
            ..SegmentOptions::default()
        },
        tier: Some(TierOptions {
            bucket,
            after: Duration::from_secs(3600),
            cache_bytes: 8 << 20,
            interval: Duration::from_millis(50),
        }),
        ..Options::default()
    }
}

fn scan_all(db: &Db, stream: &str) -> Result<Vec<(i64, Vec<Value>)>, EngineError> {
    let mut out = Vec::new();
    for batch in db.scan(stream, &ScanRequest::default())? {
        let batch = batch?;
        for r in 0..batch.len() {
            out.push((batch.tstart()[r], batch.row(r)));
        }
    }
    Ok(out)
}

fn per_minute(db: &Db, stream: &str) -> Result<Vec<(i64, Vec<Value>)>, EngineError> {
    let rows = db.aggregate(
        stream,
        &AggregateRequest {
            range: TimeRange::ALL,
            bucket_ns: Some(MINUTE),
            aggregations: vec![
                Aggregation::new(AggFn::Count, "QTY"),
                Aggregation::new(AggFn::Sum, "QTY"),
                Aggregation::new(AggFn::Max, "PRICE"),
                Aggregation::new(AggFn::First, "PRICE"),
            ],
        },
    )?;
    Ok(rows
        .into_iter()
        .map(|r| (r.bucket_start.unwrap_or(0), r.values))
        .collect())
}

/// A database tiering to `bucket` with stream `s` holding `n` events from two days ago (due
/// at once), flushed; and the first event's time.
fn old_stream(dir: &Path, bucket: BlockingBucket, n: i64) -> (Db, i64) {
    let start = (tidemark_core::time::now_ns() - 2 * DAY) / MINUTE * MINUTE;
    let db = Db::open(dir, options(bucket)).unwrap();
    db.create_stream("s", (*schema()).clone()).unwrap();
    db.append("s", events(start, n)).unwrap();
    db.flush().unwrap();
    (db, start)
}

fn status(db: &Db) -> TierStatus {
    db.tier_status().expect("the database tiers")
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn local_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The segment objects in the bucket (the manifest's copy left out).
fn objects(bucket: &BlockingBucket) -> Vec<StoredObject> {
    let mut objects = bucket.list().unwrap();
    objects.retain(|o| o.name.starts_with("segments/"));
    objects
}

#[test]
fn old_segments_move_to_the_bucket_and_read_back_exactly_as_before() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let now = tidemark_core::time::now_ns();
    let old_start = (now - 3 * DAY) / MINUTE * MINUTE;
    let (expected_scan, expected_minutes) = {
        // The same events in a database that does not tier: what every read must answer.
        let plain = tempfile::tempdir().unwrap();
        let db = Db::open(
            plain.path(),
            Options {
                tier: None,
                ..options(bucket(&proxy, "unused"))
            },
        )
        .unwrap();
        db.create_stream("old", (*schema()).clone()).unwrap();
        db.append("old", events(old_start, 5000)).unwrap();
        db.append("old", events(old_start + 2 * MINUTE / 3, 700))
            .unwrap();
        db.flush().unwrap();
        (
            scan_all(&db, "old").unwrap(),
            per_minute(&db, "old").unwrap(),
        )
    };

    let bucket = bucket(&proxy, "node-1");
    let db = Db::open(dir.path(), options(bucket.clone())).unwrap();
    db.create_stream("old", (*schema()).clone()).unwrap();
    db.create_stream("recent", (*schema()).clone()).unwrap();
    db.append("old", events(old_start, 5000)).unwrap();
    db.append("old", events(old_start + 2 * MINUTE / 3, 700))
        .unwrap();
    db.append("recent", events(now - MINUTE, 50)).unwrap();
    db.flush().unwrap();

    wait_for(
        "the old segment to be tiered",
        Duration::from_secs(30),
        || {
            let s = status(&db);
            s.tiered_segments == 1 && s.pending_segments == 0
        },
    );
    // The manifest names it tiered before its local file goes: wait for that file to go.
    wait_for(
        "the local copy to be deleted",
        Duration::from_secs(30),
        || {
            local_files(dir.path())
                .iter()
                .filter(|f| f.ends_with(".seg"))
                .count()
                == 1
        },
    );
    let files = local_files(dir.path());
    assert_eq!(
        files.iter().filter(|f| f.ends_with(".stub")).count(),
        1,
        "the old stream keeps only its stub: {files:?}"
    );
    let stored = objects(&bucket);
    assert_eq!(stored.len(), 1, "{stored:?}");
    let s = status(&db);
    assert_eq!(s.tiered_bytes, stored[0].size);
    assert_eq!((s.uploaded_segments, s.uploaded_bytes), (1, stored[0].size));
    // Each stream says how much of it is in the bucket: all of the old one, none of the
    // recent one.
    let old = db.stream_info("old").unwrap();
    assert_eq!(old.tiered_bytes, stored[0].size);
    assert_eq!(old.tiered_bytes, old.bytes_on_disk);
    let recent = db.stream_info("recent").unwrap();
    assert_eq!(recent.tiered_bytes, 0);
    assert!(recent.bytes_on_disk > 0);
    assert_eq!(s.last_error, None);
    assert_eq!(s.url, "s3://tier-test/node-1");

    // Summaries answer a per-minute aggregate over whole blocks: no request to the bucket.
    let requests = status(&db).requests;
    assert_eq!(per_minute(&db, "old").unwrap(), expected_minutes);
    assert_eq!(status(&db).requests, requests, "summaries answered");

    // A scan reads the blocks: through the cache, the second time from it.
    assert_eq!(scan_all(&db, "old").unwrap(), expected_scan);
    let after_first = status(&db);
    assert!(after_first.requests > requests, "{after_first:?}");
    assert!(after_first.cache_bytes > 0);
    assert_eq!(scan_all(&db, "old").unwrap(), expected_scan);
    assert_eq!(status(&db).requests, after_first.requests, "cached");

    // A reopen reads the footer from the stub, without a request.
    drop(db);
    let db = Db::open(dir.path(), options(bucket.clone())).unwrap();
    assert_eq!(per_minute(&db, "old").unwrap(), expected_minutes);
    assert_eq!(status(&db).requests, 0);
    assert_eq!(scan_all(&db, "old").unwrap(), expected_scan);
    assert_eq!(status(&db).tiered_segments, 1);
    drop(db);

    // Without its [tier] the directory does not open silently without its old events.
    let refused = Db::open(
        dir.path(),
        Options {
            tier: None,
            ..options(bucket.clone())
        },
    )
    .err()
    .expect("refused");
    assert!(refused.to_string().contains("[tier]"), "{refused}");

    // Retention past the tiered segment deletes its object and its stub.
    let db = Db::open(dir.path(), options(bucket.clone())).unwrap();
    db.set_retention(
        "old",
        Retention {
            max_age_ns: Some(DAY),
            max_bytes: None,
        },
    )
    .unwrap();
    wait_for("the object to be deleted", Duration::from_secs(30), || {
        db.flush().unwrap();
        objects(&bucket).is_empty()
    });
    assert!(scan_all(&db, "old").unwrap().is_empty());
    wait_for("the stub to be deleted", Duration::from_secs(10), || {
        !local_files(dir.path()).iter().any(|f| f.ends_with(".stub"))
    });
    assert_eq!(status(&db).tiered_segments, 0);
    assert_eq!(scan_all(&db, "recent").unwrap().len(), 50);
}

#[test]
fn a_bucket_that_is_down_delays_uploads_and_fails_tiered_reads_clearly() {
    let Some(mut proxy) = S3Proxy::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bucket = bucket(&proxy, "down");
    let start = (tidemark_core::time::now_ns() - 2 * DAY) / MINUTE * MINUTE;
    proxy.stop();
    let db = Db::open(dir.path(), options(bucket.clone())).unwrap();
    db.create_stream("s", (*schema()).clone()).unwrap();
    db.append("s", events(start, 3000)).unwrap();
    db.flush().unwrap();
    wait_for("the failure to show", Duration::from_secs(30), || {
        status(&db).last_error.is_some()
    });
    let s = status(&db);
    assert!(s.failures > 0 && s.pending_segments == 1, "{s:?}");
    assert_eq!(
        s.tiered_segments, 0,
        "nothing moves while the bucket is down"
    );
    assert_eq!(scan_all(&db, "s").unwrap().len(), 3000, "local reads go on");

    proxy.restart();
    wait_for(
        "the upload after the outage",
        Duration::from_secs(60),
        || status(&db).tiered_segments == 1,
    );
    let expected = scan_all(&db, "s").unwrap();
    assert_eq!(expected.len(), 3000);
    drop(db);

    // Reopened with a cold cache while the bucket is down: summaries still answer, a scan
    // is refused as unavailable (never a partial answer), and works once it is back.
    proxy.stop();
    let db = Db::open(dir.path(), options(bucket.clone())).unwrap();
    let minutes = per_minute(&db, "s").unwrap();
    assert_eq!(minutes.len(), 50);
    let error = scan_all(&db, "s").unwrap_err();
    assert!(error.is_bucket_unavailable(), "{error}");
    assert!(error.to_string().contains("tiered segment"), "{error}");
    proxy.restart();
    // (The first request after S3Proxy's port opens may still find it starting.)
    wait_for(
        "a scan once the bucket is back",
        Duration::from_secs(30),
        || scan_all(&db, "s").is_ok_and(|events| events == expected),
    );
}

/// A TCP proxy in front of S3Proxy that answers every new connection with 503 while
/// `failing` is set, as an overloaded S3 does, and otherwise passes bytes through after
/// holding each new connection `delay_ms` (a slow bucket).
struct FaultyProxy {
    endpoint: String,
    failing: Arc<std::sync::atomic::AtomicBool>,
    delay_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl FaultyProxy {
    fn start(upstream: &str) -> FaultyProxy {
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let upstream = upstream.trim_start_matches("http://").to_string();
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let delay_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (fail, delay) = (failing.clone(), delay_ms.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(mut client) = client else { return };
                if fail.load(std::sync::atomic::Ordering::SeqCst) {
                    let mut request = Vec::new();
                    let mut byte = [0u8; 1];
                    while !request.ends_with(b"\r\n\r\n")
                        && client.read(&mut byte).is_ok_and(|n| n == 1)
                    {
                        request.push(byte[0]);
                    }
                    let _ = client.write_all(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    continue;
                }
                let upstream = upstream.clone();
                let hold = delay.load(std::sync::atomic::Ordering::SeqCst);
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(hold));
                    let Ok(server) = TcpStream::connect(&upstream) else {
                        return;
                    };
                    let (mut client_in, mut server_in) =
                        (client.try_clone().unwrap(), server.try_clone().unwrap());
                    let (mut client_out, mut server_out) = (client, server);
                    std::thread::spawn(move || std::io::copy(&mut client_in, &mut server_out));
                    let _ = std::io::copy(&mut server_in, &mut client_out);
                });
            }
        });
        FaultyProxy {
            endpoint,
            failing,
            delay_ms,
        }
    }

    /// A bucket of S3Proxy's reached through this proxy.
    fn bucket(&self, proxy: &S3Proxy, prefix: &str, secret: &str) -> BlockingBucket {
        let location = proxy.location(prefix).with_endpoint(&self.endpoint);
        let credentials = tidemark_testkit::s3proxy::credentials(secret);
        let bucket = tidemark_tier::Bucket::open(location, Some(credentials)).unwrap();
        BlockingBucket::new(bucket).unwrap()
    }
}

#[test]
fn a_bucket_answering_503_keeps_segments_local_until_uploads_succeed() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let faulty = FaultyProxy::start(&proxy.endpoint);
    let bucket = faulty.bucket(&proxy, "busy", SECRET);
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = old_stream(dir.path(), bucket, 2000);
    wait_for("the failures to show", Duration::from_secs(60), || {
        status(&db).failures >= 2
    });
    let s = status(&db);
    assert!(
        s.last_error.as_deref().is_some_and(|e| e.contains("503")),
        "{s:?}"
    );
    assert_eq!((s.tiered_segments, s.pending_segments), (0, 1));
    assert_eq!(
        local_files(dir.path())
            .iter()
            .filter(|f| f.ends_with(".seg"))
            .count(),
        1,
        "nothing local goes before its upload is verified"
    );
    assert_eq!(scan_all(&db, "s").unwrap().len(), 2000);

    faulty
        .failing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    // Retries back off (up to 30 × 50 ms here): the move follows within seconds, and the
    // error clears with the first round that succeeds (a connection the proxy took just
    // before the switch may still have been answered 503).
    wait_for(
        "the upload once the bucket answers",
        Duration::from_secs(60),
        || {
            let s = status(&db);
            s.tiered_segments == 1 && s.last_error.is_none()
        },
    );
    assert_eq!(scan_all(&db, "s").unwrap().len(), 2000);
}

/// Segments upload several at once: one refused by the bucket leaves the others of its
/// wave moved and recorded, and itself local, readable and retried until it goes.
#[test]
fn an_upload_refused_among_others_keeps_only_its_own_segment_local() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let start = (tidemark_core::time::now_ns() - 2 * DAY) / MINUTE * MINUTE;
    let streams = ["a", "b", "c", "d"];
    {
        // Written without a tier first, so that nothing moves before the bucket is rigged.
        let untiered = Options {
            tier: None,
            ..options(bucket(&proxy, "mixed"))
        };
        let db = Db::open(dir.path(), untiered).unwrap();
        for stream in streams {
            db.create_stream(stream, (*schema()).clone()).unwrap();
            db.append(stream, events(start, 500)).unwrap();
        }
        db.flush().unwrap();
        db.close().unwrap();
    }
    let segments = local_files(dir.path());
    assert_eq!(segments.len(), streams.len(), "{segments:?}");
    // S3Proxy keeps an object as a file: a directory (not empty) in the place of one
    // segment's object makes the bucket refuse that put, and only that one.
    let refused = &segments[1];
    let blocker = proxy.object_path(&format!("mixed/segments/{refused}"));
    std::fs::create_dir_all(&blocker).unwrap();
    std::fs::write(blocker.join("in-the-way"), b"x").unwrap();

    let db = Db::open(dir.path(), options(bucket(&proxy, "mixed"))).unwrap();
    let local_segments = || -> Vec<String> {
        let mut files = local_files(dir.path());
        files.retain(|f| f.ends_with(".seg"));
        files
    };
    // The failed round still records what moved: the other local files go.
    wait_for("the wave's other uploads", Duration::from_secs(60), || {
        status(&db).failures >= 2 && local_segments() == [refused.clone()]
    });
    let s = status(&db);
    assert_eq!((s.tiered_segments, s.pending_segments), (3, 1), "{s:?}");
    assert!(s.last_error.is_some(), "{s:?}");
    for stream in streams {
        assert_eq!(scan_all(&db, stream).unwrap().len(), 500, "stream {stream}");
    }

    std::fs::remove_dir_all(&blocker).unwrap();
    wait_for(
        "the refused upload's retry",
        Duration::from_secs(60),
        || {
            let s = status(&db);
            s.tiered_segments == 4 && s.last_error.is_none()
        },
    );
    wait_for("the last local file to go", Duration::from_secs(60), || {
        local_segments().is_empty()
    });
    for stream in streams {
        assert_eq!(scan_all(&db, stream).unwrap(), scan_all_expected(start));
    }
}

fn scan_all_expected(start: i64) -> Vec<(i64, Vec<Value>)> {
    let batch = events(start, 500);
    (0..batch.len())
        .map(|r| (batch.tstart()[r], batch.row(r)))
        .collect()
}

#[test]
fn a_slow_bucket_never_holds_up_appends() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let faulty = FaultyProxy::start(&proxy.endpoint);
    faulty
        .delay_ms
        .store(5000, std::sync::atomic::Ordering::SeqCst);
    faulty
        .failing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let dir = tempfile::tempdir().unwrap();
    let (db, start) = old_stream(dir.path(), faulty.bucket(&proxy, "slow", SECRET), 2000);
    // The first upload now waits 5 s for its connection; appends, flushes and scans go on.
    for i in 1..=20 {
        db.append("s", events(start + i * 2000 * 1_000_000_000, 2000))
            .unwrap();
    }
    db.flush().unwrap();
    assert_eq!(scan_all(&db, "s").unwrap().len(), 42_000);
    let s = status(&db);
    assert_eq!(
        s.tiered_segments, 0,
        "every append was answered before the slow upload: {s:?}"
    );
    faulty
        .delay_ms
        .store(0, std::sync::atomic::Ordering::SeqCst);
    wait_for("the slow uploads", Duration::from_secs(60), || {
        status(&db).pending_segments == 0
    });
    assert_eq!(scan_all(&db, "s").unwrap().len(), 42_000);
}

#[test]
fn refused_credentials_show_as_the_error_and_keep_everything_local() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let wrong = BlockingBucket::new(proxy.bucket("denied", "not-the-secret")).unwrap();
    let (db, _) = old_stream(dir.path(), wrong, 1000);
    wait_for("the refusal to show", Duration::from_secs(30), || {
        status(&db).last_error.is_some()
    });
    let s = status(&db);
    let error = s.last_error.clone().unwrap_or_default();
    assert!(error.contains("refused the credentials"), "{error}");
    assert_eq!((s.tiered_segments, s.pending_segments), (0, 1));
    assert_eq!(scan_all(&db, "s").unwrap().len(), 1000);
}

#[test]
fn a_tampered_object_is_a_checksum_error_never_wrong_data() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bucket = bucket(&proxy, "tampered");
    let (db, _) = old_stream(dir.path(), bucket.clone(), 3000);
    wait_for("the upload", Duration::from_secs(30), || {
        status(&db).tiered_segments == 1
    });
    drop(db);

    let stored = objects(&bucket);
    let path = proxy.object_path(&format!("tampered/{}", stored[0].name));
    let mut bytes = std::fs::read(&path).unwrap();
    // In the first block's tstart chunk (right after the 8-byte magic), which every scan
    // reads (a chunk a scan does not ask for, such as positions, is not verified by it).
    bytes[12] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();

    let db = Db::open(dir.path(), options(bucket)).unwrap();
    let error = scan_all(&db, "s").map(|events| events.len()).unwrap_err();
    assert!(error.to_string().contains("checksum"), "{error}");
}

#[test]
fn a_store_is_restored_from_the_bucket_alone_with_what_had_moved() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let (dir, restored_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let bucket = bucket(&proxy, "restored");
    let now = tidemark_core::time::now_ns();
    let old_start = (now - 3 * DAY) / MINUTE * MINUTE;
    let db = Db::open(dir.path(), options(bucket.clone())).unwrap();
    db.create_stream("s", (*schema()).clone()).unwrap();
    db.create_stream("empty", (*schema()).clone()).unwrap();
    db.set_retention(
        "s",
        Retention {
            max_age_ns: Some(30 * DAY),
            max_bytes: None,
        },
    )
    .unwrap();
    db.append("s", events(old_start, 4000)).unwrap();
    db.flush().unwrap();
    db.append("s", events(old_start + DAY, 1000)).unwrap();
    db.flush().unwrap();
    wait_for("both segments to move", Duration::from_secs(30), || {
        status(&db).tiered_segments == 2
    });
    // Recent events stay local: lost with the disk.
    db.append("s", events(now - MINUTE, 30)).unwrap();
    db.flush().unwrap();
    let moved: Vec<_> = scan_all(&db, "s")
        .unwrap()
        .into_iter()
        .filter(|(t, _)| *t < now - DAY)
        .collect();
    assert_eq!(moved.len(), 5000);
    let minutes = per_minute(&db, "s").unwrap();
    // The manifest in the bucket follows the local one: two segments moved, one local.
    wait_for(
        "the manifest in the bucket",
        Duration::from_secs(30),
        || {
            let published = bucket.get("MANIFEST", 1 << 20).ok();
            published
                .and_then(|m| tidemark_storage::manifest::Manifest::decode(&m).ok())
                .is_some_and(|m| m.tiered.len() == 2 && m.streams[0].segments.len() == 3)
        },
    );
    drop(db);

    // Into a directory that is not empty: refused.
    let refused = tidemark_engine::restore(&bucket, dir.path(), |_, _| {}).unwrap_err();
    assert!(refused.to_string().contains("not empty"), "{refused}");

    let mut reported = Vec::new();
    let restored = tidemark_engine::restore(&bucket, restored_dir.path(), |done, total| {
        reported.push((done, total))
    })
    .unwrap();
    assert_eq!(reported.last(), Some(&(2, 2)));
    assert_eq!(
        (restored.streams, restored.segments, restored.events),
        (2, 2, 5000)
    );
    assert_eq!(restored.local_segments_lost, 1, "the recent segment");

    let db = Db::open(restored_dir.path(), options(bucket.clone())).unwrap();
    assert_eq!(scan_all(&db, "s").unwrap(), moved);
    let old_minutes: Vec<_> = minutes
        .into_iter()
        .filter(|(t, _)| *t < now - DAY)
        .collect();
    assert_eq!(per_minute(&db, "s").unwrap(), old_minutes);
    assert_eq!(db.list_streams().len(), 2);
    assert_eq!(
        db.stream_info("s").unwrap().retention.max_age_ns,
        Some(30 * DAY)
    );
    // The restored store takes writes and keeps them.
    db.append("s", events(now, 10)).unwrap();
    drop(db);
    let db = Db::open(restored_dir.path(), options(bucket)).unwrap();
    assert_eq!(scan_all(&db, "s").unwrap().len(), 5010);
}

#[test]
fn the_sweeper_deletes_segment_objects_no_segment_names() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bucket = bucket(&proxy, "swept");
    // What a crash after an upload and before its manifest leaves, and an object that is
    // not a segment's (left alone).
    bucket
        .put(
            "segments/000000000999.seg",
            bytes::Bytes::from_static(b"orphan"),
        )
        .unwrap();
    bucket
        .put("notes.txt", bytes::Bytes::from_static(b"not ours"))
        .unwrap();
    let db = Db::open(dir.path(), options(bucket.clone())).unwrap();
    wait_for("the sweep", Duration::from_secs(30), || {
        status(&db).deleted_objects == 1
    });
    let left: Vec<String> = bucket.list().unwrap().into_iter().map(|o| o.name).collect();
    assert_eq!(left, ["MANIFEST", "notes.txt"]);
    assert_eq!(status(&db).deleted_objects, 1);
}

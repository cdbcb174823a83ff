//! Crash test: a child process appends from several threads and records every
//! acknowledgement in a side file; the parent kills it with SIGKILL at a random moment,
//! reopens the database and checks that every acknowledged batch is present exactly once,
//! every batch present is whole, and scans and aggregates agree.
//!
//! `TIDEMARK_CRASH_KILLS` sets the number of kills (default 30; e.g. 500 for a long run).

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tidemark_core::{AggFn, BatchBuilder, Schema, Value};
use tidemark_engine::{
    AggregateRequest, Aggregation, Db, Options, ScanRequest, SegmentOptions, TimeRange,
};
use tidemark_storage::log_files::SPARE_FILE;

const STREAMS: usize = 3;
const WRITERS: u64 = 3;
const BATCH: usize = 50;

fn options() -> Options {
    // Small memtables and log files: kills land during flushes, log rolls and releases too.
    Options {
        memtable_bytes: 64 << 10,
        log_file_bytes: 256 << 10,
        out_of_order_window_ns: None,
        // Memtables of one stream (~1/3 of 64 KiB) land in packs and in files of their own.
        pack_below_bytes: 20 << 10,
        segment: SegmentOptions {
            max_block_events: 256,
            ..SegmentOptions::default()
        },
        ..Options::default()
    }
}

fn schema() -> Schema {
    Schema::parse_spec("BATCH:LONG,I:INTEGER,TAG:STRING").unwrap()
}

/// A batch id that is unique across runs: run, writer and sequence number.
fn batch_id(run: u64, writer: u64, seq: u64) -> i64 {
    ((run << 40) | (writer << 32) | seq) as i64
}

/// The child: appends until killed.
#[test]
#[ignore = "run by crash_recovery_keeps_every_acknowledged_batch as a child process"]
fn crash_child() {
    let Ok(dir) = std::env::var("TIDEMARK_CRASH_DIR") else {
        return;
    };
    let run: u64 = std::env::var("TIDEMARK_CRASH_RUN")
        .unwrap()
        .parse()
        .unwrap();
    let dir = Path::new(&dir);
    let db = Db::open(dir.join("db"), options()).unwrap();
    for s in 0..STREAMS {
        db.create_stream(&format!("s{s}"), schema()).unwrap();
    }
    let schema = Arc::new(schema());
    std::thread::scope(|scope| {
        for writer in 0..WRITERS {
            let (db, schema) = (&db, schema.clone());
            scope.spawn(move || {
                let mut acks = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join(format!("acks-{run}-{writer}")))
                    .unwrap();
                for seq in 0.. {
                    let id = batch_id(run, writer, seq);
                    // s0 is writer 0's own (it clears it); the others share s1 and s2.
                    let stream = match writer {
                        0 => "s0".to_string(),
                        _ => format!("s{}", 1 + (writer + seq) % 2),
                    };
                    let mut b = BatchBuilder::new(schema.clone(), BATCH);
                    for i in 0..BATCH {
                        // Out-of-order timestamps inside and across batches.
                        let ts = (run * 1_000_000 + seq * 10) as i64 - (i % 7) as i64 * 3;
                        let tag = if i % 5 == 0 {
                            Value::Null
                        } else {
                            Value::String(format!("w{writer}"))
                        };
                        b.push_row(ts, None, &[Value::Long(id), Value::Integer(i as i32), tag])
                            .unwrap();
                    }
                    db.append(&stream, b.finish()).unwrap();
                    // Written (not fsync'd) after the ack: a killed process's writes survive.
                    writeln!(acks, "{stream} {id}").unwrap();
                    // Catalog changes get killed too: writer 0 clears stream s0 now and then,
                    // writer 1 creates and drops a scratch stream.
                    if writer == 0 && seq % 25 == 24 {
                        writeln!(acks, "clearing {id}").unwrap();
                        db.clear("s0").unwrap();
                        writeln!(acks, "cleared {id}").unwrap();
                    }
                    if writer == 1 && seq % 10 == 9 {
                        let scratch = format!("scratch-{run}-{seq}");
                        db.create_stream(&scratch, (*schema).clone()).unwrap();
                        db.drop_stream(&scratch).unwrap();
                        writeln!(acks, "dropped {scratch}").unwrap();
                    }
                }
            });
        }
    });
}

#[test]
fn crash_recovery_keeps_every_acknowledged_batch() {
    let kills: u64 = std::env::var("TIDEMARK_CRASH_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(30);
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut seen = Seen::default();
    let mut spares = 0;
    for run in 0..kills {
        let mut child = Command::new(&exe)
            .args([
                "crash_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TIDEMARK_CRASH_DIR", dir.path())
            .env("TIDEMARK_CRASH_RUN", run.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.u64(30..250)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        seen = verify(dir.path(), run);
        // A released log file waiting to be reused: kills then land while the log writes
        // over a reused file's old contents too.
        spares += usize::from(dir.path().join("db/wal").join(SPARE_FILE).exists());
    }
    // Guards against a child that never got far: the test would prove nothing.
    assert!(
        seen.batches >= kills as usize * 10,
        "only {} batches were acknowledged in {kills} runs",
        seen.batches
    );
    assert!(spares > 0, "no run reused a released log file");
    assert!(
        seen.clears > 0 && seen.drops > 0,
        "no clear or drop was acknowledged: {seen:?}"
    );
    eprintln!(
        "{kills} kills, {} acknowledged batches all present exactly once, {} acknowledged clears and {} drops respected, a released log file kept for reuse after {spares} of them",
        seen.batches, seen.clears, seen.drops
    );
}

/// What the acknowledgement files recorded.
#[derive(Debug, Default)]
struct Seen {
    batches: usize,
    clears: usize,
    drops: usize,
}

/// Reopens the database and checks it against the acknowledgement files of runs 0..=last.
fn verify(dir: &Path, last: u64) -> Seen {
    let mut acked: HashMap<i64, String> = HashMap::new();
    let mut dropped: Vec<String> = Vec::new();
    // Writer 0 alone appends to s0 and clears it, and its batch ids grow over time. A batch
    // up to the last acknowledged clear must be gone; one after the last clear that was
    // started (maybe done, unacknowledged) must be there if acked; in between, either.
    let mut cleared_upto = i64::MIN;
    let mut clears = 0;
    let mut maybe_cleared_upto = i64::MIN;
    for run in 0..=last {
        for writer in 0..WRITERS {
            let Ok(text) = std::fs::read_to_string(dir.join(format!("acks-{run}-{writer}"))) else {
                continue;
            };
            // The last line may be torn by the kill: only whole lines count.
            for line in text.lines() {
                match line.split_once(' ') {
                    Some(("cleared", id)) => {
                        if let Ok(id) = id.parse::<i64>() {
                            cleared_upto = cleared_upto.max(id);
                            clears += 1;
                        }
                    }
                    Some(("clearing", id)) => {
                        if let Ok(id) = id.parse::<i64>() {
                            maybe_cleared_upto = maybe_cleared_upto.max(id);
                        }
                    }
                    Some(("dropped", name)) => dropped.push(name.to_string()),
                    Some((stream, id)) => {
                        if let Ok(id) = id.parse() {
                            acked.insert(id, stream.to_string());
                        }
                    }
                    None => {}
                }
            }
        }
    }
    let cleared = |id: i64, stream: &str| stream == "s0" && id <= cleared_upto;
    let maybe_cleared = |id: i64, stream: &str| stream == "s0" && id <= maybe_cleared_upto;
    let db = Db::open(dir.join("db"), options()).unwrap();
    for name in &dropped {
        assert!(
            db.stream_info(name).is_err(),
            "stream {name} came back after an acknowledged drop"
        );
    }
    let mut present: HashSet<i64> = HashSet::new();
    for s in 0..STREAMS {
        let stream = format!("s{s}");
        let mut rows_per_batch: HashMap<i64, Vec<i32>> = HashMap::new();
        let mut previous = i64::MIN;
        let mut scanned = 0u64;
        for batch in db.scan(&stream, &ScanRequest::default()).unwrap() {
            let batch = batch.unwrap();
            for r in 0..batch.len() {
                assert!(batch.tstart()[r] >= previous, "scan out of time order");
                previous = batch.tstart()[r];
                let (Value::Long(id), Value::Integer(i)) =
                    (batch.column(0).value(r), batch.column(1).value(r))
                else {
                    panic!("corrupt row {:?}", batch.row(r));
                };
                rows_per_batch.entry(id).or_default().push(i);
                scanned += 1;
            }
        }
        for (id, mut rows) in rows_per_batch {
            rows.sort_unstable();
            assert_eq!(
                rows,
                (0..BATCH as i32).collect::<Vec<_>>(),
                "batch {id:x} is not whole or not unique"
            );
            assert!(present.insert(id), "batch {id:x} in two streams");
            if let Some(expected) = acked.get(&id) {
                assert_eq!(expected, &stream, "batch {id:x} in the wrong stream");
            }
            assert!(
                !cleared(id, &stream),
                "batch {id:x} came back after an acknowledged clear"
            );
        }
        let agg = db
            .aggregate(
                &stream,
                &AggregateRequest {
                    range: TimeRange::ALL,
                    bucket_ns: Some(1000),
                    aggregations: vec![Aggregation::count(), Aggregation::new(AggFn::Count, "TAG")],
                },
            )
            .unwrap();
        let counted: i64 = agg
            .iter()
            .map(|r| match r.values[0] {
                Value::Long(n) => n,
                _ => 0,
            })
            .sum();
        let tags: i64 = agg
            .iter()
            .map(|r| match r.values[1] {
                Value::Long(n) => n,
                _ => 0,
            })
            .sum();
        assert_eq!(counted as u64, scanned);
        assert_eq!(tags as u64, scanned / 5 * 4);
        assert_eq!(db.stream_info(&stream).unwrap().event_count, scanned);
    }
    let lost: Vec<_> = acked
        .iter()
        .filter(|(id, stream)| !present.contains(id) && !maybe_cleared(**id, stream))
        .map(|(id, _)| id)
        .collect();
    assert!(
        lost.is_empty(),
        "run {last}: {} acknowledged batches lost, e.g. {:x}",
        lost.len(),
        lost[0]
    );
    Seen {
        batches: acked.len(),
        clears,
        drops: dropped.len(),
    }
}

//! The flusher: turns memtables into segments and checkpoints the manifest.
//!
//! A checkpoint (1) freezes every stream's active memtable, (2) writes each frozen memtable
//! as sorted segments, one per time partition of its stream that its events touch (a
//! backfill beside live events becomes segments of its own, which tier and retire by their
//! own age), small ones side by side in shared pack files, and makes them
//! durable ([`crate::sink`]: temp files, fsync'd in groups, renamed, then the directory
//! fsync'd), (3) installs
//! the segments in place of the memtables under the state lock, so readers see either the
//! memtable or the segment, never both or neither, (4) merges runs of small segments
//! ([`crate::compact`]) and installs the results, applies retention, (5) writes the
//! manifest atomically, and only then (6) deletes retired segment files and (7) releases
//! the log files that no stream needs for replay any more. A crash between any two steps leaves
//! the previous manifest and every log record it needs.
//!
//! Requests reach the flusher through the flush signal (`flush_signal`); the thread is
//! started by `db` and `replica`. Must never know about: the log's format or writer, the
//! tier's bucket, how a database was opened.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tidemark_core::sync::IgnorePoison;
use tidemark_core::Partition;
use tidemark_storage::manifest::Manifest;
use tidemark_storage::manifest::StreamId;

use crate::compact;
use crate::error::Result;
use crate::memtable::Memtable;
use crate::segment::Segment;
use crate::shared::Shared;
use crate::sink::SegmentSink;
use crate::state::State;

/// How often the flusher wakes by itself to apply age-based retention.
const IDLE_WAKE: Duration = Duration::from_secs(10);

/// The nice value of the flusher thread (0 is normal, 19 the lowest priority).
const FLUSH_NICE: i32 = 10;

/// A checkpoint's segment writes go at this many times the rate the memtables filled
/// since the one before, so that they take about half the time until the next (less:
/// compression shrinks them) and reach the disk as a trickle, not a burst in front of the
/// log's fsyncs (`tidemark_storage::pace` says why and what it measured).
const PACE_HEADROOM: f64 = 2.0;

/// The slowest a checkpoint's writes go, so that a trickle of appends does not make a
/// checkpoint crawl (what it frees waits for it: the log's files, the memtables' memory).
const MIN_PACE: u64 = 32 << 20;

/// Compressing memtables is the one CPU-heavy job nobody waits for directly, while the
/// appends, replication and fsyncs of the write path are waited for by clients: when they
/// compete for the cores, the flusher should lose, and the write path keeps its latency
/// while the flush catches up in the gaps. If it falls behind, the memtable limit stalls the
/// appends, which frees the cores for it (so it cannot starve).
fn yield_cpu_to_foreground() {
    if let Err(error) = crate::priority::lower_own_priority(FLUSH_NICE) {
        tracing::debug!(%error, "the flusher keeps its priority");
    }
}

/// The flush thread's body (`db` and `replica` start it): a checkpoint for each request,
/// and every [`IDLE_WAKE`] for age-based retention, until shut down.
pub(crate) fn run(shared: &Shared) {
    yield_cpu_to_foreground();
    let signal = &shared.flush;
    let mut last_manifest: Option<Manifest> = None;
    let mut backoff = Duration::ZERO;
    let mut last_started = Instant::now();
    while let Some(target) = signal.next_request(IDLE_WAKE) {
        let started = Instant::now();
        let outcome = checkpoint(shared, &mut last_manifest, started - last_started);
        last_started = started;
        let error = outcome.err().map(|e| e.to_string());
        signal.complete(target, error.clone());
        if let Some(e) = error {
            // Waiting appenders ask again at once; a failing disk must not make this a hot
            // loop. Back off (up to 5 s) while failures repeat, waking early on shutdown.
            backoff = (backoff * 2).clamp(Duration::from_millis(100), Duration::from_secs(5));
            tracing::error!(error = %e, retry_in = ?backoff, "flush failed; the memtables stay in memory");
            signal.pause(backoff);
        } else {
            backoff = Duration::ZERO;
        }
    }
}

struct Job {
    stream: StreamId,
    epoch: u64,
    partition: Partition,
    memtable: Arc<Memtable>,
}

/// One checkpoint, `since_last` after the one before started; see the module
/// documentation for the steps.
fn checkpoint(
    shared: &Shared,
    last_manifest: &mut Option<Manifest>,
    since_last: Duration,
) -> Result<()> {
    let _checkpointing = shared.checkpointing.lock().ignore_poison();
    let (jobs, backlog) = {
        let mut state = shared.write();
        (freeze(&mut state), state.unflushed_bytes())
    };
    let hurry = backlog >= shared.options.max_unflushed_bytes / 2;
    set_pace(shared, hurry, backlog, since_last);
    let paced = tidemark_storage::segment::SegmentOptions {
        pace: Some(shared.write_pace.clone()),
        ..shared.options.segment.clone()
    };
    // Compress on every core only when appenders are about to wait for this flush; below
    // that the backlog is fine and the other core is better left to the appenders.
    let mut segment_options = paced.clone();
    if !hurry {
        segment_options.encode_threads = 1;
    }

    let mut sink = SegmentSink::new(shared, &segment_options);
    for job in jobs {
        let Some(events) = job.memtable.sorted_events()? else {
            continue;
        };
        let (partition, expected_bytes) = (job.partition, job.memtable.bytes as u64);
        sink.write(job, &events, partition, expected_bytes)?;
    }
    let written = sink.finish()?;

    let compactions = {
        let mut state = shared.write();
        install(&mut state, written);
        compact::plan(&state, &shared.options)
    };

    let mut sink = SegmentSink::new(shared, &paced);
    for compaction in compactions {
        let events = compact::merge(&compaction)?;
        let (partition, expected_bytes) = (compaction.partition(), compaction.input_bytes());
        sink.write(compaction, &events, partition, expected_bytes)?;
    }
    let compacted = sink.finish()?;

    let (manifest, retired) = {
        let mut state = shared.write();
        for (compaction, outputs) in compacted {
            compact::install(&mut state, compaction, outputs);
        }
        apply_retention(&mut state, tidemark_core::time::now_ns());
        (state.manifest(), std::mem::take(&mut state.retired))
    };
    if last_manifest.as_ref() != Some(&manifest) {
        if let Err(e) = manifest.store(&shared.dir) {
            // The old manifest still names the retired segments: keep their files.
            shared.write().retired.extend(retired);
            return Err(e.into());
        }
    }
    for segment in &retired {
        segment.retire();
    }
    drop(retired);
    shared
        .log
        .checkpointed(manifest.log_start(), &shared.write_pace)?;
    shared.write().forget_retries_before(manifest.log_start());
    *last_manifest = Some(manifest);
    Ok(())
}

/// Sets the pace of this checkpoint's writes: [`PACE_HEADROOM`] times the rate `backlog`
/// bytes of memtables filled in `since_last`, at least [`MIN_PACE`]; unpaced when
/// appenders are about to wait for room (`hurry`) or anyone waits for the flusher.
fn set_pace(shared: &Shared, hurry: bool, backlog: usize, since_last: Duration) {
    shared.write_pace.set_rate(pace(backlog, since_last));
    // After the rate is set: a waiter counts itself, then unpaces (`Shared::waiting_for_flush`).
    if hurry || shared.someone_waits_for_flush() {
        shared.write_pace.unpace();
    }
}

/// Bytes per second for the writes of `backlog` bytes of memtables filled in `since_last`.
fn pace(backlog: usize, since_last: Duration) -> u64 {
    let fill_rate = backlog as f64 / since_last.as_secs_f64().max(1e-3);
    ((fill_rate * PACE_HEADROOM) as u64).max(MIN_PACE)
}

/// Freezes every non-empty active memtable; returns a job for every frozen memtable
/// (including those a failed checkpoint left behind).
fn freeze(state: &mut State) -> Vec<Job> {
    let mut jobs = Vec::new();
    for stream in state.streams.values_mut() {
        if !stream.active.is_empty() {
            let memtable = std::mem::take(&mut stream.active);
            stream.frozen.push(Arc::new(memtable));
        }
        for memtable in &stream.frozen {
            jobs.push(Job {
                stream: stream.id,
                epoch: stream.epoch,
                partition: stream.partition,
                memtable: memtable.clone(),
            });
        }
    }
    jobs
}

/// Puts each memtable's written segments (one per partition) in its place. Segments whose
/// stream was cleared or dropped meanwhile are discarded.
fn install(state: &mut State, written: Vec<(Job, Vec<Arc<Segment>>)>) {
    for (job, segments) in written {
        let stream = state
            .streams
            .get_mut(&job.stream)
            .filter(|s| s.epoch == job.epoch);
        let position = stream
            .as_ref()
            .and_then(|s| s.frozen.iter().position(|m| Arc::ptr_eq(m, &job.memtable)));
        match (stream, position) {
            (Some(stream), Some(position)) => {
                stream.frozen.remove(position);
                for segment in &segments {
                    stream.assert_in_one_partition(segment);
                }
                stream.segments.extend(segments);
                state.release_unflushed(job.memtable.bytes);
            }
            _ => segments.iter().for_each(|s| s.retire()), // never named by a manifest
        }
    }
}

/// Moves segments past a stream's age or size limit to `retired`: by age every segment
/// whose newest event is past it, wherever it is in the list (a backfill's segments, its
/// partitions' own, come after newer ones); by size the first inserted.
fn apply_retention(state: &mut State, now_ns: i64) {
    for stream in state.streams.values_mut() {
        if let Some(age) = stream.retention.max_age_ns {
            let cutoff = now_ns.saturating_sub(age);
            let (past, kept) = std::mem::take(&mut stream.segments)
                .into_iter()
                .partition(|s| s.meta.max_ts().is_some_and(|t| t < cutoff));
            stream.segments = kept;
            state.retired.extend::<Vec<_>>(past);
        }
        if let Some(max_bytes) = stream.retention.max_bytes {
            let mut drop_first = 0;
            let mut total: u64 = stream.segments.iter().map(|s| s.meta.bytes).sum();
            while total > max_bytes && drop_first < stream.segments.len() {
                total -= stream.segments[drop_first].meta.bytes;
                drop_first += 1;
            }
            state.retired.extend(stream.segments.drain(..drop_first));
        }
    }
}

#[cfg(test)]
mod tests {
    mod pace {
        use std::time::Duration;

        use super::super::{pace, MIN_PACE, PACE_HEADROOM};

        #[test]
        fn writes_go_at_twice_the_fill_rate_and_never_below_the_floor() {
            // 64 MiB filled in 1.4 s (46 MiB/s of appends): the segment goes at ~92 MiB/s.
            let rate = pace(64 << 20, Duration::from_millis(1400));
            let expected = (64u64 << 20) as f64 / 1.4 * PACE_HEADROOM;
            assert!((rate as f64 - expected).abs() < 1.0, "{rate} vs {expected}");
            // A trickle: 1 MiB in 10 s goes at the floor, not at 200 KiB/s.
            assert_eq!(pace(1 << 20, Duration::from_secs(10)), MIN_PACE);
            // Nothing filled, or no time passed (two checkpoints back to back): still a rate.
            assert_eq!(pace(0, Duration::from_secs(1)), MIN_PACE);
            assert!(pace(64 << 20, Duration::ZERO) >= MIN_PACE);
        }
    }

    mod partitions {
        use proptest::prelude::*;
        use tidemark_core::{BatchBuilder, EventBatch, Partition, Retention, Schema, Value};
        use tidemark_storage::manifest::Manifest;

        use crate::{Db, Options, ScanRequest, TimeRange};

        const HOUR: i64 = 3_600_000_000_000;
        const DAY: i64 = 24 * HOUR;

        /// Events in any order and at any date, so that backfills mix with live events.
        fn options() -> Options {
            Options {
                out_of_order_window_ns: None,
                max_future_ns: None,
                ..Options::default()
            }
        }

        fn compacting() -> Options {
            Options {
                compact_min_segments: 2,
                compact_small_events: 10_000,
                ..options()
            }
        }

        fn schema() -> Schema {
            Schema::parse_spec("V:LONG").unwrap()
        }

        /// Events at `ts`, each with the value `marker`.
        fn batch(ts: impl IntoIterator<Item = i64>, marker: i64) -> EventBatch {
            let mut b = BatchBuilder::new(std::sync::Arc::new(schema()), 0);
            for t in ts {
                b.push_row(t, None, &[Value::Long(marker)]).unwrap();
            }
            b.finish()
        }

        /// Each segment's first and last tstart, in the stream's list order.
        fn spans(db: &Db, stream: &str) -> Vec<(i64, i64)> {
            let state = db.shared().read();
            state
                .stream(stream)
                .unwrap()
                .segments
                .iter()
                .map(|s| (s.meta.min_ts().unwrap(), s.meta.max_ts().unwrap()))
                .collect()
        }

        fn in_one_partition(spans: &[(i64, i64)], partition: Partition) -> bool {
            spans.iter().all(|&(min, max)| partition.holds(min, max))
        }

        fn events(db: &Db, stream: &str, range: TimeRange) -> Vec<(i64, i64)> {
            let request = ScanRequest {
                range,
                ..ScanRequest::default()
            };
            let mut out = Vec::new();
            for batch in db.scan(stream, &request).unwrap() {
                let batch = batch.unwrap();
                for r in 0..batch.len() {
                    let Value::Long(v) = batch.column(0).value(r) else {
                        panic!("not a long");
                    };
                    out.push((batch.tstart()[r], v));
                }
            }
            out
        }

        #[test]
        fn a_backfill_and_live_events_in_one_memtable_flush_into_a_segment_each() {
            let dir = tempfile::tempdir().unwrap();
            let db = Db::open(dir.path(), options()).unwrap();
            db.create_stream("ticks", schema()).unwrap();
            let backfill = 10 * DAY + 5 * HOUR;
            let live = 12 * DAY + HOUR;
            db.append("ticks", batch(backfill..backfill + 100, 1))
                .unwrap();
            db.append("ticks", batch(live..live + 100, 2)).unwrap();
            db.flush().unwrap();
            let expected = vec![(backfill, backfill + 99), (live, live + 99)];
            assert_eq!(spans(&db, "ticks"), expected);
            // A day's query finds that day's events only.
            let day = events(&db, "ticks", TimeRange::half_open(12 * DAY, 13 * DAY));
            assert_eq!(day.len(), 100);
            assert!(day.iter().all(|&(_, v)| v == 2));
            db.close().unwrap();
            let db = Db::open(dir.path(), options()).unwrap();
            assert_eq!(spans(&db, "ticks"), expected);
            assert_eq!(events(&db, "ticks", TimeRange::ALL).len(), 200);
        }

        #[test]
        fn compaction_merges_a_partition_across_others_and_never_two_partitions() {
            let dir = tempfile::tempdir().unwrap();
            let db = Db::open(dir.path(), compacting()).unwrap();
            db.create_stream("ticks", schema()).unwrap();
            // Every flush holds a backfill event and a live one, all backfill events at
            // one instant and all live ones at another: the ties' order is the appends'.
            let (backfill, live) = (10 * DAY, 12 * DAY);
            for marker in 0..8 {
                db.append("ticks", batch([backfill, live], marker)).unwrap();
                db.flush().unwrap();
                assert!(in_one_partition(&spans(&db, "ticks"), Partition::DAY));
            }
            // Merged across the segments of the other partition between them.
            let segments = spans(&db, "ticks").len();
            assert!(segments < 8, "{segments} segments after 8 flushes");
            let got = events(&db, "ticks", TimeRange::ALL);
            let expected: Vec<(i64, i64)> = [backfill, live]
                .into_iter()
                .flat_map(|t| (0..8).map(move |m| (t, m)))
                .collect();
            assert_eq!(got, expected);
        }

        #[test]
        fn a_segment_of_an_older_build_spanning_partitions_is_cut_apart() {
            let dir = tempfile::tempdir().unwrap();
            // A stream of year-long partitions stands for a build without partitions: its
            // one segment holds days 10 and 12.
            let db = Db::open(dir.path(), options()).unwrap();
            let year = Partition::new(366 * DAY).unwrap();
            db.create_stream_with("ticks", schema(), false, year)
                .unwrap();
            db.append("ticks", batch([10 * DAY, 10 * DAY + 1, 12 * DAY], 1))
                .unwrap();
            db.flush().unwrap();
            assert_eq!(spans(&db, "ticks"), [(10 * DAY, 12 * DAY)]);
            db.close().unwrap();
            // The manifest such a build wrote: no partition, read as a day.
            let mut manifest = Manifest::load(dir.path()).unwrap().unwrap();
            manifest.streams[0].partition = Partition::DAY;
            manifest.store(dir.path()).unwrap();

            let db = Db::open(dir.path(), compacting()).unwrap();
            assert_eq!(db.stream_info("ticks").unwrap().partition, Partition::DAY);
            assert_eq!(
                spans(&db, "ticks"),
                [(10 * DAY, 12 * DAY)],
                "opened as it is"
            );
            db.flush().unwrap();
            assert_eq!(
                spans(&db, "ticks"),
                [(10 * DAY, 10 * DAY + 1), (12 * DAY, 12 * DAY)]
            );
            let expected = vec![(10 * DAY, 1), (10 * DAY + 1, 1), (12 * DAY, 1)];
            assert_eq!(events(&db, "ticks", TimeRange::ALL), expected);
            db.close().unwrap();
            let db = Db::open(dir.path(), options()).unwrap();
            assert_eq!(events(&db, "ticks", TimeRange::ALL), expected);
        }

        #[test]
        fn a_backfill_past_retention_is_retired_behind_newer_segments() {
            let dir = tempfile::tempdir().unwrap();
            let db = Db::open(dir.path(), options()).unwrap();
            db.create_stream("ticks", schema()).unwrap();
            let now = tidemark_core::time::now_ns();
            db.append("ticks", batch([now - HOUR], 1)).unwrap();
            db.flush().unwrap();
            db.append("ticks", batch([now - 3 * DAY, now - HOUR + 1], 2))
                .unwrap();
            db.flush().unwrap();
            assert_eq!(spans(&db, "ticks").len(), 3);
            let two_days = Retention {
                max_age_ns: Some(2 * DAY),
                max_bytes: None,
            };
            db.set_retention("ticks", two_days).unwrap();
            db.flush().unwrap();
            let kept = events(&db, "ticks", TimeRange::ALL);
            assert_eq!(kept, [(now - HOUR, 1), (now - HOUR + 1, 2)]);
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(12))]

            /// Whatever is appended and flushed, at any dates, every segment lies in one
            /// partition, and the events come back in (tstart, append) order.
            #[test]
            fn every_segment_lies_in_one_partition(
                steps in proptest::collection::vec(
                    (proptest::collection::vec(0i64..6 * HOUR, 0..40), any::<bool>()),
                    1..12,
                ),
            ) {
                let dir = tempfile::tempdir().unwrap();
                let options = Options {
                    compact_small_events: 30,
                    ..compacting()
                };
                let db = Db::open(dir.path(), options).unwrap();
                let hourly = Partition::new(HOUR).unwrap();
                db.create_stream_with("ticks", schema(), false, hourly).unwrap();
                let mut model: Vec<(i64, i64)> = Vec::new();
                for (marker, (mut ts, flush)) in steps.into_iter().enumerate() {
                    // Coarse, so that equal timestamps meet across appends.
                    for t in &mut ts {
                        *t -= *t % (HOUR / 4);
                    }
                    model.extend(ts.iter().map(|&t| (t, marker as i64)));
                    if !ts.is_empty() {
                        db.append("ticks", batch(ts, marker as i64)).unwrap();
                    }
                    if flush {
                        db.flush().unwrap();
                        prop_assert!(in_one_partition(&spans(&db, "ticks"), hourly));
                    }
                }
                db.flush().unwrap();
                db.flush().unwrap();
                prop_assert!(in_one_partition(&spans(&db, "ticks"), hourly));
                model.sort_by_key(|e| e.0);
                prop_assert_eq!(events(&db, "ticks", TimeRange::ALL), model);
            }
        }
    }
}

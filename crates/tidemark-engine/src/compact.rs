//! Compaction: merging runs of small segments of a stream's partition into one.
//!
//! Every checkpoint writes a segment per stream and partition that received events, so a
//! stream with a low rate (or one of thousands of streams) collects many small segments:
//! many files, many footers in memory, many merge sources per scan. The flusher therefore
//! merges a run of at least `compact_min_segments` adjacent segments that are each below
//! `compact_small_events` and of similar size (within a factor of 4, so every event is
//! rewritten a logarithmic number of times, as in size-tiered LSM compaction).
//!
//! Small segments share pack files ([`crate::sink`]), and a pack is deleted only with the
//! last segment in it; a stream without such a run whose small segments keep a mostly dead
//! pack alive has them rewritten instead ([`find_stranded`]).
//!
//! Tiered segments ([`crate::tier`]) are never inputs: their events stay in the bucket.
//!
//! Segments are merged within a time partition of their stream only
//! ([`tidemark_core::Partition`]), and what a compaction writes is cut at partition
//! boundaries ([`crate::sink`]). A run is of one partition's segments, which need not be
//! adjacent in the list: segments of other partitions between them hold no event of its
//! time, so no two equal timestamps change their order when the run is merged. A segment
//! of an older build that spans partitions is rewritten by itself, cut into one segment per
//! partition, when it is no larger than a run may be ([`find_spanning`]); larger ones stay
//! as they are.
//!
//! The merged segments take the run's place in the stream's list (where its first
//! segment was), and their events are in (tstart, insertion) order — the scan merge
//! produces exactly that — so queries, including the tie order of `first`/`last`, cannot
//! tell the difference.
//!
//! Must never know about: the flusher's thread or signal, the log, the tier's bucket.

use std::collections::BTreeMap;
use std::sync::Arc;

use tidemark_core::{BatchBuilder, EventBatch, Partition};
use tidemark_storage::manifest::StreamId;

use crate::error::{EngineError, Result};
use crate::merge::merge_segments;
use crate::options::Options;
use crate::segment::Segment;
use crate::state::State;

/// Segments of one stream to merge, and the partitions to cut the output at.
pub(crate) struct Compaction {
    stream: StreamId,
    epoch: u64,
    partition: Partition,
    /// In the order of the stream's segment list, oldest first.
    inputs: Vec<Arc<Segment>>,
}

/// The most runs merged for one stream in one checkpoint, each of another partition. A
/// flush adds a segment to every partition its events touch (a backfill's and the live
/// one's alike), so one run per checkpoint would fall behind; this bounds what one
/// checkpoint rewrites for a stream.
const MAX_RUNS_PER_STREAM: usize = 4;

/// Picks the runs to merge: the first run of each partition that has one (oldest first, up
/// to [`MAX_RUNS_PER_STREAM`] per stream), else one stranded run or spanning segment.
pub(crate) fn plan(state: &State, options: &Options) -> Vec<Compaction> {
    let min = options.compact_min_segments;
    if min < 2 {
        return Vec::new();
    }
    let small = Small {
        events: options.compact_small_events,
        bytes: options.compact_small_bytes,
    };
    let mut compactions = Vec::new();
    for stream in state.streams.values() {
        let segments = &stream.segments;
        let mut runs: Vec<Vec<usize>> = by_partition(segments, stream.partition)
            .into_values()
            .filter_map(|indices| {
                let members: Vec<&Arc<Segment>> = indices.iter().map(|&i| &segments[i]).collect();
                let run = find_run(&members, stream.partition, min, small)?;
                Some(indices[run].to_vec())
            })
            .take(MAX_RUNS_PER_STREAM)
            .collect();
        if runs.is_empty() {
            runs.extend(
                find_stranded(segments, min)
                    .map(|range| range.collect())
                    .or_else(|| {
                        find_spanning(segments, stream.partition, min, small).map(|i| vec![i])
                    }),
            );
        }
        // Runs of different partitions share no segment: each installs by itself.
        for indices in runs {
            compactions.push(Compaction {
                stream: stream.id,
                epoch: stream.epoch,
                partition: stream.partition,
                inputs: indices.into_iter().map(|i| segments[i].clone()).collect(),
            });
        }
    }
    compactions
}

/// The positions of each partition's segments (by partition number, in list order): those
/// wholly in it, and those of older builds that reach into it (which are never merged,
/// but no run of the partition may merge across them).
fn by_partition(segments: &[Arc<Segment>], partition: Partition) -> BTreeMap<i64, Vec<usize>> {
    let span = |s: &Arc<Segment>| {
        let (min, max) = s.meta.min_ts().zip(s.meta.max_ts())?;
        Some((partition.index(min), partition.index(max)))
    };
    let mut members: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (first, _) in segments.iter().filter_map(span).filter(|(a, b)| a == b) {
        members.entry(first).or_default();
    }
    for (i, (first, last)) in segments
        .iter()
        .enumerate()
        .filter_map(|(i, s)| Some((i, span(s)?)))
    {
        for (_, positions) in members.range_mut(first..=last) {
            positions.push(i);
        }
    }
    members
}

/// What makes a segment small: fewer events than `events` and fewer file bytes than
/// `bytes` (wide events fill a segment with few of them; merging those would rewrite
/// hundreds of MB to save a handful of files).
#[derive(Debug, Clone, Copy)]
struct Small {
    events: u64,
    bytes: u64,
}

/// The first run of at least `min` adjacent small segments of similar size, each in one
/// partition, capped at `min` small segments' worth of events and bytes in all.
fn find_run(
    segments: &[&Arc<Segment>],
    partition: Partition,
    min: usize,
    small: Small,
) -> Option<std::ops::Range<usize>> {
    let events: Vec<u64> = segments.iter().map(|s| s.meta.event_count()).collect();
    // A merge holds its output whole, with a bit per field and event however sparse the
    // fields: a segment's size is the larger of its file and those bits (100,000 events of
    // a 1,000-field stream are a 300 KB file and 12.5 MB of bits).
    let bytes: Vec<u64> = segments
        .iter()
        .zip(&events)
        .map(|(s, &n)| {
            s.meta
                .bytes
                .max(n * (s.meta.schema.len() as u64).div_ceil(8))
        })
        .collect();
    // A tiered segment is never merged: that would bring its events back to local disk.
    let is_small = |i: usize| {
        events[i] < small.events
            && bytes[i] < small.bytes
            && segments[i].local().is_some()
            && in_one_partition(segments[i], partition)
    };
    let mut start = 0;
    while start < events.len() {
        let (mut low, mut high) = (events[start], events[start]);
        let (mut total_events, mut total_bytes) = (0u64, 0u64);
        let mut end = start;
        while end < events.len() && is_small(end) {
            let (l, h) = (low.min(events[end]), high.max(events[end]));
            if h > 4 * l.max(1)
                || total_events + events[end] > min as u64 * small.events
                || total_bytes + bytes[end] > min as u64 * small.bytes
            {
                break;
            }
            (low, high) = (l, h);
            total_events += events[end];
            total_bytes += bytes[end];
            end += 1;
        }
        if end - start >= min {
            return Some(start..end);
        }
        start = end.max(start + 1);
    }
    None
}

/// Adjacent segments (at most `max` of them) that keep a pack alive of which less than a
/// quarter is still live: the rest of the pack was compacted, retired or dropped, and
/// rewriting these few frees it. Without this, a stream that stopped receiving events
/// would pin every pack its last small segments landed in.
fn find_stranded(segments: &[Arc<Segment>], max: usize) -> Option<std::ops::Range<usize>> {
    let stranded = |s: &Arc<Segment>| s.local().is_some_and(|(f, _)| f.is_mostly_dead_pack());
    let start = segments.iter().position(stranded)?;
    let len = segments[start..]
        .iter()
        .take(max)
        .take_while(|s| stranded(s))
        .count();
    Some(start..start + len)
}

/// The first local segment (of an older build) that spans partitions and holds no more
/// than a run may: rewritten by itself, cut at partition boundaries.
fn find_spanning(
    segments: &[Arc<Segment>],
    partition: Partition,
    min: usize,
    small: Small,
) -> Option<usize> {
    segments.iter().position(|s| {
        s.local().is_some()
            && !in_one_partition(s, partition)
            && s.meta.event_count() <= min as u64 * small.events
            && s.meta.bytes <= min as u64 * small.bytes
    })
}

/// Whether `segment`'s events lie in one partition (an empty one's do).
fn in_one_partition(segment: &Segment, partition: Partition) -> bool {
    match segment.meta.min_ts().zip(segment.meta.max_ts()) {
        Some((min, max)) => partition.holds(min, max),
        None => true,
    }
}

impl Compaction {
    pub(crate) fn partition(&self) -> Partition {
        self.partition
    }

    /// What the inputs occupy on disk: about what the output will.
    pub(crate) fn input_bytes(&self) -> u64 {
        self.inputs.iter().map(|s| s.meta.bytes).sum()
    }
}

/// The inputs' events merged into one batch, in the order the output keeps them.
pub(crate) fn merge(compaction: &Compaction) -> Result<EventBatch> {
    // Inputs written before fields were added to the stream have narrower schemas: the
    // output has the widest (every other is its beginning), the others' events null there.
    let schema = compaction
        .inputs
        .iter()
        .map(|s| &s.meta.schema)
        .max_by_key(|schema| schema.len())
        .ok_or_else(|| EngineError::InvalidRequest("a compaction without inputs".into()))?
        .clone();
    let total: u64 = compaction.inputs.iter().map(|s| s.meta.event_count()).sum();
    // Each field's values, from the blocks' summaries: a sparse field reserves its values,
    // not a slot per event.
    let values = |field: usize| {
        let count: u64 = compaction
            .inputs
            .iter()
            .flat_map(|s| &s.meta.blocks)
            .filter_map(|b| b.summary.fields.get(field))
            .map(|f| f.count)
            .sum();
        count as usize
    };
    let mut builder = BatchBuilder::with_capacities(schema.clone(), total as usize, values);
    for batch in merge_segments(&schema, compaction.inputs.clone())? {
        let batch = batch?;
        builder.extend_from(&batch, 0..batch.len())?;
    }
    Ok(builder.finish())
}

/// Puts the outputs (one per partition, in time order) where the first input was, if the
/// inputs are all still in the list (a clear, a drop, retention or tiering may have
/// removed or replaced some meanwhile; segments are only ever added at its end, so none
/// came between them); else discards the outputs. The replaced inputs go to
/// `state.retired`, to be deleted after the next manifest.
pub(crate) fn install(state: &mut State, compaction: Compaction, outputs: Vec<Arc<Segment>>) {
    let stream = state
        .streams
        .get_mut(&compaction.stream)
        .filter(|s| s.epoch == compaction.epoch);
    let positions: Option<Vec<usize>> = stream.as_ref().and_then(|stream| {
        compaction
            .inputs
            .iter()
            .map(|input| stream.segments.iter().position(|s| Arc::ptr_eq(s, input)))
            .collect()
    });
    let in_place = positions.filter(|p| !p.is_empty() && p.windows(2).all(|w| w[0] < w[1]));
    let (Some(stream), Some(positions)) = (stream, in_place) else {
        outputs.iter().for_each(|o| o.retire());
        return;
    };
    for output in &outputs {
        stream.assert_in_one_partition(output);
    }
    let mut replaced = Vec::with_capacity(positions.len());
    for &p in positions.iter().rev() {
        replaced.push(stream.segments.remove(p));
    }
    stream.segments.splice(positions[0]..positions[0], outputs);
    state.retired.extend(replaced);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::SegmentFile;
    use std::path::PathBuf;
    use tidemark_core::{Schema, Value};
    use tidemark_storage::segment::{write_segment, SegmentOptions};

    fn segments(dir: &std::path::Path, sizes: &[i64]) -> Vec<Arc<Segment>> {
        let schema = Arc::new(Schema::parse_spec("V:LONG").unwrap());
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let mut b = BatchBuilder::new(schema.clone(), n as usize);
                for t in 0..n {
                    b.push_row(t, None, &[Value::Long(t)]).unwrap();
                }
                let path: PathBuf = dir.join(format!("{i}.seg"));
                let meta = write_segment(&path, &b.finish(), &SegmentOptions::default()).unwrap();
                Arc::new(Segment::new(
                    i as u64,
                    SegmentFile::new(path, meta.bytes, false),
                    None,
                    meta,
                ))
            })
            .collect()
    }

    #[test]
    fn picks_runs_of_similar_small_segments() {
        let dir = tempfile::tempdir().unwrap();
        let s = segments(dir.path(), &[5000, 10, 12, 9, 11, 40, 200]);
        assert_eq!(
            find_run(&refs(&s), Partition::DAY, 4, by_events(1000)),
            Some(1..5),
            "5000 is not small; 40 is too unlike 9"
        );
        assert_eq!(
            find_run(&refs(&s), Partition::DAY, 5, by_events(1000)),
            None
        );
        assert_eq!(
            find_run(&refs(&s[1..5]), Partition::DAY, 4, by_events(12)),
            None,
            "12 events are not below 12"
        );
        assert_eq!(
            find_run(&refs(&s[1..5]), Partition::DAY, 2, by_events(15)),
            Some(0..2),
            "capped at 2 * 15 events: 10 + 12"
        );
        assert_eq!(
            find_run(&refs(&s[1..5]), Partition::DAY, 2, by_events(100)),
            Some(0..4)
        );

        // By bytes: the same segments are not small when their files are not.
        let biggest = s[1..5].iter().map(|s| s.meta.bytes).max().unwrap();
        let smallest = s[1..5].iter().map(|s| s.meta.bytes).min().unwrap();
        let by_bytes = |bytes| Small {
            events: 1000,
            bytes,
        };
        assert_eq!(
            find_run(&refs(&s[1..5]), Partition::DAY, 4, by_bytes(biggest + 1)),
            Some(0..4)
        );
        assert_eq!(
            find_run(&refs(&s[1..5]), Partition::DAY, 2, by_bytes(smallest)),
            None
        );
        // Capped at 2 small segments' worth of bytes: the first two fit, a third does not.
        assert_eq!(
            find_run(&refs(&s[1..5]), Partition::DAY, 2, by_bytes(biggest + 1)),
            Some(0..2)
        );
    }

    #[test]
    fn a_wide_sparse_segment_is_as_large_as_its_bits() {
        // 4,000 events of 800 fields, one value each: a small file, but 400 KB of null
        // bits once a merge holds them.
        let dir = tempfile::tempdir().unwrap();
        let spec: Vec<String> = (0..800).map(|i| format!("F{i}:LONG")).collect();
        let schema = Arc::new(Schema::parse_spec(&spec.join(",")).unwrap());
        let wide: Vec<Arc<Segment>> = (0..4)
            .map(|i| {
                let mut b = BatchBuilder::new(schema.clone(), 4000);
                for t in 0..4000i64 {
                    let mut row = vec![Value::Null; 800];
                    row[t as usize % 800] = Value::Long(t);
                    b.push_row(t, None, &row).unwrap();
                }
                let path: PathBuf = dir.path().join(format!("{i}.seg"));
                let meta = write_segment(&path, &b.finish(), &SegmentOptions::default()).unwrap();
                assert!(meta.bytes < 200_000, "a {} byte file", meta.bytes);
                Arc::new(Segment::new(
                    i,
                    SegmentFile::new(path, meta.bytes, false),
                    None,
                    meta,
                ))
            })
            .collect();
        let small = |bytes| Small {
            events: 1_000_000,
            bytes,
        };
        assert_eq!(
            find_run(&refs(&wide), Partition::DAY, 4, small(1 << 20)),
            Some(0..4)
        );
        assert_eq!(
            find_run(&refs(&wide), Partition::DAY, 4, small(400_000)),
            None
        );
    }

    fn refs(segments: &[Arc<Segment>]) -> Vec<&Arc<Segment>> {
        segments.iter().collect()
    }

    fn by_events(events: u64) -> Small {
        Small {
            events,
            bytes: u64::MAX / 8,
        }
    }
}

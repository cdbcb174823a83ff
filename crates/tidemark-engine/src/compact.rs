//! Compaction: merging runs of small adjacent segments of a stream into one.
//!
//! Every checkpoint writes one segment per stream that received events, so a stream with a
//! low rate (or one of thousands of streams) collects many small segments: many files, many
//! footers in memory, many merge sources per scan. The flusher therefore merges a run of at
//! least `compact_min_segments` adjacent segments that are each below
//! `compact_small_events` and of similar size (within a factor of 4, so every event is
//! rewritten a logarithmic number of times, as in size-tiered LSM compaction).
//!
//! Small segments share pack files ([`crate::sink`]), and a pack is deleted only with the
//! last segment in it; a stream without such a run whose small segments keep a mostly dead
//! pack alive has them rewritten instead ([`find_stranded`]).
//!
//! Tiered segments ([`crate::tier`]) are never inputs: their events stay in the bucket.
//!
//! The merged segment takes the run's place in the stream's list, and its events are in
//! (tstart, insertion) order — the scan merge produces exactly that — so queries, including
//! the tie order of `first`/`last`, cannot tell the difference.

use std::sync::Arc;

use tidemark_core::{BatchBuilder, EventBatch};
use tidemark_storage::manifest::StreamId;

use crate::error::{EngineError, Result};
use crate::scan::merge_segments;
use crate::state::{Segment, State};
use crate::Options;

/// Adjacent segments of one stream to merge, and the id of the segment to write.
pub(crate) struct Compaction {
    stream: StreamId,
    epoch: u64,
    /// Oldest first, adjacent in the stream's segment list.
    inputs: Vec<Arc<Segment>>,
    output_id: u64,
}

/// Picks at most one run per stream; allocates the output ids.
pub(crate) fn plan(state: &mut State, options: &Options) -> Vec<Compaction> {
    let min = options.compact_min_segments;
    if min < 2 {
        return Vec::new();
    }
    let small = Small {
        events: options.compact_small_events,
        bytes: options.compact_small_bytes,
    };
    let mut runs = Vec::new();
    for stream in state.streams.values() {
        let run =
            find_run(&stream.segments, min, small).or_else(|| find_stranded(&stream.segments, min));
        if let Some(range) = run {
            runs.push((stream.id, stream.epoch, stream.segments[range].to_vec()));
        }
    }
    runs.into_iter()
        .map(|(stream, epoch, inputs)| Compaction {
            stream,
            epoch,
            inputs,
            output_id: state.allocate_id(),
        })
        .collect()
}

/// What makes a segment small: fewer events than `events` and fewer file bytes than
/// `bytes` (wide events fill a segment with few of them; merging those would rewrite
/// hundreds of MB to save a handful of files).
#[derive(Debug, Clone, Copy)]
struct Small {
    events: u64,
    bytes: u64,
}

/// The first run of at least `min` adjacent small segments of similar size, capped at
/// `min` small segments' worth of events and bytes in all.
fn find_run(segments: &[Arc<Segment>], min: usize, small: Small) -> Option<std::ops::Range<usize>> {
    let events: Vec<u64> = segments.iter().map(|s| s.meta.event_count()).collect();
    let bytes: Vec<u64> = segments.iter().map(|s| s.meta.bytes).collect();
    // A tiered segment is never merged: that would bring its events back to local disk.
    let is_small = |i: usize| {
        events[i] < small.events && bytes[i] < small.bytes && segments[i].local().is_some()
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

impl Compaction {
    pub(crate) fn output_id(&self) -> u64 {
        self.output_id
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

/// Puts the output in place of the inputs if they are all still where they were (a clear,
/// a drop or retention may have removed some meanwhile); else discards the output. The
/// replaced inputs go to `state.retired`, to be deleted after the next manifest.
pub(crate) fn install(state: &mut State, compaction: Compaction, output: Arc<Segment>) {
    let Some(stream) = state
        .streams
        .get_mut(&compaction.stream)
        .filter(|s| s.epoch == compaction.epoch)
    else {
        output.retire();
        return;
    };
    let first = &compaction.inputs[0];
    let position = stream.segments.iter().position(|s| Arc::ptr_eq(s, first));
    let in_place = position.is_some_and(|p| {
        stream.segments.len() >= p + compaction.inputs.len()
            && stream.segments[p..p + compaction.inputs.len()]
                .iter()
                .zip(&compaction.inputs)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    });
    match position.filter(|_| in_place) {
        Some(p) => {
            let replaced: Vec<_> = stream
                .segments
                .splice(p..p + compaction.inputs.len(), [output])
                .collect();
            state.retired.extend(replaced);
        }
        None => output.retire(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::SegmentFile;
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
            find_run(&s, 4, by_events(1000)),
            Some(1..5),
            "5000 is not small; 40 is too unlike 9"
        );
        assert_eq!(find_run(&s, 5, by_events(1000)), None);
        assert_eq!(
            find_run(&s[1..5], 4, by_events(12)),
            None,
            "12 events are not below 12"
        );
        assert_eq!(
            find_run(&s[1..5], 2, by_events(15)),
            Some(0..2),
            "capped at 2 * 15 events: 10 + 12"
        );
        assert_eq!(find_run(&s[1..5], 2, by_events(100)), Some(0..4));

        // By bytes: the same segments are not small when their files are not.
        let biggest = s[1..5].iter().map(|s| s.meta.bytes).max().unwrap();
        let smallest = s[1..5].iter().map(|s| s.meta.bytes).min().unwrap();
        let by_bytes = |bytes| Small {
            events: 1000,
            bytes,
        };
        assert_eq!(find_run(&s[1..5], 4, by_bytes(biggest + 1)), Some(0..4));
        assert_eq!(find_run(&s[1..5], 2, by_bytes(smallest)), None);
        // Capped at 2 small segments' worth of bytes: the first two fit, a third does not.
        assert_eq!(find_run(&s[1..5], 2, by_bytes(biggest + 1)), Some(0..2));
    }

    fn by_events(events: u64) -> Small {
        Small {
            events,
            bytes: u64::MAX / 8,
        }
    }
}

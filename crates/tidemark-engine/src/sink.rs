//! Where a checkpoint writes segments (flushed memtables and compaction outputs), and how
//! it makes them durable.
//!
//! A segment expected to be large gets a file of its own. Smaller ones are appended to a
//! shared pack file (up to [`PACK_BYTES`] each), so a checkpoint of 2000 streams holding a
//! 64 KiB batch each creates one file instead of 2000: creating files, next to the many
//! that compaction deletes, was half of such a flush's time on ext4. Files are fsync'd in
//! groups after they are written (at most [`MAX_UNSYNCED_FILES`] open at once), so their
//! writeback overlaps and one journal commit covers many, then the directory is fsync'd
//! once. Only after that do the segments exist for the caller to install.
//!
//! Every segment is cut here at its stream's partition boundaries
//! ([`tidemark_core::Partition`]): what a flush or a compaction writes as one becomes a
//! segment per partition its events touch, so no segment written since partitions exist
//! holds events of two.
//!
//! Must never know about: what the segments are for (flushed memtables or compaction
//! outputs: the caller's `J`), where they are installed, the manifest.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use tidemark_core::{BatchBuilder, EventBatch, Partition};
use tidemark_storage::fsutil::sync_dir;
use tidemark_storage::manifest::{pack_path, segment_path, PackedSegment};
use tidemark_storage::segment::{
    write_segment_unsynced, PackWriter, SegmentMeta, SegmentOptions, UnsyncedFile,
};

use crate::error::Result;
use crate::segment::{Segment, SegmentFile};
use crate::shared::Shared;

/// A pack is closed (and a new one started) once it holds this many bytes.
const PACK_BYTES: u64 = 64 << 20;

/// Files written before the sink fsyncs them as a group; bounds the files it holds open.
const MAX_UNSYNCED_FILES: usize = 256;

/// Writes the segments of one checkpoint step; `J` is what each write was for, handed
/// back with its segments by [`SegmentSink::finish`].
pub(crate) struct SegmentSink<'a, J> {
    shared: &'a Shared,
    options: &'a SegmentOptions,
    pack: Option<OpenPack>,
    unsynced: Vec<WrittenFile>,
    /// With the write and part that made each: a pack's segments become durable after
    /// files written later.
    synced: Vec<(Part, Arc<Segment>)>,
    /// What each write was for, by write number.
    jobs: Vec<J>,
}

/// Which write made a segment, and which of its partitions it holds (in time order).
type Part = (usize, usize);

struct OpenPack {
    id: u64,
    writer: PackWriter,
    segments: Vec<WrittenSegment>,
}

/// A file written but not fsync'd, and the segments in it.
struct WrittenFile {
    file: UnsyncedFile,
    /// `None` for a segment's own file.
    pack_id: Option<u64>,
    bytes: u64,
    segments: Vec<WrittenSegment>,
}

struct WrittenSegment {
    part: Part,
    id: u64,
    /// Where it is in its file.
    range: Range<u64>,
    meta: SegmentMeta,
}

impl<'a, J> SegmentSink<'a, J> {
    pub(crate) fn new(shared: &'a Shared, options: &'a SegmentOptions) -> Self {
        SegmentSink {
            shared,
            options,
            pack: None,
            unsynced: Vec::new(),
            synced: Vec::new(),
            jobs: Vec::new(),
        }
    }

    /// Writes `events` (sorted by tstart) for `job`: a segment per `partition` they touch,
    /// each under a fresh id, and each into a pack when its share of `expected_bytes` (the
    /// memtable's size, or the inputs') is below the database's `pack_below_bytes`, else
    /// into a file of its own.
    pub(crate) fn write(
        &mut self,
        job: J,
        events: &EventBatch,
        partition: Partition,
        expected_bytes: u64,
    ) -> Result<()> {
        let write = self.jobs.len();
        self.jobs.push(job);
        let cuts = partition.cuts(events.tstart());
        let total = events.len().max(1) as u64;
        for (part, rows) in cuts.into_iter().enumerate() {
            let ts = &events.tstart()[rows.clone()];
            // The invariant every segment written from now on keeps.
            assert!(
                ts.first()
                    .zip(ts.last())
                    .is_some_and(|(&min, &max)| partition.holds(min, max)),
                "a segment of rows {rows:?} would span partitions of {partition}"
            );
            let expected = expected_bytes.saturating_mul(rows.len() as u64) / total;
            let events = if rows.len() == events.len() {
                Cow::Borrowed(events)
            } else {
                Cow::Owned(rows_of(events, rows)?)
            };
            let id = self.shared.write().allocate_id();
            self.write_segment((write, part), id, &events, expected)?;
        }
        Ok(())
    }

    fn write_segment(
        &mut self,
        part: Part,
        id: u64,
        events: &EventBatch,
        expected_bytes: u64,
    ) -> Result<()> {
        if expected_bytes >= self.shared.options.pack_below_bytes as u64 {
            let path = segment_path(&self.shared.dir, id);
            let written = write_segment_unsynced(&path, events, self.options)?;
            let bytes = written.meta.bytes;
            self.unsynced.push(WrittenFile {
                file: written.file,
                pack_id: None,
                bytes,
                segments: vec![WrittenSegment {
                    part,
                    id,
                    range: 0..bytes,
                    meta: written.meta,
                }],
            });
        } else {
            let pack = match &mut self.pack {
                Some(pack) => pack,
                None => {
                    let id = self.shared.write().allocate_id();
                    let writer = PackWriter::create(&pack_path(&self.shared.dir, id))?;
                    self.pack.insert(OpenPack {
                        id,
                        writer,
                        segments: Vec::new(),
                    })
                }
            };
            let (range, meta) = pack.writer.append(events, self.options)?;
            pack.segments.push(WrittenSegment {
                part,
                id,
                range,
                meta,
            });
            if pack.writer.bytes() >= PACK_BYTES {
                self.close_pack()?;
            }
        }
        if self.unsynced.len() >= MAX_UNSYNCED_FILES {
            self.sync_unsynced()?;
        }
        Ok(())
    }

    /// Every write's job with its segments, durable and in place, in the order written
    /// (a stream's segments are installed in this order, oldest first; a write's in time
    /// order).
    pub(crate) fn finish(mut self) -> Result<Vec<(J, Vec<Arc<Segment>>)>> {
        self.sync_unsynced()?;
        if !self.synced.is_empty() {
            sync_dir(&self.shared.dir.join("segments"))?;
        }
        self.synced.sort_by_key(|s| s.0);
        let mut written: Vec<(J, Vec<Arc<Segment>>)> =
            self.jobs.into_iter().map(|job| (job, Vec::new())).collect();
        for ((write, _), segment) in self.synced {
            written[write].1.push(segment);
        }
        Ok(written)
    }

    fn close_pack(&mut self) -> Result<()> {
        if let Some(pack) = self.pack.take() {
            self.unsynced.push(WrittenFile {
                bytes: pack.writer.bytes(),
                file: pack.writer.close()?,
                pack_id: Some(pack.id),
                segments: pack.segments,
            });
        }
        Ok(())
    }

    /// Fsyncs every file written so far (closing the open pack) and makes its segments.
    fn sync_unsynced(&mut self) -> Result<()> {
        self.close_pack()?;
        for written in self.unsynced.drain(..) {
            let path = written.file.path().to_path_buf();
            written.file.finish()?;
            let file = SegmentFile::new(path, written.bytes, written.pack_id.is_some());
            for s in written.segments {
                let packed = written.pack_id.map(|pack| PackedSegment {
                    pack,
                    offset: s.range.start,
                    len: s.range.end - s.range.start,
                });
                let segment = Segment::new(s.id, file.clone(), packed, s.meta);
                self.synced.push((s.part, Arc::new(segment)));
            }
        }
        Ok(())
    }
}

/// A copy of the events at `rows` of `events`.
fn rows_of(events: &EventBatch, rows: Range<usize>) -> Result<EventBatch> {
    let values = |field: usize| events.column(field).value_range(rows.clone()).len();
    let mut builder = BatchBuilder::with_capacities(events.schema().clone(), rows.len(), values);
    builder.extend_from(events, rows)?;
    Ok(builder.finish())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tidemark_core::{BatchBuilder, Schema, Value};

    use super::*;
    use crate::{Db, Options};

    #[test]
    fn segments_come_back_in_the_order_written_whatever_file_they_went_to() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            pack_below_bytes: 1000,
            ..Options::default()
        };
        let db = Db::open(dir.path(), options).unwrap();
        let schema = Arc::new(Schema::parse_spec("V:LONG").unwrap());
        let events = |n: i64| {
            let mut b = BatchBuilder::new(schema.clone(), n as usize);
            for t in 0..n {
                b.push_row(t, None, &[Value::Long(t)]).unwrap();
            }
            b.finish()
        };
        let shared = db.shared();
        let mut sink = SegmentSink::new(shared, &shared.options.segment);
        // Small ones go to the pack, which is made durable after the large one's file.
        for (job, (n, expected_bytes)) in
            [(10, 100), (2000, 50_000), (5, 50)].into_iter().enumerate()
        {
            sink.write(job, &events(n), Partition::DAY, expected_bytes)
                .unwrap();
        }
        let written = sink.finish().unwrap();
        let jobs: Vec<usize> = written.iter().map(|w| w.0).collect();
        assert_eq!(jobs, [0, 1, 2]);
        let segments: Vec<&Arc<Segment>> = written.iter().flat_map(|w| &w.1).collect();
        let counts: Vec<u64> = segments.iter().map(|s| s.meta.event_count()).collect();
        assert_eq!(counts, [10, 2000, 5]);
        let local: Vec<_> = segments.iter().map(|s| s.local().unwrap()).collect();
        let packed: Vec<bool> = local.iter().map(|(_, packed)| packed.is_some()).collect();
        assert_eq!(packed, [true, false, true]);
        assert!(Arc::ptr_eq(local[0].0, local[2].0), "one pack");
    }

    #[test]
    fn a_write_becomes_a_segment_per_partition_in_time_order() {
        const DAY: i64 = 86_400_000_000_000;
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            pack_below_bytes: 1000,
            ..Options::default()
        };
        let db = Db::open(dir.path(), options).unwrap();
        let schema = Arc::new(Schema::parse_spec("V:LONG").unwrap());
        // Sorted, in days 0, 2 and 5: the first part large enough for a file of its own,
        // the others small enough for the pack, which becomes durable after that file.
        let mut b = BatchBuilder::new(schema, 2015);
        let days = [(0, 2000), (2, 5), (5, 10)];
        for (day, n) in days {
            for i in 0..n {
                b.push_row(day * DAY + i, None, &[Value::Long(i)]).unwrap();
            }
        }
        let shared = db.shared();
        let mut sink = SegmentSink::new(shared, &shared.options.segment);
        sink.write("job", &b.finish(), Partition::DAY, 50_000)
            .unwrap();
        let written = sink.finish().unwrap();
        assert_eq!(written.len(), 1);
        let (job, segments) = &written[0];
        assert_eq!(*job, "job");
        let got: Vec<(Option<i64>, Option<i64>, u64, bool)> = segments
            .iter()
            .map(|s| {
                let packed = s.local().unwrap().1.is_some();
                (
                    s.meta.min_ts(),
                    s.meta.max_ts(),
                    s.meta.event_count(),
                    packed,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (Some(0), Some(1999), 2000, false),
                (Some(2 * DAY), Some(2 * DAY + 4), 5, true),
                (Some(5 * DAY), Some(5 * DAY + 9), 10, true),
            ]
        );
    }
}

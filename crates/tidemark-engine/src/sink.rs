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

use std::ops::Range;
use std::sync::Arc;

use tidemark_core::EventBatch;
use tidemark_storage::fsutil::sync_dir;
use tidemark_storage::manifest::{pack_path, segment_path, PackedSegment};
use tidemark_storage::segment::{
    write_segment_unsynced, PackWriter, SegmentMeta, SegmentOptions, UnsyncedFile,
};

use crate::db::Shared;
use crate::error::Result;
use crate::state::{Segment, SegmentFile};

/// A pack is closed (and a new one started) once it holds this many bytes.
const PACK_BYTES: u64 = 64 << 20;

/// Files written before the sink fsyncs them as a group; bounds the files it holds open.
const MAX_UNSYNCED_FILES: usize = 256;

/// Writes the segments of one checkpoint step; `J` is what each segment was written for,
/// handed back with it by [`SegmentSink::finish`].
pub(crate) struct SegmentSink<'a, J> {
    shared: &'a Shared,
    options: &'a SegmentOptions,
    pack: Option<OpenPack<J>>,
    unsynced: Vec<WrittenFile<J>>,
    /// With the number of the write that made each: a pack's segments become durable
    /// after files written later.
    synced: Vec<(usize, J, Arc<Segment>)>,
    writes: usize,
}

struct OpenPack<J> {
    id: u64,
    writer: PackWriter,
    segments: Vec<WrittenSegment<J>>,
}

/// A file written but not fsync'd, and the segments in it.
struct WrittenFile<J> {
    file: UnsyncedFile,
    /// `None` for a segment's own file.
    pack_id: Option<u64>,
    bytes: u64,
    segments: Vec<WrittenSegment<J>>,
}

struct WrittenSegment<J> {
    /// Which write made it.
    write: usize,
    job: J,
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
            writes: 0,
        }
    }

    /// Writes `events` as segment `id`: into a pack when `expected_bytes` (its memtable's
    /// size, or its inputs') is below the database's `pack_below_bytes`, else into a file
    /// of its own.
    pub(crate) fn write(
        &mut self,
        job: J,
        id: u64,
        events: &EventBatch,
        expected_bytes: u64,
    ) -> Result<()> {
        let write = self.writes;
        self.writes += 1;
        if expected_bytes >= self.shared.options.pack_below_bytes as u64 {
            let path = segment_path(&self.shared.dir, id);
            let written = write_segment_unsynced(&path, events, self.options)?;
            let bytes = written.meta.bytes;
            self.unsynced.push(WrittenFile {
                file: written.file,
                pack_id: None,
                bytes,
                segments: vec![WrittenSegment {
                    write,
                    job,
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
                write,
                job,
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

    /// Every segment written, durable and in place, in the order written (a stream's
    /// segments are installed in this order, oldest first).
    pub(crate) fn finish(mut self) -> Result<Vec<(J, Arc<Segment>)>> {
        self.sync_unsynced()?;
        if self.writes > 0 {
            sync_dir(&self.shared.dir.join("segments"))?;
        }
        self.synced.sort_by_key(|s| s.0);
        Ok(self
            .synced
            .into_iter()
            .map(|(_, job, s)| (job, s))
            .collect())
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
                self.synced.push((s.write, s.job, Arc::new(segment)));
            }
        }
        Ok(())
    }
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
            let id = shared.write().allocate_id();
            sink.write(job, id, &events(n), expected_bytes).unwrap();
        }
        let written = sink.finish().unwrap();
        let jobs: Vec<usize> = written.iter().map(|w| w.0).collect();
        assert_eq!(jobs, [0, 1, 2]);
        let counts: Vec<u64> = written.iter().map(|w| w.1.meta.event_count()).collect();
        assert_eq!(counts, [10, 2000, 5]);
        let local: Vec<_> = written.iter().map(|w| w.1.local().unwrap()).collect();
        let packed: Vec<bool> = local.iter().map(|(_, packed)| packed.is_some()).collect();
        assert_eq!(packed, [true, false, true]);
        assert!(Arc::ptr_eq(local[0].0, local[2].0), "one pack");
    }
}

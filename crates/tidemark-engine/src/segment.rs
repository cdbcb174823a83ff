//! Sealed segments as the catalog holds them: where each one's bytes are (a local file of
//! its own, its range of a shared pack, or an object in the tier's bucket), when its file
//! may be deleted, and how its bytes are opened for reading.
//!
//! Must never know about: the catalog that lists segments ([`crate::state`]), how they are
//! written (`sink`) or moved to the bucket (`tier_mover`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tidemark_storage::manifest::{PackedSegment, TieredSegment};
use tidemark_storage::segment::{ReadAt, SegmentMeta};
use tidemark_storage::StorageError;

use crate::tier::Tier;

/// A file that holds segments: one segment's own file, or a pack shared by several (see
/// [`tidemark_storage::segment::PackWriter`]). It is deleted once every segment in it has
/// been retired and the last reader has let go of it.
#[derive(Debug)]
pub struct SegmentFile {
    pub path: PathBuf,
    /// Its size on disk.
    pub bytes: u64,
    is_pack: bool,
    segments: AtomicUsize,
    retired: AtomicUsize,
    /// Bytes of its segments not retired yet.
    live_bytes: AtomicU64,
}

impl SegmentFile {
    pub fn new(path: PathBuf, bytes: u64, is_pack: bool) -> Arc<SegmentFile> {
        Arc::new(SegmentFile {
            path,
            bytes,
            is_pack,
            segments: AtomicUsize::new(0),
            retired: AtomicUsize::new(0),
            live_bytes: AtomicU64::new(0),
        })
    }

    /// A pack of which less than a quarter is still live: rewriting its live segments
    /// elsewhere frees the rest.
    pub fn is_mostly_dead_pack(&self) -> bool {
        self.is_pack && self.live_bytes.load(Ordering::Acquire).saturating_mul(4) < self.bytes
    }
}

impl Drop for SegmentFile {
    fn drop(&mut self) {
        let segments = *self.segments.get_mut();
        if segments > 0 && *self.retired.get_mut() == segments {
            // A leftover file is harmless: the next open deletes unreferenced files.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Where a sealed segment's bytes are.
#[derive(Debug)]
pub enum Placement {
    /// In a local file of its own, or in its range of a pack.
    Local {
        file: Arc<SegmentFile>,
        packed: Option<PackedSegment>,
    },
    /// In an object of the tier's bucket; only its stub (footer) is on local disk.
    Tiered {
        object: TieredSegment,
        stub: PathBuf,
        tier: Arc<Tier>,
    },
}

/// A sealed segment: where its bytes are, and its footer.
#[derive(Debug)]
pub struct Segment {
    pub id: u64,
    pub placement: Placement,
    pub meta: SegmentMeta,
    retired: AtomicBool,
}

impl Segment {
    /// A segment in a local file (`packed`: its range of a pack).
    pub fn new(
        id: u64,
        file: Arc<SegmentFile>,
        packed: Option<PackedSegment>,
        meta: SegmentMeta,
    ) -> Segment {
        file.segments.fetch_add(1, Ordering::AcqRel);
        file.live_bytes.fetch_add(meta.bytes, Ordering::AcqRel);
        Segment {
            id,
            placement: Placement::Local { file, packed },
            meta,
            retired: AtomicBool::new(false),
        }
    }

    /// A segment whose bytes are `object` in the tier's bucket, its stub at `stub`.
    pub fn tiered(
        id: u64,
        object: TieredSegment,
        stub: PathBuf,
        tier: Arc<Tier>,
        meta: SegmentMeta,
    ) -> Segment {
        tier.register(id);
        Segment {
            id,
            placement: Placement::Tiered { object, stub, tier },
            meta,
            retired: AtomicBool::new(false),
        }
    }

    /// The local file holding the segment, and its range there when it shares a pack;
    /// `None` for a tiered segment.
    pub fn local(&self) -> Option<(&Arc<SegmentFile>, Option<PackedSegment>)> {
        match &self.placement {
            Placement::Local { file, packed } => Some((file, *packed)),
            Placement::Tiered { .. } => None,
        }
    }

    pub fn tiered_object(&self) -> Option<&TieredSegment> {
        match &self.placement {
            Placement::Local { .. } => None,
            Placement::Tiered { object, .. } => Some(object),
        }
    }

    /// The local file the segment keeps: its data file (or pack), or a tiered one's stub.
    pub fn local_path(&self) -> &Path {
        match &self.placement {
            Placement::Local { file, .. } => &file.path,
            Placement::Tiered { stub, .. } => stub,
        }
    }

    /// Marks the segment dead; call only once a manifest without it is durable. Its file
    /// is deleted when every segment in it is retired and no reader holds one; a tiered
    /// one's object and stub when no reader holds it.
    pub fn retire(&self) {
        if !self.retired.swap(true, Ordering::AcqRel) {
            if let Placement::Local { file, .. } = &self.placement {
                let _ = file
                    .live_bytes
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                        Some(b.saturating_sub(self.meta.bytes))
                    });
                file.retired.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Opens its bytes for reading blocks.
    pub fn open(&self) -> std::result::Result<SegmentReader, StorageError> {
        match &self.placement {
            Placement::Local { file, .. } => File::open(&file.path)
                .map(|f| SegmentReader::Local(f, file.path.clone()))
                .map_err(|e| StorageError::io("open segment", &file.path, e)),
            Placement::Tiered { object, tier, .. } => Ok(SegmentReader::Tiered {
                id: self.id,
                object: object.clone(),
                tier: tier.clone(),
            }),
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if let Placement::Tiered { object, stub, tier } = &self.placement {
            // Retired and no reader holds it any more: its object goes (by the tiering
            // thread; a crash first leaves it to the sweeper), and its stub (a leftover one
            // is deleted by the next open).
            let retired = *self.retired.get_mut();
            tier.forget(self.id, retired.then_some(object.object.as_str()));
            if retired {
                let _ = std::fs::remove_file(stub);
            }
        }
    }
}

/// An open segment's bytes: a local file, or a tiered segment's object read through the
/// tier's cache.
pub enum SegmentReader {
    Local(File, PathBuf),
    Tiered {
        id: u64,
        object: TieredSegment,
        tier: Arc<Tier>,
    },
}

impl ReadAt for SegmentReader {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::result::Result<(), StorageError> {
        match self {
            SegmentReader::Local(file, path) => file.read_at(buf, offset).map_err(|e| match e {
                StorageError::Io { action, source, .. } => StorageError::io(action, path, source),
                other => other,
            }),
            SegmentReader::Tiered { id, object, tier } => tier.read(*id, object, buf, offset),
        }
    }
}

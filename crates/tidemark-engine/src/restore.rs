//! `tidemark restore`: a store rebuilt from its tier's bucket alone, after the loss of its
//! local disk.
//!
//! The bucket holds the manifest as last published ([`crate::tier::MANIFEST_OBJECT`]) and
//! every segment object it names (the tiering thread deletes none it names). The restored
//! store has every stream of that manifest, with its schema, retention and window, and the
//! segments that had moved to the bucket; it lacks what was only on the lost disk: segments
//! younger than `[tier] after`, memtables, and the log since the manifest. Each stub is
//! rebuilt from its object's last bytes (two ranged requests per segment) and checked by
//! its footer's CRC32C; the manifest is written last, so an interrupted restore leaves no
//! database (delete the directory and run it again).

use std::path::Path;

use tidemark_storage::fsutil::{sync_dir, write_atomic};
use tidemark_storage::manifest::{stub_path, Manifest};
use tidemark_storage::segment::{SegmentMeta, SegmentStub};
use tidemark_storage::StorageError;
use tidemark_tier::{BlockingBucket, TierError};

use crate::error::{EngineError, Result};
use crate::tier::MANIFEST_OBJECT;

/// The largest manifest copy a restore reads: far above a real one (a JSON line or two per
/// stream and per segment), and a bound on what a damaged bucket can make it allocate.
const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// What a restore brought back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub streams: usize,
    pub segments: usize,
    pub events: u64,
    pub bytes: u64,
    /// Segments the bucket's manifest named that were still local when it was published:
    /// their events are lost with the disk.
    pub local_segments_lost: usize,
    /// The newest event restored, by stream (`None`: nothing of it had moved).
    pub newest: Vec<(String, Option<i64>)>,
}

/// Rebuilds in `dir` (new, or empty) the store whose tier is `bucket`, calling `progress`
/// with (segments done, segments in all).
pub fn restore(
    bucket: &BlockingBucket,
    dir: &Path,
    mut progress: impl FnMut(usize, usize),
) -> Result<Restored> {
    let occupied = std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    if occupied {
        return Err(EngineError::InvalidRequest(format!(
            "{} is not empty: restore into a new directory",
            dir.display()
        )));
    }
    let failed = |name: &str, e: TierError| EngineError::Tier(format!("{name}: {e}"));
    let bytes = bucket
        .get(MANIFEST_OBJECT, MAX_MANIFEST_BYTES)
        .map_err(|e| failed(MANIFEST_OBJECT, e))?;
    let published = Manifest::decode(&bytes)?;

    let mut manifest = published.clone();
    manifest.packed.clear();
    manifest.producers.clear();
    manifest.retried.clear();
    let mut local_segments_lost = 0;
    for stream in &mut manifest.streams {
        let before = stream.segments.len();
        stream
            .segments
            .retain(|id| published.tiered.contains_key(id));
        local_segments_lost += before - stream.segments.len();
        // The log is not in the bucket: it begins anew at the checkpoint.
        stream.replay_from = manifest.checkpoint_lsn;
    }

    let segments_dir = dir.join("segments");
    let wal_dir = dir.join("wal");
    for d in [&segments_dir, &wal_dir] {
        std::fs::create_dir_all(d).map_err(|e| StorageError::io("create", d, e))?;
    }
    let total = manifest.tiered.len();
    let (mut events, mut restored_bytes) = (0, 0);
    let mut newest = std::collections::HashMap::new();
    for (done, (id, object)) in manifest.tiered.iter().enumerate() {
        let len = object.len;
        let tail_at = len.checked_sub(SegmentStub::TAIL as u64).ok_or_else(|| {
            StorageError::corrupt(format!("object {}", object.object), "shorter than a tail")
        })?;
        let tail = bucket
            .get_range(&object.object, tail_at..len)
            .map_err(|e| failed(&object.object, e))?;
        let span = SegmentStub::footer_span(&tail, len)?;
        let footer = bucket
            .get_range(&object.object, len - span..len)
            .map_err(|e| failed(&object.object, e))?;
        let stub = SegmentStub::from_footer(&footer, object.origin, len)?;
        let path = stub_path(dir, *id);
        let meta = SegmentMeta::read(&stub, &path, stub.range())?;
        events += meta.event_count();
        restored_bytes += len;
        if let Some(max) = meta.max_ts() {
            newest.insert(*id, max);
        }
        write_synced(&path, stub.bytes())?;
        progress(done + 1, total);
    }
    // The stubs and an empty log are durable before the manifest that names them.
    let log = wal_dir.join(tidemark_storage::log::file_name(manifest.checkpoint_lsn));
    write_synced(&log, &[])?;
    sync_dir(&segments_dir)?;
    sync_dir(&wal_dir)?;
    write_atomic(
        &dir.join(tidemark_storage::manifest::FILE_NAME),
        &manifest.encode()?,
    )?;
    Ok(Restored {
        streams: manifest.streams.len(),
        segments: total,
        events,
        bytes: restored_bytes,
        local_segments_lost,
        newest: manifest
            .streams
            .iter()
            .map(|s| {
                let max = s.segments.iter().filter_map(|id| newest.get(id)).max();
                (s.name.clone(), max.copied())
            })
            .collect(),
    })
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::result::Result<(), StorageError> {
    use std::io::Write;
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .map_err(|e| StorageError::io("write", path, e))
}

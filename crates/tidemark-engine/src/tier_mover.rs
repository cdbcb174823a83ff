//! Tiering's mover: the thread (started by `db` and `replica`) that moves due segments to
//! the tier's bucket in the four steps [`crate::tier`] describes, publishes the manifest
//! copy, deletes the objects of retired segments and sweeps orphans; and the adoption of a
//! copied checkpoint's objects into this database's prefix.
//!
//! Must never know about: how tiered segments are read (the page cache in
//! [`crate::tier`]), the log, or the transport a status is reported over.

use std::iter::Peekable;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tidemark_core::sync::IgnorePoison;
use tidemark_storage::fsutil::write_atomic;
use tidemark_storage::manifest::{stub_path, Manifest, TieredSegment};
use tidemark_storage::segment::SegmentStub;
use tidemark_storage::StorageError;
use tidemark_tier::{BlockingBucket, TierError};

use crate::error::{EngineError, OpenError, Result};
use crate::segment::{Placement, Segment};
use crate::shared::Shared;
use crate::tier::{Published, Tier, TierStatus, MANIFEST_OBJECT, SWEEP_EVERY, TIER_SOURCE_FILE};
/// How often a copy of an object is tried while the bucket fails in ways that pass.
const ADOPT_ATTEMPTS: u32 = 6;

/// Bytes uploaded in one round before its checkpoint: the manifest records the moves (and
/// the local copies go) in steps of about this much, not only after a large backlog.
const ROUND_BYTES: u64 = 256 << 20;

/// Segments uploaded at once. An upload mostly waits — on the bucket's hashing and disk and
/// on the network — so a few in flight keep both ends busy where one leaves them idle in
/// turn (`bench tier`, 92 MB in 12 segments, signed bodies: 115–119 MB/s one at a time,
/// 131–147 MB/s four at once).
const UPLOADS_AT_ONCE: usize = 4;

/// The bytes of one wave of uploads, all held in memory while it is in flight.
const WAVE_BYTES: u64 = 128 << 20;

/// The status of `shared`'s tier, if it has one.
pub(crate) fn status(shared: &Shared) -> Option<TierStatus> {
    shared.tier.as_ref().map(|tier| status_of(tier, shared))
}

fn status_of(tier: &Tier, shared: &Shared) -> TierStatus {
    let cutoff = tier.cutoff_ns();
    let (mut tiered, mut pending) = ((0, 0), (0, 0));
    for segment in shared.read().streams.values().flat_map(|s| &s.segments) {
        let counter = match &segment.placement {
            Placement::Tiered { .. } => &mut tiered,
            Placement::Local { .. } if is_due(segment, cutoff) => &mut pending,
            Placement::Local { .. } => continue,
        };
        counter.0 += 1;
        counter.1 += segment.meta.bytes;
    }
    let c = &tier.counters;
    let (cache_bytes, cache_capacity) = tier.cache_bytes();
    TierStatus {
        url: tier.bucket.location().url(),
        after: tier.after,
        tiered_segments: tiered.0,
        tiered_bytes: tiered.1,
        pending_segments: pending.0,
        pending_bytes: pending.1,
        rounds: c.rounds.load(Ordering::Relaxed),
        uploaded_segments: c.uploaded_segments.load(Ordering::Relaxed),
        uploaded_bytes: c.uploaded_bytes.load(Ordering::Relaxed),
        upload_time: Duration::from_nanos(c.upload_nanos.load(Ordering::Relaxed)),
        deleted_objects: c.deleted_objects.load(Ordering::Relaxed),
        requests: c.requests.load(Ordering::Relaxed),
        fetched_bytes: c.fetched_bytes.load(Ordering::Relaxed),
        cache_hits: c.cache_hits.load(Ordering::Relaxed),
        cache_bytes,
        cache_capacity,
        failures: c.failures.load(Ordering::Relaxed),
        last_error: tier.last_error.lock().ignore_poison().clone(),
    }
}

fn is_due(segment: &Segment, cutoff_ns: i64) -> bool {
    segment.meta.max_ts().is_some_and(|t| t < cutoff_ns)
}

/// The object holding segment `id`.
fn object_name(id: u64) -> String {
    format!("segments/{id:012}.seg")
}

/// The segment id an object of this database is named for (`None`: not a segment's).
fn object_id(name: &str) -> Option<u64> {
    name.strip_prefix("segments/")?
        .strip_suffix(".seg")?
        .parse()
        .ok()
}

/// The tiering thread's body (`db` and `replica` start it): rounds until the tier is shut
/// down, with a doubling delay while they fail.
pub(crate) fn run(shared: &Shared) {
    let Some(tier) = shared.tier.clone() else {
        return;
    };
    let mut delay = Duration::ZERO;
    while tier.sleep(delay) {
        let rounds = tier.counters.rounds.load(Ordering::Relaxed);
        match round(shared, &tier, rounds.is_multiple_of(SWEEP_EVERY)) {
            Ok(()) => {
                tier.counters.rounds.fetch_add(1, Ordering::Relaxed);
                delay = tier.interval;
                *tier.last_error.lock().ignore_poison() = None;
            }
            Err(e) => {
                tier.counters.failures.fetch_add(1, Ordering::Relaxed);
                delay = (delay * 2).clamp(tier.interval, tier.interval * 30);
                tracing::warn!(error = %e, retry_in = ?delay, "tiering failed; nothing local was removed");
                *tier.last_error.lock().ignore_poison() = Some(e.to_string());
            }
        }
    }
}

/// Publishes the manifest, deletes the doomed objects, moves the due segments, publishes
/// the manifest that names them, and sweeps when asked.
fn round(shared: &Shared, tier: &Arc<Tier>, sweep: bool) -> Result<()> {
    // First the manifest that no longer names the doomed objects, then their delete.
    publish_manifest(shared, tier)?;
    delete_doomed(tier)?;
    let cutoff = tier.cutoff_ns();
    let due: Vec<Arc<Segment>> = shared
        .read()
        .streams
        .values()
        .flat_map(|s| &s.segments)
        .filter(|s| s.local().is_some() && is_due(s, cutoff))
        .cloned()
        .collect();
    let (moved, uploaded) = move_segments(shared, tier, due);
    if moved > 0 {
        // Recorded even after a failed upload: one segment the bucket refuses must not hold
        // back the record (and the local space) of those that did move.
        shared.checkpoint_and_wait()?;
        publish_manifest(shared, tier)?;
    }
    uploaded?;
    if sweep {
        sweep_orphans(tier)?;
    }
    Ok(())
}

/// Uploads the durable manifest as [`MANIFEST_OBJECT`] if it changed since the last upload.
/// Every object it names is in the bucket already: a segment's object is uploaded before
/// any manifest names it. Called after each round, and by a stopping `Db` once its tiering
/// thread has stopped (never both at once).
pub(crate) fn publish_manifest(shared: &Shared, tier: &Tier) -> Result<()> {
    let path = shared.dir.join(tidemark_storage::manifest::FILE_NAME);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StorageError::io("read", &path, e).into()),
    };
    if tier.published.lock().ignore_poison().manifest == bytes {
        return Ok(());
    }
    let manifest = Manifest::decode(&bytes)?;
    tier.bucket
        .put(MANIFEST_OBJECT, bytes.clone().into())
        .map_err(|e| tier_error(MANIFEST_OBJECT, e))?;
    *tier.published.lock().ignore_poison() = Published {
        manifest: bytes,
        objects: manifest.tiered.into_values().map(|t| t.object).collect(),
    };
    Ok(())
}

/// Uploads `due` in waves and puts each uploaded segment in its local one's place, with a
/// checkpoint every [`ROUND_BYTES`]; how many it moved, and the first error, after which it
/// starts no more uploads.
fn move_segments(shared: &Shared, tier: &Arc<Tier>, due: Vec<Arc<Segment>>) -> (usize, Result<()>) {
    let mut moved_bytes = 0;
    let mut moved = 0;
    let mut due = due.into_iter().peekable();
    while due.peek().is_some() && !tier.is_shut_down() {
        let wave = next_wave(&mut due);
        let uploads = upload_wave(shared, tier, &wave);
        debug_assert_eq!(uploads.len(), wave.len());
        // What was uploaded is installed even when another upload of the wave failed.
        let mut failed = None;
        for (segment, uploaded) in wave.iter().zip(uploads) {
            match uploaded {
                Ok(Some(tiered)) => {
                    moved_bytes += tiered.meta.bytes;
                    moved += usize::from(install(shared, segment, tiered));
                }
                Ok(None) => {}
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            return (moved, Err(e));
        }
        if moved_bytes >= ROUND_BYTES {
            if let Err(e) = shared.checkpoint_and_wait() {
                return (moved, Err(e));
            }
            moved_bytes = 0;
        }
    }
    (moved, Ok(()))
}

/// The next segments of `due` to upload together: up to [`UPLOADS_AT_ONCE`] of them and
/// [`WAVE_BYTES`] (at least one, whatever its size).
fn next_wave(due: &mut Peekable<std::vec::IntoIter<Arc<Segment>>>) -> Vec<Arc<Segment>> {
    let mut wave: Vec<Arc<Segment>> = Vec::with_capacity(UPLOADS_AT_ONCE);
    let mut bytes = 0;
    while wave.len() < UPLOADS_AT_ONCE {
        let fits = |s: &Arc<Segment>| wave.is_empty() || bytes + s.meta.bytes <= WAVE_BYTES;
        let Some(segment) = due.next_if(fits) else {
            break;
        };
        bytes += segment.meta.bytes;
        wave.push(segment);
    }
    debug_assert!(!wave.is_empty() || due.peek().is_none());
    wave
}

/// Uploads `wave`'s segments at once, each on a thread of its own, and answers each one's
/// outcome in `wave`'s order. Its wall time counts as upload time.
fn upload_wave(
    shared: &Shared,
    tier: &Arc<Tier>,
    wave: &[Arc<Segment>],
) -> Vec<Result<Option<Segment>>> {
    let started = std::time::Instant::now();
    let outcomes = match wave {
        [one] => vec![upload(shared, tier, one)],
        _ => std::thread::scope(|scope| {
            let uploads: Vec<_> = wave
                .iter()
                .map(|segment| {
                    std::thread::Builder::new()
                        .name("tidemark-upload".into())
                        .spawn_scoped(scope, || upload(shared, tier, segment))
                })
                .collect();
            uploads
                .into_iter()
                .map(|spawned| match spawned {
                    Ok(upload) => upload
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                    Err(e) => {
                        Err(StorageError::io("start an upload thread in", &shared.dir, e).into())
                    }
                })
                .collect()
        }),
    };
    let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    tier.counters
        .upload_nanos
        .fetch_add(took, Ordering::Relaxed);
    outcomes
}

/// Steps 1 and 2: the object uploaded and verified, the stub durable; the tiered segment
/// that is to take `segment`'s place (`None`: retired meanwhile, nothing to do).
fn upload(shared: &Shared, tier: &Arc<Tier>, segment: &Arc<Segment>) -> Result<Option<Segment>> {
    let Some((file, packed)) = segment.local() else {
        return Ok(None);
    };
    let range = packed.map_or(0..file.bytes, |p| p.range());
    let bytes = match read_range(&file.path, range.clone()) {
        Ok(bytes) => bytes,
        // Retired and deleted since it was picked (compaction, retention, a clear).
        Err(_) if !still_catalogued(shared, segment) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let stub = SegmentStub::of(&bytes, range.start)?;
    let object = TieredSegment {
        object: object_name(segment.id),
        origin: range.start,
        len: bytes.len() as u64,
        crc32c: crc32c::crc32c(&bytes),
    };
    let len = bytes.len() as u64;
    tier.bucket
        .put(&object.object, bytes.into())
        .map_err(|e| tier_error(&object.object, e))?;
    tier.counters
        .uploaded_segments
        .fetch_add(1, Ordering::Relaxed);
    tier.counters
        .uploaded_bytes
        .fetch_add(len, Ordering::Relaxed);
    let stub_file = stub_path(&shared.dir, segment.id);
    write_atomic(&stub_file, stub.bytes())?;
    Ok(Some(Segment::tiered(
        segment.id,
        object,
        stub_file,
        tier.clone(),
        segment.meta.clone(),
    )))
}

/// Step 3: `tiered` takes `local`'s place if `local` is still in its stream; else it is
/// retired at once (no manifest ever named it: its object and stub go when it drops).
fn install(shared: &Shared, local: &Arc<Segment>, tiered: Segment) -> bool {
    let mut state = shared.write();
    let place = state.streams.values_mut().find_map(|stream| {
        let at = stream.segments.iter().position(|s| Arc::ptr_eq(s, local))?;
        Some((stream, at))
    });
    match place {
        Some((stream, at)) => {
            // The same events under the same footer: readers see one or the other.
            debug_assert_eq!(stream.segments[at].meta, tiered.meta);
            let replaced = std::mem::replace(&mut stream.segments[at], Arc::new(tiered));
            state.retired.push(replaced);
            true
        }
        None => {
            drop(state);
            tiered.retire();
            false
        }
    }
}

fn still_catalogued(shared: &Shared, segment: &Arc<Segment>) -> bool {
    shared
        .read()
        .streams
        .values()
        .any(|s| s.segments.iter().any(|x| Arc::ptr_eq(x, segment)))
}

fn delete_doomed(tier: &Tier) -> Result<()> {
    let mut doomed = std::mem::take(&mut *tier.doomed.lock().ignore_poison());
    // Still named by the manifest in the bucket (retired after it was uploaded): deleted
    // after the next upload.
    let published = tier.published.lock().ignore_poison().objects.clone();
    let (later, doomed): (Vec<String>, Vec<String>) =
        doomed.drain(..).partition(|o| published.contains(o));
    tier.doomed.lock().ignore_poison().extend(later);
    for (i, object) in doomed.iter().enumerate() {
        if let Err(e) = tier.bucket.delete(object) {
            // Keep what is left for the next round.
            tier.doomed
                .lock()
                .ignore_poison()
                .extend(doomed[i..].iter().cloned());
            return Err(tier_error(object, e));
        }
        tier.counters
            .deleted_objects
            .fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Deletes every segment object no live segment names: uploads a crash cut short before
/// their manifest, and objects of retired segments whose delete a crash prevented.
fn sweep_orphans(tier: &Tier) -> Result<()> {
    let listed = tier
        .bucket
        .list()
        .map_err(|e| tier_error(&tier.bucket.location().url(), e))?;
    let live = tier.live.lock().ignore_poison().clone();
    let published = tier.published.lock().ignore_poison().objects.clone();
    for object in listed {
        let Some(id) = object_id(&object.name) else {
            continue;
        };
        if !live.contains(&id) && !published.contains(&object.name) {
            tier.bucket
                .delete(&object.name)
                .map_err(|e| tier_error(&object.name, e))?;
            tier.counters
                .deleted_objects
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(object = %object.name, "deleted an object no segment names");
        }
    }
    Ok(())
}

/// Records in `dir` that its tiered segments' objects are under `tier`'s prefix.
pub(crate) fn write_source(dir: &Path, tier: &Tier) -> Result<()> {
    write_atomic(
        &dir.join(TIER_SOURCE_FILE),
        tier.bucket.location().url().as_bytes(),
    )?;
    Ok(())
}

/// Makes the tiered segments of `dir` — a copy of another replica's checkpoint, whose
/// objects are under the prefix its [`TIER_SOURCE_FILE`] names — this database's own: each
/// object is copied inside the bucket into `tier`'s prefix, then the file goes. Nothing
/// else changes (names are relative to the prefix), and a copy cut short by a crash is
/// made again at the next open. Copying rather than sharing keeps the rule that a prefix
/// belongs to one database: its sweeper, retention and drops delete only what it alone
/// names. An object the source no longer has fails the open: a segment is never dropped
/// quietly.
pub(crate) fn adopt_objects(dir: &Path, tier: Option<&Tier>) -> Result<(), OpenError> {
    let file = dir.join(TIER_SOURCE_FILE);
    let source = match read_small(&file, MAX_SOURCE_BYTES) {
        Ok(source) => source,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StorageError::io("read", &file, e).into()),
    };
    let manifest = Manifest::load(dir)?.unwrap_or_else(Manifest::empty);
    if !manifest.tiered.is_empty() {
        let Some(tier) = tier else {
            return Err(OpenError::InvalidOptions(format!(
                "{} holds segments tiered to {source}: open it with a [tier] configuration",
                dir.display()
            )));
        };
        let location = tidemark_tier::TierLocation::parse(source.trim())
            .map_err(|e| tier_error(TIER_SOURCE_FILE, e))?;
        let own = tier.bucket.location();
        if location.bucket != own.bucket {
            return Err(OpenError::InvalidOptions(format!(
                "{} holds segments tiered to bucket {:?}; this database tiers to {:?}: every node of a cluster must use the same bucket",
                dir.display(),
                location.bucket,
                own.bucket
            )));
        }
        if location.prefix != own.prefix {
            let from = tier
                .bucket
                .at_prefix(&location.prefix)
                .map_err(|e| tier_error(&location.url(), e))?;
            for object in manifest.tiered.values() {
                copy_with_retries(&tier.bucket, &from, object)?;
            }
            tracing::info!(
                from = %location.url(),
                to = %own.url(),
                objects = manifest.tiered.len(),
                "copied the objects of a checkpoint's tiered segments"
            );
        }
    }
    std::fs::remove_file(&file).map_err(|e| StorageError::io("delete", &file, e))?;
    tidemark_storage::fsutil::sync_dir(dir)?;
    Ok(())
}

/// An `s3://bucket/prefix` is far shorter; the file came from another node.
const MAX_SOURCE_BYTES: u64 = 4096;

/// The text of file `path`, refused if longer than `max` bytes or not UTF-8.
fn read_small(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("longer than {max} bytes"),
        ));
    }
    Ok(text)
}

fn copy_with_retries(
    to: &BlockingBucket,
    from: &BlockingBucket,
    object: &TieredSegment,
) -> Result<()> {
    let mut delay = Duration::from_millis(200);
    let mut attempt = 1;
    loop {
        match to.copy_from(from, &object.object, object.len) {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() && attempt < ADOPT_ATTEMPTS => {
                tracing::warn!(error = %e, object = %object.object, retry_in = ?delay, "copying a tiered object failed");
                std::thread::sleep(delay);
                delay *= 2;
                attempt += 1;
            }
            Err(e) => return Err(tier_error(&object.object, e)),
        }
    }
}

fn tier_error(object: &str, error: TierError) -> EngineError {
    EngineError::Tier(format!("{object}: {error}"))
}

fn read_range(
    path: &Path,
    range: std::ops::Range<u64>,
) -> std::result::Result<Vec<u8>, StorageError> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(|e| StorageError::io("open", path, e))?;
    let mut bytes = vec![0u8; (range.end - range.start) as usize];
    file.read_exact_at(&mut bytes, range.start)
        .map_err(|e| StorageError::io("read", path, e))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_names_its_objects_source_in_a_short_file_that_adoption_removes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(TIER_SOURCE_FILE);
        // Nothing tiered: nothing to copy, and the file goes.
        std::fs::write(&file, "s3://some-bucket/cluster/node-1/gen-000000").unwrap();
        adopt_objects(dir.path(), None).unwrap();
        assert!(!file.exists());
        // A peer's file of any length is not read whole.
        std::fs::write(&file, "s".repeat(MAX_SOURCE_BYTES as usize + 1)).unwrap();
        let refused = adopt_objects(dir.path(), None).unwrap_err();
        assert!(refused.to_string().contains("longer than"), "{refused}");
    }

    #[test]
    fn object_names_carry_the_segment_id() {
        assert_eq!(object_name(42), "segments/000000000042.seg");
        assert_eq!(object_id(&object_name(42)), Some(42));
        assert_eq!(object_id("segments/x.seg"), None);
        assert_eq!(object_id("MANIFEST"), None);
    }
}

//! Tiering: sealed segments whose newest event is older than [`TierOptions::after`] move to
//! the tier's bucket. Local disk keeps only their stubs (magic, footer and tail,
//! [`SegmentStub`]), so their footers stay in memory as every segment's do: an aggregate
//! that block summaries answer makes no request to the bucket, and a scan fetches only the
//! byte ranges of the blocks it reads, through a bounded page cache (`PageCache`).
//!
//! One segment moves in four steps, on the tiering thread (`spawn`):
//! 1. its bytes (its file, or its range of a pack) are uploaded as object
//!    `segments/<id>.seg`, verified by the bucket crate (MD5 ETag, else read back);
//! 2. its stub is written durably as `segments/<id>.stub` (temp file, fsync, rename,
//!    directory fsync);
//! 3. under the state lock a tiered segment (same id, same footer) takes its place, if it
//!    is still in its stream — retention, a clear or a drop may have taken it meanwhile,
//!    and then the object and the stub are deleted and nothing changed;
//! 4. a checkpoint writes a manifest naming it tiered (with the object's CRC32C); only
//!    once that manifest is durable is the local copy retired (its file is deleted when no
//!    reader holds it and, for a pack, every segment in the pack is retired).
//!
//! After each step 4, and whenever the manifest changed, it is uploaded too
//! ([`MANIFEST_OBJECT`]), and once more when a `Db` stops (after a checkpoint): `tidemark restore` ([`crate::restore`]) rebuilds a store from that
//! copy and the objects it names. An object is deleted only once the copy in the bucket no
//! longer names it, so the bucket never lacks an object its manifest names.
//!
//! A crash between two steps leaves the previous manifest, which names the local copy; an
//! object uploaded for nothing is an orphan that the sweeper deletes: it lists the
//! bucket when the thread starts and every [`SWEEP_EVERY`] rounds, and deletes every
//! segment object that no segment of this database names. A tiered segment that retention,
//! a clear or a drop retires has its object deleted once the manifest without it is
//! durable and no reader holds it (a crash before that: the sweeper again). The prefix
//! therefore belongs to one database.
//!
//! What the bucket holds is checked where it is read: every chunk of a block carries its
//! CRC32C in the footer, so a tampered object is a checksum error, never wrong data; a
//! bucket that cannot be reached is [`StorageError::Unavailable`], never a partial answer.
//! A failed round (the bucket down, slow, refusing the credentials) changes nothing
//! locally; the thread retries with a doubling delay and shows the error in
//! [`TierStatus::last_error`] meanwhile.

use std::collections::{HashMap, HashSet};
use std::iter::Peekable;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tidemark_core::sync::IgnorePoison;
use tidemark_storage::fsutil::write_atomic;
use tidemark_storage::manifest::{stub_path, Manifest, TieredSegment};
use tidemark_storage::segment::SegmentStub;
use tidemark_storage::StorageError;
use tidemark_tier::{BlockingBucket, TierError};

use crate::db::Shared;
use crate::error::{EngineError, Result};
use crate::state::{Placement, Segment};
use crate::TierOptions;

/// The unit the cache keeps and fetches: a read of a few bytes of a tiered segment fetches
/// the page around them, so the small chunks of one block cost one request. A request's
/// latency, more than its size, makes a cold read's time (`bench tier`: a cold 1-minute
/// scan is one 1 MiB request, 5–17 ms against S3Proxy; boto3 gets 1 KB from it in 5.2 ms
/// and 1 MiB in 6.8 ms), so pages are large: a longer scan needs fewer requests.
pub const PAGE_BYTES: u64 = 1 << 20;

/// The sweeper lists the bucket every this many rounds (and when the thread starts).
pub const SWEEP_EVERY: u64 = 360;

/// The copy of the manifest in the bucket: what `tidemark restore` rebuilds a store from.
pub const MANIFEST_OBJECT: &str = "MANIFEST";

/// In a copy of a replica's checkpoint (a cluster's snapshot): the `s3://bucket/prefix`
/// its tiered segments' objects are under. The replica opened from the copy copies them
/// into its own prefix first (`adopt_objects`).
pub const TIER_SOURCE_FILE: &str = "TIER_SOURCE";

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

/// The tier's bucket, its cache, and what it has done, shared by the tiering thread and the
/// readers of tiered segments.
#[derive(Debug)]
pub struct Tier {
    bucket: BlockingBucket,
    after: Duration,
    interval: Duration,
    cache: PageCache,
    /// Tiered segments alive in this process (catalogued, or retired and still read):
    /// the sweeper leaves their objects alone.
    live: Mutex<HashSet<u64>>,
    /// Objects of retired tiered segments no reader holds any more, to delete.
    doomed: Mutex<Vec<String>>,
    /// The manifest in the bucket ([`MANIFEST_OBJECT`]) as last uploaded, and the objects
    /// it names: those are never deleted until a newer manifest no longer names them, so
    /// the bucket never lacks an object its manifest names (`tidemark restore` needs all).
    published: Mutex<Published>,
    counters: Counters,
    last_error: Mutex<Option<String>>,
    signal: Mutex<Signal>,
    wake: Condvar,
}

/// What wakes the tiering thread early.
#[derive(Debug, Default)]
struct Signal {
    shutdown: bool,
    /// A retired tiered segment was let go: its object is to be deleted.
    doomed: bool,
}

#[derive(Debug, Default)]
struct Published {
    manifest: Vec<u8>,
    objects: HashSet<String>,
}

#[derive(Debug, Default)]
struct Counters {
    /// Rounds that ended without an error.
    rounds: AtomicU64,
    uploaded_segments: AtomicU64,
    uploaded_bytes: AtomicU64,
    /// Wall time spent in segment uploads (from the requests to their verification;
    /// uploads in flight together count once).
    upload_nanos: AtomicU64,
    deleted_objects: AtomicU64,
    /// Ranged GETs made for reads, and the bytes they brought.
    requests: AtomicU64,
    fetched_bytes: AtomicU64,
    cache_hits: AtomicU64,
    failures: AtomicU64,
}

/// What tiering has done and holds, for `tier status`, its route and `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierStatus {
    /// `s3://bucket/prefix`.
    pub url: String,
    pub after: Duration,
    /// Segments (and their bytes) whose data is in the bucket.
    pub tiered_segments: u64,
    pub tiered_bytes: u64,
    /// Local segments old enough to upload, not uploaded yet.
    pub pending_segments: u64,
    pub pending_bytes: u64,
    /// Since the database was opened: rounds that ended without an error (the first one
    /// has swept the bucket), segments uploaded...
    pub rounds: u64,
    pub uploaded_segments: u64,
    pub uploaded_bytes: u64,
    /// Time those uploads took, verification included.
    pub upload_time: Duration,
    pub deleted_objects: u64,
    pub requests: u64,
    pub fetched_bytes: u64,
    pub cache_hits: u64,
    pub cache_bytes: u64,
    pub cache_capacity: u64,
    pub failures: u64,
    /// The error of the last round, if it failed.
    pub last_error: Option<String>,
}

impl Tier {
    pub(crate) fn new(options: &TierOptions) -> Tier {
        Tier {
            bucket: options.bucket.clone(),
            after: options.after,
            interval: options.interval,
            cache: PageCache::new(options.cache_bytes),
            live: Mutex::default(),
            doomed: Mutex::default(),
            published: Mutex::default(),
            counters: Counters::default(),
            last_error: Mutex::default(),
            signal: Mutex::default(),
            wake: Condvar::new(),
        }
    }

    /// Notes a tiered segment alive in this process.
    pub(crate) fn register(&self, id: u64) {
        self.live.lock().ignore_poison().insert(id);
    }

    /// A tiered segment's last holder let go; `object` is deleted if it was retired.
    pub(crate) fn forget(&self, id: u64, retired_object: Option<&str>) {
        self.live.lock().ignore_poison().remove(&id);
        self.cache.forget(id);
        if let Some(object) = retired_object {
            self.doomed.lock().ignore_poison().push(object.to_string());
            self.signal.lock().ignore_poison().doomed = true;
            self.wake.notify_all();
        }
    }

    /// Fills `buf` from tiered segment `id` at `offset` (counted from the start of the file
    /// it was written to, as its footer's offsets are), through the cache.
    pub(crate) fn read(
        &self,
        id: u64,
        object: &TieredSegment,
        buf: &mut [u8],
        offset: u64,
    ) -> std::result::Result<(), StorageError> {
        let start = offset.checked_sub(object.origin);
        let Some(start) = start.filter(|s| s.saturating_add(buf.len() as u64) <= object.len) else {
            return Err(StorageError::corrupt(
                format!("tiered segment {id}"),
                format!(
                    "bytes at {offset} (+{}) are outside its {} bytes at {}",
                    buf.len(),
                    object.len,
                    object.origin
                ),
            ));
        };
        let fetch = |range: std::ops::Range<u64>| {
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            let bytes = self
                .bucket
                .get_range(&object.object, range)
                .map_err(|e| unavailable(id, &object.object, e))?;
            self.counters
                .fetched_bytes
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            Ok(bytes)
        };
        let hit = self.cache.read(id, object.len, buf, start, fetch)?;
        if hit {
            self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn status(&self, shared: &Shared) -> TierStatus {
        let cutoff = self.cutoff_ns();
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
        let c = &self.counters;
        TierStatus {
            url: self.bucket.location().url(),
            after: self.after,
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
            cache_bytes: self.cache.bytes(),
            cache_capacity: self.cache.capacity,
            failures: c.failures.load(Ordering::Relaxed),
            last_error: self.last_error.lock().ignore_poison().clone(),
        }
    }

    /// Segments whose newest event is before this are due for the bucket.
    fn cutoff_ns(&self) -> i64 {
        let after = i64::try_from(self.after.as_nanos()).unwrap_or(i64::MAX);
        tidemark_core::time::now_ns().saturating_sub(after)
    }

    /// Waits `delay` or until woken; false once shut down.
    /// Waits `delay`, or until an object is doomed; false once shut down.
    fn sleep(&self, delay: Duration) -> bool {
        let signal = self.signal.lock().ignore_poison();
        let (mut signal, _) = self
            .wake
            .wait_timeout_while(signal, delay, |s| !s.shutdown && !s.doomed)
            .ignore_poison();
        signal.doomed = false;
        !signal.shutdown
    }

    fn is_shut_down(&self) -> bool {
        self.signal.lock().ignore_poison().shutdown
    }

    pub(crate) fn shut_down(&self) {
        self.signal.lock().ignore_poison().shutdown = true;
        self.wake.notify_all();
    }
}

/// The status of `shared`'s tier, if it has one.
pub(crate) fn status(shared: &Shared) -> Option<TierStatus> {
    shared.tier.as_ref().map(|tier| tier.status(shared))
}

fn unavailable(id: u64, object: &str, error: TierError) -> StorageError {
    let what = format!("tiered segment {id} (object {object})");
    match error {
        TierError::Mismatch { what: detail, .. } => StorageError::corrupt(what, detail),
        other => StorageError::Unavailable {
            what,
            detail: other.to_string(),
        },
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

/// Starts the tiering thread of `shared` (which has a tier).
pub(crate) fn spawn(shared: Arc<Shared>) -> std::io::Result<Option<JoinHandle<()>>> {
    if shared.tier.is_none() {
        return Ok(None);
    }
    std::thread::Builder::new()
        .name("tidemark-tier".into())
        .spawn(move || run(&shared))
        .map(Some)
}

fn run(shared: &Shared) {
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
        shared.flush.request_and_wait()?;
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
            if let Err(e) = shared.flush.request_and_wait() {
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
pub(crate) fn adopt_objects(dir: &Path, tier: Option<&Tier>) -> Result<()> {
    let file = dir.join(TIER_SOURCE_FILE);
    let source = match read_small(&file, MAX_SOURCE_BYTES) {
        Ok(source) => source,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StorageError::io("read", &file, e).into()),
    };
    let manifest = Manifest::load(dir)?.unwrap_or_else(Manifest::empty);
    if !manifest.tiered.is_empty() {
        let Some(tier) = tier else {
            return Err(EngineError::InvalidOptions(format!(
                "{} holds segments tiered to {source}: open it with a [tier] configuration",
                dir.display()
            )));
        };
        let location = tidemark_tier::TierLocation::parse(source.trim())
            .map_err(|e| tier_error(TIER_SOURCE_FILE, e))?;
        let own = tier.bucket.location();
        if location.bucket != own.bucket {
            return Err(EngineError::InvalidOptions(format!(
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

/// Pages of tiered segments kept in memory, at most `capacity` bytes of them, the least
/// recently used dropped first.
///
/// Written here rather than taken from a crate: none in the tree does it, and with pages
/// of [`PAGE_BYTES`] a cache of a GiB holds a thousand of them, so finding the least
/// recently used one by a scan costs far less than the request that replaces it.
#[derive(Debug)]
pub(crate) struct PageCache {
    capacity: u64,
    inner: Mutex<Pages>,
}

#[derive(Debug, Default)]
struct Pages {
    /// (segment id, page number) → (bytes, last use).
    pages: HashMap<(u64, u64), (bytes::Bytes, u64)>,
    bytes: u64,
    clock: u64,
}

impl PageCache {
    fn new(capacity: u64) -> PageCache {
        PageCache {
            capacity,
            inner: Mutex::default(),
        }
    }

    fn bytes(&self) -> u64 {
        self.inner.lock().ignore_poison().bytes
    }

    /// Fills `buf` with bytes `start..` of segment `id` (of `len` bytes), fetching the pages
    /// it lacks with `fetch` (one request for each run of missing pages). True when no
    /// request was needed.
    fn read(
        &self,
        id: u64,
        len: u64,
        buf: &mut [u8],
        start: u64,
        fetch: impl Fn(std::ops::Range<u64>) -> std::result::Result<bytes::Bytes, StorageError>,
    ) -> std::result::Result<bool, StorageError> {
        if buf.is_empty() {
            return Ok(true);
        }
        let end = start + buf.len() as u64;
        let (first, last) = (start / PAGE_BYTES, (end - 1) / PAGE_BYTES);
        let mut pages: Vec<Option<bytes::Bytes>> = {
            let mut inner = self.inner.lock().ignore_poison();
            (first..=last)
                .map(|p| {
                    inner.clock += 1;
                    let now = inner.clock;
                    inner.pages.get_mut(&(id, p)).map(|(bytes, used)| {
                        *used = now;
                        bytes.clone()
                    })
                })
                .collect()
        };
        let hit = pages.iter().all(Option::is_some);
        let mut i = 0;
        while i < pages.len() {
            if pages[i].is_some() {
                i += 1;
                continue;
            }
            let run_end = (i..pages.len())
                .find(|&j| pages[j].is_some())
                .unwrap_or(pages.len());
            let from = (first + i as u64) * PAGE_BYTES;
            let to = ((first + run_end as u64) * PAGE_BYTES).min(len);
            let fetched = fetch(from..to)?;
            for (k, slot) in pages[i..run_end].iter_mut().enumerate() {
                let page_start = k as u64 * PAGE_BYTES;
                let page_end = (page_start + PAGE_BYTES).min(fetched.len() as u64);
                *slot = Some(fetched.slice(page_start as usize..page_end as usize));
            }
            self.insert(id, first + i as u64, &pages[i..run_end]);
            i = run_end;
        }
        let mut written = 0;
        for (k, page) in pages.iter().enumerate() {
            let page = page.as_ref().ok_or_else(|| {
                StorageError::corrupt("tier cache", "a page was neither cached nor fetched")
            })?;
            let page_start = (first + k as u64) * PAGE_BYTES;
            let from = start.max(page_start) - page_start;
            let to = (end.min(page_start + page.len() as u64)).saturating_sub(page_start);
            let piece = page.get(from as usize..to as usize).ok_or_else(|| {
                StorageError::corrupt("tier cache", "the bucket answered a short page")
            })?;
            buf[written..written + piece.len()].copy_from_slice(piece);
            written += piece.len();
        }
        if written != buf.len() {
            return Err(StorageError::corrupt(
                "tier cache",
                format!("{written} of {} bytes read", buf.len()),
            ));
        }
        Ok(hit)
    }

    fn insert(&self, id: u64, first_page: u64, pages: &[Option<bytes::Bytes>]) {
        if self.capacity == 0 {
            return;
        }
        let mut inner = self.inner.lock().ignore_poison();
        for (k, page) in pages.iter().enumerate() {
            let Some(page) = page else { continue };
            inner.clock += 1;
            let now = inner.clock;
            let size = page.len() as u64;
            if let Some((old, _)) = inner
                .pages
                .insert((id, first_page + k as u64), (page.clone(), now))
            {
                inner.bytes -= old.len() as u64;
            }
            inner.bytes += size;
        }
        while inner.bytes > self.capacity {
            let Some((&oldest, _)) = inner.pages.iter().min_by_key(|(_, (_, used))| *used) else {
                break;
            };
            if let Some((bytes, _)) = inner.pages.remove(&oldest) {
                inner.bytes -= bytes.len() as u64;
            }
        }
    }

    /// Drops the pages of segment `id` (its object is gone or going).
    fn forget(&self, id: u64) {
        let mut inner = self.inner.lock().ignore_poison();
        let before = inner.pages.len();
        let mut freed = 0;
        inner.pages.retain(|(segment, _), (bytes, _)| {
            let keep = *segment != id;
            if !keep {
                freed += bytes.len() as u64;
            }
            keep
        });
        if inner.pages.len() != before {
            inner.bytes -= freed;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(len: u64) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn reads_through_the_cache_match_the_object_and_stay_within_its_capacity() {
        let data = object(5 * PAGE_BYTES + 123);
        let requests = std::cell::Cell::new(0);
        let fetch = |range: std::ops::Range<u64>| {
            requests.set(requests.get() + 1);
            Ok(bytes::Bytes::copy_from_slice(
                &data[range.start as usize..range.end as usize],
            ))
        };
        let cache = PageCache::new(2 * PAGE_BYTES);
        let len = data.len() as u64;
        let mut buf = vec![0u8; 100];
        // Across a page boundary: two pages, fetched in one request.
        let at = PAGE_BYTES - 50;
        assert!(!cache.read(1, len, &mut buf, at, fetch).unwrap());
        assert_eq!(buf, data[at as usize..at as usize + 100]);
        assert_eq!(requests.get(), 1);
        assert!(cache.read(1, len, &mut buf, at, fetch).unwrap(), "cached");
        assert_eq!(requests.get(), 1);
        // The short last page.
        let mut tail = vec![0u8; 123];
        cache
            .read(1, len, &mut tail, 5 * PAGE_BYTES, fetch)
            .unwrap();
        assert_eq!(tail, data[5 * PAGE_BYTES as usize..]);
        assert!(cache.bytes() <= 2 * PAGE_BYTES, "{}", cache.bytes());
        // The least recently used page went: page 0 (read before page 1 in the first read).
        requests.set(0);
        cache
            .read(1, len, &mut buf, PAGE_BYTES + 10, fetch)
            .unwrap();
        assert_eq!(requests.get(), 0, "page 1 is still there");
        cache.read(1, len, &mut buf, 10, fetch).unwrap();
        assert_eq!(requests.get(), 1, "page 0 was dropped");
        // Everything at once, larger than the cache: still right.
        let mut all = vec![0u8; data.len()];
        cache.read(1, len, &mut all, 0, fetch).unwrap();
        assert_eq!(all, data);
        assert!(cache.bytes() <= 2 * PAGE_BYTES);
        cache.forget(1);
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn a_cache_of_nothing_fetches_every_read() {
        let data = object(3000);
        let requests = std::cell::Cell::new(0);
        let fetch = |range: std::ops::Range<u64>| {
            requests.set(requests.get() + 1);
            Ok(bytes::Bytes::copy_from_slice(
                &data[range.start as usize..range.end as usize],
            ))
        };
        let cache = PageCache::new(0);
        let mut buf = vec![0u8; 10];
        for _ in 0..3 {
            cache.read(9, 3000, &mut buf, 2990, fetch).unwrap();
            assert_eq!(buf, data[2990..]);
        }
        assert_eq!(requests.get(), 3);
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn a_short_answer_is_an_error_not_short_data() {
        let cache = PageCache::new(PAGE_BYTES);
        let mut buf = vec![0u8; 100];
        let short = |_: std::ops::Range<u64>| Ok(bytes::Bytes::from_static(&[1, 2, 3]));
        assert!(cache.read(1, 1000, &mut buf, 0, short).is_err());
    }

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

//! Tiering: sealed segments whose newest event is older than [`TierOptions::after`] move to
//! the tier's bucket. Local disk keeps only their stubs (magic, footer and tail,
//! [`SegmentStub`](tidemark_storage::segment::SegmentStub)), so their footers stay in memory as every segment's do: an aggregate
//! that block summaries answer makes no request to the bucket, and a scan fetches only the
//! byte ranges of the blocks it reads, through a bounded page cache (`PageCache`).
//!
//! This module is tiering's read side: the [`Tier`] that tiered segments read through (the
//! bucket, the page cache) and what it shares with the mover; the mover itself — the
//! thread that uploads, installs, publishes and sweeps — is `tier_mover`. Must never know
//! about: the catalog or the segments it lists (readers hand it an id and an object).
//!
//! One segment moves in four steps, on the tiering thread (`tier_mover`):
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
//! ([`MANIFEST_OBJECT`]), and once more when a `Db` stops (after a checkpoint): `tidemark
//! restore` ([`crate::restore`]) rebuilds a store from that copy and the objects it names. An object is deleted only once the copy in the bucket no
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use tidemark_core::sync::IgnorePoison;
use tidemark_storage::manifest::TieredSegment;
use tidemark_storage::StorageError;
use tidemark_tier::{BlockingBucket, TierError};

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

/// The tier's bucket, its cache, and what it has done, shared by the tiering thread
/// (`tier_mover`, which reads and changes the fields it owns: the marks of what it
/// published and deletes, its counters and last error) and the readers of tiered segments.
#[derive(Debug)]
pub struct Tier {
    pub(crate) bucket: BlockingBucket,
    pub(crate) after: Duration,
    pub(crate) interval: Duration,
    cache: PageCache,
    /// Tiered segments alive in this process (catalogued, or retired and still read):
    /// the sweeper leaves their objects alone.
    pub(crate) live: Mutex<HashSet<u64>>,
    /// Objects of retired tiered segments no reader holds any more, to delete.
    pub(crate) doomed: Mutex<Vec<String>>,
    /// The manifest in the bucket ([`MANIFEST_OBJECT`]) as last uploaded, and the objects
    /// it names: those are never deleted until a newer manifest no longer names them, so
    /// the bucket never lacks an object its manifest names (`tidemark restore` needs all).
    pub(crate) published: Mutex<Published>,
    pub(crate) counters: Counters,
    pub(crate) last_error: Mutex<Option<String>>,
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
pub(crate) struct Published {
    pub(crate) manifest: Vec<u8>,
    pub(crate) objects: HashSet<String>,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Rounds that ended without an error.
    pub(crate) rounds: AtomicU64,
    pub(crate) uploaded_segments: AtomicU64,
    pub(crate) uploaded_bytes: AtomicU64,
    /// Wall time spent in segment uploads (from the requests to their verification;
    /// uploads in flight together count once).
    pub(crate) upload_nanos: AtomicU64,
    pub(crate) deleted_objects: AtomicU64,
    /// Ranged GETs made for reads, and the bytes they brought.
    pub(crate) requests: AtomicU64,
    pub(crate) fetched_bytes: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
    pub(crate) failures: AtomicU64,
}

/// What tiering has done and holds, for `tier status` and monitoring.
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
        let new = self.live.lock().ignore_poison().insert(id);
        // One tiered segment per id at a time: `forget` takes the id out when it goes.
        debug_assert!(new, "tiered segment {id} registered twice");
    }

    /// A tiered segment's last holder let go; `object` is deleted if it was retired.
    pub(crate) fn forget(&self, id: u64, retired_object: Option<&str>) {
        let registered = self.live.lock().ignore_poison().remove(&id);
        debug_assert!(
            registered,
            "tiered segment {id} forgotten, never registered"
        );
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
    /// Bytes the page cache holds, and the most it may.
    pub(crate) fn cache_bytes(&self) -> (u64, u64) {
        (self.cache.bytes(), self.cache.capacity)
    }

    /// Segments whose newest event is before this are due for the bucket.
    pub(crate) fn cutoff_ns(&self) -> i64 {
        let after = i64::try_from(self.after.as_nanos()).unwrap_or(i64::MAX);
        tidemark_core::time::now_ns().saturating_sub(after)
    }

    /// Waits `delay`, or until an object is doomed; false once shut down.
    pub(crate) fn sleep(&self, delay: Duration) -> bool {
        let signal = self.signal.lock().ignore_poison();
        let (mut signal, _) = self
            .wake
            .wait_timeout_while(signal, delay, |s| !s.shutdown && !s.doomed)
            .ignore_poison();
        signal.doomed = false;
        !signal.shutdown
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.signal.lock().ignore_poison().shutdown
    }

    pub(crate) fn shut_down(&self) {
        self.signal.lock().ignore_poison().shutdown = true;
        self.wake.notify_all();
    }
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
        let first = start / PAGE_BYTES;
        let mut pages = self.lookup(id, len, first..=(end - 1) / PAGE_BYTES);
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
            let run = first + i as u64..first + run_end as u64;
            let fetched = fetch_pages(len, run.clone(), &fetch)?;
            for (slot, page) in pages[i..run_end].iter_mut().zip(fetched) {
                *slot = Some(page);
            }
            self.insert(id, len, run.start, &pages[i..run_end]);
            i = run_end;
        }
        copy_out(&pages, first, start, buf)?;
        Ok(hit)
    }

    /// The cached pages `numbers` of segment `id` (of `len` bytes), `None` for each one not
    /// held; those held are marked used now.
    fn lookup(
        &self,
        id: u64,
        len: u64,
        numbers: std::ops::RangeInclusive<u64>,
    ) -> Vec<Option<bytes::Bytes>> {
        let mut inner = self.inner.lock().ignore_poison();
        numbers
            .map(|p| {
                inner.clock += 1;
                let now = inner.clock;
                let (bytes, used) = inner.pages.get_mut(&(id, p))?;
                // What `insert` holds every page to: read as written.
                assert_eq!(
                    bytes.len() as u64,
                    page_len(len, p),
                    "cached page {p} of segment {id} ({len} bytes) has the wrong size"
                );
                *used = now;
                Some(bytes.clone())
            })
            .collect()
    }

    /// Keeps `pages` of segment `id` (of `len` bytes), numbered from `first_page`, then
    /// drops the least recently used pages until the cache is within its capacity.
    fn insert(&self, id: u64, len: u64, first_page: u64, pages: &[Option<bytes::Bytes>]) {
        if self.capacity == 0 {
            return;
        }
        let mut inner = self.inner.lock().ignore_poison();
        for (k, page) in pages.iter().enumerate() {
            let Some(page) = page else { continue };
            let number = first_page + k as u64;
            // Every page is held at its full size (the last one of an object at what is
            // left of it): `lookup` relies on it.
            assert_eq!(
                page.len() as u64,
                page_len(len, number),
                "page {number} of segment {id} ({len} bytes) cached at the wrong size"
            );
            inner.clock += 1;
            let now = inner.clock;
            if let Some((old, _)) = inner.pages.insert((id, number), (page.clone(), now)) {
                inner.bytes -= old.len() as u64;
            }
            inner.bytes += page.len() as u64;
        }
        while inner.bytes > self.capacity {
            let Some((&oldest, _)) = inner.pages.iter().min_by_key(|(_, (_, used))| *used) else {
                break;
            };
            if let Some((bytes, _)) = inner.pages.remove(&oldest) {
                inner.bytes -= bytes.len() as u64;
            }
        }
        assert!(
            inner.bytes <= self.capacity,
            "the cache outgrew its capacity"
        );
        debug_assert_eq!(
            inner.bytes,
            inner.held_bytes(),
            "the cache miscounts its bytes"
        );
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
        debug_assert_eq!(
            inner.bytes,
            inner.held_bytes(),
            "the cache miscounts its bytes"
        );
    }
}

impl Pages {
    /// The bytes of the pages held, counted anew: what `bytes` must always say.
    fn held_bytes(&self) -> u64 {
        self.pages
            .values()
            .map(|(bytes, _)| bytes.len() as u64)
            .sum()
    }
}

/// The size of page `number` of an object of `len` bytes: [`PAGE_BYTES`], but for the last
/// page, which holds what is left.
fn page_len(len: u64, number: u64) -> u64 {
    len.saturating_sub(number * PAGE_BYTES).min(PAGE_BYTES)
}

/// Pages `numbers` of an object of `len` bytes, in one request; an answer of another size
/// than asked is an error, so that no page of the wrong size is kept.
fn fetch_pages(
    len: u64,
    numbers: std::ops::Range<u64>,
    fetch: impl Fn(std::ops::Range<u64>) -> std::result::Result<bytes::Bytes, StorageError>,
) -> std::result::Result<Vec<bytes::Bytes>, StorageError> {
    let from = numbers.start * PAGE_BYTES;
    let to = (numbers.end * PAGE_BYTES).min(len);
    let fetched = fetch(from..to)?;
    if fetched.len() as u64 != to.saturating_sub(from) {
        return Err(StorageError::corrupt(
            "tier cache",
            "the bucket answered a short page",
        ));
    }
    Ok(numbers
        .map(|number| {
            let page_start = (number * PAGE_BYTES - from) as usize;
            let page_end = page_start + page_len(len, number) as usize;
            fetched.slice(page_start..page_end)
        })
        .collect())
}

/// Copies bytes `start..` of the object from `pages` (numbered from `first`, every one
/// cached or fetched) into `buf`.
fn copy_out(
    pages: &[Option<bytes::Bytes>],
    first: u64,
    start: u64,
    buf: &mut [u8],
) -> std::result::Result<(), StorageError> {
    let end = start + buf.len() as u64;
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
    Ok(())
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
}

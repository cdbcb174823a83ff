//! What SQL queries may take from a server, bounded for all of them together: memory, spill
//! disk, and how many run at once.
//!
//! - **Memory.** Each query has its own bound ([`crate::SqlOptions::memory_bytes`]), within
//!   one pool shared by every query ([`ResourceLimits::memory_bytes`]). What an operator
//!   (a sort, the groups of an aggregate, a join's table) reserves counts against both; an
//!   operator that can spill spills when either says no, one that cannot fails the query.
//! - **Spill.** Spill files go to one directory, emptied when the server starts. What all
//!   queries have spilled at once is bounded ([`ResourceLimits::spill_bytes`]), and no
//!   query spills while the disk holding the directory has less free than a reserve
//!   ([`ResourceLimits::min_free_disk_bytes`]), checked as files grow: a query must never
//!   take the space the server's writes need. A query's files are deleted when it ends.
//! - **Slots.** At most [`ResourceLimits::max_queries`] queries run at once; one more is
//!   refused at once, to be retried (no queue).
//!
//! A refusal says which of these it was ([`Refusal`]): the query's own bound (it would be
//! refused again: `TooLarge`) or what all queries share (retry shortly: `Exhausted`).

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{
    FairSpillPool, GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
    TrackConsumersPool,
};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::{DiskManager, SpillFile, SpillWriter, TempFileFactory};
use futures::Stream;

use tidemark_storage::fsutil::free_bytes;

use crate::stop::Refusal;

/// The bounds on what all of a server's queries take together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceLimits {
    /// Memory all queries' operators may hold together (`limits.query_memory_bytes`).
    pub memory_bytes: usize,
    /// Bytes all queries may have spilled at once (`limits.query_spill_bytes`); 0: queries
    /// never spill.
    pub spill_bytes: u64,
    /// Where spill files go: emptied when the resources are made.
    pub spill_dir: PathBuf,
    /// No spilling while the disk holding `spill_dir` has less free than this
    /// (`limits.min_free_disk_bytes`).
    pub min_free_disk_bytes: u64,
    /// The largest value a function may make (`limits.max_value_bytes`).
    pub max_value_bytes: usize,
    /// Queries running at once (`limits.max_concurrent_queries`).
    pub max_queries: usize,
}

/// The memory pool, spill space and query slots of one server's queries.
pub struct QueryResources {
    limits: ResourceLimits,
    memory: Arc<GreedyMemoryPool>,
    spill: Option<Arc<SpillSpace>>,
    running: AtomicUsize,
}

impl fmt::Debug for QueryResources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryResources")
            .field("limits", &self.limits)
            .field("memory_reserved", &self.memory.reserved())
            .field("running", &self.running())
            .finish()
    }
}

/// Words of a refusal for memory that all queries share (what [`crate::SqlError`] tells
/// from a query's own bound: DataFusion's operators must see both as `ResourcesExhausted`).
pub(crate) const SHARED_MEMORY_IN_USE: &str = "the server's query memory is in use";

/// Spill files one merge pass reads at once.
const SPILL_MERGE_FAN_IN: usize = 4;

/// How often (bytes written to one spill file) the disk's free space is looked at again.
const FREE_SPACE_CHECK_BYTES: u64 = 8 << 20;

impl QueryResources {
    /// The resources of `limits`, with their spill directory emptied (what a previous run
    /// left there is garbage) and made.
    pub fn new(limits: ResourceLimits) -> io::Result<Arc<QueryResources>> {
        let spill = if limits.spill_bytes == 0 {
            None
        } else {
            empty_dir(&limits.spill_dir)?;
            let disk = DiskManagerBuilder::default()
                .with_mode(DiskManagerMode::Directories(vec![limits.spill_dir.clone()]))
                // Bounded here, for all queries, rather than by DataFusion per query.
                .with_max_temp_directory_size(u64::MAX)
                .build()
                .map_err(io::Error::other)?;
            Some(Arc::new(SpillSpace {
                dir: limits.spill_dir.clone(),
                disk: Arc::new(disk),
                budget: limits.spill_bytes,
                reserve: limits.min_free_disk_bytes,
                used: AtomicU64::new(0),
            }))
        };
        Ok(Arc::new(QueryResources {
            memory: Arc::new(GreedyMemoryPool::new(limits.memory_bytes)),
            spill,
            running: AtomicUsize::new(0),
            limits,
        }))
    }

    pub fn limits(&self) -> &ResourceLimits {
        &self.limits
    }

    /// Memory the running queries' operators hold.
    pub fn memory_reserved(&self) -> usize {
        self.memory.reserved()
    }

    /// Bytes the running queries have spilled.
    pub fn spilled_bytes(&self) -> u64 {
        self.spill
            .as_ref()
            .map_or(0, |s| s.used.load(Ordering::Relaxed))
    }

    /// Queries running (planning, or with their answer not yet finished).
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// A slot for one more query, or why not.
    pub(crate) fn admit(self: &Arc<Self>) -> Result<QuerySlot, Refusal> {
        let max = self.limits.max_queries;
        self.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| {
                Refusal::Exhausted(format!(
                    "{max} queries are running, as many as the server runs at once \
                     (limits.max_concurrent_queries): retry shortly"
                ))
            })?;
        Ok(QuerySlot(self.clone()))
    }
}

/// One running query's place among [`ResourceLimits::max_queries`]; given back when dropped.
#[derive(Debug)]
pub(crate) struct QuerySlot(Arc<QueryResources>);

impl Drop for QuerySlot {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The memory pool of one query: its own bound (with DataFusion's fair share between the
/// operators that can spill), inside the pool of every query of the server, if it has one.
pub(crate) fn query_memory(
    memory_bytes: usize,
    server: Option<&Arc<QueryResources>>,
) -> Arc<dyn MemoryPool> {
    Arc::new(QueryMemory {
        // Its refusals name the operators holding most.
        own: TrackConsumersPool::new(
            FairSpillPool::new(memory_bytes),
            std::num::NonZeroUsize::new(3).expect("3 > 0"),
        ),
        limit: memory_bytes,
        server: server.cloned(),
    })
}

/// The runtime a query executes with: `memory`, and spill files in the server's spill
/// space (none when spilling is off). Without server resources, DataFusion's defaults.
pub(crate) fn query_runtime_env(
    memory: Arc<dyn MemoryPool>,
    server: Option<&Arc<QueryResources>>,
) -> DfResult<Arc<RuntimeEnv>> {
    let mut builder = RuntimeEnvBuilder::new().with_memory_pool(memory);
    if let Some(server) = server {
        let disk = match &server.spill {
            Some(space) => DiskManagerBuilder::default()
                .with_mode(DiskManagerMode::Custom(Arc::new(QuerySpill {
                    space: space.clone(),
                    spilled: Arc::new(AtomicU64::new(0)),
                })))
                // A merge of spill files reads a batch of each at once, and takes all the
                // memory it can for as many as there are: a few at a time leaves the query's
                // other partitions and operators their share (more passes over the disk).
                .with_max_spill_merge_fan_in(SPILL_MERGE_FAN_IN),
            None => DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
        };
        builder = builder.with_disk_manager_builder(disk);
    }
    builder.build_arc()
}

#[derive(Debug)]
struct QueryMemory {
    own: TrackConsumersPool<FairSpillPool>,
    limit: usize,
    server: Option<Arc<QueryResources>>,
}

impl fmt::Display for QueryMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "query memory ({} of {} bytes)",
            self.own.reserved(),
            self.limit
        )
    }
}

impl MemoryPool for QueryMemory {
    fn name(&self) -> &str {
        "tidemark-query"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.own.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.own.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.own.grow(reservation, additional);
        if let Some(server) = &self.server {
            server.memory.grow(reservation, additional);
        }
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.own.shrink(reservation, shrink);
        if let Some(server) = &self.server {
            server.memory.shrink(reservation, shrink);
        }
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        self.own
            .try_grow(reservation, additional)
            .map_err(|e| match e {
                DataFusionError::ResourcesExhausted(what) => DataFusionError::ResourcesExhausted(
                    format!("{what}; a query may hold {} bytes", self.limit),
                ),
                other => other,
            })?;
        let Some(server) = &self.server else {
            return Ok(());
        };
        if server.memory.try_grow(reservation, additional).is_err() {
            self.own.shrink(reservation, additional);
            return Err(DataFusionError::ResourcesExhausted(format!(
                "{SHARED_MEMORY_IN_USE}: the queries running hold {} of its {} bytes \
                 (limits.query_memory_bytes) and this one needed {additional} more; retry shortly",
                server.memory.reserved(),
                server.limits.memory_bytes,
            )));
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.own.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(match &self.server {
            Some(server) => self.limit.min(server.limits.memory_bytes),
            None => self.limit,
        })
    }
}

/// Where every query's spill files go, and what they take there together.
struct SpillSpace {
    dir: PathBuf,
    disk: Arc<DiskManager>,
    budget: u64,
    reserve: u64,
    used: AtomicU64,
}

impl SpillSpace {
    /// Whether `more` bytes may be written now without leaving less than the reserve free.
    fn check_free(&self, more: u64) -> Result<(), Refusal> {
        let free = free_bytes(&self.dir).map_err(|e| {
            Refusal::Exhausted(format!(
                "the free space of {} could not be read ({e}): not spilling",
                self.dir.display()
            ))
        })?;
        if free < self.reserve.saturating_add(more) {
            return Err(Refusal::Exhausted(format!(
                "the query needs to spill, and the disk holding {} has {free} bytes free, \
                 less than the {} kept for the server's writes (limits.min_free_disk_bytes); \
                 retry once space is freed",
                self.dir.display(),
                self.reserve
            )));
        }
        Ok(())
    }

    /// Counts `len` more bytes spilled by a query that has spilled `spilled`, or says why not.
    fn reserve(&self, len: u64, spilled: u64) -> Result<(), Refusal> {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(len).filter(|&total| total <= self.budget)
            });
        match taken {
            Ok(_) => Ok(()),
            Err(_) if spilled.saturating_add(len) > self.budget => Err(Refusal::TooLarge(format!(
                "the query would spill more than the {} bytes all queries may spill together \
                 (limits.query_spill_bytes): narrow the time range, aggregate, or add a LIMIT",
                self.budget
            ))),
            Err(used) => Err(Refusal::Exhausted(format!(
                "the server's spill space is in use: the queries running have spilled {used} of \
                 its {} bytes (limits.query_spill_bytes); retry shortly",
                self.budget
            ))),
        }
    }
}

/// One query's spill files, in the server's spill space.
struct QuerySpill {
    space: Arc<SpillSpace>,
    /// What this query has spilled (in files not yet deleted).
    spilled: Arc<AtomicU64>,
}

impl TempFileFactory for QuerySpill {
    fn create_temp_file(&self, description: &str) -> DfResult<Arc<dyn SpillFile>> {
        self.space.check_free(0)?;
        let inner = self.space.disk.create_tmp_file(description)?;
        Ok(Arc::new(BoundedSpillFile {
            inner,
            space: self.space.clone(),
            spilled: self.spilled.clone(),
            bytes: Arc::new(AtomicU64::new(0)),
        }))
    }
}

/// A spill file whose writes are counted against the spill budget and the disk's reserve;
/// its bytes are given back when it is deleted (dropped).
struct BoundedSpillFile {
    inner: Arc<dyn SpillFile>,
    space: Arc<SpillSpace>,
    spilled: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
}

impl SpillFile for BoundedSpillFile {
    fn path(&self) -> Option<&Path> {
        self.inner.path()
    }

    fn size(&self) -> Option<u64> {
        Some(self.bytes.load(Ordering::Relaxed))
    }

    fn read_stream(&self) -> DfResult<Pin<Box<dyn Stream<Item = DfResult<Bytes>> + Send>>> {
        self.inner.read_stream()
    }

    fn open_writer(&self) -> DfResult<Box<dyn SpillWriter>> {
        Ok(Box::new(BoundedWriter {
            inner: self.inner.open_writer()?,
            space: self.space.clone(),
            spilled: self.spilled.clone(),
            bytes: self.bytes.clone(),
            unchecked: FREE_SPACE_CHECK_BYTES,
        }))
    }
}

impl Drop for BoundedSpillFile {
    fn drop(&mut self) {
        let bytes = self.bytes.load(Ordering::Relaxed);
        self.space.used.fetch_sub(bytes, Ordering::AcqRel);
        self.spilled.fetch_sub(bytes, Ordering::AcqRel);
    }
}

struct BoundedWriter {
    inner: Box<dyn SpillWriter>,
    space: Arc<SpillSpace>,
    spilled: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    /// Bytes written since the free space was last looked at.
    unchecked: u64,
}

impl Write for BoundedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let len = buf.len() as u64;
        let space = &self.space;
        space
            .reserve(len, self.spilled.load(Ordering::Relaxed))
            .map_err(io::Error::other)?;
        let give_back = || {
            space.used.fetch_sub(len, Ordering::AcqRel);
        };
        if self.unchecked >= FREE_SPACE_CHECK_BYTES {
            if let Err(refusal) = space.check_free(len) {
                give_back();
                return Err(io::Error::other(refusal));
            }
            self.unchecked = 0;
        }
        if let Err(e) = self.inner.write_all(buf) {
            give_back();
            if e.kind() == io::ErrorKind::StorageFull {
                return Err(io::Error::other(Refusal::Exhausted(format!(
                    "the disk holding {} is full: not spilling; retry once space is freed",
                    space.dir.display()
                ))));
            }
            return Err(e);
        }
        self.unchecked += len;
        self.bytes.fetch_add(len, Ordering::AcqRel);
        self.spilled.fetch_add(len, Ordering::AcqRel);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl SpillWriter for BoundedWriter {
    fn finish(&mut self) -> DfResult<()> {
        self.inner.finish()
    }
}

/// Empties `dir` (making it if need be).
fn empty_dir(dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::create_dir_all(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(dir: &Path) -> ResourceLimits {
        ResourceLimits {
            memory_bytes: 1 << 20,
            spill_bytes: 1 << 20,
            spill_dir: dir.join("spill"),
            min_free_disk_bytes: 0,
            max_value_bytes: 1 << 10,
            max_queries: 2,
        }
    }

    #[test]
    fn queries_share_one_pool_each_within_its_own_bound() {
        let dir = tempfile::tempdir().unwrap();
        let server = QueryResources::new(limits(dir.path())).unwrap();
        let a = query_memory(768 << 10, Some(&server));
        let b = query_memory(768 << 10, Some(&server));
        let ra = MemoryConsumer::new("a").register(&a);
        let rb = MemoryConsumer::new("b").register(&b);
        // Its own bound.
        let own = ra.try_grow(800 << 10).unwrap_err().to_string();
        assert!(!own.contains(SHARED_MEMORY_IN_USE), "{own}");
        ra.try_grow(700 << 10).unwrap();
        // The server's: b is within its own bound, not within what a left.
        let shared = rb.try_grow(700 << 10).unwrap_err().to_string();
        assert!(shared.contains(SHARED_MEMORY_IN_USE), "{shared}");
        assert_eq!(b.reserved(), 0, "a refused reservation holds nothing");
        assert_eq!(server.memory_reserved(), 700 << 10);
        drop(ra);
        rb.try_grow(700 << 10).unwrap();
        drop(rb);
        assert_eq!(server.memory_reserved(), 0);
    }

    #[test]
    fn slots_are_bounded_and_given_back() {
        let dir = tempfile::tempdir().unwrap();
        let server = QueryResources::new(limits(dir.path())).unwrap();
        let a = server.admit().unwrap();
        let _b = server.admit().unwrap();
        assert!(matches!(server.admit(), Err(Refusal::Exhausted(_))));
        drop(a);
        assert_eq!(server.running(), 1);
        server.admit().unwrap();
    }

    #[test]
    fn spill_files_count_against_the_budget_and_the_reserve() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("spill/left-by-a-crash")).unwrap();
        let server = QueryResources::new(limits(dir.path())).unwrap();
        assert!(!dir.path().join("spill/left-by-a-crash").exists());
        let spill = QuerySpill {
            space: server.spill.clone().unwrap(),
            spilled: Arc::new(AtomicU64::new(0)),
        };
        let file = spill.create_temp_file("test").unwrap();
        let mut writer = file.open_writer().unwrap();
        writer.write_all(&[0; 600 << 10]).unwrap();
        assert_eq!(server.spilled_bytes(), 600 << 10);
        // This query alone would pass the budget: too large.
        let error = writer.write_all(&[0; 600 << 10]).unwrap_err();
        let refusal = Refusal::find(&error).unwrap();
        assert!(matches!(refusal, Refusal::TooLarge(_)), "{refusal:?}");
        // Another query would pass it with this one's files: exhausted, retry.
        let other = QuerySpill {
            space: server.spill.clone().unwrap(),
            spilled: Arc::new(AtomicU64::new(0)),
        };
        let second = other.create_temp_file("test").unwrap();
        let error = second
            .open_writer()
            .unwrap()
            .write_all(&[0; 600 << 10])
            .unwrap_err();
        assert!(matches!(Refusal::find(&error), Some(Refusal::Exhausted(_))));
        drop(writer);
        drop(file);
        assert_eq!(
            server.spilled_bytes(),
            0,
            "a deleted file gives its bytes back"
        );
        // Below the reserve nothing is spilled.
        let reserved = QueryResources::new(ResourceLimits {
            min_free_disk_bytes: u64::MAX,
            ..limits(dir.path())
        })
        .unwrap();
        let spill = QuerySpill {
            space: reserved.spill.clone().unwrap(),
            spilled: Arc::new(AtomicU64::new(0)),
        };
        let error = spill.create_temp_file("test").err().unwrap();
        assert!(
            matches!(Refusal::find(&error), Some(Refusal::Exhausted(m)) if m.contains("min_free_disk_bytes"))
        );
        assert!(free_bytes(dir.path()).unwrap() > 0);
    }
}

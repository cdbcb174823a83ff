//! How the process uses glibc's malloc: when freed memory goes back to the kernel.
//!
//! The two settings pull in opposite directions, so they are kept together: memory handed
//! back too eagerly is faulted in and zeroed again by the next batch, memory never handed
//! back inflates the resident size of a long-running server.

/// Keeps freed memory in the process between trims (see [`spawn_trimmer`]).
///
/// By default glibc serves every allocation above 128 KiB (raised as such blocks are freed)
/// with its own `mmap` and unmaps it on free, and gives a heap's free top back at once. A
/// batch's columns, a Raft entry and a received frame are all such blocks, so each batch
/// went to fresh pages that the kernel had to fault in and zero: in a 6-node cluster run
/// (`perf record -e page-faults`) a quarter to a half of every node's page faults, and
/// `clear_page_erms` was the largest single symbol of the profile. With these settings
/// blocks up to 32 MiB come from the heap and freed ones are reused.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// Blocks above this still get their own mapping (glibc's own cap on the
        /// dynamic threshold).
        const MMAP_THRESHOLD: libc::c_int = 32 << 20;
        /// A heap's free top is given back above this; the trimmer gives back the rest.
        const TRIM_THRESHOLD: libc::c_int = 1 << 30;
        // SAFETY: mallopt only changes allocator parameters; it is called before any
        // thread of ours is started. A refusal (0) leaves glibc's defaults, which are safe.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}

/// Gives free memory back to the kernel every few seconds.
///
/// glibc's malloc keeps what the server frees: appends run on up to hundreds of
/// blocking-pool threads spread over up to 8 arenas per core, and a flush frees the
/// memtables' large buffers in the middle of those arenas, where the heap top cannot
/// shrink. In the W2 replay (148 streams x 365 fields) that left 544 MB of arenas for
/// 162 MB in use (`malloc_stats`); trimming every few seconds keeps RSS near what is used
/// (docs/benchmarks.md, W2: 526 -> 313 MB; MALLOC_ARENA_MAX=2 gave 389 MB, mimalloc more).
pub fn spawn_trimmer() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// How often freed memory goes back to the system.
        const TRIM_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
        let trimmer = std::thread::Builder::new()
            .name("malloc-trim".into())
            .spawn(|| loop {
                std::thread::sleep(TRIM_INTERVAL);
                // SAFETY: malloc_trim only returns free pages to the kernel; glibc allows
                // it from any thread at any time (it takes each arena's lock).
                unsafe { libc::malloc_trim(0) };
            });
        if let Err(e) = trimmer {
            tracing::warn!("no memory trimmer thread ({e}): freed memory stays resident");
        }
    }
}

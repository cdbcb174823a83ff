//! The threads SQL runs on in a server.
//!
//! DataFusion computes on the async runtime that polls its streams, and a sort, a join or a
//! large answer can keep a worker busy for seconds. On the server's own runtime that would
//! hold the workers that take appends, answer health checks and drive Raft; here queries
//! get their own workers and blocking pool (the scans' decoding runs there), at a lower
//! priority, so they get the cores the write path leaves.
//!
//! A computation that cannot yield (one function call over large values) would still hold
//! a worker until it ends: those run through `heavy`, off the workers and a few at a
//! time, so that short queries are answered while long ones run.

use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

use tidemark_core::sync::IgnorePoison;
use tokio::runtime::{Builder, Runtime};

use crate::stop::{Refusal, Stop};

/// The nice value of query threads: below the write path, above the flusher (10), whose
/// backlog stalls appends.
const QUERY_NICE: i32 = 5;

/// The stack of a query thread. Planning and running a statement recurse as deep as its
/// expressions nest and chain, which [`crate::bounds`] limits; within those limits a 2 MiB
/// stack (tokio's default) overflowed on a chain of 250 `+` in a test build. Address space,
/// not memory: pages are touched only as deep as a query goes.
const QUERY_STACK_BYTES: usize = 64 << 20;

/// The runtime queries run on, started on first use and kept for the process's life (a
/// runtime may not be dropped from async code, so it never is).
pub fn query_runtime() -> std::io::Result<&'static Runtime> {
    static RUNTIME: OnceLock<std::io::Result<Runtime>> = OnceLock::new();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    RUNTIME
        .get_or_init(|| {
            Builder::new_multi_thread()
                .worker_threads(workers)
                .thread_stack_size(QUERY_STACK_BYTES)
                .thread_name("tidemark-query")
                .on_thread_start(|| {
                    if let Err(error) = tidemark_engine::priority::lower_own_priority(QUERY_NICE) {
                        tracing::debug!(%error, "a query thread keeps its priority");
                    }
                })
                .enable_all()
                .build()
        })
        .as_ref()
        .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))
}

/// How many long computations inside one call (a function over large values: levenshtein,
/// a regular expression over megabytes) run at once: one core fewer than the machine has,
/// so that such work never takes every core from shorter queries.
fn heavy_sections() -> &'static HeavySections {
    static SECTIONS: OnceLock<HeavySections> = OnceLock::new();
    SECTIONS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        HeavySections {
            limit: cores.saturating_sub(1).max(1),
            running: Mutex::new(0),
            freed: Condvar::new(),
        }
    })
}

struct HeavySections {
    limit: usize,
    running: Mutex<usize>,
    freed: Condvar,
}

/// Long computations running now (`heavy`).
pub fn heavy_running() -> usize {
    *heavy_sections().running.lock().ignore_poison()
}

/// Runs `work`, a computation that cannot yield (one function call over large values),
/// off the query runtime's workers: the worker's other tasks move to another thread
/// (`block_in_place`), so that other queries are served meanwhile. At most
/// [`heavy_sections`] run at once; a computation waiting for its turn stops when `stop`
/// says so.
pub(crate) fn heavy<R>(stop: &Stop, work: impl FnOnce() -> R) -> Result<R, Refusal> {
    let run = || {
        let sections = heavy_sections();
        let mut running = sections.running.lock().ignore_poison();
        while *running >= sections.limit {
            stop.check()?;
            running = sections
                .freed
                .wait_timeout(running, Duration::from_millis(20))
                .ignore_poison()
                .0;
        }
        *running += 1;
        drop(running);
        let _turn = Turn(sections);
        stop.check()?;
        Ok(work())
    };
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi_thread {
        tokio::task::block_in_place(run)
    } else {
        run()
    }
}

/// A running computation's turn, given back when dropped (also by a panic).
struct Turn(&'static HeavySections);

impl Drop for Turn {
    fn drop(&mut self) {
        *self.0.running.lock().ignore_poison() -= 1;
        self.0.freed.notify_one();
    }
}

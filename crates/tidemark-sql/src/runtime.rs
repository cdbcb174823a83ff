//! The threads SQL runs on in a server.
//!
//! DataFusion computes on the async runtime that polls its streams, and a sort, a join or a
//! large answer can keep a worker busy for seconds. On the server's own runtime that would
//! hold the workers that take appends, answer health checks and drive Raft; here queries
//! get their own workers and blocking pool (the scans' decoding runs there), at a lower
//! priority, so they get the cores the write path leaves.

use std::sync::OnceLock;

use tokio::runtime::{Builder, Runtime};

/// The nice value of query threads: below the write path, above the flusher (10), whose
/// backlog stalls appends.
const QUERY_NICE: i32 = 5;

/// The runtime queries run on, started on first use and kept for the process's life (a
/// runtime may not be dropped from async code, so it never is).
pub fn query_runtime() -> std::io::Result<&'static Runtime> {
    static RUNTIME: OnceLock<std::io::Result<Runtime>> = OnceLock::new();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    RUNTIME
        .get_or_init(|| {
            Builder::new_multi_thread()
                .worker_threads(workers)
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

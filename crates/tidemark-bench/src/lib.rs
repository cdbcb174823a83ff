//! Tidemark's benchmark harness: workload generators and runners, CSV output, statistics.
//!
//! Owns: the workloads of `workloads.md` (W1 `insert` against the embedded, server and
//! cluster targets; W2 `metrics`, recorded host metrics replayed into a server; W3 `append`
//! against a server), the peers run beside them, how they are timed (always until the last
//! event is durable), and how trials are summarised. Must never know about: storage
//! formats, engine or server internals; it drives the public [`tidemark_engine::Db`] API and
//! the client like any user would.

pub mod chart;
pub mod csv_file;
pub mod disk;
pub mod host_metrics;
pub mod latency;
pub mod lines;
pub mod peers;
pub mod process;
pub mod stats;
pub mod summary;
pub mod w1;
pub mod w1_peers;
pub mod w1_server;
pub mod w2;
pub mod w2_peers;
pub mod w3;
pub mod w3_peers;
pub mod w4;

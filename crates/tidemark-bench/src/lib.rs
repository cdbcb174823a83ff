//! Tidemark's benchmark harness: workload generators and runners, CSV output, statistics.
//!
//! Owns: the workloads of `workloads.md` (W1 `insert` against the embedded, server and
//! cluster targets; W2 `metrics`, recorded host metrics replayed into a server; W3 `append`
//! and W5 `consume` against a server; W4 `pipeline` through an agent; lines; tier; python),
//! the runs of `tidemark bench ...` ([`runner`]; the CLI only parses and dispatches), the peers run
//! beside them, how they are timed (always until the last event is durable), and how trials
//! are summarised; and what the runs start: a server on a thread ([`background_server`]),
//! node processes ([`local_cluster`], also `tidemark cluster up`'s), S3Proxy ([`s3proxy`]).
//!
//! Must never know about: storage formats, engine or server internals; it drives the public
//! [`tidemark_engine::Db`] API, the server and the client like any user would. The tests'
//! helpers built on these are in `tidemark-testkit`, which only tests depend on.

pub mod background_server;
pub mod chart;
pub mod csv_file;
pub mod disk;
pub mod host_metrics;
pub mod latency;
pub mod lines;
pub mod local_cluster;
pub mod peers;
pub mod process;
pub mod runner;
pub mod s3proxy;
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
pub mod w5;
pub mod w5_peers;

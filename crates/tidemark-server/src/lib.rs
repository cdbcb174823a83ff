//! Tidemark's server: the HTTP API (the native `/v1` API, the ChronicleDB-compatible
//! routes, InfluxDB's write routes, Prometheus remote write and read), the binary protocol listener, the Graphite plaintext
//! listener, authentication, `/metrics`, and admission control.
//!
//! Owns: turning requests into engine calls and engine results into answers; the bound on
//! request bytes in flight (429 / TRY_LATER beyond it); request size limits; bearer tokens; TLS (rustls);
//! graceful shutdown.
//!
//! Must never know about: storage formats, how the engine logs or flushes, Raft. Requests
//! are decoded into `tidemark_core` batches and handed to a [`store::Store`]: an embedded
//! `tidemark_engine::Db`, or this node's `tidemark_cluster::Cluster`.

pub mod admission;
mod append;
mod auth;
mod binary;
pub mod config;
mod consume;
pub mod error;
mod graphite;
pub mod http;
pub mod ingest;
pub mod metrics;
mod pg;
mod remote_read;
mod serve;
mod shutdown;
mod socket;
mod sql_write;
pub mod state;
pub mod store;
mod tls;

pub use config::Config;
pub use serve::{shutdown_signal, ServeError, Server};
pub use state::{AppState, Namespace};

//! Tidemark's test helpers, shared by the integration tests of several crates: a real
//! server on ephemeral ports in the test's process ([`TestServer`]), and S3Proxy started
//! for a test or skipped with the reason ([`s3proxy`]).
//!
//! Test code: its helpers panic where a test should fail. Only ever a dev-dependency (the
//! shipped binary has no test harness); what the benchmarks need as well (the server on a
//! thread, the S3Proxy launcher) lives in `tidemark-bench`, and this crate wraps it.
//!
//! Must never know about: any one test's data or assertions.

pub mod s3proxy;
mod test_server;

pub use test_server::TestServer;

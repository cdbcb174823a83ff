//! The Rust client of Tidemark.
//!
//! Owns: [`BinaryClient`] (the binary protocol: one TCP connection, many requests in flight,
//! answers matched by request id), [`HttpClient`] (the `/v1` API: streams, appends, SQL),
//! and [`Producer`], a batching buffer over either of them that sends when the buffer is
//! full or old enough, keeps several batches in flight, retries on TRY_LATER / 429, and when
//! too much is unacknowledged either blocks or answers [`ClientError::WouldBlock`]; and
//! [`Consumer`], which follows a stream by position over the binary protocol's
//! subscriptions (credit-based flow control), resuming after its last event on another
//! server when one dies, and commits its position under its name; as an async stream of
//! batches too ([`ConsumerStream`]).
//!
//! Must never know about: the server's internals. Everything here goes through the
//! documented protocols (`docs/protocol.md`, the OpenAPI document).
//!
//! All calls are blocking; the client starts its own threads and needs no async runtime.
//! [`ConsumerStream`] is the one async face, pollable on any runtime.

mod binary;
mod consumer;
mod consumer_stream;
mod error;
mod http;
mod producer;

pub use binary::{BinaryClient, Events, PendingAck, Subscription, SubscriptionEnd};
pub use consumer::{Consumer, ConsumerEnd, ConsumerOptions, StartAt};
pub use consumer_stream::ConsumerStream;
pub use error::ClientError;
pub use http::{percent_encode, HttpClient};
pub use producer::{FullBuffer, Producer, ProducerOptions, Transport};

/// What the server answered for a durable append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The batch's position in the server's log.
    pub lsn: u64,
    pub events: u64,
    /// How long the server worked on the request (binary protocol only; see ACK in
    /// `docs/protocol.md`).
    pub server_time: Option<std::time::Duration>,
    /// The stream positions the events were given, first and last (`docs/consuming.md`),
    /// over HTTP and the binary protocol alike. `None` for a producer's retry that the
    /// server recognised (its first attempt was given them), a stream without positions,
    /// and a binary answer from a server that predates them. On a cluster a batch it split
    /// may span more positions than it has events (others' appends came between its parts).
    pub positions: Option<(u64, u64)>,
}

//! The wire formats Tidemark speaks, as bytes. Chiefly its binary protocol: frames, the
//! requests a client sends and the answers a server gives (`docs/protocol.md` describes every
//! byte; this crate is its executable form). Also the text protocols of other tools, decoded:
//! InfluxDB line protocol into points ([`line_protocol`]), Graphite plaintext lines into
//! metrics ([`graphite`]), Prometheus remote write and read messages ([`prometheus`]),
//! Arrow IPC streams into a stream's events ([`arrow`]), the framing of PostgreSQL
//! frontend messages ([`pg`]) and the rows of its `COPY ... FROM STDIN` ([`pg_copy`]).
//!
//! Owns: the frame header (version, kind, request id, length, CRC32C), encoding and decoding
//! of [`Request`]s and [`Response`]s, and the error codes. Append requests carry one batch in
//! the wire form of [`tidemark_core::wire`].
//!
//! Must never know about: sockets, async runtimes, the engine or the server's state. Both the
//! server (`tidemark-server`) and the client (`tidemark-client`) build on it, so neither has
//! to know the other's internals.

pub mod arrow;
mod frame;
pub mod graphite;
pub mod line_protocol;
mod message;
pub mod pg;
pub mod pg_copy;
pub mod prometheus;

pub use frame::{
    decode_frame, decode_header, frame_len, Frame, FrameError, Header, Kind, FLAG_POSITIONS,
    HEADER_LEN, VERSION,
};
pub use message::{
    decode_append_batch, encode_append, encode_events, ErrorCode, Request, Response, Start,
};

/// The default largest frame a server accepts (the request cap of the HTTP API too).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 64 << 20;

#[cfg(test)]
mod tests;

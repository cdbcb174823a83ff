//! Tidemark's on-disk formats, and the logs written in them.
//!
//! Owns: the framing of log records ([`log`]) (what a record says is a
//! `tidemark_core::command`; [`legacy_record`] reads the records of earlier builds); a log's
//! files ([`log_files`]), reading them back ([`log_read`]), recovering and repairing them
//! ([`replay`]), and the one group-commit queue every log is written through
//! ([`group_commit`], counted in [`log_stats`]) — the database's write-ahead log and a
//! cluster node's Raft log alike; the
//! columnar segment and the pack of small segments ([`segment`]) with its block codecs
//! ([`codec`]) and summaries, the pace of their writes ([`pace`]), the manifest ([`manifest`]), CRC32C checksums, and the
//! write-to-temp / fsync / rename dance ([`fsutil`]). Every byte read back is treated as untrusted: lengths are bounded before
//! anything is allocated, checksums are verified before anything is decoded, and a bad byte
//! is a [`StorageError::Corrupt`], never a panic or a wrong value.
//!
//! Must never know about: streams as a concept with state, what a log record means or what
//! applying it does, Raft or the network. Its owner decides *what* to write and when; this
//! crate decides *how the bytes look* and how a log reaches the disk (the group-commit
//! queue's writer runs on a thread its owner starts).

pub mod bytes;
pub mod codec;
pub mod error;
pub mod fsutil;
pub mod group_commit;
pub mod legacy_record;
pub mod log;
pub mod log_files;
pub mod log_read;
pub mod log_stats;
pub mod manifest;
pub mod pace;
pub mod replay;
pub mod segment;

pub use error::StorageError;

/// Whether `bytes` match the CRC32C `expected`. Fuzz builds (`cfg(fuzzing)`, set by
/// cargo-fuzz) accept any checksum so that the fuzzer reaches the parsers behind it.
pub(crate) fn checksum_matches(bytes: &[u8], expected: u32) -> bool {
    cfg!(fuzzing) || crc32c::crc32c(bytes) == expected
}

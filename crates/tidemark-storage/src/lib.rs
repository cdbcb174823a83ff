//! Tidemark's on-disk formats.
//!
//! Owns: the framing of log records ([`log`]) (what a record says is a
//! `tidemark_core::command`; [`legacy_record`] reads the records of earlier builds), the
//! columnar segment and the pack of small segments ([`segment`]) with its block codecs
//! ([`codec`]) and summaries, the manifest ([`manifest`]), CRC32C checksums, and the
//! write-to-temp / fsync / rename dance ([`fsutil`]). Every byte read back is treated as untrusted: lengths are bounded before
//! anything is allocated, checksums are verified before anything is decoded, and a bad byte
//! is a [`StorageError::Corrupt`], never a panic or a wrong value.
//!
//! Must never know about: streams as a concept with state, threads, group commit, Raft or
//! the network. The engine decides *when* to write; this crate decides *how the bytes look*.

pub mod bytes;
pub mod codec;
pub mod error;
pub mod fsutil;
pub mod legacy_record;
pub mod log;
pub mod manifest;
pub mod segment;

pub use error::StorageError;

/// Whether `bytes` match the CRC32C `expected`. Fuzz builds (`cfg(fuzzing)`, set by
/// cargo-fuzz) accept any checksum so that the fuzzer reaches the parsers behind it.
pub(crate) fn checksum_matches(bytes: &[u8], expected: u32) -> bool {
    cfg!(fuzzing) || crc32c::crc32c(bytes) == expected
}

//! The manifest: a checkpoint of the database's catalog and of which segment files hold which
//! stream's flushed events. Replaced atomically ([`crate::fsutil::write_atomic`]) after every
//! flush; the log holds every change since.
//!
//! ```text
//! manifest := "TMMANI01", u32 len, u32 CRC32C(body), body (JSON of [`Manifest`])
//! ```
//!
//! JSON keeps the file readable by a person in an emergency; it is small (no per-block data,
//! which lives in segment footers) and written once per flush, not per append.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tidemark_core::Schema;

use crate::record::{Retention, StreamId};
use crate::StorageError;

const MAGIC: &[u8; 8] = b"TMMANI01";
pub const FILE_NAME: &str = "MANIFEST";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Every log record before this LSN is reflected in this manifest or in the memtable
    /// ranges that [`ManifestStream::replay_from`] points at.
    pub checkpoint_lsn: u64,
    pub next_stream_id: StreamId,
    pub next_segment_id: u64,
    pub streams: Vec<ManifestStream>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestStream {
    pub id: StreamId,
    pub name: String,
    pub schema: Schema,
    pub retention: Retention,
    /// Appends to this stream at or after this LSN are not in its segments and must be
    /// replayed from the log.
    pub replay_from: u64,
    /// Segment ids in the order their events were inserted (oldest first).
    pub segments: Vec<u64>,
}

impl Manifest {
    pub fn empty() -> Manifest {
        Manifest {
            checkpoint_lsn: 0,
            next_stream_id: 1,
            next_segment_id: 1,
            streams: Vec::new(),
        }
    }

    /// Where replay must start: no record before it is needed any more.
    pub fn log_start(&self) -> u64 {
        self.streams
            .iter()
            .map(|s| s.replay_from)
            .fold(self.checkpoint_lsn, u64::min)
    }

    pub fn encode(&self) -> Result<Vec<u8>, StorageError> {
        let body =
            serde_json::to_vec_pretty(self).map_err(|e| StorageError::Encode(e.to_string()))?;
        let mut out = Vec::with_capacity(body.len() + 16);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Manifest, StorageError> {
        let corrupt = |detail: &str| StorageError::corrupt("manifest", detail);
        if bytes.len() < 16 || &bytes[..8] != MAGIC {
            return Err(corrupt("bad magic number"));
        }
        let len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
        let crc = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        let body = &bytes[16..];
        if body.len() != len {
            return Err(corrupt("length does not match the file"));
        }
        if !crate::checksum_matches(body, crc) {
            return Err(corrupt("checksum mismatch"));
        }
        serde_json::from_slice(body).map_err(|e| StorageError::corrupt("manifest", e.to_string()))
    }

    /// Reads the manifest in `dir`; `None` if there is none yet.
    pub fn load(dir: &Path) -> Result<Option<Manifest>, StorageError> {
        let path = dir.join(FILE_NAME);
        match std::fs::read(&path) {
            Ok(bytes) => Manifest::decode(&bytes).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StorageError::io("read", path, e)),
        }
    }

    pub fn store(&self, dir: &Path) -> Result<(), StorageError> {
        crate::fsutil::write_atomic(&dir.join(FILE_NAME), &self.encode()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let mut m = Manifest::empty();
        m.checkpoint_lsn = 500;
        m.streams.push(ManifestStream {
            id: 1,
            name: "s".into(),
            schema: Schema::parse_spec("A:LONG").unwrap(),
            retention: Retention::default(),
            replay_from: 300,
            segments: vec![4, 9],
        });
        assert_eq!(m.log_start(), 300);
        let bytes = m.encode().unwrap();
        assert_eq!(Manifest::decode(&bytes).unwrap(), m);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(Manifest::decode(&bad).is_err(), "flip at {i}");
        }
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), None);
        m.store(dir.path()).unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), Some(m));
    }
}

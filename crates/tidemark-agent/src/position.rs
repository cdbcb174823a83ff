//! How far forwarding has come, kept in `forwarding.json` in the spool directory and
//! replaced atomically (temporary file, fsync, rename, directory fsync).
//!
//! Exactly once rests on three facts kept here:
//! - **the producer id**, made once per spool: the upstream remembers the last sequence it
//!   applied for it;
//! - **the forwarded mark**: every spooled record before it was acknowledged upstream (or
//!   dead-lettered), and the spool may delete it;
//! - **the cut in flight**: the records `[from, to)` sent (or about to be sent) as one
//!   upstream append tagged with sequence `to`. It is written *before* the first attempt,
//!   so that after a crash the agent sends exactly the same records with the same tag
//!   again: the upstream then either applied them (and skips the retry) or not (and
//!   applies it). Cutting differently after a crash could send a larger batch with a later
//!   sequence, which the upstream would apply whole, storing the first attempt's records
//!   twice.
//!
//! Producers' own tags (a producer writing to the agent with `Tidemark-Producer` or
//! TAGGED_APPEND) are deduplicated by the agent, with the producer table as of the mark.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tidemark_engine::producers::{self, ProducerTable};
use tidemark_storage::fsutil::write_atomic;

use crate::AgentError;

pub const FILE: &str = "forwarding.json";

/// A run of spooled records forwarded as one: `[from, to)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    pub from: u64,
    pub to: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Position {
    /// The agent's producer id at the upstream.
    pub producer: u64,
    /// Every record before this LSN is forwarded (or dead-lettered).
    pub forwarded: u64,
    /// The cut being forwarded; it starts at `forwarded`.
    pub in_flight: Option<Cut>,
    /// Producers' tags applied as of `forwarded`, least recently seen first.
    #[serde(default)]
    pub producers: Vec<(u64, u64, u32)>,
}

impl Position {
    /// The position kept in `dir`, or a new one (a fresh producer id, forwarding from
    /// `start`) written there first.
    pub fn load_or_create(dir: &Path, start: u64) -> Result<Position, AgentError> {
        let path = path(dir);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let position: Position = serde_json::from_slice(&bytes)
                    .map_err(|e| spool_error(dir, format!("{} is damaged: {e}", path.display())))?;
                if let Some(cut) = position.in_flight {
                    if cut.from != position.forwarded || cut.to <= cut.from {
                        return Err(spool_error(
                            dir,
                            format!("{} holds an impossible cut {cut:?}", path.display()),
                        ));
                    }
                }
                Ok(position)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut id = [0u8; 8];
                getrandom::fill(&mut id)
                    .map_err(|e| spool_error(dir, format!("no random producer id: {e}")))?;
                let position = Position {
                    producer: u64::from_le_bytes(id),
                    forwarded: start,
                    in_flight: None,
                    producers: Vec::new(),
                };
                position.store(dir)?;
                Ok(position)
            }
            Err(e) => Err(spool_error(dir, format!("reading {}: {e}", path.display()))),
        }
    }

    pub fn store(&self, dir: &Path) -> Result<(), AgentError> {
        let bytes = serde_json::to_vec(self).map_err(|e| spool_error(dir, e.to_string()))?;
        write_atomic(&path(dir), &bytes).map_err(|e| spool_error(dir, e.to_string()))
    }

    pub fn producer_table(&self) -> ProducerTable {
        let entries: Vec<_> = self
            .producers
            .iter()
            .map(|&(producer, sequence, part)| (producer, (sequence, part)))
            .collect();
        ProducerTable::from_recency_order(&entries, producers::CAPACITY)
    }

    pub fn set_producer_table(&mut self, table: &ProducerTable) {
        self.producers = table
            .recency_order()
            .into_iter()
            .map(|(producer, (sequence, part))| (producer, sequence, part))
            .collect();
    }
}

fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

pub fn spool_error(dir: &Path, message: String) -> AgentError {
    AgentError::Spool {
        dir: dir.display().to_string(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_is_made_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = Position::load_or_create(dir.path(), 0).unwrap();
        first.forwarded = 100;
        first.in_flight = Some(Cut { from: 100, to: 250 });
        first.store(dir.path()).unwrap();
        let again = Position::load_or_create(dir.path(), 0).unwrap();
        assert_eq!(again, first);
        std::fs::write(dir.path().join(FILE), b"{").unwrap();
        assert!(Position::load_or_create(dir.path(), 0).is_err());
    }
}

//! Records the upstream refused as invalid (an unknown stream, a schema mismatch, a bad
//! event): kept in `dead-letters/` in the spool directory, each as the record itself
//! (`<LSN>.record`, a command in the log's encoding: `tidemark_core::command::decode`
//! reads it) and why (`<LSN>.json`), so that forwarding goes on behind them and nothing
//! acknowledged is silently dropped.

use std::path::{Path, PathBuf};

use serde::Serialize;
use tidemark_storage::fsutil::write_atomic;

use crate::position::spool_error;
use crate::AgentError;

pub const DIR: &str = "dead-letters";

pub struct DeadLetters {
    dir: PathBuf,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Reason<'a> {
    lsn: u64,
    stream: &'a str,
    reason: &'a str,
    refused_at_unix_ms: u128,
}

impl DeadLetters {
    /// The dead letters of the spool in `spool_dir`, and how many there are.
    pub fn open(spool_dir: &Path) -> Result<(DeadLetters, u64), AgentError> {
        let dir = spool_dir.join(DIR);
        std::fs::create_dir_all(&dir)
            .map_err(|e| spool_error(spool_dir, format!("creating {}: {e}", dir.display())))?;
        let count = std::fs::read_dir(&dir)
            .map_err(|e| spool_error(spool_dir, format!("listing {}: {e}", dir.display())))?
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.path().extension().is_some_and(|e| e == "json"))
            .count() as u64;
        Ok((DeadLetters { dir }, count))
    }

    /// Keeps the record at `lsn` with why it was refused; durable when this returns.
    pub fn add(
        &self,
        lsn: u64,
        stream: &str,
        reason: &str,
        record: &[u8],
    ) -> Result<(), AgentError> {
        let name = format!("{lsn:020}");
        let failed = |e: tidemark_storage::StorageError| spool_error(&self.dir, e.to_string());
        write_atomic(&self.dir.join(format!("{name}.record")), record).map_err(failed)?;
        let reason = Reason {
            lsn,
            stream,
            reason,
            refused_at_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis()),
        };
        let json = serde_json::to_vec_pretty(&reason)
            .map_err(|e| spool_error(&self.dir, e.to_string()))?;
        write_atomic(&self.dir.join(format!("{name}.json")), &json).map_err(failed)
    }
}

//! `tidemark tier status`: what a running server's tiering has done and holds.

use anyhow::{Context, Result};
use clap::Subcommand;
use serde_json::Value as Json;

use crate::remote::Remote;

#[derive(Subcommand)]
pub enum TierCommand {
    /// Show a running server's tiering: segments in the bucket and pending, uploads, the
    /// read cache, the last error (`GET /v1/tier`; default server 127.0.0.1:8080).
    Status {
        #[command(flatten)]
        remote: Remote,
    },
}

pub fn run(command: TierCommand) -> Result<()> {
    match command {
        TierCommand::Status { mut remote } => {
            remote.server.get_or_insert_with(|| "127.0.0.1:8080".into());
            let client = remote.client()?.context("a server address")?;
            let status = client.request("GET", "/v1/tier", None)?;
            print!("{}", render(&status));
            Ok(())
        }
    }
}

/// `812 B`, `3.4 KiB`, `1.0 GiB`.
pub fn size_text(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ => format!("{value:.1} {}", units[unit]),
    }
}

/// The status as people read it.
fn render(status: &Json) -> String {
    let n = |name: &str| status[name].as_u64().unwrap_or(0);
    let size = |name: &str| size_text(n(name));
    let after = i64::try_from(n("afterSeconds")).unwrap_or(i64::MAX);
    let mut out = format!(
        "bucket            {} (segments move once their newest event is {} old)\n",
        status["url"].as_str().unwrap_or("?"),
        tidemark_query::time::format_duration(after.saturating_mul(1_000_000_000))
    );
    out += &format!(
        "in the bucket     {} segments, {}\n",
        n("tieredSegments"),
        size("tieredBytes")
    );
    out += &format!(
        "pending           {} segments, {}\n",
        n("pendingSegments"),
        size("pendingBytes")
    );
    out += &format!(
        "uploaded          {} segments, {} (since the server started); {} objects deleted\n",
        n("uploadedSegments"),
        size("uploadedBytes"),
        n("deletedObjects")
    );
    out += &format!(
        "reads             {} requests, {} fetched, {} answered by the cache\n",
        n("readRequests"),
        size("readBytes"),
        n("cacheHits")
    );
    out += &format!(
        "cache             {} of {}\n",
        size("cacheBytes"),
        size("cacheCapacityBytes")
    );
    match status["lastError"].as_str() {
        Some(error) => {
            out += &format!(
                "last error        {error} ({} failed rounds)\n",
                n("failures")
            )
        }
        None => out += "last error        none\n",
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_reads_as_lines_with_the_error_when_there_is_one() {
        let status = serde_json::json!({
            "url": "s3://b/p", "afterSeconds": 3600, "tieredSegments": 2,
            "tieredBytes": 3 << 20, "pendingSegments": 1, "pendingBytes": 1 << 20,
            "cacheBytes": 0, "cacheCapacityBytes": 1 << 30,
            "lastError": "the bucket did not answer", "failures": 4,
        });
        let text = render(&status);
        assert!(text.contains("s3://b/p"), "{text}");
        assert!(text.contains("2 segments, 3.0 MiB"), "{text}");
        assert!(text.contains("is 1h old"), "{text}");
        assert!(text.contains("cache             0 B of 1.0 GiB"), "{text}");
        assert!(
            text.contains("the bucket did not answer (4 failed rounds)"),
            "{text}"
        );
    }
}

//! The runs of `tidemark bench ...`: each workload's arguments (parsed by the CLI, which
//! only dispatches), its run against Tidemark and the peers beside it, and its report
//! (CSV, charts, summary rows); `all` runs them in turn.
//!
//! Owns: what the workloads share — a `tidemark serve` process to run against, the run's
//! summary files, and [`Unavailable`], a workload that cannot run here.
//!
//! Must never know about: the CLI's other commands. The server process is this executable
//! (`tidemark serve`), so the runs work only inside the `tidemark` binary.

pub mod all;
pub mod append;
pub mod consume;
pub mod insert;
pub mod lines;
pub mod metrics;
pub mod pipeline;
pub mod python;
pub mod sql;
pub mod tier;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::peers::{free_port, PeerProcess};
use crate::w3::ServerTarget;

/// A workload that cannot run on this machine: what it needs is not installed. Run by
/// itself it is an error (nothing was measured); in `bench all` the workload is skipped,
/// and named with this at the end, as `--peers` skips a peer that is not installed.
#[derive(Debug)]
pub struct Unavailable {
    /// What is missing, and why it is.
    pub missing: String,
    /// How to install it.
    pub install: String,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (install: {})", self.missing, self.install)
    }
}

impl std::error::Error for Unavailable {}

/// Removes the summary files of an earlier run in `out`: one command's figures are appended
/// to them as its workloads finish, and must not mix with another run's.
pub fn clear_summary(out: &Path) -> anyhow::Result<()> {
    for file in ["summary.csv", "summary.md"] {
        let path = out.join(file);
        if path.exists() {
            std::fs::remove_file(&path).with_context(|| format!("clearing {}", path.display()))?;
        }
    }
    Ok(())
}

/// Starts `tidemark serve` on free ports over a fresh `data_dir`, runs `work`, stops it
/// and removes the data.
pub fn with_server_process<T>(
    data_dir: &Path,
    work: impl FnOnce(&ServerTarget) -> Result<T>,
) -> Result<T> {
    with_configured_server(data_dir, None, work)
}

/// [`with_server_process`], the server reading `config` (TOML, docs/server.md) when given.
pub fn with_configured_server<T>(
    data_dir: &Path,
    config: Option<&str>,
    work: impl FnOnce(&ServerTarget) -> Result<T>,
) -> Result<T> {
    if data_dir.exists() {
        std::fs::remove_dir_all(data_dir)
            .with_context(|| format!("clearing {}", data_dir.display()))?;
    }
    std::fs::create_dir_all(data_dir)?;
    let (http, binary) = (free_port()?, free_port()?);
    let exe = std::env::current_exe().context("finding the tidemark executable")?;
    let mut command = Command::new(exe);
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir.join("db"))
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(["--binary", &format!("127.0.0.1:{binary}")]);
    if let Some(config) = config {
        let path = data_dir.join("server.toml");
        std::fs::write(&path, config).with_context(|| format!("writing {}", path.display()))?;
        command.arg("--config").arg(path);
    }
    let binary = std::net::SocketAddr::from(([127, 0, 0, 1], binary));
    let process = PeerProcess::start(
        "tidemark",
        command,
        &data_dir.join("server.log"),
        binary,
        Duration::from_secs(30),
    )?;
    let outcome = work(&ServerTarget {
        http: format!("http://127.0.0.1:{http}"),
        binary,
        token: std::env::var("TIDEMARK_TOKEN").ok(),
        pid: Some(process.pid()),
    });
    drop(process);
    std::fs::remove_dir_all(data_dir).ok();
    outcome
}

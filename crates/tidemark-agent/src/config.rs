//! The agent's settings: flags, or the `[agent]` section of a TOML file (docs/pipeline.md).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tidemark_server::config::{Auth, Limits};
use tidemark_server::Config;

use crate::AgentError;

/// The spool's default cap: 1 GiB of records not yet forwarded.
pub const DEFAULT_SPOOL_MAX_BYTES: u64 = 1 << 30;

/// The free space the spool's disk keeps by default: 256 MiB.
pub const DEFAULT_SPOOL_MIN_FREE_BYTES: u64 = 256 << 20;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// The upstream's binary-protocol addresses (`HOST:PORT`, or `tidemark://HOST:PORT`):
    /// one server, or the nodes of a cluster (any node takes writes; the agent moves to the
    /// next address when one fails).
    pub upstream: Vec<String>,
    /// The write token the upstream wants (AUTH), if it has tokens.
    pub upstream_token: Option<String>,
    pub spool_dir: PathBuf,
    /// Where producers write: HTTP (the server's write routes) and the binary protocol.
    pub http: SocketAddr,
    pub binary: SocketAddr,
    /// Writes are refused (429 / TRY_LATER) while the spool holds this many bytes not yet
    /// forwarded.
    pub spool_max_bytes: u64,
    /// Writes are refused the same way while the spool's disk has fewer bytes free than
    /// this (0: until the disk is full, when a write fails with 503 and is undone).
    pub spool_min_free_bytes: u64,
    /// The most bytes of spooled records forwarded as one append.
    pub forward_max_bytes: usize,
    /// How long an upstream answer may take before the agent gives up on the connection
    /// (and sends the same batch again on a new one).
    pub upstream_timeout_ms: u64,
    /// The longest wait between retries while the upstream is down or pushes back.
    pub max_backoff_ms: u64,
    /// Tokens producers must present to the agent (as to a server: docs/server.md).
    pub auth: Auth,
    pub limits: Limits,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            upstream: Vec::new(),
            upstream_token: None,
            spool_dir: PathBuf::from("tidemark-agent-spool"),
            http: SocketAddr::from(([127, 0, 0, 1], 8090)),
            binary: SocketAddr::from(([127, 0, 0, 1], 8091)),
            spool_max_bytes: DEFAULT_SPOOL_MAX_BYTES,
            spool_min_free_bytes: DEFAULT_SPOOL_MIN_FREE_BYTES,
            forward_max_bytes: 8 << 20,
            upstream_timeout_ms: 30_000,
            max_backoff_ms: 1_000,
            auth: Auth::default(),
            limits: Limits::default(),
        }
    }
}

/// A TOML file with the agent's section.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentFile {
    agent: AgentConfig,
}

impl AgentConfig {
    /// The `[agent]` section of the TOML file at `path`.
    pub fn load(path: &Path) -> Result<AgentConfig, AgentError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| AgentError::Config(format!("reading {}: {e}", path.display())))?;
        let file: AgentFile = toml::from_str(&text)
            .map_err(|e| AgentError::Config(format!("{}: {e}", path.display())))?;
        Ok(file.agent)
    }

    pub fn validate(&self) -> Result<(), AgentError> {
        let bad = |why: String| Err(AgentError::Config(why));
        if self.upstream.is_empty() {
            return bad(
                "no upstream: give --upstream HOST:PORT (the server's binary address)".into(),
            );
        }
        for upstream in &self.upstream {
            if let Err(e) = upstream_address(upstream) {
                return bad(e);
            }
        }
        if self.spool_max_bytes == 0 || self.forward_max_bytes == 0 {
            return bad("spool_max_bytes and forward_max_bytes must be above 0".into());
        }
        if self.upstream_timeout_ms == 0 || self.max_backoff_ms == 0 {
            return bad("upstream_timeout_ms and max_backoff_ms must be above 0".into());
        }
        Ok(())
    }

    /// The server that takes producers' writes into the spool.
    pub(crate) fn server_config(&self) -> Config {
        Config {
            data_dir: self.spool_dir.clone(),
            http: self.http,
            binary: self.binary,
            auth: self.auth.clone(),
            limits: self.limits.clone(),
            ..Config::default()
        }
    }

    pub(crate) fn upstream_timeout(&self) -> Duration {
        Duration::from_millis(self.upstream_timeout_ms)
    }

    pub(crate) fn max_backoff(&self) -> Duration {
        Duration::from_millis(self.max_backoff_ms)
    }
}

/// `HOST:PORT` of an upstream as configured (`tidemark://` may lead).
pub(crate) fn upstream_address(upstream: &str) -> Result<String, String> {
    let address = upstream.strip_prefix("tidemark://").unwrap_or(upstream);
    let address = address.trim_end_matches('/');
    if address.contains("://") || !address.contains(':') {
        return Err(format!(
            "upstream {upstream:?} is not HOST:PORT of a binary-protocol listener (e.g. 127.0.0.1:8081)"
        ));
    }
    Ok(address.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_are_binary_addresses() {
        assert_eq!(
            upstream_address("127.0.0.1:8081").unwrap(),
            "127.0.0.1:8081"
        );
        assert_eq!(upstream_address("tidemark://db:8081/").unwrap(), "db:8081");
        assert!(upstream_address("http://db:8080").is_err());
        assert!(upstream_address("db").is_err());
        assert!(AgentConfig::default().validate().is_err(), "no upstream");
    }

    #[test]
    fn the_agent_section_of_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(
            &path,
            "[agent]\nupstream = [\"127.0.0.1:9081\", \"127.0.0.1:9082\"]\nspool_max_bytes = 1000\n",
        )
        .unwrap();
        let config = AgentConfig::load(&path).unwrap();
        assert_eq!(config.upstream.len(), 2);
        assert_eq!(config.spool_max_bytes, 1000);
        assert_eq!(config.http, AgentConfig::default().http);
        std::fs::write(&path, "[agent]\nupstreams = []\n").unwrap();
        assert!(AgentConfig::load(&path).is_err(), "unknown keys are errors");
    }
}

//! The cluster configuration file: every node's id and addresses, Raft timing, entry cap.
//!
//! ```toml
//! secret = "…"                   # node-to-node connections present it (at least 16 characters)
//! max_entry_bytes = 4194304      # larger batches are split by the leader
//!
//! [timing]                       # optional; these are the defaults
//! heartbeat_ms = 100
//! election_timeout_min_ms = 600
//! election_timeout_max_ms = 1200
//! snapshot_every_entries = 2000
//!
//! [[node]]
//! id = 1
//! raft = "127.0.0.1:9001"
//! http = "127.0.0.1:8080"
//! binary = "127.0.0.1:8081"
//! ```

use std::collections::HashSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::raft::{NodeAddrs, NodeId, Timing};
use crate::ClusterError;

pub const DEFAULT_MAX_ENTRY_BYTES: usize = 4 << 20;

/// The shortest node-to-node secret taken, as for the server's tokens.
pub const MIN_SECRET_CHARS: usize = 16;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// What every node-to-node connection presents before its first request
    /// (`transport::hello`): without it, anyone who reaches a node's Raft address can vote,
    /// replicate entries and write. `None`: any connection is taken (a warning at start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<ClusterSecret>,
    #[serde(default = "default_max_entry_bytes")]
    pub max_entry_bytes: usize,
    #[serde(default)]
    pub timing: Timing,
    #[serde(rename = "node")]
    pub nodes: Vec<NodeConfig>,
}

/// The cluster file's `secret`: written and read as a plain string, never shown by
/// `Debug` (a configuration printed in a log or an error must not carry it).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClusterSecret(String);

impl ClusterSecret {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for ClusterSecret {
    fn from(secret: &str) -> ClusterSecret {
        ClusterSecret(secret.to_string())
    }
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(…)")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub id: NodeId,
    pub raft: String,
    pub http: String,
    pub binary: String,
}

impl NodeConfig {
    pub fn addrs(&self) -> NodeAddrs {
        NodeAddrs {
            raft: self.raft.clone(),
            http: self.http.clone(),
            binary: self.binary.clone(),
        }
    }
}

fn default_max_entry_bytes() -> usize {
    DEFAULT_MAX_ENTRY_BYTES
}

impl ClusterConfig {
    pub fn load(path: &Path) -> Result<ClusterConfig, ClusterError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ClusterError::Config(format!("reading {}: {e}", path.display())))?;
        let config: ClusterConfig = toml::from_str(&text)
            .map_err(|e| ClusterError::Config(format!("{}: {e}", path.display())))?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ClusterError> {
        let bad = |m: String| Err(ClusterError::Config(m));
        if self.nodes.is_empty() {
            return bad("the cluster has no [[node]]".into());
        }
        if let Some(secret) = self.secret.as_ref().map(ClusterSecret::as_str) {
            if secret.chars().count() < MIN_SECRET_CHARS
                || secret.len() > crate::hello::MAX_SECRET_BYTES
            {
                return bad(format!(
                    "secret must be {MIN_SECRET_CHARS} characters to {} bytes long",
                    crate::hello::MAX_SECRET_BYTES
                ));
            }
        }
        if !(64 << 10..=256 << 20).contains(&self.max_entry_bytes) {
            return bad(format!(
                "max_entry_bytes {} is outside 64 KiB..256 MiB",
                self.max_entry_bytes
            ));
        }
        let t = &self.timing;
        if t.heartbeat_ms == 0
            || t.election_timeout_min_ms <= t.heartbeat_ms
            || t.election_timeout_max_ms <= t.election_timeout_min_ms
        {
            return bad("timing must satisfy 0 < heartbeat_ms < election_timeout_min_ms < election_timeout_max_ms".into());
        }
        let mut ids = HashSet::new();
        let mut addrs = HashSet::new();
        for n in &self.nodes {
            if !ids.insert(n.id) {
                return bad(format!("node id {} appears twice", n.id));
            }
            for a in [&n.raft, &n.http, &n.binary] {
                if !addrs.insert(a.clone()) {
                    return bad(format!("address {a} appears twice"));
                }
            }
        }
        Ok(())
    }

    pub fn node(&self, id: NodeId) -> Option<&NodeConfig> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// A configuration of `n` nodes on 127.0.0.1 with consecutive ports from `base_port`
    /// (three per node: Raft, HTTP, binary), for `tidemark cluster up` and tests.
    pub fn local(n: u64, base_port: u16) -> ClusterConfig {
        let nodes = (0..n)
            .map(|i| {
                let port = |k: u64| base_port as u64 + i * 3 + k;
                NodeConfig {
                    id: i + 1,
                    raft: format!("127.0.0.1:{}", port(0)),
                    http: format!("127.0.0.1:{}", port(1)),
                    binary: format!("127.0.0.1:{}", port(2)),
                }
            })
            .collect();
        ClusterConfig {
            secret: Some(ClusterSecret(random_secret())),
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
            timing: Timing::default(),
            nodes,
        }
    }
}

/// A local cluster's secret: 32 hex digits of SipHash under `RandomState`'s keys, which the
/// standard library draws from the operating system's random source (once per thread, then
/// steps), so unpredictable without a random-number crate in the build.
fn random_secret() -> String {
    use std::hash::{BuildHasher, Hasher};
    let word = || {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u8(0);
        hasher.finish()
    };
    format!("{:016x}{:016x}", word(), word())
}

/// The configuration as the TOML file it is read from.
pub fn to_toml(config: &ClusterConfig) -> Result<String, ClusterError> {
    toml::to_string(config).map_err(|e| ClusterError::Config(e.to_string()))
}

impl ClusterConfig {
    /// Like [`ClusterConfig::local`], on 127.0.0.1 ports that are free right now (for tests
    /// and benchmarks that start clusters next to each other).
    pub fn on_free_ports(n: u64) -> std::io::Result<ClusterConfig> {
        // Held together so that no two addresses are the same port.
        let listeners = (0..n * 3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<Vec<_>>>()?;
        let mut config = ClusterConfig::local(n, 1);
        for (node, ports) in config.nodes.iter_mut().zip(listeners.chunks(3)) {
            node.raft = ports[0].local_addr()?.to_string();
            node.http = ports[1].local_addr()?.to_string();
            node.binary = ports[2].local_addr()?.to_string();
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_configs_round_trip_and_bad_ones_are_refused() {
        let config = ClusterConfig::local(3, 9000);
        config.validate().unwrap();
        let text = to_toml(&config).unwrap();
        let back: ClusterConfig = toml::from_str(&text).unwrap();
        assert_eq!(back, config);
        let mut dup = config.clone();
        dup.nodes[1].id = 1;
        assert!(dup.validate().is_err());
        let mut clash = config.clone();
        clash.nodes[1].http = clash.nodes[0].raft.clone();
        assert!(clash.validate().is_err());
        assert!(toml::from_str::<ClusterConfig>("nodes = 3").is_err());
    }

    #[test]
    fn local_clusters_get_a_secret_of_their_own_and_short_ones_are_refused() {
        let (a, b) = (ClusterConfig::local(3, 9000), ClusterConfig::local(3, 9000));
        let secret = a.secret.clone().unwrap();
        assert_eq!(secret.as_str().len(), 32);
        assert!(
            !format!("{a:?}").contains(secret.as_str()),
            "Debug hides it"
        );
        assert_ne!(a.secret, b.secret, "two local clusters, two secrets");
        let mut short = a.clone();
        short.secret = Some("fifteen chars!!".into());
        assert!(short.validate().is_err());
        let mut open = a;
        open.secret = None;
        open.validate().unwrap();
        assert!(!to_toml(&open).unwrap().contains("secret"));
    }
}

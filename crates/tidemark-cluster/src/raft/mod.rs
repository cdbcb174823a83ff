//! Everything that touches openraft. An upgrade of openraft changes this directory and
//! nothing else: the rest of the crate (and Tidemark) sees only the types re-exported here.
//!
//! - [`log_store`]: openraft's log storage on Tidemark's own log files (the engine's
//!   `wal::LogFiles`: same framing, checksums, torn-tail recovery), with group commit.
//! - [`state_machine`]: applies committed entries to the engine replica; snapshots are the
//!   engine's sealed segments plus its manifest.
//! - [`network`]: openraft's network traits over [`crate::transport`], replication
//!   pipelined on a connection per follower (`network/pipeline.rs`, which also keeps every
//!   acknowledgement openraft credits true); AppendEntries bodies are laid out by
//!   [`append_frame`] so that no node copies a batch's bytes.

pub mod append_frame;
pub mod log_store;
pub mod network;
pub mod node;
pub mod state_machine;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use openraft::{BasicNode, ServerState};

/// The addresses of one node, as the Raft membership records them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeAddrs {
    /// Node-to-node transport.
    pub raft: String,
    pub http: String,
    pub binary: String,
}

impl fmt::Display for NodeAddrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "raft {} http {} binary {}",
            self.raft, self.http, self.binary
        )
    }
}

/// The bytes of one entry: a command encoded by `tidemark_core::command`. `Bytes` so that the
/// copies openraft makes (replication to each follower) share one buffer.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload(pub bytes::Bytes);

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({} bytes)", self.0.len())
    }
}

impl fmt::Display for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What applying one entry answered, on every node alike.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Applied {
        events: u64,
        /// The first and last stream position an append's events were given.
        positions: Option<(u64, u64)>,
    },
    /// The producer's sequence number was applied before: this is a retry.
    Duplicate,
    Failed {
        kind: FailureKind,
        message: String,
    },
}

impl Outcome {
    /// An entry that changed nothing in the database (a membership change, a blank).
    pub const NOTHING: Outcome = Outcome::Applied {
        events: 0,
        positions: None,
    };
}

/// The engine errors a replicated command can end in, by what the client should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    UnknownStream,
    StreamExists,
    Invalid,
    /// A producer sequence number below the last one applied: out of order.
    OutOfOrder,
}

openraft::declare_raft_types!(
    /// Tidemark's Raft types: one entry per command, nodes known by three addresses.
    pub TypeConfig:
        D = Payload,
        R = Outcome,
        NodeId = u64,
        Node = NodeAddrs,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig, state_machine::StateMachine>;
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type EntryPayload = openraft::alias::EntryPayloadOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type Membership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
pub type Metrics = openraft::RaftMetrics<TypeConfig>;
pub type ClientWriteError =
    openraft::errors::RaftError<TypeConfig, openraft::errors::ClientWriteError<TypeConfig>>;

/// Election and heartbeat timing, from the cluster configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timing {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// A snapshot is built after this many entries since the last one.
    pub snapshot_every_entries: u64,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            heartbeat_ms: 100,
            election_timeout_min_ms: 600,
            election_timeout_max_ms: 1200,
            snapshot_every_entries: 2000,
        }
    }
}

/// The openraft configuration Tidemark runs with.
pub fn raft_config(timing: &Timing) -> Result<openraft::Config, crate::ClusterError> {
    openraft::Config {
        cluster_name: "tidemark".into(),
        heartbeat_interval: timing.heartbeat_ms,
        election_timeout_min: timing.election_timeout_min_ms,
        election_timeout_max: timing.election_timeout_max_ms,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(timing.snapshot_every_entries),
        // Keep a window of entries after a snapshot, so that a follower a little behind
        // catches up from the log instead of by a whole snapshot.
        max_in_snapshot_log_to_keep: timing.snapshot_every_entries / 2,
        max_payload_entries: 256,
        // A node restarted with a deleted data directory reports an empty log; the leader
        // then starts its replication over (by snapshot) instead of stopping. See "Replacing
        // a node's data" in docs/cluster.md for why remove-node/add-node is the safe way.
        allow_log_reversion: Some(true),
        // A whole snapshot (every sealed segment) goes in one transfer.
        install_snapshot_timeout: 600_000,
        ..Default::default()
    }
    .validate()
    .map_err(|e| crate::ClusterError::Config(e.to_string()))
}

/// Converts an openraft I/O error into ours and back: openraft wants `std::io::Error`.
pub(crate) fn io_error(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Decodes `bytes` as everything a node reads from another node or from its own Raft files:
/// a command, a log entry, each node-to-node request and answer, and the small state files.
/// For the fuzzer (`fuzz/fuzz_targets/raft_messages.rs`): it must return, whatever the bytes.
#[doc(hidden)]
pub fn decode_untrusted(bytes: &[u8]) {
    use openraft::raft::{AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};
    fn try_decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> bool {
        postcard::from_bytes::<T>(bytes).is_ok()
    }
    let _ = tidemark_core::command::decode(bytes);
    try_decode::<Entry>(bytes);
    try_decode::<Option<LogId>>(bytes);
    try_decode::<Vote>(bytes);
    try_decode::<state_machine::SnapshotState>(bytes);
    let _ = append_frame::decode(bytes::Bytes::copy_from_slice(bytes));
    try_decode::<Result<AppendEntriesResponse<TypeConfig>, String>>(bytes);
    try_decode::<VoteRequest<TypeConfig>>(bytes);
    try_decode::<Result<VoteResponse<TypeConfig>, String>>(bytes);
    try_decode::<Result<SnapshotResponse<TypeConfig>, String>>(bytes);
    try_decode::<network::MembershipChange>(bytes);
    try_decode::<Result<(u64, Outcome), network::Refused>>(bytes);
    network::decode_offer(bytes);
}

/// Log ids and votes of leader node 1, for tests.
#[cfg(test)]
pub(crate) mod testing {
    use openraft::vote::{RaftLeaderId, RaftLeaderIdExt, RaftVote};

    use super::{LogId, TypeConfig, Vote};

    /// The id of entry `index`, written in `term` by leader node 1.
    pub(crate) fn log_id(term: u64, index: u64) -> LogId {
        let leader = openraft::alias::LeaderIdOf::<TypeConfig>::new_committed(term, 1);
        LogId::new(leader, index)
    }

    /// Node 1's committed vote for itself in `term`.
    pub(crate) fn vote(term: u64) -> Vote {
        Vote::from_leader_id(
            openraft::alias::LeaderIdOf::<TypeConfig>::new(term, 1),
            true,
        )
    }
}

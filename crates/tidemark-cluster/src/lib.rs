//! Tidemark's replicated store: a Raft group (openraft) over an engine replica.
//!
//! Owns: the Raft log (on Tidemark's log files: an event is written once per node), the
//! state machine that applies committed entries to the engine, snapshots (sealed segments
//! plus manifest, streamed to followers), node-to-node transport and who may use it
//! ([`hello`]: the cluster's secret), membership changes,
//! idempotent producers, splitting batches above the entry cap, and forwarding writes from
//! followers to the leader.
//!
//! Must never know about: HTTP, the binary client protocol, SQL. The server hands it
//! validated batches and typed catalog changes; reads go straight to [`Cluster::db`].
//!
//! Every use of openraft is under [`raft`], pinned to one exact version.
//!
//! # What is acknowledged
//! [`Cluster::append`] returns once every part of the batch is committed — written and
//! fsync'd in the Raft log of a majority of the voters — and applied on this node's leader.
//! A batch larger than `max_entry_bytes` is split into parts proposed one after another;
//! a concurrent reader may see a prefix of the parts (never a part partially), and sees the
//! whole batch once it is acknowledged.

pub mod config;
pub mod conn;
pub mod dialer;
pub mod hello;
/// The producer table lives in the engine, which an embedded database dedupes with too.
pub use tidemark_engine::producers;
pub mod raft;
pub mod transport;

use std::path::Path;
use std::sync::Arc;

pub use config::{ClusterConfig, NodeConfig};
pub use raft::{FailureKind, NodeAddrs, NodeId, Outcome};
use tidemark_core::command::encode_to_vec;
use tidemark_core::{Command, EventBatch, ProducerSeq, Schema};
use tidemark_engine::{check_new_command, Engine, EngineError, Options, Positions};

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cluster configuration: {0}")]
    Config(String),
    #[error("{0}")]
    Invalid(String),
    /// Refused before it was proposed (bad batch, unknown stream, overload).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Committed, and applying it failed alike on every node.
    #[error("{message}")]
    Failed { kind: FailureKind, message: String },
    /// No leader, no quorum, or the outcome of a write is unknown.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// This node is not the leader, or is a leader that may not accept writes yet: nothing
    /// was done. Retried internally until a leader takes it.
    #[error("this node is not the leader")]
    NotLeader,
    #[error("membership change: {0}")]
    Membership(String),
    #[error("cluster storage: {0}")]
    Io(#[from] std::io::Error),
}

/// A command that cannot be encoded (a name or schema over the codec's lengths) is refused
/// before it is proposed.
impl From<tidemark_core::command::CommandError> for ClusterError {
    fn from(e: tidemark_core::command::CommandError) -> ClusterError {
        ClusterError::Invalid(e.to_string())
    }
}

/// What `tidemark cluster status` shows.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ClusterStatus {
    pub node: NodeId,
    pub state: String,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub last_log_index: Option<u64>,
    pub committed: Option<u64>,
    pub applied: Option<u64>,
    pub snapshot: Option<u64>,
    pub purged: Option<u64>,
    pub nodes: Vec<NodeStatus>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct NodeStatus {
    pub id: NodeId,
    pub addrs: NodeAddrs,
    pub voter: bool,
    /// The last log index known to be on that node (the leader tracks it for everyone).
    pub matched: Option<u64>,
    /// Entries committed but not known to be on that node.
    pub lag: Option<u64>,
    /// Attempts of this node to connect to that one that failed, since this node started.
    #[serde(default)]
    pub failed_connects: u64,
    /// How long this node has been unable to connect to that one, if it is now.
    #[serde(default)]
    pub unreachable_ms: Option<u64>,
}

/// What an acknowledged command tells the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterAck {
    /// The Raft index of the command's (last) entry: acknowledgements are ordered by it.
    pub index: u64,
    /// Events appended (0 for a catalog change).
    pub events: u64,
    /// How many entries the batch became (more than one when it was split).
    pub parts: usize,
    /// The batch (all its parts) had been applied before: a retry.
    pub duplicate: bool,
    /// The stream positions the batch's events were given, from its first part's first to
    /// its last part's last (a split batch's parts may interleave with other writers'
    /// appends); `None` for a catalog change, a retry and a stream that gives none.
    pub positions: Option<Positions>,
}

/// One node of a cluster, as the server sees it.
pub struct Cluster {
    node: raft::node::Node,
    max_entry_bytes: usize,
}

impl Cluster {
    /// Starts node `id` of `config` with its state in `dir/raft` (the Raft log, the replica,
    /// snapshots).
    pub async fn start(
        id: NodeId,
        dir: &Path,
        config: &ClusterConfig,
        options: Options,
    ) -> Result<Arc<Cluster>, ClusterError> {
        config.validate()?;
        let me = config.node(id).ok_or_else(|| {
            ClusterError::Config(format!("node {id} is not in the cluster configuration"))
        })?;
        let members = config.nodes.iter().map(|n| (n.id, n.addrs())).collect();
        let node = raft::node::Node::start(
            id,
            &dir.join("raft"),
            &me.raft,
            config.secret.as_ref().map(config::ClusterSecret::as_str),
            members,
            &config.timing,
            options,
        )
        .await?;
        Ok(Arc::new(Cluster {
            node,
            max_entry_bytes: config.max_entry_bytes,
        }))
    }

    pub fn id(&self) -> NodeId {
        self.node.id
    }

    /// This node's replica, for reads: it holds every entry this node has applied (its
    /// log statistics and failure are the Raft log's).
    pub fn db(&self) -> Engine {
        self.node.machine.db().engine()
    }

    /// Runs `command` through the cluster: checked on this node, replicated, and answered
    /// once committed on a majority and applied here (an append: every part of it). The
    /// rules for new names are checked before proposing: applying checks only what every
    /// replica decides alike, for old logs too.
    ///
    /// An append with a producer tag (its part 0: the parts are numbered here) is applied
    /// once however often it is retried; [`ClusterAck::duplicate`] says it was a retry.
    pub async fn submit(&self, command: Command<EventBatch>) -> Result<ClusterAck, ClusterError> {
        check_new_command(&command)?;
        match command {
            Command::Append {
                name,
                batch,
                producer,
            } => self.append(&name, &batch, producer).await,
            catalog => self.execute(&catalog).await,
        }
    }

    /// Appends a batch: checked against this node's replica, split at the entry cap,
    /// replicated, and acknowledged once every part is committed.
    pub async fn append(
        &self,
        stream: &str,
        batch: &EventBatch,
        producer: Option<ProducerSeq>,
    ) -> Result<ClusterAck, ClusterError> {
        if producer.is_some_and(|p| p.part != 0) {
            return Err(ClusterError::Invalid(
                "a producer tag names part 0: the cluster numbers the parts of a batch".into(),
            ));
        }
        self.stream_schema(stream).await?;
        self.node.machine.db().check_append(stream, batch)?;
        let entries = split(batch, self.max_entry_bytes, |part, piece| {
            let command = Command::Append {
                name: stream.to_string(),
                batch: piece,
                producer: producer.map(|p| ProducerSeq { part, ..p }),
            };
            Ok(encode_to_vec(&command)?)
        })?;
        let mut ack = ClusterAck {
            index: 0,
            events: 0,
            parts: entries.len(),
            duplicate: false,
            positions: None,
        };
        for entry in entries {
            let (index, outcome) = self.propose(entry, producer.is_some()).await?;
            ack.index = index;
            match outcome {
                Outcome::Applied { events, positions } => {
                    ack.events += events;
                    if let Some((first, last)) = positions {
                        let first = ack.positions.map_or(first, |p| p.first);
                        ack.positions = Some(Positions { first, last });
                    }
                }
                Outcome::Duplicate => ack.duplicate = true,
                Outcome::Failed { kind, message } => {
                    return Err(ClusterError::Failed { kind, message })
                }
            }
        }
        Ok(ack)
    }

    /// The schema of `name` for a write through this node. A stream created through
    /// another node a moment ago may not be applied here yet (this node lagged, or was
    /// paused or cut off): before answering that there is no such stream, the node catches
    /// up with the leader once (a read barrier).
    pub async fn stream_schema(&self, name: &str) -> Result<Arc<Schema>, ClusterError> {
        match self.db().stream_schema(name) {
            Err(EngineError::UnknownStream(_)) => {
                self.read_barrier().await?;
                Ok(self.db().stream_schema(name)?)
            }
            known => Ok(known?),
        }
    }

    /// Waits until this node has applied every write acknowledged before the call
    /// (`consistency=linearizable`).
    pub async fn read_barrier(&self) -> Result<(), ClusterError> {
        self.node.read_barrier().await
    }

    pub fn status(&self) -> ClusterStatus {
        self.node.status()
    }

    /// Adds a node: first as a learner that catches up (from the log or a snapshot), then
    /// as a voter.
    pub async fn add_node(&self, id: NodeId, addrs: NodeAddrs) -> Result<(), ClusterError> {
        self.node
            .change_membership(raft::network::MembershipChange::Add { id, addrs })
            .await
    }

    pub async fn remove_node(&self, id: NodeId) -> Result<(), ClusterError> {
        self.node
            .change_membership(raft::network::MembershipChange::Remove { id })
            .await
    }

    pub async fn shutdown(&self) {
        self.node.shutdown().await
    }

    /// Cuts this node off from its peers (`true`) or reconnects it (`false`), as a network
    /// partition would, for fault-injection tests and drills: while isolated, it can neither
    /// replicate, vote nor forward, and no peer reaches it; its clients still do. A leader
    /// cut off this way stays leader in its own eyes until it hears of a higher term; a
    /// write it takes meanwhile waits, and is acknowledged only if it is committed after
    /// the node reconnects (it fails if another leader has replaced its entry).
    pub fn isolate(&self, isolated: bool) {
        self.node.dialer.isolation().set(isolated);
    }

    /// Runs a catalog change and answers once this node has applied it too, so that the
    /// caller reads its own change back from the node it asked.
    async fn execute(&self, command: &Command<EventBatch>) -> Result<ClusterAck, ClusterError> {
        let entry = encode_to_vec(command)?;
        let (index, outcome) = self.propose(entry, false).await?;
        self.node.wait_applied(index).await?;
        match outcome {
            Outcome::Failed { kind, message } => Err(ClusterError::Failed { kind, message }),
            Outcome::Applied { .. } | Outcome::Duplicate => Ok(ClusterAck {
                index,
                events: 0,
                parts: 1,
                duplicate: false,
                positions: None,
            }),
        }
    }

    /// Proposes the bytes of one entry and waits until it is committed (and applied on the
    /// leader). An `idempotent` entry (tagged by a producer) is proposed again when the
    /// outcome of an attempt is unknown.
    async fn propose(
        &self,
        entry: Vec<u8>,
        idempotent: bool,
    ) -> Result<(u64, Outcome), ClusterError> {
        self.node
            .propose(raft::Payload(entry.into()), idempotent)
            .await
    }
}

/// Cuts `batch` into parts whose entries, encoded by `entry(part number, part)`, hold at
/// most `max_bytes` each (a single event whose entry is larger is refused), and returns
/// the entries in order: the whole batch in one entry when it fits.
fn split(
    batch: &EventBatch,
    max_bytes: usize,
    entry: impl Fn(u32, &EventBatch) -> Result<Vec<u8>, ClusterError>,
) -> Result<Vec<Vec<u8>>, ClusterError> {
    let mut entries = Vec::new();
    // Ranges of events still to encode, the next one first.
    let mut todo = std::collections::VecDeque::from([(0usize, batch.len())]);
    while let Some((start, end)) = todo.pop_front() {
        let part = if start == 0 && end == batch.len() {
            None
        } else {
            Some(batch.take(&(start as u32..end as u32).collect::<Vec<_>>()))
        };
        let bytes = entry(entries.len() as u32, part.as_ref().unwrap_or(batch))?;
        if bytes.len() <= max_bytes {
            entries.push(bytes);
        } else if end - start <= 1 {
            return Err(ClusterError::Invalid(format!(
                "one event of {} bytes is larger than the entry cap of {max_bytes} bytes",
                bytes.len()
            )));
        } else {
            // Split in proportion to the overshoot, then check each piece again, in order.
            let pieces = bytes.len().div_ceil(max_bytes).max(2);
            let step = (end - start).div_ceil(pieces);
            let mut s = end;
            while s > start {
                let piece_start = start + (s - start - 1) / step * step;
                todo.push_front((piece_start, s));
                s = piece_start;
            }
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::{BatchBuilder, Value};

    #[test]
    fn split_parts_fit_the_cap_and_concatenate_to_the_batch() {
        let schema = Arc::new(Schema::parse_spec("S:STRING").unwrap());
        let mut b = BatchBuilder::new(schema.clone(), 0);
        for i in 0..1000 {
            b.push_row(i, None, &[Value::String("x".repeat((i % 50) as usize))])
                .unwrap();
        }
        let batch = b.finish();
        let encode = |part, piece: &EventBatch| {
            let command = Command::Append {
                name: "s".to_string(),
                batch: piece,
                producer: Some(ProducerSeq {
                    producer: 9,
                    sequence: 4,
                    part,
                }),
            };
            Ok(encode_to_vec(&command)?)
        };
        for cap in [1 << 20, 4096, 700] {
            let entries = split(&batch, cap, encode).unwrap();
            let mut ts = Vec::new();
            for (i, entry) in entries.iter().enumerate() {
                assert!(entry.len() <= cap);
                let command = tidemark_core::command::decode(entry).unwrap();
                let Command::Append {
                    batch, producer, ..
                } = command
                else {
                    panic!("not an append: {command:?}");
                };
                assert_eq!(
                    producer.map(|t| t.part),
                    Some(i as u32),
                    "parts numbered in order"
                );
                let mut r = tidemark_storage::bytes::Reader::new(batch, "batch");
                let part = tidemark_core::wire::decode_batch(&mut r, &schema).unwrap();
                ts.extend_from_slice(part.tstart());
            }
            assert_eq!(ts, batch.tstart(), "cap {cap}");
            assert_eq!(entries.len() > 1, cap < 4096 * 8);
        }
        assert!(split(&batch, 60, encode).is_err());
    }
}

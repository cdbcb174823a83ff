//! A running cluster node: the Raft instance, its log and state machine, the node-to-node
//! server, and the write path (propose locally on the leader, forward from a follower).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::async_runtime::watch::WatchReceiver;
use openraft::{ReadPolicy, ServerState};
use tokio::net::TcpListener;

use super::log_store::LogStore;
use super::network::{self, NetworkFactory, WriteHandler, WriteRefused};
use super::state_machine::StateMachine;
use super::{raft_config, NodeAddrs, NodeId, Outcome, Payload, Raft};
use crate::transport::{self, Conn};
use crate::ClusterError;

/// How long a write waits for a leader to appear (an election) before giving up.
const LEADER_WAIT: Duration = Duration::from_secs(10);
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);
const FORWARD_CONNECTIONS: usize = 8;

pub struct Node {
    pub(crate) id: NodeId,
    pub(crate) raft: Raft,
    pub(crate) machine: StateMachine,
    forwarder: Forwarder,
    server: tokio::task::JoinHandle<()>,
}

/// Proposes forwarded writes on this node's Raft (which must be the leader).
struct LocalWrites {
    raft: Raft,
}

async fn read_index(raft: &Raft) -> Result<u64, ClusterError> {
    Ok(raft
        .ensure_linearizable(ReadPolicy::ReadIndex)
        .await
        .map_err(|e| ClusterError::Unavailable(e.to_string()))?
        .index())
}

impl WriteHandler for LocalWrites {
    async fn read_index(&self) -> Result<u64, WriteRefused> {
        if !self.raft.is_leader() {
            let leader = self.raft.current_leader().await;
            return Err(WriteRefused::NotLeader { leader });
        }
        read_index(&self.raft)
            .await
            .map_err(|e| WriteRefused::Unavailable(e.to_string()))
    }

    async fn write(&self, payload: Payload) -> Result<(u64, Outcome), WriteRefused> {
        if !self.raft.is_leader() {
            let leader = self.raft.current_leader().await;
            return Err(WriteRefused::NotLeader { leader });
        }
        match self.raft.client_write(payload).await {
            Ok(resp) => Ok((resp.log_id.index, resp.data)),
            Err(e) => Err(WriteRefused::Unavailable(format!(
                "the outcome of the write is unknown ({e}); retry with a producer id to apply it once"
            ))),
        }
    }
}

impl Node {
    /// Starts node `id` with its state under `dir`, serving the transport on `raft_addr`,
    /// and (on first start of the node with the lowest id) initialises the cluster with
    /// `members` as voters.
    pub(crate) async fn start(
        id: NodeId,
        dir: &Path,
        raft_addr: &str,
        members: BTreeMap<NodeId, NodeAddrs>,
        timing: &super::Timing,
        options: tidemark_engine::Options,
    ) -> Result<Node, ClusterError> {
        let config = Arc::new(raft_config(timing)?);
        let log = LogStore::open(&dir.join("log-store")).map_err(ClusterError::Io)?;
        let machine = StateMachine::open(dir, options).map_err(ClusterError::Io)?;
        let incoming = dir.join("incoming");
        let _ = std::fs::remove_dir_all(&incoming);
        let listener = TcpListener::bind(raft_addr).await.map_err(|e| {
            ClusterError::Config(format!("binding the Raft address {raft_addr}: {e}"))
        })?;
        let raft = Raft::new(id, config, NetworkFactory, log, machine.clone())
            .await
            .map_err(|e| ClusterError::Unavailable(e.to_string()))?;
        let writes = Arc::new(LocalWrites { raft: raft.clone() });
        let server = tokio::spawn(network::serve(listener, raft.clone(), incoming, writes));
        let lowest = members.keys().next().copied();
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| ClusterError::Unavailable(e.to_string()))?;
        if !initialized && lowest == Some(id) {
            match raft.initialize(members).await {
                Ok(()) => tracing::info!(node = id, "initialised the cluster"),
                Err(e) => tracing::info!(node = id, error = %e, "not initialising the cluster"),
            }
        }
        Ok(Node {
            id,
            raft,
            machine,
            forwarder: Forwarder::default(),
            server,
        })
    }

    /// Proposes `payload` and returns its index and what applying it answered, forwarding
    /// to the leader when this node is not. Only a write that was certainly not proposed is
    /// retried.
    pub(crate) async fn propose(&self, payload: Payload) -> Result<(u64, Outcome), ClusterError> {
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            let metrics = self.raft.metrics().borrow_watched().clone();
            let leader = metrics.current_leader;
            if leader == Some(self.id) && metrics.state == ServerState::Leader {
                return self.raft.client_write(payload).await.map(|r| (r.log_id.index, r.data)).map_err(|e| {
                    ClusterError::Unavailable(format!(
                        "the outcome of the write is unknown ({e}); retry with a producer id to apply it once"
                    ))
                });
            }
            let target: Option<String> = leader.and_then(|l| {
                metrics
                    .membership_config
                    .nodes()
                    .find(|(id, _)| **id == l)
                    .map(|(_, n)| n.raft.clone())
            });
            if let Some(addr) = target.filter(|_| leader != Some(self.id)) {
                let answer: Result<(u64, Outcome), WriteRefused> = self
                    .forwarder
                    .call(&addr, transport::CLIENT_WRITE, &payload.0)
                    .await?;
                match answer {
                    Ok(outcome) => return Ok(outcome),
                    Err(WriteRefused::Unavailable(why)) => {
                        return Err(ClusterError::Unavailable(why))
                    }
                    Err(WriteRefused::NotLeader { .. }) => {} // an election is under way
                }
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::Unavailable(format!(
                    "no leader was elected within {LEADER_WAIT:?}; is a majority of the nodes up?"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until this node has applied everything the leader had committed when asked
    /// (ReadIndex): a read after this sees every write acknowledged before it started.
    /// Waits until this node has applied everything the leader had committed when asked
    /// (ReadIndex): a read after this sees every write acknowledged before it started. A
    /// follower asks the leader for that index (one round trip) and waits to apply it.
    pub(crate) async fn read_barrier(&self) -> Result<(), ClusterError> {
        let deadline = Instant::now() + LEADER_WAIT;
        let index = loop {
            if self.raft.is_leader() {
                break read_index(&self.raft).await?;
            }
            let metrics = self.raft.metrics().borrow_watched().clone();
            let target: Option<String> = metrics.current_leader.and_then(|l| {
                metrics
                    .membership_config
                    .nodes()
                    .find(|(id, _)| **id == l)
                    .map(|(_, n)| n.raft.clone())
            });
            if let Some(addr) = target {
                let answer: Result<u64, WriteRefused> = self
                    .forwarder
                    .call(&addr, transport::READ_INDEX, &[])
                    .await?;
                match answer {
                    Ok(index) => break index,
                    Err(WriteRefused::Unavailable(why)) => {
                        return Err(ClusterError::Unavailable(why))
                    }
                    Err(WriteRefused::NotLeader { .. }) => {}
                }
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::Unavailable(format!(
                    "no leader was elected within {LEADER_WAIT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        self.wait_applied(index).await
    }

    /// Waits until this node has applied the entry at `index`.
    pub(crate) async fn wait_applied(&self, index: u64) -> Result<(), ClusterError> {
        self.raft
            .wait(Some(LEADER_WAIT))
            .applied_index_at_least(Some(index), "apply")
            .await
            .map_err(|e| {
                ClusterError::Unavailable(format!("this node has not applied entry {index}: {e}"))
            })?;
        Ok(())
    }

    pub(crate) async fn shutdown(&self) {
        self.server.abort();
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "Raft shutdown");
        }
    }

    pub(crate) async fn add_node(&self, id: NodeId, addrs: NodeAddrs) -> Result<(), ClusterError> {
        self.raft
            .add_learner(id, addrs, true)
            .await
            .map_err(|e| ClusterError::Membership(e.to_string()))?;
        let mut voters: BTreeSet<NodeId> = self.raft.voter_ids().collect();
        voters.insert(id);
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(|e| ClusterError::Membership(e.to_string()))?;
        Ok(())
    }

    pub(crate) async fn remove_node(&self, id: NodeId) -> Result<(), ClusterError> {
        let mut voters: BTreeSet<NodeId> = self.raft.voter_ids().collect();
        if !voters.remove(&id) {
            return Err(ClusterError::Membership(format!(
                "node {id} is not a voter"
            )));
        }
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(|e| ClusterError::Membership(e.to_string()))?;
        Ok(())
    }

    pub(crate) fn status(&self) -> crate::ClusterStatus {
        let m = self.raft.metrics().borrow_watched().clone();
        let index = |l: &Option<super::LogId>| l.as_ref().map(|l| l.index);
        let committed = index(&m.local_committed);
        let mut nodes: Vec<crate::NodeStatus> = m
            .membership_config
            .nodes()
            .map(|(id, addrs)| crate::NodeStatus {
                id: *id,
                addrs: addrs.clone(),
                voter: m.membership_config.voter_ids().any(|v| v == *id),
                matched: m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id).cloned().flatten())
                    .map(|l| l.index),
                lag: None,
            })
            .collect();
        for n in &mut nodes {
            if n.id == self.id {
                n.matched = m.last_log_index;
            }
            n.lag = match (committed, n.matched) {
                (Some(c), Some(mi)) => Some(c.saturating_sub(mi)),
                _ => None,
            };
        }
        crate::ClusterStatus {
            node: self.id,
            state: format!("{:?}", m.state),
            leader: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index,
            committed,
            applied: index(&m.last_applied),
            snapshot: index(&m.snapshot),
            purged: index(&m.purged),
            nodes,
        }
    }
}

/// Connections to the leader for forwarded writes: a few per address, so that concurrent
/// writes from one follower do not queue behind each other.
#[derive(Default)]
struct Forwarder {
    pools: Mutex<HashMap<String, Vec<Arc<tokio::sync::Mutex<Conn>>>>>,
    next: AtomicUsize,
}

impl Forwarder {
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        addr: &str,
        kind: u8,
        body: &[u8],
    ) -> Result<T, ClusterError> {
        let conn = {
            let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
            let pool = pools.entry(addr.to_string()).or_insert_with(|| {
                (0..FORWARD_CONNECTIONS)
                    .map(|_| Arc::new(tokio::sync::Mutex::new(Conn::new(addr.to_string()))))
                    .collect()
            });
            pool.iter()
                .find(|c| c.try_lock().is_ok())
                .unwrap_or(&pool[self.next.fetch_add(1, Ordering::Relaxed) % pool.len()])
                .clone()
        };
        let mut conn = conn.lock().await;
        let resp = conn
            .call(kind, body, FORWARD_TIMEOUT, async |_, _| Ok(()))
            .await
            .map_err(|e| {
                ClusterError::Unavailable(format!(
                    "forwarding to the leader at {addr} failed; a write's outcome is unknown ({e}): retry it with a producer id to apply it once"
                ))
            })?;
        postcard::from_bytes(&resp).map_err(|e| {
            ClusterError::Unavailable(format!("a malformed answer from the leader: {e}"))
        })
    }
}

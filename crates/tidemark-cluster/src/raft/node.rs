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
use super::network::{self, LeaderRequests, MembershipChange, NetworkFactory, Refused};
use super::state_machine::StateMachine;
use super::{raft_config, ClientWriteError, NodeAddrs, NodeId, Outcome, Payload, Raft};
use crate::conn::{CallError, Conn};
use crate::dialer::Dialer;
use crate::transport;
use crate::ClusterError;
use tidemark_core::sync::IgnorePoison;

/// How long a write waits for a leader to appear (an election) before giving up.
const LEADER_WAIT: Duration = Duration::from_secs(10);
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);
const FORWARD_CONNECTIONS: usize = 8;
/// How long a follower that cannot reach the leader waits for news of another before trying
/// it again.
const UNREACHABLE_LEADER_WAIT: Duration = Duration::from_millis(200);

pub struct Node {
    pub(crate) id: NodeId,
    pub(crate) raft: Raft,
    pub(crate) machine: StateMachine,
    forwarder: Forwarder,
    pub(crate) dialer: Dialer,
    server: tokio::task::JoinHandle<()>,
}

/// Runs what other nodes forward to this one (which must be the leader).
struct Leader {
    raft: Raft,
}

async fn read_index(raft: &Raft) -> Result<u64, ClusterError> {
    match raft.ensure_linearizable(ReadPolicy::ReadIndex).await {
        Ok(read) => Ok(read.index()),
        Err(e) if e.forward_to_leader().is_some() => Err(ClusterError::NotLeader),
        Err(e) => Err(ClusterError::Unavailable(e.to_string())),
    }
}

/// Proposes `payload` on this node, the leader. openraft answers `ForwardToLeader` only for
/// a write it refused before appending it (not the leader, or a leader whose lease has not
/// started): that one is retried; any later failure leaves the outcome unknown.
async fn client_write(raft: &Raft, payload: Payload) -> Result<(u64, Outcome), ClusterError> {
    match raft.client_write(payload).await {
        Ok(resp) => Ok((resp.log_id.index, resp.data)),
        Err(e)
            if matches!(
                e.api_error(),
                Some(openraft::errors::ClientWriteError::ForwardToLeader(_))
            ) =>
        {
            Err(ClusterError::NotLeader)
        }
        Err(e) => Err(ClusterError::Unavailable(format!(
            "the outcome of the write is unknown ({e}); retry with a producer id to apply it once"
        ))),
    }
}

/// Adds a node (a learner until it has caught up, then a voter) or removes a voter.
async fn change_membership(raft: &Raft, change: MembershipChange) -> Result<(), ClusterError> {
    let failed = |e: ClientWriteError| match e.api_error() {
        Some(openraft::errors::ClientWriteError::ForwardToLeader(_)) => ClusterError::NotLeader,
        _ => ClusterError::Membership(e.to_string()),
    };
    let mut voters: BTreeSet<NodeId> = raft.voter_ids().collect();
    match change {
        MembershipChange::Add { id, addrs } => {
            raft.add_learner(id, addrs, true).await.map_err(failed)?;
            voters.insert(id);
        }
        MembershipChange::Remove { id } => {
            if !voters.remove(&id) {
                return Err(ClusterError::Membership(format!(
                    "node {id} is not a voter"
                )));
            }
        }
    }
    raft.change_membership(voters, false)
        .await
        .map_err(failed)?;
    Ok(())
}

/// What a follower forwards runs on the leader as it would locally; anything but success
/// comes back as a [`Refused`].
impl LeaderRequests for Leader {
    async fn write(&self, payload: Payload) -> Result<(u64, Outcome), Refused> {
        self.only_on_leader().await?;
        client_write(&self.raft, payload)
            .await
            .map_err(Refused::from)
    }

    async fn read_index(&self) -> Result<u64, Refused> {
        self.only_on_leader().await?;
        read_index(&self.raft).await.map_err(Refused::from)
    }

    async fn membership(&self, change: MembershipChange) -> Result<(), Refused> {
        self.only_on_leader().await?;
        change_membership(&self.raft, change)
            .await
            .map_err(Refused::from)
    }
}

impl Leader {
    async fn only_on_leader(&self) -> Result<(), Refused> {
        if self.raft.is_leader() {
            return Ok(());
        }
        Err(Refused::NotLeader {
            leader: self.raft.current_leader().await,
        })
    }
}

impl Node {
    /// Starts node `id` with its state under `dir`, serving the transport on `raft_addr`
    /// to connections that present `secret` (and presenting it to its peers), and (on first
    /// start of the node with the lowest id) initialises the cluster with `members` as
    /// voters.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn start(
        id: NodeId,
        dir: &Path,
        raft_addr: &str,
        secret: Option<&str>,
        members: BTreeMap<NodeId, NodeAddrs>,
        timing: &super::Timing,
        options: tidemark_engine::Options,
    ) -> Result<Node, ClusterError> {
        if secret.is_none() {
            tracing::warn!(node = id, raft = raft_addr, "the cluster file sets no secret: any connection to the Raft address is served (docs/cluster.md, \"Security\")");
        }
        let config = Arc::new(raft_config(timing)?);
        let log = LogStore::open(&dir.join("log-store")).map_err(ClusterError::Io)?;
        let machine =
            StateMachine::open(dir, options, Arc::new(log.clone())).map_err(ClusterError::Io)?;
        let incoming = dir.join("incoming");
        let _ = std::fs::remove_dir_all(&incoming);
        let listener = TcpListener::bind(raft_addr).await.map_err(|e| {
            ClusterError::Config(format!("binding the Raft address {raft_addr}: {e}"))
        })?;
        let dialer = Dialer::new(secret);
        let network = NetworkFactory {
            dialer: dialer.clone(),
        };
        let raft = Raft::new(id, config, network, log.clone(), machine.clone())
            .await
            .map_err(|e| ClusterError::Unavailable(e.to_string()))?;
        let leader = Arc::new(Leader { raft: raft.clone() });
        let server = tokio::spawn(network::serve(
            listener,
            raft.clone(),
            incoming,
            leader,
            dialer.isolation().clone(),
            secret.map(Arc::from),
        ));
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
            forwarder: Forwarder::new(dialer.clone()),
            dialer,
            server,
        })
    }

    /// Runs `local` if this node leads, else sends `body` as a `kind` request to the leader
    /// (whose `LeaderRequests` runs the same thing there), waiting up to [`LEADER_WAIT`] for
    /// a leader. It tries again while nothing was done: no leader is known, the node asked
    /// no longer leads, or the leader could not be reached (it died, and the others have not
    /// noticed yet). A request sent without an answer may have been carried out: it is sent
    /// again only when it is `idempotent` (a read, or a write with a producer tag, which the
    /// leader applies once); otherwise the caller learns that its outcome is unknown.
    async fn on_leader<T, F>(
        &self,
        kind: u8,
        body: &[u8],
        idempotent: bool,
        local: impl Fn() -> F,
    ) -> Result<T, ClusterError>
    where
        T: serde::de::DeserializeOwned,
        F: std::future::Future<Output = Result<T, ClusterError>>,
    {
        let deadline = Instant::now() + LEADER_WAIT;
        let mut last_failure = None;
        loop {
            let metrics = self.raft.metrics().borrow_watched().clone();
            let leader = metrics.current_leader;
            if leader == Some(self.id) && metrics.state == ServerState::Leader {
                match local().await {
                    Err(ClusterError::NotLeader) => {} // stepped down before it was proposed
                    Err(ClusterError::Unavailable(why)) if idempotent => last_failure = Some(why),
                    done => return done,
                }
            }
            let target: Option<String> = leader.filter(|&l| l != self.id).and_then(|l| {
                metrics
                    .membership_config
                    .nodes()
                    .find(|(id, _)| **id == l)
                    .map(|(_, n)| n.raft.clone())
            });
            if let Some(addr) = target {
                match self.forwarder.call::<Result<T, Refused>>(&addr, kind, body).await {
                    Ok(Ok(value)) => return Ok(value),
                    Ok(Err(Refused::NotLeader { .. })) => {} // an election is under way
                    Ok(Err(Refused::Failed(why))) if idempotent => last_failure = Some(why),
                    Ok(Err(Refused::Failed(why))) => return Err(ClusterError::Unavailable(why)),
                    Ok(Err(Refused::Membership(why))) => {
                        return Err(ClusterError::Membership(why))
                    }
                    Err(CallError::NotSent(e)) => {
                        last_failure = Some(format!("the leader at {addr} is unreachable: {e}"));
                        // It died or is cut off: nobody to send to until the others elect
                        // another (or it is back), so wait for that, not a busy retry.
                        let _ = self
                            .raft
                            .wait(Some(UNREACHABLE_LEADER_WAIT))
                            .metrics(|m| m.current_leader != leader, "a leader change")
                            .await;
                    }
                    Err(CallError::Unanswered(e)) if idempotent => {
                        last_failure = Some(format!("the leader at {addr} did not answer: {e}"))
                    }
                    Err(CallError::Unanswered(e)) => {
                        return Err(ClusterError::Unavailable(format!(
                            "the leader at {addr} did not answer ({e}); the write's outcome is unknown: \
                             retry it with a producer id to apply it once"
                        )))
                    }
                }
            }
            if Instant::now() >= deadline {
                let last = last_failure.map_or(String::new(), |why| format!(" (last: {why})"));
                return Err(ClusterError::Unavailable(format!(
                    "no leader took the request within {LEADER_WAIT:?}{last}; is a majority of the nodes up?"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Proposes `payload` and returns its index and what applying it answered. An
    /// `idempotent` payload (a write with a producer tag) is proposed again when the outcome
    /// of an attempt is unknown.
    pub(crate) async fn propose(
        &self,
        payload: Payload,
        idempotent: bool,
    ) -> Result<(u64, Outcome), ClusterError> {
        self.on_leader(transport::CLIENT_WRITE, &payload.0, idempotent, || {
            client_write(&self.raft, payload.clone())
        })
        .await
    }

    /// Waits until this node has applied everything the leader had committed when asked
    /// (ReadIndex): a read after this sees every write acknowledged before it started. A
    /// follower asks the leader for that index (one round trip) and waits to apply it.
    pub(crate) async fn read_barrier(&self) -> Result<(), ClusterError> {
        let index = self
            .on_leader(transport::READ_INDEX, &[], true, || read_index(&self.raft))
            .await?;
        self.wait_applied(index).await
    }

    /// Adds or removes a voter, on the leader.
    pub(crate) async fn change_membership(
        &self,
        change: MembershipChange,
    ) -> Result<(), ClusterError> {
        let body =
            postcard::to_stdvec(&change).map_err(|e| ClusterError::Invalid(e.to_string()))?;
        self.on_leader(transport::MEMBERSHIP, &body, false, || {
            change_membership(&self.raft, change.clone())
        })
        .await
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
                failed_connects: 0,
                unreachable_ms: None,
            })
            .collect();
        for n in &mut nodes {
            if n.id == self.id {
                n.matched = m.last_log_index;
            } else {
                let reachability = self.dialer.reachability(&n.addrs.raft);
                n.failed_connects = reachability.failed_connects;
                n.unreachable_ms = reachability.down_for.map(|d| d.as_millis() as u64);
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
struct Forwarder {
    pools: Mutex<HashMap<String, Vec<Arc<tokio::sync::Mutex<Conn>>>>>,
    next: AtomicUsize,
    dialer: Dialer,
}

impl Forwarder {
    fn new(dialer: Dialer) -> Forwarder {
        Forwarder {
            pools: Mutex::default(),
            next: AtomicUsize::new(0),
            dialer,
        }
    }

    /// Sends a request to the node at `addr` and decodes its answer (a malformed one is an
    /// answer never had).
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        addr: &str,
        kind: u8,
        body: &[u8],
    ) -> Result<T, CallError> {
        let conn = {
            let mut pools = self.pools.lock().ignore_poison();
            let pool = pools.entry(addr.to_string()).or_insert_with(|| {
                (0..FORWARD_CONNECTIONS)
                    .map(|_| Conn::new(addr.to_string(), self.dialer.clone()))
                    .map(|conn| Arc::new(tokio::sync::Mutex::new(conn)))
                    .collect()
            });
            pool.iter()
                .find(|c| c.try_lock().is_ok())
                .unwrap_or(&pool[self.next.fetch_add(1, Ordering::Relaxed) % pool.len()])
                .clone()
        };
        let mut conn = conn.lock().await;
        let resp = conn
            .call(kind, &[body], FORWARD_TIMEOUT, async |_, _| Ok(()))
            .await?;
        postcard::from_bytes(&resp).map_err(|e| {
            CallError::Unanswered(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a malformed answer: {e}"),
            ))
        })
    }
}

//! openraft's network traits over [`crate::transport`], and the server side that hands
//! received messages to the local [`Raft`].

use std::future::Future;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, VoteRequest,
    VoteResponse,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tidemark_engine::tier::TIER_SOURCE_FILE;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpListener;

use super::append_frame;
use super::state_machine::{Snapshot, SnapshotDir};
use super::{io_error, NodeAddrs, NodeId, Outcome, Payload, Raft, SnapshotMeta, TypeConfig, Vote};
use crate::conn::Conn;
use crate::dialer::Dialer;
use crate::hello;
use crate::transport::{self, Isolation};

mod pipeline;

use pipeline::Pipeline;

/// Opens one [`Network`] (one connection) per target and purpose.
pub struct NetworkFactory {
    pub dialer: Dialer,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Network;

    async fn new_client(&mut self, target: NodeId, node: &NodeAddrs) -> Network {
        Network {
            target,
            conn: Conn::new(node.raft.clone(), self.dialer.clone()),
            dialer: self.dialer.clone(),
            idle_pipeline: None,
        }
    }
}

pub struct Network {
    target: NodeId,
    conn: Conn,
    dialer: Dialer,
    /// The connection of the last `stream_append` that ended cleanly, for the next one.
    idle_pipeline: Option<Pipeline>,
}

/// Why the leader did not do what a follower forwarded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Refused {
    /// This node is not the leader (the leader is the one named, if known): nothing was done.
    NotLeader { leader: Option<NodeId> },
    /// A membership change was refused.
    Membership(String),
    /// It failed or its outcome is unknown.
    Failed(String),
}

impl From<crate::ClusterError> for Refused {
    fn from(e: crate::ClusterError) -> Refused {
        match e {
            crate::ClusterError::Membership(why) => Refused::Membership(why),
            crate::ClusterError::NotLeader => Refused::NotLeader { leader: None },
            other => Refused::Failed(other.to_string()),
        }
    }
}

/// A change of the voters, as forwarded to the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MembershipChange {
    Add { id: NodeId, addrs: NodeAddrs },
    Remove { id: NodeId },
}

/// What a snapshot transfer starts with; the files' bytes follow in chunk frames.
#[derive(Serialize, Deserialize)]
struct SnapshotOffer {
    vote: Vote,
    meta: SnapshotMeta,
    files: Vec<(String, u64)>,
}

/// Decodes a snapshot offer and checks its file names, as a receiving node does.
pub(crate) fn decode_offer(bytes: &[u8]) {
    if let Ok(offer) = decode::<SnapshotOffer>(bytes) {
        for (name, _) in &offer.files {
            let _ = safe_relative(name);
        }
    }
}

fn encode<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    postcard::to_stdvec(value).map_err(io_error)
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    postcard::from_bytes(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn rpc_error(e: io::Error) -> RPCError<TypeConfig> {
    match e.kind() {
        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotConnected => {
            RPCError::Unreachable(Unreachable::new(&e))
        }
        _ => RPCError::Network(NetworkError::new(&e)),
    }
}

impl Network {
    async fn rpc<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        kind: u8,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let body = encode(req).map_err(rpc_error)?;
        self.call(kind, &[&body], option).await
    }

    /// Sends a request whose body is `parts` back to back and decodes the answer.
    async fn call<Resp: DeserializeOwned>(
        &mut self,
        kind: u8,
        parts: &[&[u8]],
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let resp = self
            .conn
            .call(kind, parts, option.hard_ttl(), async |_, _| Ok(()))
            .await
            .map_err(|e| rpc_error(e.into()))?;
        let result: Result<Resp, String> = decode(&resp).map_err(rpc_error)?;
        result.map_err(|e| {
            RPCError::Network(NetworkError::from_string(format!(
                "node {}: {e}",
                self.target
            )))
        })
    }
}

impl RaftNetworkV2<TypeConfig> for Network {
    type SnapshotData = SnapshotDir;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        // openraft replicates through `stream_append`; this one-off form shares its layout.
        let outgoing = append_frame::Outgoing::of(rpc, Vec::new()).map_err(rpc_error)?;
        self.call(transport::APPEND_ENTRIES, &outgoing.parts(), &option)
            .await
    }

    /// Pipelined replication (`network/pipeline.rs`): requests are written as openraft
    /// produces them, up to 8 ahead of their answers, on a connection of their own. The
    /// stream ends at the first error, conflict or partial success (openraft then starts a
    /// new one from where the follower is).
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        let addr = self.conn.addr().to_string();
        let dialer = self.dialer.clone();
        Box::pin(async move {
            dialer.check().map_err(rpc_error)?;
            // Connect only once there is a request to send: openraft delays the first request
            // of a stream after failures (its backoff), and connecting before that would retry
            // an unreachable peer in a tight loop.
            let mut input = input;
            let Some(first) = input.next().await else {
                return Ok(Box::pin(futures_util::stream::empty()) as BoxStream<'s, _>);
            };
            let reused = self
                .idle_pipeline
                .take()
                .and_then(|mut p| p.is_reusable().then_some(p));
            let pipeline = match reused {
                Some(p) => p,
                None => Pipeline::connect(&dialer, &addr, option.soft_ttl())
                    .await
                    .map_err(rpc_error)?,
            };
            Ok(pipeline.stream(
                first,
                input,
                dialer.isolation().clone(),
                option.soft_ttl(),
                &mut self.idle_pipeline,
            ))
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.rpc(transport::VOTE, &rpc, &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.rpc(transport::PRE_VOTE, &rpc, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let dir = snapshot.snapshot.0.clone();
        let files = snapshot_files(&dir).map_err(|e| StreamingError::from(rpc_error(e)))?;
        let offer = SnapshotOffer {
            vote,
            meta: snapshot.meta,
            files: files
                .iter()
                .map(|(name, len)| (name.clone(), *len))
                .collect(),
        };
        let body = encode(&offer).map_err(|e| StreamingError::from(rpc_error(e)))?;
        let parts: [&[u8]; 1] = [&body];
        let send = self.conn.call(
            transport::SNAPSHOT_BEGIN,
            &parts,
            option.hard_ttl(),
            async |w, id| {
                for (name, _) in &files {
                    let mut file = tokio::fs::File::open(dir.join(name)).await?;
                    let mut chunk = vec![0; transport::CHUNK_BYTES];
                    loop {
                        let n = tokio::io::AsyncReadExt::read(&mut file, &mut chunk).await?;
                        if n == 0 {
                            break;
                        }
                        transport::write_frame(w, transport::SNAPSHOT_CHUNK, id, &chunk[..n])
                            .await?;
                    }
                }
                Ok(())
            },
        );
        tokio::pin!(cancel);
        let resp = tokio::select! {
            closed = &mut cancel => return Err(StreamingError::Closed(closed)),
            resp = send => resp.map_err(|e| StreamingError::from(rpc_error(e.into())))?,
        };
        let result: Result<SnapshotResponse<TypeConfig>, String> =
            decode(&resp).map_err(|e| StreamingError::from(rpc_error(e)))?;
        result.map_err(|e| {
            StreamingError::Network(NetworkError::from_string(format!(
                "node {}: {e}",
                self.target
            )))
        })
    }
}

/// The files of a snapshot directory, relative paths and sizes, MANIFEST and state first.
fn snapshot_files(dir: &Path) -> io::Result<Vec<(String, u64)>> {
    let mut files = Vec::new();
    for name in ["MANIFEST", "state"] {
        files.push((name.to_string(), std::fs::metadata(dir.join(name))?.len()));
    }
    // Where its tiered segments' objects are, when it has any.
    match std::fs::metadata(dir.join(TIER_SOURCE_FILE)) {
        Ok(meta) => files.push((TIER_SOURCE_FILE.to_string(), meta.len())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut segments: Vec<(String, u64)> = Vec::new();
    for entry in std::fs::read_dir(dir.join("segments"))? {
        let entry = entry?;
        let name = format!("segments/{}", entry.file_name().to_string_lossy());
        segments.push((name, entry.metadata()?.len()));
    }
    segments.sort();
    files.extend(segments);
    Ok(files)
}

/// A relative path a peer may name in a snapshot: plain names under the snapshot directory.
fn safe_relative(name: &str) -> Option<PathBuf> {
    let path = Path::new(name);
    let ok = path.components().all(|c| matches!(c, Component::Normal(_)))
        && (["MANIFEST", "state", TIER_SOURCE_FILE].contains(&name)
            || name.starts_with("segments/"))
        && path.components().count() <= 2;
    ok.then(|| path.to_path_buf())
}

/// What other nodes forward to the leader: writes (answered with the entry's index and
/// outcome), ReadIndex requests, membership changes.
pub trait LeaderRequests: Send + Sync + 'static {
    fn write(
        &self,
        payload: Payload,
    ) -> impl Future<Output = Result<(u64, Outcome), Refused>> + Send;
    /// The leader's commit index, confirmed by a quorum (ReadIndex).
    fn read_index(&self) -> impl Future<Output = Result<u64, Refused>> + Send;
    fn membership(
        &self,
        change: MembershipChange,
    ) -> impl Future<Output = Result<(), Refused>> + Send;
}

/// Node-to-node connections that presented the secret, open at once from every peer
/// together: each peer opens about a dozen (replication, heartbeats, votes, snapshots,
/// pools of forwarded writes), so this is far above what a cluster of up to ~20 nodes
/// uses. One more is closed after its HELLO. (Connections not yet past their HELLO are
/// bounded apart: `hello::Doorway`.)
pub const MAX_CONNECTIONS: usize = 256;

/// Serves the node-to-node transport on `listener` until the task is dropped, which closes
/// every connection it accepted too (as a process that dies would). A connection is served
/// once it presented `secret` (`crate::hello`).
pub async fn serve<W: LeaderRequests>(
    listener: TcpListener,
    raft: Raft,
    incoming: PathBuf,
    writes: Arc<W>,
    isolation: Isolation,
    secret: Option<Arc<str>>,
) {
    let mut next = 0u64;
    let mut connections = tokio::task::JoinSet::new();
    let doorway = hello::Doorway::default();
    let admitted = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a Raft connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if isolation.check().is_err() {
            continue;
        }
        next += 1;
        let arrival = doorway.arrive();
        let (raft, writes, incoming, isolation, secret, admitted) = (
            raft.clone(),
            writes.clone(),
            incoming.join(format!("conn-{next}")),
            isolation.clone(),
            secret.clone(),
            admitted.clone(),
        );
        connections.spawn(async move {
            let Ok(mut halves) = transport::buffered(stream) else {
                return;
            };
            let hello = arrival.expect(&mut halves, secret.as_deref(), hello::HELLO_TIMEOUT);
            if let Err(e) = hello.await {
                // At debug: anyone can connect, and each refusal would be a line. A peer
                // refused for its secret logs it itself, once (`dialer`).
                tracing::debug!(%peer, error = %e, "a node-to-node connection was refused");
                return;
            }
            let Ok(_admitted) = admitted.try_acquire_owned() else {
                tracing::warn!(%peer, limit = MAX_CONNECTIONS, "too many node-to-node connections; closing a new one");
                return;
            };
            let (mut r, mut w) = halves;
            let served = serve_connection(
                &raft,
                &mut r,
                &mut w,
                &incoming,
                writes.as_ref(),
                &isolation,
            );
            if let Err(e) = served.await {
                if e.kind() != io::ErrorKind::UnexpectedEof {
                    tracing::debug!(%peer, error = %e, "a Raft connection ended");
                }
            }
            let _ = tokio::fs::remove_dir_all(&incoming).await;
        });
    }
}

async fn serve_connection<W: LeaderRequests>(
    raft: &Raft,
    r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    w: &mut BufWriter<tokio::net::tcp::OwnedWriteHalf>,
    incoming: &Path,
    writes: &W,
    isolation: &Isolation,
) -> io::Result<()> {
    let mut received = 0u64;
    loop {
        let (kind, id, len) = transport::read_header(r).await?;
        // Each body gets a buffer of its own: an AppendEntries' payloads and a forwarded
        // write become entries whose bytes are slices of it.
        let request = transport::read_owned_body(r, len).await?;
        isolation.check()?;
        let body = match kind {
            transport::APPEND_ENTRIES => {
                let req = append_frame::decode(request)?;
                encode(&raft.append_entries(req).await.map_err(|e| e.to_string()))?
            }
            transport::VOTE => {
                let req = decode(&request)?;
                encode(&raft.vote(req).await.map_err(|e| e.to_string()))?
            }
            transport::PRE_VOTE => {
                let req = decode(&request)?;
                encode(&raft.pre_vote(req).await.map_err(|e| e.to_string()))?
            }
            transport::SNAPSHOT_BEGIN => {
                received += 1;
                let offer: SnapshotOffer = decode(&request)?;
                let dir = incoming.join(format!("snapshot-{received}"));
                receive_files(r, &dir, &offer.files).await?;
                let snapshot = Snapshot {
                    meta: offer.meta,
                    snapshot: SnapshotDir(dir),
                };
                encode(
                    &raft
                        .install_full_snapshot(offer.vote, snapshot)
                        .await
                        .map_err(|e| e.to_string()),
                )?
            }
            transport::CLIENT_WRITE => encode(&writes.write(Payload(request)).await)?,
            transport::READ_INDEX => encode(&writes.read_index().await)?,
            transport::MEMBERSHIP => {
                let change = decode(&request)?;
                encode(&writes.membership(change).await)?
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown frame kind {other}"),
                ));
            }
        };
        transport::write_frame(w, kind | transport::RESPONSE, id, &body).await?;
        w.flush().await?;
    }
}

/// Writes the offered files from the chunk frames that follow the offer into `dir`.
async fn receive_files(
    r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    dir: &Path,
    files: &[(String, u64)],
) -> io::Result<()> {
    let mut chunk = Vec::new();
    if tokio::fs::try_exists(dir).await? {
        tokio::fs::remove_dir_all(dir).await?;
    }
    tokio::fs::create_dir_all(dir.join("segments")).await?;
    for (name, len) in files {
        let relative = safe_relative(name).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("snapshot file name {name:?}"),
            )
        })?;
        let mut file = tokio::fs::File::create(dir.join(relative)).await?;
        let mut left = *len;
        while left > 0 {
            let (kind, _) = transport::read_frame_into(r, &mut chunk).await?;
            if kind != transport::SNAPSHOT_CHUNK || chunk.len() as u64 > left {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a snapshot chunk that does not fit the offer",
                ));
            }
            file.write_all(&chunk).await?;
            left -= chunk.len() as u64;
        }
        file.sync_all().await?;
    }
    std::fs::File::open(dir.join("segments"))?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use openraft::vote::{RaftLeaderId, RaftVote};

    use super::*;

    /// A follower stand-in: counts the connections it accepts, answers every AppendEntries
    /// with success, and closes a connection after answering `close_after` requests on it.
    async fn fake_follower(listener: TcpListener, accepted: Arc<AtomicUsize>, close_after: usize) {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            accepted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut halves = transport::buffered(stream).unwrap();
                crate::hello::expect(&mut halves, None, crate::hello::HELLO_TIMEOUT)
                    .await
                    .unwrap();
                let (mut r, mut w) = halves;
                let mut body = Vec::new();
                for _ in 0..close_after {
                    let Ok((kind, id)) = transport::read_frame_into(&mut r, &mut body).await else {
                        return;
                    };
                    assert_eq!(kind, transport::APPEND_ENTRIES);
                    append_frame::decode(bytes::Bytes::copy_from_slice(&body)).unwrap();
                    let answer: Result<AppendEntriesResponse<TypeConfig>, String> =
                        Ok(AppendEntriesResponse::Success);
                    let answer = encode(&answer).unwrap();
                    transport::write_frame(&mut w, kind | transport::RESPONSE, id, &answer)
                        .await
                        .unwrap();
                    w.flush().await.unwrap();
                }
            });
        }
    }

    /// Runs one replication stream of a single request to completion.
    async fn one_stream(network: &mut Network) {
        let leader = openraft::alias::LeaderIdOf::<TypeConfig>::new(1, 1);
        let request = AppendEntriesRequest {
            vote: Vote::from_leader_id(leader, true),
            prev_log_id: None,
            leader_commit: None,
            entries: vec![],
        };
        let input = futures_util::stream::iter(vec![request]);
        let option = RPCOption::new(Duration::from_secs(5));
        let answers: Vec<_> = network
            .stream_append(input, option)
            .await
            .unwrap()
            .collect()
            .await;
        assert_eq!(answers.len(), 1);
        assert!(matches!(answers[0], Ok(Ok(_))), "{answers:?}");
    }

    #[tokio::test]
    async fn a_pipeline_serves_the_next_stream_until_the_peer_closes_it() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addrs = NodeAddrs {
            raft: listener.local_addr().unwrap().to_string(),
            ..NodeAddrs::default()
        };
        let accepted = Arc::new(AtomicUsize::new(0));
        let follower = tokio::spawn(fake_follower(listener, accepted.clone(), 2));
        let mut factory = NetworkFactory {
            dialer: Dialer::default(),
        };
        let mut network = factory.new_client(2, &addrs).await;

        one_stream(&mut network).await;
        one_stream(&mut network).await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "two streams, one connection"
        );

        // The follower has closed that connection after its second answer: the next stream
        // must notice and connect again rather than fail on the dead one.
        tokio::time::sleep(Duration::from_millis(200)).await;
        one_stream(&mut network).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        follower.abort();
    }

    #[test]
    fn snapshot_file_names_stay_inside_the_snapshot() {
        assert!(safe_relative("MANIFEST").is_some());
        assert!(safe_relative(TIER_SOURCE_FILE).is_some());
        assert!(safe_relative("segments/000000000001.seg").is_some());
        for bad in [
            "../x",
            "/etc/passwd",
            "segments/../../x",
            "segments/a/b",
            "other",
            "",
        ] {
            assert!(safe_relative(bad).is_none(), "{bad}");
        }
    }
}

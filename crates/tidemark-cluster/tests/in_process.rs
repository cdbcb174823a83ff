//! Three nodes in one process on 127.0.0.1: replication, failover, idempotent producers,
//! catch-up of a node whose data was deleted. (The same with real processes and SIGKILL is
//! in the `tidemark` crate's tests.)

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidemark_cluster::{Cluster, ClusterAck, ClusterConfig, ClusterError};
use tidemark_core::{BatchBuilder, Command, EventBatch, ProducerSeq, Schema, Value};
use tidemark_engine::{Options, ScanRequest};

async fn create(node: &Cluster, name: &str) -> Result<ClusterAck, ClusterError> {
    let schema = schema();
    let name = name.to_string();
    node.submit(Command::CreateStream {
        name,
        schema,
        evolving: false,
        partition: tidemark_core::Partition::DAY,
    })
    .await
}

async fn drop_stream(node: &Cluster, name: &str) -> Result<ClusterAck, ClusterError> {
    let name = name.to_string();
    node.submit(Command::DropStream { name }).await
}

/// The tag of batch `sequence` of `producer` (the cluster numbers its parts).
fn tag(producer: u64, sequence: u64) -> Option<ProducerSeq> {
    Some(ProducerSeq {
        producer,
        sequence,
        part: 0,
    })
}

fn config(n: usize) -> ClusterConfig {
    let mut config = ClusterConfig::on_free_ports(n as u64).unwrap();
    config.timing.snapshot_every_entries = 40;
    config.max_entry_bytes = 64 << 10;
    config
}

fn schema() -> Schema {
    Schema::parse_spec("K:INTEGER,S:STRING").unwrap()
}

fn batch(from: i64, n: i64) -> EventBatch {
    let mut b = BatchBuilder::new(Arc::new(schema()), 0);
    for i in from..from + n {
        b.push_row(
            i,
            None,
            &[
                Value::Integer(i as i32),
                Value::String(format!("event {i}")),
            ],
        )
        .unwrap();
    }
    b.finish()
}

fn timestamps(cluster: &Cluster) -> Vec<i64> {
    let db = cluster.db();
    let Ok(scan) = db.scan("s", &ScanRequest::default()) else {
        return Vec::new();
    };
    scan.flat_map(|b| b.unwrap().tstart().to_vec()).collect()
}

async fn start(id: u64, dir: &Path, config: &ClusterConfig) -> Arc<Cluster> {
    let options = Options {
        memtable_bytes: 32 << 10,
        ..Options::default()
    };
    Cluster::start(id, &dir.join(format!("n{id}")), config, options)
        .await
        .unwrap()
}

async fn start_all(dir: &Path, config: &ClusterConfig) -> Vec<Arc<Cluster>> {
    let mut nodes = Vec::new();
    for n in &config.nodes {
        nodes.push(start(n.id, dir, config).await);
    }
    nodes
}

async fn shutdown_all(nodes: &[Arc<Cluster>]) {
    for n in nodes {
        n.shutdown().await;
    }
}

/// Every node but `not`.
fn others(nodes: &[Arc<Cluster>], not: &Cluster) -> Vec<Arc<Cluster>> {
    nodes
        .iter()
        .filter(|n| n.id() != not.id())
        .cloned()
        .collect()
}

async fn leader(nodes: &[Arc<Cluster>]) -> Arc<Cluster> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for n in nodes {
            let s = n.status();
            if s.leader == Some(s.node) {
                return n.clone();
            }
        }
        assert!(Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn converge(nodes: &[Arc<Cluster>], expected: &[i64]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for n in nodes {
        loop {
            let got = timestamps(n);
            if got == expected {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {} has {} events, expected {}",
                n.id(),
                got.len(),
                expected.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicates_fails_over_deduplicates_and_catches_up_by_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(3);
    let mut nodes = start_all(dir.path(), &config).await;
    let first = leader(&nodes).await;
    // Writes through a follower are forwarded to the leader.
    let follower = nodes.iter().find(|n| n.id() != first.id()).unwrap().clone();
    create(&follower, "s").await.unwrap();
    let mut expected = Vec::new();
    for i in 0..30 {
        let via = &nodes[i % 3];
        via.append("s", &batch(i as i64 * 100, 100), None)
            .await
            .unwrap();
        expected.extend(i as i64 * 100..i as i64 * 100 + 100);
    }
    // A batch above the entry cap is split, and acknowledged whole.
    let big = batch(3000, 5000);
    let ack = nodes[0].append("s", &big, tag(9, 1)).await.unwrap();
    assert!(ack.parts > 1, "{ack:?}");
    assert_eq!(ack.events, 5000);
    expected.extend(3000..8000);
    // The same producer sequence again is a duplicate, applied once.
    let again = nodes[1].append("s", &big, tag(9, 1)).await.unwrap();
    assert!(again.duplicate && again.events == 0, "{again:?}");
    converge(&nodes, &expected).await;
    // Every node fsync'd the entries into its Raft log, and counts them like an embedded log.
    for node in &nodes {
        let log = node.db().log_stats();
        assert!(
            log.groups > 0 && log.records >= 30,
            "node {}: {log:?}",
            node.id()
        );
        assert!(log.groups <= log.records && log.bytes > 5000 * 8, "{log:?}");
        assert_eq!(log.fsync_buckets.iter().sum::<u64>(), log.groups);
    }

    // Stop the leader: the others elect a new one and keep accepting writes.
    let old = leader(&nodes).await;
    old.shutdown().await;
    let rest = others(&nodes, &old);
    let new = leader(&rest).await;
    assert_ne!(new.id(), old.id());
    for i in 80..120 {
        rest[i % 2]
            .append("s", &batch(i as i64 * 100, 100), tag(10, i as u64))
            .await
            .unwrap();
        expected.extend(i as i64 * 100..i as i64 * 100 + 100);
    }
    converge(&rest, &expected).await;

    // The stopped node comes back with its data directory deleted: it catches up by a
    // snapshot (the log before it is purged) plus the log after it.
    let old_id = old.id();
    drop(old);
    nodes.retain(|n| n.id() != old_id);
    std::fs::remove_dir_all(dir.path().join(format!("n{old_id}"))).unwrap();
    // Its Raft port may take a moment to be released by the stopped server task.
    let back = loop {
        match Cluster::start(
            old_id,
            &dir.path().join(format!("n{old_id}")),
            &config,
            Options::default(),
        )
        .await
        {
            Ok(c) => break c,
            Err(ClusterError::Config(e)) if e.contains("binding") => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    nodes.push(back.clone());
    converge(&nodes, &expected).await;
    let status = back.status();
    assert!(
        status.snapshot.is_some(),
        "caught up by snapshot: {status:?}"
    );
    shutdown_all(&nodes).await;
}

/// A leader cut off from its peers by a partition (not a crash: it keeps running and
/// taking writes) acknowledges nothing while cut off; the majority elects a new leader
/// within the bound `docs/cluster.md` states and goes on; when the partition heals, the
/// producer's retry of its unanswered batch is applied once, and every node ends with
/// exactly the acknowledged events, in the same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_leader_acknowledges_nothing_and_rejoins() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(3);
    let nodes = start_all(dir.path(), &config).await;
    let old = leader(&nodes).await;
    create(&old, "s").await.unwrap();
    let mut expected = Vec::new();
    for i in 0..10 {
        old.append("s", &batch(i * 100, 100), None).await.unwrap();
        expected.extend(i * 100..i * 100 + 100);
    }
    converge(&nodes, &expected).await;

    old.isolate(true);
    let cut_off = Instant::now();
    let tag = tag(7, 1);
    let stranded = tokio::spawn({
        let old = old.clone();
        async move { old.append("s", &batch(50_000, 100), tag).await }
    });
    let rest = others(&nodes, &old);
    let new = leader(&rest).await;
    let elected_in = cut_off.elapsed();
    assert!(elected_in < Duration::from_secs(5), "{elected_in:?}");
    for i in 10..20 {
        rest[i as usize % 2]
            .append("s", &batch(i * 100, 100), None)
            .await
            .unwrap();
        expected.extend(i * 100..i * 100 + 100);
    }
    converge(&rest, &expected).await;
    let first_attempt = if stranded.is_finished() {
        let outcome = stranded.await.unwrap();
        assert!(outcome.is_err(), "acknowledged while cut off: {outcome:?}");
        outcome
    } else {
        // Heal: the old leader hears of the new term and steps down; its stranded write
        // fails, or is committed by the new leader after all.
        old.isolate(false);
        tokio::time::timeout(Duration::from_secs(30), stranded)
            .await
            .expect("the stranded write ends once the partition heals")
            .unwrap()
    };
    old.isolate(false);
    let retry = rest[0].append("s", &batch(50_000, 100), tag).await.unwrap();
    assert_eq!(retry.duplicate, first_attempt.is_ok(), "{first_attempt:?}");
    expected.extend(50_000..50_100);
    converge(&nodes, &expected).await;
    // The old leader follows the leader the others follow.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let followed = old.status().leader;
        if followed != Some(old.id()) && followed == new.status().leader {
            break;
        }
        assert!(Instant::now() < deadline, "{:?}", old.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown_all(&nodes).await;
}

/// A write through a follower that has not yet applied the stream's creation (it was cut
/// off while the others created it) is not refused by the follower's stale replica: it
/// catches up first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lagging_follower_accepts_writes_to_a_stream_created_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(3);
    let nodes = start_all(dir.path(), &config).await;
    let first = leader(&nodes).await;
    let lagging = others(&nodes, &first)[0].clone();
    lagging.isolate(true);
    create(&first, "s").await.unwrap();
    assert!(
        lagging.db().stream_schema("s").is_err(),
        "the cut-off follower has not applied the creation"
    );
    lagging.isolate(false);
    lagging
        .append("s", &batch(0, 100), None)
        .await
        .expect("the follower catches up before it checks the stream");
    converge(&nodes, &(0..100).collect::<Vec<_>>()).await;
    shutdown_all(&nodes).await;
}

/// What one writer saw: the timestamps acknowledged, and those whose outcome it was told
/// is unknown.
#[derive(Default)]
struct Writes {
    acknowledged: Vec<i64>,
    unknown: Vec<i64>,
}

/// Writes one event every 20 ms through `via` until `stop`, with producer tags from
/// `producer` (sequence = timestamp) or without.
async fn write_until(
    via: Arc<Cluster>,
    first: i64,
    producer: Option<u64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Writes {
    let mut writes = Writes::default();
    let mut ts = first;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let tag = producer.and_then(|p| tag(p, ts as u64));
        match via.append("s", &batch(ts, 1), tag).await {
            Ok(_) => writes.acknowledged.push(ts),
            Err(e) => {
                let message = e.to_string();
                assert!(
                    message.contains("outcome is unknown"),
                    "write {ts} failed: {message}"
                );
                writes.unknown.push(ts);
            }
        }
        ts += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    writes
}

/// The leader dies while writes go through a follower: they wait for the new leader
/// instead of failing (a write with a producer tag always; one without only when it was on
/// its way to the dead leader, reported as of unknown outcome), and the new leader retries
/// the dead node with backoff, not in a tight loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_through_a_follower_wait_out_a_failover_and_the_dead_leader_is_retried_with_backoff()
{
    let dir = tempfile::tempdir().unwrap();
    let config = config(3);
    let nodes = start_all(dir.path(), &config).await;
    let old = leader(&nodes).await;
    create(&old, "s").await.unwrap();
    let via = others(&nodes, &old)[0].clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tagged = tokio::spawn(write_until(via.clone(), 0, Some(5), stop.clone()));
    let untagged = tokio::spawn(write_until(via.clone(), 1_000_000, None, stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    old.shutdown().await;
    let rest = others(&nodes, &old);
    let new = leader(&rest).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (tagged, untagged) = (tagged.await.unwrap(), untagged.await.unwrap());
    assert!(
        tagged.unknown.is_empty(),
        "tagged writes are retried until applied once: {:?}",
        tagged.unknown
    );
    assert!(
        untagged.unknown.len() <= 1,
        "only a write on its way to the dead leader is unknown: {:?}",
        untagged.unknown
    );
    assert!(tagged.acknowledged.len() > 20 && untagged.acknowledged.len() > 20);

    // Every acknowledged event is on both live nodes, once; an unknown one at most once.
    let mut expected: Vec<i64> = tagged
        .acknowledged
        .iter()
        .chain(&untagged.acknowledged)
        .copied()
        .collect();
    expected.sort_unstable();
    let present = timestamps(&new);
    let mut acknowledged_present: Vec<i64> = present
        .iter()
        .copied()
        .filter(|ts| !untagged.unknown.contains(ts))
        .collect();
    acknowledged_present.sort_unstable();
    assert_eq!(acknowledged_present, expected);
    assert!(present.len() - expected.len() <= untagged.unknown.len());

    // The new leader keeps trying the dead node, at a bounded rate: heartbeats ten times a
    // second, replication with backoff. (Retrying at once after each failure made hundreds
    // of attempts a second while writes were coming in.)
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dead = new
        .status()
        .nodes
        .into_iter()
        .find(|n| n.id == old.id())
        .expect("the dead node is still a member");
    let down_s = dead.unreachable_ms.expect("the dead node is unreachable") as f64 / 1000.0;
    assert!(down_s > 2.0, "{dead:?}");
    let per_second = dead.failed_connects as f64 / down_s;
    assert!(
        per_second < 25.0,
        "{per_second:.0} attempts a second: {dead:?}"
    );
    shutdown_all(&rest).await;
}

/// A catalog change through a follower is answered once the follower has applied it, so
/// the caller reads it back from the node it asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_created_through_a_follower_is_there_when_the_follower_answers() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(3);
    let nodes = start_all(dir.path(), &config).await;
    let first = leader(&nodes).await;
    let follower = others(&nodes, &first)[0].clone();
    for i in 0..30 {
        let name = format!("x{i}");
        create(&follower, &name).await.unwrap();
        assert!(
            follower.db().stream_schema(&name).is_ok(),
            "{name} is not on the follower that created it"
        );
        drop_stream(&follower, &name).await.unwrap();
        assert!(
            follower.db().stream_schema(&name).is_err(),
            "{name} dropped"
        );
    }
    // A stream setting is a command like any other: replicated, and every node's appends
    // are checked against it.
    create(&follower, "late").await.unwrap();
    let window = Command::SetOutOfOrderWindow {
        name: "late".into(),
        window_ns: Some(1_000),
    };
    follower.submit(window).await.unwrap();
    first.read_barrier().await.unwrap();
    for node in &nodes {
        node.read_barrier().await.unwrap();
        let info = node.db().stream_info("late").unwrap();
        assert_eq!(
            info.out_of_order_window_ns,
            Some(1_000),
            "node {}",
            node.id()
        );
    }
    follower
        .append("late", &batch(10_000, 1), None)
        .await
        .unwrap();
    let refused = first.append("late", &batch(5_000, 1), None).await;
    assert!(
        refused.is_err(),
        "5 us before the newest event: {refused:?}"
    );
    shutdown_all(&nodes).await;
}

/// Fields added to an evolving stream are a replicated command: every node grows the schema
/// at the same place in the log, a batch checked before the change and applied after it is
/// widened, and the schema and the flag survive a restart of every node (log and snapshot).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fields_added_to_an_evolving_stream_reach_every_node_and_survive_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(3);
    let nodes = start_all(dir.path(), &config).await;
    let first_leader = leader(&nodes).await;
    let follower = others(&nodes, &first_leader)[0].clone();
    follower
        .submit(Command::CreateStream {
            name: "s".into(),
            schema: schema(),
            evolving: true,
            partition: tidemark_core::Partition::DAY,
        })
        .await
        .unwrap();
    follower.append("s", &batch(0, 10), None).await.unwrap();
    let added = vec![tidemark_core::Field::new(
        "X",
        tidemark_core::FieldType::Long,
    )];
    first_leader
        .submit(Command::AddFields {
            name: "s".into(),
            fields: added.clone(),
        })
        .await
        .unwrap();
    // Built under the old schema, through a node that may not have applied the change yet.
    follower.append("s", &batch(10, 10), None).await.unwrap();
    let wide = Arc::new(schema().with_added(&added).unwrap());
    let mut b = BatchBuilder::new(wide.clone(), 0);
    for i in 20..60 {
        b.push_row(
            i,
            None,
            &[
                Value::Integer(i as i32),
                Value::String(format!("event {i}")),
                Value::Long(i * 10),
            ],
        )
        .unwrap();
    }
    let later = b.finish();
    // One event per append, so that the log passes the snapshot interval.
    for row in 0..later.len() as u32 {
        first_leader
            .append("s", &later.take(&[row]), None)
            .await
            .unwrap();
    }
    let expected: Vec<i64> = (0..60).collect();
    converge(&nodes, &expected).await;
    let check = |nodes: &[Arc<Cluster>]| {
        for n in nodes {
            let db = n.db();
            assert_eq!(db.stream_schema("s").unwrap(), wide, "node {}", n.id());
            assert!(db.stream_is_evolving("s").unwrap());
            let xs: Vec<Value> = db
                .scan("s", &ScanRequest::default())
                .unwrap()
                .flat_map(|batch| {
                    let batch = batch.unwrap();
                    (0..batch.len())
                        .map(move |r| batch.column(2).value(r))
                        .collect::<Vec<_>>()
                })
                .collect();
            let want: Vec<Value> = (0..60)
                .map(|i| {
                    if i < 20 {
                        Value::Null
                    } else {
                        Value::Long(i * 10)
                    }
                })
                .collect();
            assert_eq!(xs, want, "node {}", n.id());
        }
    };
    check(&nodes);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !nodes.iter().all(|n| n.status().snapshot.is_some()) {
        assert!(Instant::now() < deadline, "no snapshot after 45 entries");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown_all(&nodes).await;
    // Every handle on the nodes goes, so that their directories are free to open again.
    drop((nodes, first_leader, follower));
    let nodes = start_all(dir.path(), &config).await;
    leader(&nodes).await;
    converge(&nodes, &expected).await;
    check(&nodes);
    shutdown_all(&nodes).await;
}

/// Reads what a node answers on a raw connection to its Raft address until it closes it.
async fn answer_until_closed(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("the node closes a connection it refuses")
        .unwrap_or_default();
    answer
}

/// A frame header: body length, kind, request id (`tidemark_cluster::transport`).
fn header(len: u32, kind: u8) -> Vec<u8> {
    let mut frame = len.to_le_bytes().to_vec();
    frame.push(kind);
    frame.extend_from_slice(&7u64.to_le_bytes());
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_at_the_raft_address_is_refused_before_its_first_request_is_read() {
    use tidemark_cluster::{hello, transport};
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let config = config(1);
    assert!(config.secret.is_some(), "local clusters have a secret");
    let nodes = start_all(dir.path(), &config).await;
    leader(&nodes).await;
    let raft = config.nodes[0].raft.clone();

    // A forwarded write with no HELLO, and a header announcing 300 MiB: closed unanswered.
    for first in [
        [header(3, transport::CLIENT_WRITE), b"abc".to_vec()].concat(),
        header(300 << 20, transport::APPEND_ENTRIES),
    ] {
        let mut stream = tokio::net::TcpStream::connect(&raft).await.unwrap();
        stream.write_all(&first).await.unwrap();
        assert!(answer_until_closed(&mut stream).await.is_empty());
    }

    // A HELLO with a wrong secret: told why, then closed; what follows is never served.
    let mut stream = tokio::net::TcpStream::connect(&raft).await.unwrap();
    let wrong = b"not the cluster's secret";
    let mut frames = [header(wrong.len() as u32, hello::HELLO), wrong.to_vec()].concat();
    frames.extend([header(3, transport::CLIENT_WRITE), b"abc".to_vec()].concat());
    stream.write_all(&frames).await.unwrap();
    let answer = answer_until_closed(&mut stream).await;
    assert_eq!(answer[4], hello::HELLO | transport::RESPONSE, "{answer:?}");
    assert!(String::from_utf8_lossy(&answer[13..]).contains("secret"));
    assert_eq!(
        answer.len(),
        13 + u32::from_le_bytes(answer[..4].try_into().unwrap()) as usize,
        "one answer, to the HELLO only"
    );

    // The node still serves its peers, and wrote nothing a stranger sent.
    create(&nodes[0], "s").await.unwrap();
    assert!(timestamps(&nodes[0]).is_empty());
    shutdown_all(&nodes).await;
}

//! A three-node cluster of real processes on 127.0.0.1 under write load, one test per fault:
//! the leader killed with SIGKILL and restarted (`TIDEMARK_CLUSTER_KILLS` times, default 5),
//! paused with SIGSTOP for longer than the election timeout, a fourth node added and removed
//! again, a follower whose data directory was deleted catching up by snapshot. Writers
//! retry every batch whose outcome they did not see with the same producer id and sequence
//! number (two over HTTP with the header, one over the binary protocol with TAGGED_APPEND)
//! until it is acknowledged. After each fault every node holds every batch exactly once, in
//! the same order, with the same aggregates. Also: a stream that InfluxDB line protocol
//! creates and grows through a follower is the same on every node, an agent forwarding
//! to the cluster while its leader is killed stores what it acknowledged exactly once, and
//! a cluster tiering to S3Proxy loses nothing and orphans nothing when its leader dies in
//! the middle of an upload, or when a follower catches up by a snapshot of tiered segments.
//! Consumers following the stream through the leader kills (over HTTP, and over the binary
//! protocol's subscriptions), moving to another node after their last position each time
//! their node dies, see every event exactly once, in order.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tidemark_client::{BinaryClient, ClientError, HttpClient};
use tidemark_cluster::config::to_toml;
use tidemark_cluster::ClusterConfig;
use tidemark_core::sync::IgnorePoison;
use tidemark_core::{BatchBuilder, Schema, Value as CoreValue};
use tidemark_testkit::s3proxy::{S3Proxy, ACCESS_KEY, BUCKET, SECRET};

/// S3Proxy's test key, in the AWS environment variables every node reads (a tiering
/// cluster's nodes use it; the others ignore it).
const CREDENTIALS: [(&str, &str); 2] = [
    ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
    ("AWS_SECRET_ACCESS_KEY", SECRET),
];

/// A new leader must be known within this long after the old one dies (docs/cluster.md).
const ELECTION_BOUND: Duration = Duration::from_secs(5);
const EVENTS_PER_BATCH: u64 = 50;

struct Node {
    id: u64,
    http: String,
    raft: String,
    binary: String,
    config: PathBuf,
    dir: PathBuf,
    /// A server configuration with `[tier]`, for a tiering cluster.
    tier_config: Option<PathBuf>,
    child: Option<Child>,
}

impl Node {
    fn start(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args([
                "serve",
                "--node-id",
                &self.id.to_string(),
                "--cluster-config",
            ])
            .arg(&self.config)
            .arg("--data-dir")
            .arg(&self.dir)
            .args(
                self.tier_config
                    .iter()
                    .flat_map(|c| [Path::new("--config"), c]),
            )
            .envs(CREDENTIALS)
            .stdout(Stdio::null())
            .stderr(self.log())
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Each node's log goes to a file beside its data, appended over restarts.
    fn log(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.with_extension("log"))
            .unwrap()
    }

    /// What the node's log says before its first panic (or its last lines), for a failure
    /// message.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let end = lines
            .iter()
            .position(|l| l.contains("panicked at"))
            .map_or(lines.len(), |p| (p + 3).min(lines.len()));
        lines[end.saturating_sub(12)..end].join("\n")
    }

    fn signal(&self, signal: i32) {
        if let Some(child) = &self.child {
            // SAFETY: kill(2) on a child process this test started (and has not reaped).
            unsafe { libc::kill(child.id() as i32, signal) };
        }
    }

    fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        if let Some(mut child) = self.child.take() {
            child.wait().unwrap();
        }
    }

    /// A client that gives up on a paused node instead of waiting for it.
    fn client(&self) -> HttpClient {
        HttpClient::with_timeout(
            &format!("http://{}", self.http),
            None,
            Some(Duration::from_secs(20)),
        )
    }

    fn status(&self) -> Option<Value> {
        self.child.as_ref()?;
        HttpClient::with_timeout(
            &format!("http://{}", self.http),
            None,
            Some(Duration::from_secs(1)),
        )
        .request("GET", "/v1/cluster", None)
        .ok()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal(libc::SIGCONT);
            self.kill();
        }
    }
}

/// Writes the cluster file naming the first `n` nodes of `config`.
fn write_config(path: &Path, config: &ClusterConfig, n: usize) {
    let mut subset = config.clone();
    subset.nodes.truncate(n);
    std::fs::write(path, to_toml(&subset).unwrap()).unwrap();
}

/// The leader's id, once a running node reports one that is running too.
fn leader(nodes: &[Node], not: Option<u64>) -> u64 {
    let deadline = Instant::now() + ELECTION_BOUND;
    loop {
        for n in nodes {
            if let Some(status) = n.status() {
                if let Some(l) = status["leader"].as_u64() {
                    let running = nodes.iter().any(|m| m.id == l && m.child.is_some());
                    if Some(l) != not && running && status["state"] == "Leader" {
                        return l;
                    }
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader (other than {not:?}) within {ELECTION_BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One cluster test at a time: several clusters of real processes at once would fight over
/// two cores and make elections slow for reasons no test is about.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_cluster_at_a_time() -> MutexGuard<'static, ()> {
    ONE_CLUSTER_AT_A_TIME.lock().ignore_poison()
}

/// Three nodes (and a fourth, configured but not started) under the write load the module
/// describes, and the batches acknowledged so far.
struct LoadedCluster {
    nodes: Vec<Node>,
    fourth: Node,
    stop: Arc<AtomicBool>,
    acknowledged: Arc<Mutex<Vec<(u64, u64)>>>,
    writers: Vec<JoinHandle<()>>,
    dir: Option<tempfile::TempDir>,
    _one_at_a_time: MutexGuard<'static, ()>,
}

/// A failed test (or any, with `TIDEMARK_KEEP_CLUSTER=1`) keeps the cluster's directory
/// (every node's data and log) and says where.
impl Drop for LoadedCluster {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("TIDEMARK_KEEP_CLUSTER").is_some() {
            if let Some(dir) = self.dir.take() {
                eprintln!("kept the cluster's directory: {}", dir.keep().display());
            }
        }
    }
}

impl LoadedCluster {
    fn start() -> LoadedCluster {
        LoadedCluster::start_with(one_cluster_at_a_time(), |_, _| None)
    }

    /// The cluster, each node given the server configuration `tier_config(dir, node id)`
    /// returns (written into `dir`), once `one_at_a_time` is held (a test that starts more
    /// processes for its cluster, S3Proxy, takes it first).
    fn start_with(
        one_at_a_time: MutexGuard<'static, ()>,
        tier_config: impl Fn(&Path, u64) -> Option<PathBuf>,
    ) -> LoadedCluster {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ClusterConfig::on_free_ports(4).unwrap();
        config.timing.snapshot_every_entries = 100;
        let three = dir.path().join("cluster3.toml");
        let four = dir.path().join("cluster4.toml");
        write_config(&three, &config, 3);
        write_config(&four, &config, 4);
        let mut nodes: Vec<Node> = config
            .nodes
            .iter()
            .map(|n| Node {
                id: n.id,
                raft: n.raft.clone(),
                http: n.http.clone(),
                binary: n.binary.clone(),
                config: if n.id <= 3 {
                    three.clone()
                } else {
                    four.clone()
                },
                dir: dir.path().join(format!("node-{}", n.id)),
                tier_config: tier_config(dir.path(), n.id),
                child: None,
            })
            .collect();
        let fourth = nodes.pop().unwrap();
        for n in &mut nodes {
            n.start();
        }
        // Every node serves before the tests go on: a leader and one follower make progress
        // while the third may still be opening its stores, and a test that sends to "a
        // follower" would find nothing listening.
        let deadline = Instant::now() + ELECTION_BOUND;
        for n in &nodes {
            while n.status().is_none() {
                assert!(Instant::now() < deadline, "node {} never served", n.id);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        leader(&nodes, None);
        nodes[0]
            .client()
            .create_stream("events", "ID:LONG,WRITER:INTEGER")
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let acknowledged: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
        let http: Vec<String> = nodes.iter().map(|n| format!("http://{}", n.http)).collect();
        let binary: Vec<String> = nodes.iter().map(|n| n.binary.clone()).collect();
        let writers = (0..3u64)
            .map(|w| {
                let (http, binary) = (http.clone(), binary.clone());
                let (stop, acknowledged) = (stop.clone(), acknowledged.clone());
                std::thread::spawn(move || {
                    write_until_stopped(w, &http, &binary, &stop, &acknowledged)
                })
            })
            .collect();
        LoadedCluster {
            nodes,
            fourth,
            stop,
            acknowledged,
            writers,
            dir: Some(dir),
            _one_at_a_time: one_at_a_time,
        }
    }

    fn node(&self, id: u64) -> &Node {
        self.nodes.iter().find(|n| n.id == id).unwrap()
    }

    fn node_mut(&mut self, id: u64) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.id == id).unwrap()
    }

    fn leader(&self, not: Option<u64>) -> u64 {
        leader(&self.nodes, not)
    }

    /// Waits until `n` more batches are acknowledged.
    fn wait_for_progress(&self, n: usize) {
        let acknowledged = || self.acknowledged.lock().unwrap().len();
        let before = acknowledged();
        let deadline = Instant::now() + Duration::from_secs(30);
        while acknowledged() < before + n {
            assert!(Instant::now() < deadline, "writes made no progress");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the writers and checks that every node holds every acknowledged batch exactly
    /// once, in the same order, with the same aggregates.
    fn stop_and_check_every_node(&mut self, min_batches: usize) {
        self.wait_for_progress(20);
        self.stop.store(true, Ordering::Relaxed);
        for w in self.writers.drain(..) {
            w.join().unwrap();
        }
        let acknowledged = self.acknowledged.lock().unwrap().clone();
        assert!(
            acknowledged.len() >= min_batches,
            "only {} batches",
            acknowledged.len()
        );
        for writer in 0..3u64 {
            let batches = acknowledged
                .iter()
                .filter(|&&(first, _)| first / 1_000_000_000 == writer)
                .count();
            assert!(batches > 0, "writer {writer} had no batch acknowledged");
        }
        let expected: HashSet<u64> = acknowledged.iter().flat_map(|&(f, n)| f..f + n).collect();
        let mut seen: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for node in &self.nodes {
            let deadline = Instant::now() + Duration::from_secs(60);
            let ids = loop {
                let ids = ids_on(node);
                if ids.len() >= expected.len() || Instant::now() > deadline {
                    break ids;
                }
                std::thread::sleep(Duration::from_millis(200));
            };
            let distinct: HashSet<u64> = ids.iter().copied().collect();
            assert_eq!(
                distinct.len(),
                ids.len(),
                "node {}: an event is stored twice",
                node.id
            );
            let missing = expected.difference(&distinct).count();
            assert_eq!(
                missing,
                0,
                "node {}: {missing} of {} acknowledged events are missing ({}); its log ends:\n{}",
                node.id,
                expected.len(),
                last_error(node),
                node.log_tail()
            );
            seen.insert(node.id, ids);
        }
        let reference = seen.values().next().unwrap();
        for (id, ids) in &seen {
            assert_eq!(ids, reference, "node {id} differs in content or order");
        }
        let aggregates: Vec<Value> = self
            .nodes
            .iter()
            .map(|n| {
                n.client()
                    .query("SELECT count(*), sum(ID), min(ID), max(ID) FROM events")
                    .unwrap()["rows"]
                    .clone()
            })
            .collect();
        assert!(
            aggregates.windows(2).all(|w| w[0] == w[1]),
            "{aggregates:?}"
        );
    }
}

/// Writer `w` appends batches until told to stop; each batch is retried, with the same
/// producer tag, on the next node until acknowledged. Writers 0 and 1 speak HTTP
/// (Tidemark-Producer header), writer 2 the binary protocol (TAGGED_APPEND).
fn write_until_stopped(
    w: u64,
    http: &[String],
    binary_addrs: &[String],
    stop: &AtomicBool,
    acknowledged: &Mutex<Vec<(u64, u64)>>,
) {
    let timeout = Some(Duration::from_secs(5));
    let clients: Vec<HttpClient> = http
        .iter()
        .map(|u| HttpClient::with_timeout(u, None, timeout))
        .collect();
    let mut binary: Vec<Option<BinaryClient>> = binary_addrs.iter().map(|_| None).collect();
    let schema = Arc::new(Schema::parse_spec("ID:LONG,WRITER:INTEGER").unwrap());
    let mut sequence = 0u64;
    let mut target = w as usize;
    while !stop.load(Ordering::Relaxed) {
        sequence += 1;
        let first_id = w * 1_000_000_000 + sequence * EVENTS_PER_BATCH;
        let mut body = String::new();
        for id in first_id..first_id + EVENTS_PER_BATCH {
            body.push_str(&format!(
                "{{\"tstart\": {id}, \"ID\": {id}, \"WRITER\": {w}}}\n"
            ));
        }
        let mut batch = BatchBuilder::new(schema.clone(), EVENTS_PER_BATCH as usize);
        for id in first_id..first_id + EVENTS_PER_BATCH {
            let values = [CoreValue::Long(id as i64), CoreValue::Integer(w as i32)];
            batch.push_row(id as i64, None, &values).unwrap();
        }
        let batch = batch.finish();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let node = target % clients.len();
            let outcome = if w == 2 {
                let client = match binary[node].take() {
                    Some(client) => Ok(client),
                    None => BinaryClient::connect(binary_addrs[node].as_str(), None),
                };
                client.and_then(|client| {
                    let ack = client
                        .send_append_tagged("events", &batch, Some((w + 1, sequence)))
                        .and_then(|pending| pending.wait());
                    // A refusal leaves the connection usable; keep it.
                    if !matches!(ack, Err(ClientError::OutcomeUnknown)) {
                        binary[node] = Some(client);
                    }
                    ack.map(|_| ())
                })
            } else {
                clients[node]
                    .append_ndjson_tagged("events", body.clone().into_bytes(), w + 1, sequence)
                    .map(|_| ())
            };
            match outcome {
                Ok(_) => break,
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "writer {w}: batch {sequence} never acknowledged: {e}"
                    );
                    target += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        acknowledged
            .lock()
            .unwrap()
            .push((first_id, EVENTS_PER_BATCH));
    }
}

/// SIGKILL the leader, check a new one is elected in time, restart the old one
/// (`TIDEMARK_CLUSTER_KILLS` times). The nodes then name their roles, and the leader's log
/// counters are the Raft log's.
#[test]
fn killed_leaders_lose_no_acknowledged_event() {
    let kills: usize = std::env::var("TIDEMARK_CLUSTER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let mut cluster = LoadedCluster::start();
    let mut current = cluster.leader(None);
    // Consumers follow the stream from the node killed first, and from node to node: one
    // over HTTP, one over the binary protocol (tidemark_client::Consumer).
    let follower = Follower::over_http(&cluster, current);
    let consumer = Follower::over_binary(&cluster, current);
    for _ in 0..kills {
        cluster.wait_for_progress(20);
        cluster.node_mut(current).kill();
        let killed = Instant::now();
        let next = cluster.leader(Some(current));
        eprintln!(
            "killed leader {current}; node {next} leads after {:?}",
            killed.elapsed()
        );
        cluster.node_mut(current).start();
        current = next;
    }
    cluster.stop_and_check_every_node(20 * kills);
    let stored = ids_on(cluster.node(1));
    follower.check_it_saw_each_event_once(&stored);
    consumer.check_it_saw_each_event_once(&stored);

    let lead = cluster.leader(None);
    let text = cluster
        .node(lead)
        .client()
        .request("GET", "/metrics", None)
        .unwrap();
    assert!(
        text.as_str()
            .is_some_and(|t| t.contains("tidemark_raft_is_leader 1")),
        "{text}"
    );
    // The log counters are the Raft log's: a leader that took writes has group commits.
    let commits = text
        .as_str()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("tidemark_log_group_commits_total "))
        })
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(commits.is_some_and(|c| c > 0), "{text}");
    // The ChronicleDB system info names each node's role, not "standalone".
    for node in &cluster.nodes {
        let info = node.client().request("GET", "/api/sys-info", None).unwrap();
        let expected = if node.id == lead {
            "leader"
        } else {
            "follower"
        };
        assert_eq!(info["role"], expected, "node {}: {info}", node.id);
    }
}

/// A consumer following stream `events` by position: when its node dies it follows the
/// next node, after the last position it received.
struct Follower {
    /// (position, ID) of every event received, in order.
    received: Arc<Mutex<Vec<(u64, u64)>>>,
    stop: Arc<AtomicBool>,
}

impl Follower {
    /// The nodes' addresses (`address` of each), from node `first` on.
    fn addresses(
        cluster: &LoadedCluster,
        first: u64,
        address: impl Fn(&Node) -> String,
    ) -> Vec<String> {
        let mut addresses: Vec<String> = cluster.nodes.iter().map(address).collect();
        let at = cluster.nodes.iter().position(|n| n.id == first).unwrap();
        addresses.rotate_left(at);
        addresses
    }

    /// Over the binary protocol: a `Consumer` given every node, which moves on by itself.
    fn over_binary(cluster: &LoadedCluster, first: u64) -> Follower {
        let servers = Follower::addresses(cluster, first, |n| n.binary.clone());
        let received: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (into, stopped) = (received.clone(), stop.clone());
        // Detached, as over HTTP.
        std::thread::spawn(move || {
            let options = tidemark_client::ConsumerOptions {
                retry_for: Duration::from_secs(30),
                ..Default::default()
            };
            let mut consumer = tidemark_client::Consumer::new(&servers, "events", options);
            while !stopped.load(Ordering::Relaxed) {
                let Ok(Some(batch)) = consumer.next_batch() else {
                    break;
                };
                let mut into = into.lock().unwrap();
                for row in 0..batch.len() {
                    let CoreValue::Long(id) = batch.column(0).value(row) else {
                        panic!("ID is a LONG");
                    };
                    into.push((batch.position_at(row).unwrap(), id as u64));
                }
            }
        });
        Follower { received, stop }
    }

    /// Over HTTP (NDJSON, `follow=true`): a node's answer that ends or breaks, and it asks
    /// the next node.
    fn over_http(cluster: &LoadedCluster, first: u64) -> Follower {
        let urls = Follower::addresses(cluster, first, |n| format!("http://{}", n.http));
        let received: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (into, stopped) = (received.clone(), stop.clone());
        // Detached: it ends at its next connection failure once stopped (the nodes are
        // killed when the test ends).
        std::thread::spawn(move || {
            let mut node = 0;
            while !stopped.load(Ordering::Relaxed) {
                let last = into.lock().unwrap().last().map(|&(p, _)| p);
                let after = last.map_or("earliest".to_string(), |p| p.to_string());
                // No timeout: a follow has no end.
                let client = HttpClient::with_timeout(&urls[node % urls.len()], None, None);
                let params = [("follow", "true".to_string()), ("after", after)];
                if let Ok(lines) = client.read_positions("events", &params) {
                    for line in lines.lines() {
                        let Ok(line) = line else { break };
                        let Ok(line) = serde_json::from_str::<Value>(&line) else {
                            break;
                        };
                        if let Some(position) = line["position"].as_u64() {
                            let id = line["event"]["ID"].as_u64().unwrap();
                            into.lock().unwrap().push((position, id));
                        } else if line.get("error").is_some() {
                            break;
                        }
                    }
                }
                node += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Follower { received, stop }
    }

    /// Waits until it has received as many events as `ids` (a node's, in time order),
    /// then checks that it saw positions 0, 1, 2, … each once, and exactly those events.
    fn check_it_saw_each_event_once(&self, ids: &[u64]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.received.lock().unwrap().len() < ids.len() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop.store(true, Ordering::Relaxed);
        let received = self.received.lock().unwrap().clone();
        let positions: Vec<u64> = received.iter().map(|&(p, _)| p).collect();
        assert!(
            positions.iter().enumerate().all(|(i, &p)| p == i as u64),
            "the follower saw a position twice or skipped one: {} events, positions {:?}…",
            positions.len(),
            &positions[..positions.len().min(20)]
        );
        let mut seen: Vec<u64> = received.iter().map(|&(_, id)| id).collect();
        let mut stored = ids.to_vec();
        seen.sort_unstable();
        stored.sort_unstable();
        assert_eq!(seen.len(), stored.len(), "events followed vs stored");
        assert!(
            seen == stored,
            "the follower saw other events than the nodes hold"
        );
    }
}

/// Pause the leader for longer than the election timeout: the others elect a leader and
/// carry on, and the paused node catches up once it resumes. It was paused long enough for
/// the others to purge their logs past its end, so it catches up by a snapshot, and it
/// restarts (kill -9) from a log with a gap.
#[test]
fn a_paused_leader_is_replaced_and_catches_up() {
    let mut cluster = LoadedCluster::start();
    cluster.wait_for_progress(20);
    let paused = cluster.leader(None);
    cluster.node(paused).signal(libc::SIGSTOP);
    let next = cluster.leader(Some(paused));
    // Snapshots every 100 entries, each purging the log up to 50 entries before it.
    cluster.wait_for_progress(200);
    // A stream the paused node has not seen: a write through it right after it resumes is
    // accepted (it catches up with the leader before it decodes), not refused as unknown.
    cluster
        .node(next)
        .client()
        .create_stream("late", "N:LONG")
        .unwrap();
    cluster.node(paused).signal(libc::SIGCONT);
    cluster
        .node(paused)
        .client()
        .append_ndjson_tagged("late", b"{\"tstart\": 1, \"N\": 1}\n".to_vec(), 99, 1)
        .expect("a write to a stream created while this node was paused");
    eprintln!("paused leader {paused}; node {next} took over");
    let log = std::fs::read_to_string(cluster.node(paused).dir.with_extension("log")).unwrap();
    assert!(
        log.contains("installed a snapshot from the leader"),
        "{log}"
    );
    cluster.node_mut(paused).kill();
    cluster.node_mut(paused).start();
    cluster.stop_and_check_every_node(220);
}

/// InfluxDB line protocol sent to a follower under the writers' load: the stream it
/// creates and the fields later lines add (ADD FIELDS, logged and replicated) are on every
/// node, with every line's values, older lines reading the new fields as null.
#[test]
fn line_protocol_through_a_follower_creates_and_grows_a_stream_on_every_node() {
    let mut cluster = LoadedCluster::start();
    cluster.wait_for_progress(10);
    let lead = cluster.leader(None);
    let follower = cluster.nodes.iter().find(|n| n.id != lead).unwrap().id;
    let base = 1_700_000_000_000_000_000i64;
    let mut expected = Vec::new();
    for i in 0..30i64 {
        // From line 10 on a tag and a field the stream lacks: the stream grows.
        let line = if i < 10 {
            expected.push(json!([
                base + i,
                format!("h{i}"),
                i as f64 + 0.5,
                null,
                null
            ]));
            format!("proto,host=h{i} usage={i}.5 {}\n", base + i)
        } else {
            expected.push(json!([base + i, format!("h{i}"), i as f64 + 0.5, "eu", i]));
            format!(
                "proto,host=h{i},zone=eu usage={i}.5,temp={i}i {}\n",
                base + i
            )
        };
        cluster
            .node(follower)
            .client()
            .request("POST", "/write", Some(("text/plain", line.into_bytes())))
            .unwrap_or_else(|e| panic!("line {i} through follower {follower}: {e}"));
    }
    cluster.stop_and_check_every_node(20);
    let query = json!({
        "sql": "SELECT ts, host, usage, zone, temp FROM proto ORDER BY ts",
        "time": "ns",
        "consistency": "linearizable",
    });
    for node in &cluster.nodes {
        let answer = node
            .client()
            .request(
                "POST",
                "/v1/query",
                Some(("application/json", query.to_string().into_bytes())),
            )
            .unwrap();
        assert_eq!(answer["rows"], json!(expected), "node {}", node.id);
        let info = node.client().stream_info("proto").unwrap();
        assert_eq!(info["evolving"], json!(true), "node {}", node.id);
    }
}

/// 3 → 4 → 3 voters under load.
#[test]
fn a_node_added_and_removed_under_load_loses_nothing() {
    let mut cluster = LoadedCluster::start();
    cluster.wait_for_progress(20);
    cluster.fourth.start();
    let fourth = &cluster.fourth;
    let add =
        json!({"id": fourth.id, "raft": fourth.raft, "http": fourth.http, "binary": fourth.binary});
    let client = cluster.nodes[0].client();
    client
        .request(
            "POST",
            "/v1/cluster/nodes",
            Some(("application/json", add.to_string().into_bytes())),
        )
        .unwrap();
    cluster.wait_for_progress(20);
    client
        .request("DELETE", &format!("/v1/cluster/nodes/{}", fourth.id), None)
        .unwrap();
    let status = client.request("GET", "/v1/cluster", None).unwrap();
    let voters = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["voter"] == true)
        .count();
    assert_eq!(voters, 3, "{status}");
    cluster.fourth.kill();
    cluster.stop_and_check_every_node(40);
}

/// A follower loses its data directory and catches up by snapshot.
#[test]
fn a_follower_that_lost_its_data_catches_up_by_snapshot() {
    let mut cluster = LoadedCluster::start();
    // Past `snapshot_every_entries` (100), so that the leader has a snapshot to send.
    cluster.wait_for_progress(120);
    let lead = cluster.leader(None);
    let follower = cluster.nodes.iter_mut().find(|n| n.id != lead).unwrap();
    follower.kill();
    std::fs::remove_dir_all(&follower.dir).unwrap();
    follower.start();
    cluster.wait_for_progress(20);
    cluster.stop_and_check_every_node(140);
}

/// Why the last query of a node failed, if it did.
fn last_error(node: &Node) -> String {
    let body =
        json!({"sql": "SELECT count(*) FROM events", "consistency": "linearizable"}).to_string();
    match node.client().request(
        "POST",
        "/v1/query",
        Some(("application/json", body.into_bytes())),
    ) {
        Ok(answer) => format!("count {}", answer["rows"]),
        Err(e) => e.to_string(),
    }
}

/// The IDs on one node in time order, after it has applied everything committed.
fn ids_on(node: &Node) -> Vec<u64> {
    let body = json!({"sql": "SELECT ID FROM events", "consistency": "linearizable"}).to_string();
    match node.client().request(
        "POST",
        "/v1/query",
        Some(("application/json", body.into_bytes())),
    ) {
        Ok(answer) => answer["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r[0].as_u64().unwrap())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// An agent given every node forwards while the leader is killed twice: every event a
/// producer had acknowledged by the agent is on every node, exactly once.
#[test]
fn an_agent_forwarding_to_a_cluster_loses_and_duplicates_nothing_when_leaders_die() {
    let mut cluster = LoadedCluster::start();
    let spool = cluster.dir.as_ref().unwrap().path().join("agent-spool");
    let upstream: Vec<String> = cluster.nodes.iter().map(|n| n.binary.clone()).collect();
    let agent = common::agent_to(&spool, &upstream.join(","), &[]);
    common::create_stream_named(&agent, "agent_events");
    let acknowledged: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let producers =
        common::Producers::start_on(&agent.http, "agent_events", 0, acknowledged.clone());
    let mut current = cluster.leader(None);
    for _ in 0..2 {
        producers.wait_for_acks(40);
        cluster.node_mut(current).kill();
        let next = cluster.leader(Some(current));
        cluster.node_mut(current).start();
        current = next;
    }
    producers.wait_for_acks(20);
    producers.stop();
    common::drained(&agent);
    let expected: HashSet<u64> = acknowledged
        .lock()
        .unwrap()
        .iter()
        .flat_map(|&(f, n)| f..f + n)
        .collect();
    assert!(!expected.is_empty());
    for node in &cluster.nodes {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let rows = node
                .client()
                .query("SELECT ID FROM agent_events")
                .map(|a| a["rows"].as_array().cloned().unwrap_or_default())
                .unwrap_or_default();
            let ids: Vec<u64> = rows.iter().filter_map(|r| r[0].as_u64()).collect();
            let distinct: HashSet<u64> = ids.iter().copied().collect();
            assert_eq!(
                distinct.len(),
                ids.len(),
                "node {}: an event twice",
                node.id
            );
            let missing = expected.difference(&distinct).count();
            if missing == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {}: {missing} acknowledged events missing",
                node.id
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    cluster.stop_and_check_every_node(20);
}

/// A TCP relay between one node and S3Proxy that can hold back S3Proxy's answer to a
/// segment upload (a `PUT` of `…/segments/…`) while armed: the object is stored, and the
/// node does not know it yet. Killing the node then is a crash in the middle of an upload
/// that leaves an object its manifest does not name.
struct UploadHolder {
    endpoint: String,
    armed: Arc<AtomicBool>,
    /// Answers held back so far.
    held: Arc<AtomicU64>,
}

impl UploadHolder {
    fn start(upstream: &str) -> UploadHolder {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let upstream = upstream.trim_start_matches("http://").to_string();
        let (armed, held) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (a, h) = (armed.clone(), held.clone());
        std::thread::spawn(move || {
            for node in listener.incoming() {
                let Ok(node) = node else { return };
                let Ok(s3) = TcpStream::connect(&upstream) else {
                    continue;
                };
                relay(node, s3, a.clone(), h.clone());
            }
        });
        UploadHolder {
            endpoint,
            armed,
            held,
        }
    }
}

fn relay(node: TcpStream, s3: TcpStream, armed: Arc<AtomicBool>, held: Arc<AtomicU64>) {
    let uploading = Arc::new(AtomicBool::new(false));
    let (mut from, mut to) = (node.try_clone().unwrap(), s3.try_clone().unwrap());
    let noted = uploading.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            let head = &buf[..n.min(512)];
            if head.starts_with(b"PUT ") && head.windows(10).any(|w| w == b"/segments/") {
                noted.store(true, Ordering::SeqCst);
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let (mut from, mut to) = (s3, node);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if uploading.swap(false, Ordering::SeqCst) && armed.load(Ordering::SeqCst) {
                held.fetch_add(1, Ordering::SeqCst);
                // Until the test has killed the node and disarms (or gives up).
                let until = Instant::now() + Duration::from_secs(60);
                while armed.load(Ordering::SeqCst) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Node `id`'s server configuration: `[tier]` under one prefix for the whole cluster, its
/// bucket reached through `endpoint`; every event the tests write is decades old, so each
/// segment moves as soon as it is flushed.
fn tier_config(dir: &Path, id: u64, endpoint: &str) -> PathBuf {
    let path = dir.join(format!("tier-{id}.toml"));
    std::fs::write(
        &path,
        format!(
            "[tier]\nurl = \"s3://{BUCKET}/cluster\"\nendpoint = \"{endpoint}\"\n\
             region = \"us-east-1\"\nafter = \"1h\"\ncheck_every = \"100ms\"\n"
        ),
    )
    .unwrap();
    path
}

fn tier_status(node: &Node) -> Value {
    node.client().request("GET", "/v1/tier", None).unwrap()
}

/// The segment objects in the bucket under node `id`'s prefix, every generation's.
fn segment_objects(proxy: &S3Proxy, id: u64) -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "seg") {
                found.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(
        &proxy.object_path(&format!("cluster/node-{id}")),
        &mut found,
    );
    found
}

/// Every node has moved its segments to the bucket, and its part of the bucket holds
/// exactly the segments it names: no object lost, none orphaned.
fn check_every_node_tiers_exactly_what_it_names(cluster: &LoadedCluster, proxy: &S3Proxy) {
    for node in &cluster.nodes {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let status = tier_status(node);
            let objects = segment_objects(proxy, node.id).len() as u64;
            let tiered = status["tieredSegments"].as_u64().unwrap();
            if tiered > 0 && status["pendingSegments"] == 0 && objects == tiered {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {}: {objects} segment objects in the bucket for {status}",
                node.id
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Each node tiers its own segments under `cluster/node-<id>/`. The leader is killed twice
/// while S3Proxy's answer to one of its uploads is held back (the object stored, the node
/// not told): after each restart nothing acknowledged is missing on any node, and each
/// node's part of the bucket holds exactly the segments it names.
#[test]
fn a_tiering_cluster_loses_and_orphans_nothing_when_its_leader_dies_during_an_upload() {
    let one_at_a_time = one_cluster_at_a_time();
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let holders: Vec<UploadHolder> = (0..4)
        .map(|_| UploadHolder::start(&proxy.endpoint))
        .collect();
    let mut cluster = LoadedCluster::start_with(one_at_a_time, |dir, id| {
        Some(tier_config(dir, id, &holders[id as usize - 1].endpoint))
    });
    let mut killed = HashSet::new();
    for _ in 0..2 {
        let lead = cluster.leader(None);
        killed.insert(lead);
        let holder = &holders[lead as usize - 1];
        let before = holder.held.load(Ordering::SeqCst);
        holder.armed.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(60);
        while holder.held.load(Ordering::SeqCst) == before {
            assert!(Instant::now() < deadline, "leader {lead} uploaded nothing");
            std::thread::sleep(Duration::from_millis(10));
        }
        cluster.node_mut(lead).kill();
        holder.armed.store(false, Ordering::SeqCst);
        cluster.leader(Some(lead));
        cluster.wait_for_progress(20);
        cluster.node_mut(lead).start();
        cluster.wait_for_progress(20);
    }
    cluster.stop_and_check_every_node(60);
    check_every_node_tiers_exactly_what_it_names(&cluster, &proxy);
    // Each killed leader's cut-short upload left an object its manifest did not name; the
    // check above finds none left over: the node, started again, uploaded the same segment
    // under the same name (or its sweeper deleted the object).
    for id in killed {
        assert!(
            tier_status(cluster.node(id))["uploadedSegments"]
                .as_u64()
                .unwrap()
                > 0
        );
    }
}

/// A follower that lost its data directory catches up by a snapshot naming tiered
/// segments: it copies their objects into its own prefix inside the bucket, answers every
/// event, and its prefix holds exactly what it names.
#[test]
fn a_follower_catches_up_by_a_snapshot_of_tiered_segments() {
    let one_at_a_time = one_cluster_at_a_time();
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let mut cluster = LoadedCluster::start_with(one_at_a_time, |dir, id| {
        Some(tier_config(dir, id, &proxy.endpoint))
    });
    let lead = cluster.leader(None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while tier_status(cluster.node(lead))["tieredSegments"] == 0 {
        assert!(Instant::now() < deadline, "the leader tiered nothing");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Past `snapshot_every_entries` (100) again: the snapshot sent names tiered segments.
    cluster.wait_for_progress(150);
    let follower = cluster.nodes.iter_mut().find(|n| n.id != lead).unwrap();
    follower.kill();
    std::fs::remove_dir_all(&follower.dir).unwrap();
    follower.start();
    let id = follower.id;
    cluster.wait_for_progress(20);
    cluster.stop_and_check_every_node(140);
    let log = std::fs::read_to_string(cluster.node(id).dir.with_extension("log")).unwrap();
    assert!(
        log.contains("copied the objects of a checkpoint's tiered segments"),
        "node {id} did not copy tiered objects from the snapshot"
    );
    check_every_node_tiers_exactly_what_it_names(&cluster, &proxy);
}

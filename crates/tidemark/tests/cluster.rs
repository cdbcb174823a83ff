//! A three-node cluster of real processes on 127.0.0.1 under write load: the leader is
//! killed with SIGKILL and restarted (`TIDEMARK_CLUSTER_KILLS` times, default 5), paused
//! with SIGSTOP for longer than the election timeout, a fourth node is added and removed
//! again, and a follower whose data directory was deleted catches up by snapshot. Writers
//! retry every batch whose outcome they did not see with the same producer id and sequence
//! number (two over HTTP with the header, one over the binary protocol with TAGGED_APPEND)
//! until it is acknowledged. At the end every node holds every batch exactly once, in the
//! same order, with the same aggregates.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tidemark_client::{BinaryClient, ClientError, HttpClient};
use tidemark_cluster::config::to_toml;
use tidemark_cluster::ClusterConfig;
use tidemark_core::{BatchBuilder, Schema, Value as CoreValue};

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

#[test]
fn no_acknowledged_event_is_lost_or_doubled_through_kills_pauses_and_membership_changes() {
    let kills: usize = std::env::var("TIDEMARK_CLUSTER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
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
            child: None,
        })
        .collect();
    let mut fourth = nodes.pop().unwrap();
    for n in &mut nodes {
        n.start();
    }
    let first = leader(&nodes, None);
    nodes[0]
        .client()
        .create_stream("events", "ID:LONG,WRITER:INTEGER")
        .unwrap();

    // Writers: each batch is retried, with the same producer tag, until acknowledged.
    // Writers 0 and 1 speak HTTP (Tidemark-Producer header), writer 2 the binary protocol
    // (TAGGED_APPEND).
    let urls: Vec<String> = nodes
        .iter()
        .chain([&fourth])
        .map(|n| format!("http://{}", n.http))
        .collect();
    let binary_addrs: Vec<String> = nodes
        .iter()
        .chain([&fourth])
        .map(|n| n.binary.clone())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let writers: Vec<_> = (0..3u64)
        .map(|w| {
            let (urls, stop, acknowledged) = (urls.clone(), stop.clone(), acknowledged.clone());
            let binary_addrs = binary_addrs.clone();
            std::thread::spawn(move || {
                let timeout = Some(Duration::from_secs(5));
                let clients: Vec<HttpClient> = urls
                    .iter()
                    .map(|u| HttpClient::with_timeout(u, None, timeout))
                    .collect();
                let mut binary: Vec<Option<BinaryClient>> = (0..3).map(|_| None).collect();
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
                        let node = target % 3;
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
                                .append_ndjson_tagged(
                                    "events",
                                    body.clone().into_bytes(),
                                    w + 1,
                                    sequence,
                                )
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
            })
        })
        .collect();
    let wait_for_progress = |n: usize| {
        let before = acknowledged.lock().unwrap().len();
        let deadline = Instant::now() + Duration::from_secs(30);
        while acknowledged.lock().unwrap().len() < before + n {
            assert!(Instant::now() < deadline, "writes made no progress");
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    // SIGKILL the leader, check a new one is elected in time, restart the old one.
    let mut current = first;
    for _ in 0..kills {
        wait_for_progress(20);
        let victim = nodes.iter_mut().find(|n| n.id == current).unwrap();
        victim.kill();
        let killed = Instant::now();
        let next = leader(&nodes, Some(current));
        eprintln!(
            "killed leader {current}; node {next} leads after {:?}",
            killed.elapsed()
        );
        nodes.iter_mut().find(|n| n.id == current).unwrap().start();
        current = next;
    }

    // Pause the leader for longer than the election timeout; the others carry on.
    wait_for_progress(20);
    let paused = nodes.iter().find(|n| n.id == current).unwrap();
    paused.signal(libc::SIGSTOP);
    let next = leader(&nodes, Some(current));
    wait_for_progress(20);
    // A stream the paused node has not seen: a write through it right after it resumes is
    // accepted (it catches up with the leader before it decodes), not refused as unknown.
    let new_leader = nodes.iter().find(|n| n.id == next).unwrap();
    new_leader.client().create_stream("late", "N:LONG").unwrap();
    let paused = nodes.iter().find(|n| n.id == current).unwrap();
    paused.signal(libc::SIGCONT);
    paused
        .client()
        .append_ndjson_tagged("late", b"{\"tstart\": 1, \"N\": 1}\n".to_vec(), 99, 1)
        .expect("a write to a stream created while this node was paused");
    eprintln!("paused leader {current}; node {next} took over");

    // 3 → 4 → 3 voters under load.
    fourth.start();
    let add =
        json!({"id": fourth.id, "raft": fourth.raft, "http": fourth.http, "binary": fourth.binary});
    nodes[0]
        .client()
        .request(
            "POST",
            "/v1/cluster/nodes",
            Some(("application/json", add.to_string().into_bytes())),
        )
        .unwrap();
    wait_for_progress(20);
    nodes[0]
        .client()
        .request("DELETE", &format!("/v1/cluster/nodes/{}", fourth.id), None)
        .unwrap();
    let status = nodes[0]
        .client()
        .request("GET", "/v1/cluster", None)
        .unwrap();
    let voters = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["voter"] == true)
        .count();
    assert_eq!(voters, 3, "{status}");
    fourth.kill();

    // A follower loses its data directory and catches up by snapshot.
    wait_for_progress(40);
    let lead = leader(&nodes, None);
    let follower = nodes.iter_mut().find(|n| n.id != lead).unwrap();
    follower.kill();
    std::fs::remove_dir_all(&follower.dir).unwrap();
    follower.start();
    wait_for_progress(20);

    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() >= 100 + 20 * kills,
        "only {} batches",
        acknowledged.len()
    );
    for writer in 0..3u64 {
        let batches = acknowledged
            .iter()
            .filter(|&&(first, _)| first / 1_000_000_000 == writer)
            .count();
        assert!(
            batches >= 10,
            "writer {writer} had {batches} batches acknowledged"
        );
    }

    // Every node converges on the same events, each acknowledged one exactly once.
    let expected: HashSet<u64> = acknowledged.iter().flat_map(|&(f, n)| f..f + n).collect();
    let mut seen: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for node in &nodes {
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
    let aggregates: Vec<Value> = nodes
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
    let lead = leader(&nodes, None);
    let metrics = nodes.iter().find(|n| n.id == lead).unwrap().client();
    let text = metrics.request("GET", "/metrics", None).unwrap();
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
    for node in &nodes {
        let info = node.client().request("GET", "/api/sys-info", None).unwrap();
        let expected = if node.id == lead {
            "leader"
        } else {
            "follower"
        };
        assert_eq!(info["role"], expected, "node {}: {info}", node.id);
    }
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

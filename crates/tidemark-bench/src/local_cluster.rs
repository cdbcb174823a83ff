//! Tidemark nodes as processes on this machine, started from the running `tidemark`
//! executable: the development cluster of `tidemark cluster up` and the cluster target of
//! the benchmarks, which kill and restart nodes.
//!
//! Owns: each node's data directory (DIR/node-N) and the cluster file (DIR/cluster.toml),
//! the node processes (stopped with SIGTERM, then SIGKILL, when dropped), and their output
//! (relayed with the node's id, or to DIR/node-N.log).
//!
//! Must never know about: what a node does once started; it is asked over HTTP like any
//! client would.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;
use tidemark_client::HttpClient;
use tidemark_cluster::ClusterConfig;

/// The node processes of a [`LocalCluster`]; dropping it stops them (SIGTERM, then SIGKILL).
struct Nodes(Vec<Child>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            // Only a child not yet reaped: a reaped one's pid may be another process's now.
            if !matches!(child.try_wait(), Ok(None)) {
                continue;
            }
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: kill(2) on a child process this command started and has not reaped.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for child in &mut self.0 {
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Node processes on this machine, started from this executable; dropping it stops them.
pub struct LocalCluster {
    pub config: ClusterConfig,
    pub config_path: PathBuf,
    dir: PathBuf,
    quiet: bool,
    nodes: Nodes,
    /// Whether each node's exit was reported by [`LocalCluster::newly_exited`].
    reported: Vec<bool>,
}

/// Writes `text` to `path` readable by its owner only (it holds the cluster's secret),
/// replacing what was there.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // `mode` applies to a new file only: one left by an earlier `cluster up` is narrowed too.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(text.as_bytes())
}

impl LocalCluster {
    /// Writes `config` to DIR/cluster.toml and starts every node with its data in
    /// DIR/node-N; `quiet` sends the nodes' output to DIR/node-N.log instead of the terminal.
    pub fn start(config: ClusterConfig, dir: &Path, quiet: bool) -> anyhow::Result<LocalCluster> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let config_path = dir.join("cluster.toml");
        write_private(&config_path, &toml_text(&config)?)
            .with_context(|| format!("writing {}", config_path.display()))?;
        let mut cluster = LocalCluster {
            config,
            config_path,
            dir: dir.to_path_buf(),
            quiet,
            nodes: Nodes(Vec::new()),
            reported: Vec::new(),
        };
        for index in 0..cluster.config.nodes.len() {
            let child = cluster.spawn(index)?;
            cluster.nodes.0.push(child);
            cluster.reported.push(false);
        }
        Ok(cluster)
    }

    /// Starts the node at `index` of the configuration.
    fn spawn(&self, index: usize) -> anyhow::Result<Child> {
        let node = &self.config.nodes[index];
        let exe = std::env::current_exe().context("finding the tidemark executable")?;
        let mut command = Command::new(&exe);
        command
            .arg("serve")
            .arg("--node-id")
            .arg(node.id.to_string())
            .arg("--cluster-config")
            .arg(&self.config_path)
            .arg("--data-dir")
            .arg(self.node_dir(node.id));
        if self.quiet {
            // Appended to: a node started again keeps what it logged before.
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join(format!("node-{}.log", node.id)))?;
            command.stdout(Stdio::null()).stderr(log);
        } else {
            // Relayed line by line with the node's id: three nodes on one terminal are
            // otherwise one log that cannot be told apart.
            command.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("starting node {}", node.id))?;
        let label = format!("node {} | ", node.id);
        if let Some(stdout) = child.stdout.take() {
            relay(stdout, label.clone(), Output::Stdout);
        }
        if let Some(stderr) = child.stderr.take() {
            relay(stderr, label, Output::Stderr);
        }
        Ok(child)
    }

    /// The nodes that exited since the last call, with their status; each is reaped (no
    /// zombie is left) and reported once until it is started again.
    pub fn newly_exited(&mut self) -> Vec<(u64, ExitStatus)> {
        let mut exited = Vec::new();
        for ((child, node), reported) in self
            .nodes
            .0
            .iter_mut()
            .zip(&self.config.nodes)
            .zip(&mut self.reported)
        {
            if let Ok(Some(status)) = child.try_wait() {
                if !*reported {
                    *reported = true;
                    exited.push((node.id, status));
                }
            }
        }
        exited
    }

    /// How many node processes are running.
    pub fn running(&mut self) -> usize {
        self.nodes
            .0
            .iter_mut()
            .map(|child| matches!(child.try_wait(), Ok(None)))
            .filter(|running| *running)
            .count()
    }

    /// The command that starts node `id` again on its data, as a shell would take it.
    pub fn restart_command(&self, id: u64) -> String {
        // The executable as the user named it (`tidemark`, `./target/release/tidemark`).
        let program = std::env::args().next().unwrap_or_else(|| "tidemark".into());
        [
            program,
            "serve".into(),
            "--node-id".into(),
            id.to_string(),
            "--cluster-config".into(),
            self.config_path.display().to_string(),
            "--data-dir".into(),
            self.node_dir(id).display().to_string(),
        ]
        .iter()
        .map(|word| shell_word(word))
        .collect::<Vec<_>>()
        .join(" ")
    }

    /// Kills node `id` with SIGKILL (a crash, for fault benchmarks), until
    /// [`LocalCluster::restart`].
    pub fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        let index = self.index_of(id)?;
        let child = &mut self.nodes.0[index];
        child.kill().with_context(|| format!("killing node {id}"))?;
        child.wait().with_context(|| format!("reaping node {id}"))?;
        Ok(())
    }

    /// Starts node `id` again on its data after [`LocalCluster::kill`].
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        let index = self.index_of(id)?;
        if matches!(self.nodes.0[index].try_wait(), Ok(None)) {
            bail!("node {id} is running");
        }
        self.nodes.0[index] = self.spawn(index)?;
        self.reported[index] = false;
        Ok(())
    }

    fn index_of(&self, id: u64) -> anyhow::Result<usize> {
        self.config
            .nodes
            .iter()
            .position(|n| n.id == id)
            .with_context(|| format!("node {id} is not in the configuration"))
    }

    fn node_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node-{id}"))
    }

    /// The cluster status (as node 1 sees it) once a leader is elected. Fails as soon as a
    /// node process exits (with its log's last lines when `quiet`), and takes a status only
    /// from a process serving this cluster's data directory: another process on the same
    /// ports (a cluster already running) must not pass for this one.
    pub fn wait_for_leader(&mut self, timeout: Duration) -> anyhow::Result<Value> {
        let first = HttpClient::with_timeout(
            &format!("http://{}", self.config.nodes[0].http),
            None,
            Some(Duration::from_secs(2)),
        );
        let ours = self.node_dir(self.config.nodes[0].id).display().to_string();
        let deadline = Instant::now() + timeout;
        loop {
            self.fail_if_a_node_exited()?;
            let serves_ours = first
                .request("GET", "/api/sys-info", None)
                .is_ok_and(|info| info["dataDirectory"].as_str() == Some(ours.as_str()));
            match first.request("GET", "/v1/cluster", None) {
                Ok(status) if serves_ours && !status["leader"].is_null() => return Ok(status),
                _ if Instant::now() > deadline => bail!(
                    "no leader was elected within {timeout:?} (node 1 at {} did not answer for {ours})",
                    self.config.nodes[0].http
                ),
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn fail_if_a_node_exited(&mut self) -> anyhow::Result<()> {
        for (child, node) in self.nodes.0.iter_mut().zip(&self.config.nodes) {
            let Ok(Some(status)) = child.try_wait() else {
                continue;
            };
            let log = self.dir.join(format!("node-{}.log", node.id));
            let tail = if self.quiet {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().rev().take(5).collect();
                let lines: Vec<&str> = lines.into_iter().rev().collect();
                format!(" ({}): {}", log.display(), lines.join("\n"))
            } else {
                " (its error is above)".to_string()
            };
            bail!(
                "node {} (http {}, raft {}) exited with {status}{tail}",
                node.id,
                node.http,
                node.raft
            );
        }
        Ok(())
    }
}

/// Where a node's relayed line goes.
#[derive(Clone, Copy)]
enum Output {
    Stdout,
    Stderr,
}

/// Copies `from` to this process's `to` line by line, each line after `label`, until the
/// node closes it (it exits).
fn relay(from: impl Read + Send + 'static, label: String, to: Output) {
    let spawned = std::thread::Builder::new()
        .name("node-log".into())
        .spawn(move || {
            let mut from = BufReader::new(from);
            let mut line = Vec::new();
            // A line is relayed as bytes: a node's log need not be UTF-8.
            while matches!(from.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                // A failed write (our terminal gone) drops the line but keeps reading, so
                // that the node never blocks on a full pipe.
                let _ = match to {
                    Output::Stdout => write_line(&mut std::io::stdout().lock(), &label, &line),
                    Output::Stderr => write_line(&mut std::io::stderr().lock(), &label, &line),
                };
                line.clear();
            }
        });
    if let Err(e) = spawned {
        eprintln!("cannot relay a node's output: {e}");
    }
}

fn write_line(out: &mut impl Write, label: &str, line: &[u8]) -> std::io::Result<()> {
    out.write_all(label.as_bytes())?;
    out.write_all(line)?;
    out.flush()
}

/// `word` quoted for a POSIX shell where it needs it.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

fn toml_text(config: &ClusterConfig) -> anyhow::Result<String> {
    tidemark_cluster::config::to_toml(config).context("writing the cluster configuration")
}

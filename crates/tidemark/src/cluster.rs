//! `tidemark cluster`: start a development cluster on this machine, show a cluster's
//! status, add and remove nodes.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};
use tidemark_client::HttpClient;
use tidemark_cluster::ClusterConfig;

#[derive(clap::Subcommand)]
pub enum ClusterCommand {
    /// Start N nodes as processes on 127.0.0.1, print their addresses, stop them on Ctrl-C.
    /// Each node's lines are labelled with its id; a node that exits is reported at once,
    /// with the command that starts it again.
    Up {
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// Each node's data goes to DIR/node-N; the cluster file to DIR/cluster.toml.
        #[arg(long, default_value = "tidemark-cluster")]
        data_dir: PathBuf,
        /// Ports from here on, three per node (Raft, HTTP, binary).
        #[arg(long, default_value_t = 9100)]
        base_port: u16,
    },
    /// Leader, term, commit index, and each node's lag, as the node at --server sees them.
    Status(Target),
    /// Add a node (a learner until it has caught up, then a voter).
    AddNode {
        #[command(flatten)]
        target: Target,
        /// The new node's id (unique in the cluster).
        #[arg(long)]
        id: u64,
        /// Its node-to-node (Raft) address, host:port.
        #[arg(long)]
        raft: String,
        /// Its HTTP address, host:port.
        #[arg(long)]
        http: String,
        /// Its binary protocol address, host:port.
        #[arg(long)]
        binary: String,
    },
    /// Remove a voter.
    RemoveNode {
        #[command(flatten)]
        target: Target,
        /// The id of the voter to remove.
        #[arg(long)]
        id: u64,
    },
}

#[derive(clap::Args)]
pub struct Target {
    /// Any node's HTTP address.
    #[arg(long, default_value = "http://127.0.0.1:9101")]
    server: String,
    /// Bearer token (also from TIDEMARK_TOKEN).
    #[arg(long, env = "TIDEMARK_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A PEM file of the certificate authorities to trust for an https node.
    #[arg(long)]
    ca: Option<PathBuf>,
}

impl Target {
    fn client(&self) -> anyhow::Result<HttpClient> {
        crate::remote::client(&self.server, self.token.as_deref(), self.ca.as_ref())
    }
}

pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Up {
            nodes,
            data_dir,
            base_port,
        } => up(nodes, data_dir, base_port),
        ClusterCommand::Status(target) => {
            let status = target.client()?.request("GET", "/v1/cluster", None)?;
            print_status(&status);
            Ok(())
        }
        ClusterCommand::AddNode {
            target,
            id,
            raft,
            http,
            binary,
        } => {
            let body = json!({"id": id, "raft": raft, "http": http, "binary": binary});
            target.client()?.request(
                "POST",
                "/v1/cluster/nodes",
                Some(("application/json", body.to_string().into_bytes())),
            )?;
            println!("node {id} added as a voter");
            Ok(())
        }
        ClusterCommand::RemoveNode { target, id } => {
            target
                .client()?
                .request("DELETE", &format!("/v1/cluster/nodes/{id}"), None)?;
            println!("node {id} removed");
            Ok(())
        }
    }
}

fn print_status(status: &Value) {
    let opt = |v: &Value| match v {
        Value::Null => "-".to_string(),
        v => v.to_string(),
    };
    println!(
        "node {} is {}; leader {}, term {}, committed {}, applied {}, snapshot {}",
        status["node"],
        status["state"].as_str().unwrap_or("?"),
        opt(&status["leader"]),
        status["term"],
        opt(&status["committed"]),
        opt(&status["applied"]),
        opt(&status["snapshot"]),
    );
    println!(
        "{:>4}  {:<6}  {:>10}  {:>8}  addresses",
        "id", "role", "matched", "lag"
    );
    for n in status["nodes"].as_array().into_iter().flatten() {
        println!(
            "{:>4}  {:<6}  {:>10}  {:>8}  http {} binary {} raft {}",
            n["id"].to_string(),
            if n["voter"].as_bool() == Some(true) {
                "voter"
            } else {
                "learner"
            },
            opt(&n["matched"]),
            opt(&n["lag"]),
            n["addrs"]["http"].as_str().unwrap_or("?"),
            n["addrs"]["binary"].as_str().unwrap_or("?"),
            n["addrs"]["raft"].as_str().unwrap_or("?"),
        );
    }
    for n in status["nodes"].as_array().into_iter().flatten() {
        if let Some(ms) = n["unreachable_ms"].as_u64() {
            println!(
                "node {} has been unreachable from node {} for {:.1} s",
                n["id"],
                status["node"],
                ms as f64 / 1000.0
            );
        }
    }
}

/// The node processes of `cluster up`; dropping it stops them (SIGTERM, then SIGKILL).
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

impl LocalCluster {
    /// Writes `config` to DIR/cluster.toml and starts every node with its data in
    /// DIR/node-N; `quiet` sends the nodes' output to DIR/node-N.log instead of the terminal.
    pub fn start(config: ClusterConfig, dir: &Path, quiet: bool) -> anyhow::Result<LocalCluster> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let config_path = dir.join("cluster.toml");
        std::fs::write(&config_path, toml_text(&config)?)
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

fn up(nodes: u64, data_dir: PathBuf, base_port: u16) -> anyhow::Result<()> {
    if !(1..=9).contains(&nodes) {
        bail!("--nodes must be 1 to 9");
    }
    let mut cluster =
        LocalCluster::start(ClusterConfig::local(nodes, base_port), &data_dir, false)?;
    let status = cluster.wait_for_leader(Duration::from_secs(30))?;
    println!(
        "cluster of {nodes} up; configuration in {}",
        cluster.config_path.display()
    );
    print_status(&status);
    println!("Ctrl-C stops every node.");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal handler")?;
    runtime.block_on(async {
        let stop = tidemark_server::shutdown_signal();
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                () = &mut stop => break,
                _ = tick.tick() => {
                    for (id, status) in cluster.newly_exited() {
                        println!("node {id} exited ({status}); the others keep running. To start it again on its data:");
                        println!("    {}", cluster.restart_command(id));
                    }
                }
            }
        }
    });
    // A node started again by hand is not this process's child: it keeps running.
    println!("stopping {} running nodes", cluster.running());
    drop(cluster);
    Ok(())
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

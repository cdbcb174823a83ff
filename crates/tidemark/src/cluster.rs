//! `tidemark cluster`: start a development cluster on this machine, show a cluster's
//! status, add and remove nodes.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};
use tidemark_bench::local_cluster::LocalCluster;
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

//! `tidemark agent`: the agent that spools producers' writes and forwards them to the
//! upstream (docs/pipeline.md), and `tidemark agent status`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use tidemark_agent::{Agent, AgentConfig, Status};
use tidemark_server::shutdown_signal;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AgentArgs {
    #[command(subcommand)]
    command: Option<AgentCommand>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Subcommand)]
enum AgentCommand {
    /// Print a running agent's status: the upstream, the spool, what was forwarded.
    Status {
        /// The agent's HTTP address.
        #[arg(long, default_value = "http://127.0.0.1:8090")]
        agent: String,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// A TOML file whose `[agent]` section configures the agent (docs/pipeline.md);
    /// flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The upstream's binary-protocol addresses, HOST:PORT[,HOST:PORT...] (a cluster's
    /// nodes: any of them takes writes).
    #[arg(long, value_delimiter = ',')]
    upstream: Vec<String>,
    /// The upstream's write token, if it has tokens.
    #[arg(long, env = "TIDEMARK_UPSTREAM_TOKEN")]
    upstream_token: Option<String>,
    /// Where writes are spooled until forwarded [default: tidemark-agent-spool]
    #[arg(long)]
    spool_dir: Option<PathBuf>,
    /// The HTTP address producers write to [default: 127.0.0.1:8090]
    #[arg(long)]
    http: Option<SocketAddr>,
    /// The binary-protocol address producers write to [default: 127.0.0.1:8091]
    #[arg(long)]
    binary: Option<SocketAddr>,
    /// Refuse writes (429 / TRY_LATER) while the spool holds this many bytes not yet
    /// forwarded [default: 1073741824, 1 GiB]
    #[arg(long)]
    spool_max_bytes: Option<u64>,
}

pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    match args.command {
        Some(AgentCommand::Status { agent }) => status(&agent),
        None => serve(args.run),
    }
}

fn serve(args: RunArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => AgentConfig::load(path)?,
        None => AgentConfig::default(),
    };
    if !args.upstream.is_empty() {
        config.upstream = args.upstream;
    }
    if args.upstream_token.is_some() {
        config.upstream_token = args.upstream_token;
    }
    if let Some(dir) = args.spool_dir {
        config.spool_dir = dir;
    }
    if let Some(http) = args.http {
        config.http = http;
    }
    if let Some(binary) = args.binary {
        config.binary = binary;
    }
    if let Some(bytes) = args.spool_max_bytes {
        config.spool_max_bytes = bytes;
    }
    let runtime = crate::serve::long_running_runtime()?;
    runtime.block_on(async move {
        let (spool, upstream) = (config.spool_dir.clone(), config.upstream.join(","));
        let agent = Agent::bind(config).await?;
        println!(
            "tidemark agent spooling in {} — HTTP http://{}  binary {}  → upstream {upstream}  (Ctrl-C stops)",
            spool.display(),
            agent.http_addr(),
            agent.binary_addr(),
        );
        agent.run(shutdown_signal()).await?;
        tracing::info!("stopped");
        anyhow::Ok(())
    })
}

fn status(agent: &str) -> anyhow::Result<()> {
    let url = format!("{}/agent/status", agent.trim_end_matches('/'));
    let body = ureq::get(&url)
        .call()
        .with_context(|| format!("asking {url}"))?
        .body_mut()
        .read_to_string()
        .with_context(|| format!("reading the answer of {url}"))?;
    let status: Status =
        serde_json::from_str(&body).with_context(|| format!("{url} answered {body:?}"))?;
    match &status.upstream_error {
        Some(error) => println!("upstream          {} ({error})", status.upstream),
        None => println!("upstream          {}", status.upstream),
    }
    println!(
        "spooled           {} batches, {} bytes, oldest {:.1} s",
        status.spooled_batches,
        status.spooled_bytes,
        status.oldest_spooled_age_ms as f64 / 1000.0
    );
    println!(
        "forwarded         {} batches, {} bytes (since the agent started)",
        status.forwarded_batches, status.forwarded_bytes
    );
    println!("dead letters      {}", status.dead_letters);
    if let Some(last) = &status.last_dead_letter {
        println!("last dead letter  {last}");
    }
    Ok(())
}

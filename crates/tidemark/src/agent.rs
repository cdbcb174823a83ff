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
    /// Refuse writes the same way while the spool's disk has fewer bytes free than this
    /// [default: 268435456, 256 MiB; 0: until the disk is full]
    #[arg(long)]
    spool_min_free_bytes: Option<u64>,
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
    if let Some(bytes) = args.spool_min_free_bytes {
        config.spool_min_free_bytes = bytes;
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
    print_status(&status, &mut std::io::stdout().lock())?;
    Ok(())
}

/// The status as people read it.
fn print_status(status: &Status, out: &mut impl std::io::Write) -> std::io::Result<()> {
    match &status.upstream_error {
        Some(error) => writeln!(out, "upstream          {} ({error})", status.upstream)?,
        None => writeln!(out, "upstream          {}", status.upstream)?,
    }
    // The two spool figures are not one backlog's count and size: `spooledBatches` counts
    // records not yet forwarded, `spooledBytes` is what the spool's log still holds, which
    // includes forwarded records until they are released. Printed side by side as
    // "N batches, M bytes" they read as a contradiction ("0 batches, 73 bytes").
    writeln!(
        out,
        "not forwarded     {} {} (batches and stream creations), oldest {:.1} s",
        status.spooled_batches,
        plural(status.spooled_batches, "record"),
        status.oldest_spooled_age_ms as f64 / 1000.0
    )?;
    writeln!(
        out,
        "spool log         {} bytes held (records not forwarded, and forwarded ones until released)",
        status.spooled_bytes
    )?;
    writeln!(
        out,
        "forwarded         {} {}, {} bytes (since the agent started)",
        status.forwarded_batches,
        plural(status.forwarded_batches, "record"),
        status.forwarded_bytes
    )?;
    writeln!(out, "dead letters      {}", status.dead_letters)?;
    if let Some(last) = &status.last_dead_letter {
        writeln!(out, "last dead letter  {last}")?;
    }
    Ok(())
}

/// `word`, with an s unless `n` is 1.
fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        word.to_string()
    } else {
        format!("{word}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43 (9): "spooled 0 batches, 73 bytes" read as a contradiction; each figure now
    /// says what it counts.
    #[test]
    fn the_status_says_what_each_figure_counts() {
        let status: Status = serde_json::from_str(
            r#"{"upstream": "down", "spooledBatches": 0, "spooledBytes": 73,
                "oldestSpooledAgeMs": 0, "forwardedBatches": 1, "forwardedBytes": 51,
                "deadLetters": 0}"#,
        )
        .unwrap();
        let mut out = Vec::new();
        print_status(&status, &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(!out.contains("0 batches, 73 bytes"), "{out}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[1],
            "not forwarded     0 records (batches and stream creations), oldest 0.0 s"
        );
        assert!(
            lines[2].starts_with("spool log         73 bytes held"),
            "{out}"
        );
        assert_eq!(
            lines[3],
            "forwarded         1 record, 51 bytes (since the agent started)"
        );
    }
}

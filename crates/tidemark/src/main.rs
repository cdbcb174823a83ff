//! The `tidemark` command: the edge where typed errors become messages for people.

mod agent;
mod allocator;
mod bench;
mod cluster;
mod data_dir;
mod demo;
mod put;
mod query;
mod read;
mod remote;
mod restore;
mod serve;
mod streams;
mod table;
mod tail;
mod tier;
mod verify;

use clap::{Parser, Subcommand};

/// Tidemark: a store for time-ordered event streams.
#[derive(Parser)]
#[command(
    name = "tidemark",
    version,
    about = "Tidemark: a store for time-ordered event streams — a server, a Raft cluster, \
             and commands to write, read, query, verify and benchmark it.",
    after_help = "Docs: README.md, docs/server.md, docs/sql.md, docs/cluster.md. \
                  Logs: RUST_LOG (e.g. RUST_LOG=debug)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: HTTP API and binary protocol over the data directory.
    Serve(serve::ServeArgs),
    /// Run and manage a Raft cluster: start local nodes, show status, change membership.
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCommand,
    },
    /// Run the agent: take writes like a server, spool them, forward them to the upstream
    /// in order, exactly once (docs/pipeline.md); `agent status` shows a running one.
    Agent(agent::AgentArgs),
    /// Tiering to object storage: `tier status` shows a running server's (docs/tiering.md).
    Tier {
        #[command(subcommand)]
        command: tier::TierCommand,
    },
    /// Rebuild a data directory from its tier's bucket after its disk was lost: the streams
    /// and every segment that had moved (docs/tiering.md).
    Restore(restore::RestoreArgs),
    /// Create, list, describe and drop streams.
    Streams {
        #[command(subcommand)]
        command: streams::StreamsCommand,
    },
    /// Append events from JSON lines or CSV (a file or standard input).
    Put(put::PutArgs),
    /// Print the events of a time range, in time order.
    Scan(read::ScanArgs),
    /// Print a stream's events after a position, in the order they were appended; with
    /// --follow, new ones as they come (docs/consuming.md).
    Tail(tail::TailArgs),
    /// Aggregate a stream over a time range, optionally in time buckets.
    Agg(read::AggArgs),
    /// Run a SQL query (docs/sql.md) on a server or a data directory.
    Query(query::QueryArgs),
    /// Run a benchmark workload.
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
    /// Create a stream, ingest 1M events with a progress bar and print a bucketed query.
    Demo(demo::DemoArgs),
    /// Read every event of every stream, checking every checksum; report what was found.
    /// `--repair` cuts a corrupt log at its damage, saving what it cuts beside it.
    Verify(verify::VerifyArgs),
    /// Print a shell completion script: `tidemark completions bash > /etc/bash_completion.d/tidemark`.
    Completions {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
}

/// Logs go to standard error, coloured only on a terminal. `RUST_LOG` chooses what is logged
/// (`debug`, `info,tidemark_cluster=debug`, `openraft=warn`, ...); without it the server logs
/// what it does and the other commands only what went wrong (a torn log tail cut at
/// recovery, a failing flush). openraft's own messages are left to `RUST_LOG`: it logs each
/// retry of an unreachable peer, which the cluster reports itself, once.
fn init_logging(serving: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let default = if serving {
        "info,openraft=error"
    } else {
        "warn,openraft=error"
    };
    let mut complaint = None;
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => spec.parse().unwrap_or_else(|e| {
            complaint = Some(format!(
                "RUST_LOG={spec:?} is not understood ({e}); using {default:?}"
            ));
            default.parse().unwrap_or_default()
        }),
        _ => default.parse().unwrap_or_default(),
    };
    let filter: tracing_subscriber::filter::Targets = filter;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .finish()
        .with(filter)
        .init();
    if let Some(complaint) = complaint {
        tracing::warn!("{complaint}");
    }
}

fn main() {
    allocator::keep_freed_memory();
    let cli = Cli::parse();
    init_logging(matches!(
        cli.command,
        Command::Serve(_) | Command::Cluster { .. } | Command::Agent(_)
    ));
    let outcome = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Cluster { command } => cluster::run(command),
        Command::Agent(args) => agent::run(args),
        Command::Tier { command } => tier::run(command),
        Command::Restore(args) => restore::run(args),
        Command::Streams { command } => streams::run(command),
        Command::Put(args) => put::run(args),
        Command::Scan(args) => read::scan(args),
        Command::Tail(args) => tail::tail(args),
        Command::Agg(args) => read::agg(args),
        Command::Query(args) => query::run(args),
        Command::Bench { command } => bench::run(command),
        Command::Demo(args) => demo::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Completions { shell } => completions(shell),
    };
    if let Err(e) = outcome {
        eprintln!("error: {}", error_message(&e));
        std::process::exit(1);
    }
}

/// Prints the completion script. clap_complete panics when its writer fails, so the script
/// is built in memory first; a reader that stops early (`| head`) is not an error.
fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    use std::io::Write;
    let mut command = <Cli as clap::CommandFactory>::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "tidemark", &mut script);
    match std::io::stdout().lock().write_all(&script) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// The error and its causes, each said once: many errors already name their cause in their
/// own message ("listening on ...: Address already in use"), and `{:#}` would repeat it.
fn error_message(e: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if message.contains(text.trim()) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_message_names_each_cause_once() {
        let bind = tidemark_server::ServeError::Bind {
            what: "HTTP",
            addr: "127.0.0.1:80".parse().unwrap(),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        let cause = std::io::Error::from(std::io::ErrorKind::AddrInUse).to_string();
        let text = error_message(&anyhow::Error::new(bind).context("starting"));
        assert_eq!(text.matches(&cause).count(), 1, "{text}");
        assert_eq!(
            text,
            format!("starting: listening on 127.0.0.1:80 (HTTP): {cause}")
        );
    }
}

//! The `tidemark` command: the edge where typed errors become messages for people.

mod allocator;
mod bench;
mod cluster;
mod demo;
mod put;
mod query;
mod read;
mod serve;
mod streams;
mod verify;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Tidemark: a store for time-ordered event streams.
#[derive(Parser)]
#[command(name = "tidemark", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the embedded database lives.
#[derive(clap::Args, Clone)]
pub struct DataDir {
    /// The database directory (created if missing).
    #[arg(long, default_value = "tidemark-data", global = true)]
    pub data_dir: PathBuf,
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
    /// Create, list, describe and drop streams.
    Streams {
        #[command(subcommand)]
        command: streams::StreamsCommand,
    },
    /// Append events from JSON lines or CSV (a file or standard input).
    Put(put::PutArgs),
    /// Print the events of a time range, in time order.
    Scan(read::ScanArgs),
    /// Aggregate a stream over a time range, optionally in time buckets.
    Agg(read::AggArgs),
    /// Run a SQL query (the subset of docs/sql.md) on a server or a data directory.
    Query(query::QueryArgs),
    /// Run a benchmark workload.
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
    /// Create a stream, ingest 1M events with a progress bar and print a bucketed query.
    Demo(demo::DemoArgs),
    /// Read every event of every stream, checking every checksum; report what was found.
    Verify(DataDir),
}

fn main() {
    allocator::keep_freed_memory();
    // Warnings from the engine (a torn log tail cut at recovery, a failing flush) go to
    // standard error.
    let cli = Cli::parse();
    // The server logs what it does; the other commands only what went wrong.
    let level = match cli.command {
        Command::Serve(_) | Command::Cluster { .. } => {
            tracing_subscriber::filter::LevelFilter::INFO
        }
        _ => tracing_subscriber::filter::LevelFilter::WARN,
    };
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .init();
    let outcome = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Cluster { command } => cluster::run(command),
        Command::Streams { command } => streams::run(command),
        Command::Put(args) => put::run(args),
        Command::Scan(args) => read::scan(args),
        Command::Agg(args) => read::agg(args),
        Command::Query(args) => query::run(args),
        Command::Bench { command } => bench::run(command),
        Command::Demo(args) => demo::run(args),
        Command::Verify(dir) => verify::run(dir),
    };
    if let Err(e) = outcome {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

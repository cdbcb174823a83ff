//! `tidemark bench ...`: the workloads of `workloads.md`, each a subcommand.

mod append;
mod insert;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// W1: event-store ingest, timed until the last event is durable.
    Insert(insert::InsertArgs),
    /// W3: 64 KiB batches to 1, 100 or 2000 streams at fixed rates and at max; latency
    /// percentiles end to end and server-side.
    Append(append::AppendArgs),
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Insert(args) => insert::run(args),
        BenchCommand::Append(args) => append::run(args),
    }
}

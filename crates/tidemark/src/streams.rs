//! `tidemark streams ...`

use anyhow::{Context, Result};
use clap::Subcommand;
use tidemark_core::Schema;
use tidemark_engine::{Db, Options, Retention};
use tidemark_query::time::{format_instant, parse_duration};

use crate::DataDir;

#[derive(Subcommand)]
pub enum StreamsCommand {
    /// Create a stream (again with the same schema does nothing).
    Create {
        name: String,
        /// Fields as NAME:TYPE,... with types BOOLEAN BYTE SHORT INTEGER LONG FLOAT DOUBLE STRING BYTES.
        #[arg(long)]
        schema: String,
        #[command(flatten)]
        dir: DataDir,
    },
    /// List stream names.
    List {
        #[command(flatten)]
        dir: DataDir,
    },
    /// Show a stream's schema, size and time range.
    Info {
        name: String,
        #[command(flatten)]
        dir: DataDir,
    },
    /// Delete every event of a stream (the stream and its schema stay).
    Clear {
        name: String,
        #[command(flatten)]
        dir: DataDir,
    },
    /// Drop a stream's oldest segments once they are older than --max-age (by tstart) or
    /// once the stream exceeds --max-bytes on disk.
    Retention {
        name: String,
        /// e.g. 7d, 12h
        #[arg(long)]
        max_age: Option<String>,
        /// Bytes on disk, e.g. 1000000000
        #[arg(long)]
        max_bytes: Option<u64>,
        #[command(flatten)]
        dir: DataDir,
    },
    /// Delete a stream and all its events.
    Drop {
        name: String,
        #[command(flatten)]
        dir: DataDir,
    },
}

pub fn open(dir: &DataDir) -> Result<Db> {
    Db::open(&dir.data_dir, Options::default())
        .with_context(|| format!("opening {}", dir.data_dir.display()))
}

pub fn run(command: StreamsCommand) -> Result<()> {
    match command {
        StreamsCommand::Create { name, schema, dir } => {
            let schema = Schema::parse_spec(&schema)?;
            open(&dir)?.create_stream(&name, schema)?;
            println!("stream {name:?} ready");
        }
        StreamsCommand::List { dir } => {
            for name in open(&dir)?.list_streams() {
                println!("{name}");
            }
        }
        StreamsCommand::Info { name, dir } => {
            let info = open(&dir)?.stream_info(&name)?;
            println!("stream:      {}", info.name);
            println!("schema:      tstart:LONG,tend:LONG?,{}", info.schema);
            println!("events:      {}", info.event_count);
            match info.time_range {
                Some((a, b)) => println!(
                    "time range:  {} .. {}",
                    format_instant(a),
                    format_instant(b)
                ),
                None => println!("time range:  (empty)"),
            }
            println!(
                "on disk:     {} bytes in {} segments ({} events flushed)",
                info.bytes_on_disk, info.segments, info.flushed_events
            );
            if let Some(b) = info.compressed_bytes_per_event {
                println!("compressed:  {b:.2} bytes per event");
            }
            let r = info.retention;
            if r.max_age_ns.is_some() || r.max_bytes.is_some() {
                println!(
                    "retention:   max age {:?} ns, max bytes {:?}",
                    r.max_age_ns, r.max_bytes
                );
            }
        }
        StreamsCommand::Clear { name, dir } => {
            open(&dir)?.clear(&name)?;
            println!("stream {name:?} cleared");
        }
        StreamsCommand::Retention {
            name,
            max_age,
            max_bytes,
            dir,
        } => {
            let retention = Retention {
                max_age_ns: max_age.as_deref().map(parse_duration).transpose()?,
                max_bytes,
            };
            let db = open(&dir)?;
            db.set_retention(&name, retention)?;
            db.close()?;
            println!(
                "retention of {name:?} set; segments past it are dropped now and at every flush"
            );
        }
        StreamsCommand::Drop { name, dir } => {
            open(&dir)?.drop_stream(&name)?;
            println!("stream {name:?} dropped");
        }
    }
    Ok(())
}

//! `tidemark streams ...`

use anyhow::{anyhow, bail, Result};
use clap::Subcommand;
use tidemark_client::HttpClient;
use tidemark_core::Schema;
use tidemark_engine::{Db, OpenError, Options, Retention, StreamInfo};
use tidemark_query::time::{
    format_duration, format_instant, format_window, parse_duration, parse_window,
};

use crate::data_dir::DataDir;
use crate::remote::{self, Remote};

#[derive(Subcommand)]
pub enum StreamsCommand {
    /// Create a stream (again with the same schema does nothing).
    Create {
        /// The new stream's name.
        name: String,
        /// Fields as NAME:TYPE,... with types BOOLEAN BYTE SHORT INTEGER LONG FLOAT DOUBLE STRING BYTES.
        #[arg(long)]
        schema: String,
        /// Let writes add fields to the schema (as the line-protocol routes do for the
        /// streams they create); without it the schema stays as created.
        #[arg(long)]
        evolving: bool,
        /// The stream's time partitions: whole hours dividing a day (1h, 2h, 3h, 4h, 6h,
        /// 8h, 12h) or whole days (1d to 366d), from the Unix epoch in UTC. No segment
        /// holds events of two, so an old partition tiers and retires by its own age.
        #[arg(long, default_value = "1d")]
        partition: String,
        #[command(flatten)]
        dir: DataDir,
        #[command(flatten)]
        remote: Remote,
    },
    /// List stream names.
    List {
        #[command(flatten)]
        dir: DataDir,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show a stream's schema, size and time range.
    Info {
        /// The stream.
        name: String,
        #[command(flatten)]
        dir: DataDir,
        #[command(flatten)]
        remote: Remote,
    },
    /// Delete every event of a stream (the stream and its schema stay).
    Clear {
        /// The stream.
        name: String,
        #[command(flatten)]
        dir: DataDir,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show a stream's retention, or set it: drop its oldest segments once they are older
    /// than --max-age (by tstart) or once the stream exceeds --max-bytes on disk.
    Retention {
        /// The stream.
        name: String,
        /// e.g. 7d, 12h
        #[arg(long)]
        max_age: Option<String>,
        /// Bytes on disk, e.g. 1000000000
        #[arg(long)]
        max_bytes: Option<u64>,
        #[command(flatten)]
        dir: DataDir,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show a stream's out-of-order window, or set it: an event more than the window
    /// before the stream's newest event is refused (widen it for a backfill).
    Window {
        /// The stream.
        name: String,
        /// A duration (1h, 30d), unlimited, or default (the database's window)
        #[arg(long)]
        set: Option<String>,
        #[command(flatten)]
        dir: DataDir,
        #[command(flatten)]
        remote: Remote,
    },
    /// Delete a stream and all its events.
    Drop {
        /// The stream.
        name: String,
        #[command(flatten)]
        dir: DataDir,
        #[command(flatten)]
        remote: Remote,
    },
}

/// Opens (or creates) the database at `--data-dir`: for the commands that write.
pub fn open_or_create(dir: &DataDir) -> Result<Db> {
    Db::open(&dir.data_dir, Options::default()).map_err(|e| opening_failed(dir, e))
}

/// [`open_or_create`] for `demo`, which has no `--server`: the advice on a held directory
/// must not name an option the command refuses.
pub fn open_or_create_for_demo(dir: &DataDir) -> Result<Db> {
    Db::open(&dir.data_dir, Options::default()).map_err(|e| match e {
        OpenError::Locked(_) => anyhow!(
            "{e}: probably a running `tidemark serve`; stop it, or give the demo a directory \
             of its own (--data-dir demo-data)"
        ),
        e => anyhow::Error::new(e).context(format!("opening {}", dir.data_dir.display())),
    })
}

/// Opens the database at `--data-dir`, which must exist: a command that only reads or
/// changes what is there must not leave an empty database at a mistyped path.
pub fn open(dir: &DataDir) -> Result<Db> {
    let path = &dir.data_dir;
    if !path.exists() {
        bail!(
            "there is no database at {} (`tidemark streams create`, `put` and `serve` create one; \
             or pass --data-dir)",
            path.display()
        );
    }
    if !path.join("segments").is_dir() {
        bail!("{} is not a Tidemark data directory", path.display());
    }
    Db::open(path, Options::default()).map_err(|e| opening_failed(dir, e))
}

fn opening_failed(dir: &DataDir, e: OpenError) -> anyhow::Error {
    match e {
        OpenError::Locked(_) => anyhow!(
            "{e}: probably a running `tidemark serve`; stop it, or go through it with \
             --server URL"
        ),
        e => anyhow::Error::new(e).context(format!("opening {}", dir.data_dir.display())),
    }
}

/// A retention rule as people read it: "max age 7d, max 1000000000 bytes", or "none".
fn describe_retention(retention: &Retention) -> String {
    let mut parts = Vec::new();
    if let Some(ns) = retention.max_age_ns {
        parts.push(format!("max age {}", format_duration(ns)));
    }
    if let Some(bytes) = retention.max_bytes {
        parts.push(format!("max {bytes} bytes on disk"));
    }
    if parts.is_empty() {
        return "none (events are kept until dropped or cleared)".to_string();
    }
    parts.join(", ")
}

/// Where the streams are: a data directory, or a server (`--server`).
enum Catalog {
    Local(Db),
    Server(HttpClient),
}

impl Catalog {
    /// The server if `--server` was given, else the data directory (created only if
    /// `create`).
    fn open(dir: &DataDir, remote: &Remote, create: bool) -> Result<Catalog> {
        Ok(match remote.client()? {
            Some(client) => Catalog::Server(client),
            None if create => Catalog::Local(open_or_create(dir)?),
            None => Catalog::Local(open(dir)?),
        })
    }

    fn create(&self, name: &str, schema: &str, evolving: bool, partition: &str) -> Result<()> {
        match self {
            Catalog::Local(db) => {
                let partition = tidemark_query::time::parse_partition(partition)?;
                db.create_stream_with(name, Schema::parse_spec(schema)?, evolving, partition)?
            }
            Catalog::Server(client) => {
                client.create_stream_with(name, schema, evolving, Some(partition))?;
            }
        }
        Ok(())
    }

    fn list(&self) -> Result<Vec<String>> {
        Ok(match self {
            Catalog::Local(db) => db.list_streams(),
            Catalog::Server(client) => client
                .request("GET", "/v1/streams", None)?
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|info| info["name"].as_str().map(str::to_string))
                .collect(),
        })
    }

    fn info(&self, name: &str) -> Result<StreamInfo> {
        match self {
            Catalog::Local(db) => Ok(db.stream_info(name)?),
            Catalog::Server(client) => remote::stream_info(client, name),
        }
    }

    fn clear(&self, name: &str) -> Result<()> {
        match self {
            Catalog::Local(db) => db.clear(name)?,
            Catalog::Server(client) => {
                client.request("POST", &stream_path(name, "/clear"), None)?;
            }
        }
        Ok(())
    }

    fn drop_stream(&self, name: &str) -> Result<()> {
        match self {
            Catalog::Local(db) => db.drop_stream(name)?,
            Catalog::Server(client) => {
                client.request("DELETE", &stream_path(name, ""), None)?;
            }
        }
        Ok(())
    }

    /// Sets a retention rule; answers it as it is now.
    fn set_retention(
        self,
        name: &str,
        max_age: Option<&str>,
        max_bytes: Option<u64>,
    ) -> Result<Retention> {
        match self {
            Catalog::Local(db) => {
                let retention = Retention {
                    max_age_ns: max_age.map(parse_duration).transpose()?,
                    max_bytes,
                };
                db.set_retention(name, retention)?;
                db.close()?;
                Ok(retention)
            }
            Catalog::Server(client) => {
                let body = serde_json::json!({"maxAge": max_age, "maxBytes": max_bytes});
                client.request(
                    "PUT",
                    &stream_path(name, "/retention"),
                    Some(("application/json", body.to_string().into_bytes())),
                )?;
                Ok(remote::stream_info(&client, name)?.retention)
            }
        }
    }
}

impl Catalog {
    /// Sets a stream's out-of-order window (`None`: the database's); answers the stream.
    fn set_out_of_order_window(self, name: &str, window: &str) -> Result<StreamInfo> {
        let window_ns = parse_window(window)?;
        match self {
            Catalog::Local(db) => {
                db.set_out_of_order_window(name, window_ns)?;
                let info = db.stream_info(name)?;
                db.close()?;
                Ok(info)
            }
            Catalog::Server(client) => {
                let body = serde_json::json!({ "window": window });
                client.request(
                    "PUT",
                    &stream_path(name, "/out-of-order-window"),
                    Some(("application/json", body.to_string().into_bytes())),
                )?;
                remote::stream_info(&client, name)
            }
        }
    }
}

/// The out-of-order window in force, and where it comes from.
fn describe_window(info: &StreamInfo) -> String {
    let source = if info.own_out_of_order_window {
        "the stream's own"
    } else {
        "the database's default"
    };
    format!("{} ({source})", format_window(info.out_of_order_window_ns))
}

fn stream_path(name: &str, rest: &str) -> String {
    format!(
        "/v1/streams/{}{rest}",
        tidemark_client::percent_encode(name)
    )
}

pub fn run(command: StreamsCommand) -> Result<()> {
    match command {
        StreamsCommand::Create {
            name,
            schema,
            evolving,
            partition,
            dir,
            remote,
        } => {
            Catalog::open(&dir, &remote, true)?.create(&name, &schema, evolving, &partition)?;
            println!("stream {name:?} ready");
        }
        StreamsCommand::List { dir, remote } => {
            for name in Catalog::open(&dir, &remote, false)?.list()? {
                println!("{name}");
            }
        }
        StreamsCommand::Info { name, dir, remote } => {
            print_info(&Catalog::open(&dir, &remote, false)?.info(&name)?);
        }
        StreamsCommand::Clear { name, dir, remote } => {
            Catalog::open(&dir, &remote, false)?.clear(&name)?;
            println!("stream {name:?} cleared");
        }
        StreamsCommand::Retention {
            name,
            max_age,
            max_bytes,
            dir,
            remote,
        } => {
            let catalog = Catalog::open(&dir, &remote, false)?;
            if max_age.is_none() && max_bytes.is_none() {
                let now = catalog.info(&name)?.retention;
                println!("retention of {name:?}: {}", describe_retention(&now));
                return Ok(());
            }
            let retention = catalog.set_retention(&name, max_age.as_deref(), max_bytes)?;
            println!(
                "retention of {name:?} set to {}; segments past it are dropped now and at every flush",
                describe_retention(&retention)
            );
        }
        StreamsCommand::Window {
            name,
            set,
            dir,
            remote,
        } => {
            let catalog = Catalog::open(&dir, &remote, false)?;
            match set {
                None => {
                    let info = catalog.info(&name)?;
                    println!(
                        "out-of-order window of {name:?}: {}",
                        describe_window(&info)
                    );
                }
                Some(window) => {
                    let info = catalog.set_out_of_order_window(&name, &window)?;
                    println!(
                        "out-of-order window of {name:?} set to {}",
                        describe_window(&info)
                    );
                }
            }
        }
        StreamsCommand::Drop { name, dir, remote } => {
            Catalog::open(&dir, &remote, false)?.drop_stream(&name)?;
            println!("stream {name:?} dropped");
        }
    }
    Ok(())
}

fn print_info(info: &StreamInfo) {
    println!("stream:      {}", info.name);
    // tstart and tend as SQL, Arrow and psql show them: timestamps (nanoseconds, UTC), not
    // the LONGs they are stored as.
    println!(
        "schema:      tstart:TIMESTAMP,tend:TIMESTAMP?,{}{}",
        info.schema,
        if info.evolving {
            " (evolving: writes may add fields)"
        } else {
            ""
        }
    );
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
    if info.tiered_bytes > 0 {
        println!(
            "tiered:      {} of those bytes in the bucket",
            info.tiered_bytes
        );
    }
    if let Some(b) = info.compressed_bytes_per_event {
        println!("compressed:  {b:.2} bytes per event");
    }
    println!("retention:   {}", describe_retention(&info.retention));
    println!("window:      {}", describe_window(info));
    println!(
        "partition:   {} (from the Unix epoch, UTC; no segment holds events of two)",
        info.partition
    );
    match info.next_position {
        Some(next) => println!("positions:   the next event gets {next}"),
        None => println!("positions:   none (created on a cluster before positions)"),
    }
    for c in &info.consumers {
        println!(
            "consumer:    {} at position {} ({} behind)",
            c.name, c.position, c.behind
        );
    }
}

//! `tidemark tail`: a stream's events after a position, in the order they were appended,
//! printed as `scan` prints events; with `--follow` (through a server) new ones as they come;
//! with `--consumer` from, and committing to, a named consumer's position (docs/consuming.md).

use std::io::{BufRead, BufWriter, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value as Json};
use tidemark_engine::PositionRequest;
use tidemark_query::{format_event_times, Times};

use crate::data_dir::DataDir;
use crate::remote::Remote;
use crate::streams::open;
use crate::table::TimeFormat;

#[derive(Args)]
pub struct TailArgs {
    /// The stream to read.
    stream: String,
    /// Keep reading: print events as they are appended (needs --server).
    #[arg(long, short)]
    follow: bool,
    /// Print the events after this position (default: from the earliest held).
    #[arg(long, conflicts_with_all = ["consumer", "from"])]
    after: Option<u64>,
    /// Print from the first event appended that starts at or after this time (nanoseconds,
    /// RFC 3339, now-1h).
    #[arg(long, conflicts_with = "consumer")]
    from: Option<String>,
    /// Read after this named consumer's position, and commit the position of what was
    /// printed under its name (needs --server).
    #[arg(long)]
    consumer: Option<String>,
    /// Print at most this many events (without --follow: default 1000).
    #[arg(long)]
    limit: Option<usize>,
    /// Print each event as `{"position": P, "event": {...}}`.
    #[arg(long)]
    positions: bool,
    /// How tstart and tend are printed.
    #[arg(long, value_enum, default_value = "ns")]
    time: TimeFormat,
    #[command(flatten)]
    dir: DataDir,
    #[command(flatten)]
    remote: Remote,
}

/// Events a read without `--follow` prints when no `--limit` is given.
const DEFAULT_LIMIT: usize = 1_000;
/// The most events one read by position answers (the server's bound).
const MAX_READ: usize = 10_000;
/// A consumer's position is committed at least this often while events are printed.
const COMMIT_EVERY: Duration = Duration::from_secs(1);

pub fn tail(args: TailArgs) -> Result<()> {
    match args.limit {
        Some(0) => bail!("--limit must be at least 1"),
        Some(limit) if limit > MAX_READ && !args.follow => {
            bail!("--limit is at most {MAX_READ} without --follow (one read)")
        }
        _ => {}
    }
    let out = BufWriter::new(std::io::stdout().lock());
    let mut printer = Printer {
        out,
        positions: args.positions,
        times: args.time.into(),
        printed: 0,
        limit: args.limit.or((!args.follow).then_some(DEFAULT_LIMIT)),
    };
    let result = match args.remote.client()? {
        Some(client) => tail_server(&args, &client, &mut printer),
        None => tail_data_dir(&args, &mut printer),
    };
    match result.and_then(|()| printer.out.flush().map_err(Into::into)) {
        Err(e) if is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

/// Writes events as `scan` does (or with their positions), counting them.
struct Printer<W: Write> {
    out: W,
    positions: bool,
    times: Times,
    printed: usize,
    limit: Option<usize>,
}

impl<W: Write> Printer<W> {
    fn done(&self) -> bool {
        self.limit.is_some_and(|limit| self.printed >= limit)
    }

    fn print(&mut self, position: u64, mut event: Json) -> Result<()> {
        if self.times == Times::Rfc3339 {
            format_event_times(&mut event);
        }
        let line = if self.positions {
            json!({"position": position, "event": event})
        } else {
            event
        };
        writeln!(self.out, "{line}")?;
        self.printed += 1;
        Ok(())
    }
}

/// Through a server: one read, or a follow; a consumer's position committed as it goes.
fn tail_server(
    args: &TailArgs,
    client: &tidemark_client::HttpClient,
    printer: &mut Printer<impl Write>,
) -> Result<()> {
    let mut params = vec![("follow", args.follow.to_string())];
    if let Some(after) = args.after {
        params.push(("after", after.to_string()));
    }
    if let Some(from) = &args.from {
        params.push(("from", from.clone()));
    }
    if let Some(consumer) = &args.consumer {
        params.push(("consumer", consumer.clone()));
    }
    if let Some(limit) = printer.limit {
        params.push(("limit", limit.clamp(1, MAX_READ).to_string()));
    }
    let mut answer = client.read_positions(&args.stream, &params)?;
    let mut committer = args.consumer.as_ref().map(|name| Committer {
        client,
        stream: &args.stream,
        name,
        printed_to: None,
        committed: Instant::now(),
    });
    let mut line = String::new();
    loop {
        if answer.buffer().is_empty() {
            // The next line waits for the server: what was printed is shown (and, when due,
            // committed) now, not when that line comes.
            printer.out.flush()?;
            if let Some(c) = &mut committer {
                c.commit_if_due()?;
            }
        }
        line.clear();
        if answer
            .read_line(&mut line)
            .context("reading the server's answer")?
            == 0
        {
            break;
        }
        let line: Json = serde_json::from_str(line.trim_end())
            .with_context(|| format!("an unexpected line from the server: {line}"))?;
        if let Some(error) = line.get("error") {
            let message = line["message"].as_str().unwrap_or_default();
            bail!("the server ended the read ({error}): {message}");
        }
        let Some(position) = line["position"].as_u64() else {
            continue; // A heartbeat.
        };
        printer.print(position, line["event"].clone())?;
        if let Some(c) = &mut committer {
            c.printed_to = Some(position);
        }
        if printer.done() {
            break;
        }
        if let Some(c) = &mut committer {
            if c.committed.elapsed() >= COMMIT_EVERY {
                printer.out.flush()?;
                c.commit()?;
            }
        }
    }
    printer.out.flush()?;
    if let Some(c) = &mut committer {
        c.commit()?;
    }
    Ok(())
}

/// Commits a named consumer's position: what was printed (and flushed) so far.
struct Committer<'a> {
    client: &'a tidemark_client::HttpClient,
    stream: &'a str,
    name: &'a str,
    printed_to: Option<u64>,
    committed: Instant,
}

impl Committer<'_> {
    fn commit_if_due(&mut self) -> Result<()> {
        if self.committed.elapsed() >= COMMIT_EVERY {
            self.commit()?;
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        self.committed = Instant::now();
        let Some(position) = self.printed_to.take() else {
            return Ok(());
        };
        let path = format!(
            "/v1/streams/{}/consumers/{}",
            tidemark_client::percent_encode(self.stream),
            tidemark_client::percent_encode(self.name)
        );
        let body = json!({"position": position}).to_string().into_bytes();
        self.client
            .request("POST", &path, Some(("application/json", body)))
            .with_context(|| format!("committing position {position} of {:?}", self.name))?;
        Ok(())
    }
}

/// On a data directory: one read (nothing else appends to a directory this command holds).
fn tail_data_dir(args: &TailArgs, printer: &mut Printer<impl Write>) -> Result<()> {
    if args.follow || args.consumer.is_some() {
        bail!(
            "--follow and --consumer read through a running server (--server URL): a data \
             directory this command opens takes no appends meanwhile"
        );
    }
    let db = open(&args.dir)?;
    let after = match &args.from {
        Some(from) => {
            let time = tidemark_query::time::parse_instant(from, tidemark_query::time::now_ns())
                .with_context(|| format!("--from {from:?}"))?;
            // Position 0 is the first a stream gives: after none is from the earliest.
            db.first_position_from(&args.stream, time)?.checked_sub(1)
        }
        None => args.after,
    };
    let request = PositionRequest::after(after, printer.limit.unwrap_or(DEFAULT_LIMIT));
    let read = db.read_positions(&args.stream, &request)?;
    let events = &read.events;
    for row in 0..events.len() {
        if let Some(position) = events.position_at(row) {
            printer.print(position, tidemark_core::json::event_to_json(events, row))?;
        }
    }
    Ok(())
}

//! The Graphite plaintext listener: `path value timestamp` lines over TCP, as carbon takes
//! them on port 2003, into one stream (`[graphite] stream`) with fields `path: STRING`,
//! `value: DOUBLE` and one STRING field per Graphite tag. Writes go through
//! [`crate::ingest`], the seam of every protocol whose rows name their fields, so the stream
//! is created (evolving) on the first line and grows by the tags lines bring.
//!
//! The protocol has no answers: a sender learns nothing of a bad line, so a bad line is
//! counted (`tidemark_protocol_bad_lines_total`), logged at most every few seconds, and
//! skipped; the connection stays open and the lines around it are stored. Lines are stored
//! in batches (by count, bytes, or a short delay). Back-pressure is TCP's own: while the
//! server is over its write budget, a connection stops reading and retries its batch, so the
//! sender's socket buffer fills and it waits; nothing read is dropped for being too many.
//!
//! Plain TCP only: Graphite has neither TLS nor tokens, so this listener has neither (the
//! docs say to keep it on loopback or a private network).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_core::Value;
use tidemark_protocol::graphite::{decode_line, GraphiteError, MAX_LINE_BYTES};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::admission::Permit;
use crate::ingest::{self, Numbered, Row};
use crate::metrics::Protocol;
use crate::shutdown::{close_unanswered, serve_connections, stopped, Serving};
use crate::state::{AppState, Namespace};
use crate::store::StoreErrorKind;

const NAMESPACE: Namespace = Namespace::Replicated;

// What a connection holds is bounded by these: a read buffer, a part line, a batch
// (with all connections open, 512 × (16 KiB + 64 KiB + 256 KiB) = 168 MiB at most).

/// A batch is stored when it has this many lines...
const BATCH_LINES: usize = 10_000;
/// ...or this many bytes...
const BATCH_BYTES: usize = 256 * 1024;
/// ...or when its first line has waited this long (a sender of one line a minute still
/// sees it stored at once).
const BATCH_DELAY: Duration = Duration::from_millis(50);

/// Connections served at once; more are closed as they come.
const MAX_CONNECTIONS: usize = 512;

const READ_BUFFER_BYTES: usize = 16 * 1024;

/// Bad lines are logged at most this often (each log says how many were not).
const BAD_LINE_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The longest wait between two attempts to store a batch the server pushed back.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Accepts connections until `shutdown` turns true, then lets each store what it has read
/// (at most `limits.shutdown_grace_ms`).
pub async fn serve(state: AppState, listener: TcpListener, shutdown: watch::Receiver<bool>) {
    let config = state.config().graphite.as_ref();
    let shared = Arc::new(Listener {
        stream: config.map_or_else(crate::config::Graphite::default_stream, |g| {
            g.stream.clone()
        }),
        max_fields: config.map_or_else(crate::config::Graphite::default_max_fields, |g| {
            g.max_fields
        }),
        bad_lines: BadLineLog::default(),
    });
    let serving = Serving {
        what: "graphite",
        max_connections: MAX_CONNECTIONS,
        grace: state.config().limits.shutdown_grace(),
        draining: "graphite connections (with the lines not yet stored)",
    };
    let serve = |socket, peer| {
        Connection::new(state.clone(), shared.clone(), peer).serve(socket, shutdown.clone())
    };
    serve_connections(listener, serving, shutdown.clone(), serve, close_unanswered).await;
}

/// What every connection of the listener shares.
struct Listener {
    stream: String,
    /// `graphite.max_fields`.
    max_fields: usize,
    bad_lines: BadLineLog,
}

/// Logs a bad line, but not more often than [`BAD_LINE_LOG_INTERVAL`]: a sender stuck on a
/// wrong format would otherwise write the log full.
#[derive(Default)]
struct BadLineLog {
    /// When the last log was written, and the bad lines since then that were not logged.
    state: Mutex<(Option<Instant>, u64)>,
}

impl BadLineLog {
    fn record(&self, peer: SocketAddr, line: &[u8], why: &dyn std::fmt::Display) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        let (last, unlogged) = &mut *state;
        if last.is_some_and(|at| at.elapsed() < BAD_LINE_LOG_INTERVAL) {
            *unlogged += 1;
            return;
        }
        let shown = String::from_utf8_lossy(&line[..line.len().min(200)]);
        tracing::warn!(
            %peer,
            line = %shown.escape_debug(),
            unlogged_since_last = *unlogged,
            "graphite: bad line skipped: {why}"
        );
        *last = Some(Instant::now());
        *unlogged = 0;
    }
}

/// One sender's connection: the part line it has sent so far and the lines not yet stored.
struct Connection {
    state: AppState,
    listener: Arc<Listener>,
    peer: SocketAddr,
    /// The start of a line whose end has not come yet.
    partial: Vec<u8>,
    /// The line being received is longer than [`MAX_LINE_BYTES`]: skipped up to its end.
    skipping: bool,
    /// Lines read and not yet stored, back to back, and where each is.
    batch: Vec<u8>,
    lines: Vec<Range<usize>>,
    /// When the batch's first line came.
    since: Option<Instant>,
}

impl Connection {
    fn new(state: AppState, listener: Arc<Listener>, peer: SocketAddr) -> Connection {
        Connection {
            state,
            listener,
            peer,
            partial: Vec::new(),
            skipping: false,
            batch: Vec::new(),
            lines: Vec::new(),
            since: None,
        }
    }

    async fn serve(mut self, mut socket: TcpStream, mut shutdown: watch::Receiver<bool>) {
        let mut buffer = vec![0u8; READ_BUFFER_BYTES];
        loop {
            let deadline = self.since.map(|since| since + BATCH_DELAY);
            tokio::select! {
                _ = stopped(&mut shutdown) => break,
                _ = sleep_until(deadline), if deadline.is_some() => self.store().await,
                read = socket.read(&mut buffer) => match read {
                    Ok(0) => break,
                    Ok(n) => {
                        self.receive(&buffer[..n]);
                        if self.lines.len() >= BATCH_LINES || self.batch.len() >= BATCH_BYTES {
                            self.store().await;
                        }
                    }
                    Err(e) => {
                        tracing::debug!(peer = %self.peer, error = %e, "graphite connection failed");
                        break;
                    }
                },
            }
        }
        if !self.partial.is_empty() && !self.skipping {
            // Carbon drops it too: a line cut by a closed connection may be a cut number.
            let partial = std::mem::take(&mut self.partial);
            self.bad_line(&partial, &"the connection closed before the line ended");
        }
        self.store().await;
    }

    /// Takes the complete lines of `bytes` into the batch; keeps the rest for later.
    fn receive(&mut self, mut bytes: &[u8]) {
        while let Some(end) = memchr::memchr(b'\n', bytes) {
            let (line, rest) = (&bytes[..end], &bytes[end + 1..]);
            bytes = rest;
            if self.skipping {
                self.skipping = false;
                continue;
            }
            if self.partial.is_empty() {
                self.take_line(line);
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                self.take_line(&whole);
                whole.clear();
                self.partial = whole;
            }
        }
        if self.skipping {
            return;
        }
        if self.partial.len() + bytes.len() > MAX_LINE_BYTES {
            let start = self.partial.clone();
            self.bad_line(&start, &GraphiteError::TooLong);
            self.partial.clear();
            self.skipping = true;
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }

    /// A whole line, kept as text until its batch is stored (decoded then, once: see
    /// [`Connection::rows`]).
    fn take_line(&mut self, line: &[u8]) {
        let start = self.batch.len();
        self.batch.extend_from_slice(line);
        self.lines.push(start..self.batch.len());
        self.since.get_or_insert_with(Instant::now);
    }

    fn bad_line(&self, line: &[u8], why: &dyn std::fmt::Display) {
        self.state.metrics().protocol_bad_line(Protocol::Graphite);
        self.listener.bad_lines.record(self.peer, line, why);
    }

    /// Stores the batch. Pushed back (over budget, no leader yet), it waits and tries again,
    /// reading nothing meanwhile; a line the store refuses (a tag whose name a stream cannot
    /// have, or whose field has another type) is skipped and the rest stored. A batch whose
    /// columns could never fit the write budget is stored in smaller parts.
    async fn store(&mut self) {
        let mut backoff = Duration::from_millis(u64::from(self.state.retry_after_ms()).max(10));
        // How many of the lines the next attempt stores.
        let mut part = self.lines.len();
        while !self.lines.is_empty() {
            // A batch is admitted like a request body, and never more than one may be (or a
            // server configured with a tiny body limit would never admit it).
            let part_bytes: usize = self.lines[..part.min(self.lines.len())]
                .iter()
                .map(ExactSizeIterator::len)
                .sum();
            let bytes = part_bytes.min(self.state.config().limits.max_body_bytes);
            let Some(mut permit) = self.state.admission().try_admit(bytes) else {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            };
            let mut fields = self.stream_fields().await;
            let now = tidemark_query::time::now_ns();
            let (rows, taken, budget_full) = self.rows(now, part, &mut fields, &mut permit);
            if rows.is_empty() {
                part = match budget_full {
                    // Not one row fitted beside the batch's text: admit less text (a
                    // batch's text alone may take the whole budget), and once a line's
                    // alone does not fit, wait for others to give some back.
                    true if part > 1 => part / 2,
                    true => {
                        drop(permit);
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        1
                    }
                    false => self.lines.len(),
                };
                continue;
            }
            let bytes = self.lines[..taken].iter().map(ExactSizeIterator::len).sum();
            let result = ingest::write(
                self.state.store(NAMESPACE),
                self.state.metrics(),
                rows,
                Numbered::Line,
                permit,
                self.listener.max_fields,
                bytes,
            )
            .await;
            match result {
                Ok(written) => {
                    let metrics = self.state.metrics();
                    metrics.protocol_stored(Protocol::Graphite, written.events);
                    self.lines.drain(..taken);
                    part = self.lines.len();
                }
                Err(refusal) if refusal.error.kind == StoreErrorKind::TooLarge && taken > 1 => {
                    part = taken / 2;
                }
                Err(refusal) if refusal.error.kind == StoreErrorKind::Invalid => {
                    let Some(line) = refusal.line.filter(|&l| (1..=taken).contains(&l)) else {
                        self.give_up(&refusal.error);
                        return;
                    };
                    let range = self.lines.remove(line - 1);
                    part = part.saturating_sub(1).max(1);
                    let text = self.batch[range].to_vec();
                    // The message names the line within the batch, which means nothing to
                    // whoever reads the log: the line itself is shown instead.
                    let message = refusal.error.message;
                    let why = message
                        .split_once(": ")
                        .map_or(message.as_str(), |(_, why)| why);
                    self.bad_line(&text, &why);
                }
                Err(refusal) if refusal.error.is_retryable() => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(refusal) => {
                    self.give_up(&refusal.error);
                    return;
                }
            }
        }
        self.clear();
    }

    /// The stream's field names (lower case) as the store has them now; `path` and `value`
    /// for a stream not created yet.
    async fn stream_fields(&self) -> HashSet<String> {
        let store = self.state.store(NAMESPACE);
        match store.stream_schema(&self.listener.stream).await {
            Ok(schema) => schema
                .fields()
                .iter()
                .map(|f| f.name.to_lowercase())
                .collect(),
            Err(_) => ["path", "value"].map(String::from).into(),
        }
    }

    /// A batch the store cannot take as it is and never will (it went read-only, or refused
    /// it whole): its lines are counted as refused and logged, and the connection goes on.
    fn give_up(&mut self, error: &crate::store::StoreError) {
        self.state.metrics().protocol_refused(Protocol::Graphite);
        tracing::error!(
            peer = %self.peer,
            lines = self.lines.len(),
            error = %error,
            "graphite: a batch of lines could not be stored"
        );
        self.clear();
    }

    fn clear(&mut self) {
        self.batch.clear();
        self.lines.clear();
        self.since = None;
    }

    /// The first `part` of the batch's lines as rows, and how many lines of the batch they
    /// are; a timestamp of -1 is `now`. A line that does not decode is counted and skipped,
    /// and a blank one dropped, here: the lines left are the rows', so a refusal's line
    /// number is a position in `lines`. (The text is kept rather than the rows, which take
    /// several times its memory; a batch is decoded again only when its store is retried.)
    /// Each row is admitted on `permit` as it is made, and the rows stop where the budget
    /// does (then the last value is true): fewer than `part` lines, none if it is full.
    fn rows(
        &mut self,
        now: i64,
        part: usize,
        fields: &mut HashSet<String>,
        permit: &mut Permit,
    ) -> (Vec<Row>, usize, bool) {
        let part = part.min(self.lines.len());
        let mut rows = Vec::with_capacity(part);
        let mut kept = Vec::with_capacity(self.lines.len());
        let mut lines = std::mem::take(&mut self.lines);
        let rest = lines.split_off(part);
        let mut lines = lines.into_iter();
        while let Some(range) = lines.next() {
            let metric = match decode_line(&self.batch[range.clone()], now) {
                None => continue,
                Some(Err(e)) => {
                    self.bad_line(&self.batch[range], &e);
                    continue;
                }
                Some(Ok(metric)) => metric,
            };
            // Lines whose tags would grow the stream past graphite.max_fields are refused
            // here, in one pass (the store would refuse them one by one).
            // Known tags (most lines' every tag) cost a lookup, no allocation.
            let new: Vec<String> = metric
                .tags
                .iter()
                .filter(|(tag, _)| !fields.contains(*tag))
                .map(|(tag, _)| tag.to_lowercase())
                .filter(|tag| !fields.contains(tag))
                .collect();
            if fields.len() + new.len() > self.listener.max_fields {
                let why = format!(
                    "its tags would grow stream {:?} past graphite.max_fields ({})",
                    self.listener.stream, self.listener.max_fields
                );
                self.bad_line(&self.batch[range], &why);
                continue;
            }
            fields.extend(new);
            let mut values = Vec::with_capacity(2 + metric.tags.len());
            values.push(("path".to_string(), Value::String(metric.path.to_string())));
            values.push(("value".to_string(), Value::Double(metric.value)));
            for (tag, value) in metric.tags {
                values.push((tag.to_string(), Value::String(value.to_string())));
            }
            let row = Row {
                line: kept.len() + 1,
                stream: self.listener.stream.clone(),
                tstart: metric.tstart,
                values,
            };
            if !permit.grow(row.heap_bytes()) {
                // Tags it brought stay in `fields`: the next attempt reads them again.
                kept.push(range);
                kept.extend(lines.by_ref());
                let taken = rows.len();
                kept.extend(rest);
                self.lines = kept;
                return (rows, taken, true);
            }
            kept.push(range);
            rows.push(row);
        }
        let taken = kept.len();
        kept.extend(rest);
        self.lines = kept;
        (rows, taken, false)
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

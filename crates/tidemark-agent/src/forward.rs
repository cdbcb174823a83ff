//! Forwarding: the spool's records, in log order, to the upstream over the binary
//! protocol, one cut at a time (`position` says why one at a time, and why a cut is
//! recorded before it is sent).
//!
//! A cut is one catalog change (sent as COMMAND), or a run of appends to one stream built
//! for the same fields, up to `forward_max_bytes` as the upstream reads them (a slot per
//! row; the spool's log holds columns compact), sent as one TAGGED_APPEND with the
//! agent's producer id and the cut's end as its sequence. The answer decides what happens:
//! - ACK: the cut is forwarded; the next starts where it ended.
//! - TRY_LATER: the upstream pushes back; the same cut again after its hint (bounded).
//! - no answer (down, timed out, connection lost), UNAVAILABLE, INTERNAL: the same cut
//!   again with bounded backoff, on the next upstream address (a cluster's next node).
//! - refused as invalid: a cut of several records is cut down to its first record (so that
//!   one bad batch does not take its neighbours along); a single record goes to the dead
//!   letters, and forwarding goes on behind it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tidemark_client::{BinaryClient, ClientError};
use tidemark_core::command::{self, Command};
use tidemark_core::{BatchBuilder, EventBatch, Schema};
use tidemark_engine::producers::ProducerTable;
use tidemark_engine::{LoggedRecord, Spool};
use tidemark_storage::log::FRAME_HEADER;

use crate::config::{upstream_address, AgentConfig};
use crate::dead_letters::DeadLetters;
use crate::position::{spool_error, Cut, Position};
use crate::status::{StatusBoard, Upstream};
use crate::AgentError;

/// How often an idle forwarder looks for newly spooled records.
const IDLE_POLL: Duration = Duration::from_millis(2);
/// The first wait after a failed attempt; it doubles up to `max_backoff_ms`.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);

pub struct Forwarder {
    spool: Arc<Spool>,
    dir: PathBuf,
    position: Position,
    /// Whether `position` has moved past what `forwarding.json` says.
    unsaved: bool,
    /// Producers' tags as of `position.forwarded`.
    producers: ProducerTable,
    upstream: UpstreamLink,
    timeout: Duration,
    max_backoff: Duration,
    max_cut_bytes: usize,
    status: Arc<StatusBoard>,
    dead_letters: DeadLetters,
    /// The upstream has not taken records since this outage began.
    outage: Option<Outage>,
}

/// What one cut sends.
enum Payload {
    /// Every record of the cut was a producer's retry: nothing to send.
    Nothing,
    Catalog(Vec<u8>),
    Append {
        stream: String,
        batch: EventBatch,
    },
}

struct PreparedCut {
    cut: Cut,
    payload: Payload,
    records: u64,
    /// The first record, for the dead letters.
    first: LoggedRecord,
    stream: String,
    /// Producers' tags with the cut's applied.
    producers: ProducerTable,
}

/// How an attempt ended.
enum Verdict {
    Forwarded,
    Retry {
        after: Duration,
        upstream: Upstream,
        reconnect: bool,
        /// What the attempt met, for the status and the log.
        reason: String,
    },
    Refused(String),
}

/// How often the log says again that the upstream is still not taking records.
const OUTAGE_REMINDER: Duration = Duration::from_secs(30);

/// An outage as the log tells it: its first failure, a reminder every
/// [`OUTAGE_REMINDER`] with what the spool holds, and its end.
#[derive(Debug)]
struct Outage {
    since: Instant,
    reminded: Instant,
}

impl Forwarder {
    pub fn open(spool: Arc<Spool>, config: &AgentConfig) -> Result<Forwarder, AgentError> {
        let dir = config.spool_dir.clone();
        let position = Position::load_or_create(&dir, spool.spooled_start())?;
        let (start, end) = (spool.spooled_start(), spool.spooled_end());
        if position.forwarded < start || position.forwarded > end {
            return Err(spool_error(
                &dir,
                format!(
                    "forwarding stopped at LSN {}, but the spool holds {start} to {end}",
                    position.forwarded
                ),
            ));
        }
        spool
            .release_spooled_before(position.forwarded)
            .map_err(|e| spool_error(&dir, e.to_string()))?;
        let (dead_letters, dead) = DeadLetters::open(&dir)?;
        // What was spooled before this start has waited since (at least) the spool's
        // log last changed.
        let since = spooled_since(&dir);
        let status = Arc::new(StatusBoard::new(
            spool.clone(),
            position.forwarded,
            dead,
            since,
        ));
        let addresses = config
            .upstream
            .iter()
            .map(|u| upstream_address(u).map_err(AgentError::Config))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Forwarder {
            producers: position.producer_table(),
            spool,
            dir,
            position,
            unsaved: false,
            upstream: UpstreamLink {
                addresses,
                next: 0,
                token: config.upstream_token.clone(),
                client: None,
            },
            timeout: config.upstream_timeout(),
            max_backoff: config.max_backoff(),
            max_cut_bytes: config.forward_max_bytes,
            status,
            dead_letters,
            outage: None,
        })
    }

    pub fn status(&self) -> Arc<StatusBoard> {
        self.status.clone()
    }

    /// Forwards on a thread of its own until `stopping` is set. If forwarding fails (the
    /// spool cannot be read, the position not written) the error goes to `failed`: the
    /// agent then stops rather than take writes it would never forward.
    pub fn spawn(
        self,
        stopping: Arc<AtomicBool>,
        failed: tokio::sync::oneshot::Sender<AgentError>,
    ) -> Result<JoinHandle<()>, AgentError> {
        let dir = self.dir.clone();
        std::thread::Builder::new()
            .name("tidemark-forward".into())
            .spawn(move || {
                if let Err(e) = self.run(&stopping) {
                    let _ = failed.send(e);
                }
            })
            .map_err(|e| spool_error(&dir, format!("starting the forwarding thread: {e}")))
    }

    fn run(mut self, stopping: &AtomicBool) -> Result<(), AgentError> {
        while !stopping.load(Ordering::Acquire) {
            self.status.refresh();
            let Some(prepared) = self.next_cut()? else {
                // Idle: the moved mark becomes durable now, not only with the next cut.
                self.save()?;
                std::thread::sleep(IDLE_POLL);
                continue;
            };
            if self.position.in_flight != Some(prepared.cut) {
                self.position.in_flight = Some(prepared.cut);
                self.save_anyway()?;
            }
            self.forward(prepared, stopping)?;
        }
        self.save()
    }

    /// Logs an attempt that did not forward: the first of an outage, then a reminder every
    /// [`OUTAGE_REMINDER`] with what waits in the spool.
    fn tell_outage(&mut self, upstream: Upstream, reason: &str) {
        let now = Instant::now();
        match &mut self.outage {
            None => {
                tracing::warn!(
                    upstream = upstream.label(),
                    %reason,
                    "the upstream does not take records; spooling until it does"
                );
                self.outage = Some(Outage {
                    since: now,
                    reminded: now,
                });
            }
            Some(outage) if now.duration_since(outage.reminded) >= OUTAGE_REMINDER => {
                outage.reminded = now;
                let status = self.status.snapshot();
                tracing::warn!(
                    upstream = upstream.label(),
                    %reason,
                    for_s = now.duration_since(outage.since).as_secs(),
                    spooled_batches = status.spooled_batches,
                    spooled_bytes = status.spooled_bytes,
                    oldest_s = status.oldest_spooled_age_ms / 1000,
                    "the upstream still does not take records"
                );
            }
            Some(_) => {}
        }
    }

    /// Sends `prepared` until it is forwarded, dead-lettered or cut down (then its first
    /// record is the next cut), or the agent stops.
    fn forward(&mut self, prepared: PreparedCut, stopping: &AtomicBool) -> Result<(), AgentError> {
        let mut backoff = FIRST_BACKOFF;
        loop {
            if stopping.load(Ordering::Acquire) {
                return Ok(());
            }
            match self.upstream.send(
                &prepared.payload,
                self.position.producer,
                prepared.cut,
                self.timeout,
            ) {
                Verdict::Forwarded => {
                    if let Some(outage) = self.outage.take() {
                        tracing::info!(
                            after_s = outage.since.elapsed().as_secs_f64(),
                            "the upstream takes records again; forwarding the spool"
                        );
                    }
                    self.status.set_upstream(Upstream::Up, None);
                    self.done(&prepared);
                    return Ok(());
                }
                Verdict::Retry {
                    after,
                    upstream,
                    reconnect,
                    reason,
                } => {
                    self.tell_outage(upstream, &reason);
                    self.status.set_upstream(upstream, Some(reason));
                    if reconnect {
                        self.upstream.next_address();
                    }
                    let wait = if upstream == Upstream::PushingBack {
                        after.clamp(FIRST_BACKOFF, self.max_backoff)
                    } else {
                        backoff
                    };
                    backoff = (backoff * 2).min(self.max_backoff);
                    sleep_unless_stopping(wait, stopping);
                }
                Verdict::Refused(reason) if prepared.records > 1 => {
                    // Nothing of the cut was stored: its first record alone goes next.
                    tracing::info!(%reason, cut = ?prepared.cut, "the upstream refused a cut; sending its records one by one");
                    let first_end = prepared.first.lsn + record_len(&prepared.first);
                    self.position.in_flight = Some(Cut {
                        from: prepared.cut.from,
                        to: first_end,
                    });
                    return self.save_anyway();
                }
                Verdict::Refused(reason) => {
                    tracing::warn!(%reason, lsn = prepared.first.lsn, stream = %prepared.stream, "the upstream refused a record: kept in dead-letters/");
                    self.dead_letters.add(
                        prepared.first.lsn,
                        &prepared.stream,
                        &reason,
                        &prepared.first.payload,
                    )?;
                    self.status.dead_lettered(format!(
                        "record {} of stream {}: {reason}",
                        prepared.first.lsn, prepared.stream
                    ));
                    self.done(&prepared);
                    return Ok(());
                }
            }
        }
    }

    /// The cut recorded as in flight, or the next one from the forwarded mark; `None`
    /// when nothing more is spooled.
    fn next_cut(&mut self) -> Result<Option<PreparedCut>, AgentError> {
        let from = self.position.forwarded;
        let (limit, exact_end) = match self.position.in_flight {
            Some(cut) => ((cut.to - cut.from) as usize, Some(cut.to)),
            None => (self.max_cut_bytes, None),
        };
        let mut records = self
            .spool
            .read_spooled(from, limit)
            .map_err(|e| spool_error(&self.dir, e.to_string()))?;
        if let Some(end) = exact_end {
            records.retain(|r| r.lsn < end);
            let read_end = records.last().map(|r| r.lsn + record_len(r));
            if read_end != Some(end) {
                return Err(spool_error(
                    &self.dir,
                    format!("the cut in flight ends at LSN {end}, but the spool's records end at {read_end:?} there"),
                ));
            }
        }
        if records.is_empty() {
            return Ok(None);
        }
        self.prepare(records, exact_end.is_some()).map(Some)
    }

    /// The cut that starts with `records[0]`: a catalog change alone, or the appends to
    /// its stream with its fields that follow it (all of `records` when `whole`).
    fn prepare(&self, records: Vec<LoggedRecord>, whole: bool) -> Result<PreparedCut, AgentError> {
        let corrupt = |lsn: u64, e: String| {
            spool_error(
                &self.dir,
                format!("the spooled record at LSN {lsn} does not decode: {e}"),
            )
        };
        let first = &records[0];
        let command =
            command::decode(&first.payload).map_err(|e| corrupt(first.lsn, e.to_string()))?;
        let stream = command.stream().to_string();
        let mut producers = self.producers.clone();
        if command.is_catalog_change() {
            return Ok(PreparedCut {
                cut: Cut {
                    from: first.lsn,
                    to: first.lsn + record_len(first),
                },
                payload: Payload::Catalog(first.payload.clone()),
                records: 1,
                first: first.clone(),
                stream,
                producers,
            });
        }
        let schema = self.schema_of(&stream)?;
        let mut batches: Vec<EventBatch> = Vec::new();
        let mut fields = None;
        let mut end = first.lsn;
        let mut taken = 0u64;
        // What the cut takes as the upstream reads it: the log holds columns compact (a
        // null is a bit), the binary protocol a slot per row, up to 64 times larger.
        let mut sent_bytes = 0usize;
        for record in &records {
            let Command::Append {
                name,
                batch,
                producer,
            } = command::decode(&record.payload).map_err(|e| corrupt(record.lsn, e.to_string()))?
            else {
                break; // a catalog change ends the run
            };
            let record_fields =
                batch_fields(batch).ok_or_else(|| corrupt(record.lsn, "no field count".into()))?;
            if name != stream || fields.is_some_and(|f| f != record_fields) {
                break;
            }
            if record_fields > schema.len() {
                return Err(corrupt(
                    record.lsn,
                    format!("{record_fields} fields, the stream has {}", schema.len()),
                ));
            }
            let retry = producer.is_some_and(|tag| producers.is_retry(&tag));
            let decoded = if retry {
                None // a producer's retry: its first attempt is forwarded already
            } else {
                let prefix = Arc::new(schema.project(&(0..record_fields).collect::<Vec<_>>()));
                let mut r = tidemark_storage::bytes::Reader::new(batch, "spooled batch");
                let decoded = tidemark_core::wire::decode_batch(&mut r, &prefix)
                    .map_err(|e| corrupt(record.lsn, e.to_string()))?;
                let size = tidemark_core::wire::encoded_len(&decoded);
                // A cut in flight is sent again exactly as it was recorded; a new one ends
                // before the record that would take it past the limit (but takes one).
                if !whole && taken > 0 && sent_bytes + size > self.max_cut_bytes {
                    break;
                }
                sent_bytes += size;
                Some(decoded)
            };
            fields = Some(record_fields);
            end = record.lsn + record_len(record);
            taken += 1;
            if let Some(tag) = producer.filter(|_| !retry) {
                producers.record(&tag);
            }
            batches.extend(decoded);
        }
        assert!(taken > 0, "a cut of appends takes its first record");
        if whole && end != records.last().map_or(end, |r| r.lsn + record_len(r)) {
            return Err(spool_error(
                &self.dir,
                format!(
                    "the cut in flight from LSN {} no longer holds one stream's appends",
                    first.lsn
                ),
            ));
        }
        let payload = match batches.len() {
            0 => Payload::Nothing,
            1 => Payload::Append {
                stream: stream.clone(),
                batch: batches.remove(0),
            },
            _ => Payload::Append {
                stream: stream.clone(),
                batch: concat(batches).map_err(|e| corrupt(first.lsn, e))?,
            },
        };
        Ok(PreparedCut {
            cut: Cut {
                from: first.lsn,
                to: end,
            },
            payload,
            records: taken,
            first: first.clone(),
            stream,
            producers,
        })
    }

    fn schema_of(&self, stream: &str) -> Result<Arc<Schema>, AgentError> {
        self.spool
            .stream_schema(stream)
            .map_err(|e| spool_error(&self.dir, format!("a spooled append to {stream:?}: {e}")))
    }

    /// The cut left the spool: the mark moves past it (saved with the next cut, or when
    /// idle) and the status follows.
    fn done(&mut self, prepared: &PreparedCut) {
        let cut = prepared.cut;
        assert_eq!(
            cut.from, self.position.forwarded,
            "cuts are forwarded in order"
        );
        self.position.forwarded = cut.to;
        self.position.in_flight = None;
        self.producers = prepared.producers.clone();
        self.unsaved = true;
        self.status
            .forwarded(prepared.records, cut.to - cut.from, cut.to);
    }

    /// Saves the position if it moved, then lets the spool delete what it passed.
    fn save(&mut self) -> Result<(), AgentError> {
        if self.unsaved {
            self.save_anyway()?;
        }
        Ok(())
    }

    fn save_anyway(&mut self) -> Result<(), AgentError> {
        self.position.set_producer_table(&self.producers);
        self.position.store(&self.dir)?;
        self.unsaved = false;
        // Only behind the saved mark: a restart reads the cut in flight from the spool.
        self.spool
            .release_spooled_before(self.position.forwarded)
            .map_err(|e| spool_error(&self.dir, e.to_string()))
    }
}

/// When what a spool held at start was spooled, at the latest: its log's last change.
fn spooled_since(dir: &std::path::Path) -> Instant {
    let modified = std::fs::read_dir(dir.join("wal"))
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.metadata().ok()?.modified().ok())
        .min();
    let age = modified
        .and_then(|m| std::time::SystemTime::now().duration_since(m).ok())
        .unwrap_or_default();
    Instant::now().checked_sub(age).unwrap_or_else(Instant::now)
}

/// The upstream connection, moved to the next address when one fails.
struct UpstreamLink {
    addresses: Vec<String>,
    next: usize,
    token: Option<String>,
    client: Option<BinaryClient>,
}

impl UpstreamLink {
    fn send(&mut self, payload: &Payload, producer: u64, cut: Cut, timeout: Duration) -> Verdict {
        if let Payload::Nothing = payload {
            return Verdict::Forwarded;
        }
        let client = match &self.client {
            Some(client) => client,
            None => {
                let address = &self.addresses[self.next % self.addresses.len()];
                match BinaryClient::connect(address.as_str(), self.token.as_deref()) {
                    Ok(client) => self.client.insert(client),
                    Err(e) => return verdict(Err(e)),
                }
            }
        };
        let answer = match payload {
            Payload::Nothing => unreachable!("answered above"),
            Payload::Catalog(command) => client.send_command(command),
            Payload::Append { stream, batch } => {
                client.send_append_tagged(stream, batch, Some((producer, cut.to)))
            }
        }
        .and_then(|pending| pending.wait_timeout(timeout));
        verdict(answer.map(|_| ()))
    }

    /// Drops the connection; the next attempt goes to the next address.
    fn next_address(&mut self) {
        self.client = None;
        self.next = (self.next + 1) % self.addresses.len().max(1);
    }
}

fn verdict(answer: Result<(), ClientError>) -> Verdict {
    let down = |reason: String| Verdict::Retry {
        after: Duration::ZERO,
        upstream: Upstream::Down,
        reconnect: true,
        reason,
    };
    match answer {
        Ok(()) => Verdict::Forwarded,
        Err(ClientError::TryLater { retry_after, .. }) => Verdict::Retry {
            after: retry_after,
            upstream: Upstream::PushingBack,
            reconnect: false,
            reason: "the upstream pushes back (TRY_LATER)".into(),
        },
        Err(ClientError::Refused { code, message }) => match code.as_str() {
            "unknown_stream" | "schema_mismatch" | "bad_request" | "too_large" => {
                Verdict::Refused(format!("{code}: {message}"))
            }
            "unauthorized" => Verdict::Retry {
                after: Duration::ZERO,
                upstream: Upstream::Down,
                reconnect: false,
                reason: format!(
                    "the upstream refuses the agent's token (upstream_token): {message}"
                ),
            },
            _ => down(format!("{code}: {message}")),
        },
        Err(e) => down(e.to_string()),
    }
}

/// A record's bytes in the log: its frame header and payload.
fn record_len(record: &LoggedRecord) -> u64 {
    (FRAME_HEADER + record.payload.len()) as u64
}

/// The field count of a batch in wire form (`u32 n, u32 field count, …`).
fn batch_fields(batch: &[u8]) -> Option<usize> {
    let bytes = batch.get(4..8)?;
    Some(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize)
}

/// One batch of the events of `batches` (all built for one schema), in order.
fn concat(batches: Vec<EventBatch>) -> Result<EventBatch, String> {
    let events = batches.iter().map(EventBatch::len).sum();
    let mut builder = BatchBuilder::new(batches[0].schema().clone(), events);
    for batch in &batches {
        builder
            .extend_from(batch, 0..batch.len())
            .map_err(|e| e.to_string())?;
    }
    Ok(builder.finish())
}

fn sleep_unless_stopping(wait: Duration, stopping: &AtomicBool) {
    let until = Instant::now() + wait;
    while !stopping.load(Ordering::Acquire) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

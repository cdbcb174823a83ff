//! The in-memory state of a database: the catalog of streams, each stream's segments and
//! memtables. It changes only by [`State::apply`] (commands, in log order, both live and
//! during recovery or on a replica) and by the flusher installing segments.
//!
//! Must never know about: threads or locks around it (the engine's handle, `shared`, holds
//! it under one), where segments' bytes are (`segment`), the log it is fed from.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tidemark_core::name::validate_stream_name;
use tidemark_core::wire::decode_batch_widened;
use tidemark_core::{Command, Partition, ProducerSeq, Retention, Schema};
use tidemark_storage::bytes::Reader;
use tidemark_storage::manifest::{Manifest, ManifestStream, StreamId};

use crate::error::{EngineError, Result};
use crate::memtable::{Memtable, Summarized};
use crate::producers::{self, ProducerTable};
use crate::segment::Segment;

/// Subtracts `bytes` from an unflushed-bytes counter. Saturating: it runs inside the group
/// commit, where a panic must not happen.
fn release(counter: &AtomicUsize, bytes: usize) {
    let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        Some(u.saturating_sub(bytes))
    });
}

#[derive(Debug)]
pub struct StreamState {
    pub id: StreamId,
    pub name: String,
    pub schema: Arc<Schema>,
    /// Whether writes may add fields to the schema (`Command::AddFields`).
    pub evolving: bool,
    /// Its time partitions: every segment written for it lies in one (older builds' may
    /// not; compaction cuts those apart).
    pub partition: Partition,
    pub retention: Retention,
    /// The stream's own out-of-order window (`None`: the database's,
    /// `Options::out_of_order_window_ns`).
    pub out_of_order_window_ns: Option<i64>,
    /// In insertion order (oldest first).
    pub segments: Vec<Arc<Segment>>,
    /// Memtables being flushed, oldest first.
    pub frozen: Vec<Arc<Memtable>>,
    pub active: Memtable,
    /// The newest tstart ever accepted (since the last clear), for the out-of-order window.
    pub max_ts: Option<i64>,
    /// Bumped by every clear, so that a flush that started before it is discarded.
    pub epoch: u64,
    /// The position the next appended event gets. Positions count every event applied to
    /// the stream since it was created, in log order, so every replica of the same log
    /// gives the same ones; a clear or retention removes events, never positions. `None`:
    /// the stream gives no positions (created before streams had them, on a cluster node,
    /// whose replicas cannot agree where counting would have begun).
    pub next_position: Option<u64>,
    /// Says the stream's next position each time an append is applied, to readers that
    /// follow the stream ([`crate::Engine::watch_positions`]); dropped with the stream.
    pub appended: tokio::sync::watch::Sender<u64>,
    /// Named consumers and the position each has read to (`Command::CommitPosition`):
    /// kept through clears, dropped with the stream.
    pub consumers: BTreeMap<String, u64>,
}

/// The most named consumers a stream keeps: each is a few bytes in the manifest and a line
/// of `/metrics`, and a client with the write token could otherwise add them for ever.
pub const MAX_CONSUMERS: usize = 1024;

/// A command queued in the log, and (for an append) where applying it leaves the positions
/// its events were given, for its acknowledgement: the log writer applies a group before it
/// completes the group's records.
pub(crate) struct Logged {
    pub command: Prepared,
    pub given: Option<Arc<OnceLock<Positions>>>,
}

impl Logged {
    pub(crate) fn catalog_change(command: Prepared) -> Logged {
        Logged {
            command,
            given: None,
        }
    }
}

/// The positions an append's events were given: `first` to `last`, both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Positions {
    pub first: u64,
    pub last: u64,
}

impl StreamState {
    fn new(
        id: StreamId,
        name: String,
        schema: Schema,
        evolving: bool,
        partition: Partition,
    ) -> StreamState {
        StreamState {
            id,
            name,
            schema: Arc::new(schema),
            evolving,
            partition,
            retention: Retention::default(),
            out_of_order_window_ns: None,
            segments: Vec::new(),
            frozen: Vec::new(),
            active: Memtable::default(),
            max_ts: None,
            epoch: 0,
            next_position: Some(0),
            appended: tokio::sync::watch::Sender::new(0),
            consumers: BTreeMap::new(),
        }
    }

    /// The position of the first event not in segments (the first one a replay of the
    /// log from [`StreamState::replay_from`] gives again), as the manifest keeps it.
    pub fn replay_position(&self) -> Option<u64> {
        self.frozen
            .first()
            .and_then(|m| m.first_position())
            .or(self.active.first_position())
            .or(self.next_position)
    }

    /// The first LSN whose appends are not in segments (`applied` if all are).
    pub fn replay_from(&self, applied: u64) -> u64 {
        self.frozen
            .first()
            .and_then(|m| m.first_lsn())
            .or(self.active.first_lsn())
            .unwrap_or(applied)
    }

    /// The out-of-order window in force: the stream's own, else `default` (the database's;
    /// `None`: no window).
    pub fn out_of_order_window(&self, default: Option<i64>) -> Option<i64> {
        self.out_of_order_window_ns.or(default)
    }

    /// Panics unless `segment`, written for this stream now, lies in one of its
    /// partitions: every segment a flush or compaction writes does
    /// ([`crate::sink::SegmentSink::write`] cuts them). Segments of older builds, which may
    /// span partitions, are opened without this check.
    pub(crate) fn assert_in_one_partition(&self, segment: &Segment) {
        let (min, max) = (segment.meta.min_ts(), segment.meta.max_ts());
        assert!(
            min.zip(max)
                .is_some_and(|(min, max)| self.partition.holds(min, max)),
            "segment {} of stream {:?} spans partitions of {}: {min:?}..{max:?}",
            segment.id,
            self.name,
            self.partition
        );
    }

    pub fn memtables(&self) -> impl Iterator<Item = &Memtable> {
        self.frozen.iter().map(|m| m.as_ref()).chain([&self.active])
    }

    fn unflushed_bytes(&self) -> usize {
        self.memtables().map(|m| m.bytes).sum()
    }
}

/// Whether a commit of `consumer` at `position` (`None`: forget it) applies to `stream`:
/// a position the stream gave, a valid name, room for a new consumer; `false` for
/// forgetting one it does not know.
fn check_commit(stream: &StreamState, consumer: &str, position: Option<u64>) -> Result<bool> {
    tidemark_core::name::validate_consumer_name(consumer)?;
    let Some(position) = position else {
        return Ok(stream.consumers.contains_key(consumer));
    };
    let Some(next) = stream.next_position else {
        return Err(EngineError::InvalidRequest(format!(
            "stream {:?} gives no positions (created on this cluster before streams had \
             them): its consumers cannot commit any",
            stream.name
        )));
    };
    if position >= next {
        return Err(EngineError::InvalidRequest(format!(
            "stream {:?} has not given position {position}: its next event gets {next}",
            stream.name
        )));
    }
    if !stream.consumers.contains_key(consumer) && stream.consumers.len() >= MAX_CONSUMERS {
        return Err(EngineError::InvalidRequest(format!(
            "stream {:?} keeps {MAX_CONSUMERS} consumers, the most it keeps: forget one \
             (DELETE its position) before adding {consumer:?}",
            stream.name
        )));
    }
    Ok(true)
}

/// A command ready to apply: an append's batch decoded against its stream and summarised.
pub type Prepared = Command<Summarized>;

/// What applying an append logged in a database's own log keeps of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appends {
    /// Its events, in its stream's memtable: a database ([`crate::Db`]).
    Kept,
    /// Only its place in the log, whose reader forwards the log itself: a spool
    /// ([`crate::Spool`]), which keeps no events.
    LoggedOnly,
}

/// Whether applying `command` leaves files that only a checkpoint deletes (segments of a
/// dropped or cleared stream, or past a new retention): the flusher is asked for one at
/// once rather than at the next flush, which may never come.
pub fn frees_files_at_checkpoint<B>(command: &Command<B>) -> bool {
    matches!(
        command,
        Command::DropStream { .. } | Command::Clear { .. } | Command::SetRetention { .. }
    )
}

/// What the manifest a database was opened from already reflects: commands before its
/// checkpoint changed the catalog it lists, and a stream's appends before its replay point
/// are in its segments. Replaying the log (embedded) or re-applying it (replica) skips them.
#[derive(Debug, Clone, Default)]
pub struct Reflected {
    pub checkpoint: u64,
    pub replay_from: HashMap<StreamId, u64>,
}

impl Reflected {
    pub fn of(manifest: &Manifest) -> Reflected {
        Reflected {
            checkpoint: manifest.checkpoint_lsn,
            replay_from: manifest
                .streams
                .iter()
                .map(|s| (s.id, s.replay_from))
                .collect(),
        }
    }

    /// Whether the command at `position` is already reflected in `state` as opened.
    pub fn covers<B>(&self, state: &State, position: u64, command: &Command<B>) -> bool {
        if position >= self.checkpoint {
            return false;
        }
        match command {
            // Below the checkpoint no catalog change has been applied yet, so the name
            // still means the stream the manifest names (or one dropped since: skip).
            Command::Append { name, .. } => state
                .stream(name)
                .is_none_or(|s| position < self.replay_from.get(&s.id).copied().unwrap_or(0)),
            _ => true,
        }
    }
}

#[derive(Debug, Default)]
pub struct State {
    pub streams: BTreeMap<StreamId, StreamState>,
    pub by_name: HashMap<String, StreamId>,
    pub next_stream_id: StreamId,
    pub next_segment_id: u64,
    /// Every command at a position below this has been applied (or is reflected in the
    /// manifest the state was opened from).
    pub applied_lsn: u64,
    /// The last position applied or skipped since the state was opened: positions must
    /// strictly increase.
    last_position: Option<u64>,
    /// Bytes in memtables not yet flushed (active and frozen). Shared with appenders, who
    /// read it without the state lock to decide whether to wait for a flush.
    pub unflushed: Arc<AtomicUsize>,
    /// Segments taken out of the catalog whose files must outlive the manifest that still
    /// names them; the next checkpoint retires them.
    pub retired: Vec<Arc<Segment>>,
    /// The idempotent producers of an embedded log ([`State::apply_logged`]); checkpointed
    /// in the manifest. (A cluster keeps its own in its state machine.)
    pub producers: ProducerTable,
    /// Positions of logged appends skipped as retries, from the oldest replay point on:
    /// a replay below the checkpoint skips them again by position.
    pub retried: std::collections::BTreeSet<u64>,
    /// The checkpoint of the manifest the state was opened from: `producers` reflects every
    /// tag before it, so a replayed append below it is decided by `retried` instead.
    opened_at_checkpoint: u64,
    /// A stream's active memtable is frozen once it holds this many bytes
    /// ([`crate::Options::memtable_bytes`]; `None`: only checkpoints freeze memtables).
    pub freeze_memtables_at: Option<usize>,
}

impl State {
    /// The catalog of a manifest, with its segments already opened.
    pub fn from_manifest(
        manifest: &Manifest,
        mut segments: impl FnMut(&ManifestStream) -> Vec<Arc<Segment>>,
    ) -> State {
        let mut state = State {
            next_stream_id: manifest.next_stream_id,
            next_segment_id: manifest.next_segment_id,
            applied_lsn: manifest.checkpoint_lsn,
            retried: manifest.retried.iter().copied().collect(),
            opened_at_checkpoint: manifest.checkpoint_lsn,
            producers: ProducerTable::from_recency_order(
                &manifest
                    .producers
                    .iter()
                    .map(|&(producer, sequence, part)| (producer, (sequence, part)))
                    .collect::<Vec<_>>(),
                producers::CAPACITY,
            ),
            ..State::default()
        };
        for m in &manifest.streams {
            let mut stream = StreamState::new(
                m.id,
                m.name.clone(),
                m.schema.clone(),
                m.evolving,
                m.partition,
            );
            stream.retention = m.retention;
            stream.out_of_order_window_ns = m.out_of_order_window_ns;
            stream.next_position = m.next_position;
            stream.consumers = m.consumers.clone();
            stream.appended.send_replace(m.next_position.unwrap_or(0));
            stream.segments = segments(m);
            stream.max_ts = stream.segments.iter().filter_map(|s| s.meta.max_ts()).max();
            state.by_name.insert(m.name.clone(), m.id);
            state.streams.insert(m.id, stream);
        }
        state
    }

    pub fn stream(&self, name: &str) -> Option<&StreamState> {
        self.by_name.get(name).and_then(|id| self.streams.get(id))
    }

    fn stream_mut(&mut self, name: &str) -> Option<&mut StreamState> {
        self.by_name
            .get(name)
            .and_then(|id| self.streams.get_mut(id))
    }

    /// What the logged `command` at this point of the log applies: its batch decoded
    /// against the stream it names and summarised (cut at `align_ns`). `None` when it
    /// changes nothing (an empty batch, a create of a stream that exists with that schema).
    /// An error is a refusal every replica of the same log reaches alike.
    pub fn prepare(&self, command: Command<&[u8]>, align_ns: i64) -> Result<Option<Prepared>> {
        if let Command::Append {
            name,
            batch,
            producer,
        } = command
        {
            let stream = self
                .stream(&name)
                .ok_or_else(|| EngineError::UnknownStream(name.clone()))?;
            let mut r = Reader::new(batch, "append");
            // Checked against the schema when it was proposed; fields may have been added
            // since (a cluster applies what others proposed in between).
            let batch = decode_batch_widened(&mut r, &stream.schema)?;
            r.finish()?;
            return Ok(
                Summarized::new(batch, align_ns).map(|batch| Command::Append {
                    name,
                    batch,
                    producer,
                }),
            );
        }
        if !self.check_catalog_change(&command)? {
            return Ok(None);
        }
        Ok(command.catalog_change())
    }

    /// Whether the catalog change `command` applies here: `false` for a create of a stream
    /// that exists with the same schema or fields added that the stream has, an error where
    /// the catalog refuses it.
    pub fn check_catalog_change<B>(&self, command: &Command<B>) -> Result<bool> {
        let name = command.stream();
        let stream = self.stream(name);
        match (command, stream) {
            (
                Command::CreateStream {
                    schema, partition, ..
                },
                Some(existing),
            ) => {
                let differs = if !existing.schema.matches(schema) {
                    format!("schema {}", existing.schema.to_spec())
                } else if existing.partition != *partition {
                    format!("partition {}", existing.partition)
                } else {
                    return Ok(false);
                };
                Err(EngineError::StreamExists {
                    name: name.to_string(),
                    existing: differs,
                })
            }
            (Command::CreateStream { .. }, None) => {
                validate_stream_name(name)?;
                Ok(true)
            }
            (Command::AddFields { fields, .. }, Some(existing)) => {
                let grown = existing
                    .schema
                    .with_added(fields)
                    .map_err(EngineError::Invalid)?;
                if grown.len() == existing.schema.len() {
                    return Ok(false);
                }
                if !existing.evolving {
                    return Err(EngineError::InvalidRequest(format!(
                        "stream {name:?} has a strict schema ({}): fields cannot be added to it \
                         (a stream created with evolving on takes them)",
                        existing.schema.to_spec()
                    )));
                }
                Ok(true)
            }
            (
                Command::CommitPosition {
                    consumer, position, ..
                },
                Some(existing),
            ) => check_commit(existing, consumer, *position),
            (_, None) => Err(EngineError::UnknownStream(name.to_string())),
            (_, Some(_)) => Ok(true),
        }
    }

    /// Applies the command logged at `lsn` (LSNs strictly increase), which
    /// [`State::prepare`] or the embedded write path checked against this state; an
    /// append answers the positions its events were given (none where its stream gives
    /// none). It runs inside the group commit: it panics only on a broken invariant (an
    /// LSN out of order), and the log writer then marks the log failed rather than let
    /// appenders wait.
    pub fn apply(&mut self, lsn: u64, command: Prepared) -> Option<Positions> {
        self.advance_to(lsn);
        match command {
            Command::CreateStream {
                name,
                schema,
                evolving,
                partition,
            } => self.create_stream(name, schema, evolving, partition),
            Command::AddFields { name, fields } => {
                if let Some(s) = self.stream_mut(&name) {
                    // Checked by `check_catalog_change` against this state before it was
                    // logged; memtables and segments keep their narrower schemas and are
                    // read as this one (`MemBatch::batch_as`, `SegmentMeta::read_block_as`).
                    match s.schema.with_added(&fields) {
                        Ok(grown) => s.schema = Arc::new(grown),
                        Err(e) => debug_assert!(false, "fields added to {name:?} unchecked: {e}"),
                    }
                }
            }
            Command::DropStream { name } => {
                if let Some(s) = self
                    .by_name
                    .remove(&name)
                    .and_then(|id| self.streams.remove(&id))
                {
                    release(&self.unflushed, s.unflushed_bytes());
                    self.retired.extend(s.segments);
                }
            }
            Command::Append { name, batch, .. } => return self.append(lsn, &name, batch),
            Command::Clear { name } => self.clear(&name),
            Command::SetOutOfOrderWindow { name, window_ns } => {
                if let Some(s) = self.stream_mut(&name) {
                    s.out_of_order_window_ns = window_ns;
                }
            }
            Command::SetRetention { name, retention } => {
                if let Some(s) = self.stream_mut(&name) {
                    s.retention = retention;
                }
            }
            Command::CommitPosition {
                name,
                consumer,
                position,
            } => {
                if let Some(s) = self.stream_mut(&name) {
                    // Checked before it was logged; checked again here because the stream
                    // may have been dropped and created again in between: every replica
                    // decides alike, from the state the log made.
                    match position {
                        Some(p) if s.next_position.is_some_and(|next| p < next) => {
                            s.consumers.insert(consumer, p);
                        }
                        Some(_) => {}
                        None => {
                            s.consumers.remove(&consumer);
                        }
                    }
                }
            }
        }
        None
    }

    fn create_stream(
        &mut self,
        name: String,
        schema: Schema,
        evolving: bool,
        partition: Partition,
    ) {
        let stream = self.next_stream_id;
        self.next_stream_id += 1;
        debug_assert!(!self.by_name.contains_key(&name), "{name:?} created twice");
        self.by_name.insert(name.clone(), stream);
        self.streams.insert(
            stream,
            StreamState::new(stream, name, schema, evolving, partition),
        );
    }

    /// Adds an appended batch, logged at `lsn`, to its stream's active memtable, its
    /// events numbered from the stream's next position.
    fn append(&mut self, lsn: u64, name: &str, batch: Summarized) -> Option<Positions> {
        // Field by field (not `stream_mut`): `unflushed` is updated below.
        let Some(s) = self
            .by_name
            .get(name)
            .and_then(|id| self.streams.get_mut(id))
        else {
            debug_assert!(
                false,
                "an append to {name:?}, which is not there, was applied"
            );
            return None;
        };
        let newest = batch.summary.max_ts;
        s.max_ts = Some(s.max_ts.map_or(newest, |m| m.max(newest)));
        let count = batch.batch.len() as u64;
        let given = s.next_position.map(|first| Positions {
            first,
            last: first + count - 1,
        });
        if let Some(given) = given {
            // A batch is never empty here (`Summarized::new`); positions stay LONG values.
            assert!(
                count > 0 && given.last < tidemark_core::MAX_POSITION,
                "positions {given:?} for {count} events"
            );
            s.next_position = Some(given.last + 1);
            s.appended.send_replace(given.last + 1);
        }
        let before = s.active.bytes;
        s.active.push(lsn, given.map(|g| g.first), batch);
        self.unflushed
            .fetch_add(s.active.bytes.saturating_sub(before), Ordering::AcqRel);
        // A flush holds a sorted copy of the memtable it writes (two while it sorts
        // one whose batches overlap). Frozen here rather than only when a checkpoint
        // starts, no memtable outgrows this while a slow flush runs, so those copies
        // stay within a memtable's size instead of the whole unflushed backlog.
        if self
            .freeze_memtables_at
            .is_some_and(|at| s.active.bytes >= at)
        {
            let full = std::mem::take(&mut s.active);
            s.frozen.push(Arc::new(full));
        }
        given
    }

    /// Empties a stream: its segments retire at the next checkpoint, its memtables go now.
    fn clear(&mut self, name: &str) {
        if let Some(s) = self
            .by_name
            .get(name)
            .and_then(|id| self.streams.get_mut(id))
        {
            release(&self.unflushed, s.unflushed_bytes());
            self.retired.append(&mut s.segments);
            s.frozen.clear();
            s.active = Memtable::default();
            s.max_ts = None;
            s.epoch += 1;
        }
    }

    /// Applies a record of an embedded database's own log, live or replayed, by the rule
    /// that makes a producer's retry harmless: an append whose producer tag is at or
    /// before the producer's last applied one is a retry (its first attempt was logged,
    /// and is applied, before it) and changes nothing. Replay takes the same decisions in
    /// the same order, so a retry stays skipped after a restart. Where `appends` are
    /// [`Appends::LoggedOnly`] (a spool's log) an append changes nothing here either: its
    /// place in the log is all that is kept of it.
    pub fn apply_logged(
        &mut self,
        lsn: u64,
        command: Prepared,
        appends: Appends,
    ) -> Option<Positions> {
        if let Command::Append { producer, .. } = &command {
            if !self.admit_logged_append(lsn, producer.as_ref(), appends) {
                return None;
            }
        }
        self.apply(lsn, command)
    }

    /// Whether the logged append at `position`, tagged `producer`, is to be applied:
    /// `false` (and recorded as skipped) for a producer's retry, and for any append where
    /// `appends` are [`Appends::LoggedOnly`]. A tag that is not a retry is recorded either
    /// way.
    pub fn admit_logged_append(
        &mut self,
        position: u64,
        producer: Option<&ProducerSeq>,
        appends: Appends,
    ) -> bool {
        if let Some(tag) = producer {
            let retry = if position < self.opened_at_checkpoint {
                // Replayed below the checkpoint: the table is past this tag already; the
                // decision made when it was first applied is kept by position.
                self.retried.contains(&position)
            } else {
                let retry = self.producers.is_retry(tag);
                if retry {
                    self.retried.insert(position);
                } else {
                    self.producers.record(tag);
                }
                retry
            };
            if retry {
                self.skip(position);
                return false;
            }
        }
        if appends == Appends::LoggedOnly {
            self.skip(position);
            return false;
        }
        true
    }

    /// Records that `position` changed nothing (an empty entry, a command that failed or
    /// was a retry), so that checkpoints move past it.
    pub fn skip(&mut self, position: u64) {
        self.advance_to(position);
    }

    fn advance_to(&mut self, position: u64) {
        // A position twice, or out of order, would apply a command twice or in another
        // order than the log's: every replica's state would be in doubt.
        assert!(
            self.last_position.is_none_or(|last| position > last),
            "position {position} comes after {:?}",
            self.last_position
        );
        self.last_position = Some(position);
        // Below the manifest's checkpoint (replaying appends it does not hold yet), the
        // checkpoint already says how far the state reaches.
        self.applied_lsn = self.applied_lsn.max(position + 1);
    }

    /// Everything before `position` in the log is applied (the end of a group the embedded
    /// log wrote, past its last record's position).
    pub fn applied_to(&mut self, position: u64) {
        assert!(
            self.last_position.is_none_or(|last| last < position),
            "applied to {position}, before the last record applied ({:?})",
            self.last_position
        );
        self.applied_lsn = self.applied_lsn.max(position);
    }

    pub fn unflushed_bytes(&self) -> usize {
        self.unflushed.load(Ordering::Acquire)
    }

    /// Accounts for `bytes` of memtables that left memory (flushed, cleared or dropped).
    pub fn release_unflushed(&self, bytes: usize) {
        release(&self.unflushed, bytes);
    }

    /// A fresh id for a segment or a pack.
    pub fn allocate_id(&mut self) -> u64 {
        let id = self.next_segment_id;
        self.next_segment_id += 1;
        id
    }

    /// The manifest describing this state.
    pub fn manifest(&self) -> Manifest {
        let segments = || self.streams.values().flat_map(|s| &s.segments);
        let packed = segments()
            .filter_map(|seg| Some((seg.id, seg.local()?.1?)))
            .collect();
        let tiered = segments()
            .filter_map(|seg| Some((seg.id, seg.tiered_object()?.clone())))
            .collect();
        let mut manifest = Manifest {
            log_format: tidemark_storage::manifest::LOG_FORMAT,
            checkpoint_lsn: self.applied_lsn,
            next_stream_id: self.next_stream_id,
            next_segment_id: self.next_segment_id,
            streams: self
                .streams
                .values()
                .map(|s| ManifestStream {
                    id: s.id,
                    name: s.name.clone(),
                    schema: (*s.schema).clone(),
                    evolving: s.evolving,
                    retention: s.retention,
                    out_of_order_window_ns: s.out_of_order_window_ns,
                    partition: s.partition,
                    replay_from: s.replay_from(self.applied_lsn),
                    next_position: s.replay_position(),
                    consumers: s.consumers.clone(),
                    segments: s.segments.iter().map(|seg| seg.id).collect(),
                })
                .collect(),
            packed,
            producers: self
                .producers
                .recency_order()
                .into_iter()
                .map(|(producer, (sequence, part))| (producer, sequence, part))
                .collect(),
            retried: Vec::new(),
            tiered,
        };
        // The retries a replay from this manifest can meet: from its oldest replay point.
        let from = manifest.log_start();
        manifest.retried = self.retried.range(from..).copied().collect();
        manifest
    }

    /// Forgets retried positions no replay will reach again (before `log_start` of a
    /// durable manifest).
    pub fn forget_retries_before(&mut self, log_start: u64) {
        self.retried = self.retried.split_off(&log_start);
    }
}

/// A named consumer of a stream: the position it has read to, and how far behind the
/// stream it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerInfo {
    pub name: String,
    /// It resumes after this position.
    pub position: u64,
    /// Positions the stream gave after it (removed events counted too).
    pub behind: u64,
}

impl StreamState {
    /// The stream's named consumers, by name, with how far behind it each is.
    pub(crate) fn consumer_infos(&self) -> Vec<ConsumerInfo> {
        let next = self.next_position.unwrap_or(0);
        self.consumers
            .iter()
            .map(|(name, &position)| ConsumerInfo {
                name: name.clone(),
                position,
                behind: next.saturating_sub(position + 1),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use tidemark_core::{BatchBuilder, Value};

    use super::*;

    fn append(state: &mut State, position: u64, events: std::ops::Range<i64>) {
        let schema = state.streams[&0].schema.clone();
        let mut b = BatchBuilder::new(schema, events.clone().count());
        for ts in events {
            b.push_row(ts, None, &[Value::Long(ts)]).unwrap();
        }
        let batch = Summarized::new(b.finish(), 0).unwrap();
        let name = "s".to_string();
        state.apply(
            position,
            Command::Append {
                name,
                batch,
                producer: None,
            },
        );
    }

    #[test]
    fn a_memtable_is_frozen_once_it_holds_the_limit_not_only_when_a_checkpoint_starts() {
        let mut state = State {
            freeze_memtables_at: Some(64 << 10),
            ..State::default()
        };
        let schema = Schema::parse_spec("V:LONG").unwrap();
        let create = Command::CreateStream {
            name: "s".into(),
            schema,
            evolving: false,
            partition: tidemark_core::Partition::DAY,
        };
        state.apply(0, create);
        for i in 0..100 {
            append(&mut state, i + 1, i as i64 * 1000..(i as i64 + 1) * 1000);
        }
        let stream = &state.streams[&0];
        // 100 batches of 16 KB: about 25 memtables of 64 KiB, none larger than the limit
        // plus the batch that crossed it, and nothing lost or counted twice.
        assert!(stream.frozen.len() >= 20, "{} frozen", stream.frozen.len());
        let largest = stream.memtables().map(|m| m.bytes).max().unwrap();
        assert!(
            largest < (64 << 10) + (20 << 10),
            "a memtable of {largest} bytes"
        );
        let events: usize = stream
            .memtables()
            .flat_map(|m| &m.batches)
            .map(|b| b.batch.len())
            .sum();
        assert_eq!(events, 100_000);
        assert_eq!(
            state.unflushed.load(Ordering::Acquire),
            stream.unflushed_bytes()
        );
        assert_eq!(
            stream.replay_from(0),
            1,
            "replay starts at the oldest frozen memtable"
        );
    }
}

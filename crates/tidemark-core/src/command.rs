//! [`Command`]: the one vocabulary of change. Every write to a database — creating,
//! dropping and clearing streams, setting retention, appending a batch — is one command,
//! and one codec turns it into the bytes that both the embedded write-ahead log and the
//! Raft log store. Transports build commands, the cluster replicates their bytes, the
//! engine applies them in log order; none of them has a vocabulary of its own.
//!
//! ```text
//! command := u8 version (5), u8 flags (1 = producer tag), [u64 producer, u64 sequence,
//!            u32 part], u8 kind, u32 len + stream name (UTF-8), body
//!   1 CREATE     body = u32 len + schema JSON, u8 flags (1 = evolving, version 3 on;
//!                2 = partitioned, version 5 on), [i64 partition ns if partitioned]
//!   2 DROP       body = (none)
//!   3 APPEND     body = the batch in the wire form of `crate::wire` (to the end); from
//!                version 4 on, its columns with nulls may be in the compact form
//!   4 CLEAR      body = (none)
//!   5 RETENTION  body = u8 flags (1 = age, 2 = bytes), i64 max age ns, u64 max bytes
//!   6 WINDOW     body = u8 has window (0 = the database's default), i64 window ns
//!   7 ADD FIELDS body = u32 len + JSON of the fields added (version 3 on)
//!   8 COMMIT     body = u32 len + consumer name (UTF-8), u8 has position (0 = forget the
//!                consumer), u64 position (version 6 on)
//! ```
//!
//! Versions 1 and 2 are the same layout without CREATE's flags (their streams are strict)
//! and without ADD FIELDS: version 1 is the Raft entries of builds before the embedded log
//! shared this codec, version 2 the builds before schemas could grow. Version 3 is version
//! 4 without compact columns in appends: a build of version 3 would refuse them as corrupt
//! batches long after it accepted the command, so appends say version 4 up front, while
//! every other command is still written as version 3 (an older server takes an agent's
//! stream creations). Version 5 adds a stream's partition to CREATE; only a create of a
//! stream with a partition other than the default ([`Partition::DAY`]) is written with it,
//! and a create without one reads as the default. Version 6 adds COMMIT, written only with
//! it. All are still read, so logs carry over
//! an upgrade. (The embedded log of version-1 builds had records of its
//! own, which the engine upgrades on open.)
//!
//! Streams are named, never numbered: a stream's id is assigned where the create is applied,
//! so every replica assigns the same one, and a command cannot reach a stream re-created
//! under its name through a stale id.
//!
//! A command is generic over the form its batch is in ([`Command::map_batch`] turns one
//! into another): an [`EventBatch`] a client sent, the encoded bytes a log holds (what
//! [`decode`] returns), or whatever the engine prepares to apply.

use crate::bytes::{put_bytes, put_i64, put_u32, put_u64, put_u8, Malformed, Reader, TooLong};
use crate::wire::encode_batch_compact;
use crate::{EventBatch, Field, Partition, Schema};

/// The newest version [`encode`] writes.
pub const FORMAT_VERSION: u8 = 6;
/// The oldest version [`decode`] reads.
pub const OLDEST_READABLE_VERSION: u8 = 1;
const _: () = assert!(OLDEST_READABLE_VERSION <= FORMAT_VERSION);

const HAS_PRODUCER: u8 = 1;

const CREATE: u8 = 1;
const DROP: u8 = 2;
const APPEND: u8 = 3;
const CLEAR: u8 = 4;
const RETENTION: u8 = 5;
const WINDOW: u8 = 6;
const ADD_FIELDS: u8 = 7;
const COMMIT: u8 = 8;

/// The first version with CREATE's flags and ADD FIELDS.
const EVOLVING_SINCE: u8 = 3;
/// The first version whose appends may hold compact columns. Only appends are written with
/// it: every other command is the same in version 3, and a build of version 3 (a server an
/// agent forwards catalog changes to, say) still takes them.
const COMPACT_SINCE: u8 = 4;
/// The first version whose creates may name a partition. Only such creates are written
/// with it, so that an older build still takes every other command.
const PARTITION_SINCE: u8 = 5;
/// The first version with COMMIT, written only for it.
const COMMIT_SINCE: u8 = 6;
const _: () = assert!(COMMIT_SINCE == FORMAT_VERSION);
const CREATE_EVOLVING: u8 = 1;
const CREATE_PARTITIONED: u8 = 2;

const RETAIN_AGE: u8 = 1;
const RETAIN_BYTES: u8 = 2;

/// How long and how large a stream may grow before its oldest segments are dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Retention {
    /// Segments whose newest event is older than this many nanoseconds are dropped.
    pub max_age_ns: Option<i64>,
    /// The oldest segments are dropped while the stream's segments exceed this many bytes.
    pub max_bytes: Option<u64>,
}

/// Who sent a batch, and its place in that producer's sequence: a batch retried with the
/// same tag after an unknown outcome is applied once (in a cluster; see
/// `tidemark-cluster`'s producer table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ProducerSeq {
    pub producer: u64,
    pub sequence: u64,
    /// Which part of a batch the leader split (0 for a batch that was not split): the parts
    /// of one batch share the sequence number.
    pub part: u32,
}

impl ProducerSeq {
    /// Whether this tag comes after `last` in its producer's sequence.
    pub fn follows(&self, last: (u64, u32)) -> bool {
        (self.sequence, self.part) > last
    }
}

/// A change to a database, with its batch (if it appends one) in the form `B`.
#[derive(Debug, Clone, PartialEq)]
pub enum Command<B> {
    CreateStream {
        name: String,
        schema: Schema,
        /// Whether the stream's schema may grow ([`Command::AddFields`]); a strict stream
        /// keeps the schema it was created with.
        evolving: bool,
        /// The stream's time partitions: no segment holds events of two.
        partition: Partition,
    },
    /// Appends the fields the stream lacks to the schema of an evolving stream (those it
    /// has with the same type are skipped; another type is refused). Events stored before
    /// read the new fields as null.
    AddFields {
        name: String,
        fields: Vec<Field>,
    },
    DropStream {
        name: String,
    },
    /// Deletes every event of the stream; the stream and its schema stay.
    Clear {
        name: String,
    },
    SetRetention {
        name: String,
        retention: Retention,
    },
    /// How far before the newest event of the stream an event may be and still be
    /// accepted, in nanoseconds (`None`: the database's default).
    SetOutOfOrderWindow {
        name: String,
        window_ns: Option<i64>,
    },
    Append {
        name: String,
        batch: B,
        producer: Option<ProducerSeq>,
    },
    /// Keeps the position a named consumer of the stream has read to (it resumes after
    /// it), or with `None` forgets the consumer.
    CommitPosition {
        name: String,
        consumer: String,
        position: Option<u64>,
    },
}

impl<B> Command<B> {
    /// The stream the command changes.
    pub fn stream(&self) -> &str {
        match self {
            Command::CreateStream { name, .. }
            | Command::AddFields { name, .. }
            | Command::DropStream { name }
            | Command::Clear { name }
            | Command::SetRetention { name, .. }
            | Command::SetOutOfOrderWindow { name, .. }
            | Command::Append { name, .. }
            | Command::CommitPosition { name, .. } => name,
        }
    }

    /// Whether the command changes the catalog (everything but an append).
    pub fn is_catalog_change(&self) -> bool {
        !matches!(self, Command::Append { .. })
    }

    /// The same catalog change typed for any batch form; `None` for an append.
    pub fn catalog_change<C>(self) -> Option<Command<C>> {
        self.map_batch(|_| Err(())).ok()
    }

    /// The same command with its batch turned into another form by `f`.
    pub fn map_batch<C, E>(self, f: impl FnOnce(B) -> Result<C, E>) -> Result<Command<C>, E> {
        Ok(match self {
            Command::CreateStream {
                name,
                schema,
                evolving,
                partition,
            } => Command::CreateStream {
                name,
                schema,
                evolving,
                partition,
            },
            Command::AddFields { name, fields } => Command::AddFields { name, fields },
            Command::DropStream { name } => Command::DropStream { name },
            Command::Clear { name } => Command::Clear { name },
            Command::SetRetention { name, retention } => Command::SetRetention { name, retention },
            Command::SetOutOfOrderWindow { name, window_ns } => {
                Command::SetOutOfOrderWindow { name, window_ns }
            }
            Command::CommitPosition {
                name,
                consumer,
                position,
            } => Command::CommitPosition {
                name,
                consumer,
                position,
            },
            Command::Append {
                name,
                batch,
                producer,
            } => Command::Append {
                name,
                batch: f(batch)?,
                producer,
            },
        })
    }
}

/// A batch form that [`encode`] can write as an append body.
pub trait BatchBytes {
    /// Appends the batch's wire form (`crate::wire`) to `out`.
    fn put(&self, out: &mut Vec<u8>) -> Result<(), TooLong>;
    /// About how many bytes [`BatchBytes::put`] writes, to size the buffer once.
    fn size_hint(&self) -> usize;
}

/// Logged in the compact form: a null costs a bit in the log as in memory.
impl BatchBytes for EventBatch {
    fn put(&self, out: &mut Vec<u8>) -> Result<(), TooLong> {
        encode_batch_compact(self, out)
    }
    fn size_hint(&self) -> usize {
        self.heap_bytes() + 16
    }
}

/// Bytes already in wire form (a body read from a log, or from a client's frame).
impl BatchBytes for [u8] {
    fn put(&self, out: &mut Vec<u8>) -> Result<(), TooLong> {
        out.extend_from_slice(self);
        Ok(())
    }
    fn size_hint(&self) -> usize {
        self.len()
    }
}

impl<T: BatchBytes + ?Sized> BatchBytes for &T {
    fn put(&self, out: &mut Vec<u8>) -> Result<(), TooLong> {
        (**self).put(out)
    }
    fn size_hint(&self) -> usize {
        (**self).size_hint()
    }
}

/// Why bytes are not a command, or a command cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("{what}: {detail}")]
    Malformed { what: String, detail: String },
    #[error("command format version {found}: this build reads versions {OLDEST_READABLE_VERSION} to {FORMAT_VERSION}")]
    UnknownVersion { found: u8 },
    #[error("a command that long cannot be encoded: {0}")]
    TooLong(#[from] TooLong),
}

impl Malformed for CommandError {
    fn malformed(what: &str, detail: String) -> CommandError {
        CommandError::Malformed {
            what: what.to_string(),
            detail,
        }
    }
}

/// About how many bytes the encoding of `command` takes.
pub fn encoded_len_hint<B: BatchBytes>(command: &Command<B>) -> usize {
    let body = match command {
        Command::Append { batch, .. } => batch.size_hint(),
        Command::CreateStream { schema, .. } => 32 * schema.len() + 32,
        Command::AddFields { fields, .. } => 32 * fields.len() + 32,
        _ => 32,
    };
    body + 32 + command.stream().len()
}

/// Appends the bytes of `command` to `out`.
pub fn encode<B: BatchBytes>(command: &Command<B>, out: &mut Vec<u8>) -> Result<(), CommandError> {
    let (kind, producer) = match command {
        Command::CreateStream { .. } => (CREATE, None),
        Command::AddFields { .. } => (ADD_FIELDS, None),
        Command::DropStream { .. } => (DROP, None),
        Command::Clear { .. } => (CLEAR, None),
        Command::SetRetention { .. } => (RETENTION, None),
        Command::SetOutOfOrderWindow { .. } => (WINDOW, None),
        Command::Append { producer, .. } => (APPEND, *producer),
        Command::CommitPosition { .. } => (COMMIT, None),
    };
    // The oldest version that says it all, so that older builds take what they can read.
    let version = match command {
        Command::Append { .. } => COMPACT_SINCE,
        Command::CreateStream { partition, .. } if *partition != Partition::DAY => PARTITION_SINCE,
        Command::CommitPosition { .. } => COMMIT_SINCE,
        _ => EVOLVING_SINCE,
    };
    put_u8(out, version);
    match producer {
        Some(p) => {
            put_u8(out, HAS_PRODUCER);
            put_u64(out, p.producer);
            put_u64(out, p.sequence);
            put_u32(out, p.part);
        }
        None => put_u8(out, 0),
    }
    put_u8(out, kind);
    put_bytes(out, command.stream().as_bytes())?;
    match command {
        Command::CreateStream {
            schema,
            evolving,
            partition,
            ..
        } => {
            put_bytes(out, &fields_json(schema.fields())?)?;
            let partitioned = version >= PARTITION_SINCE;
            let flags = (if *evolving { CREATE_EVOLVING } else { 0 })
                | (if partitioned { CREATE_PARTITIONED } else { 0 });
            put_u8(out, flags);
            if partitioned {
                put_i64(out, partition.ns());
            }
        }
        Command::AddFields { fields, .. } => put_bytes(out, &fields_json(fields)?)?,
        Command::SetRetention { retention, .. } => {
            let flags = (if retention.max_age_ns.is_some() {
                RETAIN_AGE
            } else {
                0
            }) | (if retention.max_bytes.is_some() {
                RETAIN_BYTES
            } else {
                0
            });
            put_u8(out, flags);
            put_i64(out, retention.max_age_ns.unwrap_or(0));
            put_u64(out, retention.max_bytes.unwrap_or(0));
        }
        Command::SetOutOfOrderWindow { window_ns, .. } => {
            put_u8(out, u8::from(window_ns.is_some()));
            put_i64(out, window_ns.unwrap_or(0));
        }
        Command::Append { batch, .. } => batch.put(out)?,
        Command::CommitPosition {
            consumer, position, ..
        } => {
            put_bytes(out, consumer.as_bytes())?;
            put_u8(out, u8::from(position.is_some()));
            put_u64(out, position.unwrap_or(0));
        }
        Command::DropStream { .. } | Command::Clear { .. } => {}
    }
    Ok(())
}

/// Fields are names and type names: serialising them cannot fail.
fn fields_json(fields: &[Field]) -> Result<Vec<u8>, CommandError> {
    serde_json::to_vec(fields).map_err(|e| CommandError::Malformed {
        what: "schema".into(),
        detail: e.to_string(),
    })
}

/// The bytes of `command`, in a buffer of their own.
pub fn encode_to_vec<B: BatchBytes>(command: &Command<B>) -> Result<Vec<u8>, CommandError> {
    let mut out = Vec::with_capacity(encoded_len_hint(command));
    encode(command, &mut out)?;
    Ok(out)
}

/// Reads the command in `bytes` (all of them). An append's batch stays encoded: it can only
/// be decoded against its stream's schema (`crate::wire::decode_batch`).
pub fn decode(bytes: &[u8]) -> Result<Command<&[u8]>, CommandError> {
    let mut r: Reader<'_, CommandError> = Reader::new(bytes, "command");
    let version = r.u8()?;
    if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(CommandError::UnknownVersion { found: version });
    }
    let producer = match r.u8()? {
        0 => None,
        HAS_PRODUCER => Some(ProducerSeq {
            producer: r.u64()?,
            sequence: r.u64()?,
            part: r.u32()?,
        }),
        other => return Err(r.corrupt(format!("flags {other}"))),
    };
    let kind = r.u8()?;
    if producer.is_some() && kind != APPEND {
        return Err(r.corrupt(format!("a producer tag on a command of kind {kind}")));
    }
    let name = std::str::from_utf8(r.bytes()?)
        .map_err(|_| r.corrupt("the stream name is not UTF-8"))?
        .to_string();
    let command = match kind {
        CREATE => decode_create(&mut r, version, name)?,
        ADD_FIELDS if version >= EVOLVING_SINCE => {
            let fields: Vec<Field> = serde_json::from_slice(r.bytes()?)
                .map_err(|e| r.corrupt(format!("fields: {e}")))?;
            Command::AddFields { name, fields }
        }
        DROP => Command::DropStream { name },
        CLEAR => Command::Clear { name },
        RETENTION => {
            let flags = r.u8()?;
            if flags & !(RETAIN_AGE | RETAIN_BYTES) != 0 {
                return Err(r.corrupt(format!("retention flags {flags}")));
            }
            let age = r.i64()?;
            let bytes = r.u64()?;
            Command::SetRetention {
                name,
                retention: Retention {
                    max_age_ns: (flags & RETAIN_AGE != 0).then_some(age),
                    max_bytes: (flags & RETAIN_BYTES != 0).then_some(bytes),
                },
            }
        }
        WINDOW => {
            let has_window = match r.u8()? {
                0 => false,
                1 => true,
                other => return Err(r.corrupt(format!("window flag {other}"))),
            };
            let window = r.i64()?;
            Command::SetOutOfOrderWindow {
                name,
                window_ns: has_window.then_some(window),
            }
        }
        APPEND => Command::Append {
            name,
            batch: r.take(r.remaining())?,
            producer,
        },
        COMMIT if version >= COMMIT_SINCE => {
            let consumer = std::str::from_utf8(r.bytes()?)
                .map_err(|_| r.corrupt("the consumer name is not UTF-8"))?
                .to_string();
            let has_position = match r.u8()? {
                0 => false,
                1 => true,
                other => return Err(r.corrupt(format!("position flag {other}"))),
            };
            let position = r.u64()?;
            Command::CommitPosition {
                name,
                consumer,
                position: has_position.then_some(position),
            }
        }
        other => return Err(r.corrupt(format!("unknown kind {other}"))),
    };
    r.finish()?;
    Ok(command)
}

/// The rest of a CREATE command of format `version`, after the stream's `name`: its schema,
/// then (since [`EVOLVING_SINCE`]) its flags, then (when flagged) its partition.
fn decode_create<B>(
    r: &mut Reader<'_, CommandError>,
    version: u8,
    name: String,
) -> Result<Command<B>, CommandError> {
    let schema: Schema =
        serde_json::from_slice(r.bytes()?).map_err(|e| r.corrupt(format!("schema: {e}")))?;
    let flags = if version >= EVOLVING_SINCE {
        r.u8()?
    } else {
        0
    };
    let known = if version >= PARTITION_SINCE {
        CREATE_EVOLVING | CREATE_PARTITIONED
    } else {
        CREATE_EVOLVING
    };
    if flags & !known != 0 {
        return Err(r.corrupt(format!("create flags {flags}")));
    }
    let partition = if flags & CREATE_PARTITIONED != 0 {
        let ns = r.i64()?;
        Partition::new(ns).map_err(|e| r.corrupt(e.to_string()))?
    } else {
        Partition::DAY
    };
    Ok(Command::CreateStream {
        name,
        schema,
        evolving: flags & CREATE_EVOLVING != 0,
        partition,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::wire::decode_batch;
    use crate::{BatchBuilder, Value};

    fn batch(schema: &Arc<Schema>, n: i64) -> EventBatch {
        let mut b = BatchBuilder::new(schema.clone(), n as usize);
        for i in 0..n {
            b.push_row(
                i,
                (i % 2 == 0).then_some(i + 1),
                &[
                    Value::Integer(i as i32),
                    Value::String("x".repeat(i as usize)),
                ],
            )
            .unwrap();
        }
        b.finish()
    }

    #[test]
    fn every_command_round_trips_and_every_cut_is_an_error() {
        let schema = Arc::new(Schema::parse_spec("A:INTEGER,B:STRING").unwrap());
        let events = batch(&schema, 3);
        let body = wire_bytes(&events);
        let tag = ProducerSeq {
            producer: 7,
            sequence: 42,
            part: 1,
        };
        let name = "tick ü".to_string();
        let commands: Vec<Command<&[u8]>> = vec![
            Command::CreateStream {
                name: name.clone(),
                schema: (*schema).clone(),
                evolving: false,
                partition: Partition::DAY,
            },
            Command::CreateStream {
                name: name.clone(),
                schema: (*schema).clone(),
                evolving: true,
                partition: Partition::DAY,
            },
            Command::CreateStream {
                name: name.clone(),
                schema: (*schema).clone(),
                evolving: true,
                partition: Partition::new(3_600_000_000_000).unwrap(),
            },
            Command::CreateStream {
                name: name.clone(),
                schema: (*schema).clone(),
                evolving: false,
                partition: Partition::new(7 * 86_400_000_000_000).unwrap(),
            },
            Command::AddFields {
                name: name.clone(),
                fields: schema.fields().to_vec(),
            },
            Command::DropStream { name: name.clone() },
            Command::Clear { name: name.clone() },
            Command::SetRetention {
                name: name.clone(),
                retention: Retention {
                    max_age_ns: Some(5),
                    max_bytes: None,
                },
            },
            Command::SetOutOfOrderWindow {
                name: name.clone(),
                window_ns: Some(7 * 86_400_000_000_000),
            },
            Command::SetOutOfOrderWindow {
                name: name.clone(),
                window_ns: None,
            },
            Command::CommitPosition {
                name: name.clone(),
                consumer: "billing ü".into(),
                position: Some(u64::MAX >> 1),
            },
            Command::CommitPosition {
                name: name.clone(),
                consumer: "gone".into(),
                position: None,
            },
            Command::Append {
                name: name.clone(),
                batch: &body,
                producer: Some(tag),
            },
            Command::Append {
                name: name.clone(),
                batch: &body,
                producer: None,
            },
        ];
        for command in commands {
            let bytes = encode_to_vec(&command).unwrap();
            assert_eq!(decode(&bytes).unwrap(), command);
            // An append's body runs to the end, so only cuts into its head are errors here;
            // a cut body fails when the batch is decoded against its schema.
            let head = bytes.len() - command_body_len(&command);
            for cut in 0..head.max(bytes.len() * usize::from(command.is_catalog_change())) {
                assert!(decode(&bytes[..cut]).is_err(), "{command:?} cut at {cut}");
            }
        }
    }

    /// The wire bytes a log holds of `events`.
    fn wire_bytes(events: &EventBatch) -> Vec<u8> {
        let mut body = Vec::new();
        encode_batch_compact(events, &mut body).unwrap();
        body
    }

    fn command_body_len(command: &Command<&[u8]>) -> usize {
        match command {
            Command::Append { batch, .. } => batch.len(),
            _ => 0,
        }
    }

    #[test]
    fn an_event_batch_encodes_as_its_wire_bytes_would() {
        let schema = Arc::new(Schema::parse_spec("A:INTEGER,B:STRING").unwrap());
        let events = batch(&schema, 5);
        let body = wire_bytes(&events);
        let tag = Some(ProducerSeq {
            producer: 1,
            sequence: 2,
            part: 3,
        });
        for producer in [None, tag] {
            let from_events = Command::Append {
                name: "s".into(),
                batch: &events,
                producer,
            };
            let from_bytes = Command::Append {
                name: "s".into(),
                batch: body.as_slice(),
                producer,
            };
            let bytes = encode_to_vec(&from_events).unwrap();
            assert_eq!(bytes, encode_to_vec(&from_bytes).unwrap());
            let Command::Append { batch, .. } = decode(&bytes).unwrap() else {
                panic!("not an append");
            };
            let mut r: Reader<'_, CommandError> = Reader::new(batch, "batch");
            let back = decode_batch(&mut r, &schema).unwrap();
            assert_eq!(back.tstart(), events.tstart());
        }
    }

    #[test]
    fn versions_outside_the_readable_range_are_named_in_the_error() {
        let command: Command<&[u8]> = Command::Clear { name: "s".into() };
        let mut bytes = encode_to_vec(&command).unwrap();
        // Only appends need version 4 (compact columns), and creates with a partition
        // version 5: a version-3 reader takes the rest.
        assert_eq!(bytes[0], EVOLVING_SINCE);
        let append: Command<&[u8]> = Command::Append {
            name: "s".into(),
            batch: &[],
            producer: None,
        };
        assert_eq!(encode_to_vec(&append).unwrap()[0], COMPACT_SINCE);
        let create = |partition| Command::<&[u8]>::CreateStream {
            name: "s".into(),
            schema: Schema::parse_spec("A:INTEGER").unwrap(),
            evolving: false,
            partition,
        };
        assert_eq!(
            encode_to_vec(&create(Partition::DAY)).unwrap()[0],
            EVOLVING_SINCE
        );
        let hourly = Partition::new(3_600_000_000_000).unwrap();
        assert_eq!(encode_to_vec(&create(hourly)).unwrap()[0], PARTITION_SINCE);
        let commit = Command::<&[u8]>::CommitPosition {
            name: "s".into(),
            consumer: "c".into(),
            position: Some(1),
        };
        let mut commit_bytes = encode_to_vec(&commit).unwrap();
        assert_eq!(commit_bytes[0], COMMIT_SINCE);
        commit_bytes[0] = PARTITION_SINCE;
        assert!(decode(&commit_bytes).is_err(), "no COMMIT before version 6");
        // Version 1 (the Raft entries of earlier builds) has the same layout.
        bytes[0] = 1;
        assert_eq!(decode(&bytes).unwrap(), command);
        for version in [0, FORMAT_VERSION + 1, 255] {
            bytes[0] = version;
            let error = decode(&bytes).unwrap_err();
            assert_eq!(error, CommandError::UnknownVersion { found: version });
            assert!(error.to_string().contains(&format!("version {version}")));
        }
    }

    #[test]
    fn a_create_of_an_earlier_version_is_of_a_strict_stream() {
        let schema = Schema::parse_spec("A:INTEGER").unwrap();
        let command: Command<&[u8]> = Command::CreateStream {
            name: "s".into(),
            schema: schema.clone(),
            evolving: true,
            partition: Partition::DAY,
        };
        let mut bytes = encode_to_vec(&command).unwrap();
        assert_eq!(bytes.pop(), Some(CREATE_EVOLVING));
        for version in [1, 2] {
            bytes[0] = version;
            let Command::CreateStream { evolving, .. } = decode(&bytes).unwrap() else {
                panic!("not a create");
            };
            assert!(!evolving);
        }
        // Nor do those versions know ADD FIELDS.
        let mut add = encode_to_vec(&Command::<&[u8]>::AddFields {
            name: "s".into(),
            fields: schema.fields().to_vec(),
        })
        .unwrap();
        add[0] = 2;
        assert!(decode(&add).is_err());
    }

    #[test]
    fn a_partition_is_read_from_version_5_only_and_must_be_one() {
        let hourly = Partition::new(3_600_000_000_000).unwrap();
        let mut bytes = encode_to_vec(&Command::<&[u8]>::CreateStream {
            name: "s".into(),
            schema: Schema::parse_spec("A:INTEGER").unwrap(),
            evolving: false,
            partition: hourly,
        })
        .unwrap();
        let Command::CreateStream { partition, .. } = decode(&bytes).unwrap() else {
            panic!("not a create");
        };
        assert_eq!(partition, hourly);
        // A version 4 create knows no partition flag.
        bytes[0] = 4;
        assert!(decode(&bytes).is_err());
        // Nor is a duration that is no partition read as one.
        bytes[0] = FORMAT_VERSION;
        let at = bytes.len() - 8;
        bytes[at..].copy_from_slice(&5_400_000_000_000i64.to_le_bytes());
        let error = decode(&bytes).unwrap_err().to_string();
        assert!(error.contains("partition"), "{error}");
    }

    #[test]
    fn only_a_catalog_change_changes_batch_form() {
        let clear: Command<EventBatch> = Command::Clear { name: "s".into() };
        assert_eq!(
            clear.catalog_change::<u8>(),
            Some(Command::Clear { name: "s".into() })
        );
        let append: Command<u8> = Command::Append {
            name: "s".into(),
            batch: 1,
            producer: None,
        };
        assert_eq!(append.catalog_change::<u16>(), None);
    }

    #[test]
    fn a_producer_tag_belongs_to_appends_only() {
        let mut bytes = vec![FORMAT_VERSION, HAS_PRODUCER];
        bytes.extend_from_slice(&[0; 20]);
        bytes.push(CLEAR);
        put_bytes(&mut bytes, b"s").unwrap();
        assert!(decode(&bytes).is_err());
    }

    proptest::proptest! {
        /// Arbitrary and mutated bytes never panic the decoder.
        #[test]
        fn the_decoder_survives_garbage(
            garbage in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            flips in proptest::collection::vec((0usize..400, proptest::prelude::any::<u8>()), 1..4),
        ) {
            let _ = decode(&garbage);
            let schema = Arc::new(Schema::parse_spec("A:INTEGER,B:STRING").unwrap());
            let events = batch(&schema, 4);
            let mut valid = encode_to_vec(&Command::Append {
                name: "s".into(),
                batch: &events,
                producer: Some(ProducerSeq { producer: 1, sequence: 2, part: 0 }),
            }).unwrap();
            for (at, byte) in flips {
                let i = at % valid.len();
                valid[i] ^= byte;
            }
            if let Ok(Command::Append { batch, .. }) = decode(&valid) {
                let mut r: Reader<'_, CommandError> = Reader::new(batch, "batch");
                let _ = decode_batch(&mut r, &schema);
            }
        }
    }
}

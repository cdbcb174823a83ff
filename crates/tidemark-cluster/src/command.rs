//! What one Raft entry carries: a change to the replicated database, optionally tagged with
//! the producer id and sequence number that make a retried batch apply once.
//!
//! ```text
//! entry   := u8 version (1), u8 flags (1 = producer), [u64 producer id, u64 sequence, u32 part],
//!            u8 kind, u32 len + stream name, body
//!   1 CREATE     body = u32 len + schema JSON
//!   2 DROP       body = (none)
//!   3 APPEND     body = the batch in the wire form of `tidemark_core::wire` (to the end)
//!   4 CLEAR      body = (none)
//!   5 RETENTION  body = u8 flags (1 = age, 2 = bytes), i64 max age ns, u64 max bytes
//! ```
//!
//! The append body is the batch exactly as the binary protocol and the embedded log carry
//! it, so a batch is never re-encoded between the client and the segment flush.

use tidemark_core::bytes::{put_bytes, put_i64, put_u32, put_u64, put_u8, Malformed, Reader};
use tidemark_core::wire::encode_batch;
use tidemark_core::{EventBatch, Schema};
use tidemark_engine::{Command, Retention};

use crate::ClusterError;

const VERSION: u8 = 1;
const HAS_PRODUCER: u8 = 1;

const CREATE: u8 = 1;
const DROP: u8 = 2;
const APPEND: u8 = 3;
const CLEAR: u8 = 4;
const RETENTION: u8 = 5;

/// Who sent a batch, and its place in that producer's sequence.
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

/// A decoding failure: the bytes of an entry are not a command.
#[derive(Debug)]
pub struct BadEntry(pub String);

impl Malformed for BadEntry {
    fn malformed(what: &str, detail: String) -> BadEntry {
        BadEntry(format!("{what}: {detail}"))
    }
}

/// Encodes `command` (with its producer tag) as the bytes of one entry.
pub fn encode(
    producer: Option<ProducerSeq>,
    command: &Command<'_>,
) -> Result<Vec<u8>, ClusterError> {
    let body_len = match command {
        Command::Append { body, .. } => body.len(),
        _ => 64,
    };
    let mut out = Vec::with_capacity(body_len + 64);
    let (kind, name) = match command {
        Command::CreateStream { name, .. } => (CREATE, name),
        Command::DropStream { name } => (DROP, name),
        Command::Append { name, .. } => (APPEND, name),
        Command::Clear { name } => (CLEAR, name),
        Command::SetRetention { name, .. } => (RETENTION, name),
    };
    put_head(&mut out, producer, kind, name)?;
    match command {
        Command::CreateStream { schema, .. } => {
            let json =
                serde_json::to_vec(schema).map_err(|e| ClusterError::Invalid(e.to_string()))?;
            put_bytes(&mut out, &json).map_err(too_long)?;
        }
        Command::Append { body, .. } => out.extend_from_slice(body),
        Command::SetRetention { retention, .. } => {
            let flags = u8::from(retention.max_age_ns.is_some())
                | (u8::from(retention.max_bytes.is_some()) << 1);
            put_u8(&mut out, flags);
            put_i64(&mut out, retention.max_age_ns.unwrap_or(0));
            put_u64(&mut out, retention.max_bytes.unwrap_or(0));
        }
        Command::DropStream { .. } | Command::Clear { .. } => {}
    }
    Ok(out)
}

/// Encodes an append of `batch` to `name`: the bytes of [`encode`] for a
/// `Command::Append` whose body is the batch's wire form, with the batch encoded in place
/// rather than into a body of its own that is then copied.
pub fn encode_append(
    producer: Option<ProducerSeq>,
    name: &str,
    batch: &EventBatch,
) -> Result<Vec<u8>, ClusterError> {
    let mut out = Vec::new();
    put_head(&mut out, producer, APPEND, name)?;
    encode_batch(batch, &mut out).map_err(too_long)?;
    Ok(out)
}

/// What every entry starts with: version, producer tag, kind and stream name.
fn put_head(
    out: &mut Vec<u8>,
    producer: Option<ProducerSeq>,
    kind: u8,
    name: &str,
) -> Result<(), ClusterError> {
    put_u8(out, VERSION);
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
    put_bytes(out, name.as_bytes()).map_err(too_long)
}

fn too_long(e: tidemark_core::bytes::TooLong) -> ClusterError {
    ClusterError::Invalid(e.to_string())
}

/// Decodes the bytes of one entry; the command borrows from them.
pub fn decode(bytes: &[u8]) -> Result<(Option<ProducerSeq>, Command<'_>), BadEntry> {
    let mut r: Reader<'_, BadEntry> = Reader::new(bytes, "replicated command");
    let version = r.u8()?;
    if version != VERSION {
        return Err(r.corrupt(format!("version {version} (this build reads {VERSION})")));
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
    let name =
        std::str::from_utf8(r.bytes()?).map_err(|_| r.corrupt("stream name is not UTF-8"))?;
    let command = match kind {
        CREATE => {
            let schema: Schema =
                serde_json::from_slice(r.bytes()?).map_err(|e| BadEntry(format!("schema: {e}")))?;
            r.finish()?;
            Command::CreateStream { name, schema }
        }
        DROP => {
            r.finish()?;
            Command::DropStream { name }
        }
        CLEAR => {
            r.finish()?;
            Command::Clear { name }
        }
        RETENTION => {
            let flags = r.u8()?;
            let age = r.i64()?;
            let bytes = r.u64()?;
            r.finish()?;
            Command::SetRetention {
                name,
                retention: Retention {
                    max_age_ns: (flags & 1 != 0).then_some(age),
                    max_bytes: (flags & 2 != 0).then_some(bytes),
                },
            }
        }
        APPEND => {
            let body = r.take(r.remaining())?;
            Command::Append { name, body }
        }
        other => return Err(r.corrupt(format!("unknown kind {other}"))),
    };
    Ok((producer, command))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_round_trips_and_damage_is_an_error() {
        let schema = Schema::parse_spec("A:INTEGER,B:STRING").unwrap();
        let tag = Some(ProducerSeq {
            producer: 7,
            sequence: 42,
            part: 1,
        });
        let commands = [
            (None, Command::CreateStream { name: "s", schema }),
            (
                tag,
                Command::Append {
                    name: "s",
                    body: &[1, 2, 3, 4],
                },
            ),
            (None, Command::Clear { name: "s" }),
            (None, Command::DropStream { name: "s" }),
            (
                None,
                Command::SetRetention {
                    name: "s",
                    retention: Retention {
                        max_age_ns: Some(5),
                        max_bytes: None,
                    },
                },
            ),
        ];
        for (producer, command) in commands {
            let bytes = encode(producer, &command).unwrap();
            let (p, c) = decode(&bytes).unwrap();
            assert_eq!((p, &c), (producer, &command));
            for cut in 0..bytes.len() {
                if !matches!(command, Command::Append { .. }) || cut < 8 {
                    assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
                }
            }
        }
        assert!(decode(&[2, 0, 1, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn an_append_encoded_in_place_is_the_append_command() {
        use tidemark_core::{BatchBuilder, Value};
        let schema = std::sync::Arc::new(Schema::parse_spec("A:INTEGER,B:STRING").unwrap());
        let mut b = BatchBuilder::new(schema, 3);
        for i in 0..3 {
            b.push_row(
                i,
                None,
                &[
                    Value::Integer(i as i32),
                    Value::String("x".repeat(i as usize)),
                ],
            )
            .unwrap();
        }
        let batch = b.finish();
        let mut body = Vec::new();
        encode_batch(&batch, &mut body).unwrap();
        let tag = Some(ProducerSeq {
            producer: 1,
            sequence: 2,
            part: 3,
        });
        for producer in [None, tag] {
            let command = Command::Append {
                name: "stream",
                body: &body,
            };
            assert_eq!(
                encode_append(producer, "stream", &batch).unwrap(),
                encode(producer, &command).unwrap()
            );
        }
    }
}

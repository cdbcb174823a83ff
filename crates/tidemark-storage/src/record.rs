//! What a log record says. Every change to a database is one record: creating, dropping and
//! clearing streams, setting retention, and appending a batch. (The framing around a record,
//! its length and checksum, is in [`crate::log`].)
//!
//! ```text
//! payload := u8 kind, u32 stream id, body
//!   1 CREATE     body = u32 len + schema JSON, u32 len + name (UTF-8)
//!   2 DROP       body = (none)
//!   3 APPEND     body = batch (the wire form of `tidemark_core::wire`)
//!   4 CLEAR      body = (none)
//!   5 RETENTION  body = u8 flags (1 = age, 2 = bytes), i64 max age ns, u64 max bytes
//! ```
//!
//! Append bodies are not compressed: the log is written on the latency path of every
//! append, and a plain copy of the columns is what keeps it cheap. Compression happens once,
//! when the memtable is flushed to segments.

use std::sync::Arc;

use tidemark_core::wire::{decode_batch, encode_batch};
use tidemark_core::{EventBatch, Schema};

use crate::bytes::{put_bytes, put_i64, put_u32, put_u64, put_u8, Reader};
use crate::StorageError;

pub type StreamId = u32;

/// How long and how large a stream may grow before its oldest segments are dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Retention {
    /// Segments whose newest event is older than this many nanoseconds are dropped.
    pub max_age_ns: Option<i64>,
    /// The oldest segments are dropped while the stream's segments exceed this many bytes.
    pub max_bytes: Option<u64>,
}

/// A decoded log record. Append bodies stay undecoded until the stream's schema is known.
#[derive(Debug, Clone, PartialEq)]
pub enum Record<'a> {
    CreateStream {
        stream: StreamId,
        name: String,
        schema: Schema,
    },
    DropStream {
        stream: StreamId,
    },
    Append {
        stream: StreamId,
        body: &'a [u8],
    },
    Clear {
        stream: StreamId,
    },
    SetRetention {
        stream: StreamId,
        retention: Retention,
    },
}

const CREATE: u8 = 1;
const DROP: u8 = 2;
const APPEND: u8 = 3;
const CLEAR: u8 = 4;
const RETENTION: u8 = 5;

impl Record<'_> {
    pub fn stream(&self) -> StreamId {
        match self {
            Record::CreateStream { stream, .. }
            | Record::DropStream { stream }
            | Record::Append { stream, .. }
            | Record::Clear { stream }
            | Record::SetRetention { stream, .. } => *stream,
        }
    }

    /// Encodes a record other than an append (see [`encode_append`]).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), StorageError> {
        match self {
            Record::CreateStream {
                stream,
                name,
                schema,
            } => {
                put_u8(out, CREATE);
                put_u32(out, *stream);
                let json =
                    serde_json::to_vec(schema).map_err(|e| StorageError::Encode(e.to_string()))?;
                put_bytes(out, &json)?;
                put_bytes(out, name.as_bytes())?;
            }
            Record::DropStream { stream } => {
                put_u8(out, DROP);
                put_u32(out, *stream);
            }
            Record::Append { stream, body } => {
                put_u8(out, APPEND);
                put_u32(out, *stream);
                out.extend_from_slice(body);
            }
            Record::Clear { stream } => {
                put_u8(out, CLEAR);
                put_u32(out, *stream);
            }
            Record::SetRetention { stream, retention } => {
                put_u8(out, RETENTION);
                put_u32(out, *stream);
                let flags = u8::from(retention.max_age_ns.is_some())
                    | (u8::from(retention.max_bytes.is_some()) << 1);
                put_u8(out, flags);
                put_i64(out, retention.max_age_ns.unwrap_or(0));
                put_u64(out, retention.max_bytes.unwrap_or(0));
            }
        }
        Ok(())
    }

    pub fn decode(payload: &[u8]) -> Result<Record<'_>, StorageError> {
        let mut r = Reader::new(payload, "log record");
        let kind = r.u8()?;
        let stream = r.u32()?;
        let record = match kind {
            CREATE => {
                let schema = serde_json::from_slice(r.bytes()?)
                    .map_err(|e| r.corrupt(format!("schema: {e}")))?;
                let name = String::from_utf8(r.bytes()?.to_vec())
                    .map_err(|_| r.corrupt("stream name is not UTF-8"))?;
                Record::CreateStream {
                    stream,
                    name,
                    schema,
                }
            }
            DROP => Record::DropStream { stream },
            APPEND => {
                let body = r.take(r.remaining())?;
                Record::Append { stream, body }
            }
            CLEAR => Record::Clear { stream },
            RETENTION => {
                let flags = r.u8()?;
                let age = r.i64()?;
                let bytes = r.u64()?;
                Record::SetRetention {
                    stream,
                    retention: Retention {
                        max_age_ns: (flags & 1 != 0).then_some(age),
                        max_bytes: (flags & 2 != 0).then_some(bytes),
                    },
                }
            }
            other => return Err(r.corrupt(format!("unknown record kind {other}"))),
        };
        r.finish()?;
        Ok(record)
    }
}

/// Encodes an append record of `batch` to `stream`.
pub fn encode_append(
    stream: StreamId,
    batch: &EventBatch,
    out: &mut Vec<u8>,
) -> Result<(), StorageError> {
    put_u8(out, APPEND);
    put_u32(out, stream);
    encode_batch(batch, out)?;
    Ok(())
}

/// Decodes an append body against the stream's schema.
pub fn decode_append(body: &[u8], schema: &Arc<Schema>) -> Result<EventBatch, StorageError> {
    let mut r = Reader::new(body, "append record");
    let batch = decode_batch(&mut r, schema)?;
    r.finish()?;
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::{BatchBuilder, Value};

    #[test]
    fn records_round_trip() {
        let schema = Schema::parse_spec("S:STRING,I:INTEGER,F:FLOAT,B:BOOLEAN,X:BYTES").unwrap();
        let records = [
            Record::CreateStream {
                stream: 7,
                name: "tick ü".into(),
                schema: schema.clone(),
            },
            Record::DropStream { stream: 1 },
            Record::Clear { stream: 2 },
            Record::SetRetention {
                stream: 3,
                retention: Retention {
                    max_age_ns: Some(5),
                    max_bytes: None,
                },
            },
        ];
        for record in records {
            let mut out = Vec::new();
            record.encode(&mut out).unwrap();
            assert_eq!(Record::decode(&out).unwrap(), record);
            assert!(Record::decode(&out[..out.len() - 1]).is_err());
        }

        let schema = Arc::new(schema);
        let mut b = BatchBuilder::new(schema.clone(), 3);
        b.push_row(
            10,
            None,
            &[
                Value::String("a".into()),
                Value::Integer(1),
                Value::Float(f32::NAN),
                Value::Boolean(true),
                Value::Bytes(vec![1, 2]),
            ],
        )
        .unwrap();
        b.push_row(
            5,
            Some(6),
            &[
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
            ],
        )
        .unwrap();
        let batch = b.finish();
        let mut out = Vec::new();
        encode_append(9, &batch, &mut out).unwrap();
        let Record::Append { stream: 9, body } = Record::decode(&out).unwrap() else {
            panic!("not an append");
        };
        let back = decode_append(body, &schema).unwrap();
        assert_eq!(back.tstart(), batch.tstart());
        assert_eq!(back.tend_at(1), Some(6));
        for row in 0..2 {
            for (a, b) in back.row(row).iter().zip(batch.row(row)) {
                assert!(a.same_as(&b));
            }
        }
        let other = Arc::new(Schema::parse_spec("S:STRING").unwrap());
        assert!(decode_append(body, &other).is_err());
        for cut in 0..body.len() {
            assert!(decode_append(&body[..cut], &schema).is_err(), "cut {cut}");
        }
    }

    proptest::proptest! {
        /// Arbitrary bytes and mutated valid records never panic the decoders.
        #[test]
        fn decoders_survive_garbage(
            garbage in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            flips in proptest::collection::vec((0usize..400, proptest::prelude::any::<u8>()), 1..4),
        ) {
            let schema = Arc::new(Schema::parse_spec("S:STRING,I:INTEGER,F:DOUBLE,B:BOOLEAN").unwrap());
            let decode = |bytes: &[u8]| {
                if let Ok(Record::Append { body, .. }) = Record::decode(bytes) {
                    let _ = decode_append(body, &schema);
                }
            };
            decode(&garbage);
            let mut b = BatchBuilder::new(schema.clone(), 3);
            for i in 0..3 {
                b.push_row(i, Some(i + 1), &[Value::String("x".repeat(i as usize)), Value::Integer(7), Value::Null, Value::Boolean(true)]).unwrap();
            }
            let mut valid = Vec::new();
            encode_append(1, &b.finish(), &mut valid).unwrap();
            for (at, byte) in flips {
                let i = at % valid.len();
                valid[i] ^= byte;
            }
            decode(&valid);
        }
    }
}

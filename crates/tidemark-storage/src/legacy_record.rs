//! The log records of log format 1, read only to upgrade a data directory written by an
//! earlier build: the engine replays them once, checkpoints, and writes format 2 (commands
//! of `tidemark_core::command`) from then on. Nothing writes this format any more.
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
//! Format 1 numbered streams; format 2 names them.

use tidemark_core::{Retention, Schema};

use crate::bytes::Reader;
use crate::manifest::StreamId;
use crate::StorageError;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::{put_bytes, put_i64, put_u32, put_u64, put_u8};

    /// A record laid out as the module's documentation says format 1 did.
    fn record(kind: u8, stream: u32, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        put_u8(&mut out, kind);
        put_u32(&mut out, stream);
        body(&mut out);
        out
    }

    #[test]
    fn every_kind_of_format_1_record_decodes_and_a_cut_one_is_an_error() {
        let schema = Schema::parse_spec("S:STRING,I:INTEGER").unwrap();
        let json = serde_json::to_vec(&schema).unwrap();
        let cases = [
            (
                record(CREATE, 7, |out| {
                    put_bytes(out, &json).unwrap();
                    put_bytes(out, "tick ü".as_bytes()).unwrap();
                }),
                Record::CreateStream {
                    stream: 7,
                    name: "tick ü".into(),
                    schema: schema.clone(),
                },
            ),
            (record(DROP, 1, |_| {}), Record::DropStream { stream: 1 }),
            (record(CLEAR, 2, |_| {}), Record::Clear { stream: 2 }),
            (
                record(RETENTION, 3, |out| {
                    put_u8(out, 1);
                    put_i64(out, 5);
                    put_u64(out, 0);
                }),
                Record::SetRetention {
                    stream: 3,
                    retention: Retention {
                        max_age_ns: Some(5),
                        max_bytes: None,
                    },
                },
            ),
        ];
        for (bytes, expected) in cases {
            assert_eq!(Record::decode(&bytes).unwrap(), expected);
            assert!(Record::decode(&bytes[..bytes.len() - 1]).is_err());
        }
        let append = record(APPEND, 9, |out| out.extend_from_slice(&[1, 2, 3]));
        assert_eq!(
            Record::decode(&append).unwrap(),
            Record::Append {
                stream: 9,
                body: &[1, 2, 3]
            }
        );
        assert!(Record::decode(&record(6, 1, |_| {})).is_err());
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn the_decoder_survives_garbage(
            garbage in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        ) {
            let _ = Record::decode(&garbage);
        }
    }
}

//! Requests and answers: what the body of each frame kind holds.
//!
//! ```text
//! PING       (empty)                                   → ACK with lsn 0, events 0
//! AUTH       token (UTF-8, the rest of the body)       → ACK, or ERROR UNAUTHORIZED
//! APPEND     u16 len + stream name, u32 len + schema spec (`NAME:TYPE,…`), batch
//! TAGGED_APPEND  u64 producer id, u64 sequence, then APPEND's body
//! COMMAND    a catalog change encoded as in the log (`tidemark_core::command`): what an
//!            agent forwards from its spool besides appends (stream creation, fields added)
//! ACK        u64 durable log position (LSN), u64 events, u32 service time (µs)
//! TRY_LATER  u32 retry-after in milliseconds, u32 len + message
//! ERROR      u16 code, u32 len + message
//! ```
//! The schema spec in APPEND lets the server refuse a batch built for another schema (two
//! INTEGER fields in swapped order would otherwise decode "fine").

use std::sync::Arc;

use tidemark_core::bytes::{put_bytes, put_u32, put_u64, Reader, TooLong};
use tidemark_core::wire::{decode_batch, encode_batch};
use tidemark_core::{EventBatch, Schema};

use crate::frame::{begin_frame, end_frame, Frame, FrameError, Kind};

/// What a client asks. Borrowed from the frame it was decoded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    Ping,
    Auth {
        token: &'a str,
    },
    /// `batch` is still in wire form: only the server knows the stream's schema.
    /// `producer` is the (producer id, sequence) of a TAGGED_APPEND: in a cluster, a batch
    /// sent again with the same pair is applied once.
    Append {
        stream: &'a str,
        schema: &'a str,
        batch: &'a [u8],
        producer: Option<(u64, u64)>,
    },
    /// A catalog change, still encoded (`tidemark_core::command::decode` reads it).
    Command {
        command: &'a [u8],
    },
}

/// What a server answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Durable: the batch's log record is fsync'd at `lsn`. `service_micros` is how long the
    /// server worked on the request, from having read it in full to the answer being ready
    /// (saturating; 0 for PING and AUTH): with the client's round trip it splits a latency
    /// into server and network/client parts.
    Ack {
        lsn: u64,
        events: u64,
        service_micros: u32,
    },
    /// Not accepted now; nothing of the request was stored. Send it again later.
    TryLater {
        retry_after_ms: u32,
        message: String,
    },
    /// Refused; nothing of the request was stored.
    Error { code: ErrorCode, message: String },
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The frame could not be read; the server closes the connection after this.
    MalformedFrame,
    UnsupportedVersion,
    /// The request is well-framed but its content is invalid (bad events, bad batch).
    BadRequest,
    UnknownStream,
    /// The batch was built for a schema other than the stream's.
    SchemaMismatch,
    Unauthorized,
    TooLarge,
    /// The server cannot accept writes (its log failed, it is shutting down).
    Unavailable,
    Internal,
    /// A code this version does not know.
    Other(u16),
}

impl ErrorCode {
    pub fn code(self) -> u16 {
        match self {
            ErrorCode::MalformedFrame => 1,
            ErrorCode::UnsupportedVersion => 2,
            ErrorCode::BadRequest => 3,
            ErrorCode::UnknownStream => 4,
            ErrorCode::SchemaMismatch => 5,
            ErrorCode::Unauthorized => 6,
            ErrorCode::TooLarge => 7,
            ErrorCode::Unavailable => 8,
            ErrorCode::Internal => 9,
            ErrorCode::Other(code) => code,
        }
    }

    pub fn from_code(code: u16) -> ErrorCode {
        match code {
            1 => ErrorCode::MalformedFrame,
            2 => ErrorCode::UnsupportedVersion,
            3 => ErrorCode::BadRequest,
            4 => ErrorCode::UnknownStream,
            5 => ErrorCode::SchemaMismatch,
            6 => ErrorCode::Unauthorized,
            7 => ErrorCode::TooLarge,
            8 => ErrorCode::Unavailable,
            9 => ErrorCode::Internal,
            other => ErrorCode::Other(other),
        }
    }
}

impl<'a> Request<'a> {
    /// Reads the request in `frame`; answers are not requests.
    pub fn decode(frame: &Frame<'a>) -> Result<Request<'a>, FrameError> {
        let mut r = Reader::<FrameError>::new(frame.body, "request");
        let request = match frame.kind {
            Kind::Ping => Request::Ping,
            Kind::Auth => Request::Auth {
                token: utf8(frame.body, "token")?,
            },
            Kind::Append | Kind::TaggedAppend => {
                let producer = match frame.kind {
                    Kind::TaggedAppend => Some((r.u64()?, r.u64()?)),
                    _ => None,
                };
                let stream_len = u16::from_le_bytes([r.u8()?, r.u8()?]) as usize;
                let stream = utf8(r.take(stream_len)?, "stream name")?;
                let schema = utf8(r.bytes()?, "schema spec")?;
                let batch = r.take(r.remaining())?;
                Request::Append {
                    stream,
                    schema,
                    batch,
                    producer,
                }
            }
            Kind::Command => Request::Command {
                command: r.take(r.remaining())?,
            },
            Kind::Ack | Kind::TryLater | Kind::Error => {
                return Err(r.corrupt(format!("{:?} is an answer, not a request", frame.kind)))
            }
        };
        if matches!(request, Request::Ping) {
            r.finish()?;
        }
        Ok(request)
    }

    /// Appends the frame of this request to `out`.
    pub fn encode(&self, request_id: u64, out: &mut Vec<u8>) -> Result<(), TooLong> {
        match *self {
            Request::Ping => {
                let start = begin_frame(out, Kind::Ping, request_id);
                end_frame(out, start)
            }
            Request::Auth { token } => {
                let start = begin_frame(out, Kind::Auth, request_id);
                out.extend_from_slice(token.as_bytes());
                end_frame(out, start)
            }
            Request::Append {
                stream,
                schema,
                batch,
                producer,
            } => {
                let start = begin_append(out, request_id, stream, schema, producer)?;
                out.extend_from_slice(batch);
                end_frame(out, start)
            }
            Request::Command { command } => {
                let start = begin_frame(out, Kind::Command, request_id);
                out.extend_from_slice(command);
                end_frame(out, start)
            }
        }
    }
}

/// Appends the frame of an APPEND request of `batch` to `out` (TAGGED_APPEND with a
/// producer id and sequence), encoding the batch in place (no intermediate copy of its
/// columns).
pub fn encode_append(
    request_id: u64,
    stream: &str,
    batch: &EventBatch,
    producer: Option<(u64, u64)>,
    out: &mut Vec<u8>,
) -> Result<(), TooLong> {
    let start = begin_append(out, request_id, stream, &batch.schema().to_spec(), producer)?;
    encode_batch(batch, out)?;
    end_frame(out, start)
}

fn begin_append(
    out: &mut Vec<u8>,
    request_id: u64,
    stream: &str,
    schema: &str,
    producer: Option<(u64, u64)>,
) -> Result<usize, TooLong> {
    let stream_len = u16::try_from(stream.len()).map_err(|_| TooLong(stream.len()))?;
    let start = match producer {
        None => begin_frame(out, Kind::Append, request_id),
        Some((producer, sequence)) => {
            let start = begin_frame(out, Kind::TaggedAppend, request_id);
            put_u64(out, producer);
            put_u64(out, sequence);
            start
        }
    };
    out.extend_from_slice(&stream_len.to_le_bytes());
    out.extend_from_slice(stream.as_bytes());
    put_bytes(out, schema.as_bytes())?;
    Ok(start)
}

/// Decodes the batch of an APPEND request against the stream's `schema`, after checking that
/// the client built it for that schema (field names compare case-insensitively).
pub fn decode_append_batch(
    spec: &str,
    batch: &[u8],
    schema: &Arc<Schema>,
) -> Result<EventBatch, FrameError> {
    if !schema.is_described_by(spec) {
        // The slow path, for the error (or a spec spelling types by an alias).
        let claimed = Schema::parse_spec(spec).map_err(|e| FrameError::Malformed {
            what: "schema spec".into(),
            detail: e.to_string(),
        })?;
        if !claimed.matches(schema) {
            return Err(FrameError::SchemaMismatch {
                claimed: spec.to_string(),
                actual: schema.to_spec(),
            });
        }
    }
    let mut r = Reader::<FrameError>::new(batch, "batch");
    let batch = decode_batch(&mut r, schema)?;
    r.finish()?;
    Ok(batch)
}

impl Response {
    /// Appends the frame of this answer to `out`.
    pub fn encode(&self, request_id: u64, out: &mut Vec<u8>) {
        let kind = match self {
            Response::Ack { .. } => Kind::Ack,
            Response::TryLater { .. } => Kind::TryLater,
            Response::Error { .. } => Kind::Error,
        };
        let start = begin_frame(out, kind, request_id);
        match self {
            Response::Ack {
                lsn,
                events,
                service_micros,
            } => {
                put_u64(out, *lsn);
                put_u64(out, *events);
                put_u32(out, *service_micros);
            }
            Response::TryLater {
                retry_after_ms,
                message,
            } => {
                put_u32(out, *retry_after_ms);
                put_message(out, message);
            }
            Response::Error { code, message } => {
                out.extend_from_slice(&code.code().to_le_bytes());
                put_message(out, message);
            }
        }
        // An answer is a few dozen bytes plus a message capped by put_message: it fits.
        let fits = end_frame(out, start);
        debug_assert!(fits.is_ok());
    }

    /// Reads the answer in `frame`; requests are not answers.
    pub fn decode(frame: &Frame<'_>) -> Result<Response, FrameError> {
        let mut r = Reader::<FrameError>::new(frame.body, "answer");
        let response = match frame.kind {
            Kind::Ack => Response::Ack {
                lsn: r.u64()?,
                events: r.u64()?,
                service_micros: r.u32()?,
            },
            Kind::TryLater => Response::TryLater {
                retry_after_ms: r.u32()?,
                message: utf8(r.bytes()?, "message")?.to_string(),
            },
            Kind::Error => Response::Error {
                code: ErrorCode::from_code(u16::from_le_bytes([r.u8()?, r.u8()?])),
                message: utf8(r.bytes()?, "message")?.to_string(),
            },
            Kind::Ping | Kind::Auth | Kind::Append | Kind::TaggedAppend | Kind::Command => {
                return Err(r.corrupt(format!("{:?} is a request, not an answer", frame.kind)))
            }
        };
        r.finish()?;
        Ok(response)
    }
}

/// The most message bytes an answer carries; longer messages are cut at a char boundary.
const MAX_MESSAGE_BYTES: usize = 4096;

fn put_message(out: &mut Vec<u8>, message: &str) {
    let mut end = message.len().min(MAX_MESSAGE_BYTES);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    put_u32(out, end as u32);
    out.extend_from_slice(&message.as_bytes()[..end]);
}

fn utf8<'a>(bytes: &'a [u8], what: &str) -> Result<&'a str, FrameError> {
    std::str::from_utf8(bytes).map_err(|_| FrameError::Malformed {
        what: what.to_string(),
        detail: "not UTF-8".to_string(),
    })
}

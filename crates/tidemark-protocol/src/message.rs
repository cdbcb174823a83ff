//! Requests and answers: what the body of each frame kind holds.
//!
//! ```text
//! PING       (empty)                                   → ACK with lsn 0, events 0
//! AUTH       token (UTF-8, the rest of the body)       → ACK, or ERROR UNAUTHORIZED
//! APPEND     u16 len + stream name, u32 len + schema spec (`NAME:TYPE,…`), batch;
//!            flag FLAG_POSITIONS: answer with the positions given
//! TAGGED_APPEND  u64 producer id, u64 sequence, then APPEND's body (and its flag)
//! COMMAND    a catalog change encoded as in the log (`tidemark_core::command`): what an
//!            agent forwards from its spool besides appends (stream creation, fields added)
//! SUBSCRIBE  u16 len + stream name, u8 start (0 after, 1 earliest, 2 from a time,
//!            3 a consumer's position), u64 position or time, u16 len + consumer name,
//!            u32 credit (bytes), u8 follow (1) or end once caught up (0)
//! CREDIT     u32 bytes more for the subscription of the frame's request id
//! UNSUBSCRIBE  (empty): ends the subscription of the frame's request id
//! COMMIT_POSITION  u16 len + stream name, u16 len + consumer name, u64 position
//!            (u64::MAX: forget the consumer)
//! ACK        u64 durable log position (LSN), u64 events, u32 service time (µs);
//!            flag FLAG_POSITIONS: then u64 first position, u64 last position
//! TRY_LATER  u32 retry-after in milliseconds, u32 len + message
//! ERROR      u16 code, u32 len + message
//! EVENTS     u64 first position, u64 the stream's next position, u32 len + schema spec,
//!            batch (at least one event; consecutive positions from the first)
//! ```
//! The schema spec in APPEND lets the server refuse a batch built for another schema (two
//! INTEGER fields in swapped order would otherwise decode "fine").

use std::sync::Arc;

use tidemark_core::bytes::{put_bytes, put_u32, put_u64, Reader, TooLong};
use tidemark_core::wire::{decode_batch, encode_batch};
use tidemark_core::{EventBatch, Schema, MAX_POSITION};

use crate::frame::{begin_frame, end_frame, Frame, FrameError, Kind, FLAG_POSITIONS};

/// What a client asks. Borrowed from the frame it was decoded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    Ping,
    Auth {
        token: &'a str,
    },
    /// `batch` is still in wire form: only the server knows the stream's schema.
    /// `producer` is the (producer id, sequence) of a TAGGED_APPEND: in a cluster, a batch
    /// sent again with the same pair is applied once. `ask_positions` is the frame's
    /// [`FLAG_POSITIONS`]: the ACK is to carry the positions the events were given.
    Append {
        stream: &'a str,
        schema: &'a str,
        batch: &'a [u8],
        producer: Option<(u64, u64)>,
        ask_positions: bool,
    },
    /// A catalog change, still encoded (`tidemark_core::command::decode` reads it).
    Command {
        command: &'a [u8],
    },
    /// Read `stream` by position from `start`: the server sends EVENTS frames (with this
    /// frame's request id) while the subscription has credit, each frame's length taken
    /// from it; `follow`: for ever, as appends come, else until caught up, then an ACK.
    Subscribe {
        stream: &'a str,
        start: Start<'a>,
        credit: u32,
        follow: bool,
    },
    /// `bytes` more credit for the subscription of the frame's request id.
    Credit {
        bytes: u32,
    },
    /// Ends the subscription of the frame's request id (its last answer is an ACK).
    Unsubscribe,
    /// Consumer `consumer` of `stream` has read to `position` (`None`: forget it).
    CommitPosition {
        stream: &'a str,
        consumer: &'a str,
        position: Option<u64>,
    },
}

/// Where a subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start<'a> {
    /// After this position.
    After(u64),
    /// At the earliest event the stream holds.
    Earliest,
    /// At the first position whose event starts at or after this time (nanoseconds).
    FromTime(i64),
    /// After the position this named consumer committed (the earliest, if it never did).
    Consumer(&'a str),
}

/// What a server answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// Durable: the batch's log record is fsync'd at `lsn`. `service_micros` is how long the
    /// server worked on the request, from having read it in full to the answer being ready
    /// (saturating; 0 for PING and AUTH): with the client's round trip it splits a latency
    /// into server and network/client parts.
    ///
    /// `positions` are the stream positions the appended events were given, first and
    /// last, for an append that asked ([`FLAG_POSITIONS`]) and was given some (not a
    /// producer's retry, nor a stream without positions). Both are sent: on a cluster the
    /// parts of a split batch may interleave with other writers' appends, so the last is
    /// not always the first plus the events less one.
    Ack {
        lsn: u64,
        events: u64,
        service_micros: u32,
        positions: Option<(u64, u64)>,
    },
    /// Not accepted now; nothing of the request was stored. Send it again later.
    TryLater {
        retry_after_ms: u32,
        message: String,
    },
    /// Refused; nothing of the request was stored.
    Error { code: ErrorCode, message: String },
    /// Events of a subscription: `events` hold positions `first_position`,
    /// `first_position + 1`, …; `next_position` is the stream's next position when they
    /// were read (the subscriber is caught up once it has read up to it).
    Events {
        first_position: u64,
        next_position: u64,
        /// Boxed: the other answers are a few words.
        events: Box<EventBatch>,
    },
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
    /// A subscription asked for positions the stream no longer holds (retention, a clear):
    /// the message names the earliest held.
    Gone,
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
            ErrorCode::Gone => 10,
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
            10 => ErrorCode::Gone,
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
                    ask_positions: frame.flags & FLAG_POSITIONS != 0,
                }
            }
            Kind::Command => Request::Command {
                command: r.take(r.remaining())?,
            },
            Kind::Subscribe => {
                let stream = short_str(&mut r, "stream name")?;
                let (kind, value) = (r.u8()?, r.u64()?);
                let consumer = short_str(&mut r, "consumer name")?;
                let start = match kind {
                    0 => Start::After(value),
                    1 => Start::Earliest,
                    2 => Start::FromTime(value as i64),
                    3 => Start::Consumer(consumer),
                    other => return Err(r.corrupt(format!("start {other} (0 to 3)"))),
                };
                let credit = r.u32()?;
                let follow = match r.u8()? {
                    0 => false,
                    1 => true,
                    other => return Err(r.corrupt(format!("follow {other} (0 or 1)"))),
                };
                Request::Subscribe {
                    stream,
                    start,
                    credit,
                    follow,
                }
            }
            Kind::Credit => Request::Credit { bytes: r.u32()? },
            Kind::Unsubscribe => Request::Unsubscribe,
            Kind::CommitPosition => {
                let stream = short_str(&mut r, "stream name")?;
                let consumer = short_str(&mut r, "consumer name")?;
                let position = r.u64()?;
                Request::CommitPosition {
                    stream,
                    consumer,
                    position: (position != u64::MAX).then_some(position),
                }
            }
            Kind::Ack | Kind::TryLater | Kind::Error | Kind::Events => {
                return Err(r.corrupt(format!("{:?} is an answer, not a request", frame.kind)))
            }
        };
        // Whatever follows a request of fixed fields is a mistake: refused, not ignored.
        if !matches!(
            request,
            Request::Auth { .. } | Request::Append { .. } | Request::Command { .. }
        ) {
            r.finish()?;
        }
        Ok(request)
    }

    /// Appends the frame of this request to `out`.
    pub fn encode(&self, request_id: u64, out: &mut Vec<u8>) -> Result<(), TooLong> {
        match *self {
            Request::Ping => {
                let start = begin_frame(out, Kind::Ping, 0, request_id);
                end_frame(out, start)
            }
            Request::Auth { token } => {
                let start = begin_frame(out, Kind::Auth, 0, request_id);
                out.extend_from_slice(token.as_bytes());
                end_frame(out, start)
            }
            Request::Append {
                stream,
                schema,
                batch,
                producer,
                ask_positions,
            } => {
                let start = begin_append(out, request_id, stream, schema, producer, ask_positions)?;
                out.extend_from_slice(batch);
                end_frame(out, start)
            }
            Request::Command { command } => {
                let start = begin_frame(out, Kind::Command, 0, request_id);
                out.extend_from_slice(command);
                end_frame(out, start)
            }
            Request::Subscribe {
                stream,
                start: from,
                credit,
                follow,
            } => {
                let start = begin_frame(out, Kind::Subscribe, 0, request_id);
                put_short_str(out, stream)?;
                let (kind, value, consumer) = match from {
                    Start::After(position) => (0, position, ""),
                    Start::Earliest => (1, 0, ""),
                    Start::FromTime(time) => (2, time as u64, ""),
                    Start::Consumer(name) => (3, 0, name),
                };
                out.push(kind);
                put_u64(out, value);
                put_short_str(out, consumer)?;
                put_u32(out, credit);
                out.push(u8::from(follow));
                end_frame(out, start)
            }
            Request::Credit { bytes } => {
                let start = begin_frame(out, Kind::Credit, 0, request_id);
                put_u32(out, bytes);
                end_frame(out, start)
            }
            Request::Unsubscribe => {
                let start = begin_frame(out, Kind::Unsubscribe, 0, request_id);
                end_frame(out, start)
            }
            Request::CommitPosition {
                stream,
                consumer,
                position,
            } => {
                let start = begin_frame(out, Kind::CommitPosition, 0, request_id);
                put_short_str(out, stream)?;
                put_short_str(out, consumer)?;
                put_u64(out, position.unwrap_or(u64::MAX));
                end_frame(out, start)
            }
        }
    }
}

/// A name: `u16` length, then UTF-8.
fn short_str<'a>(r: &mut Reader<'a, FrameError>, what: &str) -> Result<&'a str, FrameError> {
    let len = u16::from_le_bytes([r.u8()?, r.u8()?]) as usize;
    utf8(r.take(len)?, what)
}

fn put_short_str(out: &mut Vec<u8>, text: &str) -> Result<(), TooLong> {
    let len = u16::try_from(text.len()).map_err(|_| TooLong(text.len()))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    Ok(())
}

/// Appends the frame of an EVENTS answer to `out`, encoding the batch in place.
pub fn encode_events(
    request_id: u64,
    first_position: u64,
    next_position: u64,
    events: &EventBatch,
    out: &mut Vec<u8>,
) -> Result<(), TooLong> {
    let start = begin_frame(out, Kind::Events, 0, request_id);
    put_u64(out, first_position);
    put_u64(out, next_position);
    put_bytes(out, events.schema().to_spec().as_bytes())?;
    encode_batch(events, out)?;
    end_frame(out, start)
}

/// Appends the frame of an APPEND request of `batch` to `out` (TAGGED_APPEND with a
/// producer id and sequence), encoding the batch in place (no intermediate copy of its
/// columns). `ask_positions` sets [`FLAG_POSITIONS`]: a server that knows it answers with
/// the positions given (an older one ignores it).
pub fn encode_append(
    request_id: u64,
    stream: &str,
    batch: &EventBatch,
    producer: Option<(u64, u64)>,
    ask_positions: bool,
    out: &mut Vec<u8>,
) -> Result<(), TooLong> {
    let spec = batch.schema().to_spec();
    let start = begin_append(out, request_id, stream, &spec, producer, ask_positions)?;
    encode_batch(batch, out)?;
    end_frame(out, start)
}

fn begin_append(
    out: &mut Vec<u8>,
    request_id: u64,
    stream: &str,
    schema: &str,
    producer: Option<(u64, u64)>,
    ask_positions: bool,
) -> Result<usize, TooLong> {
    let stream_len = u16::try_from(stream.len()).map_err(|_| TooLong(stream.len()))?;
    let flags = if ask_positions { FLAG_POSITIONS } else { 0 };
    let start = match producer {
        None => begin_frame(out, Kind::Append, flags, request_id),
        Some((producer, sequence)) => {
            let start = begin_frame(out, Kind::TaggedAppend, flags, request_id);
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
    pub fn encode(&self, request_id: u64, out: &mut Vec<u8>) -> Result<(), TooLong> {
        let kind = match self {
            Response::Ack { .. } => Kind::Ack,
            Response::TryLater { .. } => Kind::TryLater,
            Response::Error { .. } => Kind::Error,
            Response::Events {
                first_position,
                next_position,
                events,
            } => return encode_events(request_id, *first_position, *next_position, events, out),
        };
        // The one answer with a flag: an ACK that carries positions says so.
        let flags = match self {
            Response::Ack {
                positions: Some(_), ..
            } => FLAG_POSITIONS,
            _ => 0,
        };
        let start = begin_frame(out, kind, flags, request_id);
        match self {
            Response::Ack {
                lsn,
                events,
                service_micros,
                positions,
            } => {
                put_u64(out, *lsn);
                put_u64(out, *events);
                put_u32(out, *service_micros);
                if let Some((first, last)) = positions {
                    put_u64(out, *first);
                    put_u64(out, *last);
                }
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
            Response::Events { .. } => {}
        }
        // An answer is a few dozen bytes plus a message capped by put_message: it fits.
        end_frame(out, start)
    }

    /// Reads the answer in `frame`; requests are not answers.
    pub fn decode(frame: &Frame<'_>) -> Result<Response, FrameError> {
        let mut r = Reader::<FrameError>::new(frame.body, "answer");
        let response = match frame.kind {
            Kind::Ack => {
                let (lsn, events, service_micros) = (r.u64()?, r.u64()?, r.u32()?);
                // Without the flag the body ends here (`finish` below refuses more), as an
                // older server sends it; with it, exactly two positions more.
                let positions = if frame.flags & FLAG_POSITIONS != 0 {
                    let (first, last) = (r.u64()?, r.u64()?);
                    // At least one position per event, in order, within the largest: an
                    // answer that says otherwise is not one to hand on.
                    let fits = events > 0
                        && first <= last
                        && last <= MAX_POSITION
                        && events - 1 <= last - first;
                    if !fits {
                        return Err(r.corrupt(format!(
                            "ACK of {events} events at positions {first} to {last}"
                        )));
                    }
                    Some((first, last))
                } else {
                    None
                };
                Response::Ack {
                    lsn,
                    events,
                    service_micros,
                    positions,
                }
            }
            Kind::TryLater => Response::TryLater {
                retry_after_ms: r.u32()?,
                message: utf8(r.bytes()?, "message")?.to_string(),
            },
            Kind::Error => Response::Error {
                code: ErrorCode::from_code(u16::from_le_bytes([r.u8()?, r.u8()?])),
                message: utf8(r.bytes()?, "message")?.to_string(),
            },
            Kind::Events => {
                let (first_position, next_position) = (r.u64()?, r.u64()?);
                let spec = utf8(r.bytes()?, "schema spec")?;
                let schema = Schema::parse_spec(spec).map_err(|e| FrameError::Malformed {
                    what: "schema spec".into(),
                    detail: e.to_string(),
                })?;
                let events = decode_batch(&mut r, &Arc::new(schema))?;
                if events.is_empty() {
                    return Err(r.corrupt("EVENTS without events"));
                }
                let fits = first_position
                    .checked_add(events.len() as u64)
                    .is_some_and(|end| end <= next_position && next_position <= MAX_POSITION);
                if !fits {
                    return Err(r.corrupt(format!(
                        "{} events from position {first_position} pass the next position {next_position}",
                        events.len()
                    )));
                }
                Response::Events {
                    first_position,
                    next_position,
                    events: Box::new(events.with_positions_from(first_position)),
                }
            }
            Kind::Ping
            | Kind::Auth
            | Kind::Append
            | Kind::TaggedAppend
            | Kind::Command
            | Kind::Subscribe
            | Kind::Credit
            | Kind::Unsubscribe
            | Kind::CommitPosition => {
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

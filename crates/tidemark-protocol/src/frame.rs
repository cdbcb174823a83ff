//! The frame: a length-prefixed, checksummed envelope with a request id.
//!
//! ```text
//! offset size
//!      0    4  u32 length of the rest of the frame (16 + body length)
//!      4    1  u8 version (1)
//!      5    1  u8 kind
//!      6    2  u16 flags (bit 0: FLAG_POSITIONS; the others reserved, written 0)
//!      8    8  u64 request id (chosen by the client, echoed by the server)
//!     16    4  u32 CRC32C of the body
//!     20    …  body
//! ```
//! All integers little-endian.

use tidemark_core::bytes::{Malformed, TooLong};

/// The protocol version this crate speaks.
pub const VERSION: u8 = 1;
/// Bytes before the body.
pub const HEADER_LEN: usize = 20;
/// Header bytes counted by the length field (all but the length itself).
const LENGTH_COVERS: usize = HEADER_LEN - 4;

/// Flag bit 0. On APPEND and TAGGED_APPEND: the client asks for the positions its events
/// are given. On ACK: the body carries them (after the usual fields). A flag rather than a
/// new kind or version, so that neither side has to know the other's age: a server that
/// does not know the bit ignores it and answers a plain ACK, and a client that never sets
/// it never gets a longer one. The other bits are reserved: written 0, ignored on read.
pub const FLAG_POSITIONS: u16 = 0x0001;

/// What a frame carries. Requests have the high bit clear, answers have it set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ping,
    Auth,
    Append,
    /// An APPEND carrying a producer id and sequence number (idempotent retries).
    TaggedAppend,
    /// A catalog change (stream creation, fields added, …) in the log's own encoding.
    Command,
    /// Read a stream by position, as it grows: answered with EVENTS while credit lasts.
    Subscribe,
    /// More credit for the subscription of the frame's request id.
    Credit,
    /// Ends the subscription of the frame's request id.
    Unsubscribe,
    /// A named consumer's position, committed.
    CommitPosition,
    Ack,
    TryLater,
    Error,
    /// Events of a subscription, with their positions.
    Events,
}

impl Kind {
    /// APPEND, tagged or not.
    pub fn is_append(self) -> bool {
        matches!(self, Kind::Append | Kind::TaggedAppend)
    }

    /// Whether a server sends this kind (the high bit).
    pub fn is_answer(self) -> bool {
        self.code() & 0x80 != 0
    }

    pub fn code(self) -> u8 {
        match self {
            Kind::Ping => 0x01,
            Kind::Auth => 0x02,
            Kind::Append => 0x03,
            Kind::TaggedAppend => 0x04,
            Kind::Command => 0x05,
            Kind::Subscribe => 0x06,
            Kind::Credit => 0x07,
            Kind::Unsubscribe => 0x08,
            Kind::CommitPosition => 0x09,
            Kind::Ack => 0x81,
            Kind::TryLater => 0x82,
            Kind::Error => 0x83,
            Kind::Events => 0x84,
        }
    }

    pub fn from_code(code: u8) -> Option<Kind> {
        Some(match code {
            0x01 => Kind::Ping,
            0x02 => Kind::Auth,
            0x03 => Kind::Append,
            0x04 => Kind::TaggedAppend,
            0x05 => Kind::Command,
            0x06 => Kind::Subscribe,
            0x07 => Kind::Credit,
            0x08 => Kind::Unsubscribe,
            0x09 => Kind::CommitPosition,
            0x81 => Kind::Ack,
            0x82 => Kind::TryLater,
            0x83 => Kind::Error,
            0x84 => Kind::Events,
            _ => return None,
        })
    }
}

/// Why bytes are not a frame or not a valid request. Except for [`FrameError::Malformed`]
/// and [`FrameError::SchemaMismatch`] (a bad body in a good frame), the stream cannot be
/// resynchronised after one of these: close the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("frame length {0} is shorter than a header")]
    TooShort(usize),
    #[error("protocol version {0} is not supported (this server speaks {VERSION})")]
    UnsupportedVersion(u8),
    #[error("unknown frame kind {0:#04x}")]
    UnknownKind(u8),
    #[error("body checksum mismatch")]
    Checksum,
    #[error("malformed {what}: {detail}")]
    Malformed { what: String, detail: String },
    #[error("the batch is for schema {claimed:?}, the stream's schema is {actual:?}")]
    SchemaMismatch { claimed: String, actual: String },
}

impl FrameError {
    /// Whether the connection can go on after this error (the frame itself was intact).
    pub fn is_recoverable(&self) -> bool {
        matches!(
            self,
            FrameError::Malformed { .. } | FrameError::SchemaMismatch { .. }
        )
    }
}

impl Malformed for FrameError {
    fn malformed(what: &str, detail: String) -> FrameError {
        FrameError::Malformed {
            what: what.to_string(),
            detail,
        }
    }
}

/// One decoded frame, borrowing its body from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    pub kind: Kind,
    /// The header's flags as sent, reserved bits included (each kind reads its own).
    pub flags: u16,
    pub request_id: u64,
    pub body: &'a [u8],
}

/// How many bytes the frame starting at `buf` occupies, once its length prefix is there.
/// Lets a reader size its buffer before the whole frame has arrived.
pub fn frame_len(buf: &[u8], max_frame: usize) -> Result<Option<usize>, FrameError> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let mut len = [0u8; 4];
    len.copy_from_slice(prefix);
    let rest = u32::from_le_bytes(len) as usize;
    if rest < LENGTH_COVERS {
        return Err(FrameError::TooShort(rest));
    }
    let total = rest + 4;
    if total > max_frame {
        return Err(FrameError::TooLarge {
            len: total,
            max: max_frame,
        });
    }
    Ok(Some(total))
}

/// What the fixed 20 bytes before a body say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    /// As [`Frame::flags`].
    pub flags: u16,
    pub request_id: u64,
    /// The whole frame's length, header included.
    pub frame_len: usize,
    body_crc: u32,
}

/// Reads the header at the start of `buf` (at least [`HEADER_LEN`] bytes), refusing frames
/// longer than `max_frame`, unknown versions and unknown kinds. The body's checksum is checked
/// by [`decode_frame`] once the body is there: a reader can size its buffer, admit the bytes
/// and decide where the body is decoded before paying for the CRC.
pub fn decode_header(buf: &[u8], max_frame: usize) -> Result<Option<Header>, FrameError> {
    let Some(frame_len) = frame_len(buf, max_frame)? else {
        return Ok(None);
    };
    let Some(head) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    if head[4] != VERSION {
        return Err(FrameError::UnsupportedVersion(head[4]));
    }
    Ok(Some(Header {
        kind: Kind::from_code(head[5]).ok_or(FrameError::UnknownKind(head[5]))?,
        flags: u16::from_le_bytes(array(&head[6..8])),
        request_id: u64::from_le_bytes(array(&head[8..16])),
        frame_len,
        body_crc: u32::from_le_bytes(array(&head[16..20])),
    }))
}

/// Decodes the frame at the start of `buf`: `Ok(None)` while it is incomplete, otherwise
/// the frame and the bytes it took. Frames longer than `max_frame` are refused before
/// anything is buffered for them.
pub fn decode_frame(
    buf: &[u8],
    max_frame: usize,
) -> Result<Option<(Frame<'_>, usize)>, FrameError> {
    let Some(header) = decode_header(buf, max_frame)? else {
        return Ok(None);
    };
    let Some(frame) = buf.get(..header.frame_len) else {
        return Ok(None);
    };
    let body = &frame[HEADER_LEN..];
    if crc32c::crc32c(body) != header.body_crc && !cfg!(fuzzing) {
        return Err(FrameError::Checksum);
    }
    let frame = Frame {
        kind: header.kind,
        flags: header.flags,
        request_id: header.request_id,
        body,
    };
    Ok(Some((frame, header.frame_len)))
}

fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(bytes);
    out
}

/// Starts a frame in `out`: the header with placeholders for length and checksum, which
/// [`end_frame`] fills once the body is written after it. Returns the frame's offset.
pub(crate) fn begin_frame(out: &mut Vec<u8>, kind: Kind, flags: u16, request_id: u64) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(VERSION);
    out.push(kind.code());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    start
}

/// Fills in the length and checksum of the frame begun at `start`.
pub(crate) fn end_frame(out: &mut [u8], start: usize) -> Result<(), TooLong> {
    let rest = out.len() - start - 4;
    let rest = u32::try_from(rest).map_err(|_| TooLong(rest))?;
    let body_crc = crc32c::crc32c(&out[start + HEADER_LEN..]);
    out[start..start + 4].copy_from_slice(&rest.to_le_bytes());
    out[start + 16..start + 20].copy_from_slice(&body_crc.to_le_bytes());
    Ok(())
}

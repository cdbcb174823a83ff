//! The framing of PostgreSQL frontend messages, checked as their bytes arrive: where each
//! message begins and ends in a connection's bytes, whatever pieces they come in, and which
//! messages may pass before authentication and at what size. The server's PostgreSQL
//! listener runs it between the socket and pgwire (`tidemark-server`'s `pg::gate`), and the
//! fuzz target `pg_framing` checks it against pgwire's own decoder.
//!
//! Written by hand because the framing is five bytes of header and pgwire offers no hook
//! between the socket and its buffer.

/// PostgreSQL's own limit on a message before authentication (`PQ_SMALL_MESSAGE_LIMIT`).
pub const PRE_AUTH_MESSAGE_BYTES: usize = 10_000;

/// Why a message may not pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("a {what} message of {bytes} bytes is over the limit of {limit} bytes{advice}")]
    TooLarge {
        what: String,
        bytes: u64,
        limit: usize,
        advice: &'static str,
    },
    #[error("a {what} message before authentication: only the password may be sent now")]
    BeforeAuthentication { what: String },
    #[error("a message claims a length of {length} bytes, less than its own length field")]
    Malformed { length: i32 },
}

/// Where the bytes passing stand in the sequence of messages.
#[derive(Debug, Default)]
pub struct Framing {
    /// Past the first message (the startup message or a cancel request has no type byte).
    typed: bool,
    header: [u8; 5],
    header_len: usize,
    body_left: usize,
}

/// What one step over the passing bytes did.
#[derive(Debug, PartialEq, Eq)]
pub struct Step {
    /// How many of the bytes belong to the message (the rest to the ones after it).
    pub taken: usize,
    /// The step ended a message.
    pub completed: bool,
}

impl Framing {
    /// Somewhere inside a message: its header or its body has begun but not ended.
    pub fn mid_message(&self) -> bool {
        self.header_len > 0 || self.body_left > 0
    }

    /// Takes bytes of one message from the start of `bytes` (not empty), checking its header
    /// once whole: at most `limit` bytes, and only a startup, password or terminate message
    /// unless `authenticated`.
    pub fn step(
        &mut self,
        bytes: &[u8],
        authenticated: bool,
        limit: usize,
    ) -> Result<Step, FramingError> {
        assert!(!bytes.is_empty(), "a step over no bytes");
        if self.body_left > 0 {
            let taken = bytes.len().min(self.body_left);
            self.body_left -= taken;
            return Ok(Step {
                taken,
                completed: self.body_left == 0,
            });
        }
        let header = if self.typed { 5 } else { 4 };
        let taken = bytes.len().min(header - self.header_len);
        self.header[self.header_len..self.header_len + taken].copy_from_slice(&bytes[..taken]);
        self.header_len += taken;
        if self.header_len < header {
            return Ok(Step {
                taken,
                completed: false,
            });
        }
        let kind = self.typed.then_some(self.header[0]);
        let mut length = [0u8; 4];
        length.copy_from_slice(&self.header[header - 4..header]);
        let length = i32::from_be_bytes(length);
        self.header_len = 0;
        self.typed = true;
        let what = || match kind {
            None => "startup".to_string(),
            Some(b) if b.is_ascii_graphic() => format!("'{}'", b as char),
            Some(b) => format!("0x{b:02x}"),
        };
        if !authenticated && !matches!(kind, None | Some(b'p') | Some(b'X')) {
            return Err(FramingError::BeforeAuthentication { what: what() });
        }
        if length < 4 {
            return Err(FramingError::Malformed { length });
        }
        // The length counts itself, not the type byte.
        let bytes = length as u64 + u64::from(kind.is_some());
        if bytes > limit as u64 {
            return Err(FramingError::TooLarge {
                what: what(),
                bytes,
                limit,
                advice: if authenticated {
                    " (pg.max_message_bytes)"
                } else {
                    " before authentication"
                },
            });
        }
        self.body_left = length as usize - 4;
        Ok(Step {
            taken,
            completed: self.body_left == 0,
        })
    }
}

//! A connection's messages checked as their bytes arrive, before pgwire buffers them.
//!
//! pgwire reads a whole message into memory before it looks at it, and takes up to 1 GiB for
//! a query whether or not the client has authenticated. The gate sits between the socket and
//! pgwire's framing and reads each message's header as it passes: before authentication only
//! the startup, password and terminate messages of at most [`PRE_AUTH_MESSAGE_BYTES`] pass,
//! after it messages of at most `pg.max_message_bytes`. Every byte of a message is drawn on
//! the server's budget for query and control requests until the message has been served, and
//! a message that has not arrived whole `limits.read_timeout_ms` after its first byte ends its
//! connection. pgwire's decoders do not hold a message to its declared length, so the
//! connection loop also checks that each message pgwire decodes ends where the gate framed it
//! ([`MessageGate::decoded_as_framed`]). Where messages begin and end, and which may pass,
//! is [`tidemark_protocol::pg::Framing`]'s to say; the gate adds the budget and the clock.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

pub use tidemark_protocol::pg::PRE_AUTH_MESSAGE_BYTES;
use tidemark_protocol::pg::{Framing, FramingError};

use crate::admission::{Admission, Permit};

/// Why the gate ended a connection; carried inside the `io::Error` pgwire's framing returns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error(transparent)]
    Framing(#[from] FramingError),
    #[error("the server holds its limit of request bytes from every client; try again shortly")]
    Busy,
    #[error("a message did not arrive whole within {} ms (limits.read_timeout_ms)", .after.as_millis())]
    Stalled { after: Duration },
}

impl GateError {
    /// The SQLSTATE a client is told before its connection closes.
    pub fn code(&self) -> &'static str {
        match self {
            GateError::Framing(FramingError::TooLarge { .. }) => "54000",
            GateError::Framing(FramingError::BeforeAuthentication { .. }) => "28000",
            GateError::Framing(FramingError::Malformed { .. }) => "08P01",
            GateError::Busy => "53000",
            GateError::Stalled { .. } => "08006",
        }
    }

    /// The gate's error inside an error of the socket, if it is one.
    pub fn from_io(e: &io::Error) -> Option<&GateError> {
        e.get_ref()?.downcast_ref::<GateError>()
    }
}

/// The socket as pgwire reads it: bytes pass through [`Framing`] and the budget first.
pub struct MessageGate<S> {
    inner: S,
    framing: Framing,
    authenticated: bool,
    max_message_bytes: usize,
    budget: Arc<Admission>,
    /// The bytes of the message arriving.
    arriving: Option<Permit>,
    /// Messages arrived whole and not yet served, oldest first, each with where it ends in
    /// the bytes passed.
    arrived: VecDeque<(Permit, u64)>,
    /// Bytes passed since the gate was put in place.
    passed: u64,
    stall_after: Duration,
    /// Armed while a message has begun and its next bytes are awaited.
    stall: Option<Pin<Box<Sleep>>>,
    stall_armed: bool,
    /// Set once an error was returned: every later read returns it again.
    failed: Option<GateError>,
}

impl<S> MessageGate<S> {
    /// The gate over `inner`, before the first message.
    pub fn new(
        inner: S,
        max_message_bytes: usize,
        budget: Arc<Admission>,
        stall_after: Duration,
    ) -> MessageGate<S> {
        MessageGate {
            inner,
            framing: Framing::default(),
            authenticated: false,
            max_message_bytes,
            budget,
            arriving: None,
            arrived: VecDeque::new(),
            passed: 0,
            stall_after,
            stall: None,
            stall_armed: false,
            failed: None,
        }
    }

    /// Passes bytes that were read from `inner` before the gate was put in place.
    pub fn pass_buffered(&mut self, buffered: &[u8]) -> Result<(), GateError> {
        self.pass(buffered)
    }

    /// From now on the connection may send any message up to `pg.max_message_bytes`.
    pub fn authenticated(&mut self) {
        self.authenticated = true;
    }

    /// Whether pgwire, having read up to `unread` bytes before the end of what passed,
    /// decoded exactly the oldest message that arrived whole. pgwire's decoders do not hold
    /// a message to its declared length (a startup message may end early and leave a query
    /// behind it, which the gate never saw as one): a message must end where its header
    /// said, or the connection is refused.
    pub fn decoded_as_framed(&self, unread: usize) -> bool {
        let consumed = self.passed.checked_sub(unread as u64);
        self.arrived
            .front()
            .is_some_and(|(_, end)| Some(*end) == consumed)
    }

    /// The oldest message arrived whole was served: its bytes go back to the budget.
    pub fn served(&mut self) {
        let released = self.arrived.pop_front();
        debug_assert!(released.is_some(), "served a message that never arrived");
    }

    /// Bytes of messages held: arrived and not yet served, or arriving.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.arrived.iter().map(|(p, _)| p.bytes()).sum::<usize>()
            + self.arriving.as_ref().map_or(0, Permit::bytes)
    }

    fn pass(&mut self, mut bytes: &[u8]) -> Result<(), GateError> {
        let limit = if self.authenticated {
            self.max_message_bytes
        } else {
            PRE_AUTH_MESSAGE_BYTES
        };
        while !bytes.is_empty() {
            let step = self.framing.step(bytes, self.authenticated, limit)?;
            let admitted = match &mut self.arriving {
                Some(permit) => permit.grow(step.taken),
                None => {
                    self.arriving = self.budget.try_admit(step.taken);
                    self.arriving.is_some()
                }
            };
            if !admitted {
                return Err(GateError::Busy);
            }
            self.passed += step.taken as u64;
            if step.completed {
                // The next message's deadline starts with it.
                self.stall_armed = false;
                let end = self.passed;
                self.arrived
                    .extend(self.arriving.take().map(|permit| (permit, end)));
            }
            bytes = &bytes[step.taken..];
        }
        Ok(())
    }

    fn fail(&mut self, e: GateError) -> Poll<io::Result<()>> {
        self.failed = Some(e.clone());
        Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for MessageGate<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.failed.clone() {
            return this.fail(e);
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => match this.pass(&buf.filled()[before..]) {
                // The deadline runs from a message's first byte to its last, not from its
                // latest byte: a byte now and then must not hold the budget for ever.
                Ok(()) => Poll::Ready(Ok(())),
                Err(e) => this.fail(e),
            },
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if this.framing.mid_message() => {
                let deadline = Instant::now() + this.stall_after;
                let stall = this
                    .stall
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if !this.stall_armed {
                    stall.as_mut().reset(deadline);
                    this.stall_armed = true;
                }
                match stall.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        let after = this.stall_after;
                        this.fail(GateError::Stalled { after })
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for MessageGate<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn startup() -> Vec<u8> {
        let body = b"\0\x03\0\0user\0me\0\0";
        let mut m = ((body.len() + 4) as i32).to_be_bytes().to_vec();
        m.extend_from_slice(body);
        m
    }

    fn gate(budget: usize) -> MessageGate<()> {
        MessageGate::new((), 1 << 20, Admission::new(budget), Duration::from_secs(1))
    }

    /// Passes `bytes` in pieces of `piece` bytes.
    fn pass_in_pieces(
        g: &mut MessageGate<()>,
        bytes: &[u8],
        piece: usize,
    ) -> Result<(), GateError> {
        bytes.chunks(piece).try_for_each(|c| g.pass(c))
    }

    #[test]
    fn messages_are_told_apart_however_their_bytes_are_cut() {
        let mut stream = startup();
        stream.extend(message(b'p', b"secret\0"));
        let after_auth = [message(b'Q', b"SELECT 1\0"), message(b'S', b"")].concat();
        for piece in [1, 2, 3, 5, 7, 64] {
            let mut g = gate(1 << 20);
            pass_in_pieces(&mut g, &stream, piece).unwrap();
            assert_eq!(g.arrived.len(), 2, "piece {piece}");
            assert_eq!(g.held(), stream.len());
            g.served();
            g.served();
            assert_eq!(g.held(), 0);
            g.authenticated();
            pass_in_pieces(&mut g, &after_auth, piece).unwrap();
            assert_eq!(g.arrived.len(), 2, "piece {piece}");
            assert!(!g.framing.mid_message());
        }
    }

    #[test]
    fn before_authentication_only_small_startup_and_password_messages_pass() {
        let mut g = gate(1 << 30);
        g.pass(&startup()).unwrap();
        // A query's header claiming a gigabyte is refused from its five bytes.
        let e = g.pass(b"Q\x3f\xff\xff\xff").unwrap_err();
        assert!(
            matches!(
                e,
                GateError::Framing(FramingError::BeforeAuthentication { .. })
            ),
            "{e}"
        );
        let mut g = gate(1 << 30);
        g.pass(&startup()).unwrap();
        let e = g.pass(b"p\0\x01\0\0").unwrap_err();
        assert!(
            matches!(
                e,
                GateError::Framing(FramingError::TooLarge { bytes: 65537, .. })
            ),
            "{e}"
        );
        // The startup message itself.
        let e = gate(1 << 30).pass(b"\0\0\x27\x11").unwrap_err();
        assert!(
            matches!(
                e,
                GateError::Framing(FramingError::TooLarge { bytes: 10001, .. })
            ),
            "{e}"
        );
        assert!(gate(1 << 30).pass(b"\0\0\x27\x10").is_ok());
    }

    #[test]
    fn after_authentication_messages_up_to_the_limit_pass() {
        let mut g = gate(1 << 30);
        g.pass(&startup()).unwrap();
        g.authenticated();
        let limit = 1 << 20;
        let at_limit = message(b'Q', &vec![b'x'; limit - 5]);
        g.pass(&at_limit).unwrap();
        let e = g.pass(b"Q\0\x10\0\x01").unwrap_err();
        assert!(
            matches!(e, GateError::Framing(FramingError::TooLarge { bytes, .. }) if bytes == limit as u64 + 2),
            "{e}"
        );
        let e = gate(100).pass(b"\0\0\0\x03").unwrap_err();
        assert_eq!(e, GateError::Framing(FramingError::Malformed { length: 3 }));
    }

    #[test]
    fn message_bytes_are_held_on_the_budget_until_served() {
        let budget = Admission::new(100);
        let mut g = MessageGate::new((), 1 << 20, budget.clone(), Duration::from_secs(1));
        g.pass_buffered(&startup()).unwrap();
        g.authenticated();
        let held = startup().len();
        assert_eq!(budget.bytes_in_flight(), held);
        // Half a message holds what arrived of it.
        g.pass(&message(b'Q', &[b'x'; 100])[..30]).unwrap();
        assert_eq!(budget.bytes_in_flight(), held + 30);
        // More than the budget has left: refused, whatever the message's size limit.
        assert_eq!(g.pass(&[b'x'; 60]), Err(GateError::Busy));
        g.served();
        assert_eq!(budget.bytes_in_flight(), 30);
        drop(g);
        assert_eq!(budget.bytes_in_flight(), 0);
    }
}

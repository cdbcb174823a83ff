//! The PostgreSQL listener's framing (`tidemark_protocol::pg::Framing`, what the server's
//! message gate runs before pgwire buffers a byte) against pgwire's decoder (pinned, the
//! server's version). The first input byte picks how the rest is cut into reads; the rest is
//! a connection's bytes after the startup message. Whatever the bytes:
//! - the messages framed, and where framing stops with an error, do not depend on how the
//!   bytes arrive (one read, or reads of any size);
//! - a message framed whole is whole for pgwire too: decoding exactly its bytes never asks
//!   for more (one that pgwire ends early the server refuses:
//!   `MessageGate::decoded_as_framed`);
//! - no message passes over the limit the gate gives (`PRE_AUTH_MESSAGE_BYTES` before
//!   authentication), and before authentication only password and terminate messages.
#![no_main]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use pgwire::messages::{DecodeContext, PgWireFrontendMessage};
use tidemark_protocol::pg::{Framing, FramingError, PRE_AUTH_MESSAGE_BYTES};

/// The limit after authentication: small, so that inputs of libFuzzer's default length
/// (4 KiB) reach it. Before authentication the gate's own limit applies.
const LIMIT: usize = 1 << 10;

/// The size limit the gate gives the framing.
fn limit(authenticated: bool) -> usize {
    if authenticated {
        LIMIT
    } else {
        PRE_AUTH_MESSAGE_BYTES
    }
}

/// Where each framed message ends, and the error framing stopped at (if any), reading
/// `bytes` in pieces of `piece` bytes.
fn frame(bytes: &[u8], piece: usize, authenticated: bool) -> (Vec<usize>, Option<FramingError>) {
    let mut framing = Framing::default();
    // The startup message, which has no type byte, has passed.
    framing
        .step(&[0, 0, 0, 4], authenticated, limit(authenticated))
        .expect("an empty startup message passes");
    let mut ends = Vec::new();
    let mut at = 0;
    for chunk in bytes.chunks(piece) {
        let mut rest = chunk;
        while !rest.is_empty() {
            match framing.step(rest, authenticated, limit(authenticated)) {
                Ok(step) => {
                    assert!(step.taken > 0 && step.taken <= rest.len());
                    at += step.taken;
                    rest = &rest[step.taken..];
                    if step.completed {
                        ends.push(at);
                    }
                }
                Err(e) => return (ends, Some(e)),
            }
        }
    }
    (ends, None)
}

fuzz_target!(|data: &[u8]| {
    static QUIET: Once = Once::new();
    // libFuzzer's hook aborts on any panic; pgwire's (known, contained by the server's
    // runtime: see pg_messages) are caught below.
    QUIET.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    let Some((&cut, bytes)) = data.split_first() else {
        return;
    };
    let piece = usize::from(cut % 16) + 1;
    for authenticated in [false, true] {
        let whole = frame(bytes, bytes.len().max(1), authenticated);
        assert_eq!(whole, frame(bytes, piece, authenticated), "piece {piece}");
        let (ends, error) = whole;
        let mut start = 0;
        for end in ends {
            let message = &bytes[start..end];
            if !authenticated {
                assert!(matches!(message[0], b'p' | b'X'), "{message:?}");
            }
            // The type byte is not counted by the length field, but is by the limit.
            assert!(message.len() <= limit(authenticated), "{}", message.len());
            // After the startup message, as the server's connection loop decodes.
            let mut context = DecodeContext::default();
            context.awaiting_frontend_ssl = false;
            context.awaiting_frontend_startup = false;
            let mut buffer = BytesMut::from(message);
            let decoded = catch_unwind(AssertUnwindSafe(|| {
                PgWireFrontendMessage::decode(&mut buffer, &context).map(|m| m.is_some())
            }));
            if let Ok(Ok(whole)) = decoded {
                assert!(whole, "pgwire wants more than the framed {message:?}");
            }
            start = end;
        }
        if let Some(FramingError::BeforeAuthentication { .. }) = error {
            assert!(!authenticated);
        }
    }
});

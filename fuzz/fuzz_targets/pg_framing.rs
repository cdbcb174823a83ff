//! The PostgreSQL listener's framing (`tidemark_protocol::pg::Framing`, what the server's
//! message gate runs before pgwire buffers a byte) against pgwire's decoder (pinned, the
//! server's version). The first input byte picks how the rest is cut into reads; the rest is
//! a connection's bytes after the startup message. Whatever the bytes:
//! - the messages framed, and where framing stops with an error, do not depend on how the
//!   bytes arrive (one read, or reads of any size);
//! - a message framed whole is whole for pgwire too: decoding exactly its bytes never asks
//!   for more, and never takes more than them (the server also refuses a message pgwire ends
//!   early: `MessageGate::decoded_as_framed`);
//! - before authentication only password and terminate messages pass, of at most
//!   `PRE_AUTH_MESSAGE_BYTES`.
#![no_main]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use pgwire::messages::{DecodeContext, PgWireFrontendMessage};
use tidemark_protocol::pg::{Framing, FramingError, PRE_AUTH_MESSAGE_BYTES};

const LIMIT: usize = 1 << 16;

/// Where each framed message ends, and the error framing stopped at (if any), reading
/// `bytes` in pieces of `piece` bytes.
fn frame(bytes: &[u8], piece: usize, authenticated: bool) -> (Vec<usize>, Option<FramingError>) {
    let mut framing = Framing::default();
    // The startup message, which has no type byte, has passed.
    framing
        .step(&[0, 0, 0, 4], authenticated, LIMIT)
        .expect("an empty startup message passes");
    let mut ends = Vec::new();
    let mut at = 0;
    for chunk in bytes.chunks(piece) {
        let mut rest = chunk;
        while !rest.is_empty() {
            match framing.step(rest, authenticated, LIMIT) {
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
                assert!(message.len() <= PRE_AUTH_MESSAGE_BYTES + 1);
            }
            assert!(message.len() <= LIMIT);
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

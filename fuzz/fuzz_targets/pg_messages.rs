//! PostgreSQL frontend messages as the pg listener receives them: pgwire's decoder (pinned,
//! the same version as the server's) reads every message of a connection's bytes, in each
//! of the states a connection goes through (before TLS negotiation, before startup, after
//! it). Whatever the bytes: a message, "need more" or an error, in bounded time and memory.
//!
//! Panics are caught, as the server's runtime catches them (a panic ends only that
//! connection's task; `crates/tidemark-server/tests/pg.rs` checks that the server goes on):
//! pgwire 0.41.1 (and 0.42.1) panics on messages shorter than their fields, e.g. a length
//! field below 4 (`E\0\0\0\0`) or an Execute with no body (`E\0\0\0\x04`), both found here.
//! What this target still finds: aborts, hangs and runaway allocations (a length or count
//! taken at its word), which no runtime contains.
#![no_main]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use pgwire::messages::{DecodeContext, PgWireFrontendMessage};

fuzz_target!(|data: &[u8]| {
    static QUIET: Once = Once::new();
    // libFuzzer's hook aborts on any panic; the server's runtime unwinds instead.
    QUIET.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    for state in 0..3 {
        let mut context = DecodeContext::default();
        context.awaiting_frontend_ssl = state == 0;
        context.awaiting_frontend_startup = state <= 1;
        let mut buffer = BytesMut::from(data);
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // Each decoded message consumes bytes; a bound on the loop all the same.
            for _ in 0..data.len() + 1 {
                let before = buffer.len();
                match PgWireFrontendMessage::decode(&mut buffer, &context) {
                    Ok(Some(_)) => assert!(buffer.len() <= before),
                    Ok(None) | Err(_) => break,
                }
                if buffer.len() == before {
                    break;
                }
            }
        }));
    }
});

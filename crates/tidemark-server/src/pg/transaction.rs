//! What a session's transaction block (`BEGIN` ... `COMMIT`/`ROLLBACK`) means here: each
//! `INSERT` and `COPY` is stored when it is answered, inside a block or not, so a `ROLLBACK`
//! cannot undo them. Rather than let a client believe it did, a `ROLLBACK` after writes is
//! answered with a `WARNING` naming how many events stayed stored, as PostgreSQL warns of a
//! `ROLLBACK` with no transaction in progress.
//!
//! Why not hold the writes until `COMMIT`: a query in the same block would not see them
//! (the common psycopg session, whose every statement is in a block, reads what it just
//! wrote), and held writes would take the append budget for as long as a client kept its
//! block open.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pgwire::api::ClientInfo;
use pgwire::error::ErrorInfo;
use pgwire::messages::response::NoticeResponse;

/// A session's open block, and the events stored since it began.
#[derive(Debug, Default)]
struct Block {
    open: AtomicBool,
    stored: AtomicU64,
}

fn block<C: ClientInfo>(client: &C) -> std::sync::Arc<Block> {
    client
        .session_extensions()
        .get_or_insert_with(Block::default)
}

/// `BEGIN`: a block opens with nothing stored in it.
pub fn begin<C: ClientInfo>(client: &C) {
    let block = block(client);
    block.stored.store(0, Ordering::Relaxed);
    block.open.store(true, Ordering::Relaxed);
}

/// `events` were stored by a statement of the session.
pub fn stored<C: ClientInfo>(client: &C, events: u64) {
    let block = block(client);
    if block.open.load(Ordering::Relaxed) {
        block.stored.fetch_add(events, Ordering::Relaxed);
    }
}

/// `COMMIT` or `ROLLBACK`: the block ends. For a `ROLLBACK` after writes, the warning to
/// send before its answer.
pub fn end<C: ClientInfo>(client: &C, rollback: bool) -> Option<NoticeResponse> {
    let block = block(client);
    block.open.store(false, Ordering::Relaxed);
    let stored = block.stored.swap(0, Ordering::Relaxed);
    (rollback && stored > 0).then(|| {
        let message = format!(
            "ROLLBACK cannot undo the {stored} events this transaction stored: Tidemark \
             stores each INSERT and COPY when it answers it (docs/sql.md, \"Transactions\")"
        );
        ErrorInfo::new("WARNING".to_owned(), "01000".to_owned(), message).into()
    })
}

//! `COPY stream FROM STDIN` (what `psql`'s `\copy` sends): the statement names the stream,
//! its columns and format ([`tidemark_sql::write::CopyIn`]); the rows follow as copy data,
//! held until the client says it is done, then decoded and appended as one batch (all of it
//! or none, durable before `COPY n` answers), as an `INSERT` is.
//!
//! What one client may hold: its copy data counts on the append budget
//! (`limits.max_in_flight_bytes`, over all doors) as it arrives, twice (it is decoded
//! before it is let go), and one COPY takes at most `limits.max_body_bytes`, the largest
//! append of any other door. Past either, the data is dropped as it comes and the COPY is
//! refused when it ends; a COPY whose data stops coming for `limits.read_timeout_ms` is let
//! go of the same way (the client may be gone quiet, but the budget is everyone's); any other
//! statement, and the end of the connection, let go of an unfinished COPY.
//!
//! Refused at its end rather than at once: the client is still sending, and an error in the
//! middle of copy data leaves pgwire's session in copy mode with its data still coming.

use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::{stream, Sink, SinkExt};
use pgwire::api::copy::CopyHandler;
use pgwire::api::results::{CopyResponse, Response, Tag};
use pgwire::api::ClientInfo;
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use pgwire::messages::PgWireBackendMessage;
use tidemark_sql::write::CopyIn;
use tidemark_sql::SqlError;

use super::errors::{from_sql, from_store, from_write, user_error};
use crate::admission::Permit;
use crate::sql_write::{append_rows, overloaded};
use crate::state::{AppState, Namespace};

/// The append budget a byte of copy data takes: the byte, and its value once decoded (the
/// columns of text, then of the stream's types, are about the data's size each, one after
/// the other).
const DECODED_TIMES: usize = 2;

/// The COPY a session is receiving, if any (in its session extensions).
#[derive(Default)]
pub struct PendingCopy(Mutex<Option<Copying>>);

impl PendingCopy {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Copying>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct Copying {
    copy: CopyIn,
    data: Vec<u8>,
    /// The data's bytes on the append budget.
    permit: Permit,
    /// When data last came (or the COPY began).
    last_data: Instant,
    /// Why the COPY will be refused when it ends; its data is no longer kept.
    refused: Option<PgWireError>,
}

impl Copying {
    /// Lets go of the data and its budget: the COPY will be refused with `refusal`.
    fn refuse(&mut self, refusal: PgWireError) {
        self.refused = Some(refusal);
        self.data = Vec::new();
        let held = self.permit.bytes();
        self.permit.shrink(held);
    }
}

/// Starts `COPY ... FROM STDIN` `sql` in `client`'s session: the answer that asks for its
/// data.
pub fn begin<C: ClientInfo>(state: &AppState, client: &C, sql: &str) -> PgWireResult<Response> {
    let copy = CopyIn::new(&state.db(Namespace::Replicated), sql).map_err(from_sql)?;
    let permit = state
        .admission()
        .try_admit(0)
        .ok_or_else(|| from_store(overloaded("COPY")))?;
    let columns = copy.columns();
    let pending = match client.session_extensions().get::<PendingCopy>() {
        Some(pending) => pending,
        None => {
            // The session's first COPY: one watcher for all of its COPYs, as long as it
            // lives (so that starting COPYs cannot start tasks without bound).
            let extensions = client.session_extensions();
            extensions.insert(PendingCopy::default());
            let pending = extensions
                .get::<PendingCopy>()
                .ok_or_else(|| user_error("XX000", "the session lost its COPY"))?;
            watch_for_silence(&pending, state.config().limits.read_timeout());
            pending
        }
    };
    *pending.lock() = Some(Copying {
        copy,
        data: Vec::new(),
        permit,
        last_data: Instant::now(),
        refused: None,
    });
    // Text: each row's values as the COPY's format writes them (format 0 for each column).
    Ok(Response::CopyIn(CopyResponse::new(
        0,
        columns,
        stream::empty(),
    )))
}

/// Lets go of the COPY under way in `client`'s session, if any (another statement came).
pub fn abandon<C: ClientInfo>(client: &C) {
    drop(take(client));
}

/// Refuses the session's COPY whenever its data stops coming for `silence`: a task that
/// ends with the session, whose extensions hold `pending`.
fn watch_for_silence(pending: &Arc<PendingCopy>, silence: Duration) {
    let pending = Arc::downgrade(pending);
    tokio::spawn(async move {
        let mut wait = silence;
        loop {
            tokio::time::sleep(wait).await;
            let Some(pending) = pending.upgrade() else {
                return;
            };
            let mut pending = pending.lock();
            wait = silence;
            let Some(copying) = pending.as_mut().filter(|c| c.refused.is_none()) else {
                continue;
            };
            let quiet = copying.last_data.elapsed();
            if quiet < silence {
                wait = silence - quiet;
                continue;
            }
            copying.refuse(user_error(
                "57014",
                format!(
                    "the COPY's data stopped coming for {silence:?} \
                     (limits.read_timeout_ms): nothing was stored"
                ),
            ));
        }
    });
}

/// Receives the copy data of every session.
pub struct CopyRows {
    state: AppState,
}

impl CopyRows {
    pub fn new(state: AppState) -> CopyRows {
        CopyRows { state }
    }
}

/// The session's COPY, taken out of it (the COPY ends).
fn take<C: ClientInfo>(client: &C) -> Option<Copying> {
    let pending = client.session_extensions().get::<PendingCopy>()?;
    let taken = pending.lock().take();
    taken
}

#[async_trait]
impl CopyHandler for CopyRows {
    async fn on_copy_data<C>(&self, client: &mut C, copy_data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let Some(pending) = client.session_extensions().get::<PendingCopy>() else {
            return Ok(());
        };
        let mut pending = pending.lock();
        let Some(copying) = pending.as_mut().filter(|c| c.refused.is_none()) else {
            return Ok(());
        };
        let more = copy_data.data.len();
        let charge = DECODED_TIMES * more;
        let limit = self.state.config().limits.max_body_bytes;
        let refusal = if copying.data.len() + more > limit {
            Some(user_error(
                "54000",
                format!(
                    "the COPY's data is over {limit} bytes (limits.max_body_bytes): split \
                     the file and copy each part"
                ),
            ))
        } else if !copying.permit.could_grow(charge) {
            Some(user_error(
                "54000",
                format!(
                    "the COPY's data, held twice while it is decoded, is over what the \
                     server holds for appends at once (limits.max_in_flight_bytes): split \
                     the file and copy each part ({} bytes so far)",
                    copying.data.len() + more
                ),
            ))
        } else if !copying.permit.grow(charge) {
            Some(from_store(overloaded("COPY")))
        } else {
            None
        };
        match refusal {
            Some(refusal) => copying.refuse(refusal),
            None => {
                copying.data.extend_from_slice(&copy_data.data);
                copying.last_data = Instant::now();
            }
        }
        Ok(())
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let Some(copying) = take(client) else {
            return Err(user_error(
                "08P01",
                "COPY data ended with no COPY under way",
            ));
        };
        let Copying {
            copy,
            data,
            permit,
            refused,
            ..
        } = copying;
        if let Some(refusal) = refused {
            return Err(refusal);
        }
        // Decoding is CPU work proportional to the data: off the connection's thread.
        let rows = tokio::task::spawn_blocking(move || copy.rows(&data))
            .await
            .map_err(|e| from_sql(SqlError::Internal(format!("decoding the COPY: {e}"))))?
            .map_err(from_sql)?;
        let ack = append_rows(&self.state, rows, permit)
            .await
            .map_err(from_write)?;
        let events = ack.map_or(0, |ack| ack.events as usize);
        super::transaction::stored(client, events as u64);
        client
            .send(PgWireBackendMessage::CommandComplete(
                Tag::new("COPY").with_rows(events).into(),
            ))
            .await?;
        Ok(())
    }

    async fn on_copy_fail<C>(&self, client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        abandon(client);
        // As PostgreSQL answers a client that gave up: query_canceled, nothing stored.
        user_error(
            "57014",
            format!(
                "COPY from stdin failed: {} (nothing was stored)",
                fail.message
            ),
        )
    }
}

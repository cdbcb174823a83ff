//! `COPY stream FROM STDIN` (what `psql`'s `\copy` sends): the statement names the stream,
//! its columns and format ([`tidemark_sql::write::CopyIn`]); the rows follow as copy data,
//! held until the client says it is done, then decoded and appended as one batch (all of it
//! or none, durable before `COPY n` answers), as an `INSERT` is.
//!
//! What one client may hold: its copy data counts on the append budget
//! (`limits.max_in_flight_bytes`, over all doors) as it arrives, twice (it is decoded
//! before it is let go), and one COPY takes at most
//! `limits.max_body_bytes`, the largest append of any other door. Past either, the data is
//! dropped as it comes and the COPY is refused when it ends (an error in the middle of copy
//! data would leave the client still sending it); a connection that closes mid-COPY lets go
//! of all of it.

use std::fmt::Debug;
use std::sync::{Mutex, PoisonError};

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

use super::errors::{from_sql, from_write, user_error};
use crate::admission::Permit;
use crate::sql_write::append_rows;
use crate::state::{AppState, Namespace};

/// The append budget a byte of copy data takes: the byte, and its value once decoded (the
/// columns of text, then of the stream's types, are about the data's size each, one after
/// the other).
const DECODED_TIMES: usize = 2;

/// The COPY a session is receiving, if any (in its session extensions).
#[derive(Default)]
pub struct PendingCopy(Mutex<Option<Copying>>);

struct Copying {
    copy: CopyIn,
    data: Vec<u8>,
    /// The data's bytes on the append budget.
    permit: Permit,
    /// Why the COPY will be refused when it ends; its data is no longer kept.
    refused: Option<PgWireError>,
}

/// Starts `COPY ... FROM STDIN` `sql` in `client`'s session: the answer that asks for its
/// data.
pub fn begin<C: ClientInfo>(state: &AppState, client: &C, sql: &str) -> PgWireResult<Response> {
    let copy = CopyIn::new(&state.db(Namespace::Replicated), sql).map_err(from_sql)?;
    let permit = state.admission().try_admit(0).ok_or_else(|| {
        user_error(
            "53000",
            "the server is taking as many appends as it can: retry the COPY shortly",
        )
    })?;
    let columns = copy.columns();
    let pending = client
        .session_extensions()
        .get_or_insert_with(PendingCopy::default);
    *pending.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Copying {
        copy,
        data: Vec::new(),
        permit,
        refused: None,
    });
    // Text: each row's values as the COPY's format writes them (format 0 for each column).
    Ok(Response::CopyIn(CopyResponse::new(
        0,
        columns,
        stream::empty(),
    )))
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
    let taken = pending
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
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
        let mut pending = pending.0.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(copying) = pending.as_mut() else {
            return Ok(());
        };
        if copying.refused.is_some() {
            return Ok(());
        }
        let more = copy_data.data.len();
        let limit = self.state.config().limits.max_body_bytes;
        let refusal = if copying.data.len() + more > limit {
            Some(user_error(
                "54000",
                format!(
                    "the COPY's data is over {limit} bytes (limits.max_body_bytes): split \
                     the file and copy each part"
                ),
            ))
        } else if !copying.permit.grow(DECODED_TIMES * more) {
            Some(user_error(
                "53000",
                "the server is taking as many appends as it can \
                 (limits.max_in_flight_bytes): retry the COPY shortly",
            ))
        } else {
            None
        };
        match refusal {
            Some(refusal) => {
                copying.refused = Some(refusal);
                copying.data = Vec::new();
                let held = copying.permit.bytes();
                copying.permit.shrink(held);
            }
            None => copying.data.extend_from_slice(&copy_data.data),
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
        } = copying;
        if let Some(refusal) = refused {
            return Err(refusal);
        }
        // Decoding is CPU work proportional to the data: off the connection's thread.
        let rows = tokio::task::spawn_blocking(move || copy.rows(&data))
            .await
            .map_err(|e| from_sql(SqlError::Internal(format!("decoding the COPY: {e}"))))?
            .map_err(from_sql)?;
        let ack = append_rows(&self.state, rows).await.map_err(from_write)?;
        drop(permit);
        let events = ack.map_or(0, |ack| ack.events as usize);
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
        drop(take(client));
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

//! One connection from accept to close: TLS negotiation and authentication within
//! `pg.startup_timeout_ms` in a starting slot, then a session slot, messages through the
//! [`MessageGate`], named statements bounded by [`Named`], and the session closed after
//! `pg.idle_timeout_ms` without a message.
//!
//! pgwire's own loop (`process_socket`) has none of these bounds; this is that loop with
//! them, driving pgwire's message processing (`process_message`, `process_error`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use pgwire::api::auth::StartupHandler;
use pgwire::api::copy::CopyHandler;
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::{ClientInfo, PgWireConnectionState, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::{negotiate_tls, process_error, process_message};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::{Framed, FramedParts};

use super::copy::CopyRows;
use super::errors::fatal;
use super::gate::{GateError, MessageGate};
use super::named::Named;
use super::slots::{SessionSlot, Slots};
use super::startup::Startup;
use super::statements::{Backend, Prepared};
use crate::admission::Admission;
use crate::config::Pg;

/// What every connection is served by.
pub struct Handlers {
    pub backend: Arc<Backend>,
    pub startup: Arc<Startup>,
    pub copy: Arc<CopyRows>,
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.backend.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.backend.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        self.startup.clone()
    }

    fn copy_handler(&self) -> Arc<impl CopyHandler> {
        self.copy.clone()
    }
}

/// What every connection of a listener shares.
pub struct Listener {
    pub handlers: Arc<Handlers>,
    pub slots: Arc<Slots>,
    pub limits: Pg,
    /// The server's budget for query and control request bytes.
    pub message_budget: Arc<Admission>,
    /// `pg.max_prepared_bytes_total`.
    pub prepared_budget: Arc<Admission>,
    /// A message not whole this long after it began ends its connection.
    pub stall_after: Duration,
    /// The longest a statement may take, its answer sent included.
    pub statement_timeout: Duration,
}

type Socket = Framed<MessageGate<pgwire::tokio::server::MaybeTls>, Codec>;
type Codec = pgwire::tokio::server::PgWireMessageServerCodec<Prepared>;

/// Serves one connection until it closes, a bound closes it or the client sends nonsense.
pub async fn serve(listener: Arc<Listener>, socket: TcpStream, tls: Option<TlsAcceptor>) {
    let starting = listener.slots.start();
    let deadline = Instant::now() + listener.limits.startup_timeout();
    let negotiated = tokio::select! {
        () = tokio::time::sleep_until(deadline) => return,
        () = starting.evicted() => return,
        negotiated = negotiate_tls::<Prepared>(socket, tls) => negotiated,
    };
    let framed = match negotiated {
        Ok(Some(framed)) => framed,
        // A direct TLS handshake to a server without TLS.
        Ok(None) => return,
        Err(e) => {
            tracing::debug!(error = %e, "postgresql connection failed before its startup");
            return;
        }
    };
    let parts = framed.into_parts();
    // Bytes read in the clear before a TLS handshake must not pass for bytes read over TLS
    // (PostgreSQL's CVE-2021-23214): a client that sent them has its connection closed.
    if parts.codec.client_info.is_secure && !parts.read_buf.is_empty() {
        return;
    }
    let mut gate = MessageGate::new(
        parts.io,
        listener.limits.max_message_bytes,
        listener.message_budget.clone(),
        listener.stall_after,
    );
    // What was read with the TLS negotiation passes the gate before pgwire decodes it.
    let admitted = gate.pass_buffered(&parts.read_buf);
    let mut gated = FramedParts::new::<PgWireBackendMessage>(gate, parts.codec);
    if admitted.is_ok() {
        gated.read_buf = parts.read_buf;
    }
    gated.write_buf = parts.write_buf;
    let mut socket = Framed::from_parts(gated);
    if let Err(e) = admitted {
        return refuse(&mut socket, fatal(e.code(), e.to_string())).await;
    }
    let Some(named) = Named::new(&listener.limits, &listener.prepared_budget) else {
        return;
    };
    // In the session, where DEALLOCATE reaches it too.
    socket.session_extensions().insert(Mutex::new(named));
    let Some(named) = socket.session_extensions().get::<Mutex<Named>>() else {
        return;
    };
    let mut starting = Some(starting);
    loop {
        let next = match &starting {
            Some(slot) => tokio::select! {
                () = tokio::time::sleep_until(deadline) => Err(fatal(
                    "08006",
                    "the connection did not authenticate within pg.startup_timeout_ms",
                )),
                () = slot.evicted() => Err(fatal(
                    "53300",
                    "too many connections are starting: this one, the oldest, is closed",
                )),
                next = socket.next() => Ok(next),
            },
            None => tokio::time::timeout(listener.limits.idle_timeout(), socket.next())
                .await
                .map_err(|_| {
                    fatal(
                        "57P05",
                        "terminating connection due to idle-session timeout \
                         (pg.idle_timeout_ms)",
                    )
                }),
        };
        let message = match next {
            Ok(Some(Ok(message))) => message,
            Ok(None) => return,
            Ok(Some(Err(PgWireError::IoError(e)))) => {
                if let Some(gate) = GateError::from_io(&e) {
                    refuse(&mut socket, fatal(gate.code(), gate.to_string())).await;
                }
                return;
            }
            Ok(Some(Err(e))) => {
                tracing::debug!(error = %e, "postgresql connection sent what cannot be read");
                return;
            }
            Err(timed_out) => return refuse(&mut socket, timed_out).await,
        };
        let unread = socket.read_buffer().len();
        if !socket.get_ref().decoded_as_framed(unread) {
            let e = fatal(
                "08P01",
                "a message's contents do not end where its length says: the connection is closed",
            );
            return refuse(&mut socket, e).await;
        }
        if matches!(message, PgWireFrontendMessage::Terminate(_)) {
            return;
        }
        let authenticated = starting.is_none();
        match serve_message(&listener, &mut socket, &named, message, authenticated).await {
            Ok(()) => {}
            Err(Closed) => return,
        }
        if starting.is_some() && socket.session_extensions().get::<SessionSlot>().is_some() {
            socket.get_mut().authenticated();
            starting = None;
        }
    }
}

/// The connection is to close.
struct Closed;

/// Serves one message as pgwire does, with the session's named statements bounded.
async fn serve_message(
    listener: &Listener,
    socket: &mut Socket,
    named: &Mutex<Named>,
    mut message: PgWireFrontendMessage,
    authenticated: bool,
) -> Result<(), Closed> {
    // pgwire keeps a Bind's parameters as views of the read buffer: a portal holding a byte
    // of one would keep the whole buffer (up to the largest message) alive.
    if let PgWireFrontendMessage::Bind(bind) = &mut message {
        for parameter in bind.parameters.iter_mut().flatten() {
            *parameter = Bytes::copy_from_slice(parameter);
        }
    }
    let handlers = &listener.handlers;
    let extended = match socket.state() {
        PgWireConnectionState::CopyInProgress(extended) => extended,
        _ => message.is_extended_query(),
    };
    // After an error the extended protocol discards messages up to Sync: nothing is held.
    let discarding = matches!(socket.state(), PgWireConnectionState::AwaitingSync);
    let named = || named.lock().unwrap_or_else(PoisonError::into_inner);
    let checked = if discarding {
        Ok(super::named::Change::None)
    } else {
        named().check(&message)
    };
    let served = match checked {
        Err(e) => Err(e),
        Ok(change) => {
            let processing = process_message(
                message,
                socket,
                handlers.startup.clone(),
                handlers.backend.clone(),
                handlers.backend.clone(),
                handlers.copy_handler(),
                handlers.cancel_handler(),
            );
            // A client that stops reading an answer holds its statement at most this long.
            let Ok(served) = tokio::time::timeout(listener.statement_timeout, processing).await
            else {
                tracing::info!("a postgresql client stopped reading its answer; closing it");
                return Err(Closed);
            };
            match &served {
                Ok(()) => named().apply(change),
                Err(_) => named().undo(change),
            }
            served
        }
    };
    socket.get_mut().served();
    if let Err(e) = served {
        let answered = process_error(socket, e, extended);
        if !matches!(
            tokio::time::timeout(listener.stall_after, answered).await,
            Ok(Ok(()))
        ) {
            return Err(Closed);
        }
        // Before authentication an error ends the connection (a wrong password, TLS
        // required, no session slot): nothing more is read from it.
        if !authenticated {
            return Err(Closed);
        }
    }
    Ok(())
}

/// Tells the client why its connection closes, if it still listens.
async fn refuse(socket: &mut Socket, e: PgWireError) {
    let info: ErrorInfo = e.into();
    let told = async {
        let _ = socket
            .send(PgWireBackendMessage::ErrorResponse(info.into()))
            .await;
        let _ = socket.close().await;
    };
    let _ = tokio::time::timeout(REFUSAL_TIMEOUT, told).await;
}

/// How long a connection being closed may take to read why.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(5);

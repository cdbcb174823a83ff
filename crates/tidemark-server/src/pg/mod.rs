//! The PostgreSQL wire protocol listener: psql, psycopg, pandas and other PostgreSQL
//! clients send SQL, answered as over HTTP (the same statements, bounds and timeouts).
//!
//! The protocol itself (framing, startup, the simple and extended query flows, TLS
//! negotiation) is the `pgwire` crate's; Arrow batches become rows through `arrow-pg`.
//! This module owns what is Tidemark's: who may connect ([`startup`]), how much of the server
//! one connection may hold ([`connection`]: slots, message sizes, named statements, idle
//! time), what a statement means ([`statements`]), how parameters bind ([`params`]), how zoned times are written in text
//! ([`times`]), what a transaction block means ([`transaction`]) and which SQLSTATE an error
//! gets ([`errors`]).
//!
//! Must never know about: HTTP, storage formats, Raft.

mod connection;
mod copy;
mod errors;
mod gate;
mod named;
mod params;
mod slots;
mod startup;
mod statements;
mod times;
mod transaction;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::admission::Admission;
use crate::shutdown::{close_unanswered, serve_connections, stopped, Serving};
use crate::state::AppState;
use connection::{Handlers, Listener};
use copy::CopyRows;
use slots::Slots;
use startup::Startup;
use statements::Backend;

/// Accepts connections until `shutdown` turns true, then lets the queries in flight finish
/// (at most `limits.shutdown_grace_ms`). With `tls`, connections must negotiate TLS (the
/// server's certificate), as on the other listeners; one that does not is refused.
pub async fn serve(
    state: AppState,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    shutdown: watch::Receiver<bool>,
) {
    let Some(limits) = state.config().pg.clone() else {
        return;
    };
    let slots = Slots::new(limits.max_starting, limits.max_connections);
    let startup = Arc::new(Startup::new(
        state.config().auth.clone(),
        tls.is_some(),
        slots.clone(),
    ));
    let handlers = Arc::new(Handlers {
        backend: Arc::new(Backend::new(state.clone(), startup.clone())),
        startup,
        copy: Arc::new(CopyRows::new(state.clone())),
    });
    let config_limits = &state.config().limits;
    let connections = Arc::new(Listener {
        handlers,
        slots,
        message_budget: state.control_admission().clone(),
        prepared_budget: Admission::new(limits.max_prepared_bytes_total),
        stall_after: config_limits.read_timeout(),
        statement_timeout: config_limits.query_timeout() + config_limits.read_timeout(),
        limits: limits.clone(),
    });
    let serving = Serving {
        what: "postgresql",
        // Room for every session and starter: each is bounded by its own slots.
        max_connections: limits.max_connections + limits.max_starting,
        grace: config_limits.shutdown_grace(),
        draining: "postgresql connections",
    };
    let serve = |socket, _peer| {
        let (connections, tls, mut stop) = (connections.clone(), tls.clone(), shutdown.clone());
        async move {
            tokio::select! {
                // A connection idle in its session ends with the server; one running a
                // query has the grace period to finish it.
                _ = stopped(&mut stop) => {}
                () = connection::serve(connections, socket, tls) => {}
            }
        }
    };
    // Every session and starter has a slot within the bound: past it, pgwire's startup
    // would be the one to answer, and is not reached.
    serve_connections(listener, serving, shutdown.clone(), serve, close_unanswered).await;
}

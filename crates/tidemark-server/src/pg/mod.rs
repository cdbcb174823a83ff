//! The PostgreSQL wire protocol listener: psql, psycopg, pandas and other PostgreSQL
//! clients send SQL, answered as over HTTP (the same statements, bounds and timeouts).
//!
//! The protocol itself (framing, startup, the simple and extended query flows, TLS
//! negotiation) is the `pgwire` crate's; Arrow batches become rows through `arrow-pg`.
//! This module owns what is Tidemark's: who may connect ([`startup`]), what a statement
//! means ([`statements`]), how parameters bind ([`params`]) and which SQLSTATE an error
//! gets ([`errors`]).
//!
//! Must never know about: HTTP, storage formats, Raft.

mod errors;
mod params;
mod startup;
mod statements;

use std::sync::Arc;

use pgwire::api::auth::StartupHandler;
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::PgWireServerHandlers;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::shutdown::{serve_connections, stopped, Serving};
use crate::state::AppState;
use startup::Startup;
use statements::Backend;

/// Connections served at once; more are closed as they come.
const MAX_CONNECTIONS: usize = 256;

/// What every connection is served by.
struct Handlers {
    backend: Arc<Backend>,
    startup: Arc<Startup>,
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
}

/// Accepts connections until `shutdown` turns true, then lets the queries in flight finish
/// (at most `limits.shutdown_grace_ms`). With `tls`, connections must negotiate TLS (the
/// server's certificate), as on the other listeners; one that does not is refused.
pub async fn serve(
    state: AppState,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    shutdown: watch::Receiver<bool>,
) {
    let startup = Arc::new(Startup::new(state.config().auth.clone(), tls.is_some()));
    let handlers = Arc::new(Handlers {
        backend: Arc::new(Backend::new(state.clone(), startup.clone())),
        startup,
    });
    let serving = Serving {
        what: "postgresql",
        max_connections: MAX_CONNECTIONS,
        grace: state.config().limits.shutdown_grace(),
        draining: "postgresql connections",
    };
    serve_connections(listener, serving, shutdown.clone(), |socket, peer| {
        let (handlers, tls, mut stop) = (handlers.clone(), tls.clone(), shutdown.clone());
        async move {
            tokio::select! {
                // A connection idle in its session ends with the server; one running a
                // query has the grace period to finish it.
                _ = stopped(&mut stop) => {}
                served = pgwire::tokio::process_socket(socket, tls, handlers) => {
                    if let Err(e) = served {
                        tracing::debug!(%peer, error = %e, "postgresql connection failed");
                    }
                }
            }
        }
    })
    .await;
}

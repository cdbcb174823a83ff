//! Starting and stopping the server: open the stores, bind the listeners (HTTP, binary,
//! and Graphite when configured), serve until told to stop, then finish what is in flight.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::serve::ListenerExt;
use tidemark_cluster::{Cluster, ClusterConfig, ClusterError};
use tidemark_engine::{EngineError, OpenError, Options, Spool};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::binary::BinaryListener;
use crate::config::{Config, ConfigError};
use crate::http::connections;
use crate::http::front::HttpFront;
use crate::state::AppState;
use crate::store::Store;
use crate::tls::{self, TlsListener};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("opening the stores: {0}")]
    Open(#[from] OpenError),
    #[error("listening on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Cluster(#[from] tidemark_cluster::ClusterError),
    #[error("serving HTTP: {0}")]
    Http(std::io::Error),
}

/// A server with its stores open and its listeners bound, not yet serving.
pub struct Server {
    state: AppState,
    http: TcpListener,
    binary: TcpListener,
    graphite: Option<TcpListener>,
    pg: Option<TcpListener>,
    tls: Option<TlsAcceptor>,
    front: Option<HttpFront>,
}

impl Server {
    /// Opens the stores (starting this node's cluster member if `config.cluster` is set)
    /// and binds the listeners.
    pub async fn bind(config: Config, options: Options) -> Result<Server, ServeError> {
        Server::bind_with(config, options, None).await
    }

    /// [`Server::bind`] with `spool` (an agent's, open already) as the replicated store, in
    /// place of an embedded database or a cluster.
    pub async fn bind_spool(
        config: Config,
        options: Options,
        spool: Arc<Spool>,
    ) -> Result<Server, ServeError> {
        if config.cluster.is_some() {
            return Err(ClusterError::Config("a spool is embedded, never a cluster".into()).into());
        }
        Server::bind_with(config, options, Some(Store::Spool(spool))).await
    }

    async fn bind_with(
        mut config: Config,
        options: Options,
        opened: Option<Store>,
    ) -> Result<Server, ServeError> {
        config.validate()?;
        let tls = match &config.tls {
            Some(t) => Some(tls::acceptor(&t.cert, &t.key)?),
            None => None,
        };
        let cluster = start_cluster(&mut config, &options).await?;
        let (http_addr, binary_addr) = (config.http, config.binary);
        warn_of_open_listeners(&config);
        let graphite_addr = config.graphite.as_ref().map(|g| g.listen);
        let pg_addr = config.pg.as_ref().map(|p| p.listen);
        let replicated = opened.or(cluster.map(Store::Replicated));
        let state =
            tokio::task::spawn_blocking(move || AppState::open(config, options, replicated))
                .await
                .map_err(|e| {
                    OpenError::from(EngineError::InvalidRequest(format!(
                        "opening the stores: {e}"
                    )))
                })??;
        let bind = |what, addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Bind { what, addr, source })
        };
        let graphite = match graphite_addr {
            Some(addr) => Some(bind("Graphite plaintext", addr).await?),
            None => None,
        };
        let pg = match pg_addr {
            Some(addr) => Some(bind("PostgreSQL wire", addr).await?),
            None => None,
        };
        Ok(Server {
            state,
            http: bind("HTTP", http_addr).await?,
            binary: bind("binary protocol", binary_addr).await?,
            graphite,
            pg,
            tls,
            front: None,
        })
    }

    /// The bound HTTP address (useful with port 0).
    pub fn http_addr(&self) -> SocketAddr {
        self.http
            .local_addr()
            .unwrap_or_else(|_| self.state.config().http)
    }

    pub fn binary_addr(&self) -> SocketAddr {
        self.binary
            .local_addr()
            .unwrap_or_else(|_| self.state.config().binary)
    }

    /// The bound Graphite plaintext address, when the listener is on.
    pub fn graphite_addr(&self) -> Option<SocketAddr> {
        self.graphite.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The bound PostgreSQL wire address, when the listener is on.
    pub fn pg_addr(&self) -> Option<SocketAddr> {
        self.pg.as_ref().and_then(|l| l.local_addr().ok())
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Puts `front` before the HTTP API (the agent's routes, and only the write routes).
    pub fn with_front(mut self, front: HttpFront) -> Server {
        self.front = Some(front);
        self
    }

    /// Serves until `stop` completes; then stops accepting, lets in-flight requests finish
    /// within `limits.shutdown_grace_ms` (every acknowledged append is already durable; a
    /// connection still busy after it is dropped), and closes the stores.
    pub async fn run(
        self,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let binary_listener = match &self.tls {
            Some(acceptor) => BinaryListener::Tls(
                TlsListener::new(self.binary, acceptor.clone()).map_err(ServeError::Http)?,
            ),
            None => BinaryListener::Plain(self.binary),
        };
        let binary = tokio::spawn(crate::binary::serve(
            self.state.clone(),
            binary_listener,
            stop_rx.clone(),
        ));
        let graphite = self.graphite.map(|listener| {
            tokio::spawn(crate::graphite::serve(
                self.state.clone(),
                listener,
                stop_rx.clone(),
            ))
        });
        let pg = self.pg.map(|listener| {
            tokio::spawn(crate::pg::serve(
                self.state.clone(),
                listener,
                self.tls.clone(),
                stop_rx.clone(),
            ))
        });
        let limits = &self.state.config().limits;
        let (read_timeout, grace) = (limits.read_timeout(), limits.shutdown_grace());
        let router = crate::http::front::router(self.state.clone(), self.front);
        // Two branches because the listeners' connection types differ.
        let http = match self.tls {
            Some(acceptor) => {
                let listener = TlsListener::new(self.http, acceptor).map_err(ServeError::Http)?;
                tokio::spawn(connections::serve(
                    listener,
                    router,
                    read_timeout,
                    grace,
                    stop_rx,
                ))
            }
            None => tokio::spawn(connections::serve(
                self.http.tap_io(|socket| crate::socket::set_up(socket)),
                router,
                read_timeout,
                grace,
                stop_rx,
            )),
        };
        stop.await;
        tracing::info!(
            grace_ms = grace.as_millis() as u64,
            "shutting down: finishing requests in flight"
        );
        let _ = stop_tx.send(true);
        self.state.stop_subscriptions();
        let http_result = http.await;
        let _ = binary.await;
        for listener in [graphite, pg].into_iter().flatten() {
            let _ = listener.await;
        }
        if let Some(cluster) = self.state.cluster() {
            cluster.shutdown().await;
        }
        // Dropping the last handle stops the flushers; the log already holds every
        // acknowledged batch, so nothing else needs to happen before exit.
        drop(self.state);
        http_result
            .map(|_dropped| ())
            .map_err(|e| ServeError::Http(std::io::Error::other(e)))
    }
}

/// Starts this node's cluster member when `config.cluster` names a cluster file; the
/// listen addresses then come from that file.
async fn start_cluster(
    config: &mut Config,
    options: &Options,
) -> Result<Option<std::sync::Arc<Cluster>>, ServeError> {
    Ok(match &config.cluster {
        Some(path) => {
            let cluster_config = ClusterConfig::load(path)?;
            let me = cluster_config.node(config.node_id).ok_or_else(|| {
                ClusterError::Config(format!(
                    "node {} is not in {}",
                    config.node_id,
                    path.display()
                ))
            })?;
            let parse = |what: &str, addr: &str| {
                addr.parse::<SocketAddr>().map_err(|e| {
                    ClusterError::Config(format!("node {} {what} address {addr:?}: {e}", me.id))
                })
            };
            config.http = parse("http", &me.http)?;
            config.binary = parse("binary", &me.binary)?;
            let options = Options {
                tier: config.replicated_tier_options()?,
                ..options.clone()
            };
            Some(Cluster::start(config.node_id, &config.data_dir, &cluster_config, options).await?)
        }
        None => None,
    })
}

/// Warns of listeners that take anyone's connections in the clear beyond loopback.
fn warn_of_open_listeners(config: &Config) {
    if let Some(addr) = config
        .graphite
        .as_ref()
        .map(|g| g.listen)
        .filter(|a| !a.ip().is_loopback())
    {
        if config.auth.is_enabled() || config.tls.is_some() {
            tracing::warn!(
                %addr,
                "the Graphite listener takes lines from anyone who reaches it, without \
                 TLS or tokens (Graphite has neither): keep it on a private network"
            );
        }
    }
    if let Some(addr) = config
        .pg
        .as_ref()
        .map(|p| p.listen)
        .filter(|a| !a.ip().is_loopback())
    {
        if config.auth.is_enabled() && config.tls.is_none() {
            tracing::warn!(
                %addr,
                "the PostgreSQL listener takes tokens as cleartext passwords and has no \
                 TLS configured: anyone on the network path can read them"
            );
        }
    }
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(signal) => signal,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the server");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

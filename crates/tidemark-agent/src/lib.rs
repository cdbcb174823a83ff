//! Tidemark's agent (`tidemark agent`, docs/pipeline.md): producers write to it exactly as to
//! a server; it acknowledges a batch once the batch is durable in its spool, and forwards
//! the spool in order to the upstream (a server or a cluster) as an idempotent producer, so
//! that nothing acknowledged is lost and nothing is stored twice, whatever crashes.
//!
//! Owns: the spool (a `tidemark_engine::Spool`: the engine's log, group commit, checksums and
//! recovery, no second format), the
//! forwarding position (`position`), forwarding itself (`forward`), dead letters
//! (`dead_letters`), and the status (`status`).
//!
//! Must never know about: how the upstream stores what it is sent, storage formats (the
//! spool's records are read through the engine), Raft. Producers are served by
//! `tidemark-server`, restricted to its write routes (`routes`).

pub mod config;
mod dead_letters;
mod forward;
mod position;
mod routes;
mod status;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tidemark_engine::{EngineError, OpenError, Options, Spool, SpoolOptions};
use tidemark_server::{ServeError, Server};

pub use config::AgentConfig;
/// The file in the spool directory that holds the forwarding position (`forwarding.json`):
/// its presence marks a directory as an agent's spool.
pub use position::FILE as POSITION_FILE;
pub use status::Status;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("the spool in {dir}: {message}")]
    Spool { dir: String, message: String },
    #[error("the agent's configuration: {0}")]
    Config(String),
    #[error("forwarding stopped: {0}")]
    Forwarding(String),
}

/// An agent with its spool open and its listeners bound, not yet serving.
pub struct Agent {
    server: Server,
    forwarder: forward::Forwarder,
}

impl Agent {
    /// Opens the spool, binds the listeners and recovers the forwarding position.
    pub async fn bind(config: AgentConfig) -> Result<Agent, AgentError> {
        config.validate()?;
        let options = Options {
            // The upstream judges time: the spool takes events in any order, at any date.
            out_of_order_window_ns: None,
            max_future_ns: None,
            ..Options::default()
        };
        let limits = SpoolOptions {
            max_bytes: config.spool_max_bytes,
            min_free_bytes: config.spool_min_free_bytes,
        };
        let (dir, spool_options) = (config.spool_dir.clone(), options.clone());
        let spool = tokio::task::spawn_blocking(move || Spool::open(dir, spool_options, limits))
            .await
            .map_err(|e| {
                OpenError::from(EngineError::InvalidRequest(format!(
                    "opening the spool: {e}"
                )))
            })
            .and_then(|opened| opened)
            .map_err(ServeError::Open)?;
        let spool = Arc::new(spool);
        let server = Server::bind_spool(config.server_config(), options, spool.clone()).await?;
        let forwarder = forward::Forwarder::open(spool, &config)?;
        let server = server.with_front(routes::front(forwarder.status()));
        Ok(Agent { server, forwarder })
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.server.http_addr()
    }

    pub fn binary_addr(&self) -> SocketAddr {
        self.server.binary_addr()
    }

    /// Serves producers and forwards until `stop` completes, or forwarding fails; then
    /// stops taking writes, lets the forward in flight end (its outcome is recorded either
    /// way) and closes the spool. What is still spooled is forwarded at the next start.
    pub async fn run(
        self,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), AgentError> {
        let stopping = Arc::new(AtomicBool::new(false));
        let (failed_tx, failed_rx) = tokio::sync::oneshot::channel();
        let forwarding = self.forwarder.spawn(stopping.clone(), failed_tx)?;
        let failure = Arc::new(std::sync::Mutex::new(None));
        let stop = {
            let failure = failure.clone();
            async move {
                tokio::select! {
                    _ = stop => {}
                    ended = failed_rx => {
                        // Only a failure or a panic ends forwarding before `stop`.
                        let e = ended.unwrap_or_else(|_| {
                            AgentError::Forwarding("its thread panicked".into())
                        });
                        tracing::error!(error = %e, "forwarding failed: the agent stops");
                        if let Ok(mut slot) = failure.lock() {
                            *slot = Some(e);
                        }
                    }
                }
            }
        };
        let served = self.server.run(stop).await;
        stopping.store(true, Ordering::Release);
        let _ = tokio::task::spawn_blocking(move || forwarding.join()).await;
        served?;
        match failure.lock().ok().and_then(|mut slot| slot.take()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

//! Serving HTTP/1 connections with hyper, under the timeouts `axum::serve` does not offer:
//! headers must arrive within the read timeout (a keep-alive connection idle that long is
//! closed too), and on shutdown connections get a bounded grace period to finish their
//! requests before they are dropped.

use std::time::Duration;

use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::shutdown::stopped;

/// Serves `router` on `listener` until `shutdown` turns true; then each connection finishes
/// the request it is serving and closes, and connections still open after `grace` are
/// dropped. Returns how many connections were dropped that way.
pub async fn serve<L: Listener>(
    mut listener: L,
    router: Router,
    read_timeout: Duration,
    grace: Duration,
    shutdown: watch::Receiver<bool>,
) -> usize {
    let mut connections = JoinSet::new();
    let mut stop = shutdown.clone();
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => break,
            (io, _peer) = listener.accept() => {
                let service = TowerToHyperService::new(router.clone());
                let shutdown = shutdown.clone();
                connections.spawn(serve_connection(TokioIo::new(io), service, read_timeout, shutdown));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    let finished = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if finished.is_ok() {
        return 0;
    }
    let dropped = connections.len();
    tracing::warn!(
        connections = dropped,
        grace_ms = grace.as_millis() as u64,
        "HTTP connections still open after the shutdown grace period are dropped"
    );
    connections.shutdown().await;
    dropped
}

async fn serve_connection<I>(
    io: TokioIo<I>,
    service: TowerToHyperService<Router>,
    read_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(read_timeout);
    let connection = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "HTTP connection ended with an error");
            }
        }
        _ = stopped(&mut shutdown) => {
            connection.as_mut().graceful_shutdown();
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "HTTP connection ended with an error while stopping");
            }
        }
    }
}

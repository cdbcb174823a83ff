//! The server's stop signal as every listener and connection waits for it (a `watch`
//! channel that turns `true` once), and how a listener drains its connections after it;
//! shared by the transports so that none imports another.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

/// Completes once the server is told to stop (or the sender is gone).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, never held across an await.
    let _ = stop.wait_for(|stop| *stop).await.map(|_| ());
}

/// Lets a listener's connections finish what they have read for at most `grace`, then drops
/// the ones still busy, saying so (`what` names them and what they lose).
pub async fn drain(mut connections: JoinSet<()>, grace: Duration, what: &str) {
    let finished = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            connections = connections.len(),
            "{what} still busy after the shutdown grace period are dropped"
        );
        connections.shutdown().await;
    }
}

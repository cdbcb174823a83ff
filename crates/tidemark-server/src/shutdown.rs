//! The server's stop signal as every listener and connection waits for it: a `watch`
//! channel that turns `true` once, shared by the HTTP and binary transports so that
//! neither imports the other.

use tokio::sync::watch;

/// Completes once the server is told to stop (or the sender is gone).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, never held across an await.
    let _ = stop.wait_for(|stop| *stop).await.map(|_| ());
}

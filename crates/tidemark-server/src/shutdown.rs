//! The server's stop signal as every listener and connection waits for it (a `watch`
//! channel that turns `true` once), how a listener serves its connections until it, and how
//! it drains them after it; shared by the transports so that none imports another.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Where connections come from: a TCP listener, or one that completes TLS handshakes first.
pub trait Accept {
    type Socket;
    fn accept(&mut self) -> impl Future<Output = io::Result<(Self::Socket, SocketAddr)>> + Send;
}

impl Accept for TcpListener {
    type Socket = tokio::net::TcpStream;

    async fn accept(&mut self) -> io::Result<(Self::Socket, SocketAddr)> {
        let (socket, peer) = TcpListener::accept(self).await?;
        crate::socket::set_up(&socket);
        Ok((socket, peer))
    }
}

/// How a listener serves: its name in logs, how many connections it serves at once (more are
/// closed as they come), and how long they may finish what they have read after the stop.
pub struct Serving<'a> {
    pub what: &'a str,
    pub max_connections: usize,
    pub grace: Duration,
    /// What the connections still busy after `grace` lose, for the log.
    pub draining: &'a str,
}

/// Connections refused at the bound that may be told so at once; more are closed unanswered.
const MAX_REFUSING: usize = 64;

/// How long telling a refused connection why may take.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);

/// Accepts connections until `stop` turns true, each served by the task `serve` makes for
/// it; then drains them ([`drain`]). A connection task that panics ends that connection only.
/// A connection past `serving.max_connections` is handed to `refuse` (which may tell it why
/// before it is closed) and not served.
pub async fn serve_connections<L, F, Fut, R, RFut>(
    mut listener: L,
    serving: Serving<'_>,
    stop: watch::Receiver<bool>,
    mut serve: F,
    mut refuse: R,
) where
    L: Accept,
    F: FnMut(L::Socket, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
    R: FnMut(L::Socket) -> RFut,
    RFut: Future<Output = ()> + Send + 'static,
{
    let what = serving.what;
    let mut connections = JoinSet::new();
    // Bounded too: a flood of connections past the bound costs at most this many tasks.
    let mut refusing = JoinSet::new();
    let mut stop = stop;
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    if connections.len() >= serving.max_connections {
                        tracing::warn!(%peer, "{what}: {} connections open; closing a new one", serving.max_connections);
                        if refusing.len() < MAX_REFUSING {
                            refusing.spawn(tokio::time::timeout(REFUSAL_TIMEOUT, refuse(socket)));
                        }
                        continue;
                    }
                    tracing::debug!(%peer, "{what} connection");
                    connections.spawn(serve(socket, peer));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a {what} connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = refusing.join_next(), if !refusing.is_empty() => {}
            Some(ended) = connections.join_next(), if !connections.is_empty() => {
                if ended.is_err_and(|e| e.is_panic()) {
                    // pgwire 0.41 panics on a message shorter than its fields (tests/pg.rs).
                    tracing::warn!("{what}: a connection sent what its decoder could not take and was closed");
                }
            }
        }
    }
    refusing.shutdown().await;
    drain(connections, serving.grace, serving.draining).await;
}

/// The `refuse` of a protocol that has no way to say why: the connection is closed.
pub async fn close_unanswered<S>(socket: S) {
    drop(socket);
}

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

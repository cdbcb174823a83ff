//! How every accepted TCP connection is set up, whatever protocol it speaks.

use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

/// Idle time before the first keepalive probe, the time between probes, and how many go
/// unanswered before the kernel ends the connection: a peer that vanished (its machine off,
/// a cable pulled, a partition; no FIN or RST ever comes) is found within about a minute and a
/// half. Without it, an idle connection of such a peer (a subscription waiting for appends,
/// a pg session between queries) would hold its slot of the connection and subscription
/// bounds forever, and a few such peers could take them all.
///
/// No `TCP_USER_TIMEOUT`: since Linux 5.11 it also ends a connection whose peer keeps a zero
/// receive window that long, and a client that stops reading a follow or a long answer for a
/// while is alive and keeps its connection (its buffers are bounded). A vanished peer with
/// bytes unacknowledged is found by the kernel's retransmission limit (~15 minutes).
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
#[cfg(target_os = "linux")]
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
#[cfg(target_os = "linux")]
const KEEPALIVE_PROBES: u32 = 3;

/// Sets an accepted connection up: no Nagle delay (answers are small, or stream in several
/// writes whose last would wait for the client's delayed ACK, 40 ms), and keepalive so that a
/// vanished peer lets go of what it holds. Failures are ignored: each is an optimisation or a
/// safety net, and the connection works without it.
pub fn set_up(socket: &TcpStream) {
    let _ = socket.set_nodelay(true);
    let keepalive = TcpKeepalive::new().with_time(KEEPALIVE_IDLE);
    // The interval and count are the system's elsewhere (socket2 sets them on some systems
    // only).
    #[cfg(target_os = "linux")]
    let keepalive = keepalive
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let _ = SockRef::from(socket).set_tcp_keepalive(&keepalive);
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The options reach the kernel: read back from the socket.
    #[tokio::test]
    async fn an_accepted_socket_keeps_alive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (accepted, _client) = tokio::join!(listener.accept(), client);
        let (socket, _) = accepted.unwrap();
        set_up(&socket);
        let sock = SockRef::from(&socket);
        assert!(socket.nodelay().unwrap());
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
        assert_eq!(sock.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
    }
}

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
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 3;
/// How long written bytes may stay unacknowledged before the kernel ends the connection
/// (`TCP_USER_TIMEOUT`): a vanished peer with answers on their way is found in this time
/// rather than the ~15 minutes of the kernel's retransmissions. A slow reader is not cut
/// off by it: its kernel acknowledges (or advertises a zero window) while it is alive.
const UNACKNOWLEDGED: Duration = Duration::from_secs(90);

/// Sets an accepted connection up: no Nagle delay (answers are small, or stream in several
/// writes whose last would wait for the client's delayed ACK, 40 ms), and keepalive with
/// bounded retransmission so that a vanished peer lets go of what it holds. Failures are
/// ignored: each is an optimisation or a safety net, and the connection works without it.
pub fn set_up(socket: &TcpStream) {
    let _ = socket.set_nodelay(true);
    let socket = SockRef::from(socket);
    let keepalive = TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let _ = socket.set_tcp_keepalive(&keepalive);
    let _ = socket.set_tcp_user_timeout(Some(UNACKNOWLEDGED));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The options reach the kernel: read back from the socket.
    #[tokio::test]
    async fn an_accepted_socket_keeps_alive_and_bounds_retransmission() {
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
        assert_eq!(sock.tcp_user_timeout().unwrap(), Some(UNACKNOWLEDGED));
    }
}

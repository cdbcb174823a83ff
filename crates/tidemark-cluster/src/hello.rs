//! The first exchange on every node-to-node connection: the dialling node presents the
//! cluster's secret (`secret` in the cluster file) in a HELLO frame, and the accepting node
//! answers whether it takes it before it reads anything else.
//!
//! Why: a node's Raft address takes votes, entries, snapshots and forwarded writes. Without
//! the exchange, anyone who reached it could write to the cluster without a token, or make a
//! node allocate a 300 MiB frame per connection. Before its HELLO is taken, a connection
//! can make the node read at most [`MAX_SECRET_BYTES`], for at most [`HELLO_TIMEOUT`].
//!
//! ```text
//! HELLO    dialler → acceptor   frame kind 9, request id 0, body: the secret (empty: none)
//! answer   acceptor → dialler   frame kind 9 | 0x80, request id 0, body: empty when taken,
//!                               else why not (UTF-8), and the acceptor closes the connection
//! ```
//!
//! A node without a secret takes every HELLO (as a server without tokens takes every
//! request); one with a secret takes only that secret, compared in constant time
//! (`tidemark_core::secret`). The secret crosses the network as it is, as the server's
//! tokens do: keep node-to-node traffic on a network only the nodes share.
//!
//! Must never know about: what the connection carries after its HELLO, Raft.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidemark_core::secret::secret_matches;
use tidemark_core::sync::IgnorePoison;
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;

use crate::transport::{self, Halves, RESPONSE};

/// The frame kind of a HELLO and (with [`RESPONSE`]) of its answer.
pub const HELLO: u8 = 9;

/// The longest secret a HELLO may carry, and the longest answer to one.
pub const MAX_SECRET_BYTES: usize = 1024;

/// How long an accepted connection has to present its HELLO ([`expect`]'s `timeout` in
/// a node).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The dialling side: presents `secret` (`None`: the cluster has none) and returns once
/// the peer took it, waiting up to `timeout` for its answer. A peer that refuses it is
/// `PermissionDenied`, with its reason.
pub async fn present(
    halves: &mut Halves,
    secret: Option<&str>,
    timeout: Duration,
) -> io::Result<()> {
    let (r, w) = halves;
    transport::write_frame(w, HELLO, 0, secret.unwrap_or_default().as_bytes()).await?;
    w.flush().await?;
    let answer = within(timeout, read_small_frame(r, HELLO | RESPONSE)).await?;
    if answer.is_empty() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the peer refused this node: {}",
                String::from_utf8_lossy(&answer)
            ),
        ))
    }
}

/// The accepting side: the connection's first frame must be a HELLO, within `timeout`,
/// presenting `secret` when this node has one. Answers it either way; returns an error (and
/// the caller closes the connection) unless it was taken.
pub async fn expect(
    halves: &mut Halves,
    secret: Option<&str>,
    timeout: Duration,
) -> io::Result<()> {
    let (r, w) = halves;
    let presented = within(timeout, read_small_frame(r, HELLO)).await?;
    let taken = secret.is_none_or(|secret| secret_matches(&presented, secret.as_bytes()));
    let answer: &[u8] = if taken {
        b""
    } else {
        b"it did not present the cluster's secret (`secret` in the cluster file)"
    };
    transport::write_frame(w, HELLO | RESPONSE, 0, answer).await?;
    w.flush().await?;
    if taken {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "a connection did not present the cluster's secret",
        ))
    }
}

/// Connections that have not presented their HELLO yet, at most this many at once; one
/// more closes the oldest of them ([`Doorway`]).
pub const MAX_WAITING: usize = 64;

/// Where accepted connections wait for their HELLO. At most [`MAX_WAITING`] wait at once,
/// and one more closes the *oldest* waiting (as the PostgreSQL port's `max_starting`
/// does), not the newcomer: a stranger holding connections open without a word cannot
/// keep a peer's new connection out (a vote in an election is one), since a peer's HELLO
/// is taken within a round trip of its arrival.
#[derive(Clone, Default)]
pub struct Doorway {
    waiting: Arc<Mutex<Waiting>>,
}

#[derive(Default)]
struct Waiting {
    next: u64,
    /// By arrival: what closes each waiting connection.
    closers: BTreeMap<u64, oneshot::Sender<()>>,
}

/// One accepted connection's place at the [`Doorway`] until its HELLO is taken or refused.
pub struct Arrival {
    doorway: Doorway,
    number: u64,
    closed: oneshot::Receiver<()>,
}

impl Doorway {
    /// A place for a connection just accepted, closing the oldest waiting one if
    /// [`MAX_WAITING`] already wait.
    pub fn arrive(&self) -> Arrival {
        let (closer, closed) = oneshot::channel();
        let mut waiting = self.waiting.lock().ignore_poison();
        if waiting.closers.len() >= MAX_WAITING {
            if let Some((_, oldest)) = waiting.closers.pop_first() {
                let _ = oldest.send(());
            }
        }
        waiting.next += 1;
        let number = waiting.next;
        waiting.closers.insert(number, closer);
        Arrival {
            doorway: self.clone(),
            number,
            closed,
        }
    }

    /// Connections waiting for their HELLO now.
    pub fn waiting(&self) -> usize {
        self.waiting.lock().ignore_poison().closers.len()
    }
}

impl Arrival {
    /// [`expect`], unless a newer arrival closes this one first (`ConnectionAborted`).
    pub async fn expect(
        mut self,
        halves: &mut Halves,
        secret: Option<&str>,
        timeout: Duration,
    ) -> io::Result<()> {
        tokio::select! {
            taken = expect(halves, secret, timeout) => taken,
            _ = &mut self.closed => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed before its HELLO for a newer connection",
            )),
        }
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        let mut waiting = self.doorway.waiting.lock().ignore_poison();
        waiting.closers.remove(&self.number);
    }
}

async fn within<T>(timeout: Duration, work: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no HELLO exchanged in time"))?
}

/// Reads one frame of `kind` whose body is at most [`MAX_SECRET_BYTES`]; anything else is
/// refused from its header, before its body is read.
async fn read_small_frame(
    r: &mut tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
    kind: u8,
) -> io::Result<Vec<u8>> {
    let (found, _id, len) = transport::read_header(r).await?;
    if found != kind || len > MAX_SECRET_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("expected a HELLO of at most {MAX_SECRET_BYTES} bytes, got a frame of kind {found} and {len} bytes"),
        ));
    }
    let mut body = Vec::new();
    transport::read_body(r, len, &mut body).await?;
    Ok(body)
}

#[cfg(test)]
mod tests {
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// A connected pair: the dialler's halves and the acceptor's.
    async fn pair() -> (Halves, Halves) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (dialled, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (
            transport::buffered(dialled.unwrap()).unwrap(),
            transport::buffered(accepted.unwrap().0).unwrap(),
        )
    }

    async fn exchange(
        presented: Option<&str>,
        expected: Option<&str>,
    ) -> (io::Result<()>, io::Result<()>) {
        let (mut dialler, mut acceptor) = pair().await;
        tokio::join!(
            present(&mut dialler, presented, HELLO_TIMEOUT),
            expect(&mut acceptor, expected, HELLO_TIMEOUT)
        )
    }

    #[tokio::test]
    async fn the_secret_is_taken_and_anything_else_refused_on_both_sides() {
        let secret = Some("0123456789abcdef");
        let (dialler, acceptor) = exchange(secret, secret).await;
        dialler.unwrap();
        acceptor.unwrap();
        for wrong in [None, Some("0123456789abcdeF"), Some("0123456789abcdef0")] {
            let (dialler, acceptor) = exchange(wrong, secret).await;
            let refused = dialler.unwrap_err();
            assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied, "{refused}");
            assert!(refused.to_string().contains("secret"), "{refused}");
            assert_eq!(
                acceptor.unwrap_err().kind(),
                io::ErrorKind::PermissionDenied
            );
        }
        // A node without a secret takes any HELLO.
        let (dialler, acceptor) = exchange(secret, None).await;
        dialler.unwrap();
        acceptor.unwrap();
    }

    #[tokio::test]
    async fn a_first_frame_that_is_no_small_hello_is_refused_from_its_header() {
        let (mut dialler, mut acceptor) = pair().await;
        // An AppendEntries header announcing 300 MiB: refused before a byte of it is read
        // or a buffer allocated for it.
        let (_, w) = &mut dialler;
        w.write_u32_le(300 << 20).await.unwrap();
        w.write_u8(transport::APPEND_ENTRIES).await.unwrap();
        w.write_u64_le(1).await.unwrap();
        w.flush().await.unwrap();
        let refused = expect(&mut acceptor, None, HELLO_TIMEOUT)
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::InvalidData, "{refused}");

        let (mut dialler, mut acceptor) = pair().await;
        let (_, w) = &mut dialler;
        let long = vec![b'x'; MAX_SECRET_BYTES + 1];
        transport::write_frame(w, HELLO, 0, &long).await.unwrap();
        w.flush().await.unwrap();
        let refused = expect(&mut acceptor, None, HELLO_TIMEOUT)
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::InvalidData, "{refused}");
    }

    #[tokio::test]
    async fn a_new_arrival_closes_the_oldest_silent_one_and_is_served() {
        let doorway = Doorway::default();
        let secret = Some("0123456789abcdef");
        // MAX_WAITING strangers connect and say nothing.
        let mut strangers = Vec::new();
        for _ in 0..MAX_WAITING {
            let (dialler, mut acceptor) = pair().await;
            let arrival = doorway.arrive();
            let waiting =
                tokio::spawn(
                    async move { arrival.expect(&mut acceptor, secret, HELLO_TIMEOUT).await },
                );
            strangers.push((dialler, waiting));
        }
        assert_eq!(doorway.waiting(), MAX_WAITING);
        // A peer arrives: the first stranger is closed, the peer is taken.
        let (mut dialler, mut acceptor) = pair().await;
        let arrival = doorway.arrive();
        let (presented, taken) = tokio::join!(
            present(&mut dialler, secret, HELLO_TIMEOUT),
            arrival.expect(&mut acceptor, secret, HELLO_TIMEOUT)
        );
        presented.unwrap();
        taken.unwrap();
        let (_, first) = strangers.remove(0);
        let closed = first.await.unwrap().unwrap_err();
        assert_eq!(closed.kind(), io::ErrorKind::ConnectionAborted);
        // The others still wait; the peer's place was given back.
        assert_eq!(doorway.waiting(), MAX_WAITING - 1);
        for (_, waiting) in strangers {
            waiting.abort();
        }
    }

    #[tokio::test]
    async fn a_connection_that_says_nothing_is_dropped_after_the_timeout() {
        let (_dialler, mut acceptor) = pair().await;
        let timeout = Duration::from_millis(100);
        let refused = expect(&mut acceptor, Some("0123456789abcdef"), timeout)
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::TimedOut);
    }
}

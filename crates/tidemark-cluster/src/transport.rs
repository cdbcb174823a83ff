//! Node-to-node framing over persistent TCP connections.
//!
//! ```text
//! frame := u32 body length | u8 kind | u64 request id | body
//! ```
//!
//! A response carries the request's kind with the high bit set and the request's id. Each
//! openraft client (replication, heartbeats, snapshots, one per target) owns its own
//! connection, so heartbeats never wait behind a large AppendEntries on the replication
//! connection. Bodies are postcard-encoded openraft messages (see `raft::network`).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// The largest frame accepted: a full AppendEntries of `max_payload_entries` entries at the
/// entry cap fits, and nothing a peer sends can make a node allocate more.
pub const MAX_FRAME_BYTES: usize = 300 << 20;
pub const RESPONSE: u8 = 0x80;

pub const APPEND_ENTRIES: u8 = 1;
pub const VOTE: u8 = 2;
pub const PRE_VOTE: u8 = 3;
pub const SNAPSHOT_BEGIN: u8 = 4;
pub const SNAPSHOT_CHUNK: u8 = 5;
pub const CLIENT_WRITE: u8 = 6;
pub const READ_INDEX: u8 = 7;
pub const MEMBERSHIP: u8 = 8;

/// Bytes of one snapshot chunk frame.
pub const CHUNK_BYTES: usize = 4 << 20;

pub struct Frame {
    pub kind: u8,
    pub id: u64,
    pub body: Vec<u8>,
}

pub async fn read_frame(r: &mut BufReader<OwnedReadHalf>) -> io::Result<Frame> {
    let mut body = Vec::new();
    let (kind, id) = read_frame_into(r, &mut body).await?;
    Ok(Frame { kind, id, body })
}

/// A reused frame buffer keeps its memory up to this capacity.
const RETAINED_BUFFER_BYTES: usize = 16 << 20;

/// Empties a frame buffer for the next frame, keeping its memory (up to 16 MiB) so that
/// the next frame does not fault in fresh pages.
fn recycle(buffer: &mut Vec<u8>) {
    buffer.clear();
    if buffer.capacity() > RETAINED_BUFFER_BYTES {
        *buffer = Vec::new();
    }
}

/// Reads a frame's header: its kind, request id and body length (checked against the limit).
pub async fn read_header(r: &mut BufReader<OwnedReadHalf>) -> io::Result<(u8, u64, usize)> {
    let len = r.read_u32_le().await? as usize;
    if len > MAX_FRAME_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes (at most {MAX_FRAME_BYTES})"),
        ));
    }
    let kind = r.read_u8().await?;
    let id = r.read_u64_le().await?;
    Ok((kind, id, len))
}

/// Reads a frame's body into `body` (replacing what it held) and returns its kind and id.
/// Reusing one buffer spares the allocation of fresh pages, and their zeroing by the
/// kernel, for every large frame of a stream of them (snapshot chunks).
pub async fn read_frame_into(
    r: &mut BufReader<OwnedReadHalf>,
    body: &mut Vec<u8>,
) -> io::Result<(u8, u64)> {
    let (kind, id, len) = read_header(r).await?;
    recycle(body);
    read_body(r, len, body).await?;
    Ok((kind, id))
}

/// Reads a body of `len` bytes into a buffer of its own, for a frame whose parts outlive
/// it (an AppendEntries' payloads become the entries' bytes).
pub async fn read_owned_body(r: &mut BufReader<OwnedReadHalf>, len: usize) -> io::Result<Bytes> {
    let mut body = Vec::with_capacity(len);
    read_body(r, len, &mut body).await?;
    Ok(Bytes::from(body))
}

pub(crate) async fn read_body(
    r: &mut BufReader<OwnedReadHalf>,
    len: usize,
    body: &mut Vec<u8>,
) -> io::Result<()> {
    body.reserve(len);
    (&mut *r).take(len as u64).read_to_end(body).await?;
    if body.len() != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("a frame cut short: {} of {len} bytes", body.len()),
        ));
    }
    Ok(())
}

pub async fn write_frame(
    w: &mut BufWriter<OwnedWriteHalf>,
    kind: u8,
    id: u64,
    body: &[u8],
) -> io::Result<()> {
    write_frame_parts(w, kind, id, &[body]).await
}

/// Writes a frame whose body is `parts` back to back; parts larger than the writer's
/// buffer go to the socket from where they are, without a copy.
pub async fn write_frame_parts(
    w: &mut BufWriter<OwnedWriteHalf>,
    kind: u8,
    id: u64,
    parts: &[&[u8]],
) -> io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let len = u32::try_from(total)
        .ok()
        .filter(|&l| l as usize <= MAX_FRAME_BYTES)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a frame of {total} bytes"),
            )
        })?;
    w.write_u32_le(len).await?;
    w.write_u8(kind).await?;
    w.write_u64_le(id).await?;
    for part in parts {
        w.write_all(part).await?;
    }
    Ok(())
}

/// A switch that cuts this node off from its peers the way a network partition would:
/// while it is on, every request to a peer fails as unreachable and every connection from
/// one is closed, on connections already open too. Clients still reach the node. For
/// fault-injection tests and drills ([`crate::Cluster::isolate`]); off unless turned on.
#[derive(Clone, Default)]
pub struct Isolation(Arc<AtomicBool>);

impl Isolation {
    pub fn set(&self, isolated: bool) {
        self.0.store(isolated, Ordering::SeqCst);
    }

    /// Fails while the node is isolated.
    pub fn check(&self) -> io::Result<()> {
        if self.0.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "this node is isolated from its peers",
            ));
        }
        Ok(())
    }
}

/// The two buffered halves of a node-to-node connection.
pub type Halves = (BufReader<OwnedReadHalf>, BufWriter<OwnedWriteHalf>);

/// Opens a connection to a peer (giving up after `timeout`). Peers are dialled through
/// [`crate::dialer::Dialer::connect`], which keeps what the attempts found.
pub(crate) async fn connect(addr: &str, timeout: Duration) -> io::Result<Halves> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {addr}")))??;
    buffered(stream)
}

/// Idle time before the first keepalive probe, the time between probes, and how many go
/// unanswered before the kernel ends a connection: as for the server's client connections
/// (`tidemark-server`'s `socket`), so that a peer that vanished without a FIN (its machine
/// off, a partition) lets go of the accepting node's connection slot within a minute and a
/// half instead of never.
const KEEPALIVE: (Duration, Duration, u32) = (Duration::from_secs(60), Duration::from_secs(10), 3);

/// Splits a connection (either end) into buffered halves, with Nagle off (frames are
/// flushed whole, and a small answer must not wait for more) and keepalive on.
pub fn buffered(stream: TcpStream) -> io::Result<Halves> {
    stream.set_nodelay(true)?;
    let (idle, interval, probes) = KEEPALIVE;
    let keepalive = socket2::TcpKeepalive::new().with_time(idle);
    #[cfg(target_os = "linux")]
    let keepalive = keepalive.with_interval(interval).with_retries(probes);
    #[cfg(not(target_os = "linux"))]
    let _ = (interval, probes);
    socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive)?;
    let (r, w) = stream.into_split();
    Ok((
        BufReader::with_capacity(256 << 10, r),
        BufWriter::with_capacity(256 << 10, w),
    ))
}

/// Whether a connection kept idle can carry another request: the peer has not closed it,
/// and no bytes arrived that no request asked for. A peer that died closed it; a request
/// written to it would be lost without an answer, its outcome unknown.
pub fn is_reusable(reader: &mut BufReader<OwnedReadHalf>) -> bool {
    use futures_util::FutureExt;
    if !reader.buffer().is_empty() {
        return false;
    }
    let mut byte = [0u8; 1];
    // Pending means open and quiet; anything else (end, data, error) means do not use.
    reader.get_mut().peek(&mut byte).now_or_never().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// The reading end of a connection on which `bytes` were sent and the sender closed.
    async fn received(bytes: Vec<u8>) -> BufReader<OwnedReadHalf> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sender = tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(&bytes).await.unwrap();
        });
        let (stream, _) = listener.accept().await.unwrap();
        sender.await.unwrap();
        BufReader::new(stream.into_split().0)
    }

    fn frame(kind: u8, id: u64, body: &[u8]) -> Vec<u8> {
        let mut bytes = (body.len() as u32).to_le_bytes().to_vec();
        bytes.push(kind);
        bytes.extend_from_slice(&id.to_le_bytes());
        bytes.extend_from_slice(body);
        bytes
    }

    #[tokio::test]
    async fn frames_read_into_one_buffer_each_get_their_own_body() {
        let mut bytes = frame(APPEND_ENTRIES, 1, &[7; 3000]);
        bytes.extend(frame(VOTE, 2, b"short"));
        let mut r = received(bytes).await;
        let mut body = Vec::new();
        assert_eq!(
            read_frame_into(&mut r, &mut body).await.unwrap(),
            (APPEND_ENTRIES, 1)
        );
        assert_eq!(body, [7; 3000]);
        assert_eq!(read_frame_into(&mut r, &mut body).await.unwrap(), (VOTE, 2));
        assert_eq!(body, b"short");
        let end = read_frame_into(&mut r, &mut body).await.unwrap_err();
        assert_eq!(end.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn a_frame_cut_short_or_above_the_limit_is_an_error() {
        let mut cut = frame(APPEND_ENTRIES, 1, &[1; 100]);
        cut.truncate(cut.len() - 40);
        let e = read_frame_into(&mut received(cut).await, &mut Vec::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");

        let mut huge = ((MAX_FRAME_BYTES + 1) as u32).to_le_bytes().to_vec();
        huge.extend_from_slice(&[APPEND_ENTRIES, 0, 0, 0, 0, 0, 0, 0, 0]);
        let e = read_frame_into(&mut received(huge).await, &mut Vec::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}

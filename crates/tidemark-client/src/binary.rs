//! The binary protocol over one TCP connection: requests are written by the calling thread,
//! answers read by a reader thread and handed to whoever waits for that request id. Many
//! requests may be in flight at once (pipelining); see `docs/protocol.md`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tidemark_core::sync::IgnorePoison;
use tidemark_core::EventBatch;
use tidemark_protocol::{
    decode_frame, encode_append, frame_len, ErrorCode, Request, Response, Start,
    DEFAULT_MAX_FRAME_BYTES,
};

use crate::{Ack, ClientError};

/// Answers are small, but a subscription's EVENTS are up to a few megabytes (and one large
/// event more): a frame past a server's own request cap is a broken stream.
const MAX_ANSWER_BYTES: usize = DEFAULT_MAX_FRAME_BYTES;

/// A client of the binary protocol. Cheap to share between threads (`&BinaryClient` is
/// `Sync`); a broken connection is replaced on the next request.
pub struct BinaryClient {
    addr: SocketAddr,
    token: Option<String>,
    connection: Mutex<Option<Arc<Connection>>>,
    next_id: AtomicU64,
}

struct Connection {
    writer: Mutex<TcpStream>,
    waiting: Arc<Mutex<Waiting>>,
}

/// A frame of a subscription and its length (granted back as credit), or why none came.
type Received = Result<(Response, usize), ClientError>;

#[derive(Default)]
struct Waiting {
    answers: HashMap<u64, SyncSender<Result<Response, ClientError>>>,
    /// Subscriptions by the request id that opened them: each of their frames (with its
    /// length, which the subscriber grants back as credit) until the one that ends them.
    subscriptions: HashMap<u64, Sender<Received>>,
    broken: bool,
}

/// An append sent and not yet answered.
pub struct PendingAck {
    answer: Receiver<Result<Response, ClientError>>,
}

impl BinaryClient {
    /// Connects to `addr` and, with a token, authenticates (AUTH) before returning.
    pub fn connect(
        addr: impl ToSocketAddrs,
        token: Option<&str>,
    ) -> Result<BinaryClient, ClientError> {
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| ClientError::Protocol("the address resolves to nothing".into()))?;
        let client = BinaryClient {
            addr,
            token: token.map(str::to_string),
            connection: Mutex::new(None),
            next_id: AtomicU64::new(1),
        };
        client.connection()?;
        Ok(client)
    }

    /// Sends an append and returns at once; [`PendingAck::wait`] gives the answer.
    pub fn send_append(&self, stream: &str, batch: &EventBatch) -> Result<PendingAck, ClientError> {
        self.send_append_tagged(stream, batch, None)
    }

    /// [`BinaryClient::send_append`] with a (producer id, sequence) tag: a cluster applies
    /// a batch sent again with the same tag once (see `docs/cluster.md`).
    ///
    /// Every append asks for the positions its events are given ([`Ack::positions`]):
    /// sixteen bytes more in the answer, and a server that predates them ignores the ask.
    pub fn send_append_tagged(
        &self,
        stream: &str,
        batch: &EventBatch,
        producer: Option<(u64, u64)>,
    ) -> Result<PendingAck, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::with_capacity(batch.heap_bytes() + 64);
        encode_append(id, stream, batch, producer, true, &mut frame)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.send(id, &frame)
    }

    /// Appends `batch` to `stream` and waits until it is durable.
    pub fn append(&self, stream: &str, batch: &EventBatch) -> Result<Ack, ClientError> {
        self.send_append(stream, batch)?.wait()
    }

    /// Sends a catalog change encoded as in the log (`tidemark_core::command::encode`): a
    /// COMMAND frame, what an agent forwards from its spool besides appends.
    pub fn send_command(&self, command: &[u8]) -> Result<PendingAck, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.send(id, &frame_of(id, Request::Command { command })?)
    }

    /// Subscribes to `stream` from `start` (docs/protocol.md "Subscriptions"), granting
    /// `credit` bytes; `follow`: for ever, else until caught up. Each frame the
    /// subscription hands out is granted back as it goes, so `credit` is what the server
    /// may send ahead of the subscriber. Open subscriptions on a client of their own: a
    /// subscriber that stops reading holds the connection's other answers too.
    pub fn subscribe(
        &self,
        stream: &str,
        start: Start<'_>,
        credit: u32,
        follow: bool,
    ) -> Result<Subscription, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = frame_of(
            id,
            Request::Subscribe {
                stream,
                start,
                credit,
                follow,
            },
        )?;
        let (tx, rx) = channel();
        let connection = self.send_awaited(id, &frame, |waiting| &mut waiting.subscriptions, tx)?;
        Ok(Subscription {
            id,
            frames: rx,
            connection,
            ended: false,
        })
    }

    /// How long [`BinaryClient::commit_position`] waits for its answer: a commit is
    /// durable first (on a cluster, committed, which may wait out an election of a few
    /// seconds), so this is generous.
    pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(30);

    /// Keeps consumer `consumer`'s position in `stream` (`None`: forgets it), durably,
    /// waiting at most [`BinaryClient::COMMIT_TIMEOUT`] for the server to say so.
    pub fn commit_position(
        &self,
        stream: &str,
        consumer: &str,
        position: Option<u64>,
    ) -> Result<(), ClientError> {
        self.commit_position_within(stream, consumer, position, Self::COMMIT_TIMEOUT)
    }

    /// [`BinaryClient::commit_position`], waiting at most `timeout`. Past it the outcome is
    /// unknown ([`ClientError::OutcomeUnknown`]) and the connection is given up (the next
    /// request opens another): a server that stopped answering without closing it (frozen,
    /// or cut off with the frame unacknowledged, which keepalive does not notice) would
    /// otherwise hold a committing consumer for the kernel's retransmission limit, about
    /// 15 minutes. Sending the commit again is safe: a position committed twice is kept once.
    pub fn commit_position_within(
        &self,
        stream: &str,
        consumer: &str,
        position: Option<u64>,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let commit = Request::CommitPosition {
            stream,
            consumer,
            position,
        };
        let (tx, rx) = sync_channel(1);
        let connection = self.send_awaited(id, &frame_of(id, commit)?, |w| &mut w.answers, tx)?;
        match (PendingAck { answer: rx }).wait_timeout(timeout) {
            Err(ClientError::OutcomeUnknown) => {
                lock(&connection.waiting).answers.remove(&id);
                self.forget(&connection);
                Err(ClientError::OutcomeUnknown)
            }
            answered => answered.map(drop),
        }
    }

    /// A round trip to the server.
    pub fn ping(&self) -> Result<(), ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.send(id, &frame_of(id, Request::Ping)?)?
            .wait()
            .map(|_| ())
    }

    fn send(&self, id: u64, frame: &[u8]) -> Result<PendingAck, ClientError> {
        let (tx, rx) = sync_channel(1);
        self.send_awaited(id, frame, |waiting| &mut waiting.answers, tx)?;
        Ok(PendingAck { answer: rx })
    }

    /// Writes `frame` on the live connection once `waiter` waits for its answers in the
    /// map `waiters` picks (so that no answer can come before it), taking it out again if
    /// the write fails; the connection written on.
    fn send_awaited<W>(
        &self,
        id: u64,
        frame: &[u8],
        waiters: impl Fn(&mut Waiting) -> &mut HashMap<u64, W>,
        waiter: W,
    ) -> Result<Arc<Connection>, ClientError> {
        let connection = self.connection()?;
        {
            let mut waiting = lock(&connection.waiting);
            if waiting.broken {
                drop(waiting);
                self.forget(&connection);
                return Err(ClientError::OutcomeUnknown);
            }
            let earlier = waiters(&mut waiting).insert(id, waiter);
            assert!(earlier.is_none(), "request id {id} was given twice");
        }
        if let Err(e) = lock(&connection.writer).write_all(frame) {
            waiters(&mut lock(&connection.waiting)).remove(&id);
            self.forget(&connection);
            return Err(e.into());
        }
        Ok(connection)
    }

    /// The live connection, opened (and authenticated) if there is none.
    fn connection(&self) -> Result<Arc<Connection>, ClientError> {
        let mut slot = lock(&self.connection);
        if let Some(connection) = slot.as_ref() {
            if !lock(&connection.waiting).broken {
                return Ok(connection.clone());
            }
        }
        let connection = Arc::new(Connection::open(self.addr)?);
        if let Some(token) = &self.token {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let frame = frame_of(id, Request::Auth { token })?;
            let (tx, rx) = sync_channel(1);
            lock(&connection.waiting).answers.insert(id, tx);
            lock(&connection.writer).write_all(&frame)?;
            (PendingAck { answer: rx }).wait()?;
        }
        *slot = Some(connection.clone());
        Ok(connection)
    }

    fn forget(&self, broken: &Arc<Connection>) {
        let mut slot = lock(&self.connection);
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, broken)) {
            *slot = None;
        }
    }
}

impl Drop for BinaryClient {
    fn drop(&mut self) {
        if let Some(connection) = lock(&self.connection).take() {
            // Ends the reader thread, which then fails whatever still waits.
            let _ = lock(&connection.writer).shutdown(Shutdown::Both);
        }
    }
}

impl Connection {
    fn open(addr: SocketAddr) -> Result<Connection, ClientError> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
        stream.set_nodelay(true)?;
        keep_alive(&stream);
        let reader = stream.try_clone()?;
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let for_reader = waiting.clone();
        std::thread::Builder::new()
            .name("tidemark-client-reader".into())
            .spawn(move || read_answers(reader, for_reader))?;
        Ok(Connection {
            writer: Mutex::new(stream),
            waiting,
        })
    }
}

/// Keepalive probes after 60 s without traffic, as the server sends them: a server that
/// vanished without closing (its machine off, a partition) fails the connection within
/// about 90 s, so a consumer waiting on an idle stream or a request waiting for its answer
/// goes on to the next server instead of waiting for ever. Best effort: the connection works
/// without it.
fn keep_alive(stream: &TcpStream) {
    let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(60));
    #[cfg(target_os = "linux")]
    let keepalive = keepalive
        .with_interval(Duration::from_secs(10))
        .with_retries(3);
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive);
}

/// Reads answers until the stream ends or breaks, then fails every request still waiting.
fn read_answers(mut stream: TcpStream, waiting: Arc<Mutex<Waiting>>) {
    let mut buf = Vec::new();
    while let Ok((id, answer, len)) = read_answer(&mut stream, &mut buf) {
        let mut waiting = lock(&waiting);
        if let Some(waiter) = waiting.answers.remove(&id) {
            let _ = waiter.send(Ok(answer));
        } else if let Some(subscription) = waiting.subscriptions.get(&id) {
            // Every answer but EVENTS ends the subscription.
            let ends = !matches!(answer, Response::Events { .. });
            let _ = subscription.send(Ok((answer, len)));
            if ends {
                waiting.subscriptions.remove(&id);
            }
        }
    }
    let mut waiting = lock(&waiting);
    waiting.broken = true;
    for (_, waiter) in waiting.answers.drain() {
        let _ = waiter.send(Err(ClientError::OutcomeUnknown));
    }
    for (_, subscription) in waiting.subscriptions.drain() {
        let lost = std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "the connection of the subscription was lost",
        );
        let _ = subscription.send(Err(lost.into()));
    }
}

/// A subscription (SUBSCRIBE): its frames as they come.
pub struct Subscription {
    id: u64,
    frames: Receiver<Received>,
    connection: Arc<Connection>,
    ended: bool,
}

/// Events a subscription received: `events` carry their positions
/// ([`EventBatch::position_at`]), consecutive from `first_position`.
#[derive(Debug, Clone, PartialEq)]
pub struct Events {
    pub first_position: u64,
    /// The stream's next position when they were read.
    pub next_position: u64,
    pub events: EventBatch,
}

impl Subscription {
    /// The next events, waiting for them; `None` once the subscription ended (caught up
    /// without following, or unsubscribed). A refusal ends it too, as an error (GONE for
    /// positions removed before they were read, with the earliest held in its message).
    /// The frame's bytes are granted back as credit before it is returned.
    pub fn next_events(&mut self) -> Result<Option<Events>, ClientError> {
        if self.ended {
            return Ok(None);
        }
        let received = self
            .frames
            .recv()
            .map_err(|_| ClientError::OutcomeUnknown)?;
        let (answer, len) = match received {
            Ok(frame) => frame,
            Err(e) => {
                self.ended = true;
                return Err(e);
            }
        };
        match answer {
            Response::Events {
                first_position,
                next_position,
                events,
            } => {
                self.grant(u32::try_from(len).unwrap_or(u32::MAX))?;
                Ok(Some(Events {
                    first_position,
                    next_position,
                    events: *events,
                }))
            }
            other => {
                self.ended = true;
                answer_to_ack(other).map(|_| None)
            }
        }
    }

    /// Grants the server `bytes` more to send.
    pub fn grant(&self, bytes: u32) -> Result<(), ClientError> {
        self.write(Request::Credit { bytes })
    }

    /// Asks the server to end the subscription: [`Subscription::next_events`] then gives
    /// what was already sent, and `None`.
    pub fn unsubscribe(&self) -> Result<(), ClientError> {
        self.write(Request::Unsubscribe)
    }

    /// What ends this subscription from another thread, while this one waits in
    /// [`Subscription::next_events`] (which then gives what was already sent, and `None`).
    pub fn end_handle(&self) -> SubscriptionEnd {
        SubscriptionEnd {
            id: self.id,
            connection: self.connection.clone(),
        }
    }

    fn write(&self, request: Request<'_>) -> Result<(), ClientError> {
        write_on(&self.connection, self.id, request)
    }
}

/// Ends a [`Subscription`] from a thread other than the one reading it.
pub struct SubscriptionEnd {
    id: u64,
    connection: Arc<Connection>,
}

impl SubscriptionEnd {
    /// Asks the server to end the subscription, as [`Subscription::unsubscribe`].
    pub fn unsubscribe(&self) -> Result<(), ClientError> {
        write_on(&self.connection, self.id, Request::Unsubscribe)
    }

    /// Closes the subscription's connection: its reader gets an error at once, whatever the
    /// server does (an unsubscribe waits for the server's answer, which a hung server never
    /// sends). The server ends what the connection held when it sees it closed.
    pub fn close(&self) {
        // Already closed by the peer: nothing left to do.
        let _ = lock(&self.connection.writer).shutdown(std::net::Shutdown::Both);
    }
}

fn write_on(connection: &Connection, id: u64, request: Request<'_>) -> Result<(), ClientError> {
    lock(&connection.writer).write_all(&frame_of(id, request)?)?;
    Ok(())
}

/// The frame of `request` with request id `id` (a name or body past the protocol's
/// lengths is the caller's mistake, said as a protocol error).
fn frame_of(id: u64, request: Request<'_>) -> Result<Vec<u8>, ClientError> {
    let mut frame = Vec::new();
    request
        .encode(id, &mut frame)
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
    Ok(frame)
}

/// A subscription dropped before it ended is ended on the server too (best effort: a
/// connection already gone ended it there).
impl Drop for Subscription {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.unsubscribe();
        }
    }
}

fn read_answer(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<(u64, Response, usize), ClientError> {
    buf.resize(4, 0);
    stream.read_exact(&mut buf[..4])?;
    let total = frame_len(buf, MAX_ANSWER_BYTES)
        .map_err(|e| ClientError::Protocol(e.to_string()))?
        .ok_or_else(|| ClientError::Protocol("no frame length".into()))?;
    buf.resize(total, 0);
    stream.read_exact(&mut buf[4..])?;
    let (frame, used) = decode_frame(buf, MAX_ANSWER_BYTES)
        .map_err(|e| ClientError::Protocol(e.to_string()))?
        .ok_or_else(|| ClientError::Protocol("short frame".into()))?;
    // `frame_len` and `decode_frame` read the same length field.
    assert_eq!(used, total, "a frame's length read twice differs");
    let answer = Response::decode(&frame).map_err(|e| ClientError::Protocol(e.to_string()))?;
    Ok((frame.request_id, answer, total))
}

impl PendingAck {
    /// Waits for the answer: the durable position, or why it was refused.
    pub fn wait(self) -> Result<Ack, ClientError> {
        let answer = self
            .answer
            .recv()
            .map_err(|_| ClientError::OutcomeUnknown)??;
        answer_to_ack(answer)
    }

    /// [`PendingAck::wait`] for at most `timeout`; then the outcome is unknown
    /// ([`ClientError::OutcomeUnknown`]) and the client had better be dropped, so that a
    /// late answer reaches nobody.
    pub fn wait_timeout(self, timeout: Duration) -> Result<Ack, ClientError> {
        let answer = self
            .answer
            .recv_timeout(timeout)
            .map_err(|_| ClientError::OutcomeUnknown)??;
        answer_to_ack(answer)
    }
}

fn answer_to_ack(answer: Response) -> Result<Ack, ClientError> {
    match answer {
        Response::Ack {
            lsn,
            events,
            service_micros,
            positions,
        } => Ok(Ack {
            lsn,
            events,
            server_time: Some(Duration::from_micros(service_micros.into())),
            positions,
        }),
        Response::TryLater {
            retry_after_ms,
            message,
        } => Err(ClientError::TryLater {
            retry_after: Duration::from_millis(retry_after_ms.into()),
            message,
        }),
        Response::Error { code, message } => Err(ClientError::Refused {
            code: code_name(code),
            message,
        }),
        Response::Events { .. } => Err(ClientError::Protocol(
            "EVENTS answered a request that is not a subscription".into(),
        )),
    }
}

fn code_name(code: ErrorCode) -> String {
    match code {
        ErrorCode::MalformedFrame => "malformed_frame".into(),
        ErrorCode::UnsupportedVersion => "unsupported_version".into(),
        ErrorCode::BadRequest => "bad_request".into(),
        ErrorCode::UnknownStream => "unknown_stream".into(),
        ErrorCode::SchemaMismatch => "schema_mismatch".into(),
        ErrorCode::Unauthorized => "unauthorized".into(),
        ErrorCode::TooLarge => "too_large".into(),
        ErrorCode::Unavailable => "unavailable".into(),
        ErrorCode::Internal => "internal".into(),
        ErrorCode::Gone => "gone".into(),
        ErrorCode::Other(code) => format!("error {code}"),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().ignore_poison()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A connection's socket keeps alive, as the kernel reads its options back.
    #[test]
    fn a_connection_keeps_alive() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let connection = Connection::open(listener.local_addr().unwrap()).unwrap();
        let writer = lock(&connection.writer);
        let socket = socket2::SockRef::from(&*writer);
        assert!(socket.keepalive().unwrap());
        assert_eq!(
            socket.tcp_keepalive_time().unwrap(),
            Duration::from_secs(60)
        );
        assert_eq!(socket.tcp_keepalive_retries().unwrap(), 3);
    }

    /// A server that takes connections and reads what comes, but never answers.
    fn silent_server() -> (SocketAddr, Arc<AtomicU64>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicU64::new(0));
        let counted = accepted.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                counted.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut stream, &mut std::io::sink());
                });
            }
        });
        (addr, accepted)
    }

    #[test]
    fn a_commit_the_server_never_answers_ends_unknown_and_the_next_one_reconnects() {
        let (addr, accepted) = silent_server();
        let client = BinaryClient::connect(addr, None).unwrap();
        let timeout = Duration::from_millis(200);
        let started = std::time::Instant::now();
        let outcome = client.commit_position_within("s", "c", Some(7), timeout);
        assert!(
            matches!(outcome, Err(ClientError::OutcomeUnknown)),
            "{outcome:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        // The hung connection was given up: the next commit goes on a new one.
        let again = client.commit_position_within("s", "c", Some(7), timeout);
        assert!(
            matches!(again, Err(ClientError::OutcomeUnknown)),
            "{again:?}"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while accepted.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}

//! The binary protocol over one TCP connection: requests are written by the calling thread,
//! answers read by a reader thread and handed to whoever waits for that request id. Many
//! requests may be in flight at once (pipelining); see `docs/protocol.md`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tidemark_core::sync::IgnorePoison;
use tidemark_core::EventBatch;
use tidemark_protocol::{decode_frame, encode_append, frame_len, ErrorCode, Request, Response};

use crate::{Ack, ClientError};

/// Answers are small; anything larger is a broken stream.
const MAX_ANSWER_BYTES: usize = 1 << 20;

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

#[derive(Default)]
struct Waiting {
    answers: HashMap<u64, SyncSender<Result<Response, ClientError>>>,
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
    pub fn send_append_tagged(
        &self,
        stream: &str,
        batch: &EventBatch,
        producer: Option<(u64, u64)>,
    ) -> Result<PendingAck, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::with_capacity(batch.heap_bytes() + 64);
        encode_append(id, stream, batch, producer, &mut frame)
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
        let mut frame = Vec::with_capacity(command.len() + 32);
        Request::Command { command }
            .encode(id, &mut frame)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.send(id, &frame)
    }

    /// A round trip to the server.
    pub fn ping(&self) -> Result<(), ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::new();
        Request::Ping
            .encode(id, &mut frame)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.send(id, &frame)?.wait().map(|_| ())
    }

    fn send(&self, id: u64, frame: &[u8]) -> Result<PendingAck, ClientError> {
        let connection = self.connection()?;
        let (tx, rx) = sync_channel(1);
        {
            let mut waiting = lock(&connection.waiting);
            if waiting.broken {
                drop(waiting);
                self.forget(&connection);
                return Err(ClientError::OutcomeUnknown);
            }
            let earlier = waiting.answers.insert(id, tx);
            assert!(earlier.is_none(), "request id {id} was given twice");
        }
        let written = lock(&connection.writer).write_all(frame);
        if let Err(e) = written {
            lock(&connection.waiting).answers.remove(&id);
            self.forget(&connection);
            return Err(e.into());
        }
        Ok(PendingAck { answer: rx })
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
            let mut frame = Vec::new();
            Request::Auth { token }
                .encode(id, &mut frame)
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
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

/// Reads answers until the stream ends or breaks, then fails every request still waiting.
fn read_answers(mut stream: TcpStream, waiting: Arc<Mutex<Waiting>>) {
    let mut buf = Vec::new();
    while let Ok((id, answer)) = read_answer(&mut stream, &mut buf) {
        let waiter = lock(&waiting).answers.remove(&id);
        if let Some(waiter) = waiter {
            let _ = waiter.send(Ok(answer));
        }
    }
    let mut waiting = lock(&waiting);
    waiting.broken = true;
    for (_, waiter) in waiting.answers.drain() {
        let _ = waiter.send(Err(ClientError::OutcomeUnknown));
    }
}

fn read_answer(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(u64, Response), ClientError> {
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
    Ok((frame.request_id, answer))
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
        } => Ok(Ack {
            lsn,
            events,
            server_time: Some(Duration::from_micros(service_micros.into())),
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
        ErrorCode::Other(code) => format!("error {code}"),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().ignore_poison()
}

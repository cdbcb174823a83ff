//! A persistent connection to one peer: a request and its answer at a time, reopened
//! (through the [`Dialer`]) on first use and after any failure.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;

use crate::dialer::Dialer;
use crate::transport::{is_reusable, read_frame, write_frame_parts, Halves, RESPONSE};

/// Why a request to a peer got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Nothing of the request left this node (no connection could be opened, or the node
    /// is isolated): the peer did nothing.
    #[error("{0}")]
    NotSent(io::Error),
    /// The request was sent, or partly sent, and no answer came: the peer may have acted on it.
    #[error("{0}")]
    Unanswered(io::Error),
}

impl From<CallError> for io::Error {
    fn from(e: CallError) -> io::Error {
        match e {
            CallError::NotSent(e) | CallError::Unanswered(e) => e,
        }
    }
}

/// A persistent connection to one peer, opened on first use and after any failure.
pub struct Conn {
    addr: String,
    io: Option<Halves>,
    next_id: u64,
    dialer: Dialer,
}

impl Conn {
    pub fn new(addr: String, dialer: Dialer) -> Conn {
        Conn {
            addr,
            io: None,
            next_id: 1,
            dialer,
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends a request whose body is `parts` back to back (and `then`: more frames, e.g.
    /// snapshot chunks) and waits for the response body, all within `timeout`. Any failure
    /// drops the connection; the next call reconnects.
    pub async fn call(
        &mut self,
        kind: u8,
        parts: &[&[u8]],
        timeout: Duration,
        then: impl AsyncFnOnce(&mut BufWriter<OwnedWriteHalf>, u64) -> io::Result<()>,
    ) -> Result<Vec<u8>, CallError> {
        let Conn {
            addr,
            io: open,
            next_id,
            dialer,
        } = self;
        if let Err(e) = dialer.check() {
            *open = None;
            return Err(CallError::NotSent(e));
        }
        let id = *next_id;
        *next_id += 1;
        let deadline = tokio::time::Instant::now() + timeout;
        // The open connection, or a new one when there is none or the peer closed it (a
        // request written to a closed one would be lost, its outcome unknown).
        if open.as_mut().is_some_and(|(r, _)| !is_reusable(r)) {
            *open = None;
        }
        if open.is_none() {
            let halves = dialer.connect(addr, timeout).await;
            *open = Some(halves.map_err(CallError::NotSent)?);
        }
        let Some((r, w)) = open.as_mut() else {
            return Err(CallError::NotSent(io::ErrorKind::NotConnected.into()));
        };
        let outcome = tokio::time::timeout_at(deadline, async {
            write_frame_parts(w, kind, id, parts).await?;
            then(w, id).await?;
            w.flush().await?;
            let frame = read_frame(r).await?;
            if frame.kind != kind | RESPONSE || frame.id != id {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "response kind {} id {} to request kind {kind} id {id}",
                        frame.kind, frame.id
                    ),
                ));
            }
            Ok(frame.body)
        })
        .await
        .unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer from {addr} in {timeout:?}"),
            ))
        });
        outcome.map_err(|e| {
            *open = None;
            CallError::Unanswered(e)
        })
    }
}

//! [`ConsumerStream`]: a [`Consumer`] for async programs, on any runtime.
//!
//! Why threads rather than an async transport: the client is blocking by design, and the
//! consumer's protocol work (subscribing, credit, resuming after its last event on another
//! server, refusals) is one piece of code that both faces share. The stream runs the
//! consumer on a thread of its own and takes its batches through a channel holding one, so
//! at most one batch waits in memory beyond the credit the server may send ahead; a commit
//! goes through a second thread with its own connection, since the reading one may be
//! waiting for events for as long as the stream is idle. The channels are tokio's, which
//! need no tokio runtime: any executor can poll them.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::mpsc as std_mpsc;
use std::task::{Context, Poll};
use std::thread;
use std::time::Instant;

use tidemark_core::EventBatch;
use tokio::sync::{mpsc, oneshot};

use crate::consumer::{is_transient, pause_after, CommitTarget, Consumer, ConsumerEnd};
use crate::{BinaryClient, ClientError};

/// A batch the consumer handed out, with the position of its last event.
type Handed = Result<(EventBatch, u64), ClientError>;
/// A commit of a position, and where to say how it went.
type CommitRequest = (u64, oneshot::Sender<Result<(), ClientError>>);

/// Follows one stream as [`Consumer`] does, as a [`futures_core::Stream`] of batches (or
/// with [`ConsumerStream::next`], without a stream trait in scope). After an error the
/// stream ends: a new consumer starting after [`ConsumerStream::position`] resumes. Dropping
/// it ends the subscription on the server. Made by [`Consumer::into_stream`]:
///
/// ```no_run
/// use tidemark_client::{Consumer, ConsumerOptions, StartAt};
/// # fn process(_: &tidemark_core::EventBatch) {}
/// # async fn run() -> Result<(), tidemark_client::ClientError> {
/// let options = ConsumerOptions {
///     name: Some("billing".into()),
///     start: StartAt::Committed,
///     ..ConsumerOptions::default()
/// };
/// let mut batches = Consumer::new(&["127.0.0.1:8081"], "ticks", options).into_stream();
/// while let Some(batch) = batches.next().await {
///     process(&batch?);
///     batches.commit().await?;
/// }
/// # Ok(()) }
/// ```
pub struct ConsumerStream {
    batches: mpsc::Receiver<Handed>,
    end: ConsumerEnd,
    /// The position of the last event handed out.
    position: Option<u64>,
    committed: Option<u64>,
    target: CommitTarget,
    /// The committer thread's queue, once something was committed.
    commits: Option<std_mpsc::Sender<CommitRequest>>,
}

impl Consumer {
    /// This consumer as an async stream of batches, read on a thread of its own.
    pub fn into_stream(self) -> ConsumerStream {
        let end = self.end_handle();
        let target = self.commit_target();
        let (handed, batches) = mpsc::channel(1);
        let unread = handed.clone();
        if let Err(e) = thread::Builder::new()
            .name("tidemark-consumer".into())
            .spawn(move || read(self, handed))
        {
            // No thread, no reads: said as the stream's only item.
            let _ = unread.try_send(Err(ClientError::Io(e)));
        }
        drop(unread);
        ConsumerStream {
            batches,
            end,
            position: None,
            committed: None,
            target,
            commits: None,
        }
    }
}

/// The reading thread: hands out batches until the consumer is done, fails, or the stream
/// is dropped (its receiver closed).
fn read(mut consumer: Consumer, handed: mpsc::Sender<Handed>) {
    loop {
        let next = match consumer.next_batch() {
            Ok(Some(batch)) => match consumer.position() {
                Some(position) => Ok((batch, position)),
                None => Err(ClientError::Protocol("a batch without positions".into())),
            },
            Ok(None) => return,
            Err(e) => Err(e),
        };
        let failed = next.is_err();
        if handed.blocking_send(next).is_err() || failed {
            return;
        }
    }
}

impl ConsumerStream {
    /// The next batch of events (each with its position), waiting for it; `None` once a
    /// consumer that does not follow has caught up, or after an error.
    pub async fn next(&mut self) -> Option<Result<EventBatch, ClientError>> {
        poll_fn(|cx| self.poll_batch(cx)).await
    }

    /// The position of the last event handed out.
    pub fn position(&self) -> Option<u64> {
        self.position
    }

    /// Commits the position of the last event handed out under the consumer's name, as
    /// [`Consumer::commit`]: call it once what was handed out is processed.
    pub async fn commit(&mut self) -> Result<(), ClientError> {
        let Some(position) = self.position else {
            return Ok(());
        };
        if self.committed == Some(position) {
            return Ok(());
        }
        let (reply, answer) = oneshot::channel();
        self.committer()?
            .send((position, reply))
            .map_err(|_| ClientError::Protocol("the committer thread ended".into()))?;
        answer
            .await
            .map_err(|_| ClientError::Protocol("the committer thread ended".into()))??;
        self.committed = Some(position);
        Ok(())
    }

    fn committer(&mut self) -> Result<&std_mpsc::Sender<CommitRequest>, ClientError> {
        let Some(name) = self.target.name.clone() else {
            return Err(ClientError::Protocol("commit needs a consumer name".into()));
        };
        if self.commits.is_none() {
            let (requests, queue) = std_mpsc::channel();
            let target = CommitTarget {
                name: Some(name),
                servers: self.target.servers.clone(),
                stream: self.target.stream.clone(),
                token: self.target.token.clone(),
                retry_for: self.target.retry_for,
            };
            thread::Builder::new()
                .name("tidemark-committer".into())
                .spawn(move || commit_all(&target, queue))?;
            self.commits = Some(requests);
        }
        self.commits
            .as_ref()
            .ok_or_else(|| ClientError::Protocol("no committer".into()))
    }

    fn poll_batch(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<EventBatch, ClientError>>> {
        self.batches.poll_recv(cx).map(|handed| {
            handed.map(|next| {
                next.map(|(batch, position)| {
                    self.position = Some(position);
                    batch
                })
            })
        })
    }
}

/// The committer thread: commits each position asked for on a connection of its own. A
/// failure another server (or the same, later) may not have is tried again, on the next
/// server of the list, for up to the consumer's `retry_for`, as the consumer's reads are;
/// what still fails is returned. Ends when the stream is dropped.
fn commit_all(target: &CommitTarget, queue: std_mpsc::Receiver<CommitRequest>) {
    let name = target.name.as_deref().unwrap_or_default();
    let mut client: Option<BinaryClient> = None;
    let mut server = 0;
    for (position, reply) in queue {
        let started = Instant::now();
        let result = loop {
            let result = match (client.take(), target.servers.len()) {
                (_, 0) => Err(ClientError::Protocol("a consumer needs a server".into())),
                (Some(connected), _) => {
                    let committed = connected.commit_position(&target.stream, name, Some(position));
                    client = Some(connected);
                    committed
                }
                (None, servers) => BinaryClient::connect(
                    target.servers[server % servers].as_str(),
                    target.token.as_deref(),
                )
                .and_then(|connected| {
                    let committed = connected.commit_position(&target.stream, name, Some(position));
                    client = Some(connected);
                    committed
                }),
            };
            match result {
                Err(e)
                    if is_transient(&e, target.servers.len())
                        && started.elapsed() < target.retry_for =>
                {
                    client = None;
                    server += 1;
                    thread::sleep(pause_after(&e));
                }
                Err(e) => {
                    client = None;
                    break Err(e);
                }
                Ok(()) => break Ok(()),
            }
        };
        let _ = reply.send(result);
    }
}

impl futures_core::Stream for ConsumerStream {
    type Item = Result<EventBatch, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_batch(cx)
    }
}

impl Drop for ConsumerStream {
    /// Ends the subscription by closing its connection; the reading thread then ends at
    /// once. Not joined: a drop in async code must not block.
    fn drop(&mut self) {
        self.end.end();
    }
}

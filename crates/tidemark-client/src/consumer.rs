//! A consumer of one stream over the binary protocol's subscriptions: batches of events in
//! the order they were appended, each with its position, resuming by itself after the last
//! one it handed out when its connection or its server dies (on another server of the list:
//! positions are the same on every node of a cluster), and committing its position under
//! its name when asked to (docs/consuming.md).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_core::sync::IgnorePoison;
use tidemark_core::EventBatch;
use tidemark_protocol::Start;

use crate::binary::{BinaryClient, Events, Subscription, SubscriptionEnd};
use crate::ClientError;

/// Where a [`Consumer`] starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartAt {
    /// After this position.
    After(u64),
    /// At the earliest event the stream holds.
    Earliest,
    /// At the first position whose event starts at or after this time (nanoseconds).
    Time(i64),
    /// After the position the consumer's name committed (the earliest, if it never did).
    Committed,
}

/// How a [`Consumer`] reads.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// A named consumer: [`StartAt::Committed`] resumes after its committed position, and
    /// [`Consumer::commit`] keeps its position on the server.
    pub name: Option<String>,
    pub start: StartAt,
    /// Keep reading as the stream grows (else end once caught up).
    pub follow: bool,
    /// Bytes the server may send ahead of the consumer (its credit).
    pub credit_bytes: u32,
    /// How long to keep trying the servers, without receiving anything, before giving up.
    pub retry_for: Duration,
    /// The read token (the write token, to commit), when the servers have tokens.
    pub token: Option<String>,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions {
            name: None,
            start: StartAt::Earliest,
            follow: true,
            credit_bytes: 4 << 20,
            retry_for: Duration::from_secs(60),
            token: None,
        }
    }
}

/// Follows one stream: [`Consumer::next_batch`] (or the iterator) gives its events in
/// position order, each once, across reconnects. As docs/consuming.md shows it:
///
/// ```no_run
/// use tidemark_client::{Consumer, ConsumerOptions, StartAt};
/// # fn process(_: &tidemark_core::EventBatch) {}
/// # fn main() -> Result<(), tidemark_client::ClientError> {
/// let options = ConsumerOptions {
///     name: Some("billing".into()),
///     start: StartAt::Committed,
///     ..ConsumerOptions::default()
/// };
/// let mut consumer = Consumer::new(&["127.0.0.1:8081"], "ticks", options);
/// while let Some(batch) = consumer.next_batch()? {
///     process(&batch);
///     consumer.commit()?;
/// }
/// # Ok(()) }
/// ```
pub struct Consumer {
    servers: Vec<String>,
    stream: String,
    options: ConsumerOptions,
    /// The server tried next, as an index into `servers`.
    server: usize,
    open: Option<(BinaryClient, Subscription)>,
    /// The position of the last event handed out.
    position: Option<u64>,
    committed: Option<u64>,
    done: bool,
    end: ConsumerEnd,
}

impl Consumer {
    /// A consumer of `stream` on the first of `servers` (binary protocol addresses) that
    /// answers; it connects at the first [`Consumer::next_batch`].
    pub fn new(servers: &[impl ToString], stream: &str, options: ConsumerOptions) -> Consumer {
        Consumer {
            servers: servers.iter().map(ToString::to_string).collect(),
            stream: stream.to_string(),
            options,
            server: 0,
            open: None,
            position: None,
            committed: None,
            done: false,
            end: ConsumerEnd::default(),
        }
    }

    /// Ends this consumer from another thread ([`ConsumerEnd::end`]).
    pub fn end_handle(&self) -> ConsumerEnd {
        self.end.clone()
    }

    /// The servers, the stream, and the name and token a commit needs.
    pub(crate) fn commit_target(&self) -> CommitTarget {
        CommitTarget {
            servers: self.servers.clone(),
            stream: self.stream.clone(),
            name: self.options.name.clone(),
            token: self.options.token.clone(),
            retry_for: self.options.retry_for,
        }
    }

    /// The position of the last event handed out.
    pub fn position(&self) -> Option<u64> {
        self.position
    }

    /// The next batch of events (each with its position: [`EventBatch::position_at`]),
    /// waiting for it; `None` once a consumer that does not follow has caught up. A
    /// connection or server that fails is left for the next server of the list, after the
    /// last position handed out, for up to `retry_for` without progress; refusals (events
    /// removed before they were read: code `gone`; an unknown stream) are returned.
    pub fn next_batch(&mut self) -> Result<Option<EventBatch>, ClientError> {
        let mut failing_since: Option<Instant> = None;
        loop {
            if self.end.is_ended() {
                // Its connection is closed: a commit after the end takes a new one.
                self.open = None;
                return Ok(None);
            }
            if self.done {
                return Ok(None);
            }
            match self.receive() {
                Ok(Some(events)) => {
                    let Events {
                        first_position,
                        events,
                        ..
                    } = events;
                    // Each event once, in order: a subscription resumes after the last.
                    if self.position.is_some_and(|p| first_position != p + 1) {
                        self.open = None;
                        return Err(ClientError::Protocol(format!(
                            "events from position {first_position} after {:?}",
                            self.position
                        )));
                    }
                    // The decoder refuses an EVENTS frame without events.
                    let count = events.len() as u64;
                    self.position = Some(first_position + count.saturating_sub(1));
                    return Ok(Some(events));
                }
                Ok(None) => self.done = true,
                Err(e) if !self.is_transient(&e) => {
                    // Asked again, it subscribes again after the last position: the same
                    // refusal, unless what caused it changed. Never an end in silence.
                    self.open = None;
                    return Err(e);
                }
                Err(e) => {
                    self.open = None;
                    self.server += 1;
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > self.options.retry_for {
                        return Err(e);
                    }
                    std::thread::sleep(pause_after(&e));
                }
            }
        }
    }

    fn is_transient(&self, e: &ClientError) -> bool {
        is_transient(e, self.servers.len())
    }

    /// Commits the position of the last event handed out under the consumer's name: a
    /// consumer of that name then starts after it ([`StartAt::Committed`]). Call it once
    /// what was handed out is processed: at least once delivery.
    pub fn commit(&mut self) -> Result<(), ClientError> {
        let Some(name) = self.options.name.clone() else {
            return Err(ClientError::Protocol("commit needs a consumer name".into()));
        };
        let Some(position) = self.position else {
            return Ok(());
        };
        if self.committed == Some(position) {
            return Ok(());
        }
        match &self.open {
            Some((client, _)) => client.commit_position(&self.stream, &name, Some(position))?,
            None => self
                .client()?
                .commit_position(&self.stream, &name, Some(position))?,
        }
        self.committed = Some(position);
        Ok(())
    }

    /// The next events of the open subscription, subscribing first (after the last
    /// position handed out) when there is none.
    fn receive(&mut self) -> Result<Option<Events>, ClientError> {
        if self.open.is_none() {
            let client = self.client()?;
            let name = self.options.name.as_deref().unwrap_or_default();
            let start = match (self.position, &self.options.start) {
                (Some(position), _) => Start::After(position),
                (None, StartAt::After(position)) => Start::After(*position),
                (None, StartAt::Earliest) => Start::Earliest,
                (None, StartAt::Time(time)) => Start::FromTime(*time),
                (None, StartAt::Committed) if name.is_empty() => Start::Earliest,
                (None, StartAt::Committed) => Start::Consumer(name),
            };
            let subscription = client.subscribe(
                &self.stream,
                start,
                self.options.credit_bytes,
                self.options.follow,
            )?;
            self.end.watch(subscription.end_handle());
            self.open = Some((client, subscription));
        }
        match self.open.as_mut() {
            Some((_, subscription)) => subscription.next_events(),
            None => Ok(None),
        }
    }

    /// A client of the current server (a new one: a subscription's connection is its own).
    fn client(&self) -> Result<BinaryClient, ClientError> {
        if self.servers.is_empty() {
            return Err(ClientError::Protocol("a consumer needs a server".into()));
        }
        let server = &self.servers[self.server % self.servers.len()];
        BinaryClient::connect(server.as_str(), self.options.token.as_deref())
    }
}

/// Whether another server (or the same, later) may serve what failed: a lost connection, a
/// server busy or stopping; with several servers, a stream one of them does not know yet (a
/// cluster node that has not applied its creation).
pub(crate) fn is_transient(e: &ClientError, servers: usize) -> bool {
    match e {
        ClientError::Io(_) | ClientError::OutcomeUnknown | ClientError::TryLater { .. } => true,
        ClientError::Refused { code, .. } => {
            code == "unavailable" || (code == "unknown_stream" && servers > 1)
        }
        _ => false,
    }
}

/// How long to wait before trying again after the transient failure `e`.
pub(crate) fn pause_after(e: &ClientError) -> Duration {
    let wait = match e {
        ClientError::TryLater { retry_after, .. } => *retry_after,
        _ => Duration::from_millis(50),
    };
    wait.clamp(Duration::from_millis(10), Duration::from_secs(5))
}

/// Ends a [`Consumer`] from a thread other than the one reading it: a `next_batch` waiting
/// for events answers `None`, and so does every later one. Cloned freely; what the consumer
/// handed out stays handed out, and it may still commit it.
#[derive(Clone, Default)]
pub struct ConsumerEnd(Arc<Mutex<Ending>>);

#[derive(Default)]
struct Ending {
    ended: bool,
    /// The consumer's open subscription, to end on the server.
    current: Option<SubscriptionEnd>,
}

impl ConsumerEnd {
    /// Ends the consumer at once: its open subscription's connection is closed (the server
    /// ends the subscription when it sees that), so a consumer waiting for events, or for a
    /// server that stopped answering, returns.
    pub fn end(&self) {
        let mut ending = self.0.lock().ignore_poison();
        ending.ended = true;
        if let Some(current) = ending.current.take() {
            current.close();
        }
    }

    fn is_ended(&self) -> bool {
        self.0.lock().ignore_poison().ended
    }

    /// Takes the consumer's new subscription, ending it at once when the consumer was
    /// ended while it subscribed: under one lock with [`ConsumerEnd::end`], so an end
    /// never misses a subscription.
    fn watch(&self, subscription: SubscriptionEnd) {
        let mut ending = self.0.lock().ignore_poison();
        if ending.ended {
            subscription.close();
        } else {
            ending.current = Some(subscription);
        }
    }
}

/// Where a consumer's commits go, for a committer apart from the consumer's reads.
pub(crate) struct CommitTarget {
    pub servers: Vec<String>,
    pub stream: String,
    pub name: Option<String>,
    pub token: Option<String>,
    pub retry_for: Duration,
}

impl Iterator for Consumer {
    type Item = Result<EventBatch, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch().transpose()
    }
}

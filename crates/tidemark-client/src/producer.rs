//! A batching producer: events go into a buffer that is sent as one batch when it holds
//! `buffer_bytes` or its oldest event is `max_delay` old. Up to `max_in_flight` batches are
//! being sent at once; while that many are unacknowledged the buffer cannot be handed over,
//! and a push either waits ([`FullBuffer::Block`]) or fails with
//! [`ClientError::WouldBlock`] ([`FullBuffer::WouldBlock`]). Batches refused with
//! TRY_LATER / 429 are sent again after the server's hint, for up to `retry_for`.
//!
//! Nothing is dropped silently: once a batch fails for good, every later call returns the
//! failure, and [`Producer::flush`] reports it.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tidemark_core::sync::IgnorePoison;
use tidemark_core::{BatchBuilder, EventBatch, Schema, Timestamp, Value};

use crate::{Ack, BinaryClient, ClientError, HttpClient};

/// How a batch reaches the server, with an optional (producer id, sequence) tag.
pub trait Transport: Send + Sync + 'static {
    fn append(
        &self,
        stream: &str,
        batch: &EventBatch,
        producer: Option<(u64, u64)>,
    ) -> Result<Ack, ClientError>;
}

impl Transport for BinaryClient {
    fn append(
        &self,
        stream: &str,
        batch: &EventBatch,
        producer: Option<(u64, u64)>,
    ) -> Result<Ack, ClientError> {
        self.send_append_tagged(stream, batch, producer)?.wait()
    }
}

impl Transport for HttpClient {
    fn append(
        &self,
        stream: &str,
        batch: &EventBatch,
        producer: Option<(u64, u64)>,
    ) -> Result<Ack, ClientError> {
        self.append_tagged(stream, batch, producer)
    }
}

/// What a push does when `max_in_flight` batches are unacknowledged and the buffer is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FullBuffer {
    Block,
    WouldBlock,
}

#[derive(Debug, Clone)]
pub struct ProducerOptions {
    pub buffer_bytes: usize,
    pub max_delay: Duration,
    pub max_in_flight: usize,
    pub full: FullBuffer,
    /// How long a batch is retried while the server answers TRY_LATER / 429.
    pub retry_for: Duration,
    /// Tag every batch with this producer's id and a sequence number, and also retry (for
    /// `retry_for`) a batch whose outcome is unknown (the connection broke, the cluster had
    /// no leader): a cluster applies a tagged batch once however often it arrives. Only
    /// for a cluster — a single server does not deduplicate, and a retry could store a
    /// batch twice.
    pub idempotent: bool,
}

impl Default for ProducerOptions {
    fn default() -> Self {
        ProducerOptions {
            buffer_bytes: 1 << 20,
            max_delay: Duration::from_millis(100),
            max_in_flight: 4,
            full: FullBuffer::Block,
            retry_for: Duration::from_secs(60),
            idempotent: false,
        }
    }
}

/// A batching producer for one stream.
pub struct Producer {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

struct Shared {
    transport: Arc<dyn Transport>,
    stream: String,
    options: ProducerOptions,
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    buffer: BatchBuilder,
    buffer_bytes: usize,
    oldest: Option<Instant>,
    /// Sealed batches no sender has taken yet.
    queue: VecDeque<EventBatch>,
    /// Sealed batches not yet answered (queued or being sent).
    unacknowledged: usize,
    acknowledged_events: u64,
    failure: Option<String>,
    closing: bool,
}

impl State {
    /// What holds between any two changes of the state (each made under its lock): at most
    /// `max_in_flight` batches are out, those queued among them; the buffer's size, its
    /// oldest event's time and its rows are there together or not at all.
    fn check(&self, options: &ProducerOptions) {
        assert!(self.queue.len() <= self.unacknowledged);
        assert!(self.unacknowledged <= options.max_in_flight);
        assert_eq!(self.buffer.is_empty(), self.buffer_bytes == 0);
        assert_eq!(self.buffer.is_empty(), self.oldest.is_none());
    }
}

impl Producer {
    pub fn new(
        transport: Arc<dyn Transport>,
        stream: &str,
        schema: Arc<Schema>,
        options: ProducerOptions,
    ) -> Producer {
        let mut options = options;
        options.max_in_flight = options.max_in_flight.max(1);
        options.buffer_bytes = options.buffer_bytes.max(1);
        let shared = Arc::new(Shared {
            transport,
            stream: stream.to_string(),
            state: Mutex::new(State {
                buffer: BatchBuilder::new(schema, 0),
                buffer_bytes: 0,
                oldest: None,
                queue: VecDeque::new(),
                unacknowledged: 0,
                acknowledged_events: 0,
                failure: None,
                closing: false,
            }),
            changed: Condvar::new(),
            options,
        });
        let mut threads = Vec::new();
        for _ in 0..shared.options.max_in_flight {
            let shared = shared.clone();
            threads.push(std::thread::spawn(move || shared.send_batches()));
        }
        let timer = shared.clone();
        threads.push(std::thread::spawn(move || timer.seal_old_buffers()));
        Producer { shared, threads }
    }

    /// Adds one event. Invalid events are refused here, not at the server.
    pub fn push(
        &self,
        tstart: Timestamp,
        tend: Option<Timestamp>,
        values: &[Value],
    ) -> Result<(), ClientError> {
        let mut state = self.shared.make_room()?;
        state.buffer.push_row(tstart, tend, values)?;
        state.buffer_bytes += row_bytes(tend, values);
        self.shared.after_push(state);
        Ok(())
    }

    /// Adds the events of `batch` (which must have the producer's schema) from row `from`
    /// on, cutting it at buffer boundaries, and returns the row where it stopped:
    /// `batch.len()` once every row is in. In non-blocking mode a full buffer stops it early
    /// (with [`ClientError::WouldBlock`] if not even one row fit); call again from there.
    pub fn push_batch(&self, batch: &EventBatch, from: usize) -> Result<usize, ClientError> {
        let per_event = (batch.heap_bytes() / batch.len().max(1)).max(1);
        let mut row = from;
        while row < batch.len() {
            let mut state = match self.shared.make_room() {
                Ok(state) => state,
                Err(ClientError::WouldBlock) if row > from => return Ok(row),
                Err(e) => return Err(e),
            };
            let room = self
                .shared
                .options
                .buffer_bytes
                .saturating_sub(state.buffer_bytes);
            let take = (room / per_event).clamp(1, batch.len() - row);
            state.buffer.extend_from(batch, row..row + take)?;
            state.buffer_bytes += take * per_event;
            row += take;
            self.shared.after_push(state);
        }
        Ok(row)
    }

    /// Sends what is buffered and waits until everything pushed so far is acknowledged
    /// (durable). Returns the events acknowledged since the producer started.
    pub fn flush(&self) -> Result<u64, ClientError> {
        let shared = &self.shared;
        let mut state = shared.lock();
        loop {
            if let Some(failure) = &state.failure {
                return Err(ClientError::Refused {
                    code: "batch_failed".into(),
                    message: failure.clone(),
                });
            }
            if !state.buffer.is_empty() && state.unacknowledged < shared.options.max_in_flight {
                shared.seal(&mut state);
                continue;
            }
            if state.buffer.is_empty() && state.unacknowledged == 0 {
                return Ok(state.acknowledged_events);
            }
            state = shared.wait(state);
        }
    }

    /// Flushes, then stops the producer's threads.
    pub fn close(mut self) -> Result<u64, ClientError> {
        let flushed = self.flush();
        self.stop();
        flushed
    }

    fn stop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.changed.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Producer {
    /// Sends what is buffered (waiting for it) before the threads stop; use
    /// [`Producer::close`] to see whether that worked.
    fn drop(&mut self) {
        let _ = self.flush();
        self.stop();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().ignore_poison()
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(state).ignore_poison()
    }

    /// The state, once the buffer may take another event: a full buffer is handed over
    /// first, waiting (or refusing) while `max_in_flight` batches are unacknowledged.
    fn make_room(&self) -> Result<MutexGuard<'_, State>, ClientError> {
        let mut state = self.lock();
        loop {
            if let Some(failure) = &state.failure {
                return Err(ClientError::Refused {
                    code: "batch_failed".into(),
                    message: failure.clone(),
                });
            }
            if state.closing {
                return Err(ClientError::Closed);
            }
            if state.buffer_bytes < self.options.buffer_bytes {
                return Ok(state);
            }
            if state.unacknowledged < self.options.max_in_flight {
                self.seal(&mut state);
                return Ok(state);
            }
            if self.options.full == FullBuffer::WouldBlock {
                return Err(ClientError::WouldBlock);
            }
            state = self.wait(state);
        }
    }

    fn after_push(&self, mut state: MutexGuard<'_, State>) {
        state.oldest.get_or_insert_with(Instant::now);
        if state.buffer_bytes >= self.options.buffer_bytes
            && state.unacknowledged < self.options.max_in_flight
        {
            self.seal(&mut state);
        }
        state.check(&self.options);
    }

    /// Hands the buffer to the senders.
    fn seal(&self, state: &mut State) {
        // Every caller seals a buffer that holds events, with a batch's room in flight.
        assert!(!state.buffer.is_empty(), "an empty buffer sealed");
        assert!(state.unacknowledged < self.options.max_in_flight);
        let schema = state.buffer.schema().clone();
        let buffer = std::mem::replace(&mut state.buffer, BatchBuilder::new(schema, 0));
        state.queue.push_back(buffer.finish());
        state.unacknowledged += 1;
        state.buffer_bytes = 0;
        state.oldest = None;
        state.check(&self.options);
        self.changed.notify_all();
    }

    /// A sender thread: takes sealed batches and sends them, one at a time.
    ///
    /// Each sender tags its batches as a producer of its own: a cluster takes a sequence at
    /// or below the last one it applied for a producer as a duplicate, so the sequences of
    /// one producer id must reach it in order — true of one thread sending one batch at a
    /// time, not of batches sent side by side.
    fn send_batches(&self) {
        let producer_id = random_id();
        let mut sequence = 0;
        loop {
            let batch = {
                let mut state = self.lock();
                loop {
                    if let Some(batch) = state.queue.pop_front() {
                        break batch;
                    }
                    if state.closing {
                        return;
                    }
                    state = self.wait(state);
                }
            };
            sequence += 1;
            let tag = self.options.idempotent.then_some((producer_id, sequence));
            let outcome = self.send_with_retry(tag, &batch);
            let mut state = self.lock();
            assert!(state.unacknowledged > 0, "an answer to a batch not counted");
            state.unacknowledged -= 1;
            match outcome {
                // The whole batch is durable, also when a resent batch is answered as a
                // duplicate of the attempt whose answer was lost.
                Ok(_) => state.acknowledged_events += batch.len() as u64,
                Err(e) => {
                    state.failure.get_or_insert_with(|| {
                        format!(
                            "a batch of {} events was not acknowledged: {e}",
                            batch.len()
                        )
                    });
                }
            }
            state.check(&self.options);
            self.changed.notify_all();
        }
    }

    fn send_with_retry(
        &self,
        tag: Option<(u64, u64)>,
        batch: &EventBatch,
    ) -> Result<Ack, ClientError> {
        let started = Instant::now();
        loop {
            let outcome = self.transport.append(&self.stream, batch, tag);
            let wait = match &outcome {
                Err(ClientError::TryLater { retry_after, .. }) => *retry_after,
                Err(e) if tag.is_some() && unknown_outcome(e) => UNKNOWN_OUTCOME_RETRY,
                _ => return outcome,
            };
            if started.elapsed() + wait >= self.options.retry_for {
                return outcome;
            }
            std::thread::sleep(wait.min(Duration::from_secs(5)));
        }
    }

    /// The timer thread: seals a buffer whose oldest event is `max_delay` old.
    fn seal_old_buffers(&self) {
        let tick = (self.options.max_delay / 4).max(Duration::from_millis(1));
        let mut state = self.lock();
        while !state.closing {
            let old = state
                .oldest
                .is_some_and(|t| t.elapsed() >= self.options.max_delay);
            if old && state.unacknowledged < self.options.max_in_flight {
                self.seal(&mut state);
            }
            state = self
                .changed
                .wait_timeout(state, tick)
                .map(|(s, _)| s)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

/// The pause before a tagged batch whose outcome is unknown is sent again: about an
/// election's length, so the retry usually meets the new leader.
const UNKNOWN_OUTCOME_RETRY: Duration = Duration::from_millis(200);

/// Errors after which a batch may or may not have been stored: a tagged batch can be sent
/// again safely.
fn unknown_outcome(error: &ClientError) -> bool {
    match error {
        ClientError::OutcomeUnknown | ClientError::Io(_) => true,
        ClientError::Refused { code, .. } => code == "unavailable",
        _ => false,
    }
}

/// A random 64-bit id, from the standard library's randomly seeded hasher (no RNG
/// dependency for one number per sender thread).
fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

/// The bytes an event adds to a batch in wire form, near enough for sizing buffers.
fn row_bytes(tend: Option<Timestamp>, values: &[Value]) -> usize {
    let values: usize = values
        .iter()
        .map(|v| match v {
            Value::String(s) => s.len() + 4,
            Value::Bytes(b) => b.len() + 4,
            _ => 8,
        })
        .sum();
    8 + tend.map_or(0, |_| 8) + values
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loses the answer to every second attempt (as a broken connection would) and records
    /// the tags it saw.
    #[derive(Default)]
    struct Flaky {
        attempts: Mutex<Vec<Option<(u64, u64)>>>,
    }

    impl Transport for Flaky {
        fn append(
            &self,
            _stream: &str,
            batch: &EventBatch,
            producer: Option<(u64, u64)>,
        ) -> Result<Ack, ClientError> {
            let mut attempts = self.attempts.lock().unwrap();
            attempts.push(producer);
            if attempts.len() % 2 == 1 {
                return Err(ClientError::OutcomeUnknown);
            }
            Ok(Ack {
                lsn: attempts.len() as u64,
                events: batch.len() as u64,
                server_time: None,
                positions: None,
            })
        }
    }

    fn producer(transport: Arc<Flaky>, idempotent: bool) -> Producer {
        let schema = Arc::new(Schema::parse_spec("N:LONG").unwrap());
        Producer::new(
            transport,
            "s",
            schema,
            ProducerOptions {
                buffer_bytes: 1,
                max_in_flight: 1,
                idempotent,
                ..ProducerOptions::default()
            },
        )
    }

    #[test]
    fn an_idempotent_producer_resends_with_the_same_tag() {
        let transport = Arc::new(Flaky::default());
        let producer = producer(transport.clone(), true);
        for n in 0..3 {
            producer.push(n, None, &[Value::Long(n)]).unwrap();
        }
        assert_eq!(producer.close().unwrap(), 3);
        let attempts = transport.attempts.lock().unwrap().clone();
        assert_eq!(attempts.len(), 6, "each batch lost once, sent again once");
        let id = attempts[0].unwrap().0;
        let expected: Vec<_> = [1, 1, 2, 2, 3, 3].map(|seq| Some((id, seq))).into();
        assert_eq!(attempts, expected);
    }

    #[test]
    fn each_sender_is_a_producer_whose_sequences_arrive_in_order() {
        let transport = Arc::new(Flaky::default());
        let schema = Arc::new(Schema::parse_spec("N:LONG").unwrap());
        let producer = Producer::new(
            transport.clone(),
            "s",
            schema,
            ProducerOptions {
                buffer_bytes: 1,
                max_in_flight: 3,
                idempotent: true,
                ..ProducerOptions::default()
            },
        );
        for n in 0..30 {
            producer.push(n, None, &[Value::Long(n)]).unwrap();
        }
        assert_eq!(producer.close().unwrap(), 30);
        let attempts = transport.attempts.lock().unwrap().clone();
        let mut last: std::collections::HashMap<u64, u64> = Default::default();
        for (id, sequence) in attempts.into_iter().flatten() {
            let previous = last.insert(id, sequence).unwrap_or(0);
            assert!(
                sequence == previous || sequence == previous + 1,
                "producer {id}: {sequence} after {previous}"
            );
        }
        assert!(!last.is_empty() && last.len() <= 3, "{last:?}");
        assert_eq!(
            last.values().sum::<u64>(),
            30,
            "30 batches, each tagged once"
        );
    }

    #[test]
    fn a_plain_producer_does_not_resend_an_unknown_outcome() {
        let transport = Arc::new(Flaky::default());
        let producer = producer(transport.clone(), false);
        producer.push(1, None, &[Value::Long(1)]).unwrap();
        let err = producer.flush().unwrap_err();
        assert!(err.to_string().contains("not acknowledged"), "{err}");
        assert_eq!(transport.attempts.lock().unwrap().clone(), vec![None]);
    }
}

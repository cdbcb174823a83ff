//! W5 `consume`: what following a stream costs, measured the same way on every system.
//!
//! - **Live latency**: 64 KiB batches (W3's) sent at a fixed rate, each to a random one of S
//!   streams, while one consumer follows all S; a batch's latency runs from the moment it
//!   was *due* to be sent (so a slow send counts against the system: no coordinated
//!   omission) to the moment the consumer holds it. Everything is durable before it is
//!   visible, as appends are.
//! - **Catch-up**: a stream filled beforehand, read from its start to its end by 1, 10 or
//!   100 consumers at once, each on its own connection; aggregate MB/s of payload.
//! - **Idle subscriptions**: the server's resident memory per subscription that waits for
//!   events that do not come.
//!
//! The peers' adapters ([`crate::w5_peers`]) fill the same reports.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_client::{BinaryClient, ClientError, HttpClient, Subscription, SubscriptionEnd};
use tidemark_protocol::Start;
use tidemark_query::time::now_ns;

use crate::latency::{Latencies, LatencySummary};
use crate::process::{Sampler, Usage};
use crate::w3::{self, AppendConfig, Payload, Rate, ServerTarget};

pub use crate::w3::{BATCH_BYTES, RECORDS_PER_BATCH};

/// One live-latency step: S streams at a target rate.
#[derive(Debug, Clone)]
pub struct LatencyStep {
    pub streams: usize,
    pub target_mb_per_s: f64,
    /// Payload delivered to the consumer per second of the measured window.
    pub delivered_mb_per_s: f64,
    /// Due → received, of the batches due in the measured window; `None` if none arrived.
    pub latency: Option<LatencySummary>,
    /// Batches due in the window that were not sent by its end (the rate was more than the
    /// system, or the client, could do).
    pub behind: u64,
    /// The server's CPU and memory over the step.
    pub usage: Option<Usage>,
}

/// One catch-up step: `consumers` readers of one stream of `stream_bytes` payload.
#[derive(Debug, Clone)]
pub struct CatchUpStep {
    pub consumers: usize,
    pub stream_bytes: u64,
    /// `consumers × stream_bytes` over the time until the last consumer read the end.
    pub aggregate_mb_per_s: f64,
    pub usage: Option<Usage>,
}

/// Idle subscriptions: the server's RSS growth over `subscriptions` of them.
#[derive(Debug, Clone, Copy)]
pub struct IdleMemory {
    pub subscriptions: usize,
    pub bytes_per_subscription: f64,
}

/// Everything one system measured, steps that failed as their error next to the others.
#[derive(Debug, Clone)]
pub struct SystemReport {
    pub system: String,
    /// How durable an event is when a consumer can see it.
    pub durability: String,
    pub latency: Vec<Result<LatencyStep, String>>,
    pub catch_up: Vec<Result<CatchUpStep, String>>,
    pub idle: Option<Result<IdleMemory, String>>,
}

/// What every system is asked to run.
#[derive(Debug, Clone)]
pub struct ConsumePlan {
    /// Stream (partition, key, subject) counts of the latency steps.
    pub stream_counts: Vec<usize>,
    /// The latency steps' target rate: half the disk's measured limit.
    pub target_mb_per_s: f64,
    pub warmup: std::time::Duration,
    pub duration: std::time::Duration,
    /// Payload bytes of the catch-up stream.
    pub catch_up_bytes: u64,
    pub consumer_counts: Vec<usize>,
    pub idle_subscriptions: usize,
}

impl ConsumePlan {
    /// Batches per second across all streams at the target rate.
    pub fn batches_per_second(&self) -> f64 {
        self.target_mb_per_s * 1e6 / BATCH_BYTES as f64
    }

    /// Batches of the catch-up stream.
    pub fn catch_up_batches(&self) -> u64 {
        self.catch_up_bytes.div_ceil(BATCH_BYTES as u64)
    }
}

/// A plan small enough for the peers' smoke tests: seconds, not minutes.
#[cfg(test)]
pub(crate) fn tiny_plan() -> ConsumePlan {
    ConsumePlan {
        stream_counts: vec![1, 20],
        target_mb_per_s: 20.0,
        warmup: Duration::from_secs(1),
        duration: Duration::from_secs(2),
        catch_up_bytes: 32_000_000,
        consumer_counts: vec![1, 4],
        idle_subscriptions: 50,
    }
}

/// How much a Tidemark subscriber lets the server send ahead: a few 64 KiB batches, so a
/// follower is never waiting on its own grant.
const CREDIT_BYTES: u32 = 1 << 20;
/// The server takes at most this many subscriptions per connection (docs/protocol.md).
const SUBSCRIPTIONS_PER_CONNECTION: usize = 64;
/// How long after the measured window the consumers may still deliver what was sent in it.
const STRAGGLER_GRACE: Duration = Duration::from_secs(5);

/// The live-latency step on a Tidemark server: one follower per stream (a binary
/// subscription each, up to 64 on a connection), then W3's producer at the plan's rate.
pub fn tidemark_latency(
    server: &ServerTarget,
    plan: &ConsumePlan,
    streams: usize,
    progress: bool,
) -> Result<LatencyStep, ClientError> {
    let http = HttpClient::new(&server.http, server.token.as_deref());
    let spec = w3::schema().to_spec();
    for i in 0..streams {
        http.create_stream(&w3::stream_name(i), &spec)?;
    }
    // The window is known only once the producer starts; followers keep every batch's
    // due time and receipt, and the window is applied after.
    let received = Arc::new(Mutex::new(Vec::<(i64, i64)>::new()));
    let connections = (0..streams.div_ceil(SUBSCRIPTIONS_PER_CONNECTION))
        .map(|_| BinaryClient::connect(server.binary, server.token.as_deref()))
        .collect::<Result<Vec<_>, _>>()?;
    let subscriptions = (0..streams)
        .map(|i| {
            connections[i / SUBSCRIPTIONS_PER_CONNECTION].subscribe(
                &w3::stream_name(i),
                Start::Earliest,
                CREDIT_BYTES,
                true,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let followers = subscriptions
        .into_iter()
        .map(|subscription| follow(subscription, received.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let config = AppendConfig {
        clients: 4,
        in_flight: 4,
        warmup: plan.warmup,
        duration: plan.duration,
        progress,
    };
    let produced = w3::run_step(
        &config,
        server,
        streams,
        Rate::MegabytesPerSecond(plan.target_mb_per_s),
    );
    let measured_to = now_ns();
    let measured_from = measured_to - plan.duration.as_nanos() as i64;
    let in_window = |due: i64| (measured_from..measured_to).contains(&due);
    // Wait for what was acknowledged in the window to arrive (or the grace to pass).
    let acknowledged = produced.as_ref().map_or(0, |p| p.batches);
    let grace_ends = Instant::now() + STRAGGLER_GRACE;
    while Instant::now() < grace_ends {
        let arrived = lock(&received)
            .iter()
            .filter(|(due, _)| in_window(*due))
            .count() as u64;
        if arrived >= acknowledged {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (handle, subscription_end) in followers {
        // The server ends the subscription; the follower sees its end and returns.
        subscription_end.unsubscribe()?;
        handle
            .join()
            .map_err(|_| ClientError::Protocol("a follower thread panicked".into()))??;
    }
    let produced = produced?;
    let mut latencies = Latencies::new();
    let mut delivered = 0u64;
    for &(due, arrived) in lock(&received).iter().filter(|(due, _)| in_window(*due)) {
        latencies.record(Duration::from_nanos(
            arrived.saturating_sub(due).max(0) as u64
        ));
        delivered += 1;
    }
    Ok(LatencyStep {
        streams,
        target_mb_per_s: plan.target_mb_per_s,
        delivered_mb_per_s: (delivered * BATCH_BYTES as u64) as f64
            / 1e6
            / plan.duration.as_secs_f64(),
        latency: latencies.summary(),
        behind: produced.behind,
        usage: produced.usage,
    })
}

/// A follower's thread and what ends its subscription.
type Follower = (
    std::thread::JoinHandle<Result<(), ClientError>>,
    SubscriptionEnd,
);

/// Follows one subscription on a thread of its own (a small stack: 2000 of them run at
/// once), noting each batch's due time (its first event's start, which W3's producer sets)
/// and the wall-clock time it arrived.
fn follow(
    mut subscription: Subscription,
    received: Arc<Mutex<Vec<(i64, i64)>>>,
) -> Result<Follower, ClientError> {
    let end = subscription.end_handle();
    let handle = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            while let Some(events) = subscription.next_events()? {
                let arrived = now_ns();
                let batch = &events.events;
                let mut starts = Vec::new();
                let per_batch = RECORDS_PER_BATCH as u64;
                for row in 0..batch.len() {
                    // Every append is one batch of RECORDS_PER_BATCH events (positions count
                    // from 0), its events starting 1 ns apart from the time it was due. A
                    // batch has arrived with its last event: a frame cut by the credit may
                    // carry the rest of it later, as a peer's message arrives whole.
                    let position = events.first_position + row as u64;
                    if position % per_batch == per_batch - 1 {
                        let due = batch.tstart()[row] - (per_batch as i64 - 1);
                        starts.push((due, arrived));
                    }
                }
                lock(&received).extend(starts);
            }
            Ok(())
        })
        .map_err(ClientError::Io)?;
    Ok((handle, end))
}

/// Fills `stream` with `batches` of W3's 64 KiB, eight appends in flight.
pub fn tidemark_fill(server: &ServerTarget, stream: &str, batches: u64) -> Result<(), ClientError> {
    let http = HttpClient::new(&server.http, server.token.as_deref());
    http.create_stream(stream, &w3::schema().to_spec())?;
    let client = BinaryClient::connect(server.binary, server.token.as_deref())?;
    let payload = Payload::new();
    let mut rng = fastrand::Rng::with_seed(5);
    let mut in_flight = std::collections::VecDeque::new();
    for i in 0..batches {
        if in_flight.len() == 8 {
            wait_acked(in_flight.pop_front())?;
        }
        let batch = payload.batch(&mut rng, i as i64 * RECORDS_PER_BATCH as i64);
        in_flight.push_back(client.send_append(stream, &batch)?);
    }
    while let Some(pending) = in_flight.pop_front() {
        wait_acked(Some(pending))?;
    }
    Ok(())
}

fn wait_acked(pending: Option<tidemark_client::PendingAck>) -> Result<(), ClientError> {
    match pending {
        Some(pending) => pending.wait().map(drop),
        None => Ok(()),
    }
}

/// The catch-up step on a Tidemark server whose `stream` holds `batches` of 64 KiB: each
/// consumer on a connection of its own reads it from the earliest position to the end.
pub fn tidemark_catch_up(
    server: &ServerTarget,
    stream: &str,
    batches: u64,
    consumers: usize,
) -> Result<CatchUpStep, ClientError> {
    let connections = (0..consumers)
        .map(|_| BinaryClient::connect(server.binary, server.token.as_deref()))
        .collect::<Result<Vec<_>, _>>()?;
    let expected_events = batches * RECORDS_PER_BATCH as u64;
    let start = std::sync::Barrier::new(consumers + 1);
    let sampler = server.pid.map(Sampler::start);
    let (started, results) = std::thread::scope(|scope| {
        let handles: Vec<_> = connections
            .iter()
            .map(|connection| {
                let start = &start;
                scope.spawn(move || -> Result<u64, ClientError> {
                    start.wait();
                    let mut subscription =
                        connection.subscribe(stream, Start::Earliest, 8 << 20, false)?;
                    let mut read = 0u64;
                    while let Some(events) = subscription.next_events()? {
                        if events.first_position != read {
                            return Err(ClientError::Protocol(format!(
                                "read position {} after {read} events",
                                events.first_position
                            )));
                        }
                        read += events.events.len() as u64;
                    }
                    Ok(read)
                })
            })
            .collect();
        start.wait();
        let started = Instant::now();
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(ClientError::Protocol("a consumer panicked".into())))
            })
            .collect();
        (started, results)
    });
    let took = started.elapsed();
    let usage = sampler.and_then(Sampler::finish);
    for read in results {
        let read = read?;
        if read != expected_events {
            return Err(ClientError::Protocol(format!(
                "a consumer read {read} events of {expected_events}"
            )));
        }
    }
    let stream_bytes = batches * BATCH_BYTES as u64;
    Ok(CatchUpStep {
        consumers,
        stream_bytes,
        aggregate_mb_per_s: (consumers as u64 * stream_bytes) as f64 / 1e6 / took.as_secs_f64(),
        usage,
    })
}

/// Idle subscriptions on a Tidemark server: `count` followers of an empty stream, 64 to a
/// connection (the most the server takes), as a consumer of many streams would hold them.
/// The figure includes the connections' own buffers, shared by their subscriptions.
pub fn tidemark_idle(server: &ServerTarget, count: usize) -> Result<IdleMemory, ClientError> {
    let pid = server
        .pid
        .ok_or_else(|| ClientError::Protocol("the server's process is not known".into()))?;
    let http = HttpClient::new(&server.http, server.token.as_deref());
    let stream = "w5_idle";
    http.create_stream(stream, &w3::schema().to_spec())?;
    let rss = || {
        std::thread::sleep(Duration::from_secs(1));
        crate::process::rss_bytes(pid)
            .ok_or_else(|| ClientError::Protocol("the server's memory cannot be read".into()))
    };
    let before = rss()?;
    let connections = (0..count.div_ceil(SUBSCRIPTIONS_PER_CONNECTION))
        .map(|_| BinaryClient::connect(server.binary, server.token.as_deref()))
        .collect::<Result<Vec<_>, _>>()?;
    let subscriptions = (0..count)
        .map(|i| {
            connections[i / SUBSCRIPTIONS_PER_CONNECTION].subscribe(
                stream,
                Start::Earliest,
                CREDIT_BYTES,
                true,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Every subscription is open once the server answers a round trip on its connection.
    for connection in &connections {
        connection.ping()?;
    }
    let after = rss()?;
    drop(subscriptions);
    Ok(IdleMemory {
        subscriptions: count,
        bytes_per_subscription: after.saturating_sub(before) as f64 / count as f64,
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

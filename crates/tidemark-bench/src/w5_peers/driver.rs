//! What the Redis and NATS adapters share, so that both measure W5 the same way: the
//! producer's fixed-rate slots, the consumer's bookkeeping of due and received times, the
//! catch-up timing and a settled reading of the server's memory.
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::latency::Latencies;
use crate::process::{Sampler, Usage};
use crate::w5::{CatchUpStep, ConsumePlan, LatencyStep, BATCH_BYTES};

/// Messages the producer keeps in flight in total: one per connection (slot), each
/// slot on its own schedule, as W3 drives its slots.
pub const IN_FLIGHT: usize = 16;
/// How long after the measured window a late message still counts.
pub const STRAGGLERS: Duration = Duration::from_secs(5);
/// How long the server is left alone before its RSS is read.
pub const SETTLE: Duration = Duration::from_millis(2000);
/// Time for the producer's threads to start before the first message is due.
const LEAD: Duration = Duration::from_millis(300);

/// The live step's clock. Every message carries the nanoseconds from `origin` to the
/// moment it was *due* in its first 8 bytes: producer and consumer run in this process,
/// so the consumer reads its latency off the same clock.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    origin: Instant,
    begin: Instant,
    pub measured_from: Instant,
    pub end: Instant,
}

impl Window {
    pub fn new(plan: &ConsumePlan) -> Window {
        let origin = Instant::now();
        let begin = origin + LEAD;
        let measured_from = begin + plan.warmup;
        Window {
            origin,
            begin,
            measured_from,
            end: measured_from + plan.duration,
        }
    }

    fn stamp(&self, payload: &mut [u8], due: Instant) {
        let ns = due.saturating_duration_since(self.origin).as_nanos();
        if let Some(head) = payload.get_mut(..8) {
            head.copy_from_slice(&u64::try_from(ns).unwrap_or(u64::MAX).to_le_bytes());
        }
    }

    fn due_of(&self, payload: &[u8]) -> Option<Instant> {
        let head: [u8; 8] = payload.get(..8)?.try_into().ok()?;
        self.origin
            .checked_add(Duration::from_nanos(u64::from_le_bytes(head)))
    }
}

/// The consumer's record: latency of the messages due in the window, how many, the
/// last one's arrival, and a count of every message seen (the main thread waits on it).
pub struct Arrivals {
    window: Window,
    latencies: Latencies,
    in_window: u64,
    last: Option<Instant>,
    seen: Arc<AtomicU64>,
}

impl Arrivals {
    pub fn new(window: Window) -> Arrivals {
        Arrivals {
            window,
            latencies: Latencies::new(),
            in_window: 0,
            last: None,
            seen: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn seen(&self) -> Arc<AtomicU64> {
        self.seen.clone()
    }

    /// A message the consumer holds since `at`.
    pub fn record(&mut self, payload: &[u8], at: Instant) -> Result<(), String> {
        if payload.len() != BATCH_BYTES {
            return Err(format!(
                "the consumer got a message of {} bytes, not {BATCH_BYTES}",
                payload.len()
            ));
        }
        let due = self
            .window
            .due_of(payload)
            .ok_or("a message without its due time")?;
        if due >= self.window.measured_from && due < self.window.end {
            self.latencies.record(at.saturating_duration_since(due));
            self.in_window += 1;
            self.last = self.last.max(Some(at));
        }
        self.seen.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A running consumer: its thread, and its socket to end a read blocked for good.
pub struct Following {
    pub handle: JoinHandle<Result<Arrivals, String>>,
    pub stopping: Arc<AtomicBool>,
    pub socket: TcpStream,
    pub seen: Arc<AtomicU64>,
}

impl Following {
    /// Waits until the consumer saw `expected` messages (every one acknowledged), at
    /// most [`STRAGGLERS`] past the window's end, then stops it.
    pub fn finish(self, window: &Window, expected: u64) -> Result<Arrivals, String> {
        let deadline = window.end + STRAGGLERS;
        while self.seen.load(Ordering::Relaxed) < expected
            && Instant::now() < deadline
            && !self.handle.is_finished()
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.stopping.store(true, Ordering::Relaxed);
        let _ = self.socket.shutdown(Shutdown::Both);
        self.handle
            .join()
            .map_err(|_| "the consumer thread panicked".to_string())?
    }
}

/// What the producer did.
pub struct Produced {
    /// Messages acknowledged (durable), warm-up included.
    pub acknowledged: u64,
    pub behind: u64,
    pub usage: Option<Usage>,
}

/// Random uppercase letters (W3's payload), four batches' worth; a message is a
/// 64 KiB slice of it at a random offset.
pub fn payload_pool() -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(64);
    (0..4 * BATCH_BYTES).map(|_| rng.u8(b'A'..=b'Z')).collect()
}

/// Sends for the window: one slot per connection, each sending a message, waiting for
/// its durable acknowledgement (`send`), and sending the next when due — slot `i`'s
/// schedule offset by `i / slots` of an interval, so the rate is smooth. The server is
/// sampled over the measured window.
pub fn produce<C: Send>(
    connections: Vec<C>,
    streams: usize,
    window: &Window,
    batches_per_second: f64,
    pid: u32,
    send: impl Fn(&mut C, usize, &[u8]) -> std::io::Result<()> + Sync,
) -> Result<Produced, String> {
    let slots = connections.len();
    if slots == 0 || streams == 0 || batches_per_second.is_nan() || batches_per_second <= 0.0 {
        return Err("no connection, no stream or no rate".into());
    }
    let interval = Duration::try_from_secs_f64(slots as f64 / batches_per_second)
        .map_err(|e| format!("rate {batches_per_second} batches/s: {e}"))?;
    let pool = payload_pool();
    let mut sampler = None;
    let results: Vec<Result<(u64, u64), String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = connections
            .into_iter()
            .enumerate()
            .map(|(slot, mut connection)| {
                let first = window.begin + interval * slot as u32 / slots as u32;
                let (pool, send) = (&pool, &send);
                scope.spawn(move || {
                    run_slot(
                        &mut connection,
                        send,
                        pool,
                        streams,
                        slot as u64,
                        window,
                        first,
                        interval,
                    )
                })
            })
            .collect();
        std::thread::sleep(
            window
                .measured_from
                .saturating_duration_since(Instant::now()),
        );
        sampler = Some(Sampler::start(pid));
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a producer thread panicked".into()))
            })
            .collect()
    });
    let usage = sampler.and_then(Sampler::finish);
    let mut produced = Produced {
        acknowledged: 0,
        behind: 0,
        usage,
    };
    for result in results {
        let (acknowledged, behind) = result?;
        produced.acknowledged += acknowledged;
        produced.behind += behind;
    }
    Ok(produced)
}

/// One slot: (acknowledged, behind).
#[allow(clippy::too_many_arguments)]
fn run_slot<C>(
    connection: &mut C,
    send: &(impl Fn(&mut C, usize, &[u8]) -> std::io::Result<()> + Sync),
    pool: &[u8],
    streams: usize,
    seed: u64,
    window: &Window,
    first: Instant,
    interval: Duration,
) -> Result<(u64, u64), String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut message = vec![0; BATCH_BYTES];
    let mut due = first;
    let (mut acknowledged, mut behind) = (0, 0);
    while due < window.end {
        let now = Instant::now();
        if now >= window.end {
            // Fell behind the rate: what is still due is counted, not sent.
            let from = due.max(window.measured_from);
            behind += ((window.end - from).as_secs_f64() / interval.as_secs_f64()).ceil() as u64;
            break;
        }
        std::thread::sleep(due.saturating_duration_since(now));
        let at = rng.usize(..pool.len() - BATCH_BYTES);
        message.copy_from_slice(&pool[at..at + BATCH_BYTES]);
        window.stamp(&mut message, due);
        send(connection, rng.usize(..streams), &message).map_err(|e| format!("producer: {e}"))?;
        acknowledged += 1;
        due += interval;
    }
    Ok((acknowledged, behind))
}

/// The step's report: delivered MB/s as W3 computes its achieved rate (the window
/// stretched to the last arrival of a message due in it).
pub fn latency_step(
    streams: usize,
    plan: &ConsumePlan,
    window: &Window,
    produced: Produced,
    arrivals: Arrivals,
) -> Result<LatencyStep, String> {
    let span = arrivals
        .last
        .map_or(window.end, |last| last.max(window.end))
        - window.measured_from;
    Ok(LatencyStep {
        streams,
        target_mb_per_s: plan.target_mb_per_s,
        delivered_mb_per_s: (arrivals.in_window * BATCH_BYTES as u64) as f64
            / 1e6
            / span.as_secs_f64().max(1e-9),
        latency: arrivals.latencies.summary(),
        behind: produced.behind,
        usage: produced.usage,
    })
}

/// Runs `consumers` readers, each on its own thread: `prepare` (its connection, its
/// consumer) first, then all released at once, each `read`ing to the end. Answers the
/// time from the release to the last reader's end, the server's usage over it, and
/// what each reader prepared (for cleaning up).
pub fn catch_up<R: Send>(
    consumers: usize,
    pid: u32,
    prepare: impl Fn(usize) -> Result<R, String> + Sync,
    read: impl Fn(&mut R) -> Result<(), String> + Sync,
) -> Result<(Duration, Option<crate::process::Usage>, Vec<R>), String> {
    if consumers == 0 {
        return Err("a step of 0 consumers".into());
    }
    let ready = Barrier::new(consumers + 1);
    let (started, results, usage) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..consumers)
            .map(|i| {
                let (ready, prepare, read) = (&ready, &prepare, &read);
                scope.spawn(move || {
                    // Every thread reaches the barrier, prepared or not.
                    let prepared = prepare(i);
                    ready.wait();
                    let mut prepared = prepared?;
                    read(&mut prepared)?;
                    Ok((Instant::now(), prepared))
                })
            })
            .collect();
        ready.wait();
        let started = Instant::now();
        let sampler = Sampler::start(pid);
        let results: Vec<Result<(Instant, R), String>> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a consumer thread panicked".into()))
            })
            .collect();
        (started, results, sampler.finish())
    });
    let mut last = started;
    let mut prepared = Vec::with_capacity(consumers);
    for result in results {
        let (finished, r) = result?;
        last = last.max(finished);
        prepared.push(r);
    }
    Ok((last - started, usage, prepared))
}

pub fn catch_up_report(
    plan: &ConsumePlan,
    consumers: usize,
    elapsed: Duration,
    usage: Option<Usage>,
) -> CatchUpStep {
    CatchUpStep {
        consumers,
        stream_bytes: plan.catch_up_bytes,
        aggregate_mb_per_s: consumers as f64 * plan.catch_up_bytes as f64
            / elapsed.as_secs_f64().max(1e-9)
            / 1e6,
        usage,
    }
}

/// The RSS of `pid` after [`SETTLE`], once two reads half a second apart agree within
/// 0.2% (or after 10 s more, the last read).
pub fn settled_rss(pid: u32) -> Result<u64, String> {
    std::thread::sleep(SETTLE);
    let read = || crate::process::rss_bytes(pid).ok_or("cannot read the server's RSS");
    let mut last = read()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = read()?;
        if now.abs_diff(last) * 500 <= last || Instant::now() > deadline {
            return Ok(now);
        }
        last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_times_round_trip_through_the_payload() {
        let plan = crate::w5::tiny_plan();
        let window = Window::new(&plan);
        let mut payload = vec![b'A'; BATCH_BYTES];
        let due = window.measured_from + Duration::from_millis(10);
        window.stamp(&mut payload, due);
        assert_eq!(window.due_of(&payload), Some(due));
        let mut arrivals = Arrivals::new(window);
        arrivals
            .record(&payload, due + Duration::from_millis(3))
            .unwrap();
        // In the warm-up: seen, not measured.
        window.stamp(&mut payload, window.begin);
        arrivals.record(&payload, window.measured_from).unwrap();
        assert!(arrivals.record(&payload[..100], due).is_err());
        assert_eq!(arrivals.seen.load(Ordering::Relaxed), 2);
        assert_eq!(arrivals.in_window, 1);
        let summary = arrivals.latencies.summary().unwrap();
        assert!((summary.p50_ms - 3.0).abs() < 0.01, "{summary:?}");
    }
}

//! The flusher: turns memtables into segments and checkpoints the manifest.
//!
//! A checkpoint (1) freezes every stream's active memtable, (2) writes each frozen memtable
//! as one sorted segment, small ones side by side in shared pack files, and makes them
//! durable ([`crate::sink`]: temp files, fsync'd in groups, renamed, then the directory
//! fsync'd), (3) installs
//! the segments in place of the memtables under the state lock, so readers see either the
//! memtable or the segment, never both or neither, (4) merges runs of small segments
//! ([`crate::compact`]) and installs the results, applies retention, (5) writes the
//! manifest atomically, and only then (6) deletes retired segment files and (7) releases
//! the log files that no stream needs for replay any more. A crash between any two steps leaves
//! the previous manifest and every log record it needs.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tidemark_core::sync::IgnorePoison;
use tidemark_storage::manifest::Manifest;
use tidemark_storage::manifest::StreamId;

use crate::compact;
use crate::db::Shared;
use crate::error::{EngineError, Result};
use crate::memtable::Memtable;
use crate::sink::SegmentSink;
use crate::state::{Segment, State};

/// How often the flusher wakes by itself to apply age-based retention.
const IDLE_WAKE: Duration = Duration::from_secs(10);

/// Requests for the flusher, and the news of their completion.
#[derive(Default)]
pub struct FlushSignal {
    state: Mutex<Progress>,
    changed: Condvar,
}

#[derive(Default)]
struct Progress {
    requested: u64,
    completed: u64,
    shutdown: bool,
    last_error: Option<String>,
}

impl FlushSignal {
    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.state.lock().ignore_poison()
    }

    /// Asks for a checkpoint (coalesced with one already asked for) and returns its number.
    pub fn request(&self) -> u64 {
        let mut p = self.lock();
        if p.requested == p.completed {
            p.requested += 1;
            self.changed.notify_all();
        }
        p.requested
    }

    /// Asks for a checkpoint that starts after this call and waits for its outcome.
    pub fn request_and_wait(&self) -> Result<()> {
        let mut p = self.lock();
        if p.shutdown {
            return Err(EngineError::Closed);
        }
        // A checkpoint already running may have frozen its memtables before our caller's
        // last append, and it completes the number it read when it started, which is at
        // most `requested` (not `completed + 1`: another caller may have asked for two).
        // One more than that can only be completed by a checkpoint that starts after this.
        p.requested += 1;
        let target = p.requested;
        self.changed.notify_all();
        while p.completed < target && !p.shutdown {
            p = self.changed.wait(p).ignore_poison();
        }
        if p.completed < target {
            return Err(EngineError::Closed);
        }
        match &p.last_error {
            Some(e) => Err(EngineError::FlushFailed(e.clone())),
            None => Ok(()),
        }
    }

    /// Waits up to `timeout` for `ready` to hold, re-checking after every checkpoint.
    pub fn wait_until(&self, timeout: Duration, ready: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut p = self.lock();
        while !ready() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || p.shutdown {
                return false;
            }
            if p.requested == p.completed {
                p.requested += 1;
                self.changed.notify_all();
            }
            p = self
                .changed
                .wait_timeout(p, left.min(Duration::from_millis(100)))
                .ignore_poison()
                .0;
        }
        true
    }

    pub fn last_error(&self) -> Option<String> {
        self.lock().last_error.clone()
    }

    pub fn shut_down(&self) {
        self.lock().shutdown = true;
        self.changed.notify_all();
    }
}

pub fn spawn(shared: Arc<Shared>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tidemark-flush".into())
        .spawn(move || {
            yield_cpu_to_foreground();
            run(&shared)
        })
}

/// The nice value of the flusher thread (0 is normal, 19 the lowest priority).
const FLUSH_NICE: i32 = 10;

/// Compressing memtables is the one CPU-heavy job nobody waits for directly, while the
/// appends, replication and fsyncs of the write path are waited for by clients: when they
/// compete for the cores, the flusher should lose, and the write path keeps its latency
/// while the flush catches up in the gaps. If it falls behind, the memtable limit stalls the
/// appends, which frees the cores for it (so it cannot starve).
fn yield_cpu_to_foreground() {
    if let Err(error) = crate::priority::lower_own_priority(FLUSH_NICE) {
        tracing::debug!(%error, "the flusher keeps its priority");
    }
}

fn run(shared: &Shared) {
    let signal = &shared.flush;
    let mut last_manifest: Option<Manifest> = None;
    let mut backoff = Duration::ZERO;
    loop {
        let target = {
            let mut p = signal.lock();
            if p.requested == p.completed && !p.shutdown {
                p = signal.changed.wait_timeout(p, IDLE_WAKE).ignore_poison().0;
            }
            if p.shutdown {
                return;
            }
            p.requested
        };
        let outcome = checkpoint(shared, &mut last_manifest);
        let mut p = signal.lock();
        p.completed = p.completed.max(target);
        p.last_error = outcome.err().map(|e| e.to_string());
        signal.changed.notify_all();
        if let Some(e) = &p.last_error {
            // Waiting appenders ask again at once; a failing disk must not make this a hot
            // loop. Back off (up to 5 s) while failures repeat, waking early on shutdown.
            backoff = (backoff * 2).clamp(Duration::from_millis(100), Duration::from_secs(5));
            tracing::error!(error = %e, retry_in = ?backoff, "flush failed; the memtables stay in memory");
            let _ = signal
                .changed
                .wait_timeout_while(p, backoff, |p| !p.shutdown);
        } else {
            backoff = Duration::ZERO;
        }
    }
}

struct Job {
    stream: StreamId,
    epoch: u64,
    memtable: Arc<Memtable>,
    segment_id: u64,
}

/// One checkpoint; see the module documentation for the steps.
fn checkpoint(shared: &Shared, last_manifest: &mut Option<Manifest>) -> Result<()> {
    let _checkpointing = shared.checkpointing.lock().ignore_poison();
    let (jobs, backlog) = {
        let mut state = shared.write();
        (freeze(&mut state), state.unflushed_bytes())
    };
    // Compress on every core only when appenders are about to wait for this flush; below
    // that the backlog is fine and the other core is better left to the appenders.
    let mut segment_options = shared.options.segment.clone();
    if backlog < shared.options.max_unflushed_bytes / 2 {
        segment_options.encode_threads = 1;
    }

    let mut sink = SegmentSink::new(shared, &segment_options);
    for job in jobs {
        let Some(events) = job.memtable.sorted_events()? else {
            continue;
        };
        let (id, expected_bytes) = (job.segment_id, job.memtable.bytes as u64);
        sink.write(job, id, &events, expected_bytes)?;
    }
    let written = sink.finish()?;

    let compactions = {
        let mut state = shared.write();
        install(&mut state, written);
        compact::plan(&mut state, &shared.options)
    };

    let mut sink = SegmentSink::new(shared, &shared.options.segment);
    for compaction in compactions {
        let events = compact::merge(&compaction)?;
        let (id, expected_bytes) = (compaction.output_id(), compaction.input_bytes());
        sink.write(compaction, id, &events, expected_bytes)?;
    }
    let compacted = sink.finish()?;

    let (manifest, retired) = {
        let mut state = shared.write();
        for (compaction, output) in compacted {
            compact::install(&mut state, compaction, output);
        }
        apply_retention(&mut state, tidemark_core::time::now_ns());
        (state.manifest(), std::mem::take(&mut state.retired))
    };
    if last_manifest.as_ref() != Some(&manifest) {
        if let Err(e) = manifest.store(&shared.dir) {
            // The old manifest still names the retired segments: keep their files.
            shared.write().retired.extend(retired);
            return Err(e.into());
        }
    }
    for segment in &retired {
        segment.retire();
    }
    drop(retired);
    shared.log.checkpointed(manifest.log_start())?;
    shared.write().forget_retries_before(manifest.log_start());
    *last_manifest = Some(manifest);
    Ok(())
}

/// Freezes every non-empty active memtable; returns a job for every frozen memtable
/// (including those a failed checkpoint left behind).
fn freeze(state: &mut State) -> Vec<Job> {
    let mut jobs = Vec::new();
    let mut next_segment_id = state.next_segment_id;
    for stream in state.streams.values_mut() {
        if !stream.active.is_empty() {
            let memtable = std::mem::take(&mut stream.active);
            stream.frozen.push(Arc::new(memtable));
        }
        for memtable in &stream.frozen {
            jobs.push(Job {
                stream: stream.id,
                epoch: stream.epoch,
                memtable: memtable.clone(),
                segment_id: next_segment_id,
            });
            next_segment_id += 1;
        }
    }
    state.next_segment_id = next_segment_id;
    jobs
}

/// Puts written segments in place of the memtables they hold. A segment whose stream was
/// cleared or dropped meanwhile is discarded.
fn install(state: &mut State, written: Vec<(Job, Arc<Segment>)>) {
    for (job, segment) in written {
        let stream = state
            .streams
            .get_mut(&job.stream)
            .filter(|s| s.epoch == job.epoch);
        let position = stream
            .as_ref()
            .and_then(|s| s.frozen.iter().position(|m| Arc::ptr_eq(m, &job.memtable)));
        match (stream, position) {
            (Some(stream), Some(position)) => {
                stream.frozen.remove(position);
                stream.segments.push(segment);
                state.release_unflushed(job.memtable.bytes);
            }
            _ => segment.retire(), // never named by a manifest
        }
    }
}

/// Moves segments past a stream's age or size limit to `retired`, oldest first.
fn apply_retention(state: &mut State, now_ns: i64) {
    for stream in state.streams.values_mut() {
        let mut drop_first = 0;
        if let Some(age) = stream.retention.max_age_ns {
            let cutoff = now_ns.saturating_sub(age);
            drop_first = stream
                .segments
                .iter()
                .take_while(|s| s.meta.max_ts().is_some_and(|t| t < cutoff))
                .count();
        }
        if let Some(max_bytes) = stream.retention.max_bytes {
            let mut total: u64 = stream.segments[drop_first..]
                .iter()
                .map(|s| s.meta.bytes)
                .sum();
            while total > max_bytes && drop_first < stream.segments.len() {
                total -= stream.segments[drop_first].meta.bytes;
                drop_first += 1;
            }
        }
        state.retired.extend(stream.segments.drain(..drop_first));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// What the flusher does when it starts a checkpoint: takes the number to complete.
    fn start_round(signal: &FlushSignal) -> u64 {
        signal.lock().requested
    }

    fn finish_round(signal: &FlushSignal, target: u64) {
        let mut p = signal.lock();
        p.completed = p.completed.max(target);
        signal.changed.notify_all();
    }

    #[test]
    fn a_wait_is_answered_only_by_a_checkpoint_that_started_after_it() {
        let signal = Arc::new(FlushSignal::default());
        // Someone waits; a checkpoint starts for them.
        let first = {
            let signal = signal.clone();
            std::thread::spawn(move || signal.request_and_wait())
        };
        while signal.lock().requested == 0 {
            std::thread::yield_now();
        }
        let running = start_round(&signal);
        // A second caller asks while that checkpoint runs: it froze the memtables before
        // this caller's appends, so it must not answer it.
        let answered = Arc::new(AtomicBool::new(false));
        let second = {
            let (signal, answered) = (signal.clone(), answered.clone());
            std::thread::spawn(move || {
                let outcome = signal.request_and_wait();
                answered.store(true, Ordering::SeqCst);
                outcome
            })
        };
        // Until it has asked (its request changes nothing visible if the signal is wrong).
        let asked = Instant::now();
        while signal.lock().requested == running && asked.elapsed() < Duration::from_millis(300) {
            std::thread::yield_now();
        }
        finish_round(&signal, running);
        first.join().unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !answered.load(Ordering::SeqCst),
            "answered by a checkpoint that started before the request"
        );
        let next = start_round(&signal);
        finish_round(&signal, next);
        second.join().unwrap().unwrap();
        assert!(answered.load(Ordering::SeqCst));
    }
}

//! The flush signal: how writers, readers and the tiering thread ask the flusher for a
//! checkpoint and learn its outcome, and how the flusher takes requests and reports back.
//! A request is answered only by a checkpoint that started after it.
//!
//! Must never know about: what a checkpoint does (`flush`), the state it changes.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tidemark_core::sync::IgnorePoison;

use crate::error::{EngineError, Result};

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

    /// For the flusher: waits up to `idle` for a request (or shutdown) and returns the
    /// number the next checkpoint completes, which it reads as it starts; `None` once
    /// shut down.
    pub(crate) fn next_request(&self, idle: Duration) -> Option<u64> {
        let mut p = self.lock();
        if p.requested == p.completed && !p.shutdown {
            p = self.changed.wait_timeout(p, idle).ignore_poison().0;
        }
        if p.shutdown {
            return None;
        }
        Some(p.requested)
    }

    /// For the flusher: the checkpoint that started at request `target` ended with
    /// `error` (`None`: it succeeded); every waiter for `target` or before is answered.
    pub(crate) fn complete(&self, target: u64, error: Option<String>) {
        let mut p = self.lock();
        debug_assert!(target <= p.requested, "completed {target}, never requested");
        p.completed = p.completed.max(target);
        p.last_error = error;
        self.changed.notify_all();
    }

    /// For the flusher after a failure: waits `backoff`, or until shut down.
    pub(crate) fn pause(&self, backoff: Duration) {
        let p = self.lock();
        let _ = self.changed.wait_timeout_while(p, backoff, |p| !p.shutdown);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

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

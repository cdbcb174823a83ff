//! Pacing of background writes (segments a checkpoint flushes or compacts), so that they
//! reach the disk as a steady trickle instead of a burst.
//!
//! Why: an fsync's cost grows with the bytes the device took since the one before it, from
//! any file. A flush that writes a 64 MiB segment as fast as the page cache takes it puts
//! those bytes in front of every log fsync that follows, and a client waits for each of
//! those. Measured on this project's 2-vCPU machine (`scripts/fsync-beside-segments.py`,
//! docs/benchmarks.md W5): 64 KiB log writes fsync'd one by one at 46 MB/s had a p99 of
//! 1.5–3.7 ms alone, and 103–111 ms beside a 64 MiB segment file written each time the log
//! took 64 MiB (its writeback started every 1 MiB, but written at once); the same bytes
//! spaced evenly at 92 MB/s in 1 MiB steps left it at 5.2–5.9 ms.
//!
//! The owner decides the rate (and when nobody should wait for pacing: [`WritePace::unpace`]);
//! a writer calls [`WritePace::wrote`] after each step it handed to the kernel, and sleeps
//! there for as long as the rate says.
//!
//! Must never know about: what is written, why the rate is what it is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tidemark_core::sync::IgnorePoison;

/// A rate for background writes, in bytes per second, or none (unpaced).
#[derive(Debug, Default)]
pub struct WritePace {
    state: Mutex<Schedule>,
    changed: Condvar,
    /// `Schedule::rate`, written with it under the lock and read without it: appenders
    /// ask on every append past half the backlog bound whether there is a pace to drop,
    /// and an answer of no must cost neither the lock nor the condition variable's wake
    /// (a system call).
    rate_now: AtomicU64,
}

#[derive(Debug, Default)]
struct Schedule {
    /// Bytes per second; 0 means unpaced.
    rate: u64,
    /// When the bytes written so far are due to have gone at `rate`: the next write waits
    /// until then. Never earlier than the last write (idle time earns no burst).
    due: Option<Instant>,
}

impl WritePace {
    /// From now on, writes go at most at `bytes_per_second` (0: unpaced).
    pub fn set_rate(&self, bytes_per_second: u64) {
        let mut state = self.lock();
        state.rate = bytes_per_second;
        state.due = None;
        // Sequentially consistent: the engine pairs it with its count of flush waiters
        // (a waiter counts itself, then unpaces; the flusher sets the rate, then reads the
        // count), and only a single order of all four makes one of them see the other.
        self.rate_now.store(bytes_per_second, Ordering::SeqCst);
        self.changed.notify_all();
    }

    /// From now on, writes go as fast as they can, and a writer sleeping in
    /// [`WritePace::wrote`] returns at once: someone is waiting for what they write.
    pub fn unpace(&self) {
        if self.rate() != 0 {
            self.set_rate(0);
        }
    }

    /// The rate now (0: unpaced).
    pub fn rate(&self) -> u64 {
        self.rate_now.load(Ordering::SeqCst)
    }

    /// Accounts for `bytes` just handed to the kernel, and sleeps until they are due at
    /// the rate (at once when unpaced, or as soon as [`WritePace::unpace`] is called).
    pub fn wrote(&self, bytes: u64) {
        if bytes == 0 || self.rate() == 0 {
            return;
        }
        let mut state = self.lock();
        if state.rate == 0 || bytes == 0 {
            return;
        }
        let now = Instant::now();
        let start = state.due.filter(|due| *due > now).unwrap_or(now);
        let due = start + Duration::from_secs_f64(bytes as f64 / state.rate as f64);
        state.due = Some(due);
        while state.rate != 0 {
            let left = due.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            state = self.changed.wait_timeout(state, left).ignore_poison().0;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Schedule> {
        self.state.lock().ignore_poison()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn unpaced_writes_never_wait() {
        let pace = WritePace::default();
        let started = Instant::now();
        for _ in 0..1000 {
            pace.wrote(1 << 30);
        }
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn paced_writes_take_at_least_their_bytes_over_the_rate() {
        let pace = WritePace::default();
        pace.set_rate(10 << 20);
        let started = Instant::now();
        for _ in 0..4 {
            pace.wrote(1 << 20);
        }
        // 4 MiB at 10 MiB/s: 400 ms at least, whatever the machine's speed.
        assert!(started.elapsed() >= Duration::from_millis(400));
    }

    #[test]
    fn unpacing_wakes_a_sleeping_writer() {
        let pace = Arc::new(WritePace::default());
        pace.set_rate(1); // a byte per second: the write below would sleep for hours
        let (done, returned) = std::sync::mpsc::channel();
        {
            let pace = pace.clone();
            std::thread::spawn(move || {
                pace.wrote(1 << 20);
                let _ = done.send(());
            });
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(returned.try_recv().is_err(), "the writer sleeps");
        pace.unpace();
        returned
            .recv_timeout(Duration::from_secs(10))
            .expect("unpacing wakes the writer");
        assert_eq!(pace.rate(), 0);
    }
}

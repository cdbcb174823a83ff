//! What a server process costs while a workload runs, read from /proc: CPU (user + system)
//! and resident memory. Works for any PID — Tidemark's server or a peer — so both are
//! measured the same way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Clock ticks per second of /proc's CPU times: 100 on every Linux this runs on
/// (`sysconf(_SC_CLK_TCK)`; hard-coded to stay free of libc here).
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU seconds (user + system) process `pid` has used.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat).map(|ticks| ticks / TICKS_PER_SECOND)
}

/// utime + stime of a `/proc/PID/stat` line, in ticks.
fn parse_cpu_ticks(stat: &str) -> Option<f64> {
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?)
}

/// Resident memory of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_rss(&status)
}

fn parse_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// CPU and memory of one process over a measured interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// CPU seconds per wall second (1.0 = one core busy).
    pub cores: f64,
    /// The highest resident memory seen (sampled every 200 ms).
    pub peak_rss_bytes: u64,
}

/// Samples a process from [`Sampler::start`] to [`Sampler::finish`].
pub struct Sampler {
    pid: u32,
    started: Instant,
    cpu_at_start: Option<f64>,
    stop: Arc<AtomicBool>,
    peak_rss: JoinHandle<u64>,
}

impl Sampler {
    pub fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak_rss = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut peak = 0;
                while !stop.load(Ordering::Relaxed) {
                    peak = peak.max(rss_bytes(pid).unwrap_or(0));
                    std::thread::sleep(Duration::from_millis(200));
                }
                peak.max(rss_bytes(pid).unwrap_or(0))
            }
        });
        Sampler {
            pid,
            started: Instant::now(),
            cpu_at_start: cpu_seconds(pid),
            stop,
            peak_rss,
        }
    }

    /// `None` when the process could not be read (it exited, or /proc is missing).
    pub fn finish(self) -> Option<Usage> {
        let wall = self.started.elapsed().as_secs_f64();
        let cpu_now = cpu_seconds(self.pid);
        // The sampling thread stops whatever was read.
        self.stop.store(true, Ordering::Relaxed);
        let peak_rss_bytes = self.peak_rss.join().ok()?;
        let cpu = cpu_now? - self.cpu_at_start?;
        (wall > 0.0 && peak_rss_bytes > 0).then(|| Usage {
            cores: cpu / wall,
            peak_rss_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_lines() {
        // A command name with spaces and parentheses must not shift the fields.
        let stat = "4242 (tidemark (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 8 0";
        assert_eq!(parse_cpu_ticks(stat), Some(300.0));
        assert_eq!(parse_cpu_ticks("garbage"), None);
        assert_eq!(
            parse_rss("Name:\ttidemark\nVmRSS:\t  12345 kB\nVmSwap: 0 kB\n"),
            Some(12345 * 1024)
        );
        assert_eq!(parse_rss("Name: x\n"), None);
    }

    #[test]
    fn samples_this_process() {
        let sampler = Sampler::start(std::process::id());
        // Some CPU work so the interval is not empty.
        let mut x = 0u64;
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let usage = sampler.finish().expect("this process can be read");
        assert!(usage.peak_rss_bytes > 0);
        assert!(usage.cores > 0.0 && usage.cores < 64.0, "{usage:?}");

        // A process that does not exist: nothing to report, and the sampler still stops.
        assert_eq!(Sampler::start(u32::MAX - 7).finish(), None);
    }
}

//! Latency histograms: HDR histograms (the `hdrhistogram` crate) at microsecond resolution
//! with three significant digits, and the summary every report prints (avg, p50, p95, p99,
//! p99.9, max).

use std::time::Duration;

use hdrhistogram::Histogram;

/// The longest latency recorded exactly; longer ones are recorded as this (and counted).
const HIGHEST_MICROS: u64 = 3_600_000_000;

/// Latencies of one kind, mergeable across threads.
#[derive(Clone)]
pub struct Latencies {
    histogram: Histogram<u64>,
    /// Values above the histogram's range, recorded at its top.
    pub clamped: u64,
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies::new()
    }
}

impl Latencies {
    pub fn new() -> Latencies {
        Latencies {
            // 1 µs .. 1 h at 3 significant digits: fixed bounds, so creating it cannot fail.
            histogram: Histogram::new_with_bounds(1, HIGHEST_MICROS, 3)
                .expect("constant bounds are valid"),
            clamped: 0,
        }
    }

    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        if micros > HIGHEST_MICROS {
            self.clamped += 1;
        }
        self.histogram
            .saturating_record(micros.clamp(1, HIGHEST_MICROS));
    }

    pub fn merge(&mut self, other: &Latencies) {
        // Same bounds on both sides: adding cannot go out of range.
        let _ = self.histogram.add(&other.histogram);
        self.clamped += other.clamped;
    }

    pub fn len(&self) -> u64 {
        self.histogram.len()
    }

    pub fn is_empty(&self) -> bool {
        self.histogram.is_empty()
    }

    /// `None` when nothing was recorded.
    pub fn summary(&self) -> Option<LatencySummary> {
        if self.is_empty() {
            return None;
        }
        let h = &self.histogram;
        let ms = |micros: u64| micros as f64 / 1000.0;
        Some(LatencySummary {
            count: h.len(),
            avg_ms: h.mean() / 1000.0,
            p50_ms: ms(h.value_at_quantile(0.50)),
            p95_ms: ms(h.value_at_quantile(0.95)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        })
    }
}

/// What a latency report prints, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        // Three significant digits: within 0.1% (plus a microsecond of bucket width).
        (a - b).abs() <= b * 0.001 + 0.001
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut latencies = Latencies::new();
        assert_eq!(latencies.summary(), None);
        // 1..=10_000 µs once each: p50 = 5 ms, p99 = 9.9 ms, p99.9 = 9.99 ms.
        for micros in 1..=10_000u64 {
            latencies.record(Duration::from_micros(micros));
        }
        let s = latencies.summary().unwrap();
        assert_eq!(s.count, 10_000);
        assert!(close(s.avg_ms, 5.0005), "{s:?}");
        assert!(close(s.p50_ms, 5.0), "{s:?}");
        assert!(close(s.p95_ms, 9.5), "{s:?}");
        assert!(close(s.p99_ms, 9.9), "{s:?}");
        assert!(close(s.p999_ms, 9.99), "{s:?}");
        assert!(close(s.max_ms, 10.0), "{s:?}");
    }

    #[test]
    fn merging_and_out_of_range_values() {
        let mut a = Latencies::new();
        let mut b = Latencies::new();
        a.record(Duration::from_millis(2));
        b.record(Duration::from_millis(4));
        b.record(Duration::from_secs(7200));
        b.record(Duration::ZERO);
        a.merge(&b);
        assert_eq!(a.len(), 4);
        assert_eq!(a.clamped, 1, "two hours is above the range");
        let s = a.summary().unwrap();
        assert!(close(s.max_ms, 3_600_000.0), "{s:?}");
        assert!(s.p50_ms >= 0.001, "zero is recorded as the smallest value");
    }
}

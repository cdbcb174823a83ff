//! What the agent reports (`GET /agent/status`, `/metrics`, `tidemark agent status`): the
//! forwarder writes it, the HTTP handlers read it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tidemark_core::sync::IgnorePoison;

/// The upstream as the forwarder last found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    /// Unreachable, or refusing for a reason other than load (no leader, a failed log).
    Down = 0,
    Up = 1,
    /// It answers TRY_LATER / 429: the spool grows until it takes writes again.
    PushingBack = 2,
}

impl Upstream {
    pub fn label(self) -> &'static str {
        match self {
            Upstream::Down => "down",
            Upstream::Up => "up",
            Upstream::PushingBack => "pushing-back",
        }
    }
}

/// The status as JSON (`GET /agent/status`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub upstream: String,
    /// Spooled records not yet forwarded: producers' batches and stream creations.
    pub spooled_batches: u64,
    pub spooled_bytes: u64,
    /// How long the oldest record not yet forwarded has been spooled (to within 0.1 s).
    pub oldest_spooled_age_ms: u64,
    /// Records forwarded since the agent started, and their bytes.
    pub forwarded_batches: u64,
    pub forwarded_bytes: u64,
    /// Records the upstream refused as invalid, kept in `dead-letters/` (all of them,
    /// since the spool was made).
    pub dead_letters: u64,
    /// Why the last one was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_dead_letter: Option<String>,
}

/// How often the age of spooled records is sampled.
const AGE_RESOLUTION: Duration = Duration::from_millis(100);

#[derive(Default)]
pub struct StatusBoard {
    upstream: AtomicU8,
    spooled_records: AtomicU64,
    spooled_bytes: AtomicU64,
    forwarded_records: AtomicU64,
    forwarded_bytes: AtomicU64,
    dead_letters: AtomicU64,
    last_dead_letter: Mutex<Option<String>>,
    /// (end of the spool, when it was first seen there), oldest first: the age of the
    /// oldest record not forwarded is that of the first entry past the forwarded mark.
    ages: Mutex<VecDeque<(u64, Instant)>>,
}

impl StatusBoard {
    pub fn new(spooled_records: u64, dead_letters: u64) -> StatusBoard {
        let board = StatusBoard::default();
        board
            .spooled_records
            .store(spooled_records, Ordering::Relaxed);
        board.dead_letters.store(dead_letters, Ordering::Relaxed);
        board
    }

    pub fn set_upstream(&self, upstream: Upstream) {
        self.upstream.store(upstream as u8, Ordering::Relaxed);
    }

    pub fn upstream(&self) -> Upstream {
        match self.upstream.load(Ordering::Relaxed) {
            1 => Upstream::Up,
            2 => Upstream::PushingBack,
            _ => Upstream::Down,
        }
    }

    /// `records` more were found spooled, the spool now ending at `end` (first seen then,
    /// or at `since` for what was spooled before the agent started).
    pub fn spooled(&self, records: u64, end: u64, since: Instant) {
        self.spooled_records.fetch_add(records, Ordering::Relaxed);
        let mut ages = self.ages.lock().ignore_poison();
        match ages.back_mut() {
            Some((last_end, seen)) if seen.elapsed() < AGE_RESOLUTION => *last_end = end,
            _ => ages.push_back((end, since)),
        }
    }

    /// Records up to `forwarded` left the spool: `records` of them, `bytes` long.
    pub fn forwarded(&self, records: u64, bytes: u64, forwarded: u64) {
        self.spooled_records.fetch_sub(
            records.min(self.spooled_records.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        self.forwarded_records.fetch_add(records, Ordering::Relaxed);
        self.forwarded_bytes.fetch_add(bytes, Ordering::Relaxed);
        let mut ages = self.ages.lock().ignore_poison();
        while ages.front().is_some_and(|&(end, _)| end <= forwarded) {
            ages.pop_front();
        }
    }

    pub fn set_spooled_bytes(&self, bytes: u64) {
        self.spooled_bytes.store(bytes, Ordering::Relaxed);
    }

    pub fn dead_lettered(&self, reason: String) {
        self.dead_letters.fetch_add(1, Ordering::Relaxed);
        *self.last_dead_letter.lock().ignore_poison() = Some(reason);
    }

    pub fn snapshot(&self) -> Status {
        let spooled_batches = self.spooled_records.load(Ordering::Relaxed);
        let oldest = match spooled_batches {
            0 => Duration::ZERO,
            _ => self
                .ages
                .lock()
                .ignore_poison()
                .front()
                .map_or(Duration::ZERO, |(_, since)| since.elapsed()),
        };
        Status {
            upstream: self.upstream().label().to_string(),
            spooled_batches,
            spooled_bytes: self.spooled_bytes.load(Ordering::Relaxed),
            oldest_spooled_age_ms: oldest.as_millis() as u64,
            forwarded_batches: self.forwarded_records.load(Ordering::Relaxed),
            forwarded_bytes: self.forwarded_bytes.load(Ordering::Relaxed),
            dead_letters: self.dead_letters.load(Ordering::Relaxed),
            last_dead_letter: self.last_dead_letter.lock().ignore_poison().clone(),
        }
    }
}

impl Status {
    /// The status as Prometheus text, added to the agent's `/metrics`.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        };
        for (state, label) in [
            ("up", "up"),
            ("down", "down"),
            ("pushing-back", "pushing_back"),
        ] {
            metric(
                &format!("tidemark_agent_upstream_{label}"),
                "gauge",
                &format!("1 while the upstream is {state}"),
                u8::from(self.upstream == state).to_string(),
            );
        }
        metric(
            "tidemark_agent_spooled_batches",
            "gauge",
            "Spooled records not yet forwarded",
            self.spooled_batches.to_string(),
        );
        metric(
            "tidemark_agent_spooled_bytes",
            "gauge",
            "Bytes the spool holds not yet forwarded",
            self.spooled_bytes.to_string(),
        );
        metric(
            "tidemark_agent_oldest_spooled_age_seconds",
            "gauge",
            "Age of the oldest record not yet forwarded",
            format!("{:.3}", self.oldest_spooled_age_ms as f64 / 1000.0),
        );
        metric(
            "tidemark_agent_forwarded_batches_total",
            "counter",
            "Records forwarded since the agent started",
            self.forwarded_batches.to_string(),
        );
        metric(
            "tidemark_agent_forwarded_bytes_total",
            "counter",
            "Bytes of records forwarded since the agent started",
            self.forwarded_bytes.to_string(),
        );
        metric(
            "tidemark_agent_dead_letters",
            "gauge",
            "Records the upstream refused, kept in dead-letters/",
            self.dead_letters.to_string(),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_ages_follow_the_spool() {
        let board = StatusBoard::new(0, 0);
        let long_ago = Instant::now() - Duration::from_secs(5);
        board.spooled(3, 300, long_ago);
        std::thread::sleep(AGE_RESOLUTION);
        board.spooled(2, 500, Instant::now());
        let status = board.snapshot();
        assert_eq!(status.spooled_batches, 5);
        assert!(status.oldest_spooled_age_ms >= 5000, "{status:?}");
        board.forwarded(3, 280, 300);
        let status = board.snapshot();
        assert_eq!((status.spooled_batches, status.forwarded_batches), (2, 3));
        assert!(status.oldest_spooled_age_ms < 5000, "{status:?}");
        board.forwarded(2, 190, 500);
        assert_eq!(board.snapshot().oldest_spooled_age_ms, 0);
        let text = board.snapshot().prometheus();
        assert!(
            text.contains("tidemark_agent_forwarded_bytes_total 470\n"),
            "{text}"
        );
        assert!(text.contains("tidemark_agent_upstream_down 1\n"), "{text}");
    }
}

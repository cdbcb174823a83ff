//! What the agent reports (`GET /agent/status`, `/metrics`, `tidemark agent status`): the
//! forwarder writes it, the HTTP handlers read it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tidemark_core::sync::IgnorePoison;
use tidemark_engine::Spool;

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
    /// Why the upstream is not `up`, as the last attempt found it (a refused token, a
    /// connection refused, no leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_error: Option<String>,
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

pub struct StatusBoard {
    spool: Arc<Spool>,
    upstream: AtomicU8,
    upstream_error: Mutex<Option<String>>,
    backlog: Mutex<Backlog>,
    forwarded_records: AtomicU64,
    forwarded_bytes: AtomicU64,
    dead_letters: AtomicU64,
    last_dead_letter: Mutex<Option<String>>,
}

/// The spooled records not yet forwarded, counted as the spool grows and as cuts leave it.
struct Backlog {
    /// Records in `[forwarded mark, counted_until)`.
    records: u64,
    counted_until: u64,
    /// (end of the spool, when it was first seen there), oldest first: the age of the
    /// oldest record not forwarded is that of the first entry past the forwarded mark.
    ages: VecDeque<(u64, Instant)>,
}

impl StatusBoard {
    /// The status of `spool`, forwarded up to `forwarded`; what it holds beyond was
    /// spooled at `since` (at the latest).
    pub fn new(
        spool: Arc<Spool>,
        forwarded: u64,
        dead_letters: u64,
        since: Instant,
    ) -> StatusBoard {
        let board = StatusBoard {
            spool,
            upstream: AtomicU8::new(Upstream::Down as u8),
            upstream_error: Mutex::new(None),
            backlog: Mutex::new(Backlog {
                records: 0,
                counted_until: forwarded,
                ages: VecDeque::new(),
            }),
            forwarded_records: AtomicU64::new(0),
            forwarded_bytes: AtomicU64::new(0),
            dead_letters: AtomicU64::new(dead_letters),
            last_dead_letter: Mutex::new(None),
        };
        board.refresh_at(since);
        board
    }

    /// The upstream's state, and why it is not up (`None` once it is).
    pub fn set_upstream(&self, upstream: Upstream, error: Option<String>) {
        debug_assert!(upstream != Upstream::Up || error.is_none());
        *self.upstream_error.lock().ignore_poison() = error;
        self.upstream.store(upstream as u8, Ordering::Relaxed);
    }

    pub fn upstream(&self) -> Upstream {
        match self.upstream.load(Ordering::Relaxed) {
            1 => Upstream::Up,
            2 => Upstream::PushingBack,
            _ => Upstream::Down,
        }
    }

    /// Counts what was spooled since the last count.
    pub fn refresh(&self) {
        self.refresh_at(Instant::now());
    }

    fn refresh_at(&self, seen: Instant) {
        let mut backlog = self.backlog.lock().ignore_poison();
        let end = self.spool.spooled_end();
        if end <= backlog.counted_until {
            return;
        }
        match self.spool.count_spooled(backlog.counted_until, end) {
            Ok(records) => {
                backlog.records += records;
                backlog.counted_until = end;
                match backlog.ages.back_mut() {
                    Some((last_end, at)) if at.elapsed() < AGE_RESOLUTION => *last_end = end,
                    _ => backlog.ages.push_back((end, seen)),
                }
            }
            Err(e) => tracing::warn!(error = %e, "counting the spooled records"),
        }
    }

    /// The `records` before `to` (`bytes` long) left the spool.
    pub fn forwarded(&self, records: u64, bytes: u64, to: u64) {
        let mut backlog = self.backlog.lock().ignore_poison();
        if to <= backlog.counted_until {
            assert!(
                records <= backlog.records,
                "forwarded more records than were spooled"
            );
            backlog.records -= records;
        } else {
            // Read past the count: nothing counted is left, and counting resumes at `to`.
            backlog.records = 0;
            backlog.counted_until = to;
        }
        while backlog.ages.front().is_some_and(|&(end, _)| end <= to) {
            backlog.ages.pop_front();
        }
        drop(backlog);
        self.forwarded_records.fetch_add(records, Ordering::Relaxed);
        self.forwarded_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn dead_lettered(&self, reason: String) {
        self.dead_letters.fetch_add(1, Ordering::Relaxed);
        *self.last_dead_letter.lock().ignore_poison() = Some(reason);
    }

    pub fn snapshot(&self) -> Status {
        self.refresh();
        let backlog = self.backlog.lock().ignore_poison();
        let spooled_batches = backlog.records;
        let oldest = match spooled_batches {
            0 => Duration::ZERO,
            _ => backlog
                .ages
                .front()
                .map_or(Duration::ZERO, |(_, since)| since.elapsed()),
        };
        drop(backlog);
        Status {
            upstream: self.upstream().label().to_string(),
            upstream_error: self.upstream_error.lock().ignore_poison().clone(),
            spooled_batches,
            spooled_bytes: self.spool.spooled_bytes(),
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
    use tidemark_core::{BatchBuilder, Schema, Value};
    use tidemark_engine::{Options, Spool, SpoolOptions};

    #[test]
    fn counts_and_ages_follow_the_spool() {
        let dir = tempfile::tempdir().unwrap();
        let limits = SpoolOptions {
            max_bytes: 1 << 20,
            min_free_bytes: 0,
        };
        let db = Arc::new(Spool::open(dir.path(), Options::default(), limits).unwrap());
        let schema = Schema::parse_spec("V:LONG").unwrap();
        db.create_stream("s", schema.clone()).unwrap();
        let append = || {
            let mut b = BatchBuilder::new(schema.clone().into(), 1);
            b.push_row(1, None, &[Value::Long(1)]).unwrap();
            db.append("s", b.finish()).unwrap();
        };
        append();
        let created_and_one = db.spooled_end();
        let long_ago = Instant::now() - Duration::from_secs(5);
        let board = StatusBoard::new(db.clone(), 0, 0, long_ago);
        std::thread::sleep(AGE_RESOLUTION);
        append();
        let status = board.snapshot();
        assert_eq!(status.spooled_batches, 3);
        assert_eq!(status.spooled_bytes, db.spooled_end());
        assert!(status.oldest_spooled_age_ms >= 5000, "{status:?}");
        board.forwarded(2, created_and_one, created_and_one);
        let status = board.snapshot();
        assert_eq!((status.spooled_batches, status.forwarded_batches), (1, 2));
        assert!(status.oldest_spooled_age_ms < 5000, "{status:?}");
        // A cut read past the count.
        append();
        board.forwarded(2, 100, db.spooled_end());
        assert_eq!(board.snapshot().spooled_batches, 0);
        assert_eq!(board.snapshot().oldest_spooled_age_ms, 0);
        board.set_upstream(Upstream::Up, None);
        let text = board.snapshot().prometheus();
        assert!(
            text.contains("tidemark_agent_forwarded_batches_total 4\n"),
            "{text}"
        );
        assert!(text.contains("tidemark_agent_upstream_up 1\n"), "{text}");
    }
}

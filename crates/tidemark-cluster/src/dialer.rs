//! Opening connections to peers, and what the attempts found.
//!
//! openraft retries a peer it cannot reach many times a second (heartbeats, replication,
//! votes) and logs each failure. The dialer is the one place every connection to a peer is
//! opened, so it is where a node keeps each peer's reachability: it reports a peer that
//! became unreachable once, again each [`REMINDER`] while it stays so, and once more when it
//! is back, and `cluster status` shows how long a peer has been down.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::hello;
use crate::transport::{self, Halves, Isolation};
use tidemark_core::sync::IgnorePoison;

/// How often a peer that stays unreachable is reported again.
pub const REMINDER: Duration = Duration::from_secs(60);

/// A failure older than this says nothing about the peer now: a follower stops dialling a
/// dead leader once another is elected, and would otherwise show it down forever.
pub const STALE: Duration = Duration::from_secs(5);

#[derive(Clone, Default)]
pub struct Dialer {
    isolation: Isolation,
    peers: Arc<Mutex<HashMap<String, PeerHealth>>>,
    /// What every connection presents first ([`crate::hello`]); `None`: the cluster has none.
    secret: Option<Arc<str>>,
}

/// What connecting to one peer address has found so far.
#[derive(Debug, Clone, Default)]
struct PeerHealth {
    failed_connects: u64,
    /// Set at the first failure after a success (or ever, or after a pause of [`STALE`]),
    /// cleared by a success.
    down_since: Option<Instant>,
    last_failure: Option<Instant>,
    last_reported: Option<Instant>,
}

/// A peer's reachability, as `cluster status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reachability {
    /// Connection attempts to the peer that failed, since this node started.
    pub failed_connects: u64,
    /// How long every attempt to connect has failed, if the last one did (recently).
    pub down_for: Option<Duration>,
}

impl Dialer {
    /// A dialer whose connections present `secret` (the cluster file's).
    pub fn new(secret: Option<&str>) -> Dialer {
        Dialer {
            secret: secret.map(Arc::from),
            ..Dialer::default()
        }
    }

    pub fn isolation(&self) -> &Isolation {
        &self.isolation
    }

    /// Fails while this node is isolated from its peers.
    pub fn check(&self) -> io::Result<()> {
        self.isolation.check()
    }

    /// Opens a connection to the peer at `addr` and presents the cluster's secret on it,
    /// giving up after `timeout` (for the connection and the peer's answer together).
    pub async fn connect(&self, addr: &str, timeout: Duration) -> io::Result<Halves> {
        self.check()?;
        let started = tokio::time::Instant::now();
        let connected = match transport::connect(addr, timeout).await {
            Ok(mut halves) => {
                let left = timeout.saturating_sub(started.elapsed());
                hello::present(&mut halves, self.secret.as_deref(), left)
                    .await
                    .map(|()| halves)
            }
            Err(e) => Err(e),
        };
        self.record(addr, connected.as_ref().err(), Instant::now());
        connected
    }

    pub fn reachability(&self, addr: &str) -> Reachability {
        self.reachability_at(addr, Instant::now())
    }

    fn reachability_at(&self, addr: &str, now: Instant) -> Reachability {
        let peers = self.peers.lock().ignore_poison();
        let Some(health) = peers.get(addr) else {
            return Reachability::default();
        };
        let recent = health
            .last_failure
            .is_some_and(|at| now.saturating_duration_since(at) < STALE);
        Reachability {
            failed_connects: health.failed_connects,
            down_for: health
                .down_since
                .filter(|_| recent)
                .map(|since| now.saturating_duration_since(since)),
        }
    }

    fn record(&self, addr: &str, failure: Option<&io::Error>, now: Instant) {
        let mut peers = self.peers.lock().ignore_poison();
        let health = peers.entry(addr.to_string()).or_default();
        match failure {
            None => {
                if let Some(since) = health.down_since.take() {
                    tracing::info!(
                        peer = addr,
                        "the peer is reachable again after {:.1} s",
                        now.duration_since(since).as_secs_f64()
                    );
                    health.last_reported = None;
                }
            }
            Some(e) => {
                health.failed_connects += 1;
                let stale = health
                    .last_failure
                    .is_some_and(|at| now.duration_since(at) >= STALE);
                if stale {
                    health.down_since = None;
                    health.last_reported = None;
                }
                health.last_failure = Some(now);
                let since = *health.down_since.get_or_insert(now);
                let due = health
                    .last_reported
                    .is_none_or(|last| now.duration_since(last) >= REMINDER);
                if due {
                    health.last_reported = Some(now);
                    let down = now.duration_since(since);
                    if down.is_zero() {
                        tracing::warn!(peer = addr, error = %e, "cannot reach the peer; retrying with backoff");
                    } else {
                        tracing::warn!(
                            peer = addr,
                            error = %e,
                            "still cannot reach the peer after {:.0} s ({} failed attempts); retrying with backoff",
                            down.as_secs_f64(),
                            health.failed_connects
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_reported_down_once_per_reminder_and_up_once() {
        let dialer = Dialer::default();
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        let start = Instant::now();
        for i in 0..100u32 {
            dialer.record(
                "p:1",
                Some(&refused),
                start + Duration::from_millis(i.into()),
            );
        }
        let health = |d: &Dialer| d.peers.lock().unwrap()["p:1"].clone();
        assert_eq!(health(&dialer).failed_connects, 100);
        assert_eq!(health(&dialer).down_since, Some(start));
        assert_eq!(health(&dialer).last_reported, Some(start));
        // Still failing a minute later (attempts every second): reported again, once.
        for second in 1..=60u32 {
            let at = start + Duration::from_secs(second.into());
            dialer.record("p:1", Some(&refused), at);
        }
        assert_eq!(health(&dialer).down_since, Some(start));
        assert_eq!(health(&dialer).last_reported, Some(start + REMINDER));
        let last = start + REMINDER;
        assert_eq!(
            dialer.reachability_at("p:1", last + STALE / 2).down_for,
            Some(REMINDER + STALE / 2)
        );
        assert_eq!(dialer.reachability_at("p:1", last + STALE).down_for, None);

        // After a pause in the attempts, a failure is a new outage, reported at once.
        let later = start + REMINDER + STALE * 2;
        dialer.record("p:1", Some(&refused), later);
        assert_eq!(health(&dialer).down_since, Some(later));
        assert_eq!(health(&dialer).last_reported, Some(later));

        dialer.record("p:1", None, later + STALE);
        assert_eq!(health(&dialer).down_since, None);
        assert_eq!(dialer.reachability("p:1").down_for, None);
        assert_eq!(dialer.reachability("p:1").failed_connects, 161);
        assert_eq!(dialer.reachability("other:2"), Reachability::default());
    }
}

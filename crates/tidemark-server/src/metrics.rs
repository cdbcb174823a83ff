//! Counters the server keeps, and their rendering in the Prometheus text format.
//!
//! Written by hand rather than with a metrics crate: a dozen counters and one histogram
//! rendered as text are less code than wiring a registry, and the format is stable.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use tidemark_cluster::ClusterStatus;
use tidemark_engine::{ConsumerInfo, LogStats, TierStatus, FSYNC_BUCKETS_SECONDS};
use tidemark_sql::{PlanCache, Planning};

use crate::store::StoreErrorKind;

/// Why a request was refused, as the `reason` label of `tidemark_rejected_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    Overloaded,
    TooLarge,
    BadRequest,
    Unauthorized,
    NotFound,
    Unavailable,
}

impl Rejection {
    /// How a refusal of `kind` is counted, whatever the protocol that answered it; `None`
    /// for a fault of the server's, which is no refusal. The one place a kind becomes a
    /// reason: every transport counts its refusals by it.
    pub fn of(kind: StoreErrorKind) -> Option<Rejection> {
        use StoreErrorKind as K;
        Some(match kind {
            K::Invalid | K::StreamExists | K::Conflict | K::Gone => Rejection::BadRequest,
            K::TooLarge => Rejection::TooLarge,
            K::UnknownStream | K::NotFound => Rejection::NotFound,
            K::Overloaded => Rejection::Overloaded,
            K::Unavailable | K::ReadOnly => Rejection::Unavailable,
            K::Unauthorized => Rejection::Unauthorized,
            K::Internal => return None,
        })
    }

    const ALL: [Rejection; 6] = [
        Rejection::Overloaded,
        Rejection::TooLarge,
        Rejection::BadRequest,
        Rejection::Unauthorized,
        Rejection::NotFound,
        Rejection::Unavailable,
    ];

    fn label(self) -> &'static str {
        match self {
            Rejection::Overloaded => "overloaded",
            Rejection::TooLarge => "too_large",
            Rejection::BadRequest => "bad_request",
            Rejection::Unauthorized => "unauthorized",
            Rejection::NotFound => "not_found",
            Rejection::Unavailable => "unavailable",
        }
    }
}

/// A protocol of other tools that Tidemark speaks, as the `protocol` label of the
/// `tidemark_protocol_*` counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// InfluxDB line protocol (`/write`, `/api/v2/write`).
    InfluxLine,
    /// Graphite plaintext (its own TCP listener); a "request" is a batch of lines.
    Graphite,
    /// Prometheus remote write (`/api/v1/write`).
    PrometheusWrite,
    /// Prometheus remote read (`/api/v1/read`): requests only, no events.
    PrometheusRead,
    /// The PostgreSQL wire protocol (its own listener): a "request" is a statement.
    Postgres,
}

impl Protocol {
    const ALL: [Protocol; 5] = [
        Protocol::InfluxLine,
        Protocol::Graphite,
        Protocol::PrometheusWrite,
        Protocol::PrometheusRead,
        Protocol::Postgres,
    ];

    fn label(self) -> &'static str {
        match self {
            Protocol::InfluxLine => "influx_line",
            Protocol::Graphite => "graphite",
            Protocol::PrometheusWrite => "prometheus_remote_write",
            Protocol::PrometheusRead => "prometheus_remote_read",
            Protocol::Postgres => "postgresql",
        }
    }

    fn index(self) -> usize {
        Protocol::ALL.iter().position(|&p| p == self).unwrap_or(0)
    }

    /// Whether requests of the protocol store events (remote read only reads).
    fn stores_events(self) -> bool {
        !matches!(self, Protocol::PrometheusRead | Protocol::Postgres)
    }

    /// Whether the protocol skips bad lines instead of refusing a request (it has no
    /// answer to refuse with).
    fn skips_bad_lines(self) -> bool {
        self == Protocol::Graphite
    }
}

/// Requests and events of one protocol.
#[derive(Debug, Default)]
struct ProtocolCounters {
    /// Requests stored (or, of a protocol that reads, answered).
    stored: AtomicU64,
    refused: AtomicU64,
    events: AtomicU64,
    bad_lines: AtomicU64,
}

#[derive(Debug, Default)]
pub struct Metrics {
    events_appended: AtomicU64,
    batches_appended: AtomicU64,
    bytes_received: AtomicU64,
    rejected: [AtomicU64; Rejection::ALL.len()],
    protocols: [ProtocolCounters; Protocol::ALL.len()],
}

/// What `/metrics` shows besides the server's own counters.
pub struct Gauges<'a> {
    pub bytes_in_flight: usize,
    pub requests_in_flight: usize,
    pub log: &'a LogStats,
    /// (namespace, stream, events)
    pub streams: &'a [(&'static str, String, u64)],
    /// (namespace, stream, consumer): each named consumer of each stream.
    pub consumers: &'a [(&'static str, String, ConsumerInfo)],
    /// Reads that follow a stream or wait now (`limits.max_subscriptions`).
    pub subscriptions: usize,
    pub uptime_seconds: f64,
    /// This node's view of its Raft group, when it is a cluster node.
    pub raft: Option<&'a ClusterStatus>,
    /// What tiering has done and holds, when the server tiers.
    pub tier: Option<&'a TierStatus>,
    /// SQL statements by how their plans were made.
    pub sql_plans: &'a PlanCache,
    /// What running SQL queries take of what they share.
    pub sql: SqlGauges,
}

/// What running SQL queries take of what they share ([`tidemark_sql::resources`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SqlGauges {
    pub running: usize,
    pub memory_bytes: usize,
    pub spill_bytes: u64,
    /// Long computations running off the query workers ([`tidemark_sql::runtime::heavy_running`]).
    pub heavy: usize,
}

impl SqlGauges {
    pub fn of(resources: &tidemark_sql::QueryResources) -> SqlGauges {
        SqlGauges {
            running: resources.running(),
            memory_bytes: resources.memory_reserved(),
            spill_bytes: resources.spilled_bytes(),
            heavy: tidemark_sql::runtime::heavy_running(),
        }
    }
}

impl Metrics {
    pub fn appended(&self, events: usize, bytes: usize) {
        self.events_appended
            .fetch_add(events as u64, Ordering::Relaxed);
        self.batches_appended.fetch_add(1, Ordering::Relaxed);
        self.bytes_received
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// A request of `protocol` whose `events` were stored.
    pub fn protocol_stored(&self, protocol: Protocol, events: u64) {
        let counters = &self.protocols[protocol.index()];
        counters.stored.fetch_add(1, Ordering::Relaxed);
        counters.events.fetch_add(events, Ordering::Relaxed);
    }

    /// A read request of `protocol` answered.
    pub fn protocol_answered(&self, protocol: Protocol) {
        self.protocol_stored(protocol, 0);
    }

    /// A request of `protocol` refused (bad input, back-pressure, auth) or failed.
    pub fn protocol_refused(&self, protocol: Protocol) {
        self.protocols[protocol.index()]
            .refused
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A line of `protocol` skipped as bad, in a protocol that has no answer to refuse it with.
    pub fn protocol_bad_line(&self, protocol: Protocol) {
        self.protocols[protocol.index()]
            .bad_lines
            .fetch_add(1, Ordering::Relaxed);
    }

    pub fn rejected(&self, why: Rejection) {
        let index = Rejection::ALL.iter().position(|&r| r == why).unwrap_or(0);
        self.rejected[index].fetch_add(1, Ordering::Relaxed);
    }

    pub fn rejected_count(&self, why: Rejection) -> u64 {
        let index = Rejection::ALL.iter().position(|&r| r == why).unwrap_or(0);
        self.rejected[index].load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self, gauges: &Gauges<'_>) -> String {
        let mut out = String::new();
        self.render_requests(&mut out, gauges);
        self.render_protocols(&mut out);
        render_log(&mut out, gauges.log);
        render_streams(&mut out, gauges.streams);
        render_consumers(&mut out, gauges.consumers, gauges.subscriptions);
        if let Some(raft) = gauges.raft {
            render_raft(&mut out, raft);
        }
        if let Some(tier) = gauges.tier {
            render_tier(&mut out, tier);
        }
        render_sql(&mut out, gauges.sql_plans, &gauges.sql);
        metric(
            &mut out,
            "tidemark_uptime_seconds",
            "gauge",
            "Seconds since the server started.",
            gauges.uptime_seconds,
        );
        out
    }

    /// What the server took in: appends acknowledged, requests held, requests refused.
    fn render_requests(&self, out: &mut String, gauges: &Gauges<'_>) {
        metric(
            out,
            "tidemark_events_appended_total",
            "counter",
            "Events acknowledged (durable).",
            load(&self.events_appended),
        );
        metric(
            out,
            "tidemark_batches_appended_total",
            "counter",
            "Append requests acknowledged.",
            load(&self.batches_appended),
        );
        metric(
            out,
            "tidemark_append_bytes_received_total",
            "counter",
            "Request bytes of acknowledged appends.",
            load(&self.bytes_received),
        );
        metric(
            out,
            "tidemark_ingest_bytes_in_flight",
            "gauge",
            "Request bytes admitted and not yet answered.",
            gauges.bytes_in_flight,
        );
        metric(
            out,
            "tidemark_ingest_requests_in_flight",
            "gauge",
            "Requests admitted and not yet answered.",
            gauges.requests_in_flight,
        );
        header(
            out,
            "tidemark_rejected_requests_total",
            "counter",
            "Requests refused, by reason.",
        );
        for (why, count) in Rejection::ALL.iter().zip(&self.rejected) {
            let _ = writeln!(
                out,
                "tidemark_rejected_requests_total{{reason=\"{}\"}} {}",
                why.label(),
                load(count)
            );
        }
    }

    /// Requests, events and bad lines of other tools' protocols.
    fn render_protocols(&self, out: &mut String) {
        header(
            out,
            "tidemark_protocol_requests_total",
            "counter",
            "Requests of other tools' protocols, by protocol and outcome.",
        );
        for (protocol, counters) in Protocol::ALL.iter().zip(&self.protocols) {
            let done = if protocol.stores_events() {
                "stored"
            } else {
                "answered"
            };
            for (outcome, count) in [(done, &counters.stored), ("refused", &counters.refused)] {
                let _ = writeln!(
                    out,
                    "tidemark_protocol_requests_total{{protocol=\"{}\",outcome=\"{outcome}\"}} {}",
                    protocol.label(),
                    load(count)
                );
            }
        }
        header(
            out,
            "tidemark_protocol_events_total",
            "counter",
            "Events stored through other tools' protocols.",
        );
        for (protocol, counters) in Protocol::ALL.iter().zip(&self.protocols) {
            if !protocol.stores_events() {
                continue;
            }
            let _ = writeln!(
                out,
                "tidemark_protocol_events_total{{protocol=\"{}\"}} {}",
                protocol.label(),
                load(&counters.events)
            );
        }
        header(
            out,
            "tidemark_protocol_bad_lines_total",
            "counter",
            "Lines skipped as bad by protocols that cannot refuse them (Graphite).",
        );
        for (protocol, counters) in Protocol::ALL.iter().zip(&self.protocols) {
            if !protocol.skips_bad_lines() {
                continue;
            }
            let _ = writeln!(
                out,
                "tidemark_protocol_bad_lines_total{{protocol=\"{}\"}} {}",
                protocol.label(),
                load(&counters.bad_lines)
            );
        }
    }
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// The replicated store's log: its writes and the latency histogram of its fsyncs.
fn render_log(out: &mut String, log: &LogStats) {
    metric(
        out,
        "tidemark_log_group_commits_total",
        "counter",
        "Log writes, each followed by one fsync.",
        log.groups,
    );
    metric(
        out,
        "tidemark_log_records_total",
        "counter",
        "Log records written.",
        log.records,
    );
    metric(
        out,
        "tidemark_log_bytes_total",
        "counter",
        "Log bytes written.",
        log.bytes,
    );
    header(
        out,
        "tidemark_log_fsync_seconds",
        "histogram",
        "Latency of each log fsync.",
    );
    let mut cumulative = 0;
    for (i, count) in log.fsync_buckets.iter().enumerate() {
        cumulative += count;
        match FSYNC_BUCKETS_SECONDS.get(i) {
            Some(le) => {
                let _ = writeln!(
                    out,
                    "tidemark_log_fsync_seconds_bucket{{le=\"{le}\"}} {cumulative}"
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "tidemark_log_fsync_seconds_bucket{{le=\"+Inf\"}} {cumulative}"
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "tidemark_log_fsync_seconds_sum {}",
        log.fsync_seconds_total
    );
    let _ = writeln!(out, "tidemark_log_fsync_seconds_count {cumulative}");
}

/// Events per stream: `(namespace, stream, events)`.
fn render_streams(out: &mut String, streams: &[(&'static str, String, u64)]) {
    header(
        out,
        "tidemark_stream_events",
        "gauge",
        "Events stored per stream.",
    );
    for (namespace, stream, events) in streams {
        let _ = writeln!(
            out,
            "tidemark_stream_events{{namespace=\"{namespace}\",stream=\"{}\"}} {events}",
            escape_label(stream)
        );
    }
}

/// Named consumers' lag, and the follows being served.
fn render_consumers(
    out: &mut String,
    consumers: &[(&'static str, String, ConsumerInfo)],
    subscriptions: usize,
) {
    header(
        out,
        "tidemark_consumer_behind_positions",
        "gauge",
        "Positions a stream gave after the one its named consumer committed.",
    );
    for (namespace, stream, consumer) in consumers {
        let _ = writeln!(
            out,
            "tidemark_consumer_behind_positions{{namespace=\"{namespace}\",stream=\"{}\",consumer=\"{}\"}} {}",
            escape_label(stream),
            escape_label(&consumer.name),
            consumer.behind
        );
    }
    metric(
        out,
        "tidemark_subscriptions",
        "gauge",
        "Reads that follow a stream or wait for it now.",
        subscriptions,
    );
}

/// SQL: statements by how they were planned, and what running queries take.
fn render_sql(out: &mut String, plans: &PlanCache, sql: &SqlGauges) {
    header(
        out,
        "tidemark_sql_statements_total",
        "counter",
        "SQL statements by how their plans were made: afresh, from a kept plan (reused), or a kept plan moved to the query's instant (moved).",
    );
    for how in Planning::ALL {
        let _ = writeln!(
            out,
            "tidemark_sql_statements_total{{plan=\"{}\"}} {}",
            how.name(),
            plans.planned(how)
        );
    }
    metric(
        out,
        "tidemark_sql_queries_running",
        "gauge",
        "SQL queries running (planning, or with their answer unfinished); at most limits.max_concurrent_queries.",
        sql.running,
    );
    metric(
        out,
        "tidemark_sql_memory_reserved_bytes",
        "gauge",
        "Memory the running SQL queries' operators hold; at most limits.query_memory_bytes.",
        sql.memory_bytes,
    );
    metric(
        out,
        "tidemark_sql_spill_bytes",
        "gauge",
        "Bytes the running SQL queries have spilled to disk; at most limits.query_spill_bytes.",
        sql.spill_bytes,
    );
    metric(
        out,
        "tidemark_sql_heavy_computations_running",
        "gauge",
        "Long computations inside one SQL function call running off the query workers (at most one fewer than the cores).",
        sql.heavy,
    );
}

/// The Raft gauges of a cluster node; an index not known yet is left out.
fn render_raft(out: &mut String, raft: &ClusterStatus) {
    metric(
        out,
        "tidemark_raft_term",
        "gauge",
        "The current Raft term.",
        raft.term,
    );
    metric(
        out,
        "tidemark_raft_is_leader",
        "gauge",
        "1 if this node is the leader.",
        u8::from(raft.leader == Some(raft.node)),
    );
    let indexes = [
        (
            "tidemark_raft_last_log_index",
            "The last entry in this node's Raft log.",
            raft.last_log_index,
        ),
        (
            "tidemark_raft_committed_index",
            "The last entry this node knows committed.",
            raft.committed,
        ),
        (
            "tidemark_raft_applied_index",
            "The last entry this node has applied.",
            raft.applied,
        ),
        (
            "tidemark_raft_snapshot_index",
            "The last entry in this node's snapshot.",
            raft.snapshot,
        ),
    ];
    for (name, help, value) in indexes {
        if let Some(value) = value {
            metric(out, name, "gauge", help, value);
        }
    }
    header(
        out,
        "tidemark_raft_node_lag_entries",
        "gauge",
        "Committed entries not known to be on each node (the leader knows every node).",
    );
    for node in &raft.nodes {
        if let Some(lag) = node.lag {
            let _ = writeln!(
                out,
                "tidemark_raft_node_lag_entries{{node=\"{}\"}} {lag}",
                node.id
            );
        }
    }
    header(
        out,
        "tidemark_raft_node_failed_connects_total",
        "counter",
        "Attempts of this node to connect to each other node that failed.",
    );
    for node in raft.nodes.iter().filter(|n| n.id != raft.node) {
        let _ = writeln!(
            out,
            "tidemark_raft_node_failed_connects_total{{node=\"{}\"}} {}",
            node.id, node.failed_connects
        );
    }
}

/// Tiering to the bucket (`tidemark_engine::tier`).
fn render_tier(out: &mut String, tier: &TierStatus) {
    let rows: [(&str, &str, &str, u64); 13] = [
        (
            "tidemark_tier_tiered_segments",
            "gauge",
            "Segments whose data is in the bucket.",
            tier.tiered_segments,
        ),
        (
            "tidemark_tier_tiered_bytes",
            "gauge",
            "Bytes of segments in the bucket.",
            tier.tiered_bytes,
        ),
        (
            "tidemark_tier_pending_segments",
            "gauge",
            "Local segments old enough to move, not moved yet.",
            tier.pending_segments,
        ),
        (
            "tidemark_tier_pending_bytes",
            "gauge",
            "Bytes of local segments old enough to move.",
            tier.pending_bytes,
        ),
        (
            "tidemark_tier_uploaded_segments_total",
            "counter",
            "Segments uploaded and verified.",
            tier.uploaded_segments,
        ),
        (
            "tidemark_tier_uploaded_bytes_total",
            "counter",
            "Bytes uploaded and verified.",
            tier.uploaded_bytes,
        ),
        (
            "tidemark_tier_deleted_objects_total",
            "counter",
            "Objects deleted (retention, drops, the sweeper).",
            tier.deleted_objects,
        ),
        (
            "tidemark_tier_read_requests_total",
            "counter",
            "Ranged reads of tiered segments sent to the bucket.",
            tier.requests,
        ),
        (
            "tidemark_tier_read_bytes_total",
            "counter",
            "Bytes those reads brought.",
            tier.fetched_bytes,
        ),
        (
            "tidemark_tier_cache_hits_total",
            "counter",
            "Reads of tiered segments answered by the cache alone.",
            tier.cache_hits,
        ),
        (
            "tidemark_tier_cache_bytes",
            "gauge",
            "Bytes of tiered segments in the cache.",
            tier.cache_bytes,
        ),
        (
            "tidemark_tier_failures_total",
            "counter",
            "Tiering rounds that failed (the bucket down, slow or refusing).",
            tier.failures,
        ),
        (
            "tidemark_tier_failing",
            "gauge",
            "1 while the last tiering round failed.",
            u64::from(tier.last_error.is_some()),
        ),
    ];
    for (name, kind, help, value) in rows {
        metric(out, name, kind, help, value);
    }
    metric(
        out,
        "tidemark_tier_upload_seconds_total",
        "counter",
        "Time spent uploading segments, verification included.",
        tier.upload_time.as_secs_f64(),
    );
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

/// Label values escape backslash, double quote and newline.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histogram_and_escaped_labels() {
        let metrics = Metrics::default();
        metrics.appended(10, 500);
        metrics.rejected(Rejection::Overloaded);
        let log = LogStats {
            groups: 2,
            records: 3,
            bytes: 99,
            fsync_buckets: {
                let mut b = vec![0; FSYNC_BUCKETS_SECONDS.len() + 1];
                b[0] = 1;
                b[5] = 1;
                b
            },
            fsync_seconds_total: 0.004,
        };
        let streams = [("replicated", "we\"ird".to_string(), 10)];
        let node = |id, lag: Option<u64>| tidemark_cluster::NodeStatus {
            id,
            addrs: Default::default(),
            voter: true,
            matched: lag.map(|l| 40 - l),
            lag,
            failed_connects: id * 10,
            unreachable_ms: None,
        };
        let raft = ClusterStatus {
            node: 1,
            state: "Leader".into(),
            leader: Some(1),
            term: 3,
            last_log_index: Some(41),
            committed: Some(40),
            applied: Some(40),
            snapshot: None,
            purged: None,
            nodes: vec![node(1, Some(0)), node(2, Some(5)), node(3, None)],
        };
        let text = metrics.render(&Gauges {
            bytes_in_flight: 7,
            requests_in_flight: 1,
            log: &log,
            streams: &streams,
            consumers: &[(
                "replicated",
                "t\"s".into(),
                ConsumerInfo {
                    name: "billing".into(),
                    position: 4,
                    behind: 6,
                },
            )],
            subscriptions: 2,
            uptime_seconds: 1.5,
            raft: Some(&raft),
            tier: None,
            sql_plans: &PlanCache::new(0),
            sql: SqlGauges::default(),
        });
        assert!(
            !text.contains("tidemark_raft_snapshot_index "),
            "unknown indexes are left out"
        );
        assert!(
            !text.contains("tidemark_raft_node_lag_entries{node=\"3\"}"),
            "unknown lags are left out"
        );
        assert!(
            !text.contains("tidemark_raft_node_failed_connects_total{node=\"1\"}"),
            "a node does not connect to itself"
        );
        for line in [
            "tidemark_consumer_behind_positions{namespace=\"replicated\",stream=\"t\\\"s\",consumer=\"billing\"} 6",
            "tidemark_subscriptions 2",
            "tidemark_events_appended_total 10",
            "tidemark_rejected_requests_total{reason=\"overloaded\"} 1",
            "tidemark_rejected_requests_total{reason=\"too_large\"} 0",
            "tidemark_log_fsync_seconds_bucket{le=\"0.0001\"} 1",
            "tidemark_log_fsync_seconds_bucket{le=\"0.005\"} 2",
            "tidemark_log_fsync_seconds_bucket{le=\"+Inf\"} 2",
            "tidemark_log_fsync_seconds_count 2",
            "tidemark_stream_events{namespace=\"replicated\",stream=\"we\\\"ird\"} 10",
            "tidemark_ingest_bytes_in_flight 7",
            "tidemark_raft_term 3",
            "tidemark_raft_is_leader 1",
            "tidemark_raft_committed_index 40",
            "tidemark_raft_node_lag_entries{node=\"2\"} 5",
            "tidemark_raft_node_failed_connects_total{node=\"3\"} 30",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}

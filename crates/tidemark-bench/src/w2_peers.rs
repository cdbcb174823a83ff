//! W2 over Prometheus remote write: against Prometheus, the same hosts and series, one
//! remote-write request per host per second (labels `__name__` = series, `host`), the same
//! two queries in PromQL (`max_over_time` at the bucket's step), bits per point from a TSDB
//! snapshot; and against Tidemark fed exactly the same requests at its own
//! `/api/v1/write` (a stream per series, `host` a field), queried in SQL.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tidemark_client::HttpClient;

use crate::peers::prometheus::{remote_write, write_request, Prometheus, RemoteWriteError};
use crate::w2::{Layout, MetricsTarget, Query, Stored, W2Error};
use crate::w3::ServerTarget;

pub struct PrometheusMetrics {
    pub prometheus: Prometheus,
}

impl Query {
    /// The query in PromQL, with its range in seconds and its step.
    pub fn promql(&self) -> (String, u64, u64) {
        match self {
            Query::OneSeriesHour { host, series } => (
                format!("max_over_time({series}{{host=\"{host}\"}}[1m])"),
                3600,
                60,
            ),
            Query::SevenSeriesDay { host, series } => (
                // max_over_time drops the metric name; each series keeps it as a `series`
                // label so the seven results stay apart (one request, like Tidemark's one
                // SQL statement).
                series
                    .iter()
                    .map(|s| {
                        format!(
                            "label_replace(max_over_time({s}{{host=\"{host}\"}}[1h]), \"series\", \"{s}\", \"\", \"\")"
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" or "),
                86_400,
                3600,
            ),
        }
    }
}

/// Sends each of `hosts`' points of `second` as one remote-write request to `base`, sending
/// a request again after the hint when it is pushed back (as Prometheus's sender does).
fn remote_write_second(
    agent: &ureq::Agent,
    base: &str,
    token: Option<&str>,
    layout: &Layout,
    hosts: &[usize],
    second: u64,
    unix_s: i64,
) -> Result<(), W2Error> {
    for &host in hosts {
        let body = write_request(
            &Layout::host_name(host),
            layout.series_names(),
            layout.values(host, second),
            unix_s * 1000,
        );
        loop {
            match remote_write(agent, base, token, &body) {
                Ok(()) => break,
                Err(RemoteWriteError::PushedBack { retry_after, .. }) => {
                    std::thread::sleep(retry_after.min(Duration::from_millis(50)))
                }
                Err(e) => return Err(W2Error::Target(e.to_string())),
            }
        }
    }
    Ok(())
}

impl MetricsTarget for PrometheusMetrics {
    type Connection = ureq::Agent;

    fn connect(&self) -> Result<ureq::Agent, W2Error> {
        Ok(self.prometheus.agent())
    }

    fn send_second(
        &self,
        agent: &mut ureq::Agent,
        layout: &Layout,
        hosts: &[usize],
        second: u64,
        unix_s: i64,
    ) -> Result<(), W2Error> {
        remote_write_second(
            agent,
            self.prometheus.base(),
            None,
            layout,
            hosts,
            second,
            unix_s,
        )
    }

    fn pid(&self) -> Option<u32> {
        Some(self.prometheus.pid())
    }

    fn query(&self, query: &Query) -> Result<usize, W2Error> {
        let (promql, range, step) = query.promql();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.prometheus
            .query_range(&promql, now - range as i64, now, step)
            .map_err(W2Error::Target)
    }
}

/// A Tidemark server that receives W2 as Prometheus does: the same remote-write requests.
pub struct TidemarkRemoteWrite {
    server: ServerTarget,
    http: HttpClient,
}

impl TidemarkRemoteWrite {
    pub fn new(server: ServerTarget) -> TidemarkRemoteWrite {
        let http = HttpClient::new(&server.http, server.token.as_deref());
        TidemarkRemoteWrite { server, http }
    }

    /// Segment bytes and the points in them, over every series' stream.
    pub fn stored(&self, layout: &Layout) -> Result<Stored, W2Error> {
        let mut stored = Stored::default();
        for series in layout.series_names() {
            let info = self.http.stream_info(series)?;
            let number = |key: &str| {
                info[key]
                    .as_u64()
                    .ok_or_else(|| W2Error::Target(format!("stream info has no {key}: {info}")))
            };
            stored.bytes += number("bytesOnDisk")?;
            stored.points += number("flushedEvents")?;
        }
        Ok(stored)
    }
}

impl Query {
    /// The query in SQL over the streams remote write makes: one per series, `host` a field.
    pub fn remote_write_sql(&self) -> String {
        let (bucket, range, host, series): (_, _, _, &[String]) = match self {
            Query::OneSeriesHour { host, series } => {
                ("1 minute", "1 hour", host, std::slice::from_ref(series))
            }
            Query::SevenSeriesDay { host, series } => ("1 hour", "1 day", host, series),
        };
        series
            .iter()
            .map(|s| {
                format!(
                    "SELECT '{s}' AS series, time_bucket('{bucket}', ts) AS bucket, max(value) \
                     FROM \"{s}\" WHERE host = '{host}' AND ts >= now() - INTERVAL '{range}' \
                     GROUP BY bucket"
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ")
    }
}

impl MetricsTarget for TidemarkRemoteWrite {
    type Connection = ureq::Agent;

    fn connect(&self) -> Result<ureq::Agent, W2Error> {
        Ok(ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into())
    }

    fn send_second(
        &self,
        agent: &mut ureq::Agent,
        layout: &Layout,
        hosts: &[usize],
        second: u64,
        unix_s: i64,
    ) -> Result<(), W2Error> {
        remote_write_second(
            agent,
            &self.server.http,
            self.server.token.as_deref(),
            layout,
            hosts,
            second,
            unix_s,
        )
    }

    fn pid(&self) -> Option<u32> {
        self.server.pid
    }

    fn query(&self, query: &Query) -> Result<usize, W2Error> {
        let answer = self.http.query(&query.remote_write_sql())?;
        answer["rows"]
            .as_array()
            .map(Vec::len)
            .ok_or_else(|| W2Error::Target(format!("query answer without rows: {answer}")))
    }
}

//! W2 against Prometheus: the same hosts and series, one remote-write request per host per
//! second (labels `__name__` = series, `host`), the same two queries in PromQL
//! (`max_over_time` at the bucket's step), bits per point from a TSDB snapshot.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::peers::prometheus::{write_request, Prometheus};
use crate::w2::{Layout, MetricsTarget, Query, W2Error};

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
        for &host in hosts {
            let body = write_request(
                &Layout::host_name(host),
                layout.series_names(),
                layout.values(host, second),
                unix_s * 1000,
            );
            self.prometheus
                .remote_write(agent, &body)
                .map_err(W2Error::Target)?;
        }
        Ok(())
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

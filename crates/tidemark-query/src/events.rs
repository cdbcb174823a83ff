//! Reading a stream's events as they were written: the one definition of a scan from
//! people's terms (a time range, fields, filters, a limit), shared by `tidemark scan` and the
//! server's `GET /v1/streams/{s}/events`, so the two print the same thing.

use std::io::{self, Write};

use tidemark_core::{EventBatch, Schema};
use tidemark_engine::{EngineError, ScanRequest, TimeRange};

use crate::output::{write_csv_batch, write_csv_header, write_json_batch, Times};
use crate::spec::parse_predicate;
use crate::time::{parse_duration, parse_instant};
use crate::QueryError;

/// The events to read, as a person gives them.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    /// Start (inclusive): any form [`parse_instant`] reads.
    pub from: Option<String>,
    /// End (exclusive).
    pub to: Option<String>,
    /// The span before now, e.g. `1h` (instead of from/to).
    pub last: Option<String>,
    /// Fields to include (default all).
    pub fields: Option<Vec<String>>,
    /// Conditions like `SYMBOL = AAPL`, all of which must hold.
    pub filters: Vec<String>,
    pub limit: Option<usize>,
}

/// How events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFormat {
    /// One JSON object per line: `{"tstart", "tend"?, FIELD...}`.
    Jsonl,
    /// A header `tstart,tend,FIELD..` and a row per event.
    Csv,
}

/// Why events could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error(transparent)]
    Query(#[from] QueryError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("writing the events: {0}")]
    Io(#[from] io::Error),
}

impl EventQuery {
    /// The time range: `last` before `now`, or from (inclusive) .. to (exclusive), either
    /// end open when absent.
    pub fn range(&self, now: i64) -> Result<TimeRange, QueryError> {
        if self.last.is_some() && (self.from.is_some() || self.to.is_some()) {
            return Err(QueryError(
                "give either last or from/to, not both".to_string(),
            ));
        }
        if let Some(last) = &self.last {
            return Ok(TimeRange::half_open(
                now - parse_duration(last)?,
                now.saturating_add(1),
            ));
        }
        let instant = |t: &Option<String>| t.as_deref().map(|t| parse_instant(t, now)).transpose();
        let from = instant(&self.from)?.unwrap_or(i64::MIN);
        Ok(match instant(&self.to)? {
            Some(to) => TimeRange::half_open(from, to),
            None => TimeRange::new(from, i64::MAX),
        })
    }

    /// The schema of the events written for a stream of `schema`: its fields, or those
    /// asked for, in the order asked (as the engine projects them).
    pub fn output_schema(&self, schema: &Schema) -> Result<Schema, QueryError> {
        let Some(names) = &self.fields else {
            return Ok(schema.clone());
        };
        let indices = names
            .iter()
            .map(|name| {
                schema.index_of(name).ok_or_else(|| {
                    QueryError(format!("no field {name:?} in the schema ({schema})"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(schema.project(&indices))
    }

    /// The engine request for a stream of `schema`.
    pub fn request(&self, schema: &Schema, now: i64) -> Result<ScanRequest, QueryError> {
        Ok(ScanRequest {
            range: self.range(now)?,
            fields: self.fields.clone(),
            filter: self
                .filters
                .iter()
                .map(|f| parse_predicate(f, schema))
                .collect::<Result<_, _>>()?,
            ..ScanRequest::default()
        })
    }
}

/// Writes the events of `scan` (batches whose schema is `schema`: see
/// [`EventQuery::output_schema`]), at most `limit`, and returns how many it wrote. A CSV
/// gets its header even when no event matched.
pub fn write_events(
    scan: impl Iterator<Item = Result<EventBatch, EngineError>>,
    schema: &Schema,
    limit: Option<usize>,
    format: EventFormat,
    times: Times,
    out: &mut impl Write,
) -> Result<u64, EventsError> {
    let mut left = limit.unwrap_or(usize::MAX);
    let mut written = 0u64;
    if format == EventFormat::Csv {
        write_csv_header(schema, out)?;
    }
    for batch in scan {
        if left == 0 {
            break;
        }
        let mut batch = batch?;
        if batch.len() > left {
            batch = batch.take(&(0..left as u32).collect::<Vec<_>>());
        }
        left -= batch.len();
        written += batch.len() as u64;
        match format {
            EventFormat::Jsonl => write_json_batch(&batch, times, out)?,
            EventFormat::Csv => write_csv_batch(&batch, false, times, out)?,
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_csv_header_names_the_fields_asked_for() {
        let schema = Schema::parse_spec("SYMBOL:STRING,PRICE:DOUBLE").unwrap();
        let query = EventQuery {
            fields: Some(vec!["price".into()]),
            ..EventQuery::default()
        };
        let projected = query.output_schema(&schema).unwrap();
        let mut out = Vec::new();
        let none = std::iter::empty();
        write_events(
            none,
            &projected,
            None,
            EventFormat::Csv,
            Times::Nanoseconds,
            &mut out,
        )
        .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "tstart,tend,PRICE\n");
        let unknown = EventQuery {
            fields: Some(vec!["NOPE".into()]),
            ..EventQuery::default()
        };
        assert!(unknown.output_schema(&schema).is_err());
    }

    #[test]
    fn ranges_from_people_terms() {
        let hour = 3_600_000_000_000;
        let last = EventQuery {
            last: Some("1h".into()),
            ..EventQuery::default()
        };
        assert_eq!(
            last.range(5 * hour).unwrap(),
            TimeRange::half_open(4 * hour, 5 * hour + 1)
        );
        let between = EventQuery {
            from: Some("1970-01-01T01:00:00Z".into()),
            to: Some("now".into()),
            ..EventQuery::default()
        };
        assert_eq!(
            between.range(2 * hour).unwrap(),
            TimeRange::half_open(hour, 2 * hour)
        );
        let both = EventQuery {
            last: Some("1h".into()),
            from: Some("0".into()),
            ..EventQuery::default()
        };
        assert!(both.range(0).is_err());
    }
}

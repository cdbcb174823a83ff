//! Prometheus remote read over the local database: the series of the streams Prometheus
//! remote write made, selected by label matchers over a time range, in the shape Prometheus
//! takes them back (`prompb::TimeSeries`, labels sorted by name, samples in time order).
//!
//! A stream is a metric (its name is `__name__`) when it has the shape remote write gives
//! it: a `value` DOUBLE field and every other field STRING (the labels). A label a stream
//! lacks, or an event leaves null, has the value "" — Prometheus's rule, under which
//! `job=""` selects the series without a `job`.
//!
//! Transport-neutral: the HTTP route decodes the request and encodes the answer.

use std::collections::HashMap;
use std::time::Instant;

use regex::{Regex, RegexBuilder};
use tidemark_core::{Column, ColumnData, FieldType, Schema, Value};
use tidemark_engine::{CmpOp, Engine, EngineError, Predicate, ScanRequest, TimeRange};
use tidemark_protocol::prometheus::{Label, LabelMatcher, MatchType, Query, Sample, TimeSeries};

/// The label whose value is the metric's name (the stream's).
pub const NAME_LABEL: &str = "__name__";
/// The field that holds each sample's value.
pub const VALUE_FIELD: &str = "value";

const NANOS_PER_MILLI: i64 = 1_000_000;

/// The most a compiled `=~` expression may take (the regex crate's default is 10 MiB).
const MAX_REGEX_BYTES: usize = 1 << 20;

/// The most label matchers one read request may carry, over all its queries: with
/// [`MAX_REGEX_BYTES`], a bound on what compiling them may take (Prometheus sends one query
/// of a few matchers).
pub const MAX_MATCHERS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("label matcher {name:?}: {reason}")]
    Matcher { name: String, reason: String },
    #[error(
        "the answer would take more than {limit} bytes (limits.max_result_bytes): narrow the \
         time range or the matchers"
    )]
    TooLarge { limit: usize },
    #[error("the read ran past limits.query_timeout_ms ({ms} ms): narrow the time range or the matchers")]
    Timeout { ms: u128 },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// What the answers to one request may still take, and until when they may be worked on.
pub struct Budget {
    bytes_left: usize,
    limit: usize,
    started: Instant,
    timeout: std::time::Duration,
}

impl Budget {
    pub fn new(limit: usize, timeout: std::time::Duration) -> Budget {
        Budget {
            bytes_left: limit,
            limit,
            started: Instant::now(),
            timeout,
        }
    }

    fn charge(&mut self, bytes: usize) -> Result<(), ReadError> {
        self.bytes_left = self
            .bytes_left
            .checked_sub(bytes)
            .ok_or(ReadError::TooLarge { limit: self.limit })?;
        Ok(())
    }

    fn check_time(&self) -> Result<(), ReadError> {
        if self.started.elapsed() > self.timeout {
            return Err(ReadError::Timeout {
                ms: self.timeout.as_millis(),
            });
        }
        Ok(())
    }
}

/// One label matcher, compiled.
struct Matcher {
    name: String,
    test: Test,
}

enum Test {
    Equal(String),
    NotEqual(String),
    Regex(Regex),
    NotRegex(Regex),
}

impl Matcher {
    fn compile(matcher: &LabelMatcher) -> Result<Matcher, ReadError> {
        let error = |reason: String| ReadError::Matcher {
            name: matcher.name.clone(),
            reason,
        };
        let kind = MatchType::from_wire(matcher.r#type).ok_or_else(|| {
            error(format!(
                "match type {} is not =, !=, =~ or !~",
                matcher.r#type
            ))
        })?;
        // Prometheus anchors its expressions: the whole value must match.
        let regex = || {
            RegexBuilder::new(&format!("^(?:{})$", matcher.value))
                .size_limit(MAX_REGEX_BYTES)
                .build()
                .map_err(|e| error(e.to_string()))
        };
        let test = match kind {
            MatchType::Equal => Test::Equal(matcher.value.clone()),
            MatchType::NotEqual => Test::NotEqual(matcher.value.clone()),
            MatchType::Regex => Test::Regex(regex()?),
            MatchType::NotRegex => Test::NotRegex(regex()?),
        };
        Ok(Matcher {
            name: matcher.name.clone(),
            test,
        })
    }

    fn matches(&self, value: &str) -> bool {
        match &self.test {
            Test::Equal(v) => value == v,
            Test::NotEqual(v) => value != v,
            Test::Regex(r) => r.is_match(value),
            Test::NotRegex(r) => !r.is_match(value),
        }
    }
}

/// The series `query` selects, sorted by their labels.
pub fn select(
    db: &Engine,
    query: &Query,
    budget: &mut Budget,
) -> Result<Vec<TimeSeries>, ReadError> {
    let matchers = query
        .matchers
        .iter()
        .map(Matcher::compile)
        .collect::<Result<Vec<_>, _>>()?;
    let (names, labels): (Vec<&Matcher>, Vec<&Matcher>) =
        matchers.iter().partition(|m| m.name == NAME_LABEL);
    if query.start_timestamp_ms > query.end_timestamp_ms {
        return Ok(Vec::new());
    }
    let range = TimeRange::new(
        query.start_timestamp_ms.saturating_mul(NANOS_PER_MILLI),
        query
            .end_timestamp_ms
            .saturating_mul(NANOS_PER_MILLI)
            .saturating_add(NANOS_PER_MILLI - 1),
    );
    let candidates = match names.iter().find_map(|m| match &m.test {
        Test::Equal(name) => Some(name.clone()),
        _ => None,
    }) {
        Some(name) => vec![name],
        None => db.list_streams(),
    };
    let mut series = Vec::new();
    for stream in candidates {
        if !names.iter().all(|m| m.matches(&stream)) {
            continue;
        }
        let schema = match db.stream_schema(&stream) {
            Ok(schema) => schema,
            Err(EngineError::UnknownStream(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        let Some(shape) = Shape::of(&schema) else {
            continue;
        };
        series.extend(select_in(
            db, &stream, &schema, &shape, &labels, range, budget,
        )?);
    }
    series.sort_by(|a, b| {
        a.labels
            .iter()
            .map(|l| (&l.name, &l.value))
            .cmp(b.labels.iter().map(|l| (&l.name, &l.value)))
    });
    Ok(series)
}

/// Where a metric stream keeps its value and its labels.
struct Shape {
    value: usize,
    /// Field positions of the labels.
    labels: Vec<usize>,
}

impl Shape {
    /// `None` when the stream is not shaped as remote write makes a metric.
    fn of(schema: &Schema) -> Option<Shape> {
        let value = schema.index_of(VALUE_FIELD)?;
        let fields = schema.fields();
        if fields[value].ty != FieldType::Double {
            return None;
        }
        let labels: Vec<usize> = (0..fields.len()).filter(|&i| i != value).collect();
        labels
            .iter()
            .all(|&i| fields[i].ty == FieldType::String)
            .then_some(Shape { value, labels })
    }
}

/// The series of one metric stream that `matchers` select.
fn select_in(
    db: &Engine,
    stream: &str,
    schema: &Schema,
    shape: &Shape,
    matchers: &[&Matcher],
    range: TimeRange,
    budget: &mut Budget,
) -> Result<Vec<TimeSeries>, ReadError> {
    // Each matcher bound to its label's field; one on a label the stream lacks sees "".
    let mut bound: Vec<(usize, &Matcher)> = Vec::new();
    for &matcher in matchers {
        match schema
            .index_of(&matcher.name)
            .filter(|&i| i != shape.value && schema.fields()[i].name == matcher.name)
        {
            Some(field) => bound.push((field, matcher)),
            None if matcher.matches("") => {}
            None => return Ok(Vec::new()),
        }
    }
    // Equality with a value narrows the scan itself (block summaries skip blocks).
    let filter = bound
        .iter()
        .filter_map(|(field, m)| match &m.test {
            Test::Equal(v) if !v.is_empty() => Some(Predicate::Compare {
                field: schema.fields()[*field].name.clone(),
                op: CmpOp::Eq,
                value: Value::String(v.clone()),
            }),
            _ => None,
        })
        .collect();
    let request = ScanRequest {
        range,
        fields: None,
        filter,
        ..ScanRequest::default()
    };
    let mut series: Vec<TimeSeries> = Vec::new();
    let mut by_labels: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut key = Vec::new();
    for batch in db.scan(stream, &request)? {
        budget.check_time()?;
        let batch = batch?;
        let columns = batch.columns();
        let ColumnData::Double(values) = columns[shape.value].data() else {
            continue;
        };
        let slots = columns[shape.value].value_indices();
        for (row, (&tstart, slot)) in batch.tstart().iter().zip(slots).enumerate() {
            let Some(value) = slot.map(|i| values[i]) else {
                continue;
            };
            if !bound
                .iter()
                .all(|&(f, m)| m.matches(text(&columns[f], row)))
            {
                continue;
            }
            key.clear();
            for &field in &shape.labels {
                key.extend_from_slice(text(&columns[field], row).as_bytes());
                key.push(0xff); // never in UTF-8: no two label sets make one key
            }
            let index = match by_labels.get(&key) {
                Some(&index) => index,
                None => {
                    let labels = labels_of(stream, schema, shape, columns, row);
                    budget.charge(
                        labels
                            .iter()
                            .map(|l| l.name.len() + l.value.len() + 8)
                            .sum(),
                    )?;
                    series.push(TimeSeries {
                        labels,
                        samples: Vec::new(),
                        exemplars: Vec::new(),
                        histograms: Vec::new(),
                    });
                    by_labels.insert(key.clone(), series.len() - 1);
                    series.len() - 1
                }
            };
            budget.charge(std::mem::size_of::<Sample>())?;
            series[index].samples.push(Sample {
                value,
                timestamp: tstart.div_euclid(NANOS_PER_MILLI),
            });
        }
    }
    Ok(series)
}

/// The labels of the event at `row`: the name, then each non-empty label, sorted by name.
fn labels_of(
    stream: &str,
    schema: &Schema,
    shape: &Shape,
    columns: &[Column],
    row: usize,
) -> Vec<Label> {
    let mut labels = vec![Label {
        name: NAME_LABEL.to_string(),
        value: stream.to_string(),
    }];
    for &field in &shape.labels {
        let value = text(&columns[field], row);
        if !value.is_empty() {
            labels.push(Label {
                name: schema.fields()[field].name.clone(),
                value: value.to_string(),
            });
        }
    }
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    labels
}

/// A label's value at `row`: "" when null.
fn text(column: &Column, row: usize) -> &str {
    match (column.value_index(row), column.data()) {
        // STRING columns hold UTF-8 (checked when built or decoded).
        (Some(i), ColumnData::String(values)) => {
            std::str::from_utf8(values.get(i)).unwrap_or_default()
        }
        _ => "",
    }
}

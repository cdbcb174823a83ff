//! The reference the hand-written scanner is held to: InfluxData's own line protocol parser
//! (`influxdb-line-protocol`, pinned), with Tidemark's rules on top. Built for the tests and,
//! with the `reference` feature, for the differential fuzz target; never on a request's path.

use std::borrow::Cow;

use influxdb_line_protocol::{split_lines, FieldValue as ParsedValue};

use super::{FieldValue, LineError, Point, Precision};

/// The points of `body` as InfluxData's parser reads them, with Tidemark's rules on top
/// (the module's): what [`super::decode`] must answer for every body.
pub fn decode(body: &str, precision: Precision, now_ns: i64) -> Result<Vec<Point>, LineError> {
    let mut points = Vec::new();
    let mut next_line = 1;
    for text in split_lines(body) {
        // A quoted string may hold newlines: the next line starts after them.
        let line = next_line;
        next_line += 1 + text.matches('\n').count();
        let error = |message: String| LineError { line, message };
        // One line at most: `split_lines` found where it ends.
        let Some(parsed) = influxdb_line_protocol::parse_lines(text).next() else {
            continue;
        };
        let parsed = parsed.map_err(|e| error(syntax_error(&e, text)))?;
        let tstart = match parsed.timestamp {
            None => now_ns,
            Some(t) => t.checked_mul(precision.nanoseconds()).ok_or_else(|| {
                error(format!(
                    "timestamp {t} in {precision:?} is beyond what 64-bit nanoseconds hold"
                ))
            })?,
        };
        let tags: Vec<(String, String)> = parsed
            .series
            .tag_set
            .iter()
            .flatten()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        // The parser means to refuse these but does not always (`m,t=1,t=2 v=1`).
        for (i, (key, _)) in tags.iter().enumerate() {
            if tags[..i].iter().any(|(earlier, _)| earlier == key) {
                return Err(error(format!("tag {key:?} is written twice")));
            }
        }
        let mut fields: Vec<(String, FieldValue<'static>)> =
            Vec::with_capacity(parsed.field_set.len());
        for (key, value) in &parsed.field_set {
            let key = key.to_string();
            let value = match value {
                // Tidemark's rule: a DOUBLE is finite (the parser reads `1e400` as
                // infinity; InfluxDB's server refuses it as out of range).
                ParsedValue::F64(v) if !v.is_finite() => {
                    return Err(error(format!(
                        "field {key:?}: {v} is outside a DOUBLE's range"
                    )))
                }
                ParsedValue::F64(v) => FieldValue::Double(*v),
                ParsedValue::I64(v) => FieldValue::Long(*v),
                ParsedValue::U64(v) => FieldValue::Long(i64::try_from(*v).map_err(|_| {
                    error(format!(
                        "field {key:?}: unsigned {v} is above the largest LONG ({})",
                        i64::MAX
                    ))
                })?),
                ParsedValue::String(v) => FieldValue::String(Cow::Owned(v.to_string())),
                ParsedValue::Boolean(v) => FieldValue::Boolean(*v),
            };
            match fields.iter_mut().find(|(k, _)| *k == key) {
                Some(earlier) => earlier.1 = value,
                None => fields.push((key, value)),
            }
        }
        assert!(
            !fields.is_empty(),
            "the parser refuses a line without fields"
        );
        points.push(Point {
            line,
            measurement: parsed.series.measurement.to_string(),
            tstart,
            tags,
            fields,
        });
    }
    Ok(points)
}

/// The parser's reason, said for people: its generic errors name only a combinator.
fn syntax_error(error: &influxdb_line_protocol::Error, line: &str) -> String {
    const SHOWN: usize = 80;
    let line = line.trim();
    let shown = match line.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}...", &line[..end]),
        None => line.to_string(),
    };
    match error {
        influxdb_line_protocol::Error::GenericParsingError { .. } => format!(
            "not line protocol (measurement[,tag=value...] field=value[,field=value...] \
             [time]): {shown:?}"
        ),
        other => format!("{other}: {shown:?}"),
    }
}

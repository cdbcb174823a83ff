//! InfluxDB line protocol, decoded into points: what the InfluxDB write routes take.
//!
//! The syntax (escapes, quoting, comments, number forms) is InfluxData's own Rust parser's,
//! the one InfluxDB 3 runs (`influxdb-line-protocol`, pinned): a line protocol parser is
//! exactly the kind of code where a home-made one disagrees with the real server in corners.
//! This module adds what Tidemark decides: the timestamp's precision and range, one value
//! type per Tidemark type (`u` integers are LONG and refused above `i64::MAX`), the line
//! number in every error, and that a request is all or nothing (the first bad line refuses it).
//!
//! What a point becomes (a stream per measurement, tags as STRING fields) is the server's.

use influxdb_line_protocol::{split_lines, FieldValue as ParsedValue};

/// A timestamp's unit, as the `precision` query parameter names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Nanoseconds,
    Microseconds,
    Milliseconds,
    Seconds,
    Minutes,
    Hours,
}

impl Precision {
    /// The precision `text` names: `ns`, `us`, `ms`, `s` (InfluxDB 2.x), and for the 1.x route
    /// also its `n`, `u`, `m` (minutes) and `h`.
    pub fn parse(text: &str, v1: bool) -> Option<Precision> {
        Some(match (text, v1) {
            ("ns", _) | ("n", true) => Precision::Nanoseconds,
            ("us", _) | ("u", true) | ("µ", true) => Precision::Microseconds,
            ("ms", _) => Precision::Milliseconds,
            ("s", _) => Precision::Seconds,
            ("m", true) => Precision::Minutes,
            ("h", true) => Precision::Hours,
            _ => return None,
        })
    }

    fn nanoseconds(self) -> i64 {
        match self {
            Precision::Nanoseconds => 1,
            Precision::Microseconds => 1_000,
            Precision::Milliseconds => 1_000_000,
            Precision::Seconds => 1_000_000_000,
            Precision::Minutes => 60_000_000_000,
            Precision::Hours => 3_600_000_000_000,
        }
    }
}

/// One line: a measurement's tags and fields at an instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The line of the body it was on, from 1 (for errors found after decoding).
    pub line: usize,
    pub measurement: String,
    /// Nanoseconds since the epoch.
    pub tstart: i64,
    /// In the order written; no key twice.
    pub tags: Vec<(String, String)>,
    /// In the order first written; no key twice (a key written again keeps its last value).
    pub fields: Vec<(String, FieldValue)>,
}

/// A field's value, in the Tidemark type it is stored as.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    /// A float (`1.5`, `1`): DOUBLE.
    Double(f64),
    /// An integer (`1i`) or unsigned integer (`1u`): LONG.
    Long(i64),
    /// A quoted string: STRING.
    String(String),
    /// `t`, `true`, `F`...: BOOLEAN.
    Boolean(bool),
}

/// Why a request was refused: the first line that could not be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct LineError {
    /// From 1.
    pub line: usize,
    pub message: String,
}

/// The points of `body`, with times in `precision`; a line without a time gets `now_ns`.
/// Empty lines and comments (`#`) are skipped.
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
        let mut fields: Vec<(String, FieldValue)> = Vec::with_capacity(parsed.field_set.len());
        for (key, value) in &parsed.field_set {
            let key = key.to_string();
            let value = match value {
                ParsedValue::F64(v) => FieldValue::Double(*v),
                ParsedValue::I64(v) => FieldValue::Long(*v),
                ParsedValue::U64(v) => FieldValue::Long(i64::try_from(*v).map_err(|_| {
                    error(format!(
                        "field {key:?}: unsigned {v} is above the largest LONG ({})",
                        i64::MAX
                    ))
                })?),
                ParsedValue::String(v) => FieldValue::String(v.to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000_000_000;

    fn one(line: &str) -> Point {
        let mut points = decode(line, Precision::Nanoseconds, NOW).unwrap();
        assert_eq!(points.len(), 1, "{line}");
        points.remove(0)
    }

    fn refused(body: &str) -> LineError {
        decode(body, Precision::Nanoseconds, NOW).unwrap_err()
    }

    #[test]
    fn a_line_becomes_a_point_of_each_type() {
        let point = one(r#"cpu,host=a,region=west f=1.5,i=-3i,u=7u,s="x y",b=t,g=1 42"#);
        assert_eq!(point.measurement, "cpu");
        assert_eq!(point.tstart, 42);
        assert_eq!(
            point.tags,
            [
                ("host".into(), "a".into()),
                ("region".into(), "west".into())
            ]
        );
        assert_eq!(
            point.fields,
            [
                ("f".into(), FieldValue::Double(1.5)),
                ("i".into(), FieldValue::Long(-3)),
                ("u".into(), FieldValue::Long(7)),
                ("s".into(), FieldValue::String("x y".into())),
                ("b".into(), FieldValue::Boolean(true)),
                ("g".into(), FieldValue::Double(1.0)),
            ]
        );
    }

    #[test]
    fn escapes_follow_the_line_protocol() {
        let point = one(
            r#"my\ cpu\,1,ta\=g\ 1=v\,a\ l\=ue fi\ eld\=x="say \"hi\" \\ back\slash ünï",other=F"#,
        );
        assert_eq!(point.measurement, "my cpu,1");
        assert_eq!(point.tags, [("ta=g 1".into(), "v,a l=ue".into())]);
        assert_eq!(
            point.fields[0],
            (
                "fi eld=x".into(),
                FieldValue::String(r#"say "hi" \ back\slash ünï"#.into())
            )
        );
        assert_eq!(
            point.fields[1],
            ("other".into(), FieldValue::Boolean(false))
        );
        assert_eq!(point.tstart, NOW, "no time: the server's");
    }

    #[test]
    fn precisions_scale_times_to_nanoseconds() {
        let at = |precision| decode("m v=1 3", precision, NOW).unwrap()[0].tstart;
        assert_eq!(at(Precision::Nanoseconds), 3);
        assert_eq!(at(Precision::Microseconds), 3_000);
        assert_eq!(at(Precision::Milliseconds), 3_000_000);
        assert_eq!(at(Precision::Seconds), 3_000_000_000);
        assert_eq!(at(Precision::Minutes), 180_000_000_000);
        assert_eq!(at(Precision::Hours), 10_800_000_000_000);
        assert_eq!(Precision::parse("u", true), Some(Precision::Microseconds));
        assert_eq!(
            Precision::parse("u", false),
            None,
            "2.x names only ns, us, ms, s"
        );
        assert_eq!(Precision::parse("h", true), Some(Precision::Hours));
        assert_eq!(Precision::parse("d", true), None);
        let far = decode("m v=1 9223372036854775", Precision::Seconds, NOW).unwrap_err();
        assert_eq!(far.line, 1);
        assert!(far.message.contains("beyond"), "{far}");
    }

    #[test]
    fn comments_and_blank_lines_are_skipped_and_errors_name_their_line() {
        let body = "# a comment\n\nm v=1 1\n  m v=2 2\nm v=\"open\nstring\" 3\nm v=4 4\nm bad\n";
        let error = refused(body);
        assert_eq!(error.line, 8, "{error}");
        let points = decode(&body.replace("m bad\n", ""), Precision::Nanoseconds, NOW).unwrap();
        let times: Vec<i64> = points.iter().map(|p| p.tstart).collect();
        assert_eq!(times, [1, 2, 3, 4]);
        assert_eq!(
            points[2].fields[0].1,
            FieldValue::String("open\nstring".into())
        );
    }

    #[test]
    fn what_cannot_be_stored_is_refused_with_the_reason() {
        for (body, says) in [
            ("m u=9223372036854775808u", "above the largest LONG"),
            ("m", "not line protocol"),
            ("m v=", ""),
            ("m,t=1,t=2 v=1", "written twice"),
            ("m,t=1,u=1,t=1 v=1", "written twice"),
            ("m v=1i1", ""),
            ("m v=1 notatime", ""),
            ("m v=1 1 extra", ""),
            ("m v=99999999999999999999i", "integer"),
        ] {
            let error = refused(body);
            assert_eq!(error.line, 1, "{body}");
            assert!(error.message.contains(says), "{body}: {error}");
        }
        let largest = one("m u=9223372036854775807u");
        assert_eq!(largest.fields[0].1, FieldValue::Long(i64::MAX));
    }

    #[test]
    fn a_field_written_twice_keeps_its_last_value() {
        let point = one("m a=1,b=2,a=3i");
        assert_eq!(
            point.fields,
            [
                ("a".into(), FieldValue::Long(3)),
                ("b".into(), FieldValue::Double(2.0))
            ]
        );
    }
}

#[cfg(test)]
mod properties {
    use influxdb_line_protocol::builder::AfterField;
    use influxdb_line_protocol::LineProtocolBuilder;
    use proptest::prelude::*;

    use super::*;

    /// Names and tag values with every character line protocol escapes there (backslash has
    /// no escape in them, so none is written).
    fn name() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9_ ,=.ü\"-]{1,10}".prop_filter("not blank, not a comment", |s| {
            !s.trim_start().is_empty() && !s.starts_with(['#', ' '])
        })
    }

    fn value() -> impl Strategy<Value = FieldValue> {
        prop_oneof![
            any::<f64>()
                .prop_filter("finite", |v| v.is_finite())
                .prop_map(FieldValue::Double),
            any::<i64>().prop_map(FieldValue::Long),
            "[ -~ü\n]{0,12}".prop_map(FieldValue::String),
            any::<bool>().prop_map(FieldValue::Boolean),
        ]
    }

    fn point() -> impl Strategy<Value = Point> {
        (
            name(),
            -(1i64 << 60)..(1i64 << 60),
            proptest::collection::btree_map(name(), name(), 0..4),
            proptest::collection::btree_map(name(), value(), 1..5),
        )
            .prop_map(|(measurement, tstart, tags, fields)| Point {
                line: 0,
                measurement,
                tstart,
                tags: tags.into_iter().collect(),
                fields: fields.into_iter().collect(),
            })
    }

    fn encode(points: &[Point]) -> String {
        let mut done = LineProtocolBuilder::new();
        for point in points {
            let mut line = done.measurement(&point.measurement);
            for (k, v) in &point.tags {
                line = line.tag(k, v);
            }
            let add = |line: LineProtocolBuilder<Vec<u8>, AfterField>,
                       (k, v): &(String, FieldValue)| match v {
                FieldValue::Double(x) => line.field(k, *x),
                FieldValue::Long(x) => line.field(k, *x),
                FieldValue::String(x) => line.field(k, x.as_str()),
                FieldValue::Boolean(x) => line.field(k, *x),
            };
            let (first, rest) = point.fields.split_first().expect("a field");
            let mut fields = match first {
                (k, FieldValue::Double(x)) => line.field(k, *x),
                (k, FieldValue::Long(x)) => line.field(k, *x),
                (k, FieldValue::String(x)) => line.field(k, x.as_str()),
                (k, FieldValue::Boolean(x)) => line.field(k, *x),
            };
            for field in rest {
                fields = add(fields, field);
            }
            done = fields.timestamp(point.tstart).close_line();
        }
        String::from_utf8(done.build()).expect("the builder writes text")
    }

    proptest! {
        /// Whatever InfluxData's encoder writes decodes to the points it was given.
        #[test]
        fn encoded_points_decode_to_themselves(points in proptest::collection::vec(point(), 1..6)) {
            let body = encode(&points);
            let decoded = decode(&body, Precision::Nanoseconds, 0);
            // The builder writes one point per line; a string value's newlines push the
            // points after it down.
            let mut line = 1;
            let mut numbered = Vec::with_capacity(points.len());
            for point in points {
                let newlines: usize = point
                    .fields
                    .iter()
                    .map(|(_, v)| match v {
                        FieldValue::String(text) => text.matches('\n').count(),
                        _ => 0,
                    })
                    .sum();
                numbered.push(Point { line, ..point });
                line += 1 + newlines;
            }
            prop_assert_eq!(decoded, Ok(numbered), "{}", body);
        }
    }
}

//! InfluxDB line protocol, decoded into points: what the InfluxDB write routes take.
//!
//! The syntax (escapes, quoting, comments, number forms) is InfluxData's, the one InfluxDB 3
//! runs: a line protocol parser is exactly the kind of code where a home-made one disagrees
//! with the real server in corners, so `scan` is that parser's grammar written as loops
//! over the bytes (for speed: see there), and the tests hold it to InfluxData's own parser
//! (`influxdb-line-protocol`, pinned; the `reference` feature builds it in) line for line.
//! This module adds what Tidemark decides: the timestamp's precision and range, one value
//! type per Tidemark type (`u` integers are LONG and refused above `i64::MAX`), a tag written
//! twice refused, the line number in every error, and that a request is all or nothing (the
//! first bad line refuses it).
//!
//! What a point becomes (a stream per measurement, tags as STRING fields) is the server's.

use std::borrow::Cow;

mod scan;

#[cfg(any(test, feature = "reference"))]
pub mod reference;

pub use scan::Line;

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

/// One line, owned: a measurement's tags and fields at an instant.
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
    pub fields: Vec<(String, FieldValue<'static>)>,
}

/// A field's value, in the Tidemark type it is stored as.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue<'a> {
    /// A float (`1.5`, `1`): DOUBLE.
    Double(f64),
    /// An integer (`1i`) or unsigned integer (`1u`): LONG.
    Long(i64),
    /// A quoted string: STRING (borrowed from the body unless an escape was undone).
    String(Cow<'a, str>),
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

/// The lines of `body` in order, each handed to `each` as it is scanned; times in
/// `precision`, and a line without a time gets `now_ns`. Empty lines and comments (`#`) are
/// skipped. The first line that cannot be read, or the first error of `each`, ends it.
pub fn each_line<'a, E: From<LineError>>(
    body: &'a str,
    precision: Precision,
    now_ns: i64,
    mut each: impl FnMut(&Line<'a>) -> Result<(), E>,
) -> Result<(), E> {
    let mut line = Line::default();
    let mut next_number = 1;
    for (text, newlines_inside) in scan::lines(body) {
        // A quoted string may hold newlines: the next line starts after them.
        let number = next_number;
        next_number += 1 + newlines_inside;
        let text = scan::trim_leading(text);
        if text.is_empty() {
            continue;
        }
        let error = |message: String| LineError {
            line: number,
            message,
        };
        let time = scan::line(text, &mut line)
            .map_err(|reason| error(format!("{reason}: {}", shown(text))))?;
        line.number = number;
        line.tstart = match time {
            None => now_ns,
            Some(t) => t.checked_mul(precision.nanoseconds()).ok_or_else(|| {
                error(format!(
                    "timestamp {t} in {precision:?} is beyond what 64-bit nanoseconds hold"
                ))
            })?,
        };
        debug_assert!(!line.fields.is_empty(), "a line without fields is refused");
        each(&line)?;
    }
    Ok(())
}

/// The points of `body`, owned: [`each_line`] collected.
pub fn decode(body: &str, precision: Precision, now_ns: i64) -> Result<Vec<Point>, LineError> {
    let mut points = Vec::new();
    each_line(body, precision, now_ns, |line| {
        points.push(Point {
            line: line.number,
            measurement: line.measurement.to_string(),
            tstart: line.tstart,
            tags: line
                .tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            fields: line
                .fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_owned_value()))
                .collect(),
        });
        Ok::<(), LineError>(())
    })?;
    Ok(points)
}

impl FieldValue<'_> {
    /// The value, owning its text.
    pub fn to_owned_value(&self) -> FieldValue<'static> {
        match self {
            FieldValue::Double(v) => FieldValue::Double(*v),
            FieldValue::Long(v) => FieldValue::Long(*v),
            FieldValue::String(v) => FieldValue::String(Cow::Owned(v.to_string())),
            FieldValue::Boolean(v) => FieldValue::Boolean(*v),
        }
    }
}

/// A line as an error shows it: trimmed, and cut after 80 characters.
fn shown(line: &str) -> String {
    const SHOWN: usize = 80;
    let line = line.trim();
    match line.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{:?}...", &line[..end]),
        None => format!("{line:?}"),
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
            ("m", "a space and fields"),
            ("m v=", ""),
            ("m,t=1,t=2 v=1", "written twice"),
            ("m,t=1,u=1,t=1 v=1", "written twice"),
            ("m v=1i1", ""),
            ("m v=1 notatime", ""),
            ("m v=1 1 extra", ""),
            ("m v=99999999999999999999i", "integer"),
            ("m v=1e309", "outside a DOUBLE's range"),
            ("m v=-1e309", "outside a DOUBLE's range"),
            ("m v=inf", ""),
            ("m v=nan", ""),
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

    fn value() -> impl Strategy<Value = FieldValue<'static>> {
        prop_oneof![
            any::<f64>()
                .prop_filter("finite", |v| v.is_finite())
                .prop_map(FieldValue::Double),
            any::<i64>().prop_map(FieldValue::Long),
            "[ -~ü\n]{0,12}".prop_map(|s| FieldValue::String(s.into())),
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
                       (k, v): &(String, FieldValue<'static>)| match v {
                FieldValue::Double(x) => line.field(k, *x),
                FieldValue::Long(x) => line.field(k, *x),
                FieldValue::String(x) => line.field(k, x.as_ref()),
                FieldValue::Boolean(x) => line.field(k, *x),
            };
            let (first, rest) = point.fields.split_first().expect("a field");
            let mut fields = match first {
                (k, FieldValue::Double(x)) => line.field(k, *x),
                (k, FieldValue::Long(x)) => line.field(k, *x),
                (k, FieldValue::String(x)) => line.field(k, x.as_ref()),
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
        #![proptest_config(ProptestConfig::with_cases(2048))]

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

        /// Any text of line protocol's pieces reads as InfluxData's parser reads it: the same
        /// points, or a refusal of the same line.
        #[test]
        fn the_scanner_agrees_with_influxdatas_parser(body in body()) {
            prop_assert_eq!(verdict(&body), reference_verdict(&body), "{:?}", body);
        }
    }

    /// Bodies made of the pieces where line protocol has its corners: escapes, quotes,
    /// separators, number forms, comments, blanks, non-ASCII text.
    fn body() -> impl Strategy<Value = String> {
        const PIECES: &[&str] = &[
            "m",
            "cpu",
            "ü",
            ",",
            "=",
            " ",
            "  ",
            "\\",
            "\"",
            "\n",
            "\t",
            "\r",
            "\0",
            "#",
            "0",
            "1",
            "-",
            "+",
            ".",
            "e",
            "E",
            "i",
            "u",
            "t",
            "T",
            "f",
            "F",
            "true",
            "False",
            "1.5",
            "-2i",
            "7u",
            "1e3",
            "18446744073709551616u",
            "9223372036854775808i",
            "99999999999999999999",
            "a",
            "x=1",
            ",t=v",
            " v=1",
            " 17",
            "=\"s\"",
            "\\ ",
            "\\,",
            "\\=",
            "\\\\",
            "\\\"",
        ];
        proptest::collection::vec(proptest::sample::select(PIECES), 0..24)
            .prop_map(|pieces| pieces.concat())
    }

    fn verdict(body: &str) -> Result<Vec<Point>, usize> {
        decode(body, Precision::Microseconds, 5).map_err(|e| e.line)
    }

    fn reference_verdict(body: &str) -> Result<Vec<Point>, usize> {
        reference::decode(body, Precision::Microseconds, 5).map_err(|e| e.line)
    }

    /// Corners found by reading InfluxData's grammar, each held to its verdict.
    #[test]
    fn corners_read_as_influxdata_reads_them() {
        for body in [
            "m v=1",
            "m v=1 ",
            "m v=1 1 ",
            "m  v=1  1",
            "m\tv=1",
            "m,a,b=1 v=1",
            "m,a=b=c v=1",
            "m a,b=1",
            "m,t=v\\ v=1",
            "m,t\\=v v=1",
            "m\\ v=1",
            "m\\",
            "m\\=x v=1",
            "m\\é v=1",
            "m v=\"a\\\"b\" 1",
            "m v=\"a\\\\\" 1",
            "m v=\"a\\b\" 1",
            "m v=\"\"",
            "m v=\"open",
            "m v=1.",
            "m v=.5",
            "m v=1.e5",
            "m v=1.5e",
            "m v=1e+5,w=-1.5E-3",
            "m v=-1u",
            "m v=tru",
            "m v=TRUE,w=F",
            "m v=1e400",
            "m v=1 1\r",
            "# c x=\"y\nm v=1\n\" z\nm v=2",
            "m,t=1,t=2 v=1",
            "m v=1,v=2i",
            "m\0 v=1",
            "m,t=\0 v=1",
            "m v=1 -",
            "m v=1,",
            "m v=1, 5",
            "m v=1,v=2,",
            "m v=1,\t",
            "m v=1,,",
            "m v=1 -9223372036854775808",
            "m v=1 9223372036854775808",
            " \t\n# c\n  m v=1\n\n",
        ] {
            assert_eq!(verdict(body), reference_verdict(body), "{body:?}");
        }
    }
}

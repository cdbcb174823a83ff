//! `to_char(timestamp, template)` with PostgreSQL's template patterns.
//!
//! DataFusion's `to_char` takes strftime's `%` directives and copies anything else, so
//! `to_char(ts, 'YYYY-MM-DD HH24:MI')` answered its template. Here a template is read as
//! PostgreSQL reads it (its `formatting.c`): the patterns below are replaced by the
//! value's fields, `FM` before a pattern drops its padding, `TH`/`th` after a number adds
//! its ordinal suffix, text in double quotes is copied as it is (a backslash there takes
//! the next character literally; outside, `\"` is a quote), and every other character is
//! copied. A template with a strftime directive in it (a `%` and a letter, outside double
//! quotes: `%Y`, not `"100%"`) is strftime's, as it was before, so that queries written for
//! DataFusion's `to_char` keep their answers.
//!
//! Patterns: `HH`, `HH12`, `HH24`, `MI`, `SS`, `MS`, `US`, `FF1`..`FF6`, `SSSS`, `SSSSS`,
//! `AM`/`PM`/`A.M.`/`P.M.` (and in lower case), `Y,YYY`, `YYYY`, `YYY`, `YY`, `Y`, `IYYY`,
//! `IYY`, `IY`, `I`, `BC`/`AD`/`B.C.`/`A.D.`, `MONTH`/`Month`/`month` (padded to 9),
//! `MON`/`Mon`/`mon`, `MM`, `DAY`/`Day`/`day` (padded to 9), `DY`/`Dy`/`dy`, `DDD`, `IDDD`,
//! `DD`, `D` (Sunday is 1), `ID` (Monday is 1), `W`, `WW`, `IW`, `CC`, `J`, `Q`, `RM`/`rm`,
//! `TZ`/`tz` (`UTC` for UTC, otherwise the offset, as PostgreSQL writes a zone without an
//! abbreviation), `TZH`, `TZM`, `OF`. `FX` and `TM` are accepted and change nothing.
//! Numbers (PostgreSQL's `to_char(1234.5, '9G999D99')`) are refused with what to write
//! instead.

use std::fmt::Write;
use std::sync::Arc;

use chrono::{DateTime, Datelike, NaiveDateTime, Offset as _, TimeZone, Timelike};
use datafusion::arrow::array::timezone::Tz;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type, TimeUnit};
use datafusion::common::{exec_err, plan_err, Result as DfResult, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// Tidemark's `to_char`, in place of DataFusion's (which it calls for strftime templates).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ToChar {
    signature: Signature,
    strftime: ScalarUDF,
}

impl Default for ToChar {
    fn default() -> ToChar {
        ToChar {
            signature: Signature::user_defined(Volatility::Immutable),
            strftime: datafusion::functions::datetime::to_char().as_ref().clone(),
        }
    }
}

/// What to write instead of `to_char` of a number.
const NUMBERS: &str = "to_char of a number with PostgreSQL's number templates (such as \
    '9G999D99') is not supported: write round(x, 2)::text, or CAST(x AS VARCHAR)";

impl ScalarUDFImpl for ToChar {
    fn name(&self) -> &str {
        "to_char"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        let [value, template] = arg_types else {
            return plan_err!("to_char takes two arguments: a timestamp and a template");
        };
        let value = match value {
            DataType::Timestamp(..)
            | DataType::Date32
            | DataType::Date64
            | DataType::Time32(_)
            | DataType::Time64(_)
            | DataType::Duration(_) => value.clone(),
            // Text where a time is expected is read as one, as in comparisons with ts.
            DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 | DataType::Null => {
                DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))
            }
            // Refused by return_type, whose error DataFusion passes on as it is.
            v if v.is_numeric() => v.clone(),
            other => {
                return plan_err!(
                    "to_char of {other} is not supported: it takes a timestamp or a date"
                )
            }
        };
        if !matches!(
            template,
            DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 | DataType::Null
        ) {
            return plan_err!("to_char's template must be text, not {template}");
        }
        Ok(vec![value, DataType::Utf8])
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        match arg_types.first() {
            Some(value) if value.is_numeric() => plan_err!("{NUMBERS}"),
            _ => Ok(DataType::Utf8),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let [value, template] = args.args.as_slice() else {
            return exec_err!("to_char takes two arguments");
        };
        let strftime = match template {
            ColumnarValue::Scalar(s) => scalar_text(s).is_some_and(is_strftime),
            ColumnarValue::Array(a) => {
                let a = cast(a, &DataType::Utf8)?;
                a.as_string::<i32>().iter().flatten().any(is_strftime)
            }
        };
        let value_type = value.data_type();
        if strftime
            || !matches!(
                value_type,
                DataType::Timestamp(..) | DataType::Date32 | DataType::Date64
            )
        {
            if !strftime {
                return exec_err!(
                    "to_char of {value_type} takes strftime's % directives (PostgreSQL's \
                     templates are for timestamps and dates)"
                );
            }
            return self.strftime.invoke_with_args(args);
        }
        let scalar = matches!(value, ColumnarValue::Scalar(_))
            && matches!(template, ColumnarValue::Scalar(_));
        let rows = if scalar { 1 } else { args.number_rows };
        let values = value.to_array(rows)?;
        let templates = cast(&template.to_array(rows)?, &DataType::Utf8)?;
        let result = format_all(&values, templates.as_string::<i32>())?;
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&result, 0)?)
        } else {
            ColumnarValue::Array(result)
        })
    }
}

/// Whether `template` holds a strftime directive: a `%` then a letter, outside double
/// quotes (where PostgreSQL copies text as it is, `%` included).
fn is_strftime(template: &str) -> bool {
    let mut quoted = false;
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '"' => quoted = !quoted,
            '%' if !quoted && chars.peek().is_some_and(|n| n.is_ascii_alphabetic()) => {
                return true;
            }
            _ => {}
        }
    }
    false
}

fn scalar_text(value: &ScalarValue) -> Option<&str> {
    match value {
        ScalarValue::Utf8(Some(t))
        | ScalarValue::Utf8View(Some(t))
        | ScalarValue::LargeUtf8(Some(t)) => Some(t),
        _ => None,
    }
}

/// Each value formatted by its row's template.
fn format_all(
    values: &ArrayRef,
    templates: &datafusion::arrow::array::StringArray,
) -> DfResult<ArrayRef> {
    let (unit_nanos, zone) = match values.data_type() {
        DataType::Timestamp(unit, zone) => (
            match unit {
                TimeUnit::Second => 1_000_000_000,
                TimeUnit::Millisecond => 1_000_000,
                TimeUnit::Microsecond => 1_000,
                TimeUnit::Nanosecond => 1,
            },
            zone.clone(),
        ),
        DataType::Date32 => (86_400_000_000_000i128 as i64, None),
        DataType::Date64 => (1_000_000, None),
        other => return exec_err!("to_char of {other}"),
    };
    let zone = match zone.as_deref() {
        Some(name) => Some(Zone {
            tz: name.parse::<Tz>()?,
            utc: is_utc(name),
        }),
        None => None,
    };
    let raw = cast(values, &DataType::Int64)?;
    let raw = raw.as_primitive::<Int64Type>();
    let mut out = StringBuilder::with_capacity(values.len(), templates.value_data().len());
    let mut parsed: Option<(&str, Vec<Node>)> = None;
    let mut text = String::new();
    for row in 0..values.len() {
        if raw.is_null(row) || templates.is_null(row) {
            out.append_null();
            continue;
        }
        let template = templates.value(row);
        if parsed.as_ref().is_none_or(|(t, _)| *t != template) {
            parsed = Some((template, parse(template)));
        }
        let nodes = parsed
            .as_ref()
            .map(|(_, n)| n.as_slice())
            .unwrap_or_default();
        let Some(time) = Time::at(
            i128::from(raw.value(row)) * i128::from(unit_nanos),
            zone.as_ref(),
        ) else {
            return exec_err!("to_char: the time is out of range");
        };
        text.clear();
        time.write(nodes, &mut text);
        out.append_value(&text);
    }
    Ok(Arc::new(out.finish()))
}

fn is_utc(name: &str) -> bool {
    ["UTC", "+00:00", "+00", "Z", "Etc/UTC", "GMT"]
        .iter()
        .any(|u| u.eq_ignore_ascii_case(name))
}

struct Zone {
    tz: Tz,
    utc: bool,
}

/// One value's fields, in its zone.
struct Time {
    local: NaiveDateTime,
    /// The zone's offset east of UTC, in seconds.
    offset: i32,
    /// `None` for a time without a zone.
    zone: Option<bool>,
}

impl Time {
    fn at(nanos: i128, zone: Option<&Zone>) -> Option<Time> {
        let seconds = i64::try_from(nanos.div_euclid(1_000_000_000)).ok()?;
        let fraction = nanos.rem_euclid(1_000_000_000) as u32;
        let utc = DateTime::from_timestamp(seconds, fraction)?.naive_utc();
        Some(match zone {
            None => Time {
                local: utc,
                offset: 0,
                zone: None,
            },
            Some(zone) => {
                let offset = zone
                    .tz
                    .offset_from_utc_datetime(&utc)
                    .fix()
                    .local_minus_utc();
                Time {
                    local: utc + chrono::Duration::seconds(offset.into()),
                    offset,
                    zone: Some(zone.utc),
                }
            }
        })
    }

    fn write(&self, nodes: &[Node], out: &mut String) {
        for node in nodes {
            match node {
                Node::Text(text) => out.push_str(text),
                Node::Pattern {
                    pattern,
                    fill,
                    suffix,
                } => self.pattern(*pattern, *fill, *suffix, out),
            }
        }
    }

    fn pattern(&self, pattern: Pattern, fill: bool, suffix: Option<Case>, out: &mut String) {
        use Pattern::*;
        let t = &self.local;
        // A number, zero-padded to `width` unless FM, with its ordinal suffix if asked.
        let mut number = |value: i64, width: usize| {
            if fill {
                let _ = write!(out, "{value}");
            } else {
                let _ = write!(out, "{value:0width$}");
            }
            if let Some(case) = suffix {
                out.push_str(&case.apply(ordinal_suffix(value)));
            }
        };
        let year = i64::from(t.year());
        let iso = t.iso_week();
        let hour = i64::from(t.hour());
        let micros = i64::from(t.nanosecond() / 1_000);
        match pattern {
            Hour12 => number((hour + 11) % 12 + 1, 2),
            Hour24 => number(hour, 2),
            Minute => number(t.minute().into(), 2),
            Second => number(t.second().into(), 2),
            Milli => number(micros / 1_000, 3),
            Micro => number(micros, 6),
            Fraction(digits) => {
                let digits = usize::from(digits);
                number(micros / 10i64.pow(6 - digits as u32), digits)
            }
            SecondsOfDay => number(t.num_seconds_from_midnight().into(), 0),
            Meridiem(style) => out.push_str(&style.spell(if hour >= 12 { "pm" } else { "am" })),
            Era(style) => out.push_str(&style.spell(if year > 0 { "ad" } else { "bc" })),
            YearComma => {
                let _ = write!(out, "{},{:03}", year / 1000, year % 1000);
            }
            Year(digits) => year_digits(year, digits, &mut number),
            IsoYear(digits) => year_digits(iso.year().into(), digits, &mut number),
            MonthName(case) => name(MONTHS[t.month0() as usize], case, fill, 9, out),
            MonthAbbrev(case) => out.push_str(&case.apply(&MONTHS[t.month0() as usize][..3])),
            Month => number(t.month().into(), 2),
            DayName(case) => name(
                DAYS[t.weekday().num_days_from_sunday() as usize],
                case,
                fill,
                9,
                out,
            ),
            DayAbbrev(case) => {
                out.push_str(&case.apply(&DAYS[t.weekday().num_days_from_sunday() as usize][..3]))
            }
            DayOfYear => number(t.ordinal().into(), 3),
            IsoDayOfYear => number(
                i64::from((iso.week() - 1) * 7 + t.weekday().number_from_monday()),
                3,
            ),
            DayOfMonth => number(t.day().into(), 2),
            DayOfWeek => number(t.weekday().number_from_sunday().into(), 0),
            IsoDayOfWeek => number(t.weekday().number_from_monday().into(), 0),
            WeekOfMonth => number(((t.day() - 1) / 7 + 1).into(), 0),
            WeekOfYear => number(((t.ordinal() - 1) / 7 + 1).into(), 2),
            IsoWeek => number(iso.week().into(), 2),
            Century => number(century(year), 2),
            Julian => number(i64::from(t.num_days_from_ce()) + 1_721_425, 0),
            Quarter => number(((t.month() - 1) / 3 + 1).into(), 0),
            Roman(case) => {
                let roman = case.apply(ROMAN[t.month0() as usize]);
                if fill {
                    out.push_str(&roman);
                } else {
                    let _ = write!(out, "{roman:<4}");
                }
            }
            ZoneName(case) => match self.zone {
                None => {}
                Some(true) => out.push_str(&case.apply("UTC")),
                Some(false) => self.offset_text(fill, out),
            },
            ZoneHours => {
                let sign = if self.offset < 0 { '-' } else { '+' };
                let _ = write!(out, "{sign}{:02}", self.offset.abs() / 3600);
            }
            ZoneMinutes => {
                let _ = write!(out, "{:02}", self.offset.abs() % 3600 / 60);
            }
            Offset => self.offset_text(fill, out),
        }
    }

    /// The offset as PostgreSQL's `OF` writes it: `+05:30`, `-08`.
    fn offset_text(&self, fill: bool, out: &mut String) {
        let sign = if self.offset < 0 { '-' } else { '+' };
        let (hours, minutes) = (self.offset.abs() / 3600, self.offset.abs() % 3600 / 60);
        if fill {
            let _ = write!(out, "{sign}{hours}");
        } else {
            let _ = write!(out, "{sign}{hours:02}");
        }
        if minutes != 0 {
            let _ = write!(out, ":{minutes:02}");
        }
    }
}

/// The ordinal suffix of `value`: 1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st.
fn ordinal_suffix(value: i64) -> &'static str {
    match (value.abs() % 100, value.abs() % 10) {
        (11..=13, _) => "th",
        (_, 1) => "st",
        (_, 2) => "nd",
        (_, 3) => "rd",
        _ => "th",
    }
}

/// The century of `year` as PostgreSQL counts it: 2001–2100 is the 21st, there is no
/// year 0 (1 BC is year 0 here, as in ISO 8601), so 100 BC–1 BC is the -1st.
fn century(year: i64) -> i64 {
    if year > 0 {
        (year + 99) / 100
    } else {
        -((99 - (year - 1)) / 100)
    }
}

/// `YYYY` (at least 4 digits), `YYY`, `YY`, `Y`: the year's last digits.
fn year_digits(year: i64, digits: u8, number: &mut impl FnMut(i64, usize)) {
    match digits {
        4 => number(year, 4),
        n => number(year % 10i64.pow(n.into()), n.into()),
    }
}

/// A month's or day's name in `case`, padded to `width` unless FM.
fn name(name: &str, case: Case, fill: bool, width: usize, out: &mut String) {
    let text = case.apply(name);
    if fill {
        out.push_str(&text);
    } else {
        let _ = write!(out, "{text:<width$}");
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const ROMAN: [&str; 12] = [
    "I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII",
];

/// How a name is written: `MONTH`, `Month` or `month`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Upper,
    Capitalized,
    Lower,
}

impl Case {
    fn apply(self, text: &str) -> String {
        match self {
            Case::Upper => text.to_uppercase(),
            Case::Lower => text.to_lowercase(),
            Case::Capitalized => {
                let lower = text.to_lowercase();
                let mut chars = lower.chars();
                chars
                    .next()
                    .map(|first| first.to_uppercase().chain(chars).collect())
                    .unwrap_or_default()
            }
        }
    }
}

/// How AM/PM and AD/BC are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Upper,
    Lower,
    UpperDots,
    LowerDots,
}

impl Style {
    /// `word` (`am`, `pm`, `ad`, `bc`) written in this style: `AM`, `am`, `A.M.`, `a.m.`.
    fn spell(self, word: &str) -> String {
        let dotted = |word: &str| word.chars().flat_map(|c| [c, '.']).collect::<String>();
        match self {
            Style::Upper => word.to_ascii_uppercase(),
            Style::Lower => word.to_owned(),
            Style::UpperDots => dotted(&word.to_ascii_uppercase()),
            Style::LowerDots => dotted(word),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    Hour12,
    Hour24,
    Minute,
    Second,
    Milli,
    Micro,
    Fraction(u8),
    SecondsOfDay,
    Meridiem(Style),
    Era(Style),
    YearComma,
    Year(u8),
    IsoYear(u8),
    MonthName(Case),
    MonthAbbrev(Case),
    Month,
    DayName(Case),
    DayAbbrev(Case),
    DayOfYear,
    IsoDayOfYear,
    DayOfMonth,
    DayOfWeek,
    IsoDayOfWeek,
    WeekOfMonth,
    WeekOfYear,
    IsoWeek,
    Century,
    Julian,
    Quarter,
    Roman(Case),
    ZoneName(Case),
    ZoneHours,
    ZoneMinutes,
    Offset,
}

/// PostgreSQL's keywords, each before any other it begins with (`HH24` before `HH`), as its
/// table lists them: upper case, lower case and, for names, capitalized.
const KEYWORDS: &[(&str, Pattern)] = {
    use Case::{Capitalized as C, Lower as L, Upper as U};
    use Pattern::*;
    &[
        ("A.D.", Era(Style::UpperDots)),
        ("A.M.", Meridiem(Style::UpperDots)),
        ("AD", Era(Style::Upper)),
        ("AM", Meridiem(Style::Upper)),
        ("B.C.", Era(Style::UpperDots)),
        ("BC", Era(Style::Upper)),
        ("CC", Century),
        ("DAY", DayName(U)),
        ("DDD", DayOfYear),
        ("DD", DayOfMonth),
        ("DY", DayAbbrev(U)),
        ("Day", DayName(C)),
        ("Dy", DayAbbrev(C)),
        ("D", DayOfWeek),
        ("FF1", Fraction(1)),
        ("FF2", Fraction(2)),
        ("FF3", Fraction(3)),
        ("FF4", Fraction(4)),
        ("FF5", Fraction(5)),
        ("FF6", Fraction(6)),
        ("HH24", Hour24),
        ("HH12", Hour12),
        ("HH", Hour12),
        ("IDDD", IsoDayOfYear),
        ("ID", IsoDayOfWeek),
        ("IW", IsoWeek),
        ("IYYY", IsoYear(4)),
        ("IYY", IsoYear(3)),
        ("IY", IsoYear(2)),
        ("I", IsoYear(1)),
        ("J", Julian),
        ("MI", Minute),
        ("MM", Month),
        ("MONTH", MonthName(U)),
        ("MON", MonthAbbrev(U)),
        ("MS", Milli),
        ("Month", MonthName(C)),
        ("Mon", MonthAbbrev(C)),
        ("OF", Offset),
        ("P.M.", Meridiem(Style::UpperDots)),
        ("PM", Meridiem(Style::Upper)),
        ("Q", Quarter),
        ("RM", Roman(U)),
        ("SSSSS", SecondsOfDay),
        ("SSSS", SecondsOfDay),
        ("SS", Second),
        ("TZH", ZoneHours),
        ("TZM", ZoneMinutes),
        ("TZ", ZoneName(U)),
        ("US", Micro),
        ("WW", WeekOfYear),
        ("W", WeekOfMonth),
        ("Y,YYY", YearComma),
        ("YYYY", Year(4)),
        ("YYY", Year(3)),
        ("YY", Year(2)),
        ("Y", Year(1)),
        ("a.d.", Era(Style::LowerDots)),
        ("a.m.", Meridiem(Style::LowerDots)),
        ("ad", Era(Style::Lower)),
        ("am", Meridiem(Style::Lower)),
        ("b.c.", Era(Style::LowerDots)),
        ("bc", Era(Style::Lower)),
        ("cc", Century),
        ("day", DayName(L)),
        ("ddd", DayOfYear),
        ("dd", DayOfMonth),
        ("dy", DayAbbrev(L)),
        ("d", DayOfWeek),
        ("ff1", Fraction(1)),
        ("ff2", Fraction(2)),
        ("ff3", Fraction(3)),
        ("ff4", Fraction(4)),
        ("ff5", Fraction(5)),
        ("ff6", Fraction(6)),
        ("hh24", Hour24),
        ("hh12", Hour12),
        ("hh", Hour12),
        ("iddd", IsoDayOfYear),
        ("id", IsoDayOfWeek),
        ("iw", IsoWeek),
        ("iyyy", IsoYear(4)),
        ("iyy", IsoYear(3)),
        ("iy", IsoYear(2)),
        ("i", IsoYear(1)),
        ("j", Julian),
        ("mi", Minute),
        ("mm", Month),
        ("month", MonthName(L)),
        ("mon", MonthAbbrev(L)),
        ("ms", Milli),
        ("of", Offset),
        ("p.m.", Meridiem(Style::LowerDots)),
        ("pm", Meridiem(Style::Lower)),
        ("q", Quarter),
        ("rm", Roman(L)),
        ("sssss", SecondsOfDay),
        ("ssss", SecondsOfDay),
        ("ss", Second),
        ("tz", ZoneName(L)),
        ("us", Micro),
        ("ww", WeekOfYear),
        ("w", WeekOfMonth),
        ("y,yyy", YearComma),
        ("yyyy", Year(4)),
        ("yyy", Year(3)),
        ("yy", Year(2)),
        ("y", Year(1)),
    ]
};

/// A template, read.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Text(String),
    Pattern {
        pattern: Pattern,
        /// `FM`: no padding.
        fill: bool,
        /// `TH` or `th`: the number's ordinal suffix, in that case.
        suffix: Option<Case>,
    },
}

/// Reads `template` as PostgreSQL does.
fn parse(template: &str) -> Vec<Node> {
    let mut nodes = Vec::new();
    let mut text = String::new();
    let mut rest = template;
    let flush = |text: &mut String, nodes: &mut Vec<Node>| {
        if !text.is_empty() {
            nodes.push(Node::Text(std::mem::take(text)));
        }
    };
    while !rest.is_empty() {
        // Prefixes: FM fills, FX and TM change nothing here. One with no pattern after it
        // is dropped, as PostgreSQL drops it.
        let mut fill = false;
        let mut after = rest;
        loop {
            if let Some(r) = strip_either(after, "FM", "fm") {
                fill = true;
                after = r;
            } else if let Some(r) =
                strip_either(after, "FX", "fx").or_else(|| strip_either(after, "TM", "tm"))
            {
                after = r;
            } else {
                break;
            }
        }
        if let Some((keyword, pattern)) = KEYWORDS.iter().find(|(k, _)| after.starts_with(k)) {
            after = &after[keyword.len()..];
            let suffix = if let Some(r) = after.strip_prefix("TH") {
                after = r;
                Some(Case::Upper)
            } else if let Some(r) = after.strip_prefix("th") {
                after = r;
                Some(Case::Lower)
            } else {
                None
            };
            flush(&mut text, &mut nodes);
            nodes.push(Node::Pattern {
                pattern: *pattern,
                fill,
                suffix,
            });
            rest = after;
            continue;
        }
        rest = after;
        let Some(c) = rest.chars().next() else {
            break;
        };
        match c {
            '"' => {
                let mut chars = rest[1..].chars();
                loop {
                    match chars.next() {
                        None | Some('"') => break,
                        Some('\\') => {
                            if let Some(escaped) = chars.next() {
                                text.push(escaped);
                            }
                        }
                        Some(other) => text.push(other),
                    }
                }
                rest = chars.as_str();
            }
            '\\' if rest[1..].starts_with('"') => {
                text.push('"');
                rest = &rest[2..];
            }
            c => {
                text.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    flush(&mut text, &mut nodes);
    nodes
}

fn strip_either<'a>(text: &'a str, upper: &str, lower: &str) -> Option<&'a str> {
    text.strip_prefix(upper)
        .or_else(|| text.strip_prefix(lower))
}

/// For tests: `template` applied to the UTC time `nanos` (with `zone`, if any).
#[cfg(test)]
fn format(nanos: i64, zone: Option<&str>, template: &str) -> String {
    let zone = zone.map(|name| Zone {
        tz: name.parse().unwrap(),
        utc: is_utc(name),
    });
    let mut out = String::new();
    Time::at(nanos.into(), zone.as_ref())
        .unwrap()
        .write(&parse(template), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-03-29 01:05:09.123456789 UTC, a Sunday (the night Europe's clocks went forward).
    const T: i64 = 1_774_746_309_123_456_789;

    #[test]
    fn patterns_give_what_postgresql_gives() {
        let utc = |template| format(T, Some("UTC"), template);
        assert_eq!(utc("YYYY-MM-DD HH24:MI:SS"), "2026-03-29 01:05:09");
        assert_eq!(
            utc("YYYY-MM-DD\"T\"HH24:MI:SS.MSOF"),
            "2026-03-29T01:05:09.123+00"
        );
        assert_eq!(
            utc("HH12:MI AM, hh pm, A.M. p.m."),
            "01:05 AM, 01 am, A.M. a.m."
        );
        assert_eq!(utc("US FF1 FF3 FF6 SSSS"), "123456 1 123 123456 3909");
        assert_eq!(utc("Day, DD Month YYYY"), "Sunday   , 29 March     2026");
        assert_eq!(utc("FMDay, FMDDth FMMonth YYYY"), "Sunday, 29th March 2026");
        assert_eq!(
            utc("DAY DY Dy dy MON Mon mon MONTH month"),
            "SUNDAY    SUN Sun sun MAR Mar mar MARCH     march    "
        );
        assert_eq!(
            utc("D ID DDD IDDD W WW IW IYYY Q CC J"),
            "1 7 088 091 5 13 13 2026 1 21 2461129"
        );
        assert_eq!(
            utc("Y,YYY YYY YY Y RM rm FMRM"),
            "2,026 026 26 6 III  iii  III"
        );
        assert_eq!(utc("TZ tz TZH:TZM AD bc"), "UTC utc +00:00 AD ad");
        assert_eq!(utc("DDth DDTH FMDDth"), "29th 29TH 29th");
        // Quoted and unknown text is copied; a backslash before a quote makes a quote.
        assert_eq!(
            utc(r#""YYYY is" YYYY \"x\" ab%"#),
            r#"YYYY is 2026 "x" ab%"#
        );
        assert_eq!(utc("hh24:mi"), "01:05");
        assert_eq!(utc("FMx FX"), "x ");
        // In a zone: its local time and offset; without one, TZ is empty.
        assert_eq!(
            format(T, Some("Europe/Berlin"), "YYYY-MM-DD HH24:MI TZ OF"),
            "2026-03-29 03:05 +02 +02"
        );
        assert_eq!(format(T, Some("+05:30"), "HH24:MI OF"), "06:35 +05:30");
        assert_eq!(format(T, None, "HH24:MI[TZ]"), "01:05[]");
        assert_eq!(
            format(-1, None, "YYYY-MM-DD HH24:MI:SS.US"),
            "1969-12-31 23:59:59.999999"
        );
    }
}

//! Line protocol's syntax, scanned by hand over the body's bytes.
//!
//! Why by hand: InfluxData's parser (nom combinators) spent a third of the server's CPU on a
//! line protocol write — every line's parts copied several times and a `String` made for each
//! name — where a scan that borrows from the body allocates only for a name with an escape
//! in it. What it must accept is exactly what InfluxData's accepts, so it is the same
//! grammar written as loops, step for step, and the tests hold it to InfluxData's verdicts
//! line for line (`reference`, the differential property test and fuzz target). Every
//! delimiter is ASCII, so slicing the text at one is always at a character boundary.

use std::borrow::Cow;

use super::FieldValue;

/// One line's parts, borrowed from the body where no escape had to be undone. The vectors
/// are kept from line to line, so a body's lines cost no allocation of their own.
#[derive(Debug, Default)]
pub struct Line<'a> {
    /// The line of the body it starts on, from 1.
    pub number: usize,
    pub measurement: Cow<'a, str>,
    /// Nanoseconds since the epoch (the request's precision applied; the server's time when
    /// the line has none).
    pub tstart: i64,
    /// In the order written; no key twice.
    pub tags: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    /// In the order first written; no key twice (a key written again keeps its last value).
    pub fields: Vec<(Cow<'a, str>, FieldValue<'a>)>,
}

/// A line's syntax as written: its time, if it has one, is still in the request's unit.
pub(super) fn line<'a>(text: &'a str, line: &mut Line<'a>) -> Result<Option<i64>, String> {
    line.tags.clear();
    line.fields.clear();
    let bytes = text.as_bytes();
    let (measurement, mut at) =
        element(text, 0, Element::Measurement)?.ok_or("no measurement at the start")?;
    line.measurement = measurement;
    if bytes.get(at) == Some(&b',') {
        loop {
            let (key, after_key) = element(text, at + 1, Element::TagKey)?
                .ok_or("a comma after the measurement or a tag must be followed by a tag")?;
            if bytes.get(after_key) != Some(&b'=') {
                return Err(format!("tag {key:?} has no '=' and value"));
            }
            let (value, after_value) = element(text, after_key + 1, Element::TagValue)?
                .ok_or_else(|| format!("tag {key:?} has no value"))?;
            if line.tags.iter().any(|(earlier, _)| *earlier == key) {
                return Err(format!("tag {key:?} is written twice"));
            }
            line.tags.push((key, value));
            at = after_value;
            if bytes.get(at) != Some(&b',') {
                break;
            }
        }
    }
    let fields_at = spaces(bytes, at);
    if fields_at == at {
        return Err("the measurement and tags must be followed by a space and fields".into());
    }
    at = fields_at;
    // Where the first field's value ends (never 0: a measurement comes before it).
    let mut fields_end_of_first = 0;
    loop {
        let Some((key, after_key)) = element(text, at, Element::FieldKey)? else {
            // InfluxData's parser takes a comma after the first field with nothing after
            // it (`m v=1,` and `m v=1, 5`; a consequence of its list combinators, kept so
            // that a line it takes is taken here).
            if line.fields.len() == 1 && at == fields_end_of_first + 1 {
                break;
            }
            return Err("a field (key=value) is missing".into());
        };
        if bytes.get(after_key) != Some(&b'=') {
            return Err(format!("field {key:?} has no '=' and value"));
        }
        let (value, after_value) = field_value(text, after_key + 1)
            .map_err(|reason| format!("field {key:?}: {reason}"))?;
        match line.fields.iter_mut().find(|(earlier, _)| *earlier == key) {
            Some(earlier) => earlier.1 = value,
            None => line.fields.push((key, value)),
        }
        at = after_value;
        if fields_end_of_first == 0 {
            fields_end_of_first = at;
        }
        if bytes.get(at) != Some(&b',') {
            break;
        }
        at += 1;
    }
    if at == bytes.len() {
        return Ok(None);
    }
    let time_at = spaces(bytes, at);
    let time_end = signed_digits(bytes, time_at);
    if time_at == at || time_end == time_at {
        return Err(format!(
            "the fields must be followed by a space and a time, or end the line; found {:?}",
            &text[at..]
        ));
    }
    let time = &text[time_at..time_end];
    let time = time
        .parse::<i64>()
        .map_err(|_| format!("time {time} does not fit a 64-bit integer"))?;
    if spaces(bytes, time_end) != bytes.len() {
        return Err(format!(
            "text after the time: {:?}",
            &text[time_end..].trim_start_matches(' ')
        ));
    }
    Ok(Some(time))
}

/// The parts of a line named by escaped text, each with its own stops and escapes.
#[derive(Debug, Clone, Copy)]
enum Element {
    Measurement,
    TagKey,
    TagValue,
    FieldKey,
}

impl Element {
    /// Whether plain text of this element ends before `byte` (a backslash starts an escape).
    fn stops_at(self, byte: u8) -> bool {
        matches!(byte, b' ' | b'\t' | b'\n' | b'\\')
            || match self {
                Element::Measurement => byte == b',' || byte == 0,
                Element::TagKey | Element::FieldKey => byte == b'=',
                Element::TagValue => byte == b',',
            }
    }

    /// Whether a backslash before `byte` stands for `byte` alone; before any other
    /// character, both are kept as written.
    fn unescapes(self, byte: u8) -> bool {
        match self {
            Element::Measurement => matches!(byte, b',' | b' ' | b'\\'),
            _ => matches!(byte, b',' | b'=' | b' ' | b'\\'),
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Element::Measurement => "measurement",
            Element::TagKey => "tag key",
            Element::TagValue => "tag value",
            Element::FieldKey => "field key",
        }
    }
}

/// The element at `start` with its escapes undone, and where it ends; `None` when it is
/// empty there.
fn element(
    text: &str,
    start: usize,
    element: Element,
) -> Result<Option<(Cow<'_, str>, usize)>, String> {
    let bytes = text.as_bytes();
    let mut at = start;
    // Built only once an escape must be undone: text before `copied_to` is in it.
    let mut unescaped: Option<String> = None;
    let mut copied_to = start;
    loop {
        at += bytes[at..]
            .iter()
            .position(|&b| element.stops_at(b))
            .unwrap_or(bytes.len() - at);
        if bytes.get(at) != Some(&b'\\') {
            break;
        }
        match bytes.get(at + 1) {
            Some(&next) if element.unescapes(next) => {
                let buffer = unescaped.get_or_insert_with(String::new);
                buffer.push_str(&text[copied_to..at]);
                buffer.push(char::from(next));
                at += 2;
                copied_to = at;
            }
            // InfluxData's (and the Go original's) rule: any other escape is kept as written.
            Some(_) => at += 1 + text[at + 1..].chars().next().map_or(1, char::len_utf8),
            None => {
                at += 1;
                break;
            }
        }
    }
    if at == start {
        return Ok(None);
    }
    let value = match unescaped {
        None => Cow::Borrowed(&text[start..at]),
        Some(mut buffer) => {
            buffer.push_str(&text[copied_to..at]);
            Cow::Owned(buffer)
        }
    };
    if value.ends_with('\\') {
        return Err(format!(
            "{} {value:?} ends with a backslash",
            element.noun()
        ));
    }
    Ok(Some((value, at)))
}

/// A field's value at `start` and where it ends.
fn field_value(text: &str, start: usize) -> Result<(FieldValue<'_>, usize), String> {
    let bytes = text.as_bytes();
    match bytes.get(start) {
        Some(b'"') => string(text, start),
        Some(b'-' | b'0'..=b'9') => number(text, start),
        Some(b't' | b'T' | b'f' | b'F') => Ok(boolean(text, start)),
        _ => Err("no value (a number, a quoted string or a boolean)".into()),
    }
}

fn number(text: &str, start: usize) -> Result<(FieldValue<'_>, usize), String> {
    let bytes = text.as_bytes();
    let integral_end = signed_digits(bytes, start);
    if integral_end == start {
        return Err("a minus sign without digits".into());
    }
    let integral = &text[start..integral_end];
    match bytes.get(integral_end) {
        Some(b'i') => {
            let value = integral
                .parse::<i64>()
                .map_err(|_| format!("integer {integral} does not fit 64 bits"))?;
            Ok((FieldValue::Long(value), integral_end + 1))
        }
        Some(b'u') if bytes[start] != b'-' => {
            let value = integral
                .parse::<u64>()
                .map_err(|_| format!("unsigned integer {integral} does not fit 64 bits"))?;
            let value = i64::try_from(value).map_err(|_| {
                format!("unsigned {value} is above the largest LONG ({})", i64::MAX)
            })?;
            Ok((FieldValue::Long(value), integral_end + 1))
        }
        _ => {
            // Each part only when whole: `1.` and `1e` end the number before the dot or e.
            let mut end = integral_end;
            if bytes.get(end) == Some(&b'.') && bytes.get(end + 1).is_some_and(u8::is_ascii_digit) {
                end = digits(bytes, end + 1);
            }
            if matches!(bytes.get(end), Some(b'e' | b'E')) {
                let mut exponent = end + 1;
                if matches!(bytes.get(exponent), Some(b'+' | b'-')) {
                    exponent += 1;
                }
                if bytes.get(exponent).is_some_and(u8::is_ascii_digit) {
                    end = digits(bytes, exponent);
                }
            }
            let number = &text[start..end];
            let value = number
                .parse::<f64>()
                .map_err(|_| format!("{number} is not a number"))?;
            // One rule for every non-finite value: the line protocol has no `inf` or `nan`
            // (InfluxDB refuses them), and a number past a DOUBLE's range is refused as
            // InfluxDB refuses it, not stored as infinity.
            if !value.is_finite() {
                return Err(format!(
                    "{number} is outside a DOUBLE's range (about ±1.8e308)"
                ));
            }
            Ok((FieldValue::Double(value), end))
        }
    }
}

/// A quoted string: a backslash stands for itself or a quote after it; before anything
/// else it is kept as written.
fn string(text: &str, start: usize) -> Result<(FieldValue<'_>, usize), String> {
    let bytes = text.as_bytes();
    let first = start + 1;
    let mut at = first;
    let mut unescaped: Option<String> = None;
    let mut copied_to = first;
    loop {
        let Some(found) = memchr::memchr2(b'"', b'\\', &bytes[at..]) else {
            return Err("a string without its closing quote".into());
        };
        at += found;
        if bytes[at] == b'"' {
            let value = match unescaped {
                None => Cow::Borrowed(&text[first..at]),
                Some(mut buffer) => {
                    buffer.push_str(&text[copied_to..at]);
                    Cow::Owned(buffer)
                }
            };
            return Ok((FieldValue::String(value), at + 1));
        }
        match bytes.get(at + 1) {
            Some(&next @ (b'"' | b'\\')) => {
                let buffer = unescaped.get_or_insert_with(String::new);
                buffer.push_str(&text[copied_to..at]);
                buffer.push(char::from(next));
                at += 2;
                copied_to = at;
            }
            _ => at += 1,
        }
    }
}

fn boolean(text: &str, start: usize) -> (FieldValue<'_>, usize) {
    let rest = &text[start..];
    for (word, value) in [
        ("true", true),
        ("True", true),
        ("TRUE", true),
        ("false", false),
        ("False", false),
        ("FALSE", false),
    ] {
        if rest.starts_with(word) {
            return (FieldValue::Boolean(value), start + word.len());
        }
    }
    // One letter (`t`, `T`, `f`, `F`): the caller made sure it is one of them.
    let value = matches!(rest.as_bytes().first(), Some(b't' | b'T'));
    (FieldValue::Boolean(value), start + 1)
}

/// Where a run of spaces from `at` ends.
fn spaces(bytes: &[u8], at: usize) -> usize {
    at + bytes[at..].iter().take_while(|&&b| b == b' ').count()
}

/// Where a run of ASCII digits from `at` ends.
fn digits(bytes: &[u8], at: usize) -> usize {
    at + bytes[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count()
}

/// Where `-?[0-9]+` from `at` ends; `at` itself when there is none.
fn signed_digits(bytes: &[u8], at: usize) -> usize {
    let from = at + usize::from(bytes.get(at) == Some(&b'-'));
    match digits(bytes, from) {
        end if end == from => at,
        end => end,
    }
}

/// The body's lines, as InfluxDB cuts them (a port of the Go server's `scanLine`, as
/// InfluxData's Rust parser has it): a newline inside a quoted field value is not a line's
/// end, nor one after a backslash. Each line comes with the newlines inside it.
pub(super) fn lines(body: &str) -> impl Iterator<Item = (&str, usize)> {
    let bytes = body.as_bytes();
    let mut start = 0;
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        let mut quoted = false;
        let mut in_fields = false;
        let mut equals = 0usize;
        let mut commas = 0usize;
        let mut escaped = false;
        let mut newlines_inside = 0;
        let mut at = start;
        while at < bytes.len() {
            let byte = bytes[at];
            if escaped {
                // The byte after a backslash: a multi-byte character's other bytes are
                // never ASCII, so they need no skipping of their own.
                escaped = false;
                newlines_inside += usize::from(byte == b'\n');
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b' ' {
                in_fields = true;
            } else if in_fields && !quoted && byte == b'=' {
                equals += 1;
            } else if in_fields && !quoted && byte == b',' {
                commas += 1;
            } else if in_fields && byte == b'"' && equals > commas {
                quoted = !quoted;
            } else if byte == b'\n' {
                if !quoted {
                    let line = &body[start..at];
                    start = at + 1;
                    return Some((line, newlines_inside));
                }
                newlines_inside += 1;
            }
            at += 1;
        }
        done = true;
        Some((&body[start..], newlines_inside))
    })
}

/// The line without the blanks before it and the comment lines (`#`) it starts with.
pub(super) fn trim_leading(mut text: &str) -> &str {
    loop {
        text = text.trim_start_matches([' ', '\t', '\n']);
        if !text.starts_with('#') {
            return text;
        }
        text = &text[text.find('\n').unwrap_or(text.len())..];
    }
}

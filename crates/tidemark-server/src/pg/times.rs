//! Timestamps with a time zone, in text format, written as PostgreSQL writes them.
//!
//! pgwire writes a `timestamptz`'s offset in text as hours alone (chrono's `%:::z`): a zone
//! whose offset has minutes (Kathmandu +05:45, St John's -03:30, India +05:30) reached the
//! client as `+05`, which it reads as another instant. PostgreSQL writes `+05:45`, and
//! `+05:41:16` when the offset has seconds (a zone's local mean time before 1900), the hours
//! alone only when that is the whole offset. Before a batch is encoded, each such column
//! asked for in text is replaced here by its text; the column's type (`timestamptz`, from
//! the original schema) is what the client is told. Binary format carries the instant
//! alone (microseconds since 2000 in UTC) and needs nothing.

use std::str::FromStr;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::timezone::Tz;
use arrow_array::types::{
    ArrowTimestampType, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use chrono::{DateTime, Offset, TimeZone};
use pgwire::api::results::{FieldFormat, FieldInfo};
use pgwire::error::PgWireError;

use super::errors::user_error;

/// `batch` with each column that is sent in text and holds timestamps with a zone other
/// than UTC turned into PostgreSQL's text of them. UTC's offset has no minutes: pgwire
/// writes it as PostgreSQL does, and the common case (`tstart`, `tend`) costs nothing more.
pub fn zoned_times_as_text(
    batch: RecordBatch,
    fields: &[FieldInfo],
) -> Result<RecordBatch, PgWireError> {
    let rewrite = |i: usize, field: &Field| {
        let text = fields
            .get(i)
            .is_some_and(|f| f.format() == FieldFormat::Text);
        match field.data_type() {
            DataType::Timestamp(unit, Some(zone)) if text && !is_utc(zone) => {
                Some((*unit, zone.clone()))
            }
            _ => None,
        }
    };
    let schema = batch.schema();
    if !schema
        .fields()
        .iter()
        .enumerate()
        .any(|(i, f)| rewrite(i, f).is_some())
    {
        return Ok(batch);
    }
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    let mut new_fields = Vec::with_capacity(batch.num_columns());
    for (i, (field, column)) in schema.fields().iter().zip(batch.columns()).enumerate() {
        match rewrite(i, field) {
            Some((unit, zone)) => {
                let tz = Tz::from_str(&zone).map_err(|e| {
                    user_error("22023", format!("time zone \"{zone}\" not recognized: {e}"))
                })?;
                let texts = match unit {
                    TimeUnit::Second => texts::<TimestampSecondType>(column, tz)?,
                    TimeUnit::Millisecond => texts::<TimestampMillisecondType>(column, tz)?,
                    TimeUnit::Microsecond => texts::<TimestampMicrosecondType>(column, tz)?,
                    TimeUnit::Nanosecond => texts::<TimestampNanosecondType>(column, tz)?,
                };
                columns.push(Arc::new(texts));
                new_fields.push(Field::new(
                    field.name(),
                    DataType::Utf8,
                    field.is_nullable(),
                ));
            }
            None => {
                columns.push(column.clone());
                new_fields.push(field.as_ref().clone());
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(new_fields)), columns)
        .map_err(|e| user_error("XX000", format!("writing times as text: {e}")))
}

fn is_utc(zone: &str) -> bool {
    matches!(zone, "UTC" | "+00:00" | "+00" | "Z" | "Etc/UTC")
}

fn texts<T: ArrowTimestampType>(column: &ArrayRef, tz: Tz) -> Result<StringArray, PgWireError> {
    let values = column.as_primitive::<T>();
    let mut out = Vec::with_capacity(values.len());
    for i in 0..values.len() {
        if values.is_null(i) {
            out.push(None);
            continue;
        }
        // Out of chrono's range (years beyond ±262,143): an error, never a made-up time.
        let time = values.value_as_datetime_with_tz(i, tz).ok_or_else(|| {
            user_error(
                "22008",
                format!("timestamp out of range: {}", values.value(i)),
            )
        })?;
        out.push(Some(pg_text(&time)));
    }
    Ok(StringArray::from(out))
}

/// The text PostgreSQL writes for `time` in DateStyle ISO (the only one Tidemark speaks):
/// microseconds always shown, as pgwire shows them for every other timestamp, and the
/// offset as `+HH`, `+HH:MM` or `+HH:MM:SS`, the shortest that is exact.
pub fn pg_text<Z: TimeZone>(time: &DateTime<Z>) -> String {
    let offset = time.offset().fix().local_minus_utc();
    let sign = if offset < 0 { '-' } else { '+' };
    let offset = offset.unsigned_abs();
    let (hours, minutes, seconds) = (offset / 3600, offset / 60 % 60, offset % 60);
    let mut text = format!(
        "{}{sign}{hours:02}",
        time.naive_local().format("%Y-%m-%d %H:%M:%S%.6f")
    );
    if minutes != 0 || seconds != 0 {
        text.push_str(&format!(":{minutes:02}"));
    }
    if seconds != 0 {
        text.push_str(&format!(":{seconds:02}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::TimestampNanosecondArray;
    use pgwire::api::Type;

    fn zoned(zone: &str, nanos: Vec<Option<i64>>) -> RecordBatch {
        let column = TimestampNanosecondArray::from(nanos).with_timezone(zone);
        let schema = Schema::new(vec![Field::new("t", column.data_type().clone(), true)]);
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(column)]).unwrap()
    }

    fn field(format: FieldFormat) -> FieldInfo {
        FieldInfo::new("t".into(), None, None, Type::TIMESTAMPTZ, format)
    }

    fn text_of(batch: &RecordBatch) -> Vec<Option<String>> {
        batch
            .column(0)
            .as_string::<i32>()
            .iter()
            .map(|t| t.map(str::to_owned))
            .collect()
    }

    const NOV_14: i64 = 1_700_000_000_123_456_789;

    #[test]
    fn offsets_with_minutes_or_seconds_are_written_whole() {
        let cases = [
            ("Asia/Kathmandu", NOV_14, "2023-11-15 03:58:20.123456+05:45"),
            (
                "America/St_Johns",
                NOV_14,
                "2023-11-14 18:43:20.123456-03:30",
            ),
            ("Asia/Kolkata", NOV_14, "2023-11-15 03:43:20.123456+05:30"),
            ("Europe/Paris", NOV_14, "2023-11-14 23:13:20.123456+01"),
            ("America/New_York", NOV_14, "2023-11-14 17:13:20.123456-05"),
            ("+05:45", NOV_14, "2023-11-15 03:58:20.123456+05:45"),
            // Kathmandu's local mean time in 1900: PostgreSQL writes +05:41:16.
            (
                "Asia/Kathmandu",
                -2_208_988_800_000_000_000,
                "1900-01-01 05:41:16.000000+05:41:16",
            ),
        ];
        for (zone, nanos, expected) in cases {
            let batch = zoned(zone, vec![Some(nanos), None]);
            let out = zoned_times_as_text(batch, &[field(FieldFormat::Text)]).unwrap();
            assert_eq!(out.schema().field(0).data_type(), &DataType::Utf8);
            assert_eq!(text_of(&out), [Some(expected.to_string()), None], "{zone}");
        }
    }

    #[test]
    fn utc_and_binary_columns_are_left_to_the_encoder() {
        let batch = zoned("UTC", vec![Some(NOV_14)]);
        let out = zoned_times_as_text(batch.clone(), &[field(FieldFormat::Text)]).unwrap();
        assert_eq!(out, batch);
        let batch = zoned("Asia/Kathmandu", vec![Some(NOV_14)]);
        let out = zoned_times_as_text(batch.clone(), &[field(FieldFormat::Binary)]).unwrap();
        assert_eq!(out, batch);
    }

    #[test]
    fn an_unknown_zone_is_an_error_not_a_time() {
        let batch = zoned("Mars/Olympus", vec![Some(NOV_14)]);
        assert!(zoned_times_as_text(batch, &[field(FieldFormat::Text)]).is_err());
    }
}

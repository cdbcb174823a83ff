//! Summaries of groups of events: the per-field count / min / max / sum / first / last that
//! block headers store and that query accumulators are made of.
//!
//! A summary can be merged with the summary of the events that follow it, so an aggregate
//! over a long range adds up block summaries instead of reading events. "Follows" is the
//! order of the events' (tstart, insertion): `first` keeps the earliest value and, on equal
//! timestamps, the one inserted first; `last` keeps the latest and, on ties, the one inserted
//! last. Merging in insertion order therefore gives the same answer as a row-by-row pass.
//!
//! Floats compare with IEEE 754 total order (so NaN sorts above +inf and -0.0 below 0.0);
//! integer sums are exact (i128).

use std::cmp::Ordering;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use crate::{Column, ColumnData, EventBatch, FieldType, Timestamp, Value};

/// A numeric field value widened for aggregation. Booleans are 0 and 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    I(i64),
    F(f64),
}

impl Num {
    /// IEEE 754 total order for floats; integers compare exactly.
    pub fn total_cmp(&self, other: &Num) -> Ordering {
        match (self, other) {
            (Num::I(a), Num::I(b)) => a.cmp(b),
            (Num::F(a), Num::F(b)) => a.total_cmp(b),
            (Num::I(a), Num::F(b)) => (*a as f64).total_cmp(b),
            (Num::F(a), Num::I(b)) => a.total_cmp(&(*b as f64)),
        }
    }

    /// The value as a field of type `ty`.
    pub fn to_value(self, ty: FieldType) -> Value {
        match (self, ty) {
            (Num::I(v), FieldType::Boolean) => Value::Boolean(v != 0),
            (Num::I(v), FieldType::Byte) => Value::Byte(v as i8),
            (Num::I(v), FieldType::Short) => Value::Short(v as i16),
            (Num::I(v), FieldType::Integer) => Value::Integer(v as i32),
            (Num::I(v), _) => Value::Long(v),
            (Num::F(v), FieldType::Float) => Value::Float(v as f32),
            (Num::F(v), _) => Value::Double(v),
        }
    }
}

/// An exact integer sum or a float sum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sum {
    I(i128),
    F(f64),
}

impl Sum {
    fn add(&mut self, n: Num) {
        match (self, n) {
            (Sum::I(s), Num::I(v)) => *s += i128::from(v),
            (Sum::F(s), Num::F(v)) => *s += v,
            (Sum::I(s), Num::F(v)) => *s += v as i128,
            (Sum::F(s), Num::I(v)) => *s += v as f64,
        }
    }

    fn merge(&mut self, other: Sum) {
        match (self, other) {
            (Sum::I(a), Sum::I(b)) => *a += b,
            (Sum::F(a), Sum::F(b)) => *a += b,
            (Sum::I(a), Sum::F(b)) => *a += b as i128,
            (Sum::F(a), Sum::I(b)) => *a += b as f64,
        }
    }

    pub fn as_f64(self) -> f64 {
        match self {
            Sum::I(v) => v as f64,
            Sum::F(v) => v,
        }
    }
}

/// Statistics of the non-null values of a numeric field; present once one value was seen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NumSummary {
    pub min: Num,
    pub max: Num,
    pub sum: Sum,
    pub first: (Timestamp, Num),
    pub last: (Timestamp, Num),
}

impl NumSummary {
    fn new(ts: Timestamp, n: Num) -> NumSummary {
        NumSummary {
            min: n,
            max: n,
            sum: match n {
                Num::I(v) => Sum::I(i128::from(v)),
                Num::F(v) => Sum::F(v),
            },
            first: (ts, n),
            last: (ts, n),
        }
    }

    fn add(&mut self, ts: Timestamp, n: Num) {
        if n.total_cmp(&self.min).is_lt() {
            self.min = n;
        }
        if n.total_cmp(&self.max).is_gt() {
            self.max = n;
        }
        self.sum.add(n);
        if ts < self.first.0 {
            self.first = (ts, n);
        }
        if ts >= self.last.0 {
            self.last = (ts, n);
        }
    }

    fn merge(&mut self, later: &NumSummary) {
        if later.min.total_cmp(&self.min).is_lt() {
            self.min = later.min;
        }
        if later.max.total_cmp(&self.max).is_gt() {
            self.max = later.max;
        }
        self.sum.merge(later.sum);
        if later.first.0 < self.first.0 {
            self.first = later.first;
        }
        if later.last.0 >= self.last.0 {
            self.last = later.last;
        }
    }
}

/// The bounds of `values`, `None` when there are none.
fn bounds_of<'a>(mut values: impl Iterator<Item = &'a [u8]>) -> Option<BytesBounds> {
    let first = values.next()?;
    let (least, greatest) = values.fold((first, first), |(lo, hi), x| (lo.min(x), hi.max(x)));
    Some(BytesBounds {
        least: Prefix::of(least),
        greatest: Prefix::of(greatest),
    })
}

/// The most bytes of a STRING or BYTES value [`BytesBounds`] keeps.
pub const PREFIX_BYTES: usize = 16;

/// At most [`PREFIX_BYTES`] of a value, and whether it was cut short. Kept inline (no
/// allocation) so that a summary stays a few words, copied freely.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    bytes: [u8; PREFIX_BYTES],
    len: u8,
    cut: bool,
}

impl fmt::Debug for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?}{}",
            String::from_utf8_lossy(self.bytes()),
            if self.cut { "…" } else { "" }
        )
    }
}

impl Prefix {
    /// The first [`PREFIX_BYTES`] of `value`.
    pub fn of(value: &[u8]) -> Prefix {
        let len = value.len().min(PREFIX_BYTES);
        let mut bytes = [0; PREFIX_BYTES];
        bytes[..len].copy_from_slice(&value[..len]);
        Prefix {
            bytes,
            len: len as u8,
            cut: value.len() > PREFIX_BYTES,
        }
    }

    /// A prefix as stored: `None` if it could not have been made by [`Prefix::of`] (too
    /// long, or cut short before [`PREFIX_BYTES`]).
    pub fn from_parts(bytes: &[u8], cut: bool) -> Option<Prefix> {
        if bytes.len() > PREFIX_BYTES || (cut && bytes.len() != PREFIX_BYTES) {
            return None;
        }
        let mut prefix = Prefix::of(bytes);
        prefix.cut = cut;
        Some(prefix)
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// Whether `value` sorts above every value this prefix is the greatest of: above the
    /// value itself, or, cut short, above every value that begins with it.
    fn is_below(&self, value: &[u8]) -> bool {
        let bytes = self.bytes();
        if self.cut {
            &value[..value.len().min(bytes.len())] > bytes
        } else {
            value > bytes
        }
    }

    /// The greater of two greatest-value prefixes: the one whose values reach higher.
    fn upper_max(self, other: Prefix) -> Prefix {
        let covers = |a: &Prefix, b: &Prefix| a.cut && b.bytes().starts_with(a.bytes());
        if covers(&self, &other) {
            self
        } else if covers(&other, &self) || other.bytes() > self.bytes() {
            other
        } else {
            self
        }
    }
}

/// Bounds of the values of a STRING or BYTES field, in byte order: none is below `least`
/// (a prefix of the least value), and none is above `greatest` (the greatest value, or, when
/// cut short, a prefix of it: no value then is above every value that begins with it).
/// They let a scan skip a block whose values cannot equal, or be on the asked side of, a
/// literal (`SYMBOL = 'aapl'` where a block holds `AAPL` to `TSLA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BytesBounds {
    pub least: Prefix,
    pub greatest: Prefix,
}

impl BytesBounds {
    fn of(value: &[u8]) -> BytesBounds {
        let prefix = Prefix::of(value);
        BytesBounds {
            least: prefix,
            greatest: prefix,
        }
    }

    /// Bounds as stored: `None` if `least` sorts above `greatest`.
    pub fn new(least: Prefix, greatest: Prefix) -> Option<BytesBounds> {
        (least.bytes() <= greatest.bytes()
            || greatest.cut && least.bytes().starts_with(greatest.bytes()))
        .then_some(BytesBounds { least, greatest })
    }

    fn merge(&mut self, other: &BytesBounds) {
        // Cutting keeps order (a ≤ b: a's prefix ≤ b's), so the least prefix is the prefix
        // of the least value.
        if other.least.bytes() < self.least.bytes() {
            self.least = other.least;
        }
        self.greatest = self.greatest.upper_max(other.greatest);
    }

    /// Whether no value within these bounds can be `value`.
    pub fn excludes(&self, value: &[u8]) -> bool {
        value < self.least.bytes() || self.greatest.is_below(value)
    }

    /// Whether every value within these bounds is below `value`.
    pub fn all_below(&self, value: &[u8]) -> bool {
        self.greatest.is_below(value)
    }

    /// Whether every value within these bounds is at most `value`.
    pub fn all_at_most(&self, value: &[u8]) -> bool {
        !self.greatest.cut && self.greatest.bytes() <= value || self.greatest.is_below(value)
    }

    /// Whether every value within these bounds is above `value` (the least value is at
    /// least its prefix).
    pub fn all_above(&self, value: &[u8]) -> bool {
        self.least.bytes() > value
    }

    /// Whether every value within these bounds is at least `value`.
    pub fn all_at_least(&self, value: &[u8]) -> bool {
        self.least.bytes() >= value
    }

    /// Whether every value within these bounds is `value`.
    pub fn all_equal(&self, value: &[u8]) -> bool {
        !self.least.cut
            && !self.greatest.cut
            && self.least.bytes() == value
            && self.greatest.bytes() == value
    }
}

/// Whether a summary keeps the [`BytesBounds`] of STRING and BYTES values. A segment's
/// blocks keep them (a query skips the blocks they exclude); a summary taken on the append
/// path (the memtable's batches) or for an aggregate does not: finding the least and
/// greatest of every appended string cost W1's batches ~45% of their summary time, where a
/// query skipping the memtable's unflushed batches by them saves little. A summary without
/// bounds never excludes a value, and values summarised without bounds leave a summary
/// that takes them without (see [`FieldSummary::merge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bounds {
    Kept,
    Skipped,
}

/// Count, null count and (for numeric fields) [`NumSummary`] of one field over some events;
/// for STRING and BYTES fields, when [`Bounds::Kept`], the [`BytesBounds`] of their values.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FieldSummary {
    /// Non-null values.
    pub count: u64,
    pub nulls: u64,
    pub num: Option<NumSummary>,
    pub bytes: Option<BytesBounds>,
}

impl FieldSummary {
    /// `count` nulls.
    pub fn nulls(count: u64) -> FieldSummary {
        FieldSummary {
            count: 0,
            nulls: count,
            num: None,
            bytes: None,
        }
    }

    pub fn add_null(&mut self) {
        self.nulls += 1;
    }

    /// A non-null value; `num` is `None` for STRING and BYTES values, which are only counted.
    pub fn add(&mut self, ts: Timestamp, num: Option<Num>) {
        self.count += 1;
        if let Some(n) = num {
            match &mut self.num {
                Some(s) => s.add(ts, n),
                None => self.num = Some(NumSummary::new(ts, n)),
            }
        }
    }

    /// Adds the row `row` of `column` (whose event starts at `ts`).
    pub fn add_row(&mut self, column: &Column, row: usize, ts: Timestamp, bounds: Bounds) {
        let Some(index) = column.value_index(row) else {
            self.add_null();
            return;
        };
        // Values already counted without bounds leave the summary without them (as
        // `merge` does): bounds of the rest alone would rule those out.
        let unbounded = self.count > 0 && self.bytes.is_none();
        self.add(ts, column.num(row));
        if let ColumnData::String(v) | ColumnData::Bytes(v) = column.data() {
            match (&mut self.bytes, bounds) {
                (_, Bounds::Skipped) => self.bytes = None,
                (None, Bounds::Kept) if unbounded => {}
                (Some(kept), Bounds::Kept) => kept.merge(&BytesBounds::of(v.get(index))),
                (None, Bounds::Kept) => self.bytes = Some(BytesBounds::of(v.get(index))),
            }
        }
    }

    /// Folds in the summary of events that follow these in (tstart, insertion) order.
    pub fn merge(&mut self, later: &FieldSummary) {
        // Values with no bounds (of a segment written before there were any) leave the
        // merged values unbounded: bounds of the rest alone would rule them out.
        let unbounded = |s: &FieldSummary| s.count > 0 && s.bytes.is_none();
        let bounds_lost = unbounded(self) || unbounded(later);
        self.count += later.count;
        self.nulls += later.nulls;
        match (&mut self.num, &later.num) {
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (None, Some(theirs)) => self.num = Some(*theirs),
            (_, None) => {}
        }
        match (&mut self.bytes, &later.bytes) {
            _ if bounds_lost => self.bytes = None,
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (None, Some(theirs)) => self.bytes = Some(*theirs),
            (_, None) => {}
        }
    }

    /// Summarises `rows` of one column of a batch whose timestamps are `tstart`: the same
    /// answer as [`FieldSummary::add_row`] row by row, computed without widening every
    /// value to a [`Num`] (this runs for every appended batch on every replica, and at
    /// every flush).
    pub fn of_rows(
        column: &Column,
        tstart: &[Timestamp],
        rows: Range<usize>,
        bounds: Bounds,
    ) -> FieldSummary {
        let values = column.value_range(rows.clone());
        let count = values.len() as u64;
        let nulls = rows.len() as u64 - count;
        let bytes = match column.data() {
            _ if bounds == Bounds::Skipped => None,
            ColumnData::String(v) | ColumnData::Bytes(v) => {
                bounds_of(values.clone().map(|i| v.get(i)))
            }
            _ => None,
        };
        let ts = column.valid_rows(rows).map(|row| tstart[row]);
        let num = match column.data() {
            ColumnData::Boolean(v) => numeric(&v[values], ts, i64::from),
            ColumnData::Byte(v) => numeric(&v[values], ts, i64::from),
            ColumnData::Short(v) => numeric(&v[values], ts, i64::from),
            ColumnData::Integer(v) => numeric(&v[values], ts, i64::from),
            ColumnData::Long(v) => numeric(&v[values], ts, |x: i64| x),
            ColumnData::Float(v) => numeric(&v[values], ts, f64::from),
            ColumnData::Double(v) => numeric(&v[values], ts, |x: f64| x),
            ColumnData::String(_) | ColumnData::Bytes(_) => None,
        };
        FieldSummary {
            count,
            nulls,
            num,
            bytes,
        }
    }

    /// The aggregate `f` of a field of type `ty`; `Null` when there is no value to aggregate.
    pub fn eval(&self, f: AggFn, ty: FieldType) -> Value {
        if f == AggFn::Count {
            return Value::Long(self.count as i64);
        }
        let Some(s) = &self.num else {
            return Value::Null;
        };
        match f {
            AggFn::Count => Value::Long(self.count as i64),
            AggFn::Min => s.min.to_value(ty),
            AggFn::Max => s.max.to_value(ty),
            AggFn::First => s.first.1.to_value(ty),
            AggFn::Last => s.last.1.to_value(ty),
            AggFn::Avg => Value::Double(s.sum.as_f64() / self.count as f64),
            AggFn::Sum => match s.sum {
                Sum::I(v) => i64::try_from(v).map_or(Value::Double(v as f64), Value::Long),
                Sum::F(v) => Value::Double(v),
            },
        }
    }
}

/// The summary of a group of events: their count, time range and one [`FieldSummary`] per
/// schema field.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchSummary {
    pub count: u64,
    pub min_ts: Timestamp,
    pub max_ts: Timestamp,
    pub fields: Vec<FieldSummary>,
}

impl BatchSummary {
    /// Summarises a non-empty batch; `None` for an empty one.
    pub fn of(batch: &EventBatch, bounds: Bounds) -> Option<BatchSummary> {
        BatchSummary::of_rows(batch, 0..batch.len(), bounds)
    }

    /// Summarises `rows` of a batch; `None` if the range is empty.
    pub fn of_rows(batch: &EventBatch, rows: Range<usize>, bounds: Bounds) -> Option<BatchSummary> {
        let ts = &batch.tstart()[rows.clone()];
        let min_ts = *ts.iter().min()?;
        let max_ts = *ts.iter().max()?;
        Some(BatchSummary {
            count: ts.len() as u64,
            min_ts,
            max_ts,
            fields: batch
                .columns()
                .iter()
                .map(|c| FieldSummary::of_rows(c, batch.tstart(), rows.clone(), bounds))
                .collect(),
        })
    }

    /// Folds in the summary of events that follow these in (tstart, insertion) order. Of
    /// two summaries of different widths, the narrower is of events stored before fields
    /// were added to the schema: they count as nulls of those fields.
    pub fn merge(&mut self, later: &BatchSummary) {
        while self.fields.len() < later.fields.len() {
            self.fields.push(FieldSummary::nulls(self.count));
        }
        for (i, mine) in self.fields.iter_mut().enumerate() {
            match later.fields.get(i) {
                Some(theirs) => mine.merge(theirs),
                None => mine.nulls += later.count,
            }
        }
        self.count += later.count;
        self.min_ts = self.min_ts.min(later.min_ts);
        self.max_ts = self.max_ts.max(later.max_ts);
    }

    /// The summary of field `index` of the schema; a field past this summary's width was
    /// added after its events were stored, and is null in all of them.
    pub fn field(&self, index: usize) -> FieldSummary {
        self.fields
            .get(index)
            .copied()
            .unwrap_or_else(|| FieldSummary::nulls(self.count))
    }
}

/// A value as a typed summary pass widens it: `i64` (an exact `i128` sum) or `f64` (IEEE
/// 754 total order, summed in row order), as [`Num`] and [`Sum`] hold them.
trait Widened: Copy {
    type Total;
    fn start_total(self) -> Self::Total;
    fn add_to(self, total: &mut Self::Total);
    fn min_total(self, other: Self) -> Self;
    fn max_total(self, other: Self) -> Self;
    fn into_num(self) -> Num;
    fn into_sum(total: Self::Total) -> Sum;
}

impl Widened for i64 {
    type Total = i128;
    fn start_total(self) -> i128 {
        i128::from(self)
    }
    fn add_to(self, total: &mut i128) {
        *total += i128::from(self);
    }
    fn min_total(self, other: i64) -> i64 {
        self.min(other)
    }
    fn max_total(self, other: i64) -> i64 {
        self.max(other)
    }
    fn into_num(self) -> Num {
        Num::I(self)
    }
    fn into_sum(total: i128) -> Sum {
        Sum::I(total)
    }
}

impl Widened for f64 {
    type Total = f64;
    fn start_total(self) -> f64 {
        self
    }
    fn add_to(self, total: &mut f64) {
        *total += self;
    }
    fn min_total(self, other: f64) -> f64 {
        if other.total_cmp(&self).is_lt() {
            other
        } else {
            self
        }
    }
    fn max_total(self, other: f64) -> f64 {
        if other.total_cmp(&self).is_gt() {
            other
        } else {
            self
        }
    }
    fn into_num(self) -> Num {
        Num::F(self)
    }
    fn into_sum(total: f64) -> Sum {
        Sum::F(total)
    }
}

/// [`NumSummary`] of the values of a column's valid rows and those rows' timestamps, with
/// [`NumSummary::add`]'s rules for ties.
fn numeric<T: Copy, W: Widened>(
    values: &[T],
    tstart: impl Iterator<Item = Timestamp>,
    widen: impl Fn(T) -> W,
) -> Option<NumSummary> {
    let mut pairs = tstart.zip(values).map(|(ts, &v)| (ts, widen(v)));
    let (ts, v) = pairs.next()?;
    let (mut min, mut max, mut total) = (v, v, v.start_total());
    let (mut first, mut last) = ((ts, v), (ts, v));
    for (ts, v) in pairs {
        min = min.min_total(v);
        max = max.max_total(v);
        v.add_to(&mut total);
        if ts < first.0 {
            first = (ts, v);
        }
        if ts >= last.0 {
            last = (ts, v);
        }
    }
    Some(NumSummary {
        min: min.into_num(),
        max: max.into_num(),
        sum: W::into_sum(total),
        first: (first.0, first.1.into_num()),
        last: (last.0, last.1.into_num()),
    })
}

/// An aggregate function over one field (or over events, for `count` without a field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AggFn {
    Count,
    Sum,
    Min,
    Max,
    Avg,
    First,
    Last,
}

impl AggFn {
    pub const ALL: [AggFn; 7] = [
        AggFn::Count,
        AggFn::Sum,
        AggFn::Min,
        AggFn::Max,
        AggFn::Avg,
        AggFn::First,
        AggFn::Last,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AggFn::Count => "count",
            AggFn::Sum => "sum",
            AggFn::Min => "min",
            AggFn::Max => "max",
            AggFn::Avg => "avg",
            AggFn::First => "first",
            AggFn::Last => "last",
        }
    }

    /// Whether the function is defined on fields of type `ty`: STRING and BYTES fields can
    /// only be counted.
    pub fn applies_to(self, ty: FieldType) -> bool {
        self == AggFn::Count || ty.is_numeric()
    }
}

impl fmt::Display for AggFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AggFn {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        match lower.as_str() {
            "mean" | "average" => return Ok(AggFn::Avg),
            _ => {}
        }
        AggFn::ALL
            .into_iter()
            .find(|f| f.name() == lower)
            .ok_or_else(|| {
                format!(
                    "unknown aggregate {s:?} (expected count, sum, min, max, avg, first or last)"
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fold(values: &[(i64, Option<Num>)]) -> FieldSummary {
        let mut s = FieldSummary::default();
        for &(ts, v) in values {
            match v {
                Some(n) => s.add(ts, Some(n)),
                None => s.add_null(),
            }
        }
        s
    }

    #[test]
    fn merge_equals_one_pass() {
        let rows = [
            (5, Some(Num::I(3))),
            (1, None),
            (5, Some(Num::I(-7))),
            (2, Some(Num::I(10))),
            (9, Some(Num::I(4))),
            (9, Some(Num::I(8))),
            (2, Some(Num::I(11))),
        ];
        let whole = fold(&rows);
        for cut in 0..=rows.len() {
            let mut left = fold(&rows[..cut]);
            left.merge(&fold(&rows[cut..]));
            assert_eq!(left, whole, "cut at {cut}");
        }
        let ty = FieldType::Long;
        assert_eq!(whole.eval(AggFn::Count, ty), Value::Long(6));
        assert_eq!(whole.eval(AggFn::Min, ty), Value::Long(-7));
        assert_eq!(whole.eval(AggFn::Max, ty), Value::Long(11));
        assert_eq!(whole.eval(AggFn::Sum, ty), Value::Long(29));
        assert_eq!(
            whole.eval(AggFn::First, ty),
            Value::Long(10),
            "ts 2, inserted first"
        );
        assert_eq!(
            whole.eval(AggFn::Last, ty),
            Value::Long(8),
            "ts 9, inserted last"
        );
        assert_eq!(FieldSummary::default().eval(AggFn::Max, ty), Value::Null);
        assert_eq!(
            FieldSummary::default().eval(AggFn::Count, ty),
            Value::Long(0)
        );
    }

    #[test]
    fn float_total_order_and_big_sums() {
        let s = fold(&[
            (1, Some(Num::F(f64::NAN))),
            (2, Some(Num::F(-0.0))),
            (3, Some(Num::F(f64::NEG_INFINITY))),
        ]);
        assert!(matches!(s.eval(AggFn::Max, FieldType::Double), Value::Double(v) if v.is_nan()));
        assert_eq!(
            s.eval(AggFn::Min, FieldType::Double),
            Value::Double(f64::NEG_INFINITY)
        );

        let big = fold(&[(1, Some(Num::I(i64::MAX))), (2, Some(Num::I(i64::MAX)))]);
        assert_eq!(
            big.eval(AggFn::Sum, FieldType::Long),
            Value::Double(2.0 * i64::MAX as f64)
        );
        let bools = fold(&[(1, Some(Num::I(1))), (2, Some(Num::I(0)))]);
        assert_eq!(
            bools.eval(AggFn::Min, FieldType::Boolean),
            Value::Boolean(false)
        );
        assert_eq!(bools.eval(AggFn::Sum, FieldType::Boolean), Value::Long(1));
    }

    #[test]
    fn parses_functions() {
        assert_eq!("MAX".parse::<AggFn>(), Ok(AggFn::Max));
        assert_eq!("mean".parse::<AggFn>(), Ok(AggFn::Avg));
        assert!("median".parse::<AggFn>().is_err());
        assert!(!AggFn::Sum.applies_to(FieldType::String));
        assert!(AggFn::Count.applies_to(FieldType::Bytes));
    }

    /// Values of a stem of 0, 14 to 17 `a`s and a short tail of `a`s and `b`s: values that
    /// share the 16 bytes bounds keep, and differ before, at and after them.
    fn near_the_cut() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::strategy::Strategy;
        (
            proptest::sample::select(vec![0usize, 14, 15, 16, 17]),
            proptest::collection::vec(proptest::sample::select(vec![b'a', b'b']), 0..4),
        )
            .prop_map(|(stem, tail)| {
                let mut value = vec![b'a'; stem];
                value.extend(tail);
                value
            })
    }

    /// Values summarised without bounds (a segment older than them) merged with values
    /// with bounds leave no bounds: the others' would rule the first out.
    #[test]
    fn values_without_bounds_leave_a_merge_unbounded() {
        let mut column = Column::with_capacity(FieldType::String, 2);
        column.push_value(&Value::String("m".into())).unwrap();
        column.push_value(&Value::String("z".into())).unwrap();
        let bounded = FieldSummary::of_rows(&column, &[1, 2], 0..2, Bounds::Kept);
        assert!(bounded.bytes.is_some());
        let old = FieldSummary::of_rows(&column, &[1, 2], 0..2, Bounds::Skipped);
        assert_eq!(
            old,
            FieldSummary {
                bytes: None,
                ..bounded
            }
        );
        // Row by row too: a value added without bounds, or with them after values without,
        // leaves none.
        let mut mixed = bounded;
        mixed.add_row(&column, 0, 3, Bounds::Skipped);
        assert_eq!(mixed.bytes, None);
        mixed.add_row(&column, 1, 4, Bounds::Kept);
        assert_eq!((mixed.count, mixed.bytes), (4, None));
        for (mut a, b) in [(bounded, old), (old, bounded)] {
            a.merge(&b);
            assert_eq!((a.count, a.bytes), (4, None));
        }
        let mut nulls_only = FieldSummary::nulls(3);
        nulls_only.merge(&bounded);
        assert_eq!(nulls_only.bytes, bounded.bytes);
    }

    proptest::proptest! {
        /// Bytes bounds never rule out a value that is there: for values with shared
        /// prefixes around the 16 bytes kept, summarised in two parts and merged, each test
        /// a scan asks of them (=, <>, <, <=, >, >=) says "maybe" wherever some value meets
        /// it. And they do rule out: a value below the least or above the greatest whole
        /// value is excluded.
        #[test]
        fn bytes_bounds_never_exclude_a_value_that_is_there(
            values in proptest::collection::vec(near_the_cut(), 1..12),
            probe in near_the_cut(),
            split in proptest::prelude::any::<usize>(),
        ) {
            let at = 1 + split % values.len();
            let mut bounds = bounds_of(values[..at].iter().map(Vec::as_slice)).unwrap();
            if let Some(rest) = bounds_of(values[at..].iter().map(Vec::as_slice)) {
                bounds.merge(&rest);
            }
            let v = probe.as_slice();
            let any = |f: &dyn Fn(&[u8]) -> bool| values.iter().any(|x| f(x));
            proptest::prop_assert!(!bounds.excludes(v) || !any(&|x| x == v));
            proptest::prop_assert!(!bounds.all_equal(v) || !any(&|x| x != v));
            proptest::prop_assert!(!bounds.all_at_least(v) || !any(&|x| x < v));
            proptest::prop_assert!(!bounds.all_above(v) || !any(&|x| x <= v));
            proptest::prop_assert!(!bounds.all_at_most(v) || !any(&|x| x > v));
            proptest::prop_assert!(!bounds.all_below(v) || !any(&|x| x >= v));
            let least = values.iter().min().unwrap();
            let greatest = values.iter().max().unwrap();
            if v < least.as_slice() && v < &least[..least.len().min(PREFIX_BYTES)] {
                proptest::prop_assert!(bounds.excludes(v));
            }
            if greatest.len() <= PREFIX_BYTES && v > greatest.as_slice() {
                proptest::prop_assert!(bounds.excludes(v) && bounds.all_below(v));
            }
        }

        /// The typed pass of `of_rows` gives exactly what adding the same rows one by one
        /// gives, for every numeric type (floats from any bits: NaN, infinities, -0.0), with
        /// nulls, tied and unordered timestamps, and any sub-range.
        #[test]
        fn of_rows_equals_row_by_row(
            ty in proptest::sample::select(vec![
                FieldType::Boolean, FieldType::Byte, FieldType::Short, FieldType::Integer,
                FieldType::Long, FieldType::Float, FieldType::Double, FieldType::String,
            ]),
            rows in proptest::collection::vec(
                (0i64..20, proptest::prelude::any::<u64>(), proptest::prelude::any::<bool>()),
                0..100,
            ),
            cut in proptest::prelude::any::<(usize, usize)>(),
            bounds in proptest::sample::select(vec![Bounds::Kept, Bounds::Skipped]),
        ) {
            let mut column = Column::with_capacity(ty, rows.len());
            for &(_, bits, valid) in &rows {
                let value = match ty {
                    _ if !valid => Value::Null,
                    FieldType::Boolean => Value::Boolean(bits % 2 == 1),
                    FieldType::Byte => Value::Byte(bits as i8),
                    FieldType::Short => Value::Short(bits as i16),
                    FieldType::Integer => Value::Integer(bits as i32),
                    FieldType::Long => Value::Long(bits as i64),
                    FieldType::Float => Value::Float(f32::from_bits(bits as u32)),
                    FieldType::Double => Value::Double(f64::from_bits(bits)),
                    _ => Value::String(format!("{bits}")),
                };
                column.push_value(&value).unwrap();
            }
            let tstart: Vec<i64> = rows.iter().map(|r| r.0).collect();
            let (a, b) = (cut.0 % (rows.len() + 1), cut.1 % (rows.len() + 1));
            let range = a.min(b)..a.max(b);
            let mut expected = FieldSummary::default();
            for row in range.clone() {
                expected.add_row(&column, row, tstart[row], bounds);
            }
            let got = FieldSummary::of_rows(&column, &tstart, range, bounds);
            // Debug, not ==: NaN must equal NaN here, and -0.0 must differ from 0.0.
            proptest::prop_assert_eq!(format!("{got:?}"), format!("{expected:?}"));
        }
    }
}

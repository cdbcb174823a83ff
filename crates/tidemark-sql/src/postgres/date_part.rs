//! `extract` and `date_part` of the parts whose fraction DataFusion drops.
//!
//! PostgreSQL's `extract(epoch FROM now() - max(ts))` is the seconds with their fraction;
//! DataFusion's `date_part('epoch', ...)` of a duration (what the difference of two
//! timestamps is in DataFusion) kept whole seconds, counted an interval's month as 30 days
//! and its year as 360, and `second` (with `millisecond`, `microsecond`) of a time dropped
//! the fraction. Here, as in PostgreSQL:
//!
//! - `epoch` of an interval or a duration is its seconds with their fraction, a year of
//!   months being 365.25 days and a month 30; of a timestamp, its seconds since 1970 with
//!   their fraction, whole seconds and fraction converted apart (exact where a double is);
//! - `second` is the seconds with their fraction (`12.5`), `millisecond(s)` and
//!   `microsecond(s)` the same in thousandths and millionths (`12500`), of a timestamp, an
//!   interval or a duration.
//!
//! Each is a double (PostgreSQL's `numeric`); other parts and types are DataFusion's.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array};
use datafusion::arrow::datatypes::{
    DataType, Int64Type, IntervalDayTimeType, IntervalMonthDayNanoType, IntervalUnit,
    IntervalYearMonthType, TimeUnit,
};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{exec_err, DFSchema, ExprSchema, Result as DfResult, ScalarValue};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};

const NANOS_PER_SECOND: i128 = 1_000_000_000;
const SECONDS_PER_DAY: i128 = 86_400;

/// A part this module computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Part {
    Epoch,
    /// Seconds with their fraction, times this (1, 1000, 1000000).
    Seconds(u32),
}

fn part(name: &str) -> Option<Part> {
    Some(match name.to_ascii_lowercase().as_str() {
        "epoch" => Part::Epoch,
        "second" | "seconds" => Part::Seconds(1),
        "millisecond" | "milliseconds" => Part::Seconds(1_000),
        "microsecond" | "microseconds" => Part::Seconds(1_000_000),
        _ => return None,
    })
}

/// `date_part(part, x)` with `part` given as text in the statement.
fn literal_part(expr: &Expr) -> Option<(Part, &Expr)> {
    let Expr::ScalarFunction(ScalarFunction { func, args }) = expr else {
        return None;
    };
    if func.name() != "date_part" {
        return None;
    }
    let [Expr::Literal(name, _), value] = args.as_slice() else {
        return None;
    };
    let name = match name {
        ScalarValue::Utf8(Some(n))
        | ScalarValue::Utf8View(Some(n))
        | ScalarValue::LargeUtf8(Some(n)) => n,
        _ => return None,
    };
    Some((part(name)?, value))
}

/// Whether `expr` may be rewritten (without looking at its argument's type).
pub fn is_candidate(expr: &Expr) -> bool {
    literal_part(expr).is_some()
}

pub fn rewrite(expr: Expr, schema: &DFSchema) -> DfResult<Transformed<Expr>> {
    let Some((part, value)) = literal_part(&expr) else {
        return Ok(Transformed::no(expr));
    };
    let Ok(input) = value.get_type(schema as &dyn ExprSchema) else {
        return Ok(Transformed::no(expr));
    };
    // Every part here of an interval, a duration or a timestamp (DataFusion's epoch of a
    // timestamp divides its nanoseconds as one double: .25 read .2499998).
    let ours = matches!(
        &input,
        DataType::Interval(_) | DataType::Duration(_) | DataType::Timestamp(..)
    );
    if !ours {
        return Ok(Transformed::no(expr));
    }
    let function = ScalarUDF::new_from_impl(DatePart {
        signature: Signature::any(1, Volatility::Immutable),
        part,
    });
    Ok(Transformed::yes(Expr::ScalarFunction(
        ScalarFunction::new_udf(Arc::new(function), vec![value.clone()]),
    )))
}

/// `part` of its one argument, a double.
#[derive(Debug, PartialEq, Eq, Hash)]
struct DatePart {
    signature: Signature,
    part: Part,
}

impl ScalarUDFImpl for DatePart {
    fn name(&self) -> &str {
        match self.part {
            Part::Epoch => "epoch",
            Part::Seconds(1) => "seconds",
            Part::Seconds(1_000) => "milliseconds",
            Part::Seconds(_) => "microseconds",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let [value] = args.args.as_slice() else {
            return exec_err!("{} takes one argument", self.name());
        };
        let scalar = matches!(value, ColumnarValue::Scalar(_));
        let array = value.to_array(if scalar { 1 } else { args.number_rows })?;
        let result: ArrayRef = Arc::new(self.compute(&array)?);
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&result, 0)?)
        } else {
            ColumnarValue::Array(result)
        })
    }
}

impl DatePart {
    fn compute(&self, array: &ArrayRef) -> DfResult<Float64Array> {
        // Each value as nanoseconds (of a duration, of an interval's time, or since the
        // epoch) and, for intervals, its months and days.
        let values: Vec<Option<(i128, i128, i128)>> = match array.data_type() {
            DataType::Timestamp(unit, _) | DataType::Duration(unit) => {
                let per = unit_nanos(unit);
                let raw = datafusion::arrow::compute::cast(array, &DataType::Int64)?;
                raw.as_primitive::<Int64Type>()
                    .iter()
                    .map(|v| v.map(|v| (0, 0, i128::from(v) * per)))
                    .collect()
            }
            DataType::Interval(IntervalUnit::MonthDayNano) => array
                .as_primitive::<IntervalMonthDayNanoType>()
                .iter()
                .map(|v| v.map(|v| (v.months.into(), v.days.into(), v.nanoseconds.into())))
                .collect(),
            DataType::Interval(IntervalUnit::DayTime) => array
                .as_primitive::<IntervalDayTimeType>()
                .iter()
                .map(|v| v.map(|v| (0, v.days.into(), i128::from(v.milliseconds) * 1_000_000)))
                .collect(),
            DataType::Interval(IntervalUnit::YearMonth) => array
                .as_primitive::<IntervalYearMonthType>()
                .iter()
                .map(|v| v.map(|v| (v.into(), 0, 0)))
                .collect(),
            other => return exec_err!("{} of {other}", self.name()),
        };
        let timestamp = matches!(array.data_type(), DataType::Timestamp(..));
        Ok(values
            .into_iter()
            .map(|v| {
                v.map(|(months, days, nanos)| match self.part {
                    Part::Epoch => {
                        // PostgreSQL: a year is 365.25 days, a month 30 (in quarter days,
                        // to stay exact in integers).
                        let quarter_days = (months / 12) * 1461 + (months % 12) * 120 + days * 4;
                        let seconds = quarter_days * SECONDS_PER_DAY / 4;
                        // Whole seconds and the fraction apart: nanoseconds since 1970 as
                        // one double lose the fraction's last digits (.25 read .2499998).
                        let whole = seconds + nanos.div_euclid(NANOS_PER_SECOND);
                        let fraction = nanos.rem_euclid(NANOS_PER_SECOND);
                        whole as f64 + fraction as f64 / NANOS_PER_SECOND as f64
                    }
                    Part::Seconds(scale) => {
                        let minute = 60 * NANOS_PER_SECOND;
                        // A time's seconds count up within its minute; an interval's
                        // keep its sign, as in PostgreSQL.
                        let within = if timestamp {
                            nanos.rem_euclid(minute)
                        } else {
                            nanos % minute
                        };
                        let whole = within / NANOS_PER_SECOND * i128::from(scale);
                        let fraction = (within % NANOS_PER_SECOND) * i128::from(scale);
                        whole as f64 + fraction as f64 / NANOS_PER_SECOND as f64
                    }
                })
            })
            .collect())
    }
}

fn unit_nanos(unit: &TimeUnit) -> i128 {
    match unit {
        TimeUnit::Second => NANOS_PER_SECOND,
        TimeUnit::Millisecond => 1_000_000,
        TimeUnit::Microsecond => 1_000,
        TimeUnit::Nanosecond => 1,
    }
}

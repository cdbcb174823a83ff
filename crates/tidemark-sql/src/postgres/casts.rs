//! Casts to integers round, as in PostgreSQL.
//!
//! Arrow's cast truncates (`CAST(2.7 AS INTEGER)` was 2) and DataFusion's error for a value
//! out of range named Arrow's cast. PostgreSQL rounds: a `double precision` or `real` to
//! the nearest integer, ties to even (its `rint()`: `2.5::float8::int` is 2), a `numeric`
//! to the nearest, ties away from zero (`2.5::int` is 3, `(-2.5)::int` is -3), and a value
//! outside the integer's range (or NaN, or an infinity) is the error "integer out of
//! range" (or smallint, bigint). A number written in the statement (`2.5`, `-2.5`, `2.5 *
//! 3`) is a `numeric` in PostgreSQL and a double in DataFusion, so a cast of literals alone
//! rounds as `numeric` does.
//!
//! The rule keeps DataFusion's cast and rounds its input first (`RoundForCast`): the
//! cast then meets an integral value within range, and the plan's names and types are
//! those DataFusion gives. `TRY_CAST` rounds the same way and gives null out of range.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Decimal128Array, Float32Array, Float64Array,
};
use datafusion::arrow::datatypes::{DataType, Decimal128Type, Float32Type, Float64Type};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{
    exec_err, DFSchema, DataFusionError, ExprSchema, Result as DfResult, ScalarValue,
};
use datafusion::logical_expr::expr::{Cast, ScalarFunction, TryCast};
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, ExprSchemable, Operator, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};

/// A value a cast could not hold: `integer out of range`, as PostgreSQL says it (a typed
/// error, so that [`crate::SqlError::OutOfRange`] and PostgreSQL's SQLSTATE 22003 can be
/// told from other errors wherever DataFusion wraps it).
#[derive(Debug, thiserror::Error)]
#[error("{0} out of range")]
pub struct OutOfRange(&'static str);

/// Whether `expr` is a cast this rule may rewrite (without looking at its input's type).
pub fn is_candidate(expr: &Expr) -> bool {
    match expr {
        Expr::Cast(Cast { field, .. }) | Expr::TryCast(TryCast { field, .. }) => {
            integer_name(field.data_type()).is_some()
        }
        _ => false,
    }
}

/// PostgreSQL's name of an integer type, in its error "integer out of range".
fn integer_name(data_type: &DataType) -> Option<&'static str> {
    Some(match data_type {
        DataType::Int8 => "tinyint",
        DataType::Int16 => "smallint",
        DataType::Int32 => "integer",
        DataType::Int64 => "bigint",
        _ => return None,
    })
}

/// `CAST(x AS int)` of a floating-point or decimal `x` as `CAST(round(x) AS int)`.
pub fn rewrite(expr: Expr, schema: &DFSchema) -> DfResult<Transformed<Expr>> {
    let (inner, field, strict) = match &expr {
        Expr::Cast(Cast { expr, field }) => (expr, field, true),
        Expr::TryCast(TryCast { expr, field }) => (expr, field, false),
        _ => return Ok(Transformed::no(expr)),
    };
    let data_type = field.data_type();
    if integer_name(data_type).is_none() {
        return Ok(Transformed::no(expr));
    }
    // An expression whose type cannot be found here is left as DataFusion plans it.
    let Ok(input) = inner.get_type(schema as &dyn ExprSchema) else {
        return Ok(Transformed::no(expr));
    };
    let rounding = match input {
        DataType::Float16 | DataType::Float32 | DataType::Float64 if is_numeric_literal(inner) => {
            Rounding::HalfAwayFromZero
        }
        DataType::Float16 | DataType::Float32 | DataType::Float64 => Rounding::HalfEven,
        DataType::Decimal128(_, scale) if scale >= 0 => Rounding::HalfAwayFromZero,
        _ => return Ok(Transformed::no(expr)),
    };
    let round = ScalarUDF::new_from_impl(RoundForCast {
        signature: Signature::any(1, Volatility::Immutable),
        target: data_type.clone(),
        rounding,
        strict,
    });
    let rounded = Expr::ScalarFunction(ScalarFunction::new_udf(
        Arc::new(round),
        vec![inner.as_ref().clone()],
    ));
    let field = field.clone();
    Ok(Transformed::yes(if strict {
        Expr::Cast(Cast::new_from_field(Box::new(rounded), field))
    } else {
        Expr::TryCast(TryCast::new_from_field(Box::new(rounded), field))
    }))
}

/// Whether `expr` is made of numbers written in the statement alone (PostgreSQL's
/// `numeric` constants), with arithmetic. An integer in such an expression is cast to a
/// double by DataFusion's coercion; a number cast to a double in the statement
/// (`2.5::float8`) is no longer a `numeric`.
fn is_numeric_literal(expr: &Expr) -> bool {
    match expr {
        Expr::Literal(value, _) => value.data_type().is_numeric() && !value.is_null(),
        Expr::Negative(inner)
        | Expr::Alias(datafusion::logical_expr::expr::Alias { expr: inner, .. }) => {
            is_numeric_literal(inner)
        }
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            matches!(
                op,
                Operator::Plus
                    | Operator::Minus
                    | Operator::Multiply
                    | Operator::Divide
                    | Operator::Modulo
            ) && is_numeric_literal(left)
                && is_numeric_literal(right)
        }
        Expr::Cast(Cast { expr, .. }) => {
            !matches!(expr.as_ref(), Expr::Literal(v, _) if v.data_type().is_floating())
                && is_numeric_literal(expr)
        }
        _ => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Rounding {
    /// `double precision` and `real` (C's `rint()`).
    HalfEven,
    /// `numeric`.
    HalfAwayFromZero,
}

/// Its argument rounded to an integral value of its own type, which must be within
/// `target`'s range: out of it, an error (`strict`, for CAST) or null (TRY_CAST).
#[derive(Debug, PartialEq, Eq, Hash)]
struct RoundForCast {
    signature: Signature,
    target: DataType,
    rounding: Rounding,
    strict: bool,
}

impl RoundForCast {
    /// The target's range as doubles: `[-2^(n-1), 2^(n-1))`, both exact.
    fn range(&self) -> (f64, f64) {
        let bits = match self.target {
            DataType::Int8 => 8,
            DataType::Int16 => 16,
            DataType::Int32 => 32,
            _ => 64,
        };
        let half = 2f64.powi(bits - 1);
        (-half, half)
    }

    fn round(&self, value: f64) -> f64 {
        match self.rounding {
            Rounding::HalfEven => value.round_ties_even(),
            Rounding::HalfAwayFromZero => value.round(),
        }
    }

    /// `rounded` if within range; else the error, or null.
    fn checked<T>(&self, rounded: T, within: bool) -> DfResult<Option<T>> {
        if within {
            Ok(Some(rounded))
        } else if self.strict {
            let name = integer_name(&self.target).unwrap_or("integer");
            Err(DataFusionError::External(Box::new(OutOfRange(name))))
        } else {
            Ok(None)
        }
    }

    fn floats(&self, values: &Float64Array) -> DfResult<Float64Array> {
        let (low, high) = self.range();
        values
            .iter()
            .map(|v| match v {
                None => Ok(None),
                Some(v) => {
                    let r = self.round(v);
                    self.checked(r, r >= low && r < high)
                }
            })
            .collect()
    }

    fn decimals(&self, values: &Decimal128Array, scale: i8) -> DfResult<Decimal128Array> {
        let (low, high) = self.range();
        let unit = 10i128.checked_pow(u32::try_from(scale.max(0)).unwrap_or(0));
        let rounded: Decimal128Array = values
            .iter()
            .map(|v| {
                let (Some(v), Some(unit)) = (v, unit) else {
                    return Ok(None);
                };
                let (mut whole, rest) = (v / unit, v % unit);
                // Ties away from zero: half a unit or more moves away.
                if rest.unsigned_abs() * 2 >= unit.unsigned_abs() && unit > 1 {
                    whole += v.signum();
                }
                // In integers: -2^63 - 1 as a double is -2^63, inside the range.
                let within = (low as i128..high as i128).contains(&whole);
                match self.checked(whole, within)? {
                    Some(whole) => Ok(whole.checked_mul(unit)),
                    None => Ok(None),
                }
            })
            .collect::<DfResult<_>>()?;
        Ok(rounded.with_precision_and_scale(values.precision(), values.scale())?)
    }
}

impl ScalarUDFImpl for RoundForCast {
    fn name(&self) -> &str {
        match self.rounding {
            Rounding::HalfEven => "round_half_even",
            Rounding::HalfAwayFromZero => "round_half_away_from_zero",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        match arg_types {
            [one] => Ok(one.clone()),
            _ => exec_err!("{} takes one argument", self.name()),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let [value] = args.args.as_slice() else {
            return exec_err!("{} takes one argument", self.name());
        };
        let scalar = matches!(value, ColumnarValue::Scalar(_));
        let array = value.to_array(if scalar { 1 } else { args.number_rows })?;
        let rounded: ArrayRef = match array.data_type() {
            DataType::Float64 => Arc::new(self.floats(array.as_primitive::<Float64Type>())?),
            DataType::Float32 => {
                let doubles: Float64Array = array
                    .as_primitive::<Float32Type>()
                    .iter()
                    .map(|v| v.map(f64::from))
                    .collect();
                let rounded = self.floats(&doubles)?;
                // Rounded and within range, a float's value is a float's again.
                Arc::new(
                    rounded
                        .iter()
                        .map(|v| v.map(|v| v as f32))
                        .collect::<Float32Array>(),
                )
            }
            DataType::Float16 => {
                let doubles = datafusion::arrow::compute::cast(&array, &DataType::Float64)?;
                let rounded = self.floats(doubles.as_primitive::<Float64Type>())?;
                datafusion::arrow::compute::cast(&rounded, &DataType::Float16)?
            }
            DataType::Decimal128(_, scale) => {
                let scale = *scale;
                Arc::new(self.decimals(array.as_primitive::<Decimal128Type>(), scale)?)
            }
            other => return exec_err!("{} of {other}", self.name()),
        };
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&rounded, 0)?)
        } else {
            ColumnarValue::Array(rounded)
        })
    }
}

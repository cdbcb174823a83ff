//! Which of a query's filters the engine can apply itself: bounds on `tstart` become the
//! scan's time range (exactly what SQL asks), comparisons of a field with a literal become
//! engine predicates that prune blocks by their summaries (DataFusion checks those rows
//! again, so the engine only has to keep every row SQL keeps).

use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Between, BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use tidemark_core::{FieldType, Schema, Value};
use tidemark_engine::{CmpOp, Predicate, TimeRange};

use crate::convert::TSTART;

/// What a scan asks of the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Pushed {
    pub range: TimeRange,
    pub predicates: Vec<Predicate>,
}

impl Pushed {
    /// The range and predicates of `filters` (a conjunction); filters the engine cannot
    /// apply are left to DataFusion.
    pub fn from_filters(schema: &Schema, filters: &[Expr]) -> Pushed {
        let mut pushed = Pushed {
            range: TimeRange::ALL,
            predicates: Vec::new(),
        };
        for filter in filters {
            if let Some(range) = time_range(filter) {
                pushed.range = pushed.range.intersect(range);
            } else if let Some(predicate) = predicate(schema, filter) {
                pushed.predicates.push(predicate);
            }
        }
        pushed
    }
}

/// How far the engine answers `filter`: exactly for a time bound, as a superset for a field
/// predicate, not at all otherwise.
pub fn support(schema: &Schema, filter: &Expr) -> TableProviderFilterPushDown {
    if time_range(filter).is_some() {
        TableProviderFilterPushDown::Exact
    } else if predicate(schema, filter).is_some() {
        TableProviderFilterPushDown::Inexact
    } else {
        TableProviderFilterPushDown::Unsupported
    }
}

/// The range `filters` (a conjunction) keep, when every one of them is a bound on `tstart`.
pub fn time_range_of(filters: &[Expr]) -> Option<TimeRange> {
    filters.iter().try_fold(TimeRange::ALL, |range, filter| {
        Some(range.intersect(time_range(filter)?))
    })
}

/// The range of `tstart` values `filter` keeps, when it is a bound (or a conjunction or
/// BETWEEN of bounds) on `tstart` alone.
pub fn time_range(filter: &Expr) -> Option<TimeRange> {
    match filter {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) if *op == Operator::And => {
            Some(time_range(left)?.intersect(time_range(right)?))
        }
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (op, ns) = match (is_tstart(left), is_tstart(right)) {
                (true, false) => (*op, instant(right)?),
                (false, true) => (op.swap()?, instant(left)?),
                _ => return None,
            };
            match op {
                Operator::Eq => Some(TimeRange::new(ns, ns)),
                Operator::Gt => Some(
                    ns.checked_add(1)
                        .map_or(TimeRange::EMPTY, |min| TimeRange::new(min, i64::MAX)),
                ),
                Operator::GtEq => Some(TimeRange::new(ns, i64::MAX)),
                Operator::Lt => Some(
                    ns.checked_sub(1)
                        .map_or(TimeRange::EMPTY, |max| TimeRange::new(i64::MIN, max)),
                ),
                Operator::LtEq => Some(TimeRange::new(i64::MIN, ns)),
                _ => None,
            }
        }
        Expr::Between(Between {
            expr,
            negated: false,
            low,
            high,
        }) if is_tstart(expr) => Some(TimeRange::new(instant(low)?, instant(high)?)),
        _ => None,
    }
}

fn is_tstart(expr: &Expr) -> bool {
    matches!(expr, Expr::Column(c) if c.name == TSTART)
}

/// A timestamp literal in nanoseconds (DataFusion has already coerced literals compared with
/// `tstart` to its type; other units are converted, and refused if out of range).
fn instant(expr: &Expr) -> Option<i64> {
    let Expr::Literal(value, _) = expr else {
        return None;
    };
    match value {
        ScalarValue::TimestampNanosecond(Some(ns), _) => Some(*ns),
        ScalarValue::TimestampMicrosecond(Some(us), _) => us.checked_mul(1_000),
        ScalarValue::TimestampMillisecond(Some(ms), _) => ms.checked_mul(1_000_000),
        ScalarValue::TimestampSecond(Some(s), _) => s.checked_mul(1_000_000_000),
        _ => None,
    }
}

/// `filter` as an engine predicate, for fields whose comparison the engine makes exactly as
/// SQL does: integers, text and booleans. Floats are left to DataFusion (SQL's `=` on
/// floats is IEEE equality, the engine's order is total).
fn predicate(schema: &Schema, filter: &Expr) -> Option<Predicate> {
    match filter {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (field, op, literal) = match (left.as_ref(), right.as_ref()) {
                (Expr::Column(c), Expr::Literal(v, _)) => (c.name.as_str(), *op, v),
                (Expr::Literal(v, _), Expr::Column(c)) => (c.name.as_str(), op.swap()?, v),
                _ => return None,
            };
            let ty = pushable_type(schema, field)?;
            let op = match op {
                Operator::Eq => CmpOp::Eq,
                Operator::NotEq => CmpOp::Ne,
                Operator::Lt => CmpOp::Lt,
                Operator::LtEq => CmpOp::Le,
                Operator::Gt => CmpOp::Gt,
                Operator::GtEq => CmpOp::Ge,
                _ => return None,
            };
            Some(Predicate::Compare {
                field: field.to_string(),
                op,
                value: value(literal, ty)?,
            })
        }
        Expr::InList(list) if !list.negated => {
            let Expr::Column(c) = list.expr.as_ref() else {
                return None;
            };
            let ty = pushable_type(schema, &c.name)?;
            let values = list
                .list
                .iter()
                .map(|item| match item {
                    Expr::Literal(v, _) => value(v, ty),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?;
            Some(Predicate::In {
                field: c.name.clone(),
                values,
            })
        }
        Expr::IsNull(inner) => match inner.as_ref() {
            Expr::Column(c) if schema.index_of(&c.name).is_some() => Some(Predicate::IsNull {
                field: c.name.clone(),
            }),
            _ => None,
        },
        Expr::IsNotNull(inner) => match inner.as_ref() {
            Expr::Column(c) if schema.index_of(&c.name).is_some() => Some(Predicate::IsNotNull {
                field: c.name.clone(),
            }),
            _ => None,
        },
        _ => None,
    }
}

fn pushable_type(schema: &Schema, field: &str) -> Option<FieldType> {
    let ty = schema.fields()[schema.index_of(field)?].ty;
    match ty {
        FieldType::Float | FieldType::Double | FieldType::Bytes => None,
        _ => Some(ty),
    }
}

/// A literal of exactly the field's type (after DataFusion's coercion); a null literal, or
/// one of another type, is not pushed.
fn value(literal: &ScalarValue, ty: FieldType) -> Option<Value> {
    match (literal, ty) {
        (ScalarValue::Boolean(Some(v)), FieldType::Boolean) => Some(Value::Boolean(*v)),
        (ScalarValue::Int8(Some(v)), FieldType::Byte) => Some(Value::Byte(*v)),
        (ScalarValue::Int16(Some(v)), FieldType::Short) => Some(Value::Short(*v)),
        (ScalarValue::Int32(Some(v)), FieldType::Integer) => Some(Value::Integer(*v)),
        (ScalarValue::Int64(Some(v)), FieldType::Long) => Some(Value::Long(*v)),
        (
            ScalarValue::Utf8(Some(v))
            | ScalarValue::Utf8View(Some(v))
            | ScalarValue::LargeUtf8(Some(v)),
            FieldType::String,
        ) => Some(Value::String(v.clone())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use datafusion::logical_expr::{col, ident, lit};

    use super::*;

    fn ts(ns: i64) -> Expr {
        lit(ScalarValue::TimestampNanosecond(
            Some(ns),
            Some("UTC".into()),
        ))
    }

    #[test]
    fn bounds_on_tstart_become_the_time_range() {
        let schema = Schema::parse_spec("S:STRING,F:DOUBLE").unwrap();
        let filters = [
            col("tstart").gt_eq(ts(10)),
            ts(20).gt(col("tstart")),
            ident("S").eq(lit("a")),
            ident("F").gt(lit(1.0)),
        ];
        let pushed = Pushed::from_filters(&schema, &filters);
        assert_eq!(pushed.range, TimeRange::new(10, 19));
        assert_eq!(
            pushed.predicates,
            vec![Predicate::Compare {
                field: "S".into(),
                op: CmpOp::Eq,
                value: Value::String("a".into()),
            }]
        );
        assert_eq!(
            support(&schema, &filters[0]),
            TableProviderFilterPushDown::Exact
        );
        assert_eq!(
            support(&schema, &filters[2]),
            TableProviderFilterPushDown::Inexact
        );
        assert_eq!(
            support(&schema, &filters[3]),
            TableProviderFilterPushDown::Unsupported
        );
        let between = col("tstart").between(ts(3), ts(7));
        assert_eq!(time_range(&between), Some(TimeRange::new(3, 7)));
        assert_eq!(
            time_range(&col("tstart").lt(ts(i64::MIN))),
            Some(TimeRange::EMPTY)
        );
        assert_eq!(time_range(&col("tstart").not_eq(ts(3))), None);
        assert_eq!(time_range(&col("tend").gt(ts(3))), None);
    }
}

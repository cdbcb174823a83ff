//! Parameters of a statement (`$1`, `$2`, ...) bound to their values.
//!
//! A transport that takes parameters apart from the text (the PostgreSQL extended protocol)
//! hands them here as typed [`Param`]s; each placeholder of the parsed statement is replaced
//! by its value as a literal of the parameter's type, and the statement goes on as text.
//! Values are put into the syntax tree, never pasted into the text: a string parameter is a
//! string literal whatever it holds, so no value can change what the statement says.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Array, CastKind, DataType, ExactNumberInfo, Expr, Statement, Value, ValueWithSpan, VisitMut,
    VisitorMut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Span;

use crate::bounds::{parse_bounded, MAX_SQL_BYTES};
use crate::SqlError;

/// What a bound value adds besides its text, at most (`CAST(-9223372036854775808 AS BIGINT)`).
const LITERAL_OVERHEAD: usize = 40;

/// Most parameters one statement takes (PostgreSQL's own bound: a count is an `i16`).
pub const MAX_PARAMS: usize = i16::MAX as usize;

/// One parameter's value, as the client typed it.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// An exact decimal number as text (`-12.50`, `1e-3`); checked to be one.
    Decimal(String),
    /// Text; also a value whose type the client left to the server (PostgreSQL's `unknown`),
    /// which SQL then converts where it is compared or combined with a typed value.
    Text(String),
    /// Nanoseconds since the Unix epoch, UTC.
    Timestamp(i64),
    /// A list (psycopg sends a Python list as an array: `= ANY(%s)`), bound as `ARRAY[...]`,
    /// which may only be compared with ANY or ALL ([`crate::postgres::arrays`]). Its
    /// elements are not arrays.
    Array(Vec<Param>),
}

/// `sql` with each `$n` replaced by `params[n - 1]`: one statement, as text to run.
pub fn bind(sql: &str, params: &[Param]) -> Result<String, SqlError> {
    if params.len() > MAX_PARAMS {
        return Err(SqlError::TooComplex(format!(
            "{} parameters; the limit is {MAX_PARAMS}",
            params.len()
        )));
    }
    let mut statement = one_statement(sql)?;
    let mut binder = Binder {
        params,
        room: MAX_SQL_BYTES.saturating_sub(sql.len()),
    };
    if let ControlFlow::Break(error) = statement.visit(&mut binder) {
        return Err(error);
    }
    Ok(statement.to_string())
}

/// How many parameters `sql` takes: its highest `$n` (0 if none).
pub fn count(sql: &str) -> Result<usize, SqlError> {
    let mut statement = one_statement(sql)?;
    let mut counter = Counter { highest: 0 };
    if let ControlFlow::Break(error) = statement.visit(&mut counter) {
        return Err(error);
    }
    Ok(counter.highest)
}

fn one_statement(sql: &str) -> Result<Statement, SqlError> {
    let mut statements = parse_bounded(sql)?;
    match (statements.pop(), statements.is_empty()) {
        (Some(statement), true) => Ok(statement),
        (None, _) => Err(SqlError::Syntax("empty statement".into())),
        (Some(_), false) => Err(SqlError::Unsupported(format!(
            "{} statements with parameters (send one at a time)",
            statements.len() + 1
        ))),
    }
}

/// The number of a placeholder: `$3` is 3.
fn placeholder_number(expr: &Expr) -> Option<Result<usize, SqlError>> {
    let Expr::Value(ValueWithSpan {
        value: Value::Placeholder(name),
        ..
    }) = expr
    else {
        return None;
    };
    let number = name
        .strip_prefix('$')
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|&n| (1..=MAX_PARAMS).contains(&n));
    Some(number.ok_or_else(|| {
        SqlError::Unsupported(format!(
            "the placeholder {name} (parameters are $1, $2, ... up to ${MAX_PARAMS})"
        ))
    }))
}

struct Counter {
    highest: usize,
}

impl VisitorMut for Counter {
    type Break = SqlError;

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<SqlError> {
        match placeholder_number(expr) {
            Some(Ok(n)) => self.highest = self.highest.max(n),
            Some(Err(e)) => return ControlFlow::Break(e),
            None => {}
        }
        ControlFlow::Continue(())
    }
}

struct Binder<'a> {
    params: &'a [Param],
    /// Bytes the bound values may still add: a statement stays within [`MAX_SQL_BYTES`]
    /// however large its values or however often it repeats a placeholder (`$1, $1, ...`
    /// would otherwise copy one large value a quarter of a million times).
    room: usize,
}

impl VisitorMut for Binder<'_> {
    type Break = SqlError;

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<SqlError> {
        let n = match placeholder_number(expr) {
            None => return ControlFlow::Continue(()),
            Some(Ok(n)) => n,
            Some(Err(e)) => return ControlFlow::Break(e),
        };
        let Some(param) = self.params.get(n - 1) else {
            return ControlFlow::Break(SqlError::Invalid(format!(
                "the statement uses ${n} but {} parameters were given",
                self.params.len()
            )));
        };
        let size = literal_size(param);
        let Some(room) = self.room.checked_sub(size) else {
            return ControlFlow::Break(SqlError::TooComplex(format!(
                "with its parameters bound the statement exceeds {MAX_SQL_BYTES} bytes"
            )));
        };
        self.room = room;
        match literal(param) {
            Ok(literal) => *expr = literal,
            Err(e) => return ControlFlow::Break(e),
        }
        ControlFlow::Continue(())
    }
}

/// What `param`'s literal adds to the statement's text, at most.
fn literal_size(param: &Param) -> usize {
    match param {
        Param::Text(text) | Param::Decimal(text) => text.len() + LITERAL_OVERHEAD,
        Param::Array(elements) => elements
            .iter()
            .map(literal_size)
            .fold(LITERAL_OVERHEAD, usize::saturating_add),
        _ => LITERAL_OVERHEAD,
    }
}

fn value(value: Value) -> Expr {
    Expr::Value(ValueWithSpan {
        value,
        span: Span::empty(),
    })
}

fn cast(expr: Expr, data_type: DataType) -> Expr {
    Expr::Cast {
        kind: CastKind::Cast,
        expr: Box::new(expr),
        data_type,
        array: false,
        format: None,
    }
}

/// The literal a parameter stands for. Numbers keep their type (a cast where the literal's
/// own type would differ), so `$1 + 1` with an integer parameter is integer arithmetic.
fn literal(param: &Param) -> Result<Expr, SqlError> {
    Ok(match param {
        Param::Null => value(Value::Null),
        Param::Bool(b) => value(Value::Boolean(*b)),
        // Numbers as plain literals (an integer is read as a BIGINT, a number with a point
        // or an exponent as a DOUBLE): a cast around each cost three of the statement's
        // 1,000 operators, so a list of 334 numbers (`= ANY(%s)`) was "too complex". A
        // negative number is written `-5`, which SQL reads as minus 5: i64::MIN, whose
        // magnitude is no i64, keeps a cast to stay an integer.
        Param::Int(i64::MIN) => cast(
            value(Value::Number(i64::MIN.to_string(), false)),
            DataType::BigInt(None),
        ),
        Param::Int(i) => value(Value::Number(i.to_string(), false)),
        // `{:?}` always writes a point or an exponent (`1.0`, `1e300`).
        Param::Float(f) if f.is_finite() => value(Value::Number(format!("{f:?}"), false)),
        Param::Float(f) => cast(
            value(Value::SingleQuotedString(
                if f.is_nan() {
                    "NaN"
                } else if *f > 0.0 {
                    "Infinity"
                } else {
                    "-Infinity"
                }
                .into(),
            )),
            DataType::Double(ExactNumberInfo::None),
        ),
        Param::Decimal(text) => {
            if !is_decimal(text) {
                return Err(SqlError::Invalid(format!(
                    "the parameter {text:?} is not a decimal number"
                )));
            }
            value(Value::Number(text.clone(), false))
        }
        Param::Text(text) => value(Value::SingleQuotedString(text.clone())),
        Param::Array(elements) => Expr::Array(Array {
            elem: elements
                .iter()
                .map(|element| match element {
                    Param::Array(_) => Err(SqlError::Unsupported(
                        "an array of arrays as a parameter".into(),
                    )),
                    element => literal(element),
                })
                .collect::<Result<_, _>>()?,
            named: true,
        }),
        // Not CAST(n AS TIMESTAMP), which takes n as seconds.
        Param::Timestamp(ns) => Parser::new(&GenericDialect {})
            .try_with_sql(&format!("to_timestamp_nanos({ns})"))
            .and_then(|mut parser| parser.parse_expr())
            .map_err(|e| SqlError::Internal(format!("a timestamp parameter: {e}")))?,
    })
}

/// `[+-]digits[.digits][e[+-]digits]`, with digits on at least one side of the point.
fn is_decimal(text: &str) -> bool {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e.strip_prefix(['+', '-']).unwrap_or(e))),
        None => (unsigned, None),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    digits(whole)
        && digits(fraction)
        && !(whole.is_empty() && fraction.is_empty())
        && exponent.is_none_or(|e| !e.is_empty() && digits(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_become_literals_of_their_type() {
        let bound = bind(
            "SELECT * FROM t WHERE a = $1 AND b > $2 AND c = $3 AND d = $4 AND e = $5",
            &[
                Param::Text("it's".into()),
                Param::Int(-9_223_372_036_854_775_808),
                Param::Float(1.5),
                Param::Decimal("-12.50".into()),
                Param::Bool(true),
            ],
        )
        .unwrap();
        assert_eq!(
            bound,
            "SELECT * FROM t WHERE a = 'it''s' AND b > CAST(-9223372036854775808 AS BIGINT) \
             AND c = 1.5 AND d = -12.50 AND e = true"
        );
    }

    #[test]
    fn a_string_parameter_cannot_change_the_statement() {
        let evil = "x'; DROP TABLE t; --";
        let bound = bind("SELECT $1", &[Param::Text(evil.into())]).unwrap();
        let statements = parse_bounded(&bound).unwrap();
        assert_eq!(statements.len(), 1);
        assert_eq!(bound, "SELECT 'x''; DROP TABLE t; --'");
    }

    #[test]
    fn placeholders_are_counted_and_checked() {
        assert_eq!(count("SELECT $2, $1 FROM t WHERE x = $2").unwrap(), 2);
        assert_eq!(count("SELECT 1").unwrap(), 0);
        assert!(matches!(
            bind("SELECT $2", &[Param::Null]),
            Err(SqlError::Invalid(_))
        ));
        assert!(matches!(
            bind("SELECT $0", &[Param::Null]),
            Err(SqlError::Unsupported(_))
        ));
        assert!(matches!(
            bind("SELECT 1; SELECT $1", &[Param::Null]),
            Err(SqlError::Unsupported(_))
        ));
    }

    #[test]
    fn bound_values_are_bounded_however_often_they_are_used() {
        let big = Param::Text("x".repeat(MAX_SQL_BYTES / 4));
        let once = bind("SELECT $1", std::slice::from_ref(&big)).unwrap();
        assert!(once.len() > MAX_SQL_BYTES / 4);
        let err = bind("SELECT $1, $1, $1, $1, $1", &[big]).unwrap_err();
        assert!(matches!(err, SqlError::TooComplex(_)), "{err:?}");
        let many = vec!["$1"; 30_000].join(", ");
        let err = bind(&format!("SELECT {many}"), &[Param::Int(1)]).unwrap_err();
        assert!(matches!(err, SqlError::TooComplex(_)), "{err:?}");
    }

    #[test]
    fn decimals_are_checked() {
        for good in ["1", "-1.5", "+.5", "5.", "1e10", "2.5E-3"] {
            assert!(is_decimal(good), "{good}");
        }
        for bad in ["", ".", "1e", "1.2.3", "1 OR 1=1", "0x10", "--1", "1e+"] {
            assert!(!is_decimal(bad), "{bad}");
        }
        assert!(bind("SELECT $1", &[Param::Decimal("1 OR 1=1".into())]).is_err());
    }

    #[test]
    fn a_long_list_of_numbers_is_not_too_complex() {
        // psycopg's `= ANY(%s)` with a Python list: the bound statement is parsed again,
        // and a cast around each number once made 334 of them "too complex".
        for list in [
            (0..5000).map(Param::Int).collect::<Vec<_>>(),
            (0..5000)
                .map(|i| Param::Float(f64::from(i) / 4.0))
                .collect(),
        ] {
            let bound = bind("SELECT 1 WHERE 2 = ANY($1)", &[Param::Array(list)]).unwrap();
            parse_bounded(&bound).unwrap();
        }
    }

    #[test]
    fn lists_bind_as_arrays_of_their_elements() {
        assert_eq!(
            bind(
                "SELECT * FROM t WHERE a = ANY($1) AND b <> ALL($2)",
                &[
                    Param::Array(vec![Param::Int(1), Param::Null]),
                    Param::Array(vec![Param::Text("x'".into())]),
                ]
            )
            .unwrap(),
            "SELECT * FROM t WHERE a = ANY(ARRAY[1, NULL]) \
             AND b <> ALL(ARRAY['x'''])"
        );
        let nested = Param::Array(vec![Param::Array(vec![])]);
        assert!(matches!(
            bind("SELECT $1", &[nested]),
            Err(SqlError::Unsupported(_))
        ));
        let many = Param::Array(vec![Param::Text("x".repeat(1000)); MAX_SQL_BYTES / 1000]);
        assert!(matches!(
            bind("SELECT $1", &[many]),
            Err(SqlError::TooComplex(_))
        ));
    }

    #[test]
    fn special_floats_and_timestamps_bind() {
        assert_eq!(
            bind(
                "SELECT $1, $2",
                &[Param::Float(f64::NAN), Param::Timestamp(-1)]
            )
            .unwrap(),
            "SELECT CAST('NaN' AS DOUBLE), to_timestamp_nanos(-1)"
        );
    }
}

//! `x = ANY(array)` and `x <> ALL(array)`, written as PostgreSQL clients write them.
//!
//! Tidemark has no array values (DataFusion's functions and syntax that make arrays are left
//! out of its sessions, [`crate::system_catalog`]: they would be one more way to make values
//! without bound), so an array may appear only where
//! PostgreSQL's clients put one: on the right of `op ANY(...)`, `op SOME(...)` or
//! `op ALL(...)`, as `ARRAY[...]`, as PostgreSQL's array text (`'{A,B}'`, possibly cast:
//! `'{1,2}'::int[]`), or as a parameter bound to a list (psycopg's `= ANY(%s)`, which
//! [`crate::params`] binds as `ARRAY[...]`). There the array is a list known when the
//! statement is planned, and the comparison is rewritten to what DataFusion plans without
//! arrays: `x = ANY(ARRAY[a, b])` is `x IN (a, b)`, `x <> ALL(...)` is `x NOT IN (...)`,
//! and any other comparison a disjunction (ANY) or conjunction (ALL) of it with each element,
//! which have PostgreSQL's null semantics: true if one comparison is, else null if one is
//! null, else false. An empty array makes ANY false and ALL true, whatever `x` is. A
//! subquery (`x = ANY(SELECT ...)`) is left to DataFusion, which plans it.

use datafusion::sql::sqlparser::ast::{
    ArrayElemTypeDef, BinaryOperator, CastKind, DataType, Expr, Value, ValueWithSpan,
};

/// Why an array was refused, and what to write instead.
const WRITE_INSTEAD: &str = "Tidemark has no array values; an array may only be the right side \
    of = ANY(...), <> ALL(...) or another comparison with ANY or ALL (ARRAY[...], '{...}' or a \
    parameter bound to a list); elsewhere write a list, as in x IN ('A', 'B')";

/// Rewrites `expr` if it is a comparison with ANY or ALL of an array written in the
/// statement; refuses one of an array it cannot know (a column, a function's value).
pub fn any_all(expr: &mut Expr) -> Result<(), String> {
    let (left, op, right, any) = match expr {
        Expr::AnyOp {
            left,
            compare_op,
            right,
            ..
        } => (left, compare_op, right, true),
        Expr::AllOp {
            left,
            compare_op,
            right,
        } => (left, compare_op, right, false),
        _ => return Ok(()),
    };
    if matches!(unnested(right), Expr::Subquery(_)) {
        return Ok(());
    }
    let quantifier = if any { "ANY" } else { "ALL" };
    let Some(elements) = elements(right)? else {
        return Err(format!(
            "{op} {quantifier}({right}): the right side is not an array written in the \
             statement. {WRITE_INSTEAD}"
        ));
    };
    use BinaryOperator::{Eq, Gt, GtEq, Lt, LtEq, NotEq};
    if !matches!(op, Eq | NotEq | Lt | LtEq | Gt | GtEq) {
        return Err(format!(
            "{op} {quantifier}(...): only =, <>, <, <=, > and >= compare with ANY or ALL"
        ));
    }
    let left = left.as_ref().clone();
    let op = op.clone();
    *expr = if elements.is_empty() {
        // PostgreSQL: nothing to compare with makes ANY false and ALL true, even for null.
        Expr::value(Value::Boolean(!any))
    } else if (any && op == Eq) || (!any && op == NotEq) {
        Expr::InList {
            expr: Box::new(left),
            list: elements,
            negated: !any,
        }
    } else {
        let joiner = if any {
            BinaryOperator::Or
        } else {
            BinaryOperator::And
        };
        let mut terms = elements.into_iter().map(|element| Expr::BinaryOp {
            left: Box::new(left.clone()),
            op: op.clone(),
            right: Box::new(element),
        });
        let first = terms.next().expect("the array is not empty");
        Expr::Nested(Box::new(terms.fold(first, |all, term| Expr::BinaryOp {
            left: Box::new(all),
            op: joiner.clone(),
            right: Box::new(term),
        })))
    };
    Ok(())
}

/// An array found anywhere else than the right of ANY or ALL (which [`any_all`] has
/// rewritten by then): refused with what to write instead.
pub fn stray_array(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Array(_) => Some(format!("{expr}: {WRITE_INSTEAD}")),
        Expr::Cast { data_type, .. } if element_type(data_type).is_some() => {
            Some(format!("{expr}: {WRITE_INSTEAD}"))
        }
        _ => None,
    }
}

fn unnested(expr: &Expr) -> &Expr {
    match expr {
        Expr::Nested(inner) => unnested(inner),
        other => other,
    }
}

/// The element type of an array type (`INT[]`, `ARRAY<INT>`), if `data_type` is one.
fn element_type(data_type: &DataType) -> Option<Option<&DataType>> {
    match data_type {
        DataType::Array(ArrayElemTypeDef::None) => Some(None),
        DataType::Array(
            ArrayElemTypeDef::SquareBracket(inner, _)
            | ArrayElemTypeDef::AngleBracket(inner)
            | ArrayElemTypeDef::Parenthesis(inner),
        ) => Some(Some(inner)),
        _ => None,
    }
}

/// The elements of an array written in the statement, each an expression; `None` where
/// `expr` is not one.
fn elements(expr: &Expr) -> Result<Option<Vec<Expr>>, String> {
    Ok(match unnested(expr) {
        Expr::Array(array) => Some(array.elem.clone()),
        Expr::Value(ValueWithSpan {
            value: Value::SingleQuotedString(text),
            ..
        }) => Some(
            parse_array(text)?
                .into_iter()
                .map(|element| match element {
                    Some(text) => Expr::value(Value::SingleQuotedString(text)),
                    None => Expr::value(Value::Null),
                })
                .collect(),
        ),
        Expr::Cast {
            kind: CastKind::Cast | CastKind::DoubleColon,
            expr,
            data_type,
            ..
        } => {
            let Some(element_type) = element_type(data_type) else {
                return Ok(None);
            };
            let Some(elements) = elements(expr)? else {
                return Ok(None);
            };
            match element_type {
                Some(element_type) => Some(
                    elements
                        .into_iter()
                        .map(|element| Expr::Cast {
                            kind: CastKind::Cast,
                            expr: Box::new(element),
                            data_type: element_type.clone(),
                            array: false,
                            format: None,
                        })
                        .collect(),
                ),
                None => Some(elements),
            }
        }
        _ => None,
    })
}

/// The elements of PostgreSQL's array text (`{A,"B C",NULL}`), `None` for a null one.
/// Elements are separated by commas; one in double quotes keeps its text as it is (a
/// backslash escapes the next character), an unquoted one is trimmed of white space and
/// `NULL` (in any case) is null. The elements of a nested array (`{{1,2},{3,4}}`) are
/// taken in order, as ANY and ALL take them.
pub fn parse_array(text: &str) -> Result<Vec<Option<String>>, String> {
    let invalid = |why: &str| format!("malformed array literal {text:?}: {why}");
    let trimmed = text.trim();
    if !trimmed.starts_with('{') {
        return Err(invalid("an array is written {a,b,...}"));
    }
    let mut elements = Vec::new();
    let mut chars = trimmed.chars().peekable();
    let mut depth = 0usize;
    // What has been read of the current element: its text, whether any of it was quoted
    // (then it is never NULL), and whether it has ended (a quote closed, a nested array).
    let mut current = String::new();
    let mut quoted = false;
    let mut started = false;
    let mut finish = |current: &mut String, quoted: &mut bool, started: &mut bool| {
        if *started {
            let value = if *quoted {
                Some(std::mem::take(current))
            } else {
                let unquoted = current.trim().to_string();
                current.clear();
                (!unquoted.eq_ignore_ascii_case("NULL")).then_some(unquoted)
            };
            elements.push(value);
        }
        *quoted = false;
        *started = false;
    };
    let mut ended = false;
    while let Some(c) = chars.next() {
        if ended {
            if !c.is_whitespace() {
                return Err(invalid("text after the closing brace"));
            }
            continue;
        }
        match c {
            '{' if !started => depth += 1,
            '}' => {
                if depth == 0 {
                    return Err(invalid("unbalanced braces"));
                }
                finish(&mut current, &mut quoted, &mut started);
                depth -= 1;
                ended = depth == 0;
            }
            ',' if depth > 0 => finish(&mut current, &mut quoted, &mut started),
            '"' => {
                if started && !current.trim().is_empty() {
                    return Err(invalid("a quote inside an unquoted element"));
                }
                current.clear();
                started = true;
                quoted = true;
                loop {
                    match chars.next() {
                        None => return Err(invalid("an unclosed quote")),
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(escaped) => current.push(escaped),
                            None => return Err(invalid("an unclosed quote")),
                        },
                        Some(other) => current.push(other),
                    }
                }
            }
            '\\' => {
                started = true;
                match chars.next() {
                    Some(escaped) => current.push(escaped),
                    None => return Err(invalid("a backslash at the end")),
                }
            }
            // White space around an element is not part of it (inside an unquoted one it
            // is, and trimmed at its end).
            c if c.is_whitespace() && (!started || quoted) => {}
            c => {
                if quoted {
                    return Err(invalid("text after a quoted element"));
                }
                started = true;
                current.push(c);
            }
        }
    }
    if !ended {
        return Err(invalid("unbalanced braces"));
    }
    Ok(elements)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn rewritten(sql: &str) -> Result<String, String> {
        let mut expr = Parser::new(&GenericDialect {})
            .try_with_sql(sql)
            .unwrap()
            .parse_expr()
            .unwrap();
        any_all(&mut expr)?;
        Ok(expr.to_string())
    }

    #[test]
    fn comparisons_with_any_and_all_of_arrays_become_lists() {
        assert_eq!(
            rewritten("s = ANY(ARRAY['A', 'B'])").unwrap(),
            "s IN ('A', 'B')"
        );
        assert_eq!(rewritten("s = SOME('{A,B}')").unwrap(), "s IN ('A', 'B')");
        assert_eq!(rewritten("s <> ALL(ARRAY['A'])").unwrap(), "s NOT IN ('A')");
        assert_eq!(
            rewritten("n > ANY('{1,2}'::int[])").unwrap(),
            "(n > CAST('1' AS INT) OR n > CAST('2' AS INT))"
        );
        assert_eq!(
            rewritten("n <= ALL(ARRAY[1, NULL])").unwrap(),
            "(n <= 1 AND n <= NULL)"
        );
        assert_eq!(rewritten("n = ANY('{}')").unwrap(), "false");
        assert_eq!(rewritten("n <> ALL(ARRAY[])").unwrap(), "true");
        // A subquery is DataFusion's; an array that is no literal is refused.
        assert_eq!(rewritten("n = ANY(SELECT 1)").unwrap(), "n = ANY(SELECT 1)");
        let refused = rewritten("n = ANY(a)").unwrap_err();
        assert!(refused.contains("IN ("), "{refused}");
    }

    #[test]
    fn postgresql_array_text_is_read_as_postgresql_reads_it() {
        let parsed = |text: &str| parse_array(text);
        assert_eq!(
            parsed(r#"{A, "B C" ,NULL,"NULL",null,"",\,x, "a\"b"}"#).unwrap(),
            vec![
                Some("A".into()),
                Some("B C".into()),
                None,
                Some("NULL".into()),
                None,
                Some(String::new()),
                Some(",x".into()),
                Some("a\"b".into()),
            ]
        );
        assert_eq!(parsed("{}").unwrap(), Vec::<Option<String>>::new());
        assert_eq!(
            parsed("{{1,2},{3}}").unwrap(),
            ["1", "2", "3"].map(|s| Some(s.to_string())).to_vec()
        );
        for bad in [
            "",
            "A,B",
            "{A",
            "{A}}",
            "{A} x",
            r#"{"A}"#,
            r#"{x"A"}"#,
            r#"{"A"x}"#,
        ] {
            assert!(parsed(bad).is_err(), "{bad}");
        }
    }
}

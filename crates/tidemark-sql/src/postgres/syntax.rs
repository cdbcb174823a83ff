//! PostgreSQL syntax DataFusion refuses, written as what it plans; each changes only
//! statements DataFusion would refuse:
//!
//! - `x LIKE p ESCAPE 'c'` with an escape other than the backslash (SQLAlchemy lists schemas
//!   with `NOT LIKE 'pg/_' || '%' ESCAPE '/'`): a pattern of literals is written again with
//!   the backslash as its escape ([`like_escape`]);
//! - a function in FROM ([`functions_in_from`]): PostgreSQL names the column of a function
//!   returning one value by the alias of the function (Grafana's pickers read
//!   `generate_series(...) AS i, string_to_array(...) s` and then `s[i]`), and a function
//!   that is no table function (`string_to_array`) gives one row.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, Query, SetExpr, Statement, TableAlias, TableAliasColumnDef, TableFactor,
    Value, ValueWithSpan, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

/// Rewrites the LIKE patterns of `statement` whose escape is not the backslash.
pub fn like_escape(statement: &mut Statement) {
    let _ = statement.visit(&mut LikeEscape);
}

struct LikeEscape;

impl VisitorMut for LikeEscape {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let (Expr::Like {
            pattern,
            escape_char,
            ..
        }
        | Expr::ILike {
            pattern,
            escape_char,
            ..
        }) = expr
        else {
            return ControlFlow::Continue(());
        };
        let Some(escape) = escape_char.as_ref().and_then(|e| text(&e.value)) else {
            return ControlFlow::Continue(());
        };
        let mut chars = escape.chars();
        let (Some(escape), None) = (chars.next(), chars.next()) else {
            // Not one character: DataFusion's error says so.
            return ControlFlow::Continue(());
        };
        if escape == '\\' {
            return ControlFlow::Continue(());
        }
        let Some(literal) = literal_text(pattern) else {
            return ControlFlow::Continue(());
        };
        **pattern = Expr::value(Value::SingleQuotedString(with_backslash_escape(
            &literal, escape,
        )));
        *escape_char = None;
        ControlFlow::Continue(())
    }
}

/// `pattern`, whose escape is `escape`, with the backslash as its escape instead.
fn with_backslash_escape(pattern: &str, escape: char) -> String {
    let mut out = String::with_capacity(pattern.len() + 2);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c == escape {
            match chars.next() {
                // An escaped wildcard (or backslash) stays literal under the backslash.
                Some(next @ ('%' | '_' | '\\')) => {
                    out.push('\\');
                    out.push(next);
                }
                Some(next) => out.push(next),
                // A trailing escape, which PostgreSQL refuses: kept as a character.
                None => out.push(escape),
            }
        } else if c == '\\' {
            // The backslash is an ordinary character under another escape.
            out.push_str("\\\\");
        } else {
            out.push(c);
        }
    }
    out
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::SingleQuotedString(s) | Value::EscapedStringLiteral(s) => Some(s.clone()),
        _ => None,
    }
}

/// The text of a string literal, or of literals joined with `||`.
fn literal_text(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Value(ValueWithSpan { value, .. }) => text(value),
        // A parameter bound as text: `$1::VARCHAR`.
        Expr::Nested(inner) | Expr::Cast { expr: inner, .. } => literal_text(inner),
        Expr::BinaryOp {
            left,
            op: BinaryOperator::StringConcat,
            right,
        } => Some(literal_text(left)? + &literal_text(right)?),
        _ => None,
    }
}

/// Rewrites the functions in the FROM lists of `statement`: `f(...) AS a` with no column
/// names gets its one column named `a` (`AS a(a)`) when `f` is a table function
/// (`is_table_function`), and becomes `(SELECT f(...) AS a) AS a` when it is not.
pub fn functions_in_from(statement: &mut Statement, is_table_function: impl Fn(&str) -> bool) {
    let _ = statement.visit(&mut FunctionsInFrom { is_table_function });
}

struct FunctionsInFrom<F> {
    is_table_function: F,
}

impl<F: Fn(&str) -> bool> VisitorMut for FunctionsInFrom<F> {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        let TableFactor::Table {
            name,
            alias: Some(alias),
            args: Some(args),
            with_ordinality: false,
            ..
        } = factor
        else {
            return ControlFlow::Continue(());
        };
        if !alias.columns.is_empty() {
            return ControlFlow::Continue(());
        }
        let function = name.to_string();
        if (self.is_table_function)(&function.to_ascii_lowercase()) {
            // Only functions of one column (`FROM unnest(...)` is a FROM item of its own).
            if matches!(
                function.to_ascii_lowercase().as_str(),
                "generate_series" | "range"
            ) {
                alias
                    .columns
                    .push(TableAliasColumnDef::from_name(alias.name.value.clone()));
            }
            return ControlFlow::Continue(());
        }
        let call = format!(
            "(SELECT {function}({}) AS {}) AS {}",
            args.args
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            alias.name,
            alias.name
        );
        if let Some(derived) = derived_table(&call, alias) {
            *factor = derived;
        }
        ControlFlow::Continue(())
    }
}

/// `text`, `(SELECT ...) AS a`, parsed as a FROM item.
fn derived_table(text: &str, alias: &TableAlias) -> Option<TableFactor> {
    let query: Query = Parser::new(&GenericDialect {})
        .try_with_sql(&format!("SELECT * FROM {text}"))
        .ok()?
        .parse_query()
        .ok()
        .map(|q| *q)?;
    let SetExpr::Select(select) = *query.body else {
        return None;
    };
    let factor = select.from.into_iter().next()?.relation;
    matches!(&factor, TableFactor::Derived { alias: Some(a), .. } if a.name == alias.name)
        .then_some(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str, rewrite: impl Fn(&mut Statement)) -> String {
        let mut statement = Parser::parse_sql(&GenericDialect {}, sql)
            .unwrap()
            .pop()
            .unwrap();
        rewrite(&mut statement);
        statement.to_string()
    }

    #[test]
    fn other_escapes_become_the_backslash() {
        assert_eq!(with_backslash_escape("pg/_%", '/'), r"pg\_%");
        assert_eq!(with_backslash_escape(r"a\b//c/%", '/'), r"a\\b/c\%");
        assert_eq!(
            rewritten(
                "SELECT 1 WHERE n NOT LIKE 'pg/_' || '%' ESCAPE '/'",
                like_escape
            ),
            r"SELECT 1 WHERE n NOT LIKE 'pg\_%'"
        );
        // A pattern that is no literal is left for DataFusion to refuse.
        let kept = "SELECT 1 WHERE n LIKE m ESCAPE '/'";
        assert_eq!(rewritten(kept, like_escape), kept);
    }

    #[test]
    fn functions_in_from_name_their_column_or_give_a_row() {
        let sql = "SELECT s[i] FROM generate_series(1, 2) AS i, string_to_array('a,b', ',') s";
        let got = rewritten(sql, |s| {
            functions_in_from(s, |f| f == "generate_series");
        });
        assert_eq!(
            got,
            "SELECT s[i] FROM generate_series(1, 2) AS i (i), \
             (SELECT string_to_array('a,b', ',') AS s) AS s"
        );
    }
}

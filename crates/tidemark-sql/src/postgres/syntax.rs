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
//!
//! And one that DataFusion plans but answers in its own words: `information_schema.columns`
//! is read with PostgreSQL's type names, a `udt_name` and positions from 1
//! ([`information_schema_columns`]).

use std::ops::ControlFlow;
use std::sync::OnceLock;

use tidemark_core::FieldType;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, Ident, Query, SetExpr, Statement, TableAliasColumnDef, TableFactor,
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
        if let Some(derived) = derived_table(&call, &alias.name) {
            *factor = derived;
        }
        ControlFlow::Continue(())
    }
}

/// Reads `information_schema.columns` with PostgreSQL's type names, as clients that pick
/// columns by type read them: `data_type` (`double precision`, `timestamp with time zone`)
/// and `udt_name` (`float8`, `timestamptz`), which DataFusion's table lacks (Grafana's
/// builders and backend ask for both), and `ordinal_position` counted from 1 (DataFusion's
/// from 0; Grafana picks a table's first time column by it). DataFusion's table names
/// Arrow's types; the table is read through a derived table of the same name (or alias)
/// that renames them.
pub fn information_schema_columns(statement: &mut Statement) {
    let _ = statement.visit(&mut PostgresColumnTypes);
}

struct PostgresColumnTypes;

/// PostgreSQL's SQL name of the type whose own name (`udt_name`, `typname`) is `udt`, where
/// the two differ: `float8` is `double precision`.
pub(crate) fn sql_type_name(udt: &str) -> &str {
    match udt {
        "bool" => "boolean",
        "int2" => "smallint",
        "int4" => "integer",
        "int8" => "bigint",
        "float4" => "real",
        "float8" => "double precision",
        "timestamptz" => "timestamp with time zone",
        "timestamp" => "timestamp without time zone",
        other => other,
    }
}

/// Arrow's name of each type a stream's column has (as DataFusion's table prints it),
/// PostgreSQL's name of it, and its `udt_name`: the type arrow-pg gives the column on the
/// wire and in `pg_attribute` (what psql's `\d` shows), so every door names it alike.
fn column_types() -> &'static [(String, String, String)] {
    static TYPES: OnceLock<Vec<(String, String, String)>> = OnceLock::new();
    TYPES.get_or_init(|| {
        std::iter::once(crate::convert::time_type())
            .chain(FieldType::ALL.map(crate::convert::arrow_type))
            .filter_map(|arrow| {
                let udt = arrow_pg::datatypes::into_pg_type(&arrow)
                    .ok()?
                    .name()
                    .to_owned();
                let name = sql_type_name(&udt).to_owned();
                Some((arrow.to_string(), name, udt))
            })
            .collect()
    })
}

impl VisitorMut for PostgresColumnTypes {
    type Break = ();

    fn post_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        let TableFactor::Table {
            name,
            args: None,
            alias,
            ..
        } = factor
        else {
            return ControlFlow::Continue(());
        };
        let parts: Vec<String> = name
            .0
            .iter()
            .filter_map(|part| part.as_ident())
            .map(|ident| ident.value.to_ascii_lowercase())
            .collect();
        if parts != ["information_schema", "columns"] {
            return ControlFlow::Continue(());
        }
        // The table's alias, or its own name: what the statement calls it either way.
        let (alias, name) = match alias {
            Some(alias) => (alias.to_string(), alias.name.clone()),
            None => ("columns".to_owned(), Ident::new("columns")),
        };
        let case = |column: usize| {
            let arms: String = column_types()
                .iter()
                .map(|(arrow, name, udt)| {
                    let postgres = if column == 1 { name } else { udt };
                    format!(" WHEN '{}' THEN '{postgres}'", arrow.replace('\'', "''"))
                })
                .collect();
            format!("CASE data_type{arms} ELSE data_type END")
        };
        let text = format!(
            "(SELECT table_catalog, table_schema, table_name, column_name, \
             ordinal_position + 1 AS ordinal_position, \
             column_default, is_nullable, {} AS data_type, character_maximum_length, \
             character_octet_length, numeric_precision, numeric_precision_radix, numeric_scale, \
             datetime_precision, interval_type, {} AS udt_name \
             FROM information_schema.columns) AS {alias}",
            case(1),
            case(2),
        );
        if let Some(derived) = derived_table(&text, &name) {
            *factor = derived;
        }
        // After the factor's parts were visited: the derived table, which reads
        // `information_schema.columns` itself, is not visited again.
        ControlFlow::Continue(())
    }
}

/// `text`, `(SELECT ...) AS a`, parsed as a FROM item named `name`.
fn derived_table(text: &str, name: &Ident) -> Option<TableFactor> {
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
    matches!(&factor, TableFactor::Derived { alias: Some(a), .. } if a.name == *name)
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

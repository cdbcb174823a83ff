//! Names as people write them, resolved before DataFusion plans the statement.
//!
//! Stream and field names are often upper case (`SYMBOL`, `LASTTRADEPRICE`), and SQL folds
//! unquoted names to lower case: left alone, `SELECT SYMBOL` would find no column. Here an
//! unquoted name that matches a stream or a field without regard to case is replaced by the
//! quoted exact name (an exact match wins; a name two fields share is left to DataFusion,
//! which then says it is ambiguous or unknown). `ts` names `tstart` where no field is
//! called `ts`, and an unaliased `ts` in the select list keeps `ts` as its label.
//!
//! An unaliased expression in the select list is labelled as written (`max(PRICE)`), not
//! with DataFusion's qualified form (`max(ticks.PRICE)`).

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, Function, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, Interval, ObjectName,
    ObjectNamePart, Query, SelectItem, SetExpr, Statement, TableFactor, Value, ValueWithSpan,
    Visit, VisitMut, Visitor, VisitorMut,
};
use tidemark_query::time::parse_duration;

use crate::convert::TSTART;

/// The short name of `tstart`.
const TS: &str = "ts";

/// The streams and fields a statement may name.
#[derive(Debug, Default)]
pub struct Names {
    /// Every stream, by its exact name.
    streams: Vec<String>,
    /// Every column of the streams the statement reads: `tstart`, `tend` and their fields.
    columns: Vec<String>,
}

impl Names {
    pub fn new(streams: Vec<String>) -> Names {
        Names {
            streams,
            columns: Vec::new(),
        }
    }

    /// The stream `name` (as written, possibly unquoted) means.
    pub fn stream(&self, name: &Ident) -> Option<&str> {
        exact_or_folded(&self.streams, name)
    }

    pub fn add_columns(&mut self, columns: impl IntoIterator<Item = String>) {
        self.columns.extend(columns);
        self.columns.sort();
        self.columns.dedup();
    }

    fn column(&self, name: &Ident) -> Option<String> {
        if let Some(exact) = exact_or_folded(&self.columns, name) {
            return Some(exact.to_string());
        }
        (name.quote_style.is_none() && name.value.eq_ignore_ascii_case(TS))
            .then(|| TSTART.to_string())
    }
}

/// `names[i]` when it equals `name`, or (for an unquoted name) the one name equal to it
/// without regard to case.
fn exact_or_folded<'a>(names: &'a [String], name: &Ident) -> Option<&'a str> {
    if let Some(exact) = names.iter().find(|n| **n == name.value) {
        return Some(exact);
    }
    if name.quote_style.is_some() {
        return None;
    }
    let mut folded = names.iter().filter(|n| n.eq_ignore_ascii_case(&name.value));
    match (folded.next(), folded.next()) {
        (Some(one), None) => Some(one),
        _ => None,
    }
}

/// What a statement reads: the single-part table names it names (as written; not table
/// functions such as `generate_series(1, 10)`), and the names its CTEs define.
#[derive(Debug, Default)]
pub struct Relations {
    pub tables: Vec<Ident>,
    pub ctes: Vec<Ident>,
}

impl Relations {
    /// Whether `name` is one of the statement's CTEs (which SQL finds before any table).
    pub fn is_cte(&self, name: &Ident) -> bool {
        self.ctes
            .iter()
            .any(|cte| cte.value.eq_ignore_ascii_case(&name.value))
    }
}

pub fn relations(statement: &Statement) -> Relations {
    let mut found = Relations::default();
    let _ = statement.visit(&mut found);
    found
}

impl Visitor for Relations {
    type Break = ();

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        if let Some(with) = &query.with {
            self.ctes
                .extend(with.cte_tables.iter().map(|cte| cte.alias.name.clone()));
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table {
            name, args: None, ..
        } = factor
        {
            if let [ObjectNamePart::Identifier(ident)] = name.0.as_slice() {
                self.tables.push(ident.clone());
            }
        }
        ControlFlow::Continue(())
    }
}

/// Rewrites `statement`'s stream and column names to their quoted exact form, and
/// `time_bucket('1 minute', ts)` to DataFusion's `date_bin(INTERVAL '60000000000
/// nanoseconds', ts)`. The error names a bucket width that is not a duration.
pub fn resolve(statement: &mut Statement, names: &Names) -> Result<(), String> {
    match statement.visit(&mut Resolver { names }) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(message) => Err(message),
    }
}

/// `time_bucket(width, ts)` (TimescaleDB's name, with Tidemark's durations: `'1 minute'`,
/// `'5m'`) as `date_bin(INTERVAL, ts)`, which DataFusion knows and the summary rule matches.
fn time_bucket_as_date_bin(function: &mut Function) -> Result<(), String> {
    let is_time_bucket = matches!(function.name.0.as_slice(),
        [ObjectNamePart::Identifier(name)] if name.value.eq_ignore_ascii_case("time_bucket"));
    if !is_time_bucket {
        return Ok(());
    }
    function.name = ObjectName(vec![ObjectNamePart::Identifier(Ident::new("date_bin"))]);
    let FunctionArguments::List(list) = &mut function.args else {
        return Ok(());
    };
    if let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(width))) = list.args.first_mut() {
        if let Expr::Value(ValueWithSpan {
            value: Value::SingleQuotedString(text),
            ..
        }) = width
        {
            let ns = parse_duration(text).map_err(|e| format!("time_bucket: {e}"))?;
            *width = Expr::Interval(Interval {
                value: Box::new(Expr::value(Value::SingleQuotedString(format!(
                    "{ns} nanoseconds"
                )))),
                leading_field: None,
                leading_precision: None,
                last_field: None,
                fractional_seconds_precision: None,
            });
        }
    }
    Ok(())
}

struct Resolver<'a> {
    names: &'a Names,
}

fn quoted(value: &str) -> Ident {
    Ident::with_quote('"', value)
}

impl VisitorMut for Resolver<'_> {
    type Break = String;

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<String> {
        if let SetExpr::Select(select) = query.body.as_mut() {
            for item in &mut select.projection {
                let SelectItem::UnnamedExpr(expr) = &*item else {
                    continue;
                };
                // A bare column keeps its own name; anything else is labelled as written.
                let label = match expr {
                    Expr::Identifier(ident) if ident.value.eq_ignore_ascii_case(TS) => {
                        Some(ident.clone())
                    }
                    Expr::Identifier(_) | Expr::CompoundIdentifier(_) | Expr::Wildcard(_) => None,
                    other => Some(quoted(&other.to_string())),
                };
                if let Some(alias) = label {
                    let expr = expr.clone();
                    *item = SelectItem::ExprWithAlias { expr, alias };
                }
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_relation(&mut self, relation: &mut ObjectName) -> ControlFlow<String> {
        if let [ObjectNamePart::Identifier(ident)] = relation.0.as_mut_slice() {
            if let Some(stream) = self.names.stream(ident) {
                *ident = quoted(stream);
            }
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<String> {
        match expr {
            Expr::Identifier(ident) => {
                if let Some(column) = self.names.column(ident) {
                    *ident = quoted(&column);
                }
            }
            Expr::CompoundIdentifier(parts) => {
                if let [table, column] = parts.as_mut_slice() {
                    if let Some(stream) = self.names.stream(table) {
                        *table = quoted(stream);
                    }
                    if let Some(exact) = self.names.column(column) {
                        *column = quoted(&exact);
                    }
                }
            }
            Expr::Function(function) => {
                if let Err(message) = time_bucket_as_date_bin(function) {
                    return ControlFlow::Break(message);
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    use super::*;

    fn rewrite(sql: &str) -> String {
        let mut statement = Parser::parse_sql(&GenericDialect {}, sql)
            .unwrap()
            .remove(0);
        let mut names = Names::new(vec!["Ticks".into(), "other".into()]);
        names.add_columns(["tstart", "tend", "SYMBOL", "PRICE", "a", "A"].map(String::from));
        resolve(&mut statement, &names).unwrap();
        statement.to_string()
    }

    #[test]
    fn names_match_without_regard_to_case_unless_quoted_or_ambiguous() {
        assert_eq!(
            rewrite("SELECT symbol, max(price) FROM ticks WHERE ts > 0 GROUP BY symbol"),
            "SELECT \"SYMBOL\", max(\"PRICE\") AS \"max(price)\" FROM \"Ticks\" WHERE \"tstart\" > 0 GROUP BY \"SYMBOL\""
        );
        assert_eq!(
            rewrite("SELECT ts, \"symbol\", a, \"A\" FROM \"ticks\""),
            "SELECT \"tstart\" AS ts, \"symbol\", \"a\", \"A\" FROM \"ticks\""
        );
        assert_eq!(
            rewrite("SELECT t.price FROM Ticks t JOIN other o ON t.ts = o.ts"),
            "SELECT t.\"PRICE\" FROM \"Ticks\" t JOIN \"other\" o ON t.\"tstart\" = o.\"tstart\""
        );
        assert_eq!(
            rewrite("SELECT time_bucket('1 minute', ts) AS m FROM ticks GROUP BY m"),
            "SELECT date_bin(INTERVAL '60000000000 nanoseconds', \"tstart\") AS m FROM \"Ticks\" GROUP BY m"
        );
    }
}

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
    BinaryOperator, Expr, Function, FunctionArg, FunctionArgExpr, FunctionArgumentClause,
    FunctionArguments, Ident, Interval, NullTreatment, ObjectName, ObjectNamePart, OrderByExpr,
    OrderByOptions, Query, Select, SelectItem, SetExpr, Statement, TableFactor, UnaryOperator,
    Value, ValueWithSpan, Visit, VisitMut, Visitor, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use tidemark_query::time::{parse_duration, parse_instant};

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
    pub fn streams(&self) -> impl Iterator<Item = &str> {
        self.streams.iter().map(String::as_str)
    }

    pub fn stream(&self, name: &Ident) -> Option<&str> {
        exact_or_folded(&self.streams, name)
    }

    pub fn add_columns(&mut self, columns: impl IntoIterator<Item = String>) {
        self.columns.extend(columns);
        self.columns.sort();
        self.columns.dedup();
    }

    /// The column `name` means; `ts` is `tstart` only where `ts_is_tstart` (in a query that
    /// reads a stream itself, not only subqueries or CTEs, whose `ts` is theirs).
    fn column(&self, name: &Ident, ts_is_tstart: bool) -> Option<String> {
        if let Some(exact) = exact_or_folded(&self.columns, name) {
            return Some(exact.to_string());
        }
        (ts_is_tstart && name.quote_style.is_none() && name.value.eq_ignore_ascii_case(TS))
            .then(|| TSTART.to_string())
    }
}

/// `names[i]` when it equals `name`, or (for an unquoted name) the one name equal to it
/// without regard to case.
pub(crate) fn exact_or_folded<'a>(names: &'a [String], name: &Ident) -> Option<&'a str> {
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
    /// Tables named with their schema (`information_schema.tables`, `"public"."trades"`):
    /// the schema in lowercase, and the table's name as written.
    pub qualified: Vec<(String, Ident)>,
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
            match name.0.as_slice() {
                [ObjectNamePart::Identifier(ident)] => self.tables.push(ident.clone()),
                [.., ObjectNamePart::Identifier(schema), ObjectNamePart::Identifier(table)] => self
                    .qualified
                    .push((schema.value.to_ascii_lowercase(), table.clone())),
                _ => {}
            }
        }
        ControlFlow::Continue(())
    }
}

/// The columns a resolved statement names, or `None` where it may use every column of a
/// table (`*`, `t.*`, a NATURAL join or USING). A table that offers only these plans as
/// narrow as the query: W2's streams have 365 fields, and DataFusion's planning and
/// optimizing carry every column of a table until projections are pruned, which made a
/// one-field query over such a stream take three times as long.
pub fn referenced_columns(statement: &Statement) -> Option<Vec<String>> {
    let mut found = ReferencedColumns::default();
    match statement.visit(&mut found) {
        ControlFlow::Continue(()) => {
            let mut names = found.names;
            names.sort();
            names.dedup();
            Some(names)
        }
        ControlFlow::Break(()) => None,
    }
}

#[derive(Default)]
struct ReferencedColumns {
    names: Vec<String>,
}

impl Visitor for ReferencedColumns {
    /// Breaks off at anything that may use every column.
    type Break = ();

    fn pre_visit_select(&mut self, select: &Select) -> ControlFlow<()> {
        let wildcard = select.projection.iter().any(|item| {
            matches!(
                item,
                SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)
            )
        });
        // Conservative: a false match only keeps the table whole.
        let joins_by_name = select.from.iter().flat_map(|f| &f.joins).any(|join| {
            let text = join.to_string();
            text.contains("NATURAL ") || text.contains(" USING")
        });
        if wildcard || joins_by_name {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        match expr {
            Expr::Identifier(ident) => self.names.push(ident.value.clone()),
            Expr::CompoundIdentifier(parts) => {
                if let Some(last) = parts.last() {
                    self.names.push(last.value.clone());
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

/// Rewrites `statement`'s stream and column names to their quoted exact form,
/// `time_bucket('1 minute', ts)` to DataFusion's `date_bin(INTERVAL '60000000000
/// nanoseconds', ts)`, and comparisons with ANY or ALL of an array to lists
/// ([`crate::postgres::arrays`]). The error names a bucket width that is not a duration,
/// or an array Tidemark cannot take.
pub fn resolve(statement: &mut Statement, names: &Names) -> Result<(), String> {
    let mut resolver = Resolver {
        names,
        scopes: Vec::new(),
        ctes: Vec::new(),
    };
    match statement.visit(&mut resolver) {
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

/// The aggregates Tidemark's SQL had before DataFusion, kept so that queries written for it
/// still run: `first(f)` and `last(f)` (the earliest and latest non-null value by time, as
/// block summaries keep them) as `first_value(f IGNORE NULLS ORDER BY tstart)` and
/// `last_value(...)`, and `percentile(f, q)` with its other spellings as
/// `approx_percentile_cont(f, q)`.
fn former_aggregates(function: &mut Function) {
    let [ObjectNamePart::Identifier(name)] = function.name.0.as_mut_slice() else {
        return;
    };
    let lower = name.value.to_ascii_lowercase();
    match lower.as_str() {
        "percentile" | "approx_percentile" | "percentile_approx" | "quantile" => {
            *name = Ident::new("approx_percentile_cont");
        }
        "first" | "last" if function.over.is_none() => {
            let FunctionArguments::List(list) = &mut function.args else {
                return;
            };
            let has_order = list
                .clauses
                .iter()
                .any(|c| matches!(c, FunctionArgumentClause::OrderBy(_)));
            if list.args.len() != 1 || has_order {
                return;
            }
            *name = Ident::new(format!("{lower}_value"));
            list.clauses
                .push(FunctionArgumentClause::IgnoreOrRespectNulls(
                    NullTreatment::IgnoreNulls,
                ));
            list.clauses
                .push(FunctionArgumentClause::OrderBy(vec![OrderByExpr {
                    expr: Expr::Identifier(quoted(TSTART)),
                    options: OrderByOptions::default(),
                    with_fill: None,
                }]));
        }
        _ => {}
    }
}

/// Whether `expr` is the `tstart` column (resolved: `ts` has become `"tstart"` by now).
fn is_tstart(expr: &Expr) -> bool {
    match expr {
        Expr::Identifier(ident) => ident.value == TSTART,
        Expr::CompoundIdentifier(parts) => parts.last().is_some_and(|p| p.value == TSTART),
        _ => false,
    }
}

/// A time compared with `tstart`, written as Tidemark reads times everywhere (the same rule
/// as `--from` and event bodies: nanoseconds since the epoch, an RFC 3339 time, `'now-1h'`),
/// as the timestamp it means: `to_timestamp_nanos(N)`, or `now()` plus or minus an interval.
/// DataFusion alone refuses a number or `'now-1h'` there. Anything else is left alone.
fn time_literal(expr: &mut Expr) {
    let text = match expr {
        Expr::Value(ValueWithSpan {
            value: Value::Number(number, _),
            ..
        }) => number.to_string(),
        Expr::Value(ValueWithSpan {
            value: Value::SingleQuotedString(text),
            ..
        }) => text.clone(),
        // A time before 1970 is a negative number, which SQL parses as minus a number.
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr: inner,
        } => match inner.as_ref() {
            Expr::Value(ValueWithSpan {
                value: Value::Number(number, _),
                ..
            }) => format!("-{number}"),
            _ => return,
        },
        _ => return,
    };
    // Read with now = 0, `now-1h` is its offset from now.
    let Ok(ns) = parse_instant(&text, 0) else {
        return;
    };
    let sql = if text.trim_start().starts_with("now") {
        let sign = if ns < 0 { '-' } else { '+' };
        format!("now() {sign} INTERVAL '{} nanoseconds'", ns.unsigned_abs())
    } else {
        format!("to_timestamp_nanos({ns})")
    };
    if let Ok(parsed) = Parser::new(&GenericDialect {})
        .try_with_sql(&sql)
        .and_then(|mut parser| parser.parse_expr())
    {
        *expr = parsed;
    }
}

fn is_comparison(op: &BinaryOperator) -> bool {
    use BinaryOperator::{Eq, Gt, GtEq, Lt, LtEq, NotEq};
    matches!(op, Eq | NotEq | Lt | LtEq | Gt | GtEq)
}

struct Resolver<'a> {
    names: &'a Names,
    /// For each query being visited, outermost first: whether its FROM names a stream, and
    /// how many CTEs were in scope before its own.
    scopes: Vec<(bool, usize)>,
    /// The CTEs of the queries being visited (lower case), which FROM may name.
    ctes: Vec<String>,
}

impl Resolver<'_> {
    fn ts_is_tstart(&self) -> bool {
        self.scopes
            .last()
            .is_none_or(|(reads_a_stream, _)| *reads_a_stream)
    }

    /// Whether `body`'s FROM (or that of one side of a UNION...) names a stream: a table
    /// that is not a CTE (an unknown name counts: DataFusion will say it is unknown).
    fn names_a_stream(&self, body: &SetExpr) -> bool {
        match body {
            SetExpr::Select(select) => select.from.iter().any(|from| {
                std::iter::once(&from.relation)
                    .chain(from.joins.iter().map(|join| &join.relation))
                    .any(|factor| match factor {
                        TableFactor::Table {
                            name, args: None, ..
                        } => match name.0.as_slice() {
                            [ObjectNamePart::Identifier(ident)] => {
                                !self.ctes.contains(&ident.value.to_ascii_lowercase())
                            }
                            _ => true,
                        },
                        _ => false,
                    })
            }),
            SetExpr::SetOperation { left, right, .. } => {
                self.names_a_stream(left) || self.names_a_stream(right)
            }
            SetExpr::Query(query) => self.names_a_stream(&query.body),
            _ => false,
        }
    }
}

fn quoted(value: &str) -> Ident {
    Ident::with_quote('"', value)
}

impl VisitorMut for Resolver<'_> {
    type Break = String;

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<String> {
        let outer_ctes = self.ctes.len();
        if let Some(with) = &query.with {
            self.ctes.extend(
                with.cte_tables
                    .iter()
                    .map(|cte| cte.alias.name.value.to_ascii_lowercase()),
            );
        }
        let reads_a_stream = self.names_a_stream(&query.body);
        self.scopes.push((reads_a_stream, outer_ctes));
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
                    Expr::CompoundIdentifier(parts)
                        if parts
                            .last()
                            .is_some_and(|p| p.value.eq_ignore_ascii_case(TS)) =>
                    {
                        parts.last().cloned()
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

    fn post_visit_query(&mut self, _query: &mut Query) -> ControlFlow<String> {
        if let Some((_, outer_ctes)) = self.scopes.pop() {
            self.ctes.truncate(outer_ctes);
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

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<String> {
        // Before the operands are visited, so that the elements of the list it becomes are
        // resolved as any other expression.
        if let Err(message) = crate::postgres::arrays::any_all(expr) {
            return ControlFlow::Break(message);
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<String> {
        if let Some(message) = crate::postgres::arrays::stray_array(expr) {
            return ControlFlow::Break(message);
        }
        match expr {
            Expr::Identifier(ident) => {
                if let Some(column) = self.names.column(ident, self.ts_is_tstart()) {
                    *ident = quoted(&column);
                }
            }
            Expr::CompoundIdentifier(parts) => {
                if let [table, column] = parts.as_mut_slice() {
                    if let Some(stream) = self.names.stream(table) {
                        *table = quoted(stream);
                    }
                    if let Some(exact) = self.names.column(column, self.ts_is_tstart()) {
                        *column = quoted(&exact);
                    }
                }
            }
            Expr::BinaryOp { left, op, right } if is_comparison(op) => {
                if is_tstart(left) {
                    time_literal(right);
                } else if is_tstart(right) {
                    time_literal(left);
                }
            }
            Expr::Between {
                expr, low, high, ..
            } if is_tstart(expr) => {
                time_literal(low);
                time_literal(high);
            }
            Expr::Function(function) => {
                if let Err(message) = time_bucket_as_date_bin(function) {
                    return ControlFlow::Break(message);
                }
                former_aggregates(function);
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
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
    fn a_statement_names_its_columns_unless_it_may_use_them_all() {
        let columns = |sql: &str| {
            let mut statement = Parser::parse_sql(&GenericDialect {}, sql)
                .unwrap()
                .remove(0);
            let mut names = Names::new(vec!["Ticks".into()]);
            names.add_columns(["tstart", "tend", "SYMBOL", "PRICE"].map(String::from));
            resolve(&mut statement, &names).unwrap();
            referenced_columns(&statement)
        };
        assert_eq!(
            columns("SELECT max(price) FROM ticks t WHERE t.symbol = 'A' AND ts > 0"),
            Some(vec!["PRICE".into(), "SYMBOL".into(), "tstart".into()])
        );
        assert_eq!(columns("SELECT count(*) FROM ticks"), Some(vec![]));
        for whole in [
            "SELECT * FROM ticks",
            "SELECT t.* FROM ticks t",
            "SELECT price FROM (SELECT * FROM ticks)",
            "SELECT a.price FROM ticks a JOIN ticks b USING (symbol)",
            "SELECT a.price FROM ticks a NATURAL JOIN ticks b",
        ] {
            assert_eq!(columns(whole), None, "{whole}");
        }
    }

    #[test]
    fn times_compared_with_ts_follow_tidemarks_one_rule() {
        assert_eq!(
            rewrite("SELECT * FROM ticks WHERE ts >= 1500 AND 'now-1h' < ts"),
            "SELECT * FROM \"Ticks\" WHERE \"tstart\" >= to_timestamp_nanos(1500) \
             AND now() - INTERVAL '3600000000000 nanoseconds' < \"tstart\""
        );
        assert_eq!(
            rewrite("SELECT * FROM ticks WHERE ts > -1500"),
            "SELECT * FROM \"Ticks\" WHERE \"tstart\" > to_timestamp_nanos(-1500)"
        );
        assert_eq!(
            rewrite("SELECT * FROM ticks t WHERE t.ts BETWEEN '1970-01-01 00:00:01' AND 'now+1s'"),
            "SELECT * FROM \"Ticks\" t WHERE t.\"tstart\" BETWEEN to_timestamp_nanos(1000000000) \
             AND now() + INTERVAL '1000000000 nanoseconds'"
        );
        // `ts` in a query over a subquery is the subquery's `ts`.
        assert_eq!(
            rewrite("SELECT ts FROM (SELECT ts FROM ticks) WHERE ts > 5"),
            "SELECT ts AS ts FROM (SELECT \"tstart\" AS ts FROM \"Ticks\") WHERE ts > 5"
        );
        assert_eq!(
            rewrite("WITH a AS (SELECT t.ts FROM ticks t) SELECT ts FROM a"),
            "WITH a AS (SELECT t.\"tstart\" AS ts FROM \"Ticks\" t) SELECT ts AS ts FROM a"
        );
        // Not a time, or not compared with ts: left to DataFusion.
        assert_eq!(
            rewrite("SELECT * FROM ticks WHERE ts > 'yesterday' AND price > 5"),
            "SELECT * FROM \"Ticks\" WHERE \"tstart\" > 'yesterday' AND \"PRICE\" > 5"
        );
    }

    #[test]
    fn names_match_without_regard_to_case_unless_quoted_or_ambiguous() {
        assert_eq!(
            rewrite("SELECT symbol, max(price) FROM ticks WHERE ts > 0 GROUP BY symbol"),
            "SELECT \"SYMBOL\", max(\"PRICE\") AS \"max(price)\" FROM \"Ticks\" WHERE \"tstart\" > to_timestamp_nanos(0) GROUP BY \"SYMBOL\""
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
        assert_eq!(
            rewrite(
                "SELECT first(price) AS f, LAST(price) AS l, quantile(price, 0.5) AS q FROM ticks"
            ),
            "SELECT first_value(\"PRICE\" IGNORE NULLS ORDER BY \"tstart\") AS f, \
             last_value(\"PRICE\" IGNORE NULLS ORDER BY \"tstart\") AS l, \
             approx_percentile_cont(\"PRICE\", 0.5) AS q FROM \"Ticks\""
        );
    }
}

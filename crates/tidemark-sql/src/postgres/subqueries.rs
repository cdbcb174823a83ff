//! Subqueries where DataFusion does not plan them, written as what it plans. Each rewrite
//! changes only statements DataFusion would refuse, and the first and last only subqueries
//! that read no stream (rows of the catalog, of `information_schema`, of a function: small
//! sets gathered whole, lookups that need no index). Grafana's table picker and its older
//! query builder send all three shapes ([`rewrite`]):
//!
//! - `x [NOT] IN (SELECT ...)` inside an expression of a select list or of ORDER BY
//!   (DataFusion decorrelates IN only as a condition of WHERE): the set is gathered once
//!   as an array and `x` looked up in it, with PostgreSQL's three-valued answer
//!   (`in_as_lookup`);
//! - an ORDER BY item holding a subquery (DataFusion refuses subqueries in a sort): it is
//!   computed in the select list as a hidden column, sorted by, then left out
//!   (`ordered_by_hidden_columns`);
//! - `(SELECT x FROM ... ORDER BY o LIMIT 1)`, a scalar subquery of one value per row
//!   (DataFusion decorrelates only aggregated ones): `(SELECT first_value(x ORDER BY o)
//!   FROM ...)`, the same value, and NULL where no row is.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    visit_expressions, Expr, GroupByExpr, Ident, LimitClause, OrderByKind, Query, Select,
    SelectItem, SetExpr, Statement, Value, Visit, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::resolve::Relations;

/// Rewrites the subqueries of `statement` that read no stream (`is_stream` says which
/// names are streams) and that DataFusion would refuse where they stand.
pub fn rewrite(statement: &mut Statement, is_stream: impl Fn(&Ident) -> bool) {
    let statement_ctes = crate::resolve::relations(statement).ctes;
    let _ = statement.visit(&mut Subqueries {
        is_stream,
        statement_ctes,
    });
}

struct Subqueries<F> {
    is_stream: F,
    /// The CTEs of the whole statement: a subquery may read one defined around it, which
    /// may read a stream.
    statement_ctes: Vec<Ident>,
}

impl<F: Fn(&Ident) -> bool> Subqueries<F> {
    /// Whether `query` reads no stream, itself or through a CTE (one of its own is read
    /// with it; one of the statement around it is taken to read one).
    fn reads_no_stream(&self, query: &Query) -> bool {
        let mut relations = Relations::default();
        let _ = query.visit(&mut relations);
        !relations.tables.iter().any(|t| {
            !relations.is_cte(t)
                && ((self.is_stream)(t) || self.statement_ctes.iter().any(|c| same_name(c, t)))
        })
    }
}

impl<F: Fn(&Ident) -> bool> VisitorMut for Subqueries<F> {
    type Break = ();

    // After the query's own subqueries were visited: the hidden columns' query is made
    // last, and not visited again.
    fn post_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        if let SetExpr::Select(select) = query.body.as_mut() {
            for item in &mut select.projection {
                match item {
                    SelectItem::ExprWithAlias { expr, .. } => {
                        in_as_lookup(expr, &|q| self.reads_no_stream(q));
                    }
                    SelectItem::UnnamedExpr(expr) => {
                        // The column keeps the name its text gives it, not the lookup's.
                        let name = Ident::with_quote('"', expr.to_string());
                        if in_as_lookup(expr, &|q| self.reads_no_stream(q)) {
                            *item = SelectItem::ExprWithAlias {
                                expr: expr.clone(),
                                alias: name,
                            };
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(OrderByKind::Expressions(items)) = query.order_by.as_mut().map(|o| &mut o.kind)
        {
            for item in items {
                in_as_lookup(&mut item.expr, &|q| self.reads_no_stream(q));
            }
        }
        ordered_by_hidden_columns(query);
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::Subquery(query) = expr {
            if self.reads_no_stream(query) {
                first_of_ordered(query);
            }
        }
        ControlFlow::Continue(())
    }
}

/// Every `x [NOT] IN (SELECT ...)` within `expr` whose subquery `may_gather` as
/// `CASE WHEN set IS NULL THEN false WHEN x IS NULL THEN NULL WHEN array_has(set, x) THEN
/// true WHEN nulls > 0 THEN NULL ELSE false END` (negated for NOT IN): what PostgreSQL
/// answers, an empty set holding nothing and a NULL in it making "not found" unknown.
/// `set` is `(SELECT array_agg(element) FROM (...) AS s(element))`, NULL when empty, and
/// `nulls` the count of NULL elements. Not in a subquery of `expr`: its own select list and
/// ORDER BY are rewritten with it, and its WHERE is DataFusion's to plan. Returns whether
/// anything was rewritten.
fn in_as_lookup(expr: &mut Expr, may_gather: &dyn Fn(&Query) -> bool) -> bool {
    struct Lookups<'a> {
        may_gather: &'a dyn Fn(&Query) -> bool,
        /// The subqueries of `expr` being visited.
        depth: usize,
        rewritten: bool,
    }
    impl VisitorMut for Lookups<'_> {
        type Break = ();
        fn pre_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> {
            self.depth += 1;
            ControlFlow::Continue(())
        }
        fn post_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> {
            self.depth -= 1;
            ControlFlow::Continue(())
        }
        fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
            if self.depth > 0 {
                return ControlFlow::Continue(());
            }
            let Expr::InSubquery {
                expr: needle,
                subquery,
                negated,
            } = expr
            else {
                return ControlFlow::Continue(());
            };
            // The lookup writes the subquery three times: one holding subqueries of its own
            // (rewritten already, or to be) would grow threefold with each level of nesting,
            // and a statement of a few kilobytes to gigabytes.
            let nested = visit_expressions(subquery.as_ref(), |e| match e {
                Expr::Subquery(_) | Expr::InSubquery { .. } | Expr::Exists { .. } => {
                    ControlFlow::Break(())
                }
                _ => ControlFlow::Continue(()),
            });
            if nested.is_break() || !(self.may_gather)(subquery) {
                return ControlFlow::Continue(());
            }
            let set =
                format!("(SELECT array_agg(in_set.element) FROM ({subquery}) AS in_set(element))");
            let nulls = format!(
                "(SELECT count(*) - count(in_set.element) FROM ({subquery}) AS in_set(element))"
            );
            let found = format!(
                "CASE WHEN {set} IS NULL THEN false WHEN ({needle}) IS NULL THEN NULL \
                 WHEN array_has({set}, {needle}) THEN true WHEN {nulls} > 0 THEN NULL \
                 ELSE false END"
            );
            let text = if *negated {
                format!("NOT ({found})")
            } else {
                format!("({found})")
            };
            if let Ok(lookup) = parse_expr(&text) {
                *expr = lookup;
                self.rewritten = true;
            }
            ControlFlow::Continue(())
        }
    }
    let mut lookups = Lookups {
        may_gather,
        depth: 0,
        rewritten: false,
    };
    let _ = expr.visit(&mut lookups);
    lookups.rewritten
}

/// The name of the `n`th hidden column of ORDER BY.
fn hidden_column(n: usize) -> String {
    format!("__order_by_{n}")
}

/// A query `SELECT ... ORDER BY <items, one holding a subquery>` as `SELECT * EXCLUDE
/// (hidden) FROM (SELECT ..., <item> AS hidden ...) AS ordered ORDER BY hidden ...`. An
/// item that is a position (`ORDER BY 1`) or a name of the select list stays as it is
/// (the outer select list is the inner one's); every other becomes a hidden column, as it
/// may name a column the select list leaves out. Not a DISTINCT select, whose rows the
/// hidden columns would change.
fn ordered_by_hidden_columns(query: &mut Query) {
    let Some(OrderByKind::Expressions(items)) = query.order_by.as_ref().map(|o| &o.kind) else {
        return;
    };
    if !items.iter().any(|item| has_subquery(&item.expr)) {
        return;
    }
    let SetExpr::Select(select) = query.body.as_ref() else {
        return;
    };
    if select.distinct.is_some() {
        return;
    }
    let mut inner: Select = (**select).clone();
    let mut hidden = Vec::new();
    let mut items = items.clone();
    for item in &mut items {
        let is_position =
            matches!(&item.expr, Expr::Value(v) if matches!(v.value, Value::Number(..)));
        let is_output = matches!(&item.expr, Expr::Identifier(name) if names_output(&inner, name));
        if is_position || is_output {
            continue;
        }
        let name = Ident::new(hidden_column(hidden.len() + 1));
        inner.projection.push(SelectItem::ExprWithAlias {
            expr: item.expr.clone(),
            alias: name.clone(),
        });
        item.expr = Expr::Identifier(name.clone());
        hidden.push(name.to_string());
    }
    let order: Vec<String> = items.iter().map(ToString::to_string).collect();
    let text = format!(
        "SELECT * EXCLUDE ({}) FROM ({inner}) AS ordered ORDER BY {}",
        hidden.join(", "),
        order.join(", ")
    );
    let Ok(mut outer) = parse_query(&text) else {
        return;
    };
    // The query's WITH, LIMIT and OFFSET apply to the outer query as they did to it.
    outer.with = query.with.take();
    outer.limit_clause = query.limit_clause.take();
    outer.fetch = query.fetch.take();
    *query = outer;
}

/// Whether `name` is the name of an item of `select`'s list (`AS name`).
fn names_output(select: &Select, name: &Ident) -> bool {
    select.projection.iter().any(|item| match item {
        SelectItem::ExprWithAlias { alias, .. } => same_name(alias, name),
        SelectItem::UnnamedExpr(Expr::Identifier(column)) => same_name(column, name),
        _ => false,
    })
}

/// Names compared as PostgreSQL does: unquoted ones folded to lower case.
fn same_name(a: &Ident, b: &Ident) -> bool {
    let folded = |i: &Ident| match i.quote_style {
        Some(_) => i.value.clone(),
        None => i.value.to_lowercase(),
    };
    folded(a) == folded(b)
}

fn has_subquery(expr: &Expr) -> bool {
    visit_expressions(expr, |e| match e {
        Expr::Subquery(_) | Expr::InSubquery { .. } | Expr::Exists { .. } => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    })
    .is_break()
}

/// `(SELECT x FROM ... ORDER BY o LIMIT 1)` as `(SELECT first_value(x ORDER BY o) FROM
/// ...)`: one value, not aggregated, grouped, distinct or windowed, LIMIT 1 with no
/// OFFSET, and ordered by neither a position nor the value's name.
fn first_of_ordered(query: &mut Query) {
    let is_limit_one = matches!(
        &query.limit_clause,
        Some(LimitClause::LimitOffset { limit: Some(Expr::Value(v)), offset: None, limit_by })
            if limit_by.is_empty() && matches!(&v.value, Value::Number(n, _) if n == "1")
    );
    let Some(OrderByKind::Expressions(order)) = query.order_by.as_ref().map(|o| &o.kind) else {
        return;
    };
    if !is_limit_one || query.fetch.is_some() || query.with.is_some() {
        return;
    }
    let SetExpr::Select(select) = query.body.as_mut() else {
        return;
    };
    let grouped = !matches!(&select.group_by, GroupByExpr::Expressions(e, _) if e.is_empty());
    if select.projection.len() != 1
        || grouped
        || select.distinct.is_some()
        || select.having.is_some()
        || crate::system_catalog::has_aggregate(&select.projection[0])
        || has_window(&select.projection[0])
    {
        return;
    }
    let (value, alias) = match &select.projection[0] {
        SelectItem::UnnamedExpr(e) => (e, None),
        SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.clone())),
        _ => return,
    };
    // ORDER BY reads the select list's names and positions first; inside first_value it
    // would read the FROM's columns.
    let reads_select_list = order.iter().any(|item| {
        matches!(&item.expr, Expr::Value(v) if matches!(v.value, Value::Number(..)))
            || alias.as_ref().is_some_and(|alias| {
                visit_expressions(&item.expr, |e| match e {
                    Expr::Identifier(name) if same_name(name, alias) => ControlFlow::Break(()),
                    _ => ControlFlow::Continue(()),
                })
                .is_break()
            })
    });
    if reads_select_list {
        return;
    }
    let order: Vec<String> = order.iter().map(ToString::to_string).collect();
    let Ok(first) = parse_expr(&format!(
        "first_value({value} ORDER BY {})",
        order.join(", ")
    )) else {
        return;
    };
    select.projection = vec![match alias {
        Some(alias) => SelectItem::ExprWithAlias { expr: first, alias },
        None => SelectItem::UnnamedExpr(first),
    }];
    query.order_by = None;
    query.limit_clause = None;
}

fn has_window(item: &SelectItem) -> bool {
    visit_expressions(item, |e| match e {
        Expr::Function(f) if f.over.is_some() => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    })
    .is_break()
}

fn parser(text: &str) -> Result<Parser<'static>, datafusion::sql::sqlparser::parser::ParserError> {
    Parser::new(&GenericDialect {}).try_with_sql(text)
}

fn parse_expr(text: &str) -> Result<Expr, datafusion::sql::sqlparser::parser::ParserError> {
    parser(text)?.parse_expr()
}

fn parse_query(text: &str) -> Result<Query, datafusion::sql::sqlparser::parser::ParserError> {
    parser(text)?.parse_query().map(|q| *q)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str) -> String {
        let mut statement = Parser::parse_sql(&GenericDialect {}, sql)
            .unwrap()
            .pop()
            .unwrap();
        rewrite(&mut statement, |t| t.value == "trades");
        statement.to_string()
    }

    #[test]
    fn subqueries_of_streams_are_left_to_datafusion() {
        for sql in [
            "SELECT a IN (SELECT s FROM trades) FROM t ORDER BY 1",
            "SELECT (SELECT p FROM trades ORDER BY tstart DESC LIMIT 1) FROM t",
        ] {
            let unchanged = Parser::parse_sql(&GenericDialect {}, sql).unwrap()[0].to_string();
            assert_eq!(rewritten(sql), unchanged);
        }
    }

    #[test]
    fn subqueries_reading_a_cte_of_the_statement_are_left_to_datafusion() {
        let sql = "WITH s AS (SELECT symbol FROM trades) \
                   SELECT a IN (SELECT symbol FROM s) AS found FROM t";
        let unchanged = Parser::parse_sql(&GenericDialect {}, sql).unwrap()[0].to_string();
        assert_eq!(rewritten(sql), unchanged);
        // A WHERE inside a select list's subquery is DataFusion's; the name of an unnamed
        // item is its text.
        let got = rewritten(
            "SELECT (SELECT count(*) FROM u WHERE u.a IN (SELECT 1)), a IN (SELECT 2) FROM t",
        );
        assert!(
            got.starts_with("SELECT (SELECT count(*) FROM u WHERE u.a IN (SELECT 1)), (CASE"),
            "{got}"
        );
        assert!(
            got.ends_with(r#"END) AS "a IN (SELECT 2)" FROM t"#),
            "{got}"
        );
    }

    #[test]
    fn nested_in_subqueries_are_rewritten_once_not_copied_at_every_level() {
        let mut sql = "SELECT 1".to_owned();
        for level in 0..12 {
            sql = format!("SELECT a{level} IN ({sql}) FROM t");
        }
        let got = rewritten(&sql);
        // Only the innermost IN, over a subquery of no subquery, became a lookup.
        assert_eq!(got.matches("array_has").count(), 1, "{got}");
        assert!(
            got.len() < 4 * sql.len(),
            "{} bytes from {}",
            got.len(),
            sql.len()
        );
    }

    #[test]
    fn an_order_by_subquery_becomes_a_hidden_column() {
        let sql = "WITH w AS (SELECT 1) SELECT a AS x, b FROM t \
                   ORDER BY CASE WHEN a IN (SELECT 'p') THEN 0 ELSE 1 END, 1, x, c DESC LIMIT 5";
        let got = rewritten(sql);
        assert!(got.starts_with("WITH w AS (SELECT 1) SELECT * EXCLUDE (__order_by_1, __order_by_2) FROM (SELECT a AS x, b, CASE WHEN (CASE WHEN"), "{got}");
        assert!(got.ends_with("AS __order_by_1, c AS __order_by_2 FROM t) AS ordered ORDER BY __order_by_1, 1, x, __order_by_2 DESC LIMIT 5"), "{got}");
        assert!(got.contains("array_has((SELECT array_agg(in_set.element) FROM (SELECT 'p') AS in_set (element)), a)"), "{got}");
    }

    #[test]
    fn an_ordered_first_row_becomes_first_value() {
        assert_eq!(
            rewritten(
                "SELECT (SELECT c AS n FROM cols WHERE cols.t = t.t ORDER BY pos LIMIT 1) FROM t"
            ),
            "SELECT (SELECT first_value(c ORDER BY pos) AS n FROM cols WHERE cols.t = t.t) FROM t"
        );
        // Two rows, an offset, an aggregate, an order by the select list: left as they are.
        for sql in [
            "SELECT (SELECT y FROM cols ORDER BY 1 LIMIT 1) FROM t",
            "SELECT (SELECT -x AS x FROM cols ORDER BY x LIMIT 1) FROM t",
            "SELECT (SELECT c FROM cols ORDER BY pos LIMIT 2) FROM t",
            "SELECT (SELECT c FROM cols ORDER BY pos LIMIT 1 OFFSET 1) FROM t",
            "SELECT (SELECT max(c) FROM cols ORDER BY 1 LIMIT 1) FROM t",
        ] {
            let unchanged = Parser::parse_sql(&GenericDialect {}, sql).unwrap()[0].to_string();
            assert_eq!(rewritten(sql), unchanged);
        }
    }
}

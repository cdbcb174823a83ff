//! Catalog queries about what Tidemark has none of (row security policies, statistics
//! objects, publications, triggers, inheritance): psql's `\d stream` asks each, in
//! PostgreSQL syntax DataFusion does not always plan (`ARRAY(SELECT ...)`, `= ANY` of an
//! array column, correlated subqueries in the select list). Such a query's rows come from a
//! table that is empty here, so it has none, whatever its select list computes; when
//! DataFusion cannot plan it, it is answered as what it is: its columns, no rows.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, Function, Ident, JoinOperator, ObjectNamePart, Query, Select, SelectItem, SetExpr,
    Statement, TableFactor, TableWithJoins, Visit, Visitor,
};

use super::{SystemCatalog, PG_CATALOG};

/// `statement`'s answer as a statement DataFusion plans (`SELECT CAST(NULL AS TEXT) AS
/// "name", ... WHERE false`) when it provably has no rows: every row would come through a
/// `pg_catalog` table that is empty. `None` when it might have rows, or its columns cannot be
/// named without planning it (a `*`).
pub(crate) fn empty_answer(statement: &Statement, catalog: &SystemCatalog) -> Option<String> {
    let Statement::Query(query) = statement else {
        return None;
    };
    if !query_is_empty(query, catalog) {
        return None;
    }
    let columns = output_names(&query.body)?;
    if columns.is_empty() {
        // `SELECT FROM t`: nothing to name; DataFusion's refusal stands.
        return None;
    }
    // PostgreSQL lets two columns have one name; DataFusion does not: the second is
    // `name_1`, as DataFusion's own planner suggests.
    let mut seen = std::collections::HashMap::<&str, usize>::new();
    let list: Vec<String> = columns
        .iter()
        .map(|name| {
            let count = seen.entry(name.as_str()).or_default();
            let unique = match *count {
                0 => name.clone(),
                n => format!("{name}_{n}"),
            };
            *count += 1;
            format!("CAST(NULL AS TEXT) AS {}", Ident::with_quote('"', unique))
        })
        .collect();
    Some(format!("SELECT {} WHERE false", list.join(", ")))
}

fn query_is_empty(query: &Query, catalog: &SystemCatalog) -> bool {
    // A CTE could be what the FROM reads: not followed here.
    query.with.is_none() && set_is_empty(&query.body, catalog)
}

fn set_is_empty(set: &SetExpr, catalog: &SystemCatalog) -> bool {
    match set {
        SetExpr::Select(select) => select_is_empty(select, catalog),
        SetExpr::Query(query) => query_is_empty(query, catalog),
        // UNION, INTERSECT, EXCEPT: empty when both sides are (EXCEPT and INTERSECT when the
        // left is, but clients' catalog queries only unite).
        SetExpr::SetOperation { left, right, .. } => {
            set_is_empty(left, catalog) && set_is_empty(right, catalog)
        }
        _ => false,
    }
}

fn select_is_empty(select: &Select, catalog: &SystemCatalog) -> bool {
    // An aggregate (or HAVING) without GROUP BY has a row over no rows (count(*) is 0).
    let grouped = !matches!(
        &select.group_by,
        datafusion::sql::sqlparser::ast::GroupByExpr::Expressions(e, _) if e.is_empty()
    );
    if !grouped && (select.having.is_some() || select.projection.iter().any(has_aggregate)) {
        return false;
    }
    // The FROM list is a cross product: empty when any of its items is.
    select
        .from
        .iter()
        .any(|item| from_item_is_empty(item, catalog))
}

/// `relation JOIN ...` (joined left to right) is empty when no join keeps the rows of the
/// relation it brings in (RIGHT, FULL) and its first relation, or one joined inner, is.
fn from_item_is_empty(item: &TableWithJoins, catalog: &SystemCatalog) -> bool {
    let keeps_other_side = |op: &JoinOperator| {
        matches!(
            op,
            JoinOperator::Right(_)
                | JoinOperator::RightOuter(_)
                | JoinOperator::FullOuter(_)
                | JoinOperator::RightSemi(_)
                | JoinOperator::RightAnti(_)
        )
    };
    let inner = |op: &JoinOperator| {
        matches!(
            op,
            JoinOperator::Join(_) | JoinOperator::Inner(_) | JoinOperator::CrossJoin(_)
        )
    };
    if item
        .joins
        .iter()
        .any(|j| keeps_other_side(&j.join_operator))
    {
        return false;
    }
    is_empty_table(&item.relation, catalog)
        || item
            .joins
            .iter()
            .any(|j| inner(&j.join_operator) && is_empty_table(&j.relation, catalog))
}

fn is_empty_table(factor: &TableFactor, catalog: &SystemCatalog) -> bool {
    let (name, args) = match factor {
        TableFactor::Table { name, args, .. } => (name, args),
        TableFactor::Derived { subquery, .. } => return query_is_empty(subquery, catalog),
        _ => return false,
    };
    if args.is_some() {
        return false;
    }
    let parts: Vec<&str> = name
        .0
        .iter()
        .filter_map(ObjectNamePart::as_ident)
        .map(|i| i.value.as_str())
        .collect();
    match parts.as_slice() {
        [schema, table] if schema.eq_ignore_ascii_case(PG_CATALOG) => catalog.is_empty(table),
        _ => false,
    }
}

/// Whether `item` calls an aggregate (not in a subquery of its own).
pub(crate) fn has_aggregate(item: &SelectItem) -> bool {
    let expr = match item {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e,
        _ => return false,
    };
    let mut finder = AggregateFinder {
        subqueries: 0,
        found: false,
    };
    let _ = expr.visit(&mut finder);
    finder.found
}

/// Finds an aggregate call of the select list itself, not of a subquery in it (whose
/// aggregate makes one value per row, not a row).
struct AggregateFinder {
    subqueries: usize,
    found: bool,
}

impl Visitor for AggregateFinder {
    type Break = ();

    fn pre_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
        self.subqueries += 1;
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
        self.subqueries -= 1;
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
        if let (0, Expr::Function(Function { name, .. })) = (self.subqueries, e) {
            let last = name
                .0
                .last()
                .and_then(ObjectNamePart::as_ident)
                .map(|i| i.value.to_ascii_lowercase());
            let aggregates = crate::session_template(true).aggregate_functions();
            self.found |= last.is_some_and(|f| aggregates.contains_key(&f));
        }
        ControlFlow::Continue(())
    }
}

/// The names of `set`'s columns, as PostgreSQL names them: an alias, a column's name, a
/// function's name, `?column?` for anything else.
fn output_names(set: &SetExpr) -> Option<Vec<String>> {
    match set {
        SetExpr::Select(select) => select
            .projection
            .iter()
            .map(|item| match item {
                SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.clone()),
                SelectItem::UnnamedExpr(expr) => Some(expr_name(expr)),
                _ => None,
            })
            .collect(),
        SetExpr::Query(query) => output_names(&query.body),
        SetExpr::SetOperation { left, .. } => output_names(left),
        _ => None,
    }
}

fn expr_name(expr: &Expr) -> String {
    match expr {
        Expr::Identifier(ident) => ident.value.clone(),
        Expr::CompoundIdentifier(parts) => parts
            .last()
            .map_or_else(|| "?column?".into(), |i| i.value.clone()),
        Expr::Function(Function { name, .. }) => name
            .0
            .last()
            .and_then(ObjectNamePart::as_ident)
            .map_or_else(|| "?column?".into(), |i| i.value.clone()),
        Expr::Cast { expr, .. } | Expr::Nested(expr) => expr_name(expr),
        Expr::Case { .. } => "case".into(),
        _ => "?column?".into(),
    }
}

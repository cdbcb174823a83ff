//! Catalog queries as clients write them, rewritten to what DataFusion plans
//! ([`rewrite`]), and told apart from queries of streams, which keep Tidemark's reading.

use std::ops::ControlFlow;
use std::sync::OnceLock;

use datafusion::sql::sqlparser::ast::{
    Expr, Function, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, Ident,
    ObjectName, Query, SelectItem, SetExpr, Statement, TableAliasColumnDef, TableFactor, VisitMut,
    VisitorMut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion_pg_catalog::pg_catalog::PG_CATALOG_TABLES;
use datafusion_pg_catalog::sql::rules::{self, SqlStatementRewriteRule};

use super::{empty, PG_CATALOG};
use crate::resolve::Relations;

/// `statement` with the PostgreSQL syntax that clients' catalog queries use rewritten to
/// what DataFusion plans. In every statement, only what reads nothing but the catalog:
/// `OPERATOR(pg_catalog.~)` as `~`, `pg_catalog.f()` as `f()`, `version()`'s column name.
/// In a catalog query (one naming a `pg_catalog` table: [`names_catalog`]) the crate's other
/// rules too, whose changes would be wrong answers in a query of streams: unqualified
/// `pg_class` as `pg_catalog.pg_class`, `'t'::regclass` as the oid's lookup, `COLLATE`
/// left out, a duplicated column beside `t.*` aliased, an unqualified name in WHERE bound
/// to the `t.*` table, `= ANY(column)` as `array_contains`, a correlated subquery of the
/// select list as NULL (DataFusion does not plan them there); then `ARRAY(SELECT ...)` and
/// scalar subqueries in aggregates ([`ArraySubquery`], [`OneValueSubquery`]), and
/// `unnest(...) AS x` with its column named `x` ([`Unnests`]). Arrays written
/// in the statement (`= ANY('{r,v}')`) are compared as in every query
/// ([`crate::postgres::arrays`]). Returns whether it is a catalog query.
pub(crate) fn rewrite(statement: Statement, is_stream: impl Fn(&str) -> bool) -> (Statement, bool) {
    static RULES: OnceLock<Rules> = OnceLock::new();
    let rules = RULES.get_or_init(Rules::new);
    let mut statement = rules
        .every_statement
        .iter()
        .fold(statement, |s, rule| rule.rewrite(s));
    // `current_catalog`, `current_schema`, `user` without parentheses (pgjdbc asks `select
    // current_catalog`) are PostgreSQL's functions where no stream's field could be meant.
    let relations = crate::resolve::relations(&statement);
    let reads_stream = relations
        .tables
        .iter()
        .any(|t| !relations.is_cte(t) && is_stream(&t.value));
    if !reads_stream {
        statement = rules.special_registers.rewrite(statement);
        let _ = statement.visit(&mut UserAsSessionUser);
    }
    // Neither rule above changes what the statement reads.
    if !names_catalog(&relations, &is_stream) {
        return (statement, false);
    }
    let _ = statement.visit(&mut WrittenArrays);
    let _ = statement.visit(&mut Unnests);
    let mut statement = rules
        .catalog_statements
        .iter()
        .fold(statement, |s, rule| rule.rewrite(s));
    // After the rule that drops correlated subqueries from select lists: this one's
    // subquery is an aggregate, which DataFusion decorrelates.
    let _ = statement.visit(&mut ArraySubquery);
    let _ = statement.visit(&mut OneValueSubquery::default());
    (statement, true)
}

/// Whether `statement` names a table of `pg_catalog`: qualified, or unqualified where no
/// stream has its name (a stream named `pg_tables` is read as the stream).
fn names_catalog(relations: &Relations, is_stream: impl Fn(&str) -> bool) -> bool {
    relations
        .qualified
        .iter()
        .any(|(schema, _)| schema.eq_ignore_ascii_case(PG_CATALOG))
        || relations.tables.iter().any(|table| {
            !relations.is_cte(table)
                && !is_stream(&table.value)
                && PG_CATALOG_TABLES.contains(&table.value.to_ascii_lowercase().as_str())
        })
}

/// `x = ANY('{r,v}')`, `x <> ALL(ARRAY[...])`: compared with each element, as in queries
/// of streams; a comparison with an array column is left to the crate's rule.
/// `user`, PostgreSQL's `current_user` (Grafana's pickers compare schemas with it), which
/// the crate's rule leaves: as `session_user`, as it writes `current_user`.
struct UserAsSessionUser;

impl VisitorMut for UserAsSessionUser {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let is_user = |name: &ObjectName| {
            matches!(name.0.as_slice(), [part] if part.as_ident().is_some_and(|i| {
                i.quote_style.is_none() && i.value.eq_ignore_ascii_case("user")
            }))
        };
        match expr {
            Expr::Identifier(ident)
                if ident.quote_style.is_none() && ident.value.eq_ignore_ascii_case("user") =>
            {
                *expr = session_user();
            }
            Expr::Function(function)
                if matches!(function.args, FunctionArguments::None) && is_user(&function.name) =>
            {
                *expr = session_user();
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

/// `session_user`, as sqlparser reads it (a function without parentheses).
fn session_user() -> Expr {
    Expr::Function(Function {
        name: ObjectName::from(vec![Ident::new("session_user")]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::None,
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}

struct WrittenArrays;

impl VisitorMut for WrittenArrays {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        // An error is an array not written in the statement: the crate's rule's.
        let _ = crate::postgres::arrays::any_all(expr);
        ControlFlow::Continue(())
    }
}

/// `unnest(a) AS x` (of one array) as `unnest(a) AS x(x)`: PostgreSQL names the one column of a function in
/// FROM by the alias when no column list follows it (psql's `\d+` selects `'toast.' || x
/// FROM unnest(tc.reloptions) x`); DataFusion names it after the call. And `unnest` of an
/// array column Tidemark keeps NULL ([`super::is_null_array`]) as the empty table it is,
/// which DataFusion plans where an `unnest` of a column of the outer query (psql's, in an
/// `ARRAY(SELECT ...)` of the select list) it does not.
struct Unnests;

impl VisitorMut for Unnests {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        let (alias, argument) = match factor {
            TableFactor::Table {
                name,
                args: Some(args),
                alias: Some(alias),
                with_ordinality: false,
                ..
            } if name
                .0
                .last()
                .and_then(|part| part.as_ident())
                .is_some_and(|i| i.value.eq_ignore_ascii_case("unnest")) =>
            {
                match args.args.as_slice() {
                    [FunctionArg::Unnamed(FunctionArgExpr::Expr(e))] => (alias, e),
                    _ => return ControlFlow::Continue(()),
                }
            }
            TableFactor::UNNEST {
                alias: Some(alias),
                array_exprs,
                with_offset: false,
                with_ordinality: false,
                ..
            } if array_exprs.len() == 1 => (alias, &array_exprs[0]),
            _ => return ControlFlow::Continue(()),
        };
        if alias.columns.is_empty() {
            alias.columns = vec![TableAliasColumnDef::from_name(alias.name.value.clone())];
        }
        let column = match argument {
            Expr::Identifier(ident) => Some(ident),
            Expr::CompoundIdentifier(parts) => parts.last(),
            _ => None,
        };
        if column.is_some_and(|c| super::is_null_array(&c.value)) {
            let alias = alias.clone();
            if let Ok(none) = Parser::new(&GenericDialect {})
                .try_with_sql("SELECT CAST(NULL AS TEXT) WHERE false")
                .and_then(|mut parser| parser.parse_query())
            {
                *factor = TableFactor::Derived {
                    lateral: false,
                    subquery: none,
                    alias: Some(alias),
                    sample: None,
                };
            }
        }
        ControlFlow::Continue(())
    }
}

/// A scalar subquery of a catalog query, `(SELECT x FROM pg_type WHERE oid = a.atttypid)`,
/// as `(SELECT first_value(x) FROM ...)`: DataFusion decorrelates only aggregated ones, and
/// a catalog's rows looked up by oid are one at most (where PostgreSQL would refuse more
/// than one, this takes the first). Not one that orders or limits (its first row is its
/// own), nor the subquery of `x op ANY(SELECT ...)`, which is a set.
#[derive(Default)]
struct OneValueSubquery {
    /// The subqueries of ANY and ALL being visited (by address: the visitor is handed
    /// their expressions again).
    sets: Vec<*const Expr>,
}

impl VisitorMut for OneValueSubquery {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::AnyOp { right, .. } | Expr::AllOp { right, .. } = expr {
            self.sets.push(std::ptr::from_ref(right.as_ref()));
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::AnyOp { .. } | Expr::AllOp { .. } = expr {
            self.sets.pop();
            return ControlFlow::Continue(());
        }
        if self.sets.contains(&std::ptr::from_ref(&*expr)) {
            return ControlFlow::Continue(());
        }
        let Expr::Subquery(query) = expr else {
            return ControlFlow::Continue(());
        };
        if query.order_by.is_some() || query.limit_clause.is_some() || query.fetch.is_some() {
            return ControlFlow::Continue(());
        }
        let SetExpr::Select(select) = query.body.as_mut() else {
            return ControlFlow::Continue(());
        };
        let grouped = !matches!(&select.group_by, GroupByExpr::Expressions(e, _) if e.is_empty());
        if select.projection.len() != 1
            || grouped
            || select.distinct.is_some()
            || select.having.is_some()
            || empty::has_aggregate(&select.projection[0])
        {
            return ControlFlow::Continue(());
        }
        let (value, alias) = match &select.projection[0] {
            SelectItem::UnnamedExpr(e) => (e, None),
            SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.clone())),
            _ => return ControlFlow::Continue(()),
        };
        let Ok(first) = parse_expr(&format!("first_value({value})")) else {
            return ControlFlow::Continue(());
        };
        select.projection = vec![match alias {
            Some(alias) => SelectItem::ExprWithAlias { expr: first, alias },
            None => SelectItem::UnnamedExpr(first),
        }];
        ControlFlow::Continue(())
    }
}

/// `ARRAY(SELECT x FROM ... ORDER BY o)` (psql's `\du` lists a role's groups so) as the
/// scalar subquery `(SELECT array_agg(x ORDER BY o) FROM ...)`, or, for a subquery that
/// groups, limits or is a union, `(SELECT array_agg(element) FROM (...) AS array_subquery
/// (element))` (DataFusion does not decorrelate that form as well).
struct ArraySubquery;

impl ArraySubquery {
    fn aggregated(query: &Query) -> String {
        let simple = match query.body.as_ref() {
            SetExpr::Select(select) => {
                select.projection.len() == 1
                    && select.distinct.is_none()
                    && matches!(&select.group_by, GroupByExpr::Expressions(e, _) if e.is_empty())
                    && select.having.is_none()
            }
            _ => false,
        };
        if !simple || query.limit_clause.is_some() || query.fetch.is_some() || query.with.is_some()
        {
            return format!(
                "(SELECT array_agg(array_subquery.element) FROM ({query}) AS array_subquery(element))"
            );
        }
        let mut query = query.clone();
        let order = query
            .order_by
            .take()
            .map(|o| format!(" {o}"))
            .unwrap_or_default();
        if let SetExpr::Select(select) = query.body.as_mut() {
            let element = match &select.projection[0] {
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                    e.to_string()
                }
                other => other.to_string(),
            };
            if let Ok(aggregate) = parse_expr(&format!("array_agg({element}{order})")) {
                select.projection = vec![SelectItem::UnnamedExpr(aggregate)];
            }
        }
        format!("({query})")
    }
}

fn parse_expr(text: &str) -> Result<Expr, datafusion::sql::sqlparser::parser::ParserError> {
    Parser::new(&GenericDialect {})
        .try_with_sql(text)
        .and_then(|mut parser| parser.parse_expr())
}

impl VisitorMut for ArraySubquery {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let Expr::Function(function) = expr else {
            return ControlFlow::Continue(());
        };
        let FunctionArguments::Subquery(query) = &function.args else {
            return ControlFlow::Continue(());
        };
        if !function.name.to_string().eq_ignore_ascii_case("array") {
            return ControlFlow::Continue(());
        }
        // Printed by sqlparser, it parses again; if it did not, DataFusion says what it
        // cannot plan.
        if let Ok(aggregated) = parse_expr(&ArraySubquery::aggregated(query)) {
            *expr = aggregated;
        }
        ControlFlow::Continue(())
    }
}

/// The crate's rewrite rules (`PostgresCompatibilityParser`'s, in its order), without its
/// token substitutions of whole known queries.
struct Rules {
    every_statement: Vec<Box<dyn SqlStatementRewriteRule>>,
    special_registers: rules::CurrentUserVariableToSessionUserFunctionCall,
    catalog_statements: Vec<Box<dyn SqlStatementRewriteRule>>,
}

impl Rules {
    fn new() -> Rules {
        Rules {
            every_statement: vec![
                Box::new(rules::StripCallableQualifier),
                Box::new(rules::RewritePgCatalogOperator),
                Box::new(rules::FixVersionColumnName),
            ],
            special_registers: rules::CurrentUserVariableToSessionUserFunctionCall,
            // Not FixArrayLiteral: it splits '{...}' naively (quotes, NULL, commas), where
            // WrittenArrays reads them as PostgreSQL does.
            catalog_statements: vec![
                Box::new(rules::AliasDuplicatedProjectionRewrite),
                Box::new(rules::ResolveUnqualifiedIdentifier),
                Box::new(rules::RewriteArrayAnyAllOperation),
                Box::new(rules::PrependUnqualifiedPgTableName),
                Box::new(rules::StripCollate),
                Box::new(rules::RewriteRegCastToSubquery::new()),
                Box::new(rules::RemoveSubqueryFromProjection),
            ],
        }
    }
}

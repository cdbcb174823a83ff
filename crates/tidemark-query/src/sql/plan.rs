//! From SQL text to a [`Plan`]: which stream, which time range, which filters, and either
//! rows or aggregates to produce.

use sqlparser::ast::{
    BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr,
    LimitClause, ObjectName, ObjectNamePart, OrderByKind, OrderBySort, Query, Select, SelectItem,
    SetExpr, Statement, TableFactor, UnaryOperator, Value as SqlValue,
};
use tidemark_core::{AggFn, FieldType, Schema, Value};
use tidemark_engine::{Aggregation, CmpOp, Predicate, TimeRange};

use super::SqlError;
use crate::spec::literal;
use crate::time::{parse_duration, parse_instant, parse_rfc3339};

/// What a query asks for, in engine terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub stream: String,
    pub range: TimeRange,
    pub filter: Vec<Predicate>,
    pub shape: Shape,
    /// `ORDER BY ts DESC` (or by the bucket, descending).
    pub descending: bool,
    pub limit: Option<usize>,
    /// Output column names, in order.
    pub labels: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    Rows(Vec<RowOutput>),
    Aggregate {
        bucket_ns: Option<i64>,
        group_fields: Vec<String>,
        outputs: Vec<AggOutput>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum RowOutput {
    Tstart,
    Tend,
    Field(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum AggOutput {
    /// The start of the event's `time_bucket`.
    Bucket,
    /// A GROUP BY field's value.
    Group(String),
    Agg(Aggregation),
    /// An approximate percentile (`q` in 0..=1) of a numeric field.
    Percentile {
        field: String,
        q: f64,
    },
}

impl Shape {
    /// Whether the engine's block summaries can answer it (no per-event work).
    pub fn uses_summaries(&self, filter: &[Predicate]) -> bool {
        match self {
            Shape::Rows(_) => false,
            Shape::Aggregate {
                group_fields,
                outputs,
                ..
            } => {
                filter.is_empty()
                    && group_fields.is_empty()
                    && !outputs
                        .iter()
                        .any(|o| matches!(o, AggOutput::Percentile { .. }))
            }
        }
    }
}

fn unsupported(what: impl Into<String>) -> SqlError {
    SqlError::Unsupported(what.into())
}

fn invalid(what: impl Into<String>) -> SqlError {
    SqlError::Invalid(what.into())
}

/// Parses one SELECT statement and refuses every clause the subset does not have.
pub fn parse(sql: &str) -> Result<(Select, Query), SqlError> {
    let mut statements = super::bounds::parse_bounded(sql)?;
    if statements.len() != 1 {
        return Err(unsupported(format!(
            "{} statements (send exactly one SELECT)",
            statements.len()
        )));
    }
    let query = match statements.pop() {
        Some(Statement::Query(query)) => *query,
        Some(other) => {
            let text = other.to_string();
            let verb = text.split_whitespace().next().unwrap_or("statement");
            return Err(unsupported(format!("{verb} statements (only SELECT is)")));
        }
        None => return Err(SqlError::Syntax("empty query".into())),
    };
    if query.with.is_some() {
        return Err(unsupported("WITH"));
    }
    if query.fetch.is_some() || !query.locks.is_empty() || query.for_clause.is_some() {
        return Err(unsupported("FETCH / FOR clauses"));
    }
    if !query.pipe_operators.is_empty() || query.settings.is_some() || query.format_clause.is_some()
    {
        return Err(unsupported("pipe operators, SETTINGS and FORMAT"));
    }
    let select = match query.body.as_ref() {
        SetExpr::Select(select) => (**select).clone(),
        SetExpr::SetOperation { op, .. } => return Err(unsupported(format!("{op}"))),
        other => return Err(unsupported(format!("query body {other}"))),
    };
    if select.distinct.is_some() {
        return Err(unsupported("DISTINCT"));
    }
    if select.top.is_some() {
        return Err(unsupported("TOP"));
    }
    if select.having.is_some() {
        return Err(unsupported("HAVING"));
    }
    if select.into.is_some() {
        return Err(unsupported("SELECT INTO"));
    }
    if select.qualify.is_some() || !select.named_window.is_empty() {
        return Err(unsupported("window functions"));
    }
    if !select.lateral_views.is_empty()
        || select.prewhere.is_some()
        || !select.cluster_by.is_empty()
        || !select.distribute_by.is_empty()
        || !select.sort_by.is_empty()
        || !select.connect_by.is_empty()
    {
        return Err(unsupported("dialect-specific SELECT clauses"));
    }
    Ok((select, query))
}

/// The one stream a query reads.
pub fn stream_name((select, _): &(Select, Query)) -> Result<String, SqlError> {
    let [table] = select.from.as_slice() else {
        return Err(if select.from.is_empty() {
            invalid("FROM names no stream")
        } else {
            unsupported("more than one stream in FROM (joins)")
        });
    };
    if !table.joins.is_empty() {
        return Err(unsupported("JOIN"));
    }
    match &table.relation {
        TableFactor::Table {
            name, args: None, ..
        } => single_name(name),
        TableFactor::Derived { .. } => Err(unsupported("subqueries")),
        other => Err(unsupported(format!("FROM {other}"))),
    }
}

fn single_name(name: &ObjectName) -> Result<String, SqlError> {
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(ident)] => Ok(ident.value.clone()),
        _ => Err(unsupported(format!("qualified names ({name})"))),
    }
}

/// Builds the plan of a parsed query against the stream's schema.
pub fn plan(
    (select, query): &(Select, Query),
    stream: String,
    schema: &Schema,
    now_ns: i64,
) -> Result<Plan, SqlError> {
    let scope = Scope { schema, now_ns };
    let mut range = TimeRange::ALL;
    let mut filter = Vec::new();
    if let Some(selection) = &select.selection {
        scope.conditions(selection, &mut range, &mut filter)?;
    }

    // Items and their labels; aggregates are recognised by function name.
    let mut items = Vec::new();
    for item in &select.projection {
        match item {
            SelectItem::UnnamedExpr(expr) => items.push((expr.clone(), expr.to_string())),
            SelectItem::ExprWithAlias { expr, alias } => {
                items.push((expr.clone(), alias.value.clone()))
            }
            SelectItem::Wildcard(_) => {
                items.push((Expr::Identifier("tstart".into()), "tstart".into()));
                for field in schema.fields() {
                    items.push((
                        Expr::Identifier(field.name.as_str().into()),
                        field.name.clone(),
                    ));
                }
            }
            other => return Err(unsupported(format!("select item {other}"))),
        }
    }
    let group_exprs = match &select.group_by {
        GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => exprs.clone(),
        GroupByExpr::Expressions(..) => return Err(unsupported("GROUP BY modifiers")),
        GroupByExpr::All(_) => return Err(unsupported("GROUP BY ALL")),
    };
    let aggregating = !group_exprs.is_empty() || items.iter().any(|(e, _)| scope.is_aggregate(e));

    let mut bucket_ns = None;
    let mut group_fields = Vec::new();
    for expr in &group_exprs {
        // GROUP BY may name a select item by alias or position.
        let resolved = match expr {
            Expr::Identifier(ident) if schema.index_of(&ident.value).is_none() => items
                .iter()
                .find(|(_, label)| label.eq_ignore_ascii_case(&ident.value))
                .map(|(e, _)| e.clone())
                .ok_or_else(|| invalid(format!("GROUP BY {ident}: no such field or alias")))?,
            Expr::Value(v) => match &v.value {
                SqlValue::Number(n, _) => {
                    let position: usize =
                        n.parse().map_err(|_| invalid(format!("GROUP BY {n}")))?;
                    items
                        .get(position.wrapping_sub(1))
                        .map(|(e, _)| e.clone())
                        .ok_or_else(|| invalid(format!("GROUP BY {n}: no such select item")))?
                }
                other => return Err(unsupported(format!("GROUP BY {other}"))),
            },
            other => other.clone(),
        };
        if let Some(width) = scope.time_bucket(&resolved)? {
            if bucket_ns.replace(width).is_some_and(|w| w != width) {
                return Err(unsupported("two different time_bucket widths"));
            }
        } else {
            group_fields.push(scope.field(&resolved)?);
        }
    }

    let mut labels = Vec::new();
    let shape = if aggregating {
        let mut outputs = Vec::new();
        for (expr, label) in &items {
            let output = if let Some(width) = scope.time_bucket(expr)? {
                if bucket_ns != Some(width) {
                    return Err(invalid(format!("{expr} must also be in GROUP BY")));
                }
                AggOutput::Bucket
            } else if let Some(output) = scope.aggregate(expr)? {
                output
            } else {
                let field = scope.field(expr)?;
                if !group_fields.iter().any(|g| g.eq_ignore_ascii_case(&field)) {
                    return Err(invalid(format!(
                        "{expr} is neither aggregated nor in GROUP BY"
                    )));
                }
                AggOutput::Group(field)
            };
            outputs.push(output);
            labels.push(label.clone());
        }
        Shape::Aggregate {
            bucket_ns,
            group_fields,
            outputs,
        }
    } else {
        let mut outputs = Vec::new();
        for (expr, label) in &items {
            outputs.push(scope.row_output(expr)?);
            labels.push(label.clone());
        }
        Shape::Rows(outputs)
    };

    let mut descending = false;
    if let Some(order_by) = &query.order_by {
        let OrderByKind::Expressions(exprs) = &order_by.kind else {
            return Err(unsupported("ORDER BY ALL"));
        };
        match exprs.as_slice() {
            [] => {}
            [order] => {
                let by_time = match &order.expr {
                    Expr::Identifier(ident) if is_time(&ident.value) => true,
                    Expr::Value(v) => match &v.value {
                        // ORDER BY 1: the first select item.
                        SqlValue::Number(n, _) => n
                            .parse::<usize>()
                            .ok()
                            .and_then(|p| items.get(p.wrapping_sub(1)))
                            .is_some_and(|(e, _)| {
                                matches!(e, Expr::Identifier(i) if is_time(&i.value))
                                    || matches!(scope.time_bucket(e), Ok(Some(_)))
                            }),
                        _ => false,
                    },
                    Expr::Identifier(ident) => items.iter().any(|(e, label)| {
                        label.eq_ignore_ascii_case(&ident.value)
                            && matches!(scope.time_bucket(e), Ok(Some(_)))
                    }),
                    expr => matches!(scope.time_bucket(expr), Ok(Some(_))),
                };
                if !by_time {
                    return Err(unsupported(format!(
                        "ORDER BY {} (only by ts or the time bucket)",
                        order.expr
                    )));
                }
                descending = match order.options.sort {
                    None | Some(OrderBySort::Asc) => false,
                    Some(OrderBySort::Desc) => true,
                    Some(OrderBySort::Using(_)) => return Err(unsupported("ORDER BY USING")),
                };
            }
            _ => return Err(unsupported("ORDER BY more than one key")),
        }
    }
    let limit = match &query.limit_clause {
        None => None,
        Some(LimitClause::LimitOffset {
            limit,
            offset: None,
            limit_by,
        }) if limit_by.is_empty() => match limit {
            None => None,
            Some(Expr::Value(v)) => match &v.value {
                SqlValue::Number(n, _) => Some(
                    n.parse()
                        .map_err(|_| invalid(format!("LIMIT {n} is not a row count")))?,
                ),
                other => return Err(invalid(format!("LIMIT {other} is not a row count"))),
            },
            Some(other) => return Err(invalid(format!("LIMIT {other} is not a row count"))),
        },
        Some(_) => return Err(unsupported("OFFSET")),
    };
    Ok(Plan {
        stream,
        range,
        filter,
        shape,
        descending,
        limit,
        labels,
    })
}

fn is_time(name: &str) -> bool {
    name.eq_ignore_ascii_case("ts") || name.eq_ignore_ascii_case("tstart")
}

struct Scope<'a> {
    schema: &'a Schema,
    now_ns: i64,
}

impl Scope<'_> {
    /// Folds a WHERE clause (a conjunction) into the time range and field predicates.
    fn conditions(
        &self,
        expr: &Expr,
        range: &mut TimeRange,
        filter: &mut Vec<Predicate>,
    ) -> Result<(), SqlError> {
        match expr {
            Expr::Nested(inner) => self.conditions(inner, range, filter),
            Expr::BinaryOp {
                left,
                op: BinaryOperator::And,
                right,
            } => {
                self.conditions(left, range, filter)?;
                self.conditions(right, range, filter)
            }
            Expr::BinaryOp {
                op: BinaryOperator::Or,
                ..
            } => Err(unsupported("OR in WHERE (conditions are joined with AND)")),
            Expr::BinaryOp { left, op, right } => {
                let op = comparison(op).ok_or_else(|| unsupported(format!("operator {op}")))?;
                // `5 < x` is `x > 5`.
                let (column, value, op) = if self.is_column(left) {
                    (left.as_ref(), right.as_ref(), op)
                } else if self.is_column(right) {
                    (right.as_ref(), left.as_ref(), flip(op))
                } else {
                    return Err(unsupported(format!(
                        "{expr} (compare a field with a value)"
                    )));
                };
                if self.is_time_column(column) {
                    let at = self.instant(value)?;
                    *range = narrow(*range, op, at)?;
                    return Ok(());
                }
                let field = self.field(column)?;
                let value = self.literal(value, &field)?;
                filter.push(Predicate::Compare { field, op, value });
                Ok(())
            }
            Expr::Between {
                expr: column,
                negated: false,
                low,
                high,
            } => {
                if self.is_time_column(column) {
                    *range = narrow(*range, CmpOp::Ge, self.instant(low)?)?;
                    *range = narrow(*range, CmpOp::Le, self.instant(high)?)?;
                    return Ok(());
                }
                let field = self.field(column)?;
                for (op, bound) in [(CmpOp::Ge, low), (CmpOp::Le, high)] {
                    let value = self.literal(bound, &field)?;
                    filter.push(Predicate::Compare {
                        field: field.clone(),
                        op,
                        value,
                    });
                }
                Ok(())
            }
            Expr::Between { negated: true, .. } => Err(unsupported("NOT BETWEEN")),
            Expr::InList {
                expr: column,
                list,
                negated: false,
            } => {
                let field = self.field(column)?;
                let values = list
                    .iter()
                    .map(|v| self.literal(v, &field))
                    .collect::<Result<_, _>>()?;
                filter.push(Predicate::In { field, values });
                Ok(())
            }
            Expr::InList { negated: true, .. } => Err(unsupported("NOT IN")),
            Expr::IsNull(column) => {
                filter.push(Predicate::IsNull {
                    field: self.field(column)?,
                });
                Ok(())
            }
            Expr::IsNotNull(column) => {
                filter.push(Predicate::IsNotNull {
                    field: self.field(column)?,
                });
                Ok(())
            }
            other => Err(unsupported(format!("condition {other}"))),
        }
    }

    fn is_column(&self, expr: &Expr) -> bool {
        matches!(expr, Expr::Identifier(_) | Expr::CompoundIdentifier(_))
    }

    fn is_time_column(&self, expr: &Expr) -> bool {
        matches!(expr, Expr::Identifier(ident) if is_time(&ident.value) && self.schema.index_of(&ident.value).is_none())
    }

    /// The schema field an expression names (its declared spelling).
    fn field(&self, expr: &Expr) -> Result<String, SqlError> {
        match expr {
            Expr::Identifier(ident) => self
                .schema
                .index_of(&ident.value)
                .map(|i| self.schema.fields()[i].name.clone())
                .ok_or_else(|| invalid(format!("no field {:?} in the stream", ident.value))),
            Expr::Nested(inner) => self.field(inner),
            other => Err(unsupported(format!("expression {other} (name a field)"))),
        }
    }

    fn row_output(&self, expr: &Expr) -> Result<RowOutput, SqlError> {
        match expr {
            Expr::Identifier(ident) if self.schema.index_of(&ident.value).is_none() => {
                if is_time(&ident.value) {
                    Ok(RowOutput::Tstart)
                } else if ident.value.eq_ignore_ascii_case("tend") {
                    Ok(RowOutput::Tend)
                } else {
                    Err(invalid(format!("no field {:?} in the stream", ident.value)))
                }
            }
            other => Ok(RowOutput::Field(self.field(other)?)),
        }
    }

    /// A literal compared with `field`, converted to its type.
    fn literal(&self, expr: &Expr, field: &str) -> Result<Value, SqlError> {
        let ty = self
            .schema
            .index_of(field)
            .map(|i| self.schema.fields()[i].ty)
            .unwrap_or(FieldType::String);
        let text = match expr {
            Expr::Value(v) => match &v.value {
                SqlValue::Number(n, _) => n.clone(),
                SqlValue::SingleQuotedString(s) | SqlValue::DoubleQuotedString(s) => {
                    if ty == FieldType::String || ty == FieldType::Bytes {
                        return literal(&format!("'{s}'"), ty).map_err(|e| invalid(e.0));
                    }
                    s.clone()
                }
                SqlValue::Boolean(b) => b.to_string(),
                SqlValue::Null => {
                    return Err(invalid(format!("compare {field} with NULL using IS NULL")))
                }
                other => return Err(unsupported(format!("literal {other}"))),
            },
            Expr::UnaryOp {
                op: UnaryOperator::Minus,
                expr,
            } => match expr.as_ref() {
                Expr::Value(v) => match &v.value {
                    SqlValue::Number(n, _) => format!("-{n}"),
                    other => return Err(invalid(format!("-{other}"))),
                },
                other => return Err(unsupported(format!("expression -{other}"))),
            },
            other => return Err(unsupported(format!("expression {other} (use a literal)"))),
        };
        literal(&text, ty).map_err(|e| invalid(format!("{field}: {}", e.0)))
    }

    /// A point in time: nanoseconds, `'2026-11-21T10:00:00Z'`, `'now-1h'`, `now()`,
    /// `now() - INTERVAL '1 hour'`.
    fn instant(&self, expr: &Expr) -> Result<i64, SqlError> {
        match expr {
            Expr::Nested(inner) => self.instant(inner),
            Expr::Value(v) => match &v.value {
                SqlValue::Number(n, _) => n
                    .parse()
                    .map_err(|_| invalid(format!("{n} is not a timestamp in nanoseconds"))),
                SqlValue::SingleQuotedString(s) => parse_rfc3339(s)
                    .or_else(|_| parse_instant(s, self.now_ns))
                    .map_err(|e| invalid(e.0)),
                other => Err(invalid(format!("{other} is not a point in time"))),
            },
            Expr::Function(f) if function_name(&f.name).as_deref() == Some("now") => {
                Ok(self.now_ns)
            }
            Expr::BinaryOp { left, op, right } => {
                let base = self.instant(left)?;
                let offset = self.interval(right)?;
                match op {
                    BinaryOperator::Minus => Ok(base.saturating_sub(offset)),
                    BinaryOperator::Plus => Ok(base.saturating_add(offset)),
                    other => Err(unsupported(format!("time arithmetic with {other}"))),
                }
            }
            other => Err(unsupported(format!("{other} as a point in time"))),
        }
    }

    /// `INTERVAL '1 hour'`, `INTERVAL '5' MINUTE` or a duration string, in nanoseconds.
    fn interval(&self, expr: &Expr) -> Result<i64, SqlError> {
        let text = match expr {
            Expr::Interval(interval) => {
                let value = match interval.value.as_ref() {
                    Expr::Value(v) => match &v.value {
                        SqlValue::SingleQuotedString(s) | SqlValue::Number(s, _) => s.clone(),
                        other => return Err(invalid(format!("INTERVAL {other}"))),
                    },
                    other => return Err(invalid(format!("INTERVAL {other}"))),
                };
                match &interval.leading_field {
                    Some(unit) => format!("{value} {}", unit.to_string().to_ascii_lowercase()),
                    None => value,
                }
            }
            Expr::Value(v) => match &v.value {
                SqlValue::SingleQuotedString(s) => s.clone(),
                other => return Err(invalid(format!("{other} is not an interval"))),
            },
            other => return Err(unsupported(format!("{other} as an interval"))),
        };
        parse_duration(&text).map_err(|e| invalid(e.0))
    }

    /// The width of `time_bucket('1 minute', ts)`, or `None` if `expr` is not one.
    fn time_bucket(&self, expr: &Expr) -> Result<Option<i64>, SqlError> {
        let Expr::Function(f) = expr else {
            return Ok(None);
        };
        if function_name(&f.name).as_deref() != Some("time_bucket") {
            return Ok(None);
        }
        let args = plain_args(&f.args)?;
        let [width, column] = args.as_slice() else {
            return Err(invalid("time_bucket takes (width, ts)"));
        };
        if !matches!(column, Some(c) if self.is_time_column(c)) {
            return Err(invalid("time_bucket's second argument must be ts"));
        }
        let width = width
            .as_ref()
            .ok_or_else(|| invalid("time_bucket's width must be a string like '1 minute'"))?;
        Ok(Some(self.interval(width)?))
    }

    fn is_aggregate(&self, expr: &Expr) -> bool {
        matches!(expr, Expr::Function(f) if function_name(&f.name).is_some_and(|n| is_aggregate_name(&n)))
    }

    /// An aggregate call, or `None` if `expr` is not one.
    fn aggregate(&self, expr: &Expr) -> Result<Option<AggOutput>, SqlError> {
        let Expr::Function(f) = expr else {
            return Ok(None);
        };
        let Some(name) = function_name(&f.name) else {
            return Ok(None);
        };
        if !is_aggregate_name(&name) {
            return Ok(None);
        }
        if f.filter.is_some() || f.over.is_some() || !f.within_group.is_empty() {
            return Err(unsupported(format!(
                "{expr} (FILTER / OVER / WITHIN GROUP)"
            )));
        }
        if let FunctionArguments::List(list) = &f.args {
            if list.duplicate_treatment.is_some() {
                return Err(unsupported(format!("{expr} (DISTINCT in aggregates)")));
            }
        }
        let args = plain_args(&f.args)?;
        if is_percentile_name(&name) {
            let [Some(field), Some(q)] = args.as_slice() else {
                return Err(invalid(format!(
                    "{name} takes (field, fraction between 0 and 1)"
                )));
            };
            let field = self.numeric_field(field, &name)?;
            let q = match q {
                Expr::Value(v) => match &v.value {
                    SqlValue::Number(n, _) => n.parse::<f64>().ok(),
                    _ => None,
                },
                _ => None,
            }
            .filter(|q| (0.0..=1.0).contains(q))
            .ok_or_else(|| invalid(format!("{name}'s fraction must be a number in 0..=1")))?;
            return Ok(Some(AggOutput::Percentile { field, q }));
        }
        let func: AggFn = name.parse().map_err(invalid)?;
        match args.as_slice() {
            // count(*) arrives as a wildcard, i.e. no expression.
            [None] if func == AggFn::Count => Ok(Some(AggOutput::Agg(Aggregation::count()))),
            [Some(arg)] => {
                let field = if func == AggFn::Count {
                    self.field(arg)?
                } else {
                    self.numeric_field(arg, &name)?
                };
                Ok(Some(AggOutput::Agg(Aggregation::new(func, &field))))
            }
            _ => Err(invalid(format!("{name} takes one field"))),
        }
    }

    fn numeric_field(&self, expr: &Expr, function: &str) -> Result<String, SqlError> {
        let field = self.field(expr)?;
        let ty = self
            .schema
            .index_of(&field)
            .map(|i| self.schema.fields()[i].ty)
            .unwrap_or(FieldType::String);
        if !ty.is_numeric() && ty != FieldType::Boolean {
            return Err(invalid(format!(
                "{function}({field}): {field} is {ty}, not numeric"
            )));
        }
        Ok(field)
    }
}

fn is_aggregate_name(name: &str) -> bool {
    matches!(
        name,
        "count" | "sum" | "min" | "max" | "avg" | "first" | "last"
    ) || is_percentile_name(name)
}

fn is_percentile_name(name: &str) -> bool {
    matches!(
        name,
        "percentile" | "approx_percentile" | "percentile_approx" | "quantile"
    )
}

fn function_name(name: &ObjectName) -> Option<String> {
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(ident)] => Some(ident.value.to_ascii_lowercase()),
        _ => None,
    }
}

/// Positional arguments; `None` stands for `*`.
fn plain_args(args: &FunctionArguments) -> Result<Vec<Option<Expr>>, SqlError> {
    match args {
        FunctionArguments::None => Ok(Vec::new()),
        FunctionArguments::Subquery(_) => Err(unsupported("subqueries")),
        FunctionArguments::List(list) => {
            if !list.clauses.is_empty() {
                return Err(unsupported("clauses inside function arguments"));
            }
            list.args
                .iter()
                .map(|arg| match arg {
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(Some(e.clone())),
                    FunctionArg::Unnamed(FunctionArgExpr::Wildcard) => Ok(None),
                    other => Err(unsupported(format!("argument {other}"))),
                })
                .collect()
        }
    }
}

fn comparison(op: &BinaryOperator) -> Option<CmpOp> {
    Some(match op {
        BinaryOperator::Eq => CmpOp::Eq,
        BinaryOperator::NotEq => CmpOp::Ne,
        BinaryOperator::Lt => CmpOp::Lt,
        BinaryOperator::LtEq => CmpOp::Le,
        BinaryOperator::Gt => CmpOp::Gt,
        BinaryOperator::GtEq => CmpOp::Ge,
        _ => return None,
    })
}

fn flip(op: CmpOp) -> CmpOp {
    match op {
        CmpOp::Lt => CmpOp::Gt,
        CmpOp::Le => CmpOp::Ge,
        CmpOp::Gt => CmpOp::Lt,
        CmpOp::Ge => CmpOp::Le,
        other => other,
    }
}

/// The part of `range` where `ts op at` holds.
fn narrow(range: TimeRange, op: CmpOp, at: i64) -> Result<TimeRange, SqlError> {
    let (min, max) = match op {
        CmpOp::Eq => (at, at),
        CmpOp::Ge => (at, i64::MAX),
        CmpOp::Gt => (at.saturating_add(1), i64::MAX),
        CmpOp::Le => (i64::MIN, at),
        CmpOp::Lt => (i64::MIN, at.saturating_sub(1)),
        CmpOp::Ne => return Err(unsupported("ts != (time conditions are ranges)")),
    };
    Ok(TimeRange::new(range.min.max(min), range.max.min(max)))
}

//! Where DataFusion's answers differ from PostgreSQL's, whose dialect Tidemark speaks (its
//! clients come over the PostgreSQL wire), Tidemark answers as PostgreSQL does, or refuses
//! with what to write instead (docs/sql.md, "As in PostgreSQL"):
//!
//! - a floating-point or numeric value cast to an integer is rounded, not truncated, and
//!   one out of the integer's range is an error, not a wrapped value ([`casts`]);
//! - `to_char(timestamp, 'YYYY-MM-DD HH24:MI')` reads PostgreSQL's template patterns
//!   ([`to_char`]);
//! - `extract(epoch FROM interval)` and the seconds of a time keep their fraction
//!   ([`date_part`]);
//! - `x = ANY(ARRAY[...])`, `x <> ALL(...)` and a list bound as a parameter compare with
//!   each element ([`arrays`]);
//! - `LIKE ... ESCAPE '/'` and functions in FROM (`generate_series(...) AS i`, whose column
//!   is `i`) are read as PostgreSQL reads them ([`syntax`]);
//! - `x IN (SELECT ...)` in a select list, a subquery in ORDER BY and a scalar subquery's
//!   `ORDER BY o LIMIT 1` are planned, where DataFusion refuses them ([`subqueries`]).
//!
//! Casts and `date_part` are rewritten in the logical plan by one analyzer rule
//! ([`PostgresRule`], after DataFusion's type coercion, so that every expression's type is
//! known); `to_char` replaces DataFusion's function of that name; ANY and ALL are
//! rewritten in the syntax tree (by [`crate::resolve`]), since DataFusion plans them with
//! array functions Tidemark does not build.

pub mod arrays;
pub mod casts;
pub mod date_part;
pub mod subqueries;
pub mod syntax;
pub mod to_char;

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, Result as DfResult};
use datafusion::execution::SessionState;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::utils::merge_schema;
use datafusion::logical_expr::{Expr, LogicalPlan, ScalarUDF};
use datafusion::optimizer::AnalyzerRule;

/// Puts PostgreSQL's semantics into `state`: its `to_char` and the analyzer rule.
pub(crate) fn install(state: &mut SessionState) {
    // SessionState's registry cannot fail (the Result is the trait's).
    let _ = datafusion::execution::FunctionRegistry::register_udf(
        state,
        Arc::new(ScalarUDF::new_from_impl(to_char::ToChar::default())),
    );
    state.add_analyzer_rule(Arc::new(PostgresRule));
}

/// Rewrites casts to integers and `date_part` of the parts whose fraction DataFusion drops.
#[derive(Debug)]
pub struct PostgresRule;

impl AnalyzerRule for PostgresRule {
    fn name(&self) -> &str {
        "tidemark_postgres_semantics"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> DfResult<LogicalPlan> {
        // Most statements have nothing to rewrite: they are not rebuilt.
        let mut found = false;
        plan.apply_with_subqueries(|node| {
            node.apply_expressions(|expr| {
                expr.apply(|e| {
                    found = casts::is_candidate(e) || date_part::is_candidate(e);
                    Ok(if found {
                        TreeNodeRecursion::Stop
                    } else {
                        TreeNodeRecursion::Continue
                    })
                })
            })?;
            Ok(if found {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        })?;
        if !found {
            return Ok(plan);
        }
        plan.transform_up_with_subqueries(rewrite_node)
            .map(|rewritten| rewritten.data)
    }
}

/// One plan node's expressions, rewritten; its schema computed again, since `date_part`
/// of seconds becomes a double (its input's types may have changed too).
fn rewrite_node(plan: LogicalPlan) -> DfResult<Transformed<LogicalPlan>> {
    let mut schema = merge_schema(&plan.inputs());
    if let LogicalPlan::TableScan(scan) = &plan {
        schema.merge(&DFSchema::try_from_qualified_schema(
            scan.table_name.clone(),
            &scan.source.schema(),
        )?);
    }
    let names = NamePreserver::new(&plan);
    let rewritten = plan.map_expressions(|expr| {
        let name = names.save(&expr);
        let rewritten = expr.transform_up(|e| rewrite_expr(e, &schema))?;
        Ok(rewritten.update_data(|e| name.restore(e)))
    })?;
    // Recomputed whether or not this node changed: an input's column may have.
    rewritten
        .data
        .recompute_schema()
        .map(|plan| Transformed::new_transformed(plan, rewritten.transformed))
}

fn rewrite_expr(expr: Expr, schema: &DFSchema) -> DfResult<Transformed<Expr>> {
    let expr = casts::rewrite(expr, schema)?;
    if expr.transformed {
        return Ok(expr);
    }
    date_part::rewrite(expr.data, schema)
}

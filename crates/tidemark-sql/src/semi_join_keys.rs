//! `EXISTS` and `IN` subqueries join on the subquery's distinct keys.
//!
//! DataFusion turns `WHERE EXISTS (SELECT 1 FROM quotes q WHERE q.symbol = t.symbol ...)`
//! and `symbol IN (SELECT symbol ...)` into a semi join (`NOT ...` into an anti join) whose
//! hash table holds every row of the subquery: 40,000 quotes of 20 symbols make chains of
//! 2,000 rows, and each of a million trades walks its key's chain (DataFusion's hash join
//! lists each matching pair before a semi join keeps one), seconds where DuckDB takes
//! milliseconds. Only whether a key occurs matters to a semi or anti join, so this rule
//! groups the subquery's side by the join keys: the table then holds each key once. A
//! `NULL` key stays a group of its own, so `NOT IN`'s null-aware answer is unchanged.

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{JoinType, Result};
use datafusion::logical_expr::{Expr, Join, LogicalPlan, LogicalPlanBuilder};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

#[derive(Debug)]
pub struct DistinctSemiJoinKeys;

impl OptimizerRule for DistinctSemiJoinKeys {
    fn name(&self) -> &str {
        "tidemark_distinct_semi_join_keys"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let mut join = match plan {
            LogicalPlan::Join(join) => join,
            other => return Ok(Transformed::no(other)),
        };
        let Some((keys_of_right, distinct)) = distinct_keys(&join)? else {
            return Ok(Transformed::no(LogicalPlan::Join(join)));
        };
        // A semi or anti join's output is the other side's rows: its schema is unchanged.
        if keys_of_right {
            join.right = Arc::new(distinct);
        } else {
            join.left = Arc::new(distinct);
        }
        Ok(Transformed::yes(LogicalPlan::Join(join)))
    }
}

/// The side of `join` whose keys only matter (whether it is the right), grouped by its
/// keys; `None` when `join` is no semi or anti join on plain columns.
fn distinct_keys(join: &Join) -> Result<Option<(bool, LogicalPlan)>> {
    let keys_of_right = match join.join_type {
        JoinType::LeftSemi | JoinType::LeftAnti => true,
        JoinType::RightSemi | JoinType::RightAnti => false,
        _ => return Ok(None),
    };
    // A join filter would read the side's other columns.
    if join.filter.is_some() || join.on.is_empty() {
        return Ok(None);
    }
    let (side, keys): (&LogicalPlan, Vec<Expr>) = if keys_of_right {
        (
            &join.right,
            join.on.iter().map(|(_, r)| r.clone()).collect(),
        )
    } else {
        (&join.left, join.on.iter().map(|(l, _)| l.clone()).collect())
    };
    // Plain columns keep their names through the grouping, so the join's keys still name
    // them; a side grouped already has distinct keys.
    if !keys.iter().all(|k| matches!(k, Expr::Column(_)))
        || matches!(side, LogicalPlan::Aggregate(_) | LogicalPlan::Distinct(_))
    {
        return Ok(None);
    }
    let distinct = LogicalPlanBuilder::from(side.clone())
        .aggregate(keys, Vec::<Expr>::new())?
        .build()?;
    Ok(Some((keys_of_right, distinct)))
}

//! A query's [`Stop`] checked inside its plan, not only between the batches of its answer.
//!
//! The answer's stream checks the stop each time it is polled (`Guarded` in lib.rs), but an
//! operator can run for minutes inside one poll: a count over a cross join keeps pulling
//! batches from its join, which makes thousands of them from each batch of its inputs without
//! once returning to its caller (DataFusion's cooperative yielding counts only batches read
//! from the plan's leaves). Neither the query's deadline nor its client leaving could stop
//! it. So every operator that can make more rows than it reads (joins, unnests, recursive
//! queries, generated series) has its output checked batch by batch: a stopped query fails
//! with its refusal at the next batch any of them makes, wherever it is in the plan.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;

use crate::stop::Stop;

/// `plan` with a check of `stop` after each operator that can make more rows than it reads.
pub(crate) fn checked(plan: Arc<dyn ExecutionPlan>, stop: &Stop) -> Result<Arc<dyn ExecutionPlan>> {
    if stop.is_never() {
        return Ok(plan);
    }
    plan.transform_up(|node| {
        if multiplies_rows(node.name()) {
            Ok(Transformed::yes(
                Arc::new(StopCheck::new(node, stop.clone())) as _,
            ))
        } else {
            Ok(Transformed::no(node))
        }
    })
    .data()
}

/// Operators whose output can be far larger than their input, by DataFusion's names for
/// them: every join (a cross join is a nested loop join), unnesting, recursion, and the
/// leaves that generate rows (`generate_series`, `range`).
fn multiplies_rows(name: &str) -> bool {
    name.contains("Join")
        || name == "UnnestExec"
        || name == "RecursiveQueryExec"
        || name == "LazyMemoryExec"
}

/// Its input's batches, each let through only while the query may go on.
#[derive(Debug)]
struct StopCheck {
    input: Arc<dyn ExecutionPlan>,
    stop: Stop,
}

impl StopCheck {
    fn new(input: Arc<dyn ExecutionPlan>, stop: Stop) -> StopCheck {
        StopCheck { input, stop }
    }
}

impl DisplayAs for StopCheck {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "StopCheck")
    }
}

impl ExecutionPlan for StopCheck {
    fn name(&self) -> &'static str {
        "StopCheck"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Ok([input]) = <[_; 1]>::try_from(children) else {
            return internal_err!("StopCheck has one child");
        };
        Ok(Arc::new(StopCheck::new(input, self.stop.clone())))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let stop = self.stop.clone();
        // The check comes before each batch is asked for, so that a stopped query does not
        // first wait for (or compute) one more.
        let checked =
            futures::stream::unfold((input, stop, false), |(mut input, stop, done)| async move {
                if done {
                    return None;
                }
                if let Err(refusal) = stop.check() {
                    return Some((Err(refusal.into()), (input, stop, true)));
                }
                let next = input.next().await?;
                Some((next, (input, stop, false)))
            });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, checked)))
    }
}

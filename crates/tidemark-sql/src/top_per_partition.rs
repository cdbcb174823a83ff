//! The first rows of each partition (`row_number() OVER (PARTITION BY p ORDER BY o) <= k`)
//! kept in a heap per partition rather than found by sorting every row, with the sort as the
//! fallback.
//!
//! DataFusion's `WindowTopN` rule writes `Filter(rn <= k) → Window → Sort` as
//! `Window → PartitionedTopK(k)`: for the first two trades of each of 20 symbols among 1M,
//! about five times faster than the sort here. But its heaps are held in memory and never
//! spilled: with a million partitions (the newest row of each device) the query passes its
//! memory bound and is refused, where the sort spills and answers. DataFusion leaves the
//! rule off by default for that reason, and Tidemark has no estimate of a key's distinct
//! values to choose beforehand. So [`TopPerPartition`] plans both: [`HeapsOrSort`] runs the
//! heaps and, if they run out of memory before answering anything, the sort instead.

use std::fmt;
use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{Distribution, EquivalenceProperties, PhysicalExpr};
use datafusion::physical_optimizer::window_topn::WindowTopN;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::execution_plan::{
    reset_plan_states, Boundedness, ChildrenPropertiesMode, EmissionType, ReplaceChildrenOptions,
};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::windows::BoundedWindowAggExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

/// Where DataFusion's `WindowTopN` rule would take a filter of a window's row numbers,
/// plans [`HeapsOrSort`] of its plan and the filter's own. Runs where that rule runs
/// (which Tidemark's session leaves off), before distribution and sorting are enforced.
#[derive(Debug, Default)]
pub(crate) struct TopPerPartition;

impl PhysicalOptimizerRule for TopPerPartition {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut heaps_on = config.clone();
        heaps_on.optimizer.enable_window_topn = true;
        // Bottom up: the filter kept as the fallback is not visited again.
        plan.transform_up(|node| match with_heaps(&node, &heaps_on)? {
            Some(heaps) => Ok(Transformed::yes(Arc::new(HeapsOrSort::new(heaps, node)?))),
            None => Ok(Transformed::no(node)),
        })
        .data()
    }

    fn name(&self) -> &str {
        "TopPerPartition"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `filter` (of a window's row numbers, through projections and repartitions) with heaps
/// under its window, or None where DataFusion's rule does not apply. The rule takes a
/// filter right above its window; one above a projection (`SELECT a, r ... ORDER BY r`
/// keeps `r` and leaves out the window's other columns) is given to it as the same
/// condition on the window's own column, and kept above: rows past `k` are no longer
/// there, and it drops none.
fn with_heaps(
    filter: &Arc<dyn ExecutionPlan>,
    config: &ConfigOptions,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(typed) = filter.downcast_ref::<FilterExec>() else {
        return Ok(None);
    };
    let mut predicate = Arc::clone(typed.predicate());
    let mut between = Vec::new();
    let mut below = Arc::clone(typed.input());
    while below.downcast_ref::<BoundedWindowAggExec>().is_none() {
        if let Some(projection) = below.downcast_ref::<ProjectionExec>() {
            let Some(mapped) = through_projection(&predicate, projection)? else {
                return Ok(None);
            };
            predicate = mapped;
        } else if below.downcast_ref::<RepartitionExec>().is_none() {
            return Ok(None);
        }
        let Some(next) = below.children().first().map(|c| Arc::clone(c)) else {
            return Ok(None);
        };
        between.push(below);
        below = next;
    }
    // PartitionedTopK goes under the whole window: a second function of it (`lead(x)`, a
    // frame reaching FOLLOWING rows) would see only the first k rows of each partition.
    let only_ranking = below
        .downcast_ref::<BoundedWindowAggExec>()
        .is_some_and(|window| window.window_expr().len() == 1);
    if !only_ranking {
        return Ok(None);
    }
    // Not `r = 1` taken as `r <= 1`: tried, it made docs/sql.md's as-of join (a partition
    // per trade over millions of joined rows) 4.5 times slower than its sort.
    let on_window: Arc<dyn ExecutionPlan> = Arc::new(FilterExec::try_new(predicate, below)?);
    let heaps = WindowTopN::new().optimize(Arc::clone(&on_window), config)?;
    if Arc::ptr_eq(&heaps, &on_window) {
        return Ok(None);
    }
    let recompute = || ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
    let mut rebuilt = heaps;
    for node in between.into_iter().rev() {
        rebuilt = node.replace_children(vec![rebuilt], recompute())?;
    }
    Ok(Some(
        Arc::clone(filter).replace_children(vec![rebuilt], recompute())?,
    ))
}

/// `predicate` over `projection`'s output as the same condition over its input, where each
/// column it reads is one the projection passes on as it is.
fn through_projection(
    predicate: &Arc<dyn PhysicalExpr>,
    projection: &ProjectionExec,
) -> Result<Option<Arc<dyn PhysicalExpr>>> {
    let mut passed_on = true;
    let mapped = Arc::clone(predicate).transform(|expr| {
        let Some(column) = expr.downcast_ref::<Column>() else {
            return Ok(Transformed::no(expr));
        };
        let source = projection.expr().get(column.index()).map(|p| &p.expr);
        match source.and_then(|e| e.downcast_ref::<Column>()) {
            Some(input) => Ok(Transformed::yes(
                Arc::new(input.clone()) as Arc<dyn PhysicalExpr>
            )),
            None => {
                passed_on = false;
                Ok(Transformed::no(expr))
            }
        }
    })?;
    Ok(passed_on.then_some(mapped.data))
}

/// Two plans of the same rows: `heaps` (a window over `PartitionedTopK`) and `sort` (the
/// filter of a window over a sort). Runs `heaps` to its end, holding its answer (k rows of
/// each partition, counted in the query's memory); if that fails for want of memory, runs
/// `sort` instead, once the heaps' memory is given back. Nothing is answered before the
/// choice is made, so the fallback never repeats or loses a row. One partition, in no
/// order: its parent sorts what it needs sorted.
#[derive(Debug)]
pub(crate) struct HeapsOrSort {
    heaps: Arc<dyn ExecutionPlan>,
    sort: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl HeapsOrSort {
    fn new(heaps: Arc<dyn ExecutionPlan>, sort: Arc<dyn ExecutionPlan>) -> Result<HeapsOrSort> {
        if heaps.schema().fields() != sort.schema().fields() {
            return internal_err!(
                "the per-partition heaps make {:?} and the sort {:?}",
                heaps.schema(),
                sort.schema()
            );
        }
        let properties = PlanProperties::new(
            EquivalenceProperties::new(sort.schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Ok(HeapsOrSort {
            heaps,
            sort,
            properties: Arc::new(properties),
        })
    }
}

impl DisplayAs for HeapsOrSort {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "HeapsOrSort: heaps first, the sort if they run out of memory"
        )
    }
}

/// Whether `error` is a memory pool's refusal (of the query's bound or the server's).
fn is_out_of_memory(error: &DataFusionError) -> bool {
    matches!(error.find_root(), DataFusionError::ResourcesExhausted(_))
}

impl ExecutionPlan for HeapsOrSort {
    fn name(&self) -> &'static str {
        "HeapsOrSort"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.heaps, &self.sort]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition; 2]
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
        let Ok([heaps, sort]) = <[_; 2]>::try_from(children) else {
            return internal_err!("HeapsOrSort has two children");
        };
        Ok(Arc::new(HeapsOrSort::new(heaps, sort)?))
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
        if partition != 0 {
            return internal_err!("HeapsOrSort has one partition, not {partition}");
        }
        let (heaps, sort) = (Arc::clone(&self.heaps), Arc::clone(&self.sort));
        let schema = self.schema();
        let chosen = async move {
            let pool = Arc::clone(context.memory_pool());
            let before = pool.reserved();
            let held = MemoryConsumer::new("HeapsOrSort").register(&pool);
            // A plan of its own for this run: the state its operators keep (a repartition's
            // channels and their memory) goes with it when it is given up.
            let heaps = reset_plan_states(heaps)?;
            let mut answer = heaps.execute(0, Arc::clone(&context))?;
            let mut batches = Vec::new();
            let all_in = async {
                while let Some(batch) = answer.next().await {
                    let batch = batch?;
                    held.try_grow(batch.get_array_memory_size())?;
                    batches.push(batch);
                }
                Ok::<_, DataFusionError>(())
            }
            .await;
            match all_in {
                Ok(()) => {
                    // The answer's memory stays counted until it is taken.
                    let batches = futures::stream::iter(batches).map(move |batch| {
                        let _counted = &held;
                        Ok(batch)
                    });
                    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches))
                        as SendableRecordBatchStream)
                }
                Err(e) if is_out_of_memory(&e) => {
                    drop((answer, heaps, batches, held));
                    given_back(pool.as_ref(), before).await;
                    sort.execute(0, context)
                }
                Err(e) => Err(e),
            }
        };
        let batches = futures::stream::once(chosen).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            batches,
        )))
    }
}

/// Waits (a second at most) until `pool` holds no more than `before`: the heaps' partitions
/// run in tasks of their own (below the coalescing of their partitions), which let go of
/// their memory when the runtime next polls them after their plan was dropped.
async fn given_back(pool: &dyn MemoryPool, before: usize) {
    for _ in 0..1_000 {
        if pool.reserved() <= before {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{AsArray, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::datasource::MemTable;
    use datafusion::execution::memory_pool::GreedyMemoryPool;
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::{SessionConfig, SessionContext};

    /// `keys` rows, key = i (each row its own partition) and value = i, in a session whose
    /// operators may hold `memory` bytes; with [`TopPerPartition`] in its rules, or with
    /// DataFusion's `WindowTopN` alone.
    fn session(keys: i64, memory: usize, fallback: bool) -> SessionContext {
        let mut config = SessionConfig::new().with_target_partitions(2);
        config.options_mut().optimizer.enable_window_topn = !fallback;
        // As a Tidemark query sets it: what a sort sets aside to merge is within its bound.
        config.options_mut().execution.sort_spill_reservation_bytes = 256 << 10;
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(GreedyMemoryPool::new(memory)))
            .build_arc()
            .unwrap();
        let mut builder = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(runtime)
            .with_default_features();
        if fallback {
            builder = builder.with_physical_optimizer_rules(crate::physical_rules());
        }
        let context = SessionContext::new_with_state(builder.build());
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Int64, false),
            Field::new("value", DataType::Int64, false),
        ]));
        let column = || Arc::new(Int64Array::from_iter_values(0..keys));
        let batch = RecordBatch::try_new(schema.clone(), vec![column(), column()]).unwrap();
        let table = MemTable::try_new(schema, vec![vec![batch]]).unwrap();
        context.register_table("t", Arc::new(table)).unwrap();
        context
    }

    const FIRST_OF_EACH: &str = "SELECT key, value FROM (SELECT key, value, row_number() OVER \
                                 (PARTITION BY key ORDER BY value) AS r FROM t) WHERE r <= 1 \
                                 ORDER BY key";

    async fn run(context: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>> {
        context.sql(sql).await?.collect().await
    }

    /// `sql`'s plans, as EXPLAIN prints them.
    async fn explain(context: &SessionContext, sql: &str) -> String {
        let plan = run(context, &format!("EXPLAIN {sql}")).await.unwrap();
        datafusion::arrow::util::pretty::pretty_format_batches(&plan)
            .unwrap()
            .to_string()
    }

    /// The values of column `i` of `batches`, a BIGINT.
    fn longs(batches: &[RecordBatch], i: usize) -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| b.column(i).as_primitive::<Int64Type>().values().to_vec())
            .collect()
    }

    #[tokio::test]
    async fn heaps_that_run_out_of_memory_give_way_to_the_sort() {
        let (keys, memory) = (20_000, 4 << 20);
        // DataFusion's heaps alone are refused within this memory.
        let heaps_alone = run(&session(keys, memory, false), FIRST_OF_EACH).await;
        assert!(
            heaps_alone.as_ref().is_err_and(is_out_of_memory),
            "{heaps_alone:?}"
        );
        // With the sort to fall back on, every partition's first row.
        let context = session(keys, memory, true);
        let plan = explain(&context, FIRST_OF_EACH).await;
        assert!(
            plan.contains("HeapsOrSort") && plan.contains("PartitionedTopKExec"),
            "{plan}"
        );
        let batches = run(&context, FIRST_OF_EACH).await.unwrap();
        let keys_answered = longs(&batches, 0);
        assert_eq!(keys_answered, (0..keys).collect::<Vec<_>>());
        // Few partitions fit: the heaps answer.
        let batches = run(
            &session(keys, memory, true),
            "SELECT k, value FROM (SELECT key % 3 AS k, value, row_number() OVER \
             (PARTITION BY key % 3 ORDER BY value DESC) AS r FROM t) WHERE r <= 2 ORDER BY k, value",
        )
        .await
        .unwrap();
        let values = longs(&batches, 1);
        assert_eq!(values, [19_995, 19_998, 19_996, 19_999, 19_994, 19_997]);
        let context = session(keys, memory, true);
        // A window with another function (the next row's value) is left to the sort: under
        // the heaps that function would see only the first rows.
        let with_lead = "SELECT k, r, nx FROM (SELECT key % 3 AS k, row_number() OVER \
                         (PARTITION BY key % 3 ORDER BY value) AS r, lead(value) OVER \
                         (PARTITION BY key % 3 ORDER BY value) AS nx FROM t) WHERE r <= 2 \
                         ORDER BY k, r";
        let plan = explain(&context, with_lead).await;
        assert!(!plan.contains("HeapsOrSort"), "{plan}");
        let batches = run(&context, with_lead).await.unwrap();
        let next = longs(&batches, 2);
        assert_eq!(next, [3, 6, 4, 7, 5, 8]);
    }
}

//! Optimized plans reused at a later instant.
//!
//! The optimizer folds `now()` into the query's own instant, so an optimized plan holds for
//! that instant only: unless the instant is used only as a bound on time that moves with it
//! (`WHERE ts >= now() - INTERVAL '1 hour'`, W2's queries and every dashboard's) and those
//! bounds all end up as ranges of summary aggregates. Then the plan is optimized once and
//! *moved*: its ranges shifted to the new instant. Optimizing costs a W2 query more than
//! answering it from summaries (`cargo bench -p tidemark-sql --bench small_query`: planned
//! afresh vs planned before).
//!
//! A plan is a `MovingPlan` only when both hold, checked when it is made:
//! - every use of the instant in the statement's plan is `now()` plus or minus constants,
//!   compared with `tstart` (not `date_trunc('day', now())` or `current_date`, whose values
//!   jump, nor `now()` in a select list);
//! - optimized at two instants [`PROBE`] apart, the plans differ only in summary ranges, each
//!   bound either the same or exactly [`PROBE`] later.
//!
//! Moving re-checks what depends on the data (the number of buckets): a range that has
//! grown too many of them is not moved, and the statement is optimized afresh.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::Result;
use datafusion::execution::SessionState;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    Between, BinaryExpr, Cast, Expr, Extension, LogicalPlan, Operator, TryCast, Volatility,
};
use tidemark_engine::TimeRange;

use crate::convert::TSTART;
use crate::summary::SummaryAggregate;

/// How far apart the two instants a plan is optimized at to see what follows the instant:
/// an odd number of nanoseconds, so that no bound that jumps (a day, an hour, a second) can
/// look as if it moved with it.
pub const PROBE: Duration = Duration::from_nanos(86_400_000_000_000 + 123_456_789);

/// An optimized plan and, for each summary aggregate in it (in plan order, subqueries
/// included), which bounds of its range follow the instant.
pub(crate) struct MovingPlan {
    plan: LogicalPlan,
    /// The instant it was optimized at, in nanoseconds.
    at: i64,
    moves: Vec<Moves>,
}

/// Which bounds of a range follow the instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Moves {
    min: bool,
    max: bool,
}

impl MovingPlan {
    /// `plan` (as SQL planning left it) optimized by `state` (whose instant is set) if it can
    /// be moved, given `optimized`, what `state` made of it.
    pub(crate) fn new(
        state: &SessionState,
        plan: &LogicalPlan,
        optimized: &LogicalPlan,
    ) -> Result<Option<MovingPlan>> {
        let (Some(at), Some(at_ns)) = (
            state.execution_props().query_execution_start_time,
            instant(state),
        ) else {
            return Ok(None);
        };
        match instant_use(plan) {
            InstantUse::Other => return Ok(None),
            InstantUse::None => {
                let fixed = Moves {
                    min: false,
                    max: false,
                };
                return Ok(Some(MovingPlan {
                    plan: optimized.clone(),
                    at: at_ns,
                    moves: vec![fixed; summary_ranges(optimized).len()],
                }));
            }
            InstantUse::TimeBounds => {}
        }
        let mut later = state.clone();
        later.execution_props_mut().query_execution_start_time = Some(at + PROBE);
        let optimized_later = later.optimize(plan)?;
        let (before, after) = (summary_ranges(optimized), summary_ranges(&optimized_later));
        if before.len() != after.len() {
            return Ok(None);
        }
        let probe = i64::try_from(PROBE.as_nanos()).expect("the probe is a day");
        let moves = |then: i64, later: i64| {
            if later == then {
                Some(false)
            } else {
                (then.checked_add(probe) == Some(later)).then_some(true)
            }
        };
        let mut all_moves = Vec::with_capacity(before.len());
        for (then, later) in before.iter().zip(&after) {
            let (Some(min), Some(max)) = (moves(then.min, later.min), moves(then.max, later.max))
            else {
                return Ok(None);
            };
            all_moves.push(Moves { min, max });
        }
        // Everything else must be the same: put the earlier ranges into the later plan.
        let mut earlier = before.into_iter();
        let aligned = with_ranges(optimized_later, false, |_| earlier.next());
        if aligned.as_ref() != Some(optimized) {
            return Ok(None);
        }
        Ok(Some(MovingPlan {
            plan: optimized.clone(),
            at: at_ns,
            moves: all_moves,
        }))
    }

    /// The plan as optimizing it at the instant of `state` would make it; `None` where the
    /// statement must be optimized afresh (a range that now spans too many buckets, or a
    /// bound moved beyond the representable times).
    pub(crate) fn at(&self, state: &SessionState) -> Option<LogicalPlan> {
        self.at_instant(instant(state)?)
    }

    fn at_instant(&self, instant: i64) -> Option<LogicalPlan> {
        let delta = instant.checked_sub(self.at)?;
        let mut moves = self.moves.iter();
        let moved = |bound: i64, follows: bool| {
            if follows {
                bound.checked_add(delta)
            } else {
                Some(bound)
            }
        };
        with_ranges(self.plan.clone(), true, |range| {
            let moves = moves.next()?;
            Some(TimeRange::new(
                moved(range.min, moves.min)?,
                moved(range.max, moves.max)?,
            ))
        })
    }
}

/// The instant `state` optimizes at, in nanoseconds.
fn instant(state: &SessionState) -> Option<i64> {
    state
        .execution_props()
        .query_execution_start_time?
        .timestamp_nanos_opt()
}

/// The ranges of the summary aggregates of `plan`, in plan order, subqueries included.
fn summary_ranges(plan: &LogicalPlan) -> Vec<TimeRange> {
    let mut ranges = Vec::new();
    plan.apply_with_subqueries(|node| {
        if let Some(summary) = as_summary(node) {
            ranges.push(summary.range());
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .expect("collecting never fails");
    ranges
}

/// `plan` with the range of each summary aggregate (in [`summary_ranges`]'s order) replaced by
/// what `range` makes of it; `None` if it makes none, or if `check_buckets` and summaries
/// would make too many buckets of a new range.
fn with_ranges(
    plan: LogicalPlan,
    check_buckets: bool,
    mut range: impl FnMut(TimeRange) -> Option<TimeRange>,
) -> Option<LogicalPlan> {
    let mut complete = true;
    let moved = plan
        .transform_down_with_subqueries(|node| {
            let Some(summary) = as_summary(&node) else {
                return Ok(Transformed::no(node));
            };
            match range(summary.range()).and_then(|r| summary.over(r, check_buckets)) {
                Some(moved) => Ok(Transformed::yes(LogicalPlan::Extension(Extension {
                    node: Arc::new(moved),
                }))),
                None => {
                    complete = false;
                    Ok(Transformed::new(node, false, TreeNodeRecursion::Stop))
                }
            }
        })
        .ok()?;
    complete.then_some(moved.data)
}

fn as_summary(node: &LogicalPlan) -> Option<&SummaryAggregate> {
    match node {
        LogicalPlan::Extension(extension) => extension.node.as_any().downcast_ref(),
        _ => None,
    }
}

/// How a plan uses the instant it is optimized at.
#[derive(Debug, PartialEq, Eq)]
enum InstantUse {
    None,
    /// Only as bounds on `tstart` that move with it.
    TimeBounds,
    Other,
}

fn instant_use(plan: &LogicalPlan) -> InstantUse {
    let mut found = InstantUse::None;
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|expr| {
            if !expr.exists(|e| Ok(reads_instant(e)))? {
                return Ok(TreeNodeRecursion::Continue);
            }
            if bounds_time_only(expr) {
                found = InstantUse::TimeBounds;
                Ok(TreeNodeRecursion::Continue)
            } else {
                found = InstantUse::Other;
                Ok(TreeNodeRecursion::Stop)
            }
        })
    })
    .expect("inspecting never fails");
    found
}

/// Whether `expr` is a function whose value the optimizer takes from the query's instant
/// (`now()`, `current_date`, `current_time`: DataFusion's stable functions).
fn reads_instant(expr: &Expr) -> bool {
    matches!(expr, Expr::ScalarFunction(ScalarFunction { func, .. })
        if func.signature().volatility == Volatility::Stable)
}

/// Whether every use of the instant in `expr` is a comparison of `tstart` with `now()` plus or
/// minus constants, in a conjunction.
fn bounds_time_only(expr: &Expr) -> bool {
    if !expr.exists(|e| Ok(reads_instant(e))).unwrap_or(true) {
        return true;
    }
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::And => bounds_time_only(left) && bounds_time_only(right),
            Operator::Eq | Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq => {
                (is_tstart(left) && follows_instant(right))
                    || (is_tstart(right) && follows_instant(left))
            }
            _ => false,
        },
        Expr::Between(Between {
            expr,
            negated: false,
            low,
            high,
        }) => {
            let bound = |e: &Expr| is_constant(e) || follows_instant(e);
            is_tstart(expr) && bound(low) && bound(high)
        }
        _ => false,
    }
}

/// `now()` plus or minus constants (an exact cast to nanoseconds allowed).
fn follows_instant(expr: &Expr) -> bool {
    match expr {
        Expr::ScalarFunction(ScalarFunction { func, args }) => {
            func.name() == "now" && args.is_empty()
        }
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::Plus => {
                (follows_instant(left) && is_constant(right))
                    || (is_constant(left) && follows_instant(right))
            }
            Operator::Minus => follows_instant(left) && is_constant(right),
            _ => false,
        },
        Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field }) => {
            matches!(
                field.data_type(),
                DataType::Timestamp(TimeUnit::Nanosecond, _)
            ) && follows_instant(expr)
        }
        _ => false,
    }
}

/// Literals, and arithmetic and casts of literals.
fn is_constant(expr: &Expr) -> bool {
    match expr {
        Expr::Literal(..) => true,
        Expr::Cast(Cast { expr, .. }) | Expr::TryCast(TryCast { expr, .. }) => is_constant(expr),
        Expr::Negative(expr) => is_constant(expr),
        Expr::BinaryExpr(BinaryExpr { left, right, .. }) => is_constant(left) && is_constant(right),
        _ => false,
    }
}

fn is_tstart(expr: &Expr) -> bool {
    matches!(expr, Expr::Column(column) if column.name == TSTART)
}

#[cfg(test)]
mod tests {
    use tidemark_core::{BatchBuilder, Schema, Value};
    use tidemark_engine::{Db, Options};

    use super::*;
    use crate::SqlOptions;

    const HOUR: i64 = 3_600_000_000_000;
    /// The instants the plans are optimized at: 2026-11-24T00:00:00Z and later.
    const T0: i64 = 1_795_478_400_000_000_000;

    /// Two days of `cpu` readings, one a second, ending at `T0`.
    fn db() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path(), Options::default()).unwrap();
        let schema = Schema::parse_spec("cpu:DOUBLE,host:STRING").unwrap();
        db.create_stream("m", schema.clone()).unwrap();
        let events = 2 * 24 * 3600;
        let mut batch = BatchBuilder::new(schema.into(), events);
        for i in 0..events as i64 {
            let ts = T0 - (events as i64 - i) * 1_000_000_000;
            batch
                .push_row(
                    ts,
                    None,
                    &[Value::Double(i as f64), Value::String("a".into())],
                )
                .unwrap();
        }
        db.append("m", batch.finish()).unwrap();
        (dir, db)
    }

    /// The statement as SQL planning leaves it, and a session at `instant`.
    fn planned(db: &Db, sql: &str, instant: i64) -> (SessionState, LogicalPlan) {
        let (mut state, planned) = futures::executor::block_on(crate::plan(
            db,
            sql,
            &SqlOptions::default(),
            db.list_streams(),
        ))
        .unwrap();
        at(&mut state, instant);
        (state, planned.plan)
    }

    /// Sets the instant `state` optimizes at.
    fn at(state: &mut SessionState, instant: i64) {
        state.mark_start_execution();
        let now = super::instant(state).unwrap();
        let clock = state.execution_props().query_execution_start_time.unwrap();
        let shifted = if instant >= now {
            clock + Duration::from_nanos(instant.abs_diff(now))
        } else {
            clock - Duration::from_nanos(instant.abs_diff(now))
        };
        state.execution_props_mut().query_execution_start_time = Some(shifted);
        assert_eq!(super::instant(state), Some(instant));
    }

    fn moving(db: &Db, sql: &str) -> Option<(MovingPlan, SessionState, LogicalPlan)> {
        let (state, plan) = planned(db, sql, T0);
        let optimized = state.optimize(&plan).unwrap();
        MovingPlan::new(&state, &plan, &optimized)
            .unwrap()
            .map(|m| (m, state, plan))
    }

    #[test]
    fn a_range_from_now_moves_with_the_instant_as_optimizing_afresh_would() {
        let (_dir, db) = db();
        for sql in [
            "SELECT time_bucket('1 minute', ts) AS b, max(cpu) FROM m \
             WHERE ts >= now() - INTERVAL '1 hour' GROUP BY b",
            "SELECT count(*), avg(cpu) FROM m WHERE ts BETWEEN now() - INTERVAL '2 hours' \
             AND now() - INTERVAL '1 hour'",
            "SELECT max(cpu) FROM m WHERE ts > 'now-90m' AND ts <= '2026-11-23T23:00:00Z'",
        ] {
            let (moving, mut state, plan) = moving(&db, sql).expect(sql);
            assert!(moving.moves.iter().any(|m| m.min || m.max), "{sql}");
            for later in [T0 + 1, T0 + HOUR, T0 + 7 * HOUR + 12_345, T0 - 3 * HOUR] {
                at(&mut state, later);
                let afresh = state.optimize(&plan).unwrap();
                assert_eq!(moving.at(&state), Some(afresh), "{sql} at {later}");
            }
        }
    }

    #[test]
    fn a_plan_without_the_instant_is_reused_as_it_is() {
        let (_dir, db) = db();
        let sql = "SELECT max(cpu) FROM m WHERE ts >= '2026-11-23T12:00:00Z'";
        let (moving, state, _) = moving(&db, sql).expect("movable");
        assert_eq!(
            moving.moves,
            [Moves {
                min: false,
                max: false
            }]
        );
        assert_eq!(moving.at_instant(T0 + 5 * HOUR), Some(moving.plan.clone()));
        assert_eq!(moving.at(&state), Some(moving.plan.clone()));
    }

    #[test]
    fn instants_used_otherwise_are_optimized_every_time() {
        let (_dir, db) = db();
        for sql in [
            // Values that jump with the instant rather than follow it.
            "SELECT max(cpu) FROM m WHERE ts >= date_trunc('day', now())",
            "SELECT max(cpu) FROM m WHERE ts >= current_date",
            "SELECT max(cpu) FROM m WHERE ts >= now() - INTERVAL '1 hour' + (now() - now())",
            // The instant outside a bound on time.
            "SELECT now(), max(cpu) FROM m WHERE ts >= now() - INTERVAL '1 hour'",
            "SELECT max(cpu) FROM m WHERE ts >= now() - INTERVAL '1 hour' OR cpu > 3",
            "SELECT max(cpu) FROM m WHERE now() > '2027-01-01'",
            // A bound that ends in a scan's filter, not a summary range.
            "SELECT cpu FROM m WHERE ts >= now() - INTERVAL '1 minute'",
            "SELECT max(cpu) FROM m WHERE ts >= now() - INTERVAL '1 hour' AND host = 'a'",
        ] {
            assert!(moving(&db, sql).is_none(), "{sql}");
        }
    }

    #[test]
    fn a_range_that_moves_into_too_many_buckets_is_optimized_afresh() {
        let (_dir, db) = db();
        // One-second buckets over an hour are summaries' (3,600); two days earlier the range
        // reaches over all two days of events: 172,800 buckets, the plain plan's.
        let sql = "SELECT time_bucket('1 second', ts) AS b, max(cpu) FROM m \
                   WHERE ts >= now() - INTERVAL '1 hour' GROUP BY b";
        let (moving, _, _) = moving(&db, sql).expect("movable");
        assert!(moving.at_instant(T0 + HOUR).is_some());
        assert_eq!(moving.at_instant(T0 - 48 * HOUR), None);
        assert_eq!(moving.at_instant(i64::MIN), None, "moved beyond time");
    }
}

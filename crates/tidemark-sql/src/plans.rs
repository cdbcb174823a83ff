//! Statements planned before. Dashboards and monitoring send the same text again and again,
//! and for a small query DataFusion's parse, name resolution and SQL-to-plan cost more than
//! answering it. A [`PlanCache`] keeps, per statement text, the logical plan as SQL planning
//! left it: before the optimizer, which is where `now()` becomes the query's own instant, so
//! a repeat is optimized and run as if it were new, at its own time. Where the optimized plan
//! can be moved to a later instant ([`crate::moving`]), it keeps that too, and a repeat is not
//! optimized at all.
//!
//! An entry is used only where it was made: the same database, the same streams (a new one
//! could change what a name means) and the same schemas of the streams it reads. Anything
//! else plans afresh and replaces it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::logical_expr::LogicalPlan;
use tidemark_core::sync::IgnorePoison;
use tidemark_core::Schema;
use tidemark_engine::Engine;

use crate::moving::MovingPlan;

/// Statements longer than this are planned every time: a cache of them would hold megabytes
/// for the rare client that repeats one.
pub const MAX_CACHED_SQL_BYTES: usize = 16 << 10;

/// Plans whose nodes carry more columns than this in all (a node's output schema counted
/// once per node, subqueries included) are not kept: 16 KiB of SQL over wide streams can plan
/// to megabytes (`SELECT *` of a 365-field stream through a few hundred joins), and a cache of
/// 256 of them must stay small. W2's plans carry a few dozen, a `SELECT *` of such a stream
/// with an order and a limit about 1,500.
pub const MAX_CACHED_PLAN_COLUMNS: usize = 4_096;

/// Planned statements by their text, at most `capacity` of them (the least recently used
/// goes first).
pub struct PlanCache {
    capacity: usize,
    entries: Mutex<Entries>,
    /// By [`Planning`], in its order.
    counts: [AtomicU64; 3],
}

/// How a statement's plan was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planning {
    /// Parsed, resolved, planned and optimized.
    Afresh,
    /// The kept logical plan, optimized.
    Reused,
    /// The kept optimized plan, moved to the query's instant.
    Moved,
}

impl Planning {
    pub const ALL: [Planning; 3] = [Planning::Afresh, Planning::Reused, Planning::Moved];

    pub fn name(self) -> &'static str {
        match self {
            Planning::Afresh => "afresh",
            Planning::Reused => "reused",
            Planning::Moved => "moved",
        }
    }
}

#[derive(Default)]
struct Entries {
    by_statement: HashMap<Key, Slot>,
    /// Counts lookups: a slot's `used` is when it was last asked for.
    clock: u64,
}

#[derive(Clone, Hash, PartialEq, Eq)]
struct Key {
    sql: String,
    /// Whether the plan may use the summary aggregate (a rule of the optimizer, but each
    /// session template has its own).
    summaries: bool,
}

struct Slot {
    planned: Arc<Planned>,
    used: u64,
}

/// The streams a statement reads, with their schemas when it was planned.
pub(crate) type StreamsRead = Vec<(String, Arc<Schema>)>;

/// A statement as SQL planning left it, and what it was planned against.
pub(crate) struct Planned {
    pub engine: Engine,
    /// Every stream of `engine` at the time, in the engine's order.
    pub streams: Vec<String>,
    /// The streams the statement reads and their schemas at the time.
    pub read: StreamsRead,
    pub plan: LogicalPlan,
    /// The plan optimized, where it can be moved to a later instant.
    pub moving: Option<MovingPlan>,
}

impl Planned {
    /// Whether planning the same text against `engine`, whose streams are now `streams`,
    /// would give this plan.
    fn holds_for(&self, engine: &Engine, streams: &[String]) -> bool {
        engine.same_database(&self.engine)
            && self.streams == streams
            && self.read.iter().all(|(stream, then)| {
                engine
                    .stream_schema(stream)
                    .is_ok_and(|now| Arc::ptr_eq(&now, then) || now == *then)
            })
    }
}

impl PlanCache {
    pub fn new(capacity: usize) -> PlanCache {
        PlanCache {
            capacity,
            entries: Mutex::new(Entries::default()),
            counts: Default::default(),
        }
    }

    /// Counts a statement planned `how`.
    pub(crate) fn count(&self, how: Planning) {
        self.counts[how as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// How many statements were planned `how` since the cache was made.
    pub fn planned(&self, how: Planning) -> u64 {
        self.counts[how as usize].load(Ordering::Relaxed)
    }

    /// Whether it would keep the plan of `sql`.
    pub(crate) fn keeps(&self, sql: &str) -> bool {
        self.capacity > 0 && sql.len() <= MAX_CACHED_SQL_BYTES
    }

    /// The plan of `sql` made before, if it still holds for `engine` and its `streams`.
    pub(crate) fn get(
        &self,
        sql: &str,
        summaries: bool,
        engine: &Engine,
        streams: &[String],
    ) -> Option<Arc<Planned>> {
        if !self.keeps(sql) {
            return None;
        }
        let mut entries = self.lock();
        entries.clock += 1;
        let clock = entries.clock;
        let key = Key {
            sql: sql.to_string(),
            summaries,
        };
        let slot = entries.by_statement.get_mut(&key)?;
        if !slot.planned.holds_for(engine, streams) {
            entries.by_statement.remove(&key);
            return None;
        }
        slot.used = clock;
        Some(slot.planned.clone())
    }

    pub(crate) fn put(&self, sql: &str, summaries: bool, planned: Arc<Planned>) {
        if !self.keeps(sql) || columns_carried(&planned.plan) > MAX_CACHED_PLAN_COLUMNS {
            return;
        }
        let mut entries = self.lock();
        let key = Key {
            sql: sql.to_string(),
            summaries,
        };
        if !entries.by_statement.contains_key(&key) && entries.by_statement.len() >= self.capacity {
            let oldest = entries
                .by_statement
                .iter()
                .min_by_key(|(_, slot)| slot.used)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                entries.by_statement.remove(&oldest);
            }
        }
        let used = entries.clock;
        entries.by_statement.insert(key, Slot { planned, used });
        assert!(entries.by_statement.len() <= self.capacity);
    }

    /// How many statements it holds.
    pub fn len(&self) -> usize {
        self.lock().by_statement.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock().ignore_poison()
    }
}

/// The columns `plan`'s nodes carry, each node's output counted (subqueries included).
fn columns_carried(plan: &LogicalPlan) -> usize {
    let mut columns = 0;
    plan.apply_with_subqueries(|node| {
        columns += node.schema().fields().len();
        Ok(TreeNodeRecursion::Continue)
    })
    .expect("counting never fails");
    columns
}

//! The SQL subset: parsed with the `sqlparser` crate into a [`Plan`] of engine requests, then
//! run against a database ([`Engine`], what a `Db` or a replica reads through). See `docs/sql.md` for what is accepted.
//!
//! ```sql
//! SELECT time_bucket('1 minute', ts) AS minute, SYMBOL, max(PRICE), count(*)
//! FROM ticks
//! WHERE ts >= now() - INTERVAL '1 hour' AND SYMBOL IN ('AAPL', 'MSFT')
//! GROUP BY minute, SYMBOL
//! ORDER BY minute DESC
//! LIMIT 100
//! ```
//!
//! Anything outside the subset is refused with [`SqlError::Unsupported`] naming the part.

mod bounds;
mod exec;
mod plan;

pub use bounds::{MAX_NESTING, MAX_OPERATORS, MAX_SQL_BYTES};

pub use exec::execute;
pub use plan::{AggOutput, Plan, RowOutput, Shape};

use tidemark_engine::{Engine, EngineError};

use crate::Table;

#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    #[error("SQL syntax: {0}")]
    Syntax(String),
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error("{0}")]
    Invalid(String),
    /// Beyond the bounds on text size, operator count and nesting ([`MAX_OPERATORS`]...).
    #[error("the statement is too complex: {0}")]
    TooComplex(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Limits on what one query may return.
#[derive(Debug, Clone, Copy)]
pub struct SqlLimits {
    /// Row queries (and groups) beyond this many rows are refused: narrow the range or add
    /// LIMIT.
    pub max_rows: usize,
    /// Answers (and the groups of an aggregate) that would hold more than this many bytes in
    /// memory are refused, so that a query's memory is bounded whatever its rows hold.
    pub max_bytes: usize,
}

impl Default for SqlLimits {
    fn default() -> Self {
        SqlLimits {
            max_rows: 1_000_000,
            max_bytes: 64 << 20,
        }
    }
}

/// Parses, plans and runs `sql` against `db`; `now_ns` is what `now()` means.
pub fn run_sql(db: &Engine, sql: &str, now_ns: i64, limits: SqlLimits) -> Result<Table, SqlError> {
    let select = plan::parse(sql)?;
    let stream = plan::stream_name(&select)?;
    let schema = db.stream_schema(&stream)?;
    let plan = plan::plan(&select, stream, &schema, now_ns)?;
    execute(db, &plan, limits)
}

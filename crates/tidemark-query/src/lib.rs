//! Tidemark's engine-level query API.
//!
//! Owns: the vocabulary a person or a program uses to ask questions of a stream — time
//! ranges ("the last hour", "from .. to"), durations ("1m"), aggregate specs
//! (`max:LASTTRADEPRICE`), filter expressions (`SYMBOL = AAPL`) — turning them into engine
//! requests, running them, and rendering the answers as tables, JSON lines or CSV. SQL is
//! `tidemark-sql`'s.
//!
//! Must never know about: transports (HTTP, the binary protocol), storage formats, Raft.

pub mod events;
pub mod output;
pub mod query;
pub mod spec;
pub mod time;

pub use events::{write_events, EventFormat, EventQuery, EventsError};
pub use output::{
    format_event_times, write_csv_batch, write_csv_header, write_json_batch, Table, Times,
};
pub use query::run_aggregate;
pub use spec::{parse_aggregation, parse_predicate};

/// Why a query could not be understood.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct QueryError(pub String);

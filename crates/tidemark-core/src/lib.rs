//! Tidemark's data model, shared by every other crate.
//!
//! Owns: [`Schema`] and [`FieldType`], [`Value`], the columnar [`EventBatch`] (always valid
//! against its schema once built), the per-field [`FieldSummary`] that both block headers and
//! query accumulators are made of, name validation, a stream's time [`Partition`]s, decoding of JSON events, RFC 3339 times
//! ([`time`]), and the events of the benchmark workloads ([`workload`]).
//!
//! Must never know about: files, threads (beyond the poison policy every crate's locks
//! follow, [`sync`]), async runtimes or the network. Everything here is
//! pure computation so that the storage, engine, query and server layers can agree on one
//! meaning of "a valid event" and "the max of a field".

pub mod batch;
pub mod bitmap;
pub mod bytes;
pub mod column;
pub mod command;
pub mod error;
pub mod json;
pub mod name;
pub mod partition;
pub mod schema;
pub mod secret;
pub mod summary;
pub mod sync;
pub mod time;
pub mod value;
pub mod wire;
pub mod workload;

pub use batch::{BatchBuilder, EventBatch, MAX_POSITION};
pub use bitmap::Bitmap;
pub use column::{Column, ColumnData, VarBinary};
pub use command::{Command, ProducerSeq, Retention};
pub use error::CoreError;
pub use partition::Partition;
pub use schema::{Field, FieldType, Schema};
pub use summary::{
    AggFn, BatchSummary, Bounds, BytesBounds, FieldSummary, Num, NumSummary, Prefix, Sum,
    PREFIX_BYTES,
};
pub use value::{Value, ValueRef};

/// `text` cut to at most `max_chars` characters (with `…` and its full length in bytes
/// when cut), for echoing input in error messages without echoing all of it.
pub fn truncated(text: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max_chars) {
        None => std::borrow::Cow::Borrowed(text),
        Some((cut, _)) => {
            std::borrow::Cow::Owned(format!("{}… ({} bytes)", &text[..cut], text.len()))
        }
    }
}

/// Nanoseconds since the Unix epoch: the unit of every timestamp in Tidemark.
pub type Timestamp = i64;

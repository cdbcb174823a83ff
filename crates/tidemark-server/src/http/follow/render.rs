//! A read by position's events in the format the client asked for: NDJSON, Server-Sent
//! Events, or an Arrow IPC stream.
//!
//! - NDJSON: one `{"position": P, "event": {…}}` per line (the event as a scan prints it).
//! - Server-Sent Events (`Accept: text/event-stream`): each event's position is its `id`,
//!   so that a browser's `EventSource` resumes by itself (it sends `Last-Event-ID`).
//! - Arrow (`Accept: application/vnd.apache.arrow.stream`): record batches of the stream's
//!   table (`tstart`, `tend`, its fields) with a `position` column first, for consumers
//!   that want columns and bulk catch-up. An IPC stream has one schema, so a follow of an
//!   evolving stream whose schema grows ends there (cleanly); the client resumes after its
//!   last position and gets the new schema. It has no room for words either: a heartbeat is
//!   a batch of no rows, and a follow that fails ends without the stream's end-of-stream
//!   marker (a reader that looks for it sees the answer cut short; many take it for an end)
//!   and the client learns why from its next request.

use std::io;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use arrow_schema::{Field, Schema as ArrowSchema, SchemaRef};
use bytes::Bytes;
use serde_json::json;
use tidemark_core::{EventBatch, Schema};
use tidemark_query::Times;
use tidemark_sql::convert::{table_schema, to_record_batch};
use tidemark_sql::AnswerWriter;

use crate::error::ApiError;

/// The column of an Arrow answer that holds each event's position.
pub const POSITION: &str = "position";

/// How events are written to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Ndjson,
    Sse,
    Arrow,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Ndjson => "application/x-ndjson",
            Format::Sse => "text/event-stream",
            Format::Arrow => tidemark_sql::Format::Arrow.media_type(),
        }
    }
}

/// Why an answer cannot go on with a read's events.
#[derive(Debug)]
pub enum Stop {
    /// The stream's schema is not the one an Arrow answer began with.
    SchemaChanged,
    Failed(io::Error),
}

/// One answer being written: an Arrow answer's schema goes first, once.
pub struct Renderer {
    format: Format,
    times: Times,
    arrow: Option<ArrowAnswer>,
}

struct ArrowAnswer {
    /// The stream's schema when the answer began: every batch has it.
    stream: Arc<Schema>,
    /// The stream's table, as `to_record_batch` makes it.
    table: SchemaRef,
    /// `position`, then the table's columns.
    answer: SchemaRef,
    writer: AnswerWriter,
}

impl Renderer {
    /// Begins an answer about a stream of `schema`.
    pub fn begin(format: Format, times: Times, schema: &Arc<Schema>) -> io::Result<Renderer> {
        let arrow = match format {
            Format::Arrow => {
                let table = table_schema(schema);
                let position = Arc::new(Field::new(POSITION, arrow_schema::DataType::Int64, false));
                let fields = std::iter::once(position)
                    .chain(table.fields().iter().cloned())
                    .collect::<Vec<_>>();
                let answer = Arc::new(ArrowSchema::new(fields));
                let writer = AnswerWriter::begin(tidemark_sql::Format::Arrow, times, &answer)?;
                Some(ArrowAnswer {
                    stream: schema.clone(),
                    table,
                    answer,
                    writer,
                })
            }
            Format::Ndjson | Format::Sse => None,
        };
        Ok(Renderer {
            format,
            times,
            arrow,
        })
    }

    /// `events`, each with its position (every event of a read has one).
    pub fn events(&mut self, events: EventBatch) -> Result<Vec<Bytes>, Stop> {
        if let Some(arrow) = &mut self.arrow {
            return arrow.batch(events);
        }
        let mut out = Vec::new();
        for row in 0..events.len() {
            let Some(position) = events.position_at(row) else {
                continue;
            };
            let mut event = tidemark_core::json::event_to_json(&events, row);
            if self.times == Times::Rfc3339 {
                tidemark_query::format_event_times(&mut event);
            }
            match self.format {
                Format::Sse => {
                    out.extend_from_slice(format!("id: {position}\ndata: {event}\n\n").as_bytes())
                }
                Format::Ndjson | Format::Arrow => {
                    let line = json!({"position": position, "event": event});
                    out.extend_from_slice(line.to_string().as_bytes());
                    out.push(b'\n');
                }
            }
        }
        Ok(vec![Bytes::from(out)])
    }

    /// Said while nothing is new: that the follow is alive, and where the stream is.
    pub fn heartbeat(&mut self, next_position: u64) -> Result<Vec<Bytes>, Stop> {
        let text = match self.format {
            Format::Ndjson => format!(
                "{}\n",
                json!({"heartbeat": true, "nextPosition": next_position})
            ),
            // A comment: EventSource ignores it, proxies see traffic.
            Format::Sse => format!(": heartbeat, next position {next_position}\n\n"),
            Format::Arrow => {
                let Some(arrow) = &mut self.arrow else {
                    return Ok(Vec::new());
                };
                let empty = RecordBatch::new_empty(arrow.answer.clone());
                arrow.writer.write(&empty).map_err(Stop::Failed)?;
                return Ok(arrow.writer.take_output());
            }
        };
        Ok(vec![Bytes::from(text)])
    }

    /// Why the answer ends early, as its last words: `None` where the format has no room
    /// for them (Arrow), and the answer is to be cut short instead.
    pub fn error(&self, e: &ApiError) -> Option<Bytes> {
        let body = json!({"error": e.code, "message": e.message});
        match self.format {
            Format::Ndjson => Some(format!("{body}\n")),
            Format::Sse => Some(format!("event: error\ndata: {body}\n\n")),
            Format::Arrow => None,
        }
        .map(Bytes::from)
    }

    /// Ends the answer: the rest of its bytes (Arrow's end-of-stream marker).
    pub fn finish(self) -> Result<Vec<Bytes>, Stop> {
        match self.arrow {
            Some(arrow) => arrow.writer.finish().map_err(Stop::Failed),
            None => Ok(Vec::new()),
        }
    }
}

impl ArrowAnswer {
    fn batch(&mut self, events: EventBatch) -> Result<Vec<Bytes>, Stop> {
        if events.schema() != &self.stream {
            return Err(Stop::SchemaChanged);
        }
        let positions = (0..events.len())
            .map(|r| events.position_at(r).and_then(|p| i64::try_from(p).ok()))
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| Stop::Failed(io::Error::other("a read's event without a position")))?;
        let table =
            to_record_batch(events, &self.table).map_err(|e| Stop::Failed(io::Error::other(e)))?;
        let columns = std::iter::once(Arc::new(Int64Array::from(positions)) as ArrayRef)
            .chain(table.columns().iter().cloned())
            .collect();
        let batch = RecordBatch::try_new(self.answer.clone(), columns)
            .map_err(|e| Stop::Failed(io::Error::other(e)))?;
        self.writer.write(&batch).map_err(Stop::Failed)?;
        Ok(self.writer.take_output())
    }
}

//! Writes whose rows name their fields as they go — InfluxDB line protocol, and the other
//! protocols of agents that never declare a schema. A protocol pushes each row into
//! [`Events`] as it decodes it, which sorts them by stream straight into columns (no row
//! is kept: a line protocol body of a million lines is a few columns, not a million
//! vectors); a stream is created (evolving) on its first write and grows by the fields a
//! write brings that it lacks; then one batch per stream is appended through the [`Store`]
//! seam, as every other write is, and counted as appended as the store layer's `append` counts.
//!
//! What the columns will take in memory is admitted on the request's permit before it is
//! taken: a row that names a field the rows before it lacked costs a null for each of them,
//! and a stream of many fields costs a null per absent field in every event. A null is a
//! bit of its column's validity (the column holds no value for it), so that is an eighth of
//! a byte per absent field and event, where it once was the type's whole default value
//! (1,000 field names in a 100 KB body once took 306 MB). A request whose columns could
//! never fit the budget is refused `too_large`, one that does not fit now `overloaded`
//! (429), before the memory is taken.
//!
//! Every check that can refuse a request — names, a field's type against the stream's or
//! against another row of the same request, a strict stream asked to grow — runs over all
//! rows before anything is created, grown or appended: a refused request stores nothing.
//! (The streams' batches are appended together, each on its own; a failure of the store
//! for some of them, such as back-pressure or an event beyond a stream's out-of-order
//! window, leaves the others stored, and the error says which streams were.)

use std::sync::Arc;

use futures::future::join_all;
use rustc_hash::FxHashMap;
use tidemark_core::name::{validate_new_field_name, validate_new_stream_name};
pub use tidemark_core::schema::MAX_FIELDS;
use tidemark_core::{
    Bitmap, Column, Command, EventBatch, Field, FieldType, Schema, Value, ValueRef,
};

use crate::admission::Permit;
use crate::metrics::Metrics;
use crate::store::{Store, StoreError, StoreErrorKind};

/// One event as a protocol decoded it: its stream, instant and named values.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The line (or item: see [`Numbered`]) of the request it came from, 1-based, for errors.
    pub line: usize,
    pub stream: String,
    pub tstart: i64,
    /// Each value's type is the field's; no name twice (compared case-insensitively).
    pub values: Vec<(String, Value)>,
}

/// What a row's value (a field's name and value) takes besides its text: the name's and
/// the value's headers and allocations.
pub const ROW_VALUE_BYTES: usize = 64;

impl Row {
    /// The memory this row holds, about: a protocol that builds rows before pushing them
    /// into [`Events`] admits them as it builds them.
    pub fn heap_bytes(&self) -> usize {
        let text = |value: &Value| match value {
            Value::String(s) => s.len(),
            Value::Bytes(b) => b.len(),
            _ => 0,
        };
        std::mem::size_of::<Row>()
            + self.stream.len()
            + self
                .values
                .iter()
                .map(|(name, value)| ROW_VALUE_BYTES + name.len() + text(value))
                .sum::<usize>()
    }
}

/// A refused or failed write, with the line it is about when it is about one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct Refusal {
    pub line: Option<usize>,
    pub error: StoreError,
}

impl Refusal {
    /// A refusal about `line`; its message is prefixed with what the line is at the end of
    /// [`write`].
    fn invalid(line: usize, message: String) -> Refusal {
        Refusal {
            line: Some(line),
            error: StoreError::new(StoreErrorKind::Invalid, message),
        }
    }

    /// The message, prefixed with the line it is about (`line 3: ...`).
    fn numbered(mut self, numbered: Numbered) -> Refusal {
        if let Some(line) = self.line {
            self.error.message = format!("{} {line}: {}", numbered.noun(), self.error.message);
        }
        self
    }
}

/// What a protocol's rows are numbered by in its requests, as errors name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numbered {
    /// Lines of text (line protocols).
    Line,
    /// Time series of a remote-write request (all samples of a series share its number).
    TimeSeries,
}

impl Numbered {
    fn noun(self) -> &'static str {
        match self {
            Numbered::Line => "line",
            Numbered::TimeSeries => "time series",
        }
    }
}

impl From<StoreError> for Refusal {
    fn from(error: StoreError) -> Refusal {
        Refusal { line: None, error }
    }
}

/// How often creating or growing a stream is tried again when another writer changed it
/// between this write's look at the schema and its change.
const SCHEMA_ATTEMPTS: usize = 4;

/// The most streams one write may reach. Each stream a write creates is a logged catalog
/// change of its own: without a bound, one request of a million measurement names would
/// create a million streams. (Prometheus sends at most a few hundred metric names a request.)
pub const MAX_STREAMS_PER_WRITE: usize = 1_000;

/// Events stored by a write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    pub events: u64,
    pub streams: usize,
}

/// The events of one stream, as columns of the fields they bring in order of first
/// appearance.
struct Group {
    stream: String,
    /// The most fields the stream may have once this write added its own.
    max_fields: usize,
    tstart: Vec<i64>,
    /// The line of each event, in order (for errors).
    lines: Vec<usize>,
    fields: Vec<Field>,
    /// One per field; shorter than `tstart` while the latest rows lack the field (padded
    /// with nulls as values come, and when the batch is made).
    columns: Vec<Column>,
    /// For each field, the first line that brought it (for errors).
    first_line: Vec<usize>,
    /// Each spelling of a field name seen so far → its field: rows of one writer spell a
    /// name the same way, so looking a name up costs no allocation per value.
    names: FxHashMap<String, usize>,
}

impl Group {
    fn new(stream: String, max_fields: usize) -> Group {
        Group {
            stream,
            max_fields,
            tstart: Vec::new(),
            lines: Vec::new(),
            fields: Vec::new(),
            columns: Vec::new(),
            first_line: Vec::new(),
            names: FxHashMap::default(),
        }
    }

    /// The field `name` is (names compare case-insensitively), if it was brought before.
    fn field_of(&mut self, name: &str) -> Option<usize> {
        if let Some(&i) = self.names.get(name) {
            return Some(i);
        }
        let i = self
            .fields
            .iter()
            .position(|f| f.name.eq_ignore_ascii_case(name))?;
        self.names.insert(name.to_string(), i);
        Some(i)
    }

    /// Adds one event's values to the columns; a field brought before with another type, or
    /// given twice in the event, refuses it (leaving the group half-written: the request is
    /// refused as a whole).
    fn push<'v>(
        &mut self,
        numbered: Numbered,
        line: usize,
        tstart: i64,
        values: impl IntoIterator<Item = (&'v str, ValueRef<'v>)>,
        budget: &mut ColumnBudget,
    ) -> Result<(), Refusal> {
        let row = self.tstart.len();
        budget.admit(EVENT_BYTES, line)?;
        for (name, value) in values {
            let Some(ty) = value.field_type() else {
                continue;
            };
            let index = match self.field_of(name) {
                Some(i) => {
                    let earlier = &self.fields[i];
                    if earlier.ty != ty {
                        return Err(Refusal::invalid(
                            line,
                            format!(
                                "field {name:?} is {ty} here but {} on {} {} of the same \
                                 request (a field has one type)",
                                earlier.ty,
                                numbered.noun(),
                                self.first_line[i]
                            ),
                        ));
                    }
                    if self.columns[i].len() > row {
                        return Err(Refusal::invalid(
                            line,
                            format!(
                                "{name:?} is given twice (a tag and a field, or names that \
                                 differ only in case, are one field here)"
                            ),
                        ));
                    }
                    i
                }
                None => {
                    validate_new_field_name(name).map_err(|e| {
                        Refusal::invalid(line, format!("stream {:?}: {e}", self.stream))
                    })?;
                    // Whatever the stream has, it cannot take more than this: refused at
                    // once, not after every row was read.
                    self.within_field_limit(self.fields.len(), &[line])?;
                    budget.admit(FIELD_BYTES, line)?;
                    self.fields.push(Field::new(name, ty));
                    self.columns.push(Column::empty(ty));
                    self.first_line.push(line);
                    self.names.insert(name.to_string(), self.fields.len() - 1);
                    self.fields.len() - 1
                }
            };
            let column = &mut self.columns[index];
            let text = match value {
                ValueRef::String(v) => v.len(),
                ValueRef::Bytes(v) => v.len(),
                _ => 0,
            };
            let bits = validity_bytes(column.len(), row + 1);
            budget.admit(value_bytes(ty) + text + bits, line)?;
            column.pad_with_nulls(row);
            // The type was checked above: only the 4 GiB limit of a string column is left.
            column
                .push_ref(value)
                .map_err(|message| Refusal::invalid(line, message))?;
            assert_eq!(column.len(), row + 1, "one value per event");
        }
        self.tstart.push(tstart);
        self.lines.push(line);
        Ok(())
    }

    /// What must change in the stream as `found` (`None`: it does not exist) before the
    /// events can be appended: the fields it lacks. A field it has with another type, or a
    /// strict stream that lacks one, refuses the request.
    fn missing(&self, found: &Option<Found>) -> Result<Vec<Field>, Refusal> {
        let Some(Found { schema, evolving }) = found else {
            self.within_field_limit(0, &self.first_line)?;
            return Ok(self.fields.clone());
        };
        let mut missing = Vec::new();
        let mut missing_lines = Vec::new();
        for (field, &line) in self.fields.iter().zip(&self.first_line) {
            match schema.index_of(&field.name) {
                Some(i) if schema.fields()[i].ty == field.ty => {}
                Some(i) => {
                    return Err(Refusal::invalid(
                        line,
                        format!(
                            "field {:?} of stream {:?} is {}, this write gives it as {}",
                            field.name,
                            self.stream,
                            schema.fields()[i].ty,
                            field.ty
                        ),
                    ))
                }
                None if *evolving => {
                    missing.push(field.clone());
                    missing_lines.push(line);
                }
                None => {
                    return Err(Refusal::invalid(
                        line,
                        format!(
                            "stream {:?} has a strict schema ({}) without field {:?}: \
                             create it with evolving on to let writes add fields",
                            self.stream,
                            schema.to_spec(),
                            field.name
                        ),
                    ))
                }
            }
        }
        self.within_field_limit(schema.len(), &missing_lines)?;
        Ok(missing)
    }

    /// Refuses the write when a stream of `existing` fields plus those the rows bring would
    /// have more than a schema may (checked here, before anything is stored, rather than
    /// found by the store after other streams of the request were written).
    /// `added_lines` are the lines that brought the fields to add, in order.
    fn within_field_limit(&self, existing: usize, added_lines: &[usize]) -> Result<(), Refusal> {
        match added_lines.get(self.max_fields.saturating_sub(existing)) {
            Some(&line) => Err(Refusal::invalid(
                line,
                format!(
                    "stream {:?} would have more than {} fields",
                    self.stream, self.max_fields
                ),
            )),
            None => Ok(()),
        }
    }

    /// The bytes the batch takes beyond the columns pushed so far, once the stream has
    /// `existing` fields (and the group's own): a bit for each event a field has no value
    /// in, and a column for each field of the stream the events do not name.
    fn padding_bytes(&self, existing: &[Field]) -> usize {
        let events = self.tstart.len();
        let own: usize = self
            .columns
            .iter()
            .map(|column| validity_bytes(column.len(), events))
            .sum();
        let named: std::collections::HashSet<String> =
            self.fields.iter().map(|f| f.name.to_lowercase()).collect();
        let others = existing
            .iter()
            .filter(|field| !named.contains(&field.name.to_lowercase()))
            .count();
        own + others * (std::mem::size_of::<Column>() + validity_bytes(0, events))
    }

    /// The events as one batch under `schema` (which has every field they bring): the
    /// columns move into it in the schema's order, a field of the schema they lack reads as
    /// null. The lines stay, in order, in `lines`.
    fn batch(&mut self, schema: &Arc<Schema>) -> Result<EventBatch, Refusal> {
        let events = self.tstart.len();
        let mut placed: Vec<Option<Column>> = vec![None; schema.len()];
        for (field, mut column) in self.fields.iter().zip(std::mem::take(&mut self.columns)) {
            let at = schema.index_of(&field.name).ok_or_else(|| {
                unavailable(format!(
                    "stream {:?} lost field {:?} while being written; retry",
                    self.stream, field.name
                ))
            })?;
            column.pad_with_nulls(events);
            placed[at] = Some(column);
        }
        let columns = placed
            .into_iter()
            .zip(schema.fields())
            .map(|(column, field)| column.unwrap_or_else(|| Column::nulls(field.ty, events)))
            .collect();
        EventBatch::new(
            schema.clone(),
            std::mem::take(&mut self.tstart),
            None,
            columns,
        )
        .map_err(|e| {
            unavailable(format!(
                "stream {:?} changed while being written ({e}); retry",
                self.stream
            ))
        })
    }
}

/// A store error that a retry of the whole request may not meet.
fn unavailable(message: String) -> Refusal {
    StoreError::new(StoreErrorKind::Unavailable, message).into()
}

/// A write's events as protocols decode them, sorted by stream into columns as they come
/// (see [`Events::push`]); stored by [`write_events`].
pub struct Events {
    numbered: Numbered,
    groups: Vec<Group>,
    by_stream: FxHashMap<String, usize>,
    /// The request's bytes on the server's budget, grown by what its columns will take
    /// before they take it; given back once the events are written.
    budget: ColumnBudget,
    /// The most fields a stream may have after this write.
    max_fields: usize,
}

impl Events {
    /// Events of a request admitted with `permit`, which streams may grow to `max_fields`
    /// (at most what a schema may have).
    pub fn new(numbered: Numbered, permit: Permit, max_fields: usize) -> Events {
        Events {
            numbered,
            groups: Vec::new(),
            by_stream: FxHashMap::default(),
            budget: ColumnBudget {
                permit,
                allowance: 0,
            },
            max_fields: max_fields.min(MAX_FIELDS),
        }
    }

    /// Adds the event on `line` (a refusal names it): its stream, instant and values by
    /// field name (null values are skipped). After a refusal the events are not to be
    /// written: the request is refused as a whole.
    pub fn push<'v>(
        &mut self,
        line: usize,
        stream: &str,
        tstart: i64,
        values: impl IntoIterator<Item = (&'v str, ValueRef<'v>)>,
    ) -> Result<(), Refusal> {
        let index = match self.by_stream.get(stream) {
            Some(&index) => index,
            None => {
                if self.groups.len() == MAX_STREAMS_PER_WRITE {
                    return Err(Refusal::invalid(
                        line,
                        format!(
                            "a write may reach at most {MAX_STREAMS_PER_WRITE} streams \
                             (measurements); split the request"
                        ),
                    )
                    .numbered(self.numbered));
                }
                validate_new_stream_name(stream)
                    .map_err(|e| Refusal::invalid(line, e.to_string()).numbered(self.numbered))?;
                self.groups
                    .push(Group::new(stream.to_string(), self.max_fields));
                self.by_stream
                    .insert(stream.to_string(), self.groups.len() - 1);
                self.groups.len() - 1
            }
        };
        self.groups[index]
            .push(self.numbered, line, tstart, values, &mut self.budget)
            .map_err(|refusal| refusal.numbered(self.numbered))
    }

    /// The events pushed so far.
    pub fn len(&self) -> usize {
        self.groups.iter().map(|g| g.tstart.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.iter().all(|g| g.tstart.is_empty())
    }
}

impl Group {
    /// A refusal of the group's batch, naming the line of the event it is about.
    fn about_line(&self, error: StoreError) -> Refusal {
        match error.event.and_then(|event| self.lines.get(event)) {
            Some(&line) => Refusal {
                line: Some(line),
                error,
            },
            None => error.into(),
        }
    }
}

/// A stream as a write finds it.
struct Found {
    schema: Arc<Schema>,
    /// Whether writes may add fields to it.
    evolving: bool,
}

/// The stream as it is now; `None` when there is no such stream.
async fn look_up(store: &Store, stream: &str) -> Result<Option<Found>, Refusal> {
    match store.stream_schema(stream).await {
        Ok(schema) => {
            let evolving = store.stream_is_evolving(stream);
            Ok(Some(Found { schema, evolving }))
        }
        Err(e) if e.kind == StoreErrorKind::UnknownStream => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Stores `rows`: streams created or grown as they need, then one batch per stream. A
/// refusal about a row names it as `numbered` says (`line 3: ...`). What was stored is
/// counted as appended, as one request of `bytes_received`.
pub async fn write(
    store: &Store,
    metrics: &Metrics,
    rows: Vec<Row>,
    numbered: Numbered,
    permit: Permit,
    max_fields: usize,
    bytes_received: usize,
) -> Result<Written, Refusal> {
    let mut events = Events::new(numbered, permit, max_fields);
    for row in &rows {
        let values = row
            .values
            .iter()
            .map(|(name, v)| (name.as_str(), v.borrowed()));
        events.push(row.line, &row.stream, row.tstart, values)?;
    }
    write_events(store, metrics, events, bytes_received).await
}

/// Stores `events`: streams created or grown as they need, then one batch per stream. A
/// refusal about an event names its line as the events are numbered (`line 3: ...`). What
/// was stored is counted as appended, as one request of `bytes_received`.
pub async fn write_events(
    store: &Store,
    metrics: &Metrics,
    events: Events,
    bytes_received: usize,
) -> Result<Written, Refusal> {
    let numbered = events.numbered;
    let written = write_groups(store, events.groups, events.budget)
        .await
        .map_err(|refusal| refusal.numbered(numbered))?;
    if written.events > 0 {
        metrics.appended(written.events as usize, bytes_received);
    }
    Ok(written)
}

/// Bytes an event takes besides its values: its instant and its line.
const EVENT_BYTES: usize = 16;

/// Bytes a field new to the request takes besides its values: its name (in the field,
/// the lookup map and the schema), its column and its first line.
const FIELD_BYTES: usize = 256;

/// Bytes a value of `ty` takes in a column besides its text: the value (an offset for
/// STRING and BYTES).
fn value_bytes(ty: FieldType) -> usize {
    match ty {
        FieldType::Boolean | FieldType::Byte => 1,
        FieldType::Short => 2,
        FieldType::Integer | FieldType::Float | FieldType::String | FieldType::Bytes => 4,
        FieldType::Long | FieldType::Double => 8,
    }
}

/// Bytes a column's validity grows by from `rows` to `to` rows: a bit a row, in the words
/// the bitmap allocates. Charged whether or not the rows are null (a column without nulls
/// has no bitmap yet, but gets one, as long as the column, at its first null).
fn validity_bytes(rows: usize, to: usize) -> usize {
    Bitmap::heap_bytes_for(to).saturating_sub(Bitmap::heap_bytes_for(rows))
}

/// The request's permit, grown as its columns grow. Growing takes an atomic update of the
/// server's budget, so it is grown [`ADMIT_AHEAD`] bytes at a time, not once a value.
struct ColumnBudget {
    permit: Permit,
    /// Bytes admitted and not yet taken.
    allowance: usize,
}

/// How far ahead of what it takes a request's permit is grown.
const ADMIT_AHEAD: usize = 64 << 10;

impl ColumnBudget {
    /// Admits `bytes` the request is about to take, or refuses it: `too_large` if that
    /// could never be admitted, `overloaded` if not now.
    fn admit(&mut self, bytes: usize, line: usize) -> Result<(), Refusal> {
        if let Some(left) = self.allowance.checked_sub(bytes) {
            self.allowance = left;
            return Ok(());
        }
        let needed = bytes - self.allowance;
        // Ahead if there is room, else exactly: near the limit the last bytes still fit.
        if self.permit.grow(needed + ADMIT_AHEAD) {
            self.allowance = ADMIT_AHEAD;
            return Ok(());
        }
        if self.permit.grow(needed) {
            self.allowance = 0;
            return Ok(());
        }
        let (kind, message) = if self.permit.could_grow(needed) {
            (
                StoreErrorKind::Overloaded,
                "the server has too many request bytes in flight; retry later".to_string(),
            )
        } else {
            (
                StoreErrorKind::TooLarge,
                "the events would take more memory as columns than one request may hold \
                 (limits.max_in_flight_bytes; each event holds a null, a bit, for every field \
                 of its stream it lacks): send fewer events per request, or fewer distinct \
                 field names"
                    .to_string(),
            )
        };
        Err(Refusal {
            line: Some(line),
            error: StoreError::new(kind, message),
        })
    }
}

async fn write_groups(
    store: &Store,
    mut groups: Vec<Group>,
    mut budget: ColumnBudget,
) -> Result<Written, Refusal> {
    // Everything that can refuse the request is checked before anything changes, what its
    // batches will take in memory included.
    for group in &groups {
        let found = look_up(store, &group.stream).await?;
        group.missing(&found)?;
        let existing = found
            .as_ref()
            .map_or(&[][..], |found| found.schema.fields());
        let first_line = group.lines.first().copied().unwrap_or(1);
        budget.admit(group.padding_bytes(existing), first_line)?;
    }
    let mut appends = Vec::with_capacity(groups.len());
    for group in &mut groups {
        let schema = prepare_stream(store, group).await?;
        appends.push(Command::Append {
            name: group.stream.clone(),
            batch: group.batch(&schema)?,
            producer: None,
        });
    }
    // Submitted together, the streams' batches meet in the store's group commit: one fsync
    // (one Raft round in a cluster) for the request, not one per stream in turn — a
    // remote-write request reaches hundreds of streams.
    let results = join_all(appends.into_iter().map(|append| store.submit(append))).await;
    let mut written = Written::default();
    let mut stored = Vec::new();
    let mut failure = None;
    for (group, result) in groups.iter().zip(results) {
        match result {
            Ok(ack) => {
                written.events += ack.events;
                written.streams += 1;
                stored.push(group.stream.as_str());
            }
            Err(error) => {
                failure.get_or_insert_with(|| group.about_line(error));
            }
        }
    }
    drop(budget);
    match failure {
        None => Ok(written),
        Some(refusal) => Err(stored_before(refusal, &stored)),
    }
}

/// Creates or grows the stream of `group` until it has every field the rows bring; returns
/// its schema then. Another writer may change the stream in between: looked at again.
async fn prepare_stream(store: &Store, group: &Group) -> Result<Arc<Schema>, Refusal> {
    for _ in 0..SCHEMA_ATTEMPTS {
        let found = look_up(store, &group.stream).await?;
        let missing = group.missing(&found)?;
        let change = match (found, missing.is_empty()) {
            (Some(found), true) => return Ok(found.schema),
            (None, _) => Command::CreateStream {
                name: group.stream.clone(),
                schema: Schema::new(missing).map_err(|e| {
                    Refusal::from(StoreError::new(StoreErrorKind::Invalid, e.to_string()))
                })?,
                evolving: true,
                partition: tidemark_core::Partition::DAY,
            },
            (Some(_), false) => Command::AddFields {
                name: group.stream.clone(),
                fields: missing,
            },
        };
        match store.submit(change).await {
            Ok(_) => {}
            // Created or changed by another writer meanwhile: look again.
            Err(e)
                if matches!(
                    e.kind,
                    StoreErrorKind::StreamExists | StoreErrorKind::UnknownStream
                ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::new(
        StoreErrorKind::Unavailable,
        format!(
            "stream {:?} kept changing under this write ({SCHEMA_ATTEMPTS} attempts); retry",
            group.stream
        ),
    )
    .into())
}

/// A store failure of some streams' batches, saying which others were stored.
fn stored_before(refusal: Refusal, stored: &[&str]) -> Refusal {
    if stored.is_empty() {
        return refusal;
    }
    Refusal {
        error: StoreError {
            message: format!(
                "{} (the events of streams {stored:?} were stored)",
                refusal.error.message
            ),
            ..refusal.error
        },
        ..refusal
    }
}

#[cfg(test)]
mod tests {
    use tidemark_core::FieldType;

    use super::*;
    use crate::admission::Admission;

    fn unbounded(numbered: Numbered) -> Events {
        Events::new(
            numbered,
            Admission::new(1 << 30).try_admit(0).unwrap(),
            MAX_FIELDS,
        )
    }

    #[test]
    fn what_sparse_rows_will_take_is_admitted_before_it_is_taken() {
        // A field per row, of 1,000 in turn: row k brings a value to a field the rows since
        // its last value lack, a null (a bit) for each of them.
        let budget = Admission::new(1 << 20);
        let mut sparse = Events::new(Numbered::Line, budget.try_admit(100).unwrap(), MAX_FIELDS);
        let names: Vec<String> = (0..1000).map(|i| format!("f{i}")).collect();
        let refused = (0..20_000)
            .find_map(|row| {
                sparse
                    .push(
                        row + 1,
                        "m",
                        1,
                        [(names[row % 1000].as_str(), ValueRef::Double(1.0))],
                    )
                    .err()
            })
            .expect("refused before its columns take more than the budget");
        assert_eq!(refused.error.kind, StoreErrorKind::TooLarge, "{refused}");
        assert!(budget.bytes_in_flight() <= 1 << 20);
        let held: usize = sparse
            .groups
            .iter()
            .flat_map(|g| &g.columns)
            .map(Column::heap_bytes)
            .sum();
        assert!(
            held <= budget.bytes_in_flight(),
            "{held} held, {} admitted",
            budget.bytes_in_flight()
        );
        drop(sparse);
        // With room taken by others, the same is refused for now, not for ever.
        let other = budget.try_admit((1 << 20) - 4096).unwrap();
        let mut events = Events::new(Numbered::Line, budget.try_admit(0).unwrap(), MAX_FIELDS);
        let refused = (0..20_000)
            .find_map(|row| {
                events
                    .push(
                        row + 1,
                        "m",
                        1,
                        [(names[row % 1000].as_str(), ValueRef::Double(1.0))],
                    )
                    .err()
            })
            .unwrap();
        assert_eq!(refused.error.kind, StoreErrorKind::Overloaded, "{refused}");
        drop((other, events));
        assert_eq!(budget.bytes_in_flight(), 0);
    }

    #[test]
    fn a_stream_grows_to_at_most_the_fields_its_writer_may_add() {
        let bounded = || {
            Events::new(
                Numbered::Line,
                Admission::new(1 << 30).try_admit(0).unwrap(),
                3,
            )
        };
        let mut events = bounded();
        for (row, name) in ["a", "b", "c"].into_iter().enumerate() {
            events
                .push(row + 1, "m", 1, [(name, ValueRef::Double(1.0))])
                .unwrap();
        }
        // The fourth is refused on its line, before the rows after it are read.
        let refused = events
            .push(4, "m", 1, [("d", ValueRef::Double(1.0))])
            .unwrap_err();
        assert_eq!(refused.line, Some(4));
        assert!(
            refused.error.message.contains("more than 3 fields"),
            "{refused}"
        );
        // With a stream that has two fields already, the second the rows bring is one too
        // many.
        let mut events = bounded();
        for (row, name) in ["a", "b"].into_iter().enumerate() {
            events
                .push(row + 1, "m", 1, [(name, ValueRef::Double(1.0))])
                .unwrap();
        }
        let schema = Schema::new(vec![
            Field::new("x", FieldType::Double),
            Field::new("y", FieldType::Double),
        ])
        .unwrap();
        let found = Some(Found {
            schema: Arc::new(schema),
            evolving: true,
        });
        let refused = events.groups[0].missing(&found).unwrap_err();
        assert_eq!(refused.line, Some(2));
    }

    #[test]
    fn sparse_rows_become_columns_in_the_schemas_order_with_nulls_where_a_row_lacks_a_field() {
        let mut events = unbounded(Numbered::Line);
        events
            .push(1, "m", 10, [("a", ValueRef::Double(1.0))])
            .unwrap();
        events
            .push(
                2,
                "m",
                20,
                [("b", ValueRef::String("x")), ("A", ValueRef::Double(2.0))],
            )
            .unwrap();
        events
            .push(
                3,
                "m",
                30,
                [("b", ValueRef::String("y")), ("c", ValueRef::Null)],
            )
            .unwrap();
        assert_eq!(events.len(), 3);
        let mut group = events.groups.remove(0);
        assert_eq!(group.fields.len(), 2, "a null brings no field; `A` is `a`");
        // The stream as it is: its own order, and a field these rows never give.
        let schema = Arc::new(
            Schema::new(vec![
                Field::new("b", FieldType::String),
                Field::new("z", FieldType::Long),
                Field::new("a", FieldType::Double),
            ])
            .unwrap(),
        );
        let batch = group.batch(&schema).unwrap();
        assert_eq!(batch.tstart(), [10, 20, 30]);
        assert_eq!(group.lines, [1, 2, 3]);
        let s = |text: &str| Value::String(text.into());
        assert_eq!(batch.row(0), [Value::Null, Value::Null, Value::Double(1.0)]);
        assert_eq!(batch.row(1), [s("x"), Value::Null, Value::Double(2.0)]);
        assert_eq!(batch.row(2), [s("y"), Value::Null, Value::Null]);
    }

    #[test]
    fn a_field_given_twice_or_with_two_types_refuses_the_line_it_is_on() {
        let mut events = unbounded(Numbered::Line);
        let twice = events
            .push(
                4,
                "m",
                1,
                [("a", ValueRef::Double(1.0)), ("A", ValueRef::Double(2.0))],
            )
            .unwrap_err();
        assert_eq!(twice.line, Some(4));
        assert!(twice.error.message.starts_with("line 4: "), "{twice}");
        assert!(twice.error.message.contains("given twice"), "{twice}");

        let mut events = unbounded(Numbered::TimeSeries);
        events
            .push(1, "m", 1, [("a", ValueRef::Double(1.0))])
            .unwrap();
        let retyped = events
            .push(2, "m", 2, [("a", ValueRef::Long(1))])
            .unwrap_err();
        assert_eq!(retyped.line, Some(2));
        assert!(
            retyped.error.message.contains("on time series 1"),
            "{retyped}"
        );
    }
}

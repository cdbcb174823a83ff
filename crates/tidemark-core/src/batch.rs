use std::ops::Range;
use std::sync::Arc;

use crate::{Column, ColumnData, CoreError, FieldType, Schema, Timestamp, Value};

/// A columnar batch of events of one schema: `tstart` for every event, an optional `tend`,
/// optional stream positions, and one column per schema field.
///
/// A batch can only be built valid: column count, types and lengths match the schema,
/// `tend >= tstart` wherever `tend` is present, and positions are not negative.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    schema: Arc<Schema>,
    tstart: Vec<Timestamp>,
    /// A LONG column; `None` when no event of the batch has an end timestamp.
    tend: Option<Column>,
    /// Each event's position in its stream (a LONG column; null for events stored before
    /// streams had positions). `None` where the reader did not ask for them: a batch as
    /// appended has none (the stream gives them when the append is applied), nor does a
    /// scan's answer.
    positions: Option<Box<Column>>,
    columns: Vec<Column>,
}

/// The largest position an event can have: positions are kept as LONG values.
pub const MAX_POSITION: u64 = i64::MAX as u64;

/// An optional LONG column (`tend`, positions) kept only while some event has a value.
fn unless_all_null(column: Option<Column>) -> Option<Column> {
    column.filter(|c| c.null_count() < c.len())
}

/// A LONG column of `before` nulls, to which values for later rows are added.
fn nulls_before(before: usize) -> Column {
    let mut c = Column::with_capacity(FieldType::Long, before);
    c.pad_with_nulls(before);
    c
}

/// Appends `rows` of `theirs` (or as many nulls) to the optional column `mine`, which
/// holds `before` rows (none yet: all null).
fn extend_optional(
    mine: &mut Option<Column>,
    before: usize,
    theirs: Option<&Column>,
    rows: Range<usize>,
) -> Result<(), CoreError> {
    match (mine, theirs) {
        (None, None) => Ok(()),
        (Some(mine), None) => {
            mine.pad_with_nulls(mine.len() + rows.len());
            Ok(())
        }
        (mine, Some(theirs)) => mine
            .get_or_insert_with(|| nulls_before(before))
            .extend_from(theirs, rows),
    }
}

impl EventBatch {
    pub fn new(
        schema: Arc<Schema>,
        tstart: Vec<Timestamp>,
        tend: Option<Column>,
        columns: Vec<Column>,
    ) -> Result<EventBatch, CoreError> {
        let n = tstart.len();
        if columns.len() != schema.len() {
            return Err(CoreError::Shape(format!(
                "{} columns for {} schema fields",
                columns.len(),
                schema.len()
            )));
        }
        for (column, field) in columns.iter().zip(schema.fields()) {
            if column.field_type() != field.ty {
                return Err(CoreError::Shape(format!(
                    "column {:?} holds {} values, the schema says {}",
                    field.name,
                    column.field_type(),
                    field.ty
                )));
            }
            if column.len() != n {
                return Err(CoreError::Shape(format!(
                    "column {:?} has {} values for {n} events",
                    field.name,
                    column.len()
                )));
            }
        }
        if let Some(tend) = &tend {
            let ColumnData::Long(ends) = tend.data() else {
                return Err(CoreError::Shape("tend must be a LONG column".into()));
            };
            if tend.len() != n {
                return Err(CoreError::Shape(format!(
                    "{} tend values for {n} events",
                    tend.len()
                )));
            }
            for (row, &end) in tend.valid_rows(0..n).zip(ends) {
                let start = tstart[row];
                if end < start {
                    return Err(CoreError::EndBeforeStart {
                        row,
                        tstart: start,
                        tend: end,
                    });
                }
            }
        }
        Ok(EventBatch {
            schema,
            tstart,
            tend: unless_all_null(tend),
            positions: None,
            columns,
        })
    }

    /// The same events with their stream positions (`positions`: a LONG column, one value
    /// or null per event, none negative).
    pub fn with_positions(mut self, positions: Column) -> Result<EventBatch, CoreError> {
        let ColumnData::Long(values) = positions.data() else {
            return Err(CoreError::Shape("positions must be a LONG column".into()));
        };
        if positions.len() != self.len() {
            return Err(CoreError::Shape(format!(
                "{} positions for {} events",
                positions.len(),
                self.len()
            )));
        }
        if let Some(negative) = values.iter().find(|&&p| p < 0) {
            return Err(CoreError::Shape(format!("a negative position {negative}")));
        }
        self.positions = unless_all_null(Some(positions)).map(Box::new);
        Ok(self)
    }

    /// The same events numbered `first`, `first + 1`, … in row order: a batch as the
    /// stream took it.
    pub fn with_positions_from(mut self, first: u64) -> EventBatch {
        assert!(
            first.saturating_add(self.len() as u64) <= MAX_POSITION,
            "positions from {first} past the largest"
        );
        self.positions = (!self.is_empty()).then(|| Box::new(numbered(first, self.len())));
        self
    }

    /// The same events without positions.
    pub fn without_positions(mut self) -> EventBatch {
        self.positions = None;
        self
    }

    /// Each event's stream position, when the batch carries them.
    pub fn positions(&self) -> Option<&Column> {
        self.positions.as_deref()
    }

    /// The stream position of the event at `row`, when the batch carries one for it.
    pub fn position_at(&self, row: usize) -> Option<u64> {
        long_at(self.positions.as_deref()?, row).map(|p| p as u64)
    }

    pub fn empty(schema: Arc<Schema>) -> EventBatch {
        BatchBuilder::new(schema, 0).finish()
    }

    /// The same events under `schema`, which extends theirs ([`Schema::extends`]): the
    /// fields added since the batch was built read as null.
    pub fn widened(self, schema: Arc<Schema>) -> Result<EventBatch, CoreError> {
        if !schema.extends(&self.schema) {
            return Err(CoreError::Shape(format!(
                "schema {} does not extend the batch's {}",
                schema, self.schema
            )));
        }
        let n = self.len();
        let mut columns = self.columns;
        columns.extend(
            schema.fields()[columns.len()..]
                .iter()
                .map(|f| Column::nulls(f.ty, n)),
        );
        let positions = self.positions;
        let mut widened = EventBatch::new(schema, self.tstart, self.tend, columns)?;
        widened.positions = positions;
        Ok(widened)
    }

    pub fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    pub fn len(&self) -> usize {
        self.tstart.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tstart.is_empty()
    }

    pub fn tstart(&self) -> &[Timestamp] {
        &self.tstart
    }

    pub fn tend(&self) -> Option<&Column> {
        self.tend.as_ref()
    }

    pub fn tend_at(&self, row: usize) -> Option<Timestamp> {
        long_at(self.tend.as_ref()?, row)
    }

    /// The schema, `tstart`, `tend` and the field columns, to hand on without a copy (the
    /// positions, which the caller reads first if it needs them, are left behind).
    pub fn into_parts(self) -> (Arc<Schema>, Vec<Timestamp>, Option<Column>, Vec<Column>) {
        (self.schema, self.tstart, self.tend, self.columns)
    }

    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    pub fn column(&self, index: usize) -> &Column {
        &self.columns[index]
    }

    /// The smallest and largest `tstart`, or `None` for an empty batch.
    pub fn time_range(&self) -> Option<(Timestamp, Timestamp)> {
        let min = *self.tstart.iter().min()?;
        let max = *self.tstart.iter().max()?;
        Some((min, max))
    }

    /// Whether `tstart` never decreases.
    pub fn is_sorted(&self) -> bool {
        self.tstart.windows(2).all(|w| w[0] <= w[1])
    }

    /// A builder holding this batch's events, to append more (no copy).
    pub fn into_builder(self) -> BatchBuilder {
        BatchBuilder {
            schema: self.schema,
            tstart: self.tstart,
            tend: self.tend,
            positions: self.positions.map(|p| *p),
            columns: self.columns,
        }
    }

    /// The field values of one event in schema order (allocates; for output and tests).
    pub fn row(&self, row: usize) -> Vec<Value> {
        self.columns.iter().map(|c| c.value(row)).collect()
    }

    /// Approximate heap bytes held by the batch.
    /// Gives back what the batch's vectors reserved beyond what they hold: a batch built
    /// row by row may hold twice its bytes, which [`EventBatch::heap_bytes`] (what budgets
    /// count) does not see.
    pub fn shrink_to_fit(&mut self) {
        self.tstart.shrink_to_fit();
        self.columns
            .iter_mut()
            .chain(&mut self.tend)
            .chain(self.positions.as_deref_mut())
            .for_each(Column::shrink_to_fit);
    }

    pub fn heap_bytes(&self) -> usize {
        self.tstart.len() * 8
            + self.tend.as_ref().map_or(0, Column::heap_bytes)
            + self.positions.as_deref().map_or(0, Column::heap_bytes)
            + self.columns.iter().map(Column::heap_bytes).sum::<usize>()
    }

    /// The events at `indices`, in that order.
    pub fn take(&self, indices: &[u32]) -> EventBatch {
        EventBatch {
            schema: self.schema.clone(),
            tstart: indices.iter().map(|&i| self.tstart[i as usize]).collect(),
            tend: unless_all_null(self.tend.as_ref().map(|t| t.take(indices))),
            positions: unless_all_null(self.positions.as_deref().map(|p| p.take(indices)))
                .map(Box::new),
            columns: self.columns.iter().map(|c| c.take(indices)).collect(),
        }
    }

    /// The events at `rows` (ascending; `None` for all) with only the fields at `fields`,
    /// described by `schema` (this schema projected to `fields`). Copies only what it returns.
    pub fn select(
        &self,
        rows: Option<&[u32]>,
        fields: &[usize],
        schema: Arc<Schema>,
    ) -> EventBatch {
        let pick = |c: &Column| match rows {
            None => c.clone(),
            Some(rows) => c.take(rows),
        };
        EventBatch {
            schema,
            tstart: match rows {
                None => self.tstart.clone(),
                Some(rows) => rows.iter().map(|&i| self.tstart[i as usize]).collect(),
            },
            tend: unless_all_null(self.tend.as_ref().map(pick)),
            positions: unless_all_null(self.positions.as_deref().map(pick)).map(Box::new),
            columns: fields.iter().map(|&f| pick(&self.columns[f])).collect(),
        }
    }

    /// Like [`EventBatch::select`], but consumes the batch: when every row is kept, the
    /// columns move instead of being copied (a field asked for twice is copied once).
    pub fn into_selected(
        self,
        rows: Option<&[u32]>,
        fields: &[usize],
        schema: Arc<Schema>,
    ) -> EventBatch {
        if rows.is_some() {
            return self.select(rows, fields, schema);
        }
        let mut columns = self.columns;
        let picked = fields
            .iter()
            .map(|&f| {
                if fields.iter().filter(|&&g| g == f).count() > 1 {
                    columns[f].clone()
                } else {
                    let placeholder = Column::empty(columns[f].field_type());
                    std::mem::replace(&mut columns[f], placeholder)
                }
            })
            .collect();
        EventBatch {
            schema,
            tstart: self.tstart,
            tend: self.tend,
            positions: self.positions,
            columns: picked,
        }
    }

    /// The same events with only the fields at `fields` (positions in this batch's schema).
    pub fn project(&self, fields: &[usize]) -> EventBatch {
        EventBatch {
            schema: Arc::new(self.schema.project(fields)),
            tstart: self.tstart.clone(),
            tend: self.tend.clone(),
            positions: self.positions.clone(),
            columns: fields.iter().map(|&i| self.columns[i].clone()).collect(),
        }
    }

    /// A stable sort by `tstart`: events with equal timestamps keep their order.
    pub fn sorted(self) -> EventBatch {
        if self.is_sorted() {
            return self;
        }
        let mut order: Vec<u32> = (0..self.len() as u32).collect();
        order.sort_by_key(|&i| self.tstart[i as usize]);
        self.take(&order)
    }
}

/// Builds an [`EventBatch`] row by row or from ranges of other batches of the same schema.
#[derive(Debug)]
pub struct BatchBuilder {
    schema: Arc<Schema>,
    tstart: Vec<Timestamp>,
    tend: Option<Column>,
    positions: Option<Column>,
    columns: Vec<Column>,
}

impl BatchBuilder {
    pub fn new(schema: Arc<Schema>, capacity: usize) -> BatchBuilder {
        let columns = schema
            .fields()
            .iter()
            .map(|f| Column::with_capacity(f.ty, capacity))
            .collect();
        BatchBuilder {
            schema,
            tstart: Vec::with_capacity(capacity),
            tend: None,
            positions: None,
            columns,
        }
    }

    /// A builder with room for `events` events and, in field `i`, `values(i)` values: for
    /// a batch built from others, whose sparse columns hold the values of their valid rows
    /// only. [`BatchBuilder::new`] reserves a value for every event in every field, which
    /// for a stream of a thousand fields an event names one of is a thousand times what
    /// the values take.
    pub fn with_capacities(
        schema: Arc<Schema>,
        events: usize,
        values: impl Fn(usize) -> usize,
    ) -> BatchBuilder {
        let columns = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| Column::with_capacity(f.ty, values(i).min(events)))
            .collect();
        BatchBuilder {
            schema,
            tstart: Vec::with_capacity(events),
            tend: None,
            positions: None,
            columns,
        }
    }

    pub fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    pub fn len(&self) -> usize {
        self.tstart.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tstart.is_empty()
    }

    /// Appends one event; `values` are in schema order. On error nothing is appended.
    pub fn push_row(
        &mut self,
        tstart: Timestamp,
        tend: Option<Timestamp>,
        values: &[Value],
    ) -> Result<(), CoreError> {
        let row = self.len();
        if values.len() != self.schema.len() {
            return Err(CoreError::Shape(format!(
                "event {row} has {} values for {} fields",
                values.len(),
                self.schema.len()
            )));
        }
        if let Some(end) = tend.filter(|&end| end < tstart) {
            return Err(CoreError::EndBeforeStart {
                row,
                tstart,
                tend: end,
            });
        }
        for (value, field) in values.iter().zip(self.schema.fields()) {
            if let Some(found) = value.field_type().filter(|&t| t != field.ty) {
                return Err(CoreError::TypeMismatch {
                    row,
                    field: field.name.clone(),
                    expected: field.ty,
                    found: found.to_string(),
                });
            }
        }
        for (i, value) in values.iter().enumerate() {
            // Types were checked above, so only the 4 GiB string limit can fail here: the
            // columns already pushed are cut back so that nothing is stored half.
            if let Err(message) = self.columns[i].push_value(value) {
                for column in &mut self.columns[..i] {
                    column.truncate(row);
                }
                return Err(CoreError::InvalidEvent { row, message });
            }
        }
        self.tstart.push(tstart);
        self.push_tend(tend);
        if let Some(positions) = &mut self.positions {
            positions.push_null();
        }
        Ok(())
    }

    fn push_tend(&mut self, tend: Option<Timestamp>) {
        match (tend, &mut self.tend) {
            (None, None) => {}
            (None, Some(column)) => column.push_null(),
            (Some(end), column) => {
                let before = self.tstart.len() - 1;
                let column = column.get_or_insert_with(|| {
                    let mut c = Column::with_capacity(FieldType::Long, before + 1);
                    for _ in 0..before {
                        c.push_null();
                    }
                    c
                });
                // Cannot fail: the column is LONG.
                let _ = column.push_value(&Value::Long(end));
            }
        }
    }

    /// Appends `rows` of `batch`, which must have this builder's schema.
    pub fn extend_from(&mut self, batch: &EventBatch, rows: Range<usize>) -> Result<(), CoreError> {
        let before = self.len();
        self.extend_events(batch, rows.clone())?;
        extend_optional(
            &mut self.positions,
            before,
            batch.positions.as_deref(),
            rows,
        )
    }

    /// Appends `rows` of `batch` (which carries no positions) numbered from `first`: the
    /// positions its stream gave it, `first` being its first event's.
    pub fn extend_numbered(
        &mut self,
        batch: &EventBatch,
        rows: Range<usize>,
        first: u64,
    ) -> Result<(), CoreError> {
        debug_assert!(batch.positions.is_none(), "a numbered batch numbered again");
        let before = self.len();
        self.extend_events(batch, rows.clone())?;
        let numbers = numbered(first + rows.start as u64, rows.len());
        extend_optional(&mut self.positions, before, Some(&numbers), 0..rows.len())
    }

    /// Appends `rows` of `batch`: all but the positions, which the caller adds.
    fn extend_events(&mut self, batch: &EventBatch, rows: Range<usize>) -> Result<(), CoreError> {
        // Pointers first: a merge calls this for every run, and a 1,000-field schema
        // compared by name each time was a few per cent of it.
        if !Arc::ptr_eq(&batch.schema, &self.schema)
            && batch.schema.fields() != self.schema.fields()
        {
            return Err(CoreError::Shape("batches of different schemas".into()));
        }
        let before = self.len();
        for (mine, theirs) in self.columns.iter_mut().zip(&batch.columns) {
            mine.extend_from(theirs, rows.clone())?;
        }
        self.tstart.extend_from_slice(&batch.tstart[rows.clone()]);
        extend_optional(&mut self.tend, before, batch.tend.as_ref(), rows)
    }

    /// Appends each of `runs` (rows of batches of this builder's schema) in order, a column
    /// at a time: a merge of interleaved sources makes runs of a row or a few, and copying
    /// them event by event touched every column of every source for each one (a cache miss
    /// per field per event in a 1,000-field stream).
    pub fn extend_from_runs(
        &mut self,
        runs: &[(&EventBatch, Range<usize>)],
    ) -> Result<(), CoreError> {
        for (batch, rows) in runs {
            if !Arc::ptr_eq(&batch.schema, &self.schema)
                && batch.schema.fields() != self.schema.fields()
            {
                return Err(CoreError::Shape("batches of different schemas".into()));
            }
            if rows.start > rows.end || rows.end > batch.len() {
                return Err(CoreError::Shape(format!(
                    "rows {rows:?} of a batch of {}",
                    batch.len()
                )));
            }
        }
        let before = self.len();
        let added: usize = runs.iter().map(|(_, rows)| rows.len()).sum();
        for (i, mine) in self.columns.iter_mut().enumerate() {
            for (batch, rows) in runs {
                mine.extend_from(&batch.columns[i], rows.clone())?;
            }
        }
        for (batch, rows) in runs {
            self.tstart.extend_from_slice(&batch.tstart[rows.clone()]);
        }
        let mut before_run = before;
        for (batch, rows) in runs {
            extend_optional(
                &mut self.tend,
                before_run,
                batch.tend.as_ref(),
                rows.clone(),
            )?;
            let theirs = batch.positions.as_deref();
            extend_optional(&mut self.positions, before_run, theirs, rows.clone())?;
            before_run += rows.len();
        }
        assert!(
            self.columns
                .iter()
                .chain(&self.tend)
                .chain(&self.positions)
                .all(|c| c.len() == before + added)
                && self.tstart.len() == before + added,
            "columns of a batch built from runs"
        );
        Ok(())
    }

    /// Keeps the first `rows` events (undoes a failed [`BatchBuilder::extend_from`]).
    pub fn truncate(&mut self, rows: usize) {
        self.tstart.truncate(rows);
        for optional in self.tend.iter_mut().chain(&mut self.positions) {
            optional.truncate(rows);
        }
        for column in &mut self.columns {
            column.truncate(rows);
        }
    }

    pub fn finish(self) -> EventBatch {
        let n = self.tstart.len();
        assert!(
            self.columns
                .iter()
                .chain(&self.tend)
                .chain(&self.positions)
                .all(|c| c.len() == n),
            "a column of a built batch is not {n} events long"
        );
        EventBatch {
            schema: self.schema,
            tstart: self.tstart,
            tend: self.tend,
            positions: unless_all_null(self.positions).map(Box::new),
            columns: self.columns,
        }
    }
}

/// The LONG value of `column` at `row`, unless null.
fn long_at(column: &Column, row: usize) -> Option<i64> {
    match (column.value_index(row), column.data()) {
        (Some(i), ColumnData::Long(v)) => Some(v[i]),
        _ => None,
    }
}

/// The LONG column `first`, `first + 1`, … of `len` values.
fn numbered(first: u64, len: usize) -> Column {
    let values: Vec<i64> = (0..len as u64).map(|i| (first + i) as i64).collect();
    // Cannot fail: a dense column of the values given.
    Column::new(ColumnData::Long(values), None).unwrap_or_else(|_| Column::empty(FieldType::Long))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Field;

    fn schema() -> Arc<Schema> {
        Arc::new(
            Schema::new(vec![
                Field::new("S", FieldType::String),
                Field::new("P", FieldType::Double),
            ])
            .unwrap(),
        )
    }

    #[test]
    fn builds_and_refuses() {
        let mut b = BatchBuilder::new(schema(), 4);
        b.push_row(5, None, &[Value::String("a".into()), Value::Double(1.0)])
            .unwrap();
        b.push_row(3, Some(4), &[Value::Null, Value::Double(2.0)])
            .unwrap();
        let err = b.push_row(1, None, &[Value::Long(1), Value::Double(2.0)]);
        assert!(matches!(err, Err(CoreError::TypeMismatch { row: 2, .. })));
        let err = b.push_row(9, Some(8), &[Value::Null, Value::Null]);
        assert!(matches!(err, Err(CoreError::EndBeforeStart { .. })));
        assert!(b.push_row(1, None, &[Value::Null]).is_err());
        let batch = b.finish();
        assert_eq!(batch.len(), 2);
        assert_eq!(batch.tend_at(0), None);
        assert_eq!(batch.tend_at(1), Some(4));
        assert_eq!(batch.time_range(), Some((3, 5)));

        let sorted = batch.clone().sorted();
        assert_eq!(sorted.tstart(), &[3, 5]);
        assert_eq!(sorted.row(0), vec![Value::Null, Value::Double(2.0)]);
        assert_eq!(sorted.tend_at(0), Some(4));

        let projected = sorted.project(&[1]);
        assert_eq!(projected.schema().fields()[0].name, "P");
        assert_eq!(projected.row(1), vec![Value::Double(1.0)]);
    }

    #[test]
    fn new_checks_shape() {
        let s = schema();
        let ok = EventBatch::new(
            s.clone(),
            vec![1],
            None,
            vec![
                Column::with_capacity(FieldType::String, 1),
                Column::with_capacity(FieldType::Double, 1),
            ],
        );
        assert!(ok.is_err(), "columns shorter than tstart must be refused");
        let wrong_type = EventBatch::new(
            s,
            vec![],
            None,
            vec![
                Column::empty(FieldType::Long),
                Column::empty(FieldType::Double),
            ],
        );
        assert!(wrong_type.is_err());
    }

    #[test]
    fn select_copies_or_moves_the_same_events() {
        let mut b = BatchBuilder::new(schema(), 3);
        for (t, s) in [(1, "a"), (2, "b"), (3, "c")] {
            b.push_row(
                t,
                Some(t + 1),
                &[Value::String(s.into()), Value::Double(t as f64)],
            )
            .unwrap();
        }
        let batch = b.finish();
        let twice = Arc::new(batch.schema().project(&[1, 0, 1]));
        let copied = batch.select(None, &[1, 0, 1], twice.clone());
        let moved = batch.clone().into_selected(None, &[1, 0, 1], twice.clone());
        assert_eq!(copied, moved);
        assert_eq!(
            moved.row(2),
            vec![
                Value::Double(3.0),
                Value::String("c".into()),
                Value::Double(3.0)
            ]
        );
        let some = batch.into_selected(Some(&[0, 2]), &[0], Arc::new(schema().project(&[0])));
        assert_eq!(some.tstart(), &[1, 3]);
        assert_eq!(some.tend_at(1), Some(4));
        assert_eq!(some.row(1), vec![Value::String("c".into())]);
    }

    #[test]
    fn sort_is_stable() {
        let s = Arc::new(Schema::parse_spec("V:LONG").unwrap());
        let mut b = BatchBuilder::new(s, 4);
        for (t, v) in [(2, 0), (1, 1), (2, 2), (1, 3)] {
            b.push_row(t, None, &[Value::Long(v)]).unwrap();
        }
        let sorted = b.finish().sorted();
        let values: Vec<_> = (0..4).map(|r| sorted.row(r)[0].clone()).collect();
        assert_eq!(
            values,
            vec![
                Value::Long(1),
                Value::Long(3),
                Value::Long(0),
                Value::Long(2)
            ]
        );
    }

    #[test]
    fn runs_copied_a_column_at_a_time_are_the_events_copied_one_run_at_a_time() {
        // Two batches, one with `tend` and nulls in both fields, one dense without `tend`.
        let mut a = BatchBuilder::new(schema(), 0);
        for i in 0..200i64 {
            let s = if i % 7 == 0 {
                Value::String(format!("a{i}"))
            } else {
                Value::Null
            };
            let p = if i % 3 == 0 {
                Value::Null
            } else {
                Value::Double(i as f64)
            };
            a.push_row(i, (i % 2 == 0).then_some(i + 1), &[s, p])
                .unwrap();
        }
        let mut b = BatchBuilder::new(schema(), 0);
        for i in 0..150i64 {
            b.push_row(
                i,
                None,
                &[Value::String(format!("b{i}")), Value::Double(-(i as f64))],
            )
            .unwrap();
        }
        // `a` as a stream numbered it, `b` as stored before streams had positions.
        let (a, b) = (a.finish().with_positions_from(1000), b.finish());
        let runs = [
            (&b, 0..1),
            (&a, 0..1),
            (&a, 1..70),
            (&b, 1..2),
            (&b, 2..2),
            (&a, 70..200),
            (&b, 2..150),
        ];
        let mut by_run = BatchBuilder::new(schema(), 0);
        for (batch, rows) in &runs {
            by_run.extend_from(batch, rows.clone()).unwrap();
        }
        let mut by_column = BatchBuilder::new(schema(), 0);
        by_column.extend_from_runs(&runs).unwrap();
        let (want, got) = (by_run.finish(), by_column.finish());
        assert_eq!(got.len(), 350);
        assert_eq!(got.tstart(), want.tstart());
        for row in 0..want.len() {
            assert_eq!(got.row(row), want.row(row), "row {row}");
            assert_eq!(got.tend_at(row), want.tend_at(row), "tend of row {row}");
            assert_eq!(got.position_at(row), want.position_at(row), "row {row}");
        }
        assert_eq!(got.position_at(0), None, "b's first row has none");
        assert_eq!(got.position_at(1), Some(1000), "a's first row");
        assert_eq!(got.position_at(349), None);
        let other = BatchBuilder::new(Arc::new(Schema::parse_spec("V:LONG").unwrap()), 0).finish();
        let mut refused = BatchBuilder::new(schema(), 0);
        assert!(refused.extend_from_runs(&[(&other, 0..0)]).is_err());
        assert!(refused.extend_from_runs(&[(&a, 190..201)]).is_err());
    }

    #[test]
    fn positions_follow_their_events_through_sorts_selections_and_builders() {
        let s = Arc::new(Schema::parse_spec("V:LONG").unwrap());
        let mut b = BatchBuilder::new(s.clone(), 4);
        for (t, v) in [(30, 0), (10, 1), (20, 2), (10, 3)] {
            b.push_row(t, None, &[Value::Long(v)]).unwrap();
        }
        let appended = b.finish();
        assert_eq!(appended.positions(), None, "appended events have none yet");
        let numbered = appended.clone().with_positions_from(7);
        let sorted = numbered.clone().sorted();
        let pairs: Vec<_> = (0..4)
            .map(|r| (sorted.row(r)[0].clone(), sorted.position_at(r)))
            .collect();
        assert_eq!(
            pairs,
            vec![
                (Value::Long(1), Some(8)),
                (Value::Long(3), Some(10)),
                (Value::Long(2), Some(9)),
                (Value::Long(0), Some(7)),
            ]
        );
        let picked = sorted.select(Some(&[1, 3]), &[0], s.clone());
        assert_eq!(
            (picked.position_at(0), picked.position_at(1)),
            (Some(10), Some(7))
        );

        // Numbered while built from a batch, after events without a position.
        let mut builder = BatchBuilder::new(s.clone(), 0);
        builder.extend_from(&appended, 0..1).unwrap();
        builder.extend_numbered(&appended, 2..4, 100).unwrap();
        builder.extend_numbered(&appended, 0..1, 200).unwrap();
        builder.push_row(40, None, &[Value::Long(9)]).unwrap();
        let built = builder.finish();
        let positions: Vec<_> = (0..5).map(|r| built.position_at(r)).collect();
        assert_eq!(positions, vec![None, Some(102), Some(103), Some(200), None]);
        let mut cut = built.clone().into_builder();
        cut.truncate(2);
        assert_eq!(cut.finish().positions().map(Column::len), Some(2));
        assert_eq!(built.positions().map(Column::len), Some(5));
        assert_eq!(built.without_positions().positions(), None);

        let negative = Column::new(ColumnData::Long(vec![0, -1, 2, 3]), None).unwrap();
        assert!(appended.clone().with_positions(negative).is_err());
        let short = Column::new(ColumnData::Long(vec![0]), None).unwrap();
        assert!(appended.with_positions(short).is_err());
    }
}

//! Typed, nullable columns. A column holds the values of its valid rows only, in row order,
//! and a validity bitmap: a null costs one bit (issue 42: a stream of 1,000 fields of which
//! each event names a few must not pay a value per absent field).

use std::borrow::Cow;
use std::ops::Range;

use crate::bitmap::Bitmap;
use crate::summary::Num;
use crate::{CoreError, FieldType, Value, ValueRef};

/// Variable-length values (STRING or BYTES) as one byte buffer plus offsets, so that a batch
/// of strings costs two allocations rather than one per event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarBinary {
    offsets: Vec<u32>,
    data: Vec<u8>,
}

impl Default for VarBinary {
    fn default() -> Self {
        VarBinary {
            offsets: vec![0],
            data: Vec::new(),
        }
    }
}

impl VarBinary {
    pub fn with_capacity(items: usize, bytes: usize) -> VarBinary {
        let mut offsets = Vec::with_capacity(items + 1);
        offsets.push(0);
        VarBinary {
            offsets,
            data: Vec::with_capacity(bytes),
        }
    }

    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> &[u8] {
        &self.data[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// Total bytes of all values.
    pub fn data_len(&self) -> usize {
        self.data.len()
    }

    pub fn data(&self) -> &[u8] {
        &self.data
    }

    pub fn offsets(&self) -> &[u32] {
        &self.offsets
    }

    /// The offsets (`len() + 1`, from 0, non-decreasing) and the bytes they index.
    pub fn into_parts(self) -> (Vec<u32>, Vec<u8>) {
        (self.offsets, self.data)
    }

    /// Value lengths, in order.
    pub fn lengths(&self) -> impl Iterator<Item = u32> + '_ {
        self.offsets.windows(2).map(|w| w[1] - w[0])
    }

    pub fn push(&mut self, value: &[u8]) -> Result<(), CoreError> {
        let end = u32::try_from(self.data.len() + value.len())
            .map_err(|_| CoreError::Shape("more than 4 GiB of strings in one column".into()))?;
        self.data.extend_from_slice(value);
        self.offsets.push(end);
        Ok(())
    }

    fn truncate(&mut self, len: usize) {
        self.offsets.truncate(len + 1);
        self.data.truncate(self.offsets[len] as usize);
    }

    fn extend_from(&mut self, other: &VarBinary, rows: Range<usize>) -> Result<(), CoreError> {
        let start = other.offsets[rows.start] as usize;
        let end = other.offsets[rows.end] as usize;
        let base = self.data.len() as i64 - start as i64;
        if self.data.len() + (end - start) > u32::MAX as usize {
            return Err(CoreError::Shape(
                "more than 4 GiB of strings in one column".into(),
            ));
        }
        self.data.extend_from_slice(&other.data[start..end]);
        self.offsets.extend(
            other.offsets[rows.start + 1..=rows.end]
                .iter()
                .map(|&o| (o as i64 + base) as u32),
        );
        Ok(())
    }

    /// Rebuilds from parts read off disk; refuses offsets that do not describe `data`.
    pub fn from_parts(offsets: Vec<u32>, data: Vec<u8>) -> Result<VarBinary, CoreError> {
        let valid = offsets.first() == Some(&0)
            && offsets.windows(2).all(|w| w[0] <= w[1])
            && offsets.last().map(|&l| l as usize) == Some(data.len());
        if !valid {
            return Err(CoreError::Shape("string offsets are inconsistent".into()));
        }
        Ok(VarBinary { offsets, data })
    }
}

/// The values of one column; which variant is fixed by the field's [`FieldType`].
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnData {
    Boolean(Vec<bool>),
    Byte(Vec<i8>),
    Short(Vec<i16>),
    Integer(Vec<i32>),
    Long(Vec<i64>),
    Float(Vec<f32>),
    Double(Vec<f64>),
    /// Always valid UTF-8 (checked when the column is built or decoded).
    String(VarBinary),
    Bytes(VarBinary),
}

/// Runs `$body` with `$v` bound to the inner vector of any fixed-width variant, and
/// `$var` to the inner [`VarBinary`] of STRING and BYTES.
macro_rules! dispatch {
    ($data:expr, $v:ident => $fixed:expr, $var:ident => $varlen:expr) => {
        match $data {
            ColumnData::Boolean($v) => $fixed,
            ColumnData::Byte($v) => $fixed,
            ColumnData::Short($v) => $fixed,
            ColumnData::Integer($v) => $fixed,
            ColumnData::Long($v) => $fixed,
            ColumnData::Float($v) => $fixed,
            ColumnData::Double($v) => $fixed,
            ColumnData::String($var) | ColumnData::Bytes($var) => $varlen,
        }
    };
}

impl ColumnData {
    pub fn empty(ty: FieldType, capacity: usize) -> ColumnData {
        match ty {
            FieldType::Boolean => ColumnData::Boolean(Vec::with_capacity(capacity)),
            FieldType::Byte => ColumnData::Byte(Vec::with_capacity(capacity)),
            FieldType::Short => ColumnData::Short(Vec::with_capacity(capacity)),
            FieldType::Integer => ColumnData::Integer(Vec::with_capacity(capacity)),
            FieldType::Long => ColumnData::Long(Vec::with_capacity(capacity)),
            FieldType::Float => ColumnData::Float(Vec::with_capacity(capacity)),
            FieldType::Double => ColumnData::Double(Vec::with_capacity(capacity)),
            FieldType::String => ColumnData::String(VarBinary::with_capacity(capacity, 0)),
            FieldType::Bytes => ColumnData::Bytes(VarBinary::with_capacity(capacity, 0)),
        }
    }

    pub fn field_type(&self) -> FieldType {
        match self {
            ColumnData::Boolean(_) => FieldType::Boolean,
            ColumnData::Byte(_) => FieldType::Byte,
            ColumnData::Short(_) => FieldType::Short,
            ColumnData::Integer(_) => FieldType::Integer,
            ColumnData::Long(_) => FieldType::Long,
            ColumnData::Float(_) => FieldType::Float,
            ColumnData::Double(_) => FieldType::Double,
            ColumnData::String(_) => FieldType::String,
            ColumnData::Bytes(_) => FieldType::Bytes,
        }
    }

    pub fn len(&self) -> usize {
        dispatch!(self, v => v.len(), b => b.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn truncate(&mut self, len: usize) {
        dispatch!(self, v => v.truncate(len), b => b.truncate(len))
    }

    /// The value at index `i` (allocates for strings; meant for output and tests).
    pub fn value(&self, i: usize) -> Value {
        match self {
            ColumnData::Boolean(v) => Value::Boolean(v[i]),
            ColumnData::Byte(v) => Value::Byte(v[i]),
            ColumnData::Short(v) => Value::Short(v[i]),
            ColumnData::Integer(v) => Value::Integer(v[i]),
            ColumnData::Long(v) => Value::Long(v[i]),
            ColumnData::Float(v) => Value::Float(v[i]),
            ColumnData::Double(v) => Value::Double(v[i]),
            ColumnData::String(b) => Value::String(String::from_utf8_lossy(b.get(i)).into_owned()),
            ColumnData::Bytes(b) => Value::Bytes(b.get(i).to_vec()),
        }
    }

    /// The value at index `i` as a number for aggregation; `None` for STRING and BYTES.
    pub fn num(&self, i: usize) -> Option<Num> {
        Some(match self {
            ColumnData::Boolean(v) => Num::I(i64::from(v[i])),
            ColumnData::Byte(v) => Num::I(i64::from(v[i])),
            ColumnData::Short(v) => Num::I(i64::from(v[i])),
            ColumnData::Integer(v) => Num::I(i64::from(v[i])),
            ColumnData::Long(v) => Num::I(v[i]),
            ColumnData::Float(v) => Num::F(f64::from(v[i])),
            ColumnData::Double(v) => Num::F(v[i]),
            ColumnData::String(_) | ColumnData::Bytes(_) => return None,
        })
    }

    /// Appends `other`'s values at `range`; the types must match.
    fn extend_from(&mut self, other: &ColumnData, range: Range<usize>) -> Result<(), CoreError> {
        match (self, other) {
            (ColumnData::Boolean(a), ColumnData::Boolean(b)) => a.extend_from_slice(&b[range]),
            (ColumnData::Byte(a), ColumnData::Byte(b)) => a.extend_from_slice(&b[range]),
            (ColumnData::Short(a), ColumnData::Short(b)) => a.extend_from_slice(&b[range]),
            (ColumnData::Integer(a), ColumnData::Integer(b)) => a.extend_from_slice(&b[range]),
            (ColumnData::Long(a), ColumnData::Long(b)) => a.extend_from_slice(&b[range]),
            (ColumnData::Float(a), ColumnData::Float(b)) => a.extend_from_slice(&b[range]),
            (ColumnData::Double(a), ColumnData::Double(b)) => a.extend_from_slice(&b[range]),
            (ColumnData::String(a), ColumnData::String(b))
            | (ColumnData::Bytes(a), ColumnData::Bytes(b)) => a.extend_from(b, range)?,
            (a, b) => {
                return Err(CoreError::Shape(format!(
                    "cannot append a {} column to a {} column",
                    b.field_type(),
                    a.field_type()
                )))
            }
        }
        Ok(())
    }

    /// The values at `indices`, in that order; `Some` index picks a value, `None` puts the
    /// type's default (how [`Column::dense`] fills null slots).
    fn pick(&self, indices: impl ExactSizeIterator<Item = Option<usize>> + Clone) -> ColumnData {
        fn pick<T: Copy + Default>(
            v: &[T],
            indices: impl Iterator<Item = Option<usize>>,
        ) -> Vec<T> {
            indices
                .map(|i| i.map_or_else(T::default, |i| v[i]))
                .collect()
        }
        match self {
            ColumnData::Boolean(v) => ColumnData::Boolean(pick(v, indices)),
            ColumnData::Byte(v) => ColumnData::Byte(pick(v, indices)),
            ColumnData::Short(v) => ColumnData::Short(pick(v, indices)),
            ColumnData::Integer(v) => ColumnData::Integer(pick(v, indices)),
            ColumnData::Long(v) => ColumnData::Long(pick(v, indices)),
            ColumnData::Float(v) => ColumnData::Float(pick(v, indices)),
            ColumnData::Double(v) => ColumnData::Double(pick(v, indices)),
            ColumnData::String(b) | ColumnData::Bytes(b) => {
                let get = |i: Option<usize>| i.map_or(&[][..], |i| b.get(i));
                let bytes = indices.clone().map(|i| get(i).len()).sum();
                let mut out = VarBinary::with_capacity(indices.len(), bytes);
                for i in indices {
                    out.data.extend_from_slice(get(i));
                    out.offsets.push(out.data.len() as u32);
                }
                if matches!(self, ColumnData::String(_)) {
                    ColumnData::String(out)
                } else {
                    ColumnData::Bytes(out)
                }
            }
        }
    }

    /// Approximate heap bytes, for memtable accounting.
    pub fn heap_bytes(&self) -> usize {
        dispatch!(self, v => std::mem::size_of_val(v.as_slice()), b => b.data.len() + b.offsets.len() * 4)
    }

    /// Gives back what the vectors reserved beyond what they hold.
    pub fn shrink_to_fit(&mut self) {
        dispatch!(self, v => v.shrink_to_fit(), b => {
            b.data.shrink_to_fit();
            b.offsets.shrink_to_fit();
        })
    }
}

/// A nullable column: the values of its valid rows, in row order, and a validity bitmap
/// (`None` means no nulls). A null costs its bit and nothing in the values.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// One value per valid row: `data.len()` is the number of set bits of `validity`, or
    /// the column's length when there is no bitmap.
    data: ColumnData,
    validity: Option<Bitmap>,
}

impl Column {
    pub fn empty(ty: FieldType) -> Column {
        Column::with_capacity(ty, 0)
    }

    pub fn with_capacity(ty: FieldType, capacity: usize) -> Column {
        Column {
            data: ColumnData::empty(ty, capacity),
            validity: None,
        }
    }

    /// `len` nulls: how a field added to a schema reads in events stored before it. Costs
    /// the bitmap only.
    pub fn nulls(ty: FieldType, len: usize) -> Column {
        Column {
            data: ColumnData::empty(ty, 0),
            validity: (len > 0).then(|| Bitmap::repeat(false, len)),
        }
    }

    /// A column from the values of its valid rows (in row order) and its validity (`None`:
    /// every row is valid); refuses a value count that is not the number of valid rows and
    /// STRING data that is not UTF-8.
    pub fn new(data: ColumnData, validity: Option<Bitmap>) -> Result<Column, CoreError> {
        if let Some(mask) = &validity {
            if mask.count_ones() != data.len() {
                return Err(CoreError::Shape(format!(
                    "{} values for {} valid rows of {}",
                    data.len(),
                    mask.count_ones(),
                    mask.len()
                )));
            }
        }
        if let ColumnData::String(s) = &data {
            // One pass over the bytes, then each value boundary must fall between characters.
            let valid = std::str::from_utf8(s.data()).is_ok_and(|text| {
                s.offsets()
                    .iter()
                    .all(|&o| text.is_char_boundary(o as usize))
            });
            if !valid {
                return Err(CoreError::Shape("STRING column holds invalid UTF-8".into()));
            }
        }
        let validity = validity.filter(|m| m.count_zeros() > 0);
        Ok(Column { data, validity })
    }

    /// A column from one value per row (whatever stands at a null's slot is dropped): for
    /// formats that keep slots, as the wire form and Arrow arrays do. Refuses what
    /// [`Column::new`] refuses and a mask that is not one bit per value.
    pub fn from_dense(data: ColumnData, validity: Option<Bitmap>) -> Result<Column, CoreError> {
        let Some(mask) = validity else {
            return Column::new(data, None);
        };
        if mask.len() != data.len() {
            return Err(CoreError::Shape(format!(
                "validity mask has {} entries for {} values",
                mask.len(),
                data.len()
            )));
        }
        let valid = data.pick(ExactOnes::new(&mask));
        Column::new(valid, Some(mask))
    }

    /// The values of the valid rows only, in row order: index them with
    /// [`Column::value_index`] or walk them with [`Column::value_indices`] /
    /// [`Column::valid_rows`]; [`Column::dense`] gives one slot per row.
    pub fn data(&self) -> &ColumnData {
        &self.data
    }

    /// Which rows are valid; `None` when all are.
    pub fn validity(&self) -> Option<&Bitmap> {
        self.validity.as_ref()
    }

    /// The values of the valid rows (as [`Column::data`]) and the validity (`None`: no
    /// nulls), to hand on without a copy.
    pub fn into_parts(self) -> (ColumnData, Option<Bitmap>) {
        (self.data, self.validity)
    }

    /// One value per row, the type's default at nulls: for consumers that need slots
    /// (fixed-layout encoders, Arrow arrays). Copies only when the column has nulls; meant
    /// to be used a column at a time.
    pub fn dense(&self) -> Cow<'_, ColumnData> {
        match &self.validity {
            None => Cow::Borrowed(&self.data),
            Some(mask) => Cow::Owned(self.data.pick(ValueIndices::new(Some(mask), self.len()))),
        }
    }

    /// [`Column::dense`] of an owned column, with the validity.
    pub fn into_dense(self) -> (ColumnData, Option<Bitmap>) {
        match self.validity {
            None => (self.data, None),
            Some(mask) => {
                let dense = self.data.pick(ValueIndices::new(Some(&mask), mask.len()));
                (dense, Some(mask))
            }
        }
    }

    pub fn field_type(&self) -> FieldType {
        self.data.field_type()
    }

    pub fn len(&self) -> usize {
        self.validity.as_ref().map_or(self.data.len(), Bitmap::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_valid(&self, row: usize) -> bool {
        assert!(row < self.len(), "row {row} of {}", self.len());
        self.validity.as_ref().is_none_or(|m| m.get(row))
    }

    pub fn null_count(&self) -> usize {
        self.validity.as_ref().map_or(0, Bitmap::count_zeros)
    }

    pub fn heap_bytes(&self) -> usize {
        self.data.heap_bytes() + self.validity.as_ref().map_or(0, Bitmap::heap_bytes)
    }

    /// Gives back what the column reserved beyond what it holds (a column built by pushing
    /// may have reserved up to twice its values).
    pub fn shrink_to_fit(&mut self) {
        self.data.shrink_to_fit();
        if let Some(mask) = &mut self.validity {
            mask.shrink_to_fit();
        }
    }

    /// Where row `row`'s value is in [`Column::data`]; `None` for a null. Constant time,
    /// but a scan should walk [`Column::value_indices`].
    pub fn value_index(&self, row: usize) -> Option<usize> {
        match &self.validity {
            None => {
                assert!(row < self.data.len(), "row {row} of {}", self.data.len());
                Some(row)
            }
            Some(mask) => mask.get(row).then(|| mask.rank(row)),
        }
    }

    /// [`Column::value_index`] of every row, in row order, in constant time per row.
    pub fn value_indices(&self) -> impl ExactSizeIterator<Item = Option<usize>> + Clone + '_ {
        ValueIndices::new(self.validity.as_ref(), self.len())
    }

    /// The indices in [`Column::data`] of the values of `rows`: the values of a range of
    /// rows are one range of values.
    pub fn value_range(&self, rows: Range<usize>) -> Range<usize> {
        assert!(rows.start <= rows.end && rows.end <= self.len());
        match &self.validity {
            None => rows,
            Some(mask) => mask.rank(rows.start)..mask.rank(rows.end),
        }
    }

    /// The valid rows among `rows`, ascending: zipped with [`Column::value_range`] of the
    /// same rows, each valid row with its value.
    pub fn valid_rows(&self, rows: Range<usize>) -> impl Iterator<Item = usize> + '_ {
        assert!(rows.start <= rows.end && rows.end <= self.len());
        let (all, some) = match &self.validity {
            None => (Some(rows), None),
            Some(mask) => (None, Some(mask.ones(rows))),
        };
        all.into_iter().flatten().chain(some.into_iter().flatten())
    }

    /// Every row's value, in row order (allocates for strings; meant for output and tests).
    pub fn values(&self) -> impl Iterator<Item = Value> + '_ {
        self.value_indices()
            .map(|i| i.map_or(Value::Null, |i| self.data.value(i)))
    }

    /// The value at `row` (allocates for strings; meant for output and tests).
    pub fn value(&self, row: usize) -> Value {
        self.value_index(row)
            .map_or(Value::Null, |i| self.data.value(i))
    }

    /// The value at `row` as a number for aggregation; `None` for null and for STRING/BYTES.
    pub fn num(&self, row: usize) -> Option<Num> {
        self.value_index(row).and_then(|i| self.data.num(i))
    }

    /// Appends a value of this column's type, or null. On a type mismatch nothing is
    /// appended and the error names the type that was found.
    pub fn push_value(&mut self, value: &Value) -> Result<(), String> {
        self.push_ref(value.borrowed())
    }

    /// [`Column::push_value`] of a borrowed value.
    pub fn push_ref(&mut self, value: ValueRef<'_>) -> Result<(), String> {
        match (&mut self.data, value) {
            (_, ValueRef::Null) => {
                self.push_null();
                return Ok(());
            }
            (ColumnData::Boolean(v), ValueRef::Boolean(x)) => v.push(x),
            (ColumnData::Byte(v), ValueRef::Byte(x)) => v.push(x),
            (ColumnData::Short(v), ValueRef::Short(x)) => v.push(x),
            (ColumnData::Integer(v), ValueRef::Integer(x)) => v.push(x),
            (ColumnData::Long(v), ValueRef::Long(x)) => v.push(x),
            (ColumnData::Float(v), ValueRef::Float(x)) => v.push(x),
            (ColumnData::Double(v), ValueRef::Double(x)) => v.push(x),
            (ColumnData::String(b), ValueRef::String(x)) => {
                b.push(x.as_bytes()).map_err(|e| e.to_string())?
            }
            (ColumnData::Bytes(b), ValueRef::Bytes(x)) => b.push(x).map_err(|e| e.to_string())?,
            (_, other) => {
                return Err(other
                    .field_type()
                    .map_or("null".to_string(), |t| t.to_string()))
            }
        }
        if let Some(mask) = &mut self.validity {
            mask.push(true);
        }
        // Per value, so checked in debug builds only (a rank is up to 64 popcounts).
        debug_assert!(self.holds_its_values());
        Ok(())
    }

    /// Appends nulls until the column holds `len` rows: bits, no values.
    pub fn pad_with_nulls(&mut self, len: usize) {
        if len > self.len() {
            let rows = self.len();
            self.validity
                .get_or_insert_with(|| Bitmap::repeat(true, rows))
                .resize(len, false);
        }
    }

    /// Keeps the first `len` rows (no-op if the column is shorter).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len() {
            let values = self.value_range(0..len).end;
            self.data.truncate(values);
            if let Some(mask) = &mut self.validity {
                mask.truncate(len);
            }
            assert!(self.holds_its_values());
        }
    }

    pub fn push_null(&mut self) {
        let rows = self.len();
        self.validity
            .get_or_insert_with(|| Bitmap::repeat(true, rows))
            .push(false);
    }

    /// Appends `rows` of `other`, which must have the same type.
    pub fn extend_from(&mut self, other: &Column, rows: Range<usize>) -> Result<(), CoreError> {
        let before = (self.len(), self.data.len());
        let values = match &other.validity {
            None => rows.clone(),
            Some(mask) => {
                // A merge of interleaved sources copies runs of a row or a few, a column at
                // a time: in a sparse column most such runs hold no value and need no rank
                // (ranks were two thirds of compacting a 1,000-field stream).
                let count = mask.count_ones_in(rows.clone());
                let start = if count == 0 { 0 } else { mask.rank(rows.start) };
                start..start + count
            }
        };
        self.data.extend_from(&other.data, values.clone())?;
        match (&mut self.validity, &other.validity) {
            (None, None) => {}
            (Some(mask), None) => mask.resize(before.0 + rows.len(), true),
            (mask, Some(theirs)) => mask
                .get_or_insert_with(|| Bitmap::repeat(true, before.0))
                .extend_from(theirs, rows.clone()),
        }
        // The rows appended brought exactly their values (checked whole in debug builds:
        // a full count per call was a fifth of a merge of runs of one row).
        assert_eq!(self.len() - before.0, rows.len(), "rows appended");
        assert_eq!(self.data.len() - before.1, values.len(), "values appended");
        debug_assert!(self.holds_its_values());
        Ok(())
    }

    /// The rows at `indices`, in that order.
    pub fn take(&self, indices: &[u32]) -> Column {
        let Some(mask) = &self.validity else {
            let data = self.data.pick(indices.iter().map(|&i| Some(i as usize)));
            return Column {
                data,
                validity: None,
            };
        };
        let picked: Bitmap = indices.iter().map(|&i| mask.get(i as usize)).collect();
        let valid = indices.iter().filter(|&&i| mask.get(i as usize));
        let data = self.data.pick(
            valid
                .map(|&i| Some(mask.rank(i as usize)))
                .collect::<Vec<_>>()
                .into_iter(),
        );
        let column = Column {
            data,
            validity: Some(picked).filter(|m| m.count_zeros() > 0),
        };
        assert!(column.holds_its_values());
        column
    }

    /// The invariant: one value per valid row.
    fn holds_its_values(&self) -> bool {
        self.validity
            .as_ref()
            .is_none_or(|m| m.count_ones() == self.data.len())
    }
}

/// [`Column::value_index`] of each row of a column, walking its bitmap.
#[derive(Clone)]
struct ValueIndices<'a> {
    mask: Option<&'a Bitmap>,
    row: usize,
    rows: usize,
    /// Valid rows before `row`.
    next_value: usize,
}

impl<'a> ValueIndices<'a> {
    fn new(mask: Option<&'a Bitmap>, rows: usize) -> ValueIndices<'a> {
        ValueIndices {
            mask,
            row: 0,
            rows,
            next_value: 0,
        }
    }
}

impl Iterator for ValueIndices<'_> {
    type Item = Option<usize>;

    fn next(&mut self) -> Option<Option<usize>> {
        if self.row == self.rows {
            return None;
        }
        let valid = self.mask.is_none_or(|m| m.get(self.row));
        self.row += 1;
        Some(valid.then(|| {
            self.next_value += 1;
            self.next_value - 1
        }))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.rows - self.row;
        (left, Some(left))
    }
}

impl ExactSizeIterator for ValueIndices<'_> {}

/// The slot of every valid row of a dense column: picks a dense column's values down to the
/// valid rows' (what [`Column::from_dense`] keeps).
#[derive(Clone)]
struct ExactOnes<'a> {
    mask: &'a Bitmap,
    row: usize,
    left: usize,
}

impl<'a> ExactOnes<'a> {
    fn new(mask: &'a Bitmap) -> ExactOnes<'a> {
        ExactOnes {
            mask,
            row: 0,
            left: mask.count_ones(),
        }
    }
}

impl Iterator for ExactOnes<'_> {
    type Item = Option<usize>;

    fn next(&mut self) -> Option<Option<usize>> {
        if self.left == 0 {
            return None;
        }
        while !self.mask.get(self.row) {
            self.row += 1;
        }
        self.row += 1;
        self.left -= 1;
        Some(Some(self.row - 1))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for ExactOnes<'_> {}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_extend_take() {
        let mut a = Column::empty(FieldType::String);
        a.push_value(&Value::String("x".into())).unwrap();
        a.push_null();
        a.push_value(&Value::String("héllo".into())).unwrap();
        assert_eq!(a.push_value(&Value::Long(1)), Err("LONG".to_string()));
        assert_eq!(a.len(), 3);
        assert_eq!(a.null_count(), 1);

        let mut b = Column::empty(FieldType::String);
        b.push_value(&Value::String("first".into())).unwrap();
        b.extend_from(&a, 1..3).unwrap();
        assert_eq!(b.value(0), Value::String("first".into()));
        assert_eq!(b.value(1), Value::Null);
        assert_eq!(b.value(2), Value::String("héllo".into()));

        let t = b.take(&[2, 0]);
        assert_eq!(t.value(0), Value::String("héllo".into()));
        assert_eq!(t.validity(), None, "no nulls left after take");
        assert!(b
            .extend_from(&Column::empty(FieldType::Long), 0..0)
            .is_err());
    }

    #[test]
    fn refuses_bad_parts() {
        assert!(VarBinary::from_parts(vec![0, 3, 2], vec![0; 3]).is_err());
        assert!(VarBinary::from_parts(vec![1], vec![]).is_err());
        let bad_utf8 = VarBinary::from_parts(vec![0, 1], vec![0xff]).unwrap();
        assert!(Column::new(ColumnData::String(bad_utf8.clone()), None).is_err());
        assert!(Column::new(ColumnData::Bytes(bad_utf8), None).is_ok());
        let one_of_two: Bitmap = [true, false].into_iter().collect();
        assert!(Column::new(ColumnData::Long(vec![1, 2]), Some(one_of_two.clone())).is_err());
        assert!(Column::new(ColumnData::Long(vec![1]), Some(one_of_two.clone())).is_ok());
        assert!(Column::from_dense(ColumnData::Long(vec![1]), Some(one_of_two.clone())).is_err());
        let dense = Column::from_dense(ColumnData::Long(vec![1, 7]), Some(one_of_two)).unwrap();
        assert_eq!(dense.data(), &ColumnData::Long(vec![1]));
        assert_eq!(dense.value(1), Value::Null);
    }

    /// One step of building a column, as the model applies it too.
    #[derive(Debug, Clone)]
    enum Op {
        Push(Option<i64>),
        Pad(usize),
        Truncate(usize),
        /// Appends rows `start..start + len` of the column built so far (clamped).
        ExtendFrom(usize, usize),
        /// Keeps the rows at these positions (taken modulo the length).
        Take(Vec<usize>),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => proptest::option::weighted(0.3, any::<i64>()).prop_map(Op::Push),
            1 => (0usize..300).prop_map(Op::Pad),
            1 => (0usize..300).prop_map(Op::Truncate),
            1 => (0usize..300, 0usize..200).prop_map(|(s, l)| Op::ExtendFrom(s, l)),
            1 => proptest::collection::vec(0usize..1_000, 0..100).prop_map(Op::Take),
        ]
    }

    /// The value a model row holds, as the column of `ty` would hold it.
    fn typed(ty: FieldType, v: Option<i64>) -> Value {
        match v {
            None => Value::Null,
            Some(x) => match ty {
                FieldType::Boolean => Value::Boolean(x % 2 == 0),
                FieldType::Integer => Value::Integer(x as i32),
                FieldType::Double => Value::Double(x as f64),
                FieldType::String => Value::String(format!("v{x}")),
                _ => Value::Long(x),
            },
        }
    }

    fn check(column: &Column, model: &[Value]) -> Result<(), proptest::test_runner::TestCaseError> {
        use proptest::{prop_assert, prop_assert_eq};
        prop_assert_eq!(column.len(), model.len());
        let nulls = model.iter().filter(|v| v.is_null()).count();
        prop_assert_eq!(column.null_count(), nulls);
        for (row, want) in model.iter().enumerate() {
            prop_assert_eq!(&column.value(row), want, "row {}", row);
            prop_assert_eq!(column.is_valid(row), !want.is_null());
        }
        prop_assert_eq!(column.values().collect::<Vec<_>>(), model.to_vec());
        let mut valid = Column::empty(column.field_type());
        model
            .iter()
            .filter(|v| !v.is_null())
            .for_each(|v| valid.push_value(v).unwrap());
        prop_assert_eq!(column.data(), valid.data(), "the values of the valid rows");
        let dense = column.dense();
        prop_assert_eq!(dense.len(), model.len());
        for (row, want) in model.iter().enumerate() {
            let slot = dense.value(row);
            if want.is_null() {
                let default = match column.field_type() {
                    FieldType::Boolean => Value::Boolean(false),
                    FieldType::Integer => Value::Integer(0),
                    FieldType::Double => Value::Double(0.0),
                    FieldType::String => Value::String(String::new()),
                    _ => Value::Long(0),
                };
                prop_assert_eq!(slot, default);
            } else {
                prop_assert_eq!(&slot, want);
            }
        }
        let back = Column::from_dense(dense.into_owned(), column.validity().cloned()).unwrap();
        // (A bitmap without nulls, which truncating can leave, is dropped by `from_dense`.)
        prop_assert_eq!(back.data(), column.data());
        prop_assert_eq!(back.values().collect::<Vec<_>>(), model.to_vec());
        let first = column.value_range(0..model.len() / 2);
        prop_assert_eq!(
            first.len(),
            model[..model.len() / 2]
                .iter()
                .filter(|v| !v.is_null())
                .count()
        );
        let rows: Vec<usize> = column.valid_rows(0..model.len()).collect();
        let want: Vec<usize> = (0..model.len()).filter(|&r| !model[r].is_null()).collect();
        prop_assert_eq!(rows, want);
        let cap = model.len() / 8 + 64 + model.len() / 512;
        if nulls == model.len() {
            prop_assert!(
                column.heap_bytes() <= cap,
                "{} > {}",
                column.heap_bytes(),
                cap
            );
        }
        Ok(())
    }

    proptest::proptest! {
        #[test]
        fn a_column_agrees_with_a_vector_of_options(
            ty in proptest::sample::select(vec![
                FieldType::Boolean, FieldType::Integer, FieldType::Long,
                FieldType::Double, FieldType::String,
            ]),
            ops in proptest::collection::vec(op(), 0..40),
        ) {
            let mut column = Column::empty(ty);
            let mut model: Vec<Value> = Vec::new();
            for op in ops {
                match op {
                    Op::Push(v) => {
                        let value = typed(ty, v);
                        column.push_value(&value).unwrap();
                        model.push(value);
                    }
                    Op::Pad(n) => {
                        let len = model.len() + n;
                        column.pad_with_nulls(len);
                        model.resize(len, Value::Null);
                    }
                    Op::Truncate(len) => {
                        column.truncate(len);
                        model.truncate(len);
                    }
                    Op::ExtendFrom(start, len) => {
                        let start = start.min(model.len());
                        let end = (start + len).min(model.len());
                        let other = column.clone();
                        column.extend_from(&other, start..end).unwrap();
                        model.extend_from_within(start..end);
                    }
                    Op::Take(picks) => {
                        if model.is_empty() {
                            continue;
                        }
                        let indices: Vec<u32> =
                            picks.iter().map(|&p| (p % model.len()) as u32).collect();
                        column = column.take(&indices);
                        model = indices.iter().map(|&i| model[i as usize].clone()).collect();
                    }
                }
                check(&column, &model)?;
            }
        }
    }

    #[test]
    fn a_null_costs_a_bit() {
        let n = 1_000_000;
        // A bit, and the bitmap's rank index (a u32 per 512 rows), and a few words more.
        let bits = n / 8 + n / 128 + 1_024;
        let nulls = Column::nulls(FieldType::Double, n);
        assert!(nulls.heap_bytes() <= bits, "{}", nulls.heap_bytes());
        let mut one = Column::empty(FieldType::Double);
        one.push_value(&Value::Double(1.5)).unwrap();
        one.pad_with_nulls(n);
        assert!(one.heap_bytes() <= bits, "{}", one.heap_bytes());
        assert_eq!((one.len(), one.null_count()), (n, n - 1));
        assert_eq!(one.value(0), Value::Double(1.5));
        let mut strings = Column::empty(FieldType::String);
        strings.pad_with_nulls(n - 1);
        strings.push_value(&Value::String("x".into())).unwrap();
        assert!(strings.heap_bytes() <= bits, "{}", strings.heap_bytes());
        assert_eq!(strings.value(n - 1), Value::String("x".into()));
    }
}

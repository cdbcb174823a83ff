//! Typed, nullable columns. Null slots hold the type's default value so that every column is
//! a plain vector the codecs can take as a slice.

use std::ops::Range;

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

    fn push_default(&mut self) {
        dispatch!(self, v => v.push(Default::default()), b => {
            let end = *b.offsets.last().unwrap_or(&0);
            b.offsets.push(end);
        })
    }

    /// Approximate heap bytes, for memtable accounting.
    pub fn heap_bytes(&self) -> usize {
        dispatch!(self, v => std::mem::size_of_val(v.as_slice()), b => b.data.len() + b.offsets.len() * 4)
    }
}

/// A nullable column: values plus an optional validity mask (`None` means no nulls).
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    data: ColumnData,
    validity: Option<Vec<bool>>,
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

    /// `len` nulls: how a field added to a schema reads in events stored before it.
    pub fn nulls(ty: FieldType, len: usize) -> Column {
        let mut data = ColumnData::empty(ty, len);
        for _ in 0..len {
            data.push_default();
        }
        Column {
            data,
            validity: (len > 0).then(|| vec![false; len]),
        }
    }

    /// A column from values and an optional mask; refuses masks of the wrong length and
    /// STRING data that is not UTF-8.
    pub fn new(data: ColumnData, validity: Option<Vec<bool>>) -> Result<Column, CoreError> {
        if let Some(mask) = &validity {
            if mask.len() != data.len() {
                return Err(CoreError::Shape(format!(
                    "validity mask has {} entries for {} values",
                    mask.len(),
                    data.len()
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
        let validity = validity.filter(|m| m.iter().any(|valid| !valid));
        Ok(Column { data, validity })
    }

    pub fn data(&self) -> &ColumnData {
        &self.data
    }

    pub fn validity(&self) -> Option<&[bool]> {
        self.validity.as_deref()
    }

    /// The values and the validity (`None`: no nulls), to hand on without a copy.
    pub fn into_parts(self) -> (ColumnData, Option<Vec<bool>>) {
        (self.data, self.validity)
    }

    pub fn field_type(&self) -> FieldType {
        self.data.field_type()
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_valid(&self, row: usize) -> bool {
        self.validity.as_ref().is_none_or(|m| m[row])
    }

    pub fn null_count(&self) -> usize {
        self.validity
            .as_ref()
            .map_or(0, |m| m.iter().filter(|v| !**v).count())
    }

    pub fn heap_bytes(&self) -> usize {
        self.data.heap_bytes() + self.validity.as_ref().map_or(0, Vec::len)
    }

    /// The value at `row` (allocates for strings; meant for output and tests).
    pub fn value(&self, row: usize) -> Value {
        if !self.is_valid(row) {
            return Value::Null;
        }
        match &self.data {
            ColumnData::Boolean(v) => Value::Boolean(v[row]),
            ColumnData::Byte(v) => Value::Byte(v[row]),
            ColumnData::Short(v) => Value::Short(v[row]),
            ColumnData::Integer(v) => Value::Integer(v[row]),
            ColumnData::Long(v) => Value::Long(v[row]),
            ColumnData::Float(v) => Value::Float(v[row]),
            ColumnData::Double(v) => Value::Double(v[row]),
            ColumnData::String(b) => {
                Value::String(String::from_utf8_lossy(b.get(row)).into_owned())
            }
            ColumnData::Bytes(b) => Value::Bytes(b.get(row).to_vec()),
        }
    }

    /// The value at `row` as a number for aggregation; `None` for null and for STRING/BYTES.
    pub fn num(&self, row: usize) -> Option<Num> {
        if !self.is_valid(row) {
            return None;
        }
        Some(match &self.data {
            ColumnData::Boolean(v) => Num::I(i64::from(v[row])),
            ColumnData::Byte(v) => Num::I(i64::from(v[row])),
            ColumnData::Short(v) => Num::I(i64::from(v[row])),
            ColumnData::Integer(v) => Num::I(i64::from(v[row])),
            ColumnData::Long(v) => Num::I(v[row]),
            ColumnData::Float(v) => Num::F(f64::from(v[row])),
            ColumnData::Double(v) => Num::F(v[row]),
            ColumnData::String(_) | ColumnData::Bytes(_) => return None,
        })
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
        Ok(())
    }

    /// Appends nulls until the column holds `len` values.
    pub fn pad_with_nulls(&mut self, len: usize) {
        while self.len() < len {
            self.push_null();
        }
    }

    /// Keeps the first `len` rows (no-op if the column is shorter).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len() {
            self.data.truncate(len);
            if let Some(mask) = &mut self.validity {
                mask.truncate(len);
            }
        }
    }

    pub fn push_null(&mut self) {
        let len = self.len();
        self.data.push_default();
        self.validity
            .get_or_insert_with(|| vec![true; len])
            .push(false);
    }

    /// Appends `rows` of `other`, which must have the same type.
    pub fn extend_from(&mut self, other: &Column, rows: Range<usize>) -> Result<(), CoreError> {
        let before = self.len();
        match (&mut self.data, &other.data) {
            (ColumnData::Boolean(a), ColumnData::Boolean(b)) => {
                a.extend_from_slice(&b[rows.clone()])
            }
            (ColumnData::Byte(a), ColumnData::Byte(b)) => a.extend_from_slice(&b[rows.clone()]),
            (ColumnData::Short(a), ColumnData::Short(b)) => a.extend_from_slice(&b[rows.clone()]),
            (ColumnData::Integer(a), ColumnData::Integer(b)) => {
                a.extend_from_slice(&b[rows.clone()])
            }
            (ColumnData::Long(a), ColumnData::Long(b)) => a.extend_from_slice(&b[rows.clone()]),
            (ColumnData::Float(a), ColumnData::Float(b)) => a.extend_from_slice(&b[rows.clone()]),
            (ColumnData::Double(a), ColumnData::Double(b)) => a.extend_from_slice(&b[rows.clone()]),
            (ColumnData::String(a), ColumnData::String(b))
            | (ColumnData::Bytes(a), ColumnData::Bytes(b)) => a.extend_from(b, rows.clone())?,
            (a, b) => {
                return Err(CoreError::Shape(format!(
                    "cannot append a {} column to a {} column",
                    b.field_type(),
                    a.field_type()
                )))
            }
        }
        match (&mut self.validity, &other.validity) {
            (None, None) => {}
            (Some(mask), None) => mask.resize(self.data.len(), true),
            (mask, Some(theirs)) => {
                let mask = mask.get_or_insert_with(|| vec![true; before]);
                mask.extend_from_slice(&theirs[rows]);
            }
        }
        Ok(())
    }

    /// The rows at `indices`, in that order.
    pub fn take(&self, indices: &[u32]) -> Column {
        fn pick<T: Copy>(v: &[T], indices: &[u32]) -> Vec<T> {
            indices.iter().map(|&i| v[i as usize]).collect()
        }
        let data = match &self.data {
            ColumnData::Boolean(v) => ColumnData::Boolean(pick(v, indices)),
            ColumnData::Byte(v) => ColumnData::Byte(pick(v, indices)),
            ColumnData::Short(v) => ColumnData::Short(pick(v, indices)),
            ColumnData::Integer(v) => ColumnData::Integer(pick(v, indices)),
            ColumnData::Long(v) => ColumnData::Long(pick(v, indices)),
            ColumnData::Float(v) => ColumnData::Float(pick(v, indices)),
            ColumnData::Double(v) => ColumnData::Double(pick(v, indices)),
            ColumnData::String(b) | ColumnData::Bytes(b) => {
                let bytes = indices.iter().map(|&i| b.get(i as usize).len()).sum();
                let mut out = VarBinary::with_capacity(indices.len(), bytes);
                for &i in indices {
                    out.data.extend_from_slice(b.get(i as usize));
                    out.offsets.push(out.data.len() as u32);
                }
                if matches!(self.data, ColumnData::String(_)) {
                    ColumnData::String(out)
                } else {
                    ColumnData::Bytes(out)
                }
            }
        };
        let validity = self
            .validity
            .as_ref()
            .map(|m| pick(m, indices))
            .filter(|m| m.iter().any(|valid| !valid));
        Column { data, validity }
    }
}

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
        assert!(Column::new(ColumnData::Long(vec![1]), Some(vec![true, false])).is_err());
    }
}

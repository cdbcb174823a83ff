//! Result tables as an Arrow IPC stream (`application/vnd.apache.arrow.stream`), for pandas,
//! polars and DuckDB clients that read Arrow without parsing text.

use std::io::Write;
use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{ArrowError, DataType, Field, Schema};
use tidemark_core::Value;

use crate::Table;

/// The Arrow type of a column: from its first non-null value (integers as Int64, floats as
/// Float64); a column of nulls only, or of mixed kinds, is Utf8.
fn column_type(table: &Table, column: usize) -> DataType {
    let mut kinds = table.rows.iter().filter_map(|row| match row.get(column) {
        None | Some(Value::Null) => None,
        Some(Value::Boolean(_)) => Some(DataType::Boolean),
        Some(Value::Byte(_) | Value::Short(_) | Value::Integer(_) | Value::Long(_)) => {
            Some(DataType::Int64)
        }
        Some(Value::Float(_) | Value::Double(_)) => Some(DataType::Float64),
        Some(Value::String(_)) => Some(DataType::Utf8),
        Some(Value::Bytes(_)) => Some(DataType::Binary),
    });
    let Some(first) = kinds.next() else {
        return DataType::Utf8;
    };
    if kinds.all(|k| k == first) {
        first
    } else {
        DataType::Utf8
    }
}

fn build_column(table: &Table, column: usize, ty: &DataType) -> ArrayRef {
    let cells = table
        .rows
        .iter()
        .map(|row| row.get(column).unwrap_or(&Value::Null));
    match ty {
        DataType::Boolean => {
            let mut b = BooleanBuilder::new();
            cells.for_each(|v| {
                b.append_option(if let Value::Boolean(x) = v {
                    Some(*x)
                } else {
                    None
                })
            });
            Arc::new(b.finish())
        }
        DataType::Int64 => {
            let mut b = Int64Builder::new();
            cells.for_each(|v| {
                b.append_option(match v {
                    Value::Byte(x) => Some(i64::from(*x)),
                    Value::Short(x) => Some(i64::from(*x)),
                    Value::Integer(x) => Some(i64::from(*x)),
                    Value::Long(x) => Some(*x),
                    _ => None,
                })
            });
            Arc::new(b.finish())
        }
        DataType::Float64 => {
            let mut b = Float64Builder::new();
            cells.for_each(|v| {
                b.append_option(match v {
                    Value::Float(x) => Some(f64::from(*x)),
                    Value::Double(x) => Some(*x),
                    _ => None,
                })
            });
            Arc::new(b.finish())
        }
        DataType::Binary => {
            let mut b = BinaryBuilder::new();
            cells.for_each(|v| {
                b.append_option(if let Value::Bytes(x) = v {
                    Some(x)
                } else {
                    None
                })
            });
            Arc::new(b.finish())
        }
        _ => {
            let mut b = StringBuilder::new();
            cells.for_each(|v| match v {
                Value::Null => b.append_null(),
                Value::String(s) => b.append_value(s),
                other => b.append_value(other.to_string()),
            });
            Arc::new(b.finish())
        }
    }
}

/// Writes `table` as an Arrow IPC stream: its schema, one record batch, the end marker.
pub fn write_arrow_stream(table: &Table, out: impl Write) -> Result<(), ArrowError> {
    let types: Vec<DataType> = (0..table.columns.len())
        .map(|c| column_type(table, c))
        .collect();
    let schema = Arc::new(Schema::new(
        table
            .columns
            .iter()
            .zip(&types)
            .map(|(name, ty)| Field::new(name, ty.clone(), true))
            .collect::<Vec<_>>(),
    ));
    let columns = types
        .iter()
        .enumerate()
        .map(|(c, ty)| build_column(table, c, ty))
        .collect();
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    let mut writer = StreamWriter::try_new(out, &schema)?;
    writer.write(&batch)?;
    writer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type};
    use arrow_array::Array;
    use arrow_ipc::reader::StreamReader;

    #[test]
    fn tables_read_back_from_the_stream() {
        let table = Table {
            columns: vec![
                "ts".into(),
                "SYMBOL".into(),
                "max(P)".into(),
                "empty".into(),
            ],
            rows: vec![
                vec![
                    Value::Long(1),
                    Value::String("A".into()),
                    Value::Float(1.5),
                    Value::Null,
                ],
                vec![
                    Value::Long(2),
                    Value::Null,
                    Value::Double(-2.0),
                    Value::Null,
                ],
            ],
        };
        let mut bytes = Vec::new();
        write_arrow_stream(&table, &mut bytes).unwrap();
        let mut reader = StreamReader::try_new(&bytes[..], None).unwrap();
        let batch = reader.next().unwrap().unwrap();
        assert!(reader.next().is_none());
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.schema().field(2).name(), "max(P)");
        assert_eq!(
            batch.column(0).as_primitive::<Int64Type>().values(),
            &[1, 2]
        );
        let symbols = batch.column(1).as_string::<i32>();
        assert_eq!((symbols.value(0), symbols.is_null(1)), ("A", true));
        assert_eq!(
            batch.column(2).as_primitive::<Float64Type>().values(),
            &[1.5, -2.0]
        );
        assert_eq!(batch.column(3).null_count(), 2);
    }
}

use std::fmt;

use crate::FieldType;

/// One field value, row-wise. Batches store columns; `Value` is for input, output and tests.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Boolean(bool),
    Byte(i8),
    Short(i16),
    Integer(i32),
    Long(i64),
    Float(f32),
    Double(f64),
    String(String),
    Bytes(Vec<u8>),
}

impl Value {
    /// The type of a non-null value.
    pub fn field_type(&self) -> Option<FieldType> {
        Some(match self {
            Value::Null => return None,
            Value::Boolean(_) => FieldType::Boolean,
            Value::Byte(_) => FieldType::Byte,
            Value::Short(_) => FieldType::Short,
            Value::Integer(_) => FieldType::Integer,
            Value::Long(_) => FieldType::Long,
            Value::Float(_) => FieldType::Float,
            Value::Double(_) => FieldType::Double,
            Value::String(_) => FieldType::String,
            Value::Bytes(_) => FieldType::Bytes,
        })
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// Equality that treats floats bit-exactly (NaN equals NaN, -0.0 differs from 0.0),
    /// which is what "the stored value came back unchanged" means.
    pub fn same_as(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Float(a), Value::Float(b)) => a.to_bits() == b.to_bits(),
            (Value::Double(a), Value::Double(b)) => a.to_bits() == b.to_bits(),
            _ => self == other,
        }
    }

    /// The value as JSON. Non-finite floats, which JSON numbers cannot hold, become the
    /// strings "NaN", "Infinity" and "-Infinity" (the JSON decoder reads them back).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::Null => J::Null,
            Value::Boolean(b) => J::Bool(*b),
            Value::Byte(v) => J::from(*v),
            Value::Short(v) => J::from(*v),
            Value::Integer(v) => J::from(*v),
            Value::Long(v) => J::from(*v),
            // Through the shortest decimal of the f32, so 82.46f32 is 82.46, not
            // 82.45999908447266 (both read back as the same f32).
            Value::Float(v) => float_json(v.to_string().parse().unwrap_or(f64::from(*v))),
            Value::Double(v) => float_json(*v),
            Value::String(s) => J::String(s.clone()),
            Value::Bytes(b) => J::String(crate::json::encode_base64(b)),
        }
    }
}

/// One field value, borrowed: how a decoder hands a value to a column without owning
/// its text (see [`crate::Column::push_ref`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ValueRef<'a> {
    Null,
    Boolean(bool),
    Byte(i8),
    Short(i16),
    Integer(i32),
    Long(i64),
    Float(f32),
    Double(f64),
    String(&'a str),
    Bytes(&'a [u8]),
}

impl ValueRef<'_> {
    /// The type of a non-null value.
    pub fn field_type(self) -> Option<FieldType> {
        Some(match self {
            ValueRef::Null => return None,
            ValueRef::Boolean(_) => FieldType::Boolean,
            ValueRef::Byte(_) => FieldType::Byte,
            ValueRef::Short(_) => FieldType::Short,
            ValueRef::Integer(_) => FieldType::Integer,
            ValueRef::Long(_) => FieldType::Long,
            ValueRef::Float(_) => FieldType::Float,
            ValueRef::Double(_) => FieldType::Double,
            ValueRef::String(_) => FieldType::String,
            ValueRef::Bytes(_) => FieldType::Bytes,
        })
    }
}

impl Value {
    /// The value, borrowed.
    pub fn borrowed(&self) -> ValueRef<'_> {
        match self {
            Value::Null => ValueRef::Null,
            Value::Boolean(v) => ValueRef::Boolean(*v),
            Value::Byte(v) => ValueRef::Byte(*v),
            Value::Short(v) => ValueRef::Short(*v),
            Value::Integer(v) => ValueRef::Integer(*v),
            Value::Long(v) => ValueRef::Long(*v),
            Value::Float(v) => ValueRef::Float(*v),
            Value::Double(v) => ValueRef::Double(*v),
            Value::String(v) => ValueRef::String(v),
            Value::Bytes(v) => ValueRef::Bytes(v),
        }
    }
}

fn float_json(v: f64) -> serde_json::Value {
    match serde_json::Number::from_f64(v) {
        Some(n) => serde_json::Value::Number(n),
        None if v.is_nan() => serde_json::Value::String("NaN".into()),
        None if v > 0.0 => serde_json::Value::String("Infinity".into()),
        None => serde_json::Value::String("-Infinity".into()),
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Boolean(v) => write!(f, "{v}"),
            Value::Byte(v) => write!(f, "{v}"),
            Value::Short(v) => write!(f, "{v}"),
            Value::Integer(v) => write!(f, "{v}"),
            Value::Long(v) => write!(f, "{v}"),
            Value::Float(v) => write!(f, "{v}"),
            Value::Double(v) => write!(f, "{v}"),
            Value::String(v) => f.write_str(v),
            Value::Bytes(v) => f.write_str(&crate::json::encode_base64(v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_become_their_shortest_json_and_read_back_exactly() {
        for v in [82.46f32, 0.1, 1e-30, f32::MAX, -3.5, 16_777_217.0] {
            let json = Value::Float(v).to_json();
            assert_eq!(json.as_f64().map(|d| d as f32), Some(v), "{json}");
        }
        assert_eq!(Value::Float(82.46).to_json().to_string(), "82.46");
        assert_eq!(Value::Float(f32::NAN).to_json(), serde_json::json!("NaN"));
        assert_eq!(
            Value::Float(f32::NEG_INFINITY).to_json(),
            serde_json::json!("-Infinity")
        );
    }
}

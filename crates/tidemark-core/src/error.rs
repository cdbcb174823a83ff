use crate::FieldType;

/// Why a schema, a name or an event was refused. Every variant names the offending part so
/// that the message can be shown to the user as it is.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoreError {
    #[error("invalid {what} name {name:?}: {reason}")]
    InvalidName {
        what: &'static str,
        name: String,
        reason: &'static str,
    },
    #[error("invalid schema: {0}")]
    InvalidSchema(String),
    #[error("invalid partition {0}")]
    InvalidPartition(String),
    #[error("unknown field type {0:?} (expected one of BOOLEAN, BYTE, SHORT, INTEGER, LONG, FLOAT, DOUBLE, STRING, BYTES)")]
    UnknownType(String),
    #[error("field {0:?} is not in the stream's schema")]
    UnknownField(String),
    #[error("event {row}: field {field:?} is missing (use null for no value)")]
    MissingField { row: usize, field: String },
    #[error("event {row}: field {field:?} given twice")]
    DuplicateField { row: usize, field: String },
    #[error("event {row}: field {field:?} expects {expected}, got {found}")]
    TypeMismatch {
        row: usize,
        field: String,
        expected: FieldType,
        found: String,
    },
    #[error("event {row}: invalid timestamp: {reason}")]
    InvalidTimestamp { row: usize, reason: String },
    #[error("event {row}: tend {tend} is before tstart {tstart}")]
    EndBeforeStart { row: usize, tstart: i64, tend: i64 },
    #[error("event {row}: {message}")]
    InvalidEvent { row: usize, message: String },
    #[error("batch does not match its schema: {0}")]
    Shape(String),
}

//! Tidemark's errors as PostgreSQL errors: the one place a [`SqlError`] or a [`StoreError`]
//! (a write's) gets its SQLSTATE, so that clients branch on the codes they know.

use pgwire::error::{ErrorInfo, PgWireError};
use tidemark_sql::{BadValue, SqlError, Undefined};

use crate::error::MAX_MESSAGE_CHARS;
use crate::sql_write::SqlWriteError;
use crate::store::{StoreError, StoreErrorKind};

/// An `ERROR` with `code` (a SQLSTATE) and `message`, cut as every answer's message is.
pub fn user_error(code: &str, message: impl Into<String>) -> PgWireError {
    let message = message.into();
    let message = tidemark_core::truncated(&message, MAX_MESSAGE_CHARS).into_owned();
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_owned(),
        code.to_owned(),
        message,
    )))
}

/// A `FATAL` error: the connection closes once it is sent.
pub fn fatal(code: &str, message: impl Into<String>) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".to_owned(),
        code.to_owned(),
        message.into(),
    )))
}

pub fn from_sql(e: SqlError) -> PgWireError {
    let message = e.to_string();
    let code = match e {
        SqlError::Syntax(_) => "42601",
        SqlError::Unsupported(_) => "0A000",
        SqlError::Invalid(_) => "42000",
        SqlError::Undefined(Undefined::Column, _) => "42703",
        SqlError::Undefined(Undefined::Function, _) => "42883",
        SqlError::BadValue(BadValue::InvalidText, _) => "22P02",
        SqlError::BadValue(BadValue::DivisionByZero, _) => "22012",
        // numeric_value_out_of_range: psycopg's NumericValueOutOfRange.
        SqlError::OutOfRange(_) => "22003",
        SqlError::TooComplex(_) => "54001",
        SqlError::TooLarge(_) => "53200",
        SqlError::Timeout(_) => "57014",
        SqlError::Internal(_) => "XX000",
        SqlError::Engine(e) => store_code(&StoreError::from(e)),
    };
    user_error(code, message)
}

/// A store's refusal of a write, with the SQLSTATE its kind has.
pub fn from_store(e: StoreError) -> PgWireError {
    user_error(store_code(&e), e.message)
}

/// An SQL write's refusal: its statement's or the store's.
pub fn from_write(e: SqlWriteError) -> PgWireError {
    match e {
        SqlWriteError::Sql(e) => from_sql(e),
        SqlWriteError::Store(e) => from_store(e),
    }
}

fn store_code(e: &StoreError) -> &'static str {
    use StoreErrorKind as K;
    match e.kind {
        K::Invalid => "22023",
        K::TooLarge => "54000",
        K::UnknownStream => "42P01",
        K::StreamExists => "42P07",
        K::Conflict => "40001",
        // insufficient_resources: the client may retry shortly.
        K::Overloaded => "53000",
        K::Unavailable => "57P03",
        K::ReadOnly => "25006",
        // SQL errors carry neither; the session was authenticated at its start.
        K::Unauthorized => "28000",
        K::NotFound => "42704",
        // object_not_in_prerequisite_state: what was asked for is no longer there.
        K::Gone => "55000",
        K::Internal => "XX000",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(e: PgWireError) -> String {
        match e {
            PgWireError::UserError(info) => info.code,
            other => panic!("not a user error: {other}"),
        }
    }

    #[test]
    fn errors_get_the_sqlstate_clients_branch_on() {
        assert_eq!(code(from_sql(SqlError::Syntax("x".into()))), "42601");
        assert_eq!(
            code(from_sql(SqlError::Engine(
                tidemark_engine::EngineError::UnknownStream("s".into())
            ))),
            "42P01"
        );
        let long = "x".repeat(MAX_MESSAGE_CHARS * 2);
        match user_error("22000", long) {
            PgWireError::UserError(info) => {
                assert!(info.message.chars().count() <= MAX_MESSAGE_CHARS + 20)
            }
            other => panic!("{other}"),
        }
    }
}

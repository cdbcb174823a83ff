//! Rules for stream and field names. Stream names become parts of file paths and URLs, so
//! they are restricted more than a SQL identifier would be.

use crate::CoreError;

/// The longest stream or field name, in bytes.
pub const MAX_NAME_BYTES: usize = 200;

/// Checks a stream name: non-empty, at most [`MAX_NAME_BYTES`], no path separators, no
/// control characters, and not `.` or `..`.
pub fn validate_stream_name(name: &str) -> Result<(), CoreError> {
    validate(name, "stream")?;
    if name == "." || name == ".." {
        return Err(invalid(name, "stream", "'.' and '..' are reserved"));
    }
    if name.contains(['/', '\\']) {
        return Err(invalid(name, "stream", "must not contain '/' or '\\'"));
    }
    Ok(())
}

/// Checks a field name: like a stream name, and also not `tstart`/`tend` (the event's own
/// timestamps) and free of `,` and `:` (the separators of the schema spec syntax).
pub fn validate_field_name(name: &str) -> Result<(), CoreError> {
    validate(name, "field")?;
    if name.eq_ignore_ascii_case("tstart") || name.eq_ignore_ascii_case("tend") {
        return Err(invalid(
            name,
            "field",
            "tstart and tend are the event timestamps",
        ));
    }
    if name.contains([',', ':']) {
        return Err(invalid(name, "field", "must not contain ',' or ':'"));
    }
    if name.trim() != name {
        return Err(invalid(
            name,
            "field",
            "must not start or end with whitespace",
        ));
    }
    Ok(())
}

fn validate(name: &str, what: &'static str) -> Result<(), CoreError> {
    if name.is_empty() {
        return Err(invalid(name, what, "must not be empty"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(invalid(name, what, "longer than 200 bytes"));
    }
    if name.chars().any(char::is_control) {
        return Err(invalid(name, what, "must not contain control characters"));
    }
    Ok(())
}

fn invalid(name: &str, what: &'static str, reason: &'static str) -> CoreError {
    CoreError::InvalidName {
        what,
        name: name.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_names() {
        assert!(validate_stream_name("demo_event_store").is_ok());
        assert!(validate_stream_name("größe.v2-ü").is_ok());
        for bad in ["", ".", "..", "a/b", "a\\b", "a\nb", "a\0b"] {
            assert!(validate_stream_name(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_stream_name(&"x".repeat(201)).is_err());
    }

    #[test]
    fn field_names() {
        assert!(validate_field_name("LASTTRADEPRICE").is_ok());
        for bad in ["", "TStart", "tend", "a,b", "a:b", " a", "a\t"] {
            assert!(validate_field_name(bad).is_err(), "{bad:?} accepted");
        }
    }
}

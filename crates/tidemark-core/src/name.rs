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

/// Checks the name of a stream's consumer (`Command::CommitPosition`): a name like a new
/// stream's, since it becomes part of URLs and of what a listing shows.
pub fn validate_consumer_name(name: &str) -> Result<(), CoreError> {
    validate(name, "consumer")?;
    if name.contains(['/', '\\']) {
        return Err(invalid(name, "consumer", "must not contain '/' or '\\'"));
    }
    validate_visible(name, "consumer")
}

/// Checks the name of a stream about to be created: [`validate_stream_name`], and also no
/// invisible formatting characters (zero-width, bidirectional controls) and Unicode NFC, so
/// that two names that look alike are the same name. Only creation checks this: streams
/// created before the rule existed still open and replay.
pub fn validate_new_stream_name(name: &str) -> Result<(), CoreError> {
    validate_stream_name(name)?;
    validate_visible(name, "stream")
}

/// Checks the fields of a schema for a stream about to be created: also refuses `ts`, the
/// name queries give the time column (see [`validate_new_stream_name`] for why only then).
pub fn validate_new_field_name(name: &str) -> Result<(), CoreError> {
    validate_field_name(name)?;
    if name.eq_ignore_ascii_case("ts") {
        return Err(invalid(
            name,
            "field",
            "ts is the name of the time column in queries",
        ));
    }
    validate_visible(name, "field")
}

fn validate_visible(name: &str, what: &'static str) -> Result<(), CoreError> {
    if name.chars().any(is_format_character) {
        return Err(invalid(
            name,
            what,
            "must not contain invisible formatting characters (zero-width or bidirectional controls)",
        ));
    }
    if !unicode_normalization::is_nfc(name) {
        return Err(invalid(
            name,
            what,
            "must be in Unicode normal form C (NFC): compose its accents",
        ));
    }
    Ok(())
}

/// Unicode's general category Cf (format): characters that change how text around them is
/// shown without being seen themselves. The list of Unicode 15.1.
fn is_format_character(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061C}'
            | '\u{06DD}'
            | '\u{070F}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08E2}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0001}'
            | '\u{E0020}'..='\u{E007F}'
    )
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
        name: crate::truncated(name, 64).into_owned(),
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
    fn new_names_are_visible_and_composed() {
        assert!(validate_new_stream_name("größe.v2-ü").is_ok());
        for bad in ["ab\u{200B}c", "\u{202E}kcit", "a\u{FEFF}", "u\u{0308}ber"] {
            assert!(validate_stream_name(bad).is_ok(), "{bad:?}: old rule");
            assert!(validate_new_stream_name(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_field_name("ts").is_ok());
        for bad in ["ts", "TS", "p\u{200D}rice"] {
            assert!(validate_new_field_name(bad).is_err(), "{bad:?} accepted");
        }
        let long = "x".repeat(10_000);
        let message = validate_new_stream_name(&long).unwrap_err().to_string();
        assert!(message.len() < 300, "{message}");
    }

    #[test]
    fn field_names() {
        assert!(validate_field_name("LASTTRADEPRICE").is_ok());
        for bad in ["", "TStart", "tend", "a,b", "a:b", " a", "a\t"] {
            assert!(validate_field_name(bad).is_err(), "{bad:?} accepted");
        }
    }
}

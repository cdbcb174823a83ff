//! Bearer tokens, the same for every transport: HTTP routes (`http::access`) and the binary
//! protocol's AUTH frame compare a presented token with the configured ones here.

use tidemark_core::secret::secret_matches;

/// Whether `presented` is the configured token (never when none is configured), in time
/// independent of where they differ ([`tidemark_core::secret`]).
pub fn token_matches(presented: &str, expected: &Option<String>) -> bool {
    expected
        .as_ref()
        .is_some_and(|expected| secret_matches(presented.as_bytes(), expected.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_exactly() {
        let expected = Some("0123456789abcdef".to_string());
        assert!(token_matches("0123456789abcdef", &expected));
        assert!(!token_matches("0123456789abcde", &expected));
        assert!(!token_matches("0123456789abcdefg", &expected));
        assert!(!token_matches("1123456789abcdef", &expected));
        assert!(!token_matches("", &None));
    }
}

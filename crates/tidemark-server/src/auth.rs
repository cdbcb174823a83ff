//! Bearer tokens, the same for every transport: HTTP routes (`http::access`) and the binary
//! protocol's AUTH frame compare a presented token with the configured ones here.

/// Compares in time independent of where the strings differ, so that response times do
/// not reveal a token's prefix.
pub fn token_matches(presented: &str, expected: &Option<String>) -> bool {
    let Some(expected) = expected else {
        return false;
    };
    let (a, b) = (presented.as_bytes(), expected.as_bytes());
    let mut diff = u8::from(a.len() != b.len());
    for (i, &byte) in b.iter().enumerate() {
        diff |= byte ^ a.get(i).copied().unwrap_or(0);
    }
    diff == 0
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

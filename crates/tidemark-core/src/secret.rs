//! Comparing a presented secret (a token, a cluster's node-to-node secret) with the one
//! configured, in time independent of where they differ, so that response times do not
//! reveal a secret's prefix. Every door that checks one (HTTP, the binary protocol, the
//! PostgreSQL wire, the node-to-node transport) compares here.

/// Whether `presented` is exactly `expected`. Its time depends on `expected`'s length
/// only (a secret's length is not what it protects).
pub fn secret_matches(presented: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(presented.len() != expected.len());
    for (i, &byte) in expected.iter().enumerate() {
        diff |= byte ^ presented.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_exactly() {
        assert!(secret_matches(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!secret_matches(b"0123456789abcdeF", b"0123456789abcdef"));
        assert!(!secret_matches(b"0123456789abcde", b"0123456789abcdef"));
        assert!(!secret_matches(b"0123456789abcdef0", b"0123456789abcdef"));
        assert!(!secret_matches(b"", b"0123456789abcdef"));
        // A presented secret padded with zero bytes is not the secret.
        assert!(!secret_matches(b"0123456789abcdef\0", b"0123456789abcdef"));
    }
}

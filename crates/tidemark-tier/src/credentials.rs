//! Access keys to a bucket: what the caller gives [`crate::Bucket::open`] and what the AWS
//! shared files hold. Its own module so that the bucket and the shared-file reader both
//! name it without importing each other.
//!
//! Must never know about: where keys are found or how a request is signed.

/// Access keys (and a session token with temporary ones).
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret, in logs or errors.
        write!(f, "Credentials({}, ***)", self.access_key_id)
    }
}

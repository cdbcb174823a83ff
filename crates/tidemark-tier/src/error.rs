//! What can go wrong with a bucket, in the terms a caller acts on.

/// A failed bucket operation.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// The configuration cannot name a bucket (a bad URL, no credentials...): fix it, do not
    /// retry.
    #[error("tier configuration: {0}")]
    Config(String),
    /// The bucket refused the credentials or their signature: fix them, do not retry.
    #[error("the bucket refused the credentials: {0}")]
    Denied(String),
    /// No such object.
    #[error("object {0} is not in the bucket")]
    NotFound(String),
    /// The bucket stored something other than what was sent, or answered with other bytes
    /// than asked for: never taken as done.
    #[error("object {name}: {what}")]
    Mismatch { name: String, what: String },
    /// The bucket could not be reached or failed (down, slow, 5xx): worth retrying later.
    #[error("the bucket did not answer: {0}")]
    Unavailable(String),
}

impl TierError {
    /// Whether the same request may succeed later.
    pub fn is_transient(&self) -> bool {
        matches!(self, TierError::Unavailable(_) | TierError::Mismatch { .. })
    }

    pub(crate) fn from_store(name: &str, error: object_store::Error) -> TierError {
        match error {
            object_store::Error::NotFound { .. } => TierError::NotFound(name.to_string()),
            object_store::Error::PermissionDenied { source, .. }
            | object_store::Error::Unauthenticated { source, .. } => {
                TierError::Denied(source.to_string())
            }
            object_store::Error::UnknownConfigurationKey { .. }
            | object_store::Error::InvalidPath { .. } => TierError::Config(error.to_string()),
            other => {
                let text = other.to_string();
                // The AWS client reports S3's refusals of a signature or key as a generic
                // error carrying S3's code: those are not worth a retry.
                if [
                    "SignatureDoesNotMatch",
                    "InvalidAccessKeyId",
                    "AccessDenied",
                ]
                .iter()
                .any(|code| text.contains(code))
                {
                    TierError::Denied(text)
                } else {
                    TierError::Unavailable(text)
                }
            }
        }
    }
}

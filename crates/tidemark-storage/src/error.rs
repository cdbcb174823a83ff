use std::path::PathBuf;

/// What went wrong reading or writing a Tidemark file.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not what Tidemark wrote: a checksum mismatch, a bad length, an
    /// impossible value. Nothing from the damaged part is returned.
    #[error("corrupt {what}: {detail}")]
    Corrupt { what: String, detail: String },
    #[error("cannot encode: {0}")]
    Encode(String),
    /// Bytes that live in a bucket (a tiered segment) could not be fetched: the bucket is
    /// down, slow or refuses the credentials. Worth trying again later; nothing was
    /// answered from partial data.
    #[error("{what} is in the bucket, which did not answer: {detail}")]
    Unavailable { what: String, detail: String },
}

impl StorageError {
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StorageError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub fn corrupt(what: impl Into<String>, detail: impl Into<String>) -> Self {
        StorageError::Corrupt {
            what: what.into(),
            detail: detail.into(),
        }
    }
}

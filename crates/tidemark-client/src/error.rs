use std::time::Duration;

/// Why a call failed. Nothing of a refused append was stored unless the variant says the
/// outcome is unknown.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The server is overloaded; the request was not stored. Retry after the hint.
    #[error("the server asks to retry in {retry_after:?}: {message}")]
    TryLater {
        retry_after: Duration,
        message: String,
    },
    /// The server refused the request; `code` is the protocol's error code or the HTTP
    /// API's error code.
    #[error("refused ({code}): {message}")]
    Refused { code: String, message: String },
    /// The connection broke with the request in flight: it may or may not have been stored.
    #[error("the connection was lost with the request in flight (it may or may not be stored)")]
    OutcomeUnknown,
    /// The server's answer is not what the protocol says.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The producer's buffer is full and the producer does not block.
    #[error("the buffer is full (non-blocking mode): retry later")]
    WouldBlock,
    /// A batch could not be built (an event does not fit the schema).
    #[error("invalid event: {0}")]
    Invalid(#[from] tidemark_core::CoreError),
    #[error("the producer is closed")]
    Closed,
}

impl ClientError {
    /// Whether sending the same request again may succeed (and cannot store it twice).
    pub fn is_retryable(&self) -> bool {
        matches!(self, ClientError::TryLater { .. })
    }
}

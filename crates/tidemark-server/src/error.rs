//! Every refusal the HTTP API gives: a status, a stable machine-readable code and a message
//! for people, as `{"error": code, "message": ...}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tidemark_cluster::{ClusterError, FailureKind};
use tidemark_core::CoreError;
use tidemark_engine::EngineError;

/// The longest message an error answer carries, in characters.
pub const MAX_MESSAGE_CHARS: usize = 500;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Sent as `Retry-After` (rounded up to whole seconds, as HTTP wants) and as
    /// `retryAfterMs` in the body.
    pub retry_after_ms: Option<u32>,
}

impl ApiError {
    /// An error whose message is cut to [`MAX_MESSAGE_CHARS`]: messages may quote input
    /// (a name, an expression), and an answer must not echo a whole request back.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        let message = message.into();
        let message = match tidemark_core::truncated(&message, MAX_MESSAGE_CHARS) {
            std::borrow::Cow::Borrowed(_) => message,
            std::borrow::Cow::Owned(cut) => cut,
        };
        ApiError {
            status,
            code,
            message,
            retry_after_ms: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn overloaded(message: impl Into<String>, retry_after_ms: u32) -> ApiError {
        ApiError {
            retry_after_ms: Some(retry_after_ms),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "overloaded", message)
        }
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the request body exceeds the limit of {limit} bytes"),
        )
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// Maps an engine error; `retry_after_ms` is the hint for overload.
    pub fn from_engine(e: EngineError, retry_after_ms: u32) -> ApiError {
        let message = e.to_string();
        match e {
            EngineError::UnknownStream(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_stream", message)
            }
            EngineError::StreamExists { .. } => {
                ApiError::new(StatusCode::CONFLICT, "stream_exists", message)
            }
            EngineError::Invalid(_)
            | EngineError::TooLate { .. }
            | EngineError::TooFarAhead { .. }
            | EngineError::ValueTooLong { .. }
            | EngineError::InvalidRequest(_) => ApiError::bad_request(message),
            EngineError::BatchTooLarge { .. } => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
            }
            EngineError::Overloaded(_) => ApiError::overloaded(message, retry_after_ms),
            EngineError::LogFailed(_) | EngineError::Closed => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
            }
            EngineError::Locked(_)
            | EngineError::Storage(_)
            | EngineError::FlushFailed(_)
            | EngineError::InvalidOptions(_) => ApiError::internal(message),
        }
    }
}

impl ApiError {
    /// Maps a cluster error: refusals before proposing as the engine's, committed failures
    /// by their kind, no leader or quorum as 503 with a retry hint.
    pub fn from_cluster(e: ClusterError, retry_after_ms: u32) -> ApiError {
        let message = e.to_string();
        match e {
            ClusterError::Engine(e) => ApiError::from_engine(e, retry_after_ms),
            ClusterError::Failed { kind, .. } => match kind {
                FailureKind::UnknownStream => {
                    ApiError::new(StatusCode::NOT_FOUND, "unknown_stream", message)
                }
                FailureKind::StreamExists => {
                    ApiError::new(StatusCode::CONFLICT, "stream_exists", message)
                }
                FailureKind::Invalid | FailureKind::OutOfOrder => ApiError::bad_request(message),
            },
            ClusterError::Invalid(_) => ApiError::bad_request(message),
            ClusterError::Membership(_) => {
                ApiError::new(StatusCode::CONFLICT, "membership", message)
            }
            ClusterError::Unavailable(_) | ClusterError::NotLeader => ApiError {
                retry_after_ms: Some(retry_after_ms),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
            },
            ClusterError::Config(_) | ClusterError::Io(_) => ApiError::internal(message),
        }
    }
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> ApiError {
        ApiError::bad_request(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({"error": self.code, "message": self.message});
        if let Some(ms) = self.retry_after_ms {
            body["retryAfterMs"] = ms.into();
        }
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The body was left unread: the connection cannot carry another request, and
            // saying so keeps clients from reusing it.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(ms) = self.retry_after_ms {
            let seconds = ms.div_ceil(1000).max(1);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

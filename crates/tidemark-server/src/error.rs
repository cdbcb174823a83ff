//! Every refusal the HTTP API gives: a status, a stable machine-readable code and a message
//! for people, as `{"error": code, "message": ...}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tidemark_cluster::ClusterError;
use tidemark_core::CoreError;
use tidemark_engine::EngineError;

use crate::store::{StoreError, StoreErrorKind};

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

    /// The HTTP answer for a store's refusal: the one place a [`StoreError`] becomes a
    /// status and a code. `retry_after_ms` is the hint sent with retryable ones.
    pub fn from_store(e: StoreError, retry_after_ms: u32) -> ApiError {
        use StoreErrorKind as K;
        let (status, code) = match e.kind {
            K::Invalid => (StatusCode::BAD_REQUEST, "bad_request"),
            K::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            K::UnknownStream => (StatusCode::NOT_FOUND, "unknown_stream"),
            K::StreamExists => (StatusCode::CONFLICT, "stream_exists"),
            K::Conflict => (StatusCode::CONFLICT, "membership"),
            K::Overloaded => (StatusCode::TOO_MANY_REQUESTS, "overloaded"),
            K::Unavailable | K::ReadOnly => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            K::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        let retryable = e.is_retryable();
        let mut error = ApiError::new(status, code, e.message);
        if retryable {
            error.retry_after_ms = Some(retry_after_ms);
        }
        error
    }

    /// [`ApiError::from_store`] of an engine error (a read's).
    pub fn from_engine(e: EngineError, retry_after_ms: u32) -> ApiError {
        ApiError::from_store(e.into(), retry_after_ms)
    }

    /// [`ApiError::from_store`] of a cluster error (a membership change's).
    pub fn from_cluster(e: ClusterError, retry_after_ms: u32) -> ApiError {
        ApiError::from_store(e.into(), retry_after_ms)
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

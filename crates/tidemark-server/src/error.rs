//! Every refusal the HTTP API gives: a status, a stable machine-readable code and a message
//! for people, as `{"error": code, "message": ...}`; and what kind of refusal it is
//! ([`StoreErrorKind`]), which the answer carries to the layer that counts refusals.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tidemark_cluster::ClusterError;
use tidemark_core::CoreError;
use tidemark_engine::EngineError;

use crate::metrics::Rejection;
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
    /// What the refusal is, whatever status it is answered with: `/metrics` counts it by
    /// this ([`Rejection::of`]).
    pub kind: StoreErrorKind,
}

impl ApiError {
    /// A refusal of `kind` with `code`, answered with the kind's status (see
    /// [`ApiError::with_status`] for the few that HTTP answers otherwise). Its message is cut
    /// to [`MAX_MESSAGE_CHARS`]: messages may quote input (a name, an expression), and an
    /// answer must not echo a whole request back.
    pub fn new(kind: StoreErrorKind, code: &'static str, message: impl Into<String>) -> ApiError {
        let message = message.into();
        let message = match tidemark_core::truncated(&message, MAX_MESSAGE_CHARS) {
            std::borrow::Cow::Borrowed(_) => message,
            std::borrow::Cow::Owned(cut) => cut,
        };
        ApiError {
            status: status_of(kind),
            code,
            message,
            retry_after_ms: None,
            kind,
        }
    }

    /// The same refusal answered with `status`: a request timeout (408), an encoding not
    /// taken (415), a method a route lacks (405) are invalid requests with statuses of
    /// their own.
    pub fn with_status(self, status: StatusCode) -> ApiError {
        ApiError { status, ..self }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StoreErrorKind::Invalid, "bad_request", message)
    }

    pub fn overloaded(message: impl Into<String>, retry_after_ms: u32) -> ApiError {
        ApiError {
            retry_after_ms: Some(retry_after_ms),
            ..ApiError::new(StoreErrorKind::Overloaded, "overloaded", message)
        }
    }

    /// A body over `limit` bytes.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::too_large_because(format!(
            "the request body exceeds the limit of {limit} bytes"
        ))
    }

    pub fn too_large_because(message: impl Into<String>) -> ApiError {
        ApiError::new(StoreErrorKind::TooLarge, "too_large", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StoreErrorKind::Unauthorized, "unauthorized", message)
    }

    /// Something the request names that this server does not have, as `code` says.
    pub fn not_found(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StoreErrorKind::NotFound, code, message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StoreErrorKind::Internal, "internal", message)
    }

    /// The HTTP answer for a store's refusal: the one place a [`StoreError`] becomes a
    /// status and a code. `retry_after_ms` is the hint sent with retryable ones.
    pub fn from_store(e: StoreError, retry_after_ms: u32) -> ApiError {
        use StoreErrorKind as K;
        let code = match e.kind {
            K::Invalid => "bad_request",
            K::TooLarge => "too_large",
            K::UnknownStream => "unknown_stream",
            K::StreamExists => "stream_exists",
            K::Conflict => "membership",
            K::Overloaded => "overloaded",
            K::Unavailable | K::ReadOnly => "unavailable",
            K::Unauthorized => "unauthorized",
            K::NotFound => "not_found",
            K::Gone => "positions_removed",
            K::Internal => "internal",
        };
        let retryable = e.is_retryable();
        let mut error = ApiError::new(e.kind, code, e.message);
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

    /// How `/metrics` counts this refusal (`None`: a fault, not a refusal).
    pub fn rejection(&self) -> Option<Rejection> {
        Rejection::of(self.kind)
    }
}

/// The status a refusal of `kind` is answered with.
fn status_of(kind: StoreErrorKind) -> StatusCode {
    use StoreErrorKind as K;
    match kind {
        K::Invalid => StatusCode::BAD_REQUEST,
        K::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        K::UnknownStream | K::NotFound => StatusCode::NOT_FOUND,
        K::Gone => StatusCode::GONE,
        K::StreamExists | K::Conflict => StatusCode::CONFLICT,
        K::Overloaded => StatusCode::TOO_MANY_REQUESTS,
        K::Unavailable | K::ReadOnly => StatusCode::SERVICE_UNAVAILABLE,
        K::Unauthorized => StatusCode::UNAUTHORIZED,
        K::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> ApiError {
        ApiError::bad_request(e.to_string())
    }
}

impl ApiError {
    /// Marks `response` as this refusal, for the HTTP layer that counts refusals (a
    /// protocol that answers in its own shape marks its answer too).
    pub fn mark(&self, response: &mut Response) {
        if let Some(why) = self.rejection() {
            response.extensions_mut().insert(why);
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({"error": self.code, "message": self.message});
        if let Some(ms) = self.retry_after_ms {
            body["retryAfterMs"] = ms.into();
        }
        let mut response = (self.status, Json(body)).into_response();
        self.mark(&mut response);
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

//! What producers reach on the agent's HTTP listener: the server's write routes (native,
//! ChronicleDB, InfluxDB line protocol), `/health`, `/ready`, `/metrics` (the server's
//! and the agent's), `GET /agent/status`, and the web console at `/` (its page shows that
//! status). Reads are the upstream's to answer.

use std::sync::Arc;

use axum::http::Method;
use axum::routing::get;
use axum::Json;
use tidemark_server::http::front::HttpFront;

use crate::status::{Status, StatusBoard};

pub fn front(status: Arc<StatusBoard>) -> HttpFront {
    let for_metrics = status.clone();
    HttpFront {
        // The console's page shows the agent's status (it asks for /agent/status first).
        routes: tidemark_server::http::console::routes().route(
            "/agent/status",
            get(move || async move { Json::<Status>(status.snapshot()) }),
        ),
        admits: is_write_route,
        refusal:
            "the agent takes writes only (stream creation and appends): read from the upstream",
        metrics: Some(Arc::new(move || for_metrics.snapshot().prometheus())),
    }
}

/// The API routes an agent serves: writes that it spools and forwards, and what monitors
/// and clients probe.
fn is_write_route(method: &Method, path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let post = method == Method::POST;
    let probe = method == Method::GET || method == Method::HEAD;
    match segments.as_slice() {
        ["health"] | ["ready"] | ["metrics"] | ["ping"] => probe,
        // Native API: create a stream, append to one.
        ["v1", "streams"] | ["v1", "streams", _, "events"] => post,
        // ChronicleDB: the same, in the replicated namespace.
        ["api", "event-store", "streams"] | ["api", "event-store", "streams", _, "events"] => post,
        // InfluxDB line protocol (1.x and 2.x write routes).
        ["write"] | ["api", "v2", "write"] => post,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_pass_reads_and_deletes_do_not() {
        for (method, path) in [
            (Method::POST, "/v1/streams"),
            (Method::POST, "/v1/streams/ticks/events"),
            (Method::POST, "/api/event-store/streams/ticks/events"),
            (Method::POST, "/write"),
            (Method::POST, "/api/v2/write"),
            (Method::GET, "/health"),
            (Method::GET, "/metrics"),
        ] {
            assert!(is_write_route(&method, path), "{method} {path}");
        }
        for (method, path) in [
            (Method::GET, "/v1/streams"),
            (Method::GET, "/v1/streams/ticks/events"),
            (Method::DELETE, "/v1/streams/ticks"),
            (Method::POST, "/v1/streams/ticks/clear"),
            // A consumer's position is the upstream's to keep (docs/consuming.md).
            (Method::POST, "/v1/streams/ticks/consumers/billing"),
            (Method::GET, "/v1/streams/ticks/consumers"),
            (Method::POST, "/v1/query"),
            (Method::DELETE, "/api/event-store/streams/ticks/events"),
            (
                Method::POST,
                "/api/event-store/embedded/streams/ticks/events",
            ),
            (Method::POST, "/api/v1/write"),
        ] {
            assert!(!is_write_route(&method, path), "{method} {path}");
        }
    }
}

//! The web console's files (`tidemark_console`): `/` answers the page, `/console/...` its
//! scripts, styles and vendored libraries. They are open to everyone, tokens or not: they
//! hold no data, and the page asks for a token when a route it calls needs one.
//!
//! Each file is gzipped once, when first asked for by a client that takes gzip, and kept;
//! each carries an ETag, so a browser that has it is answered 304. The page is sent with a
//! Content-Security-Policy that lets it load only this server's scripts and talk only to
//! this server, and may not be framed (a framed console could be clicked into dropping a
//! stream).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tidemark_console::Asset;

use crate::error::ApiError;

/// The console's routes, for any router's state (the server's and the agent's).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(page))
        .route("/console/{*path}", get(file))
}

async fn page(headers: HeaderMap) -> Response {
    serve("index.html", tidemark_console::index(), &headers)
}

async fn file(Path(path): Path<String>, headers: HeaderMap) -> Response {
    match tidemark_console::asset(&path) {
        Some(asset) => serve(&path, asset, &headers),
        None => ApiError::not_found("not_found", "the console has no such file").into_response(),
    }
}

/// What the page may load and reach: this server only. Inline styles are allowed because
/// CodeMirror and uPlot position their elements with them.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

fn serve(path: &str, asset: Asset, headers: &HeaderMap) -> Response {
    let prepared = prepared()
        .get(path)
        .unwrap_or_else(|| unreachable!("every asset is prepared, and {path} is an asset"));
    if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|tags| tags.as_bytes() == prepared.etag.as_bytes())
    {
        return (
            StatusCode::NOT_MODIFIED,
            [(header::ETAG, prepared.etag.clone())],
        )
            .into_response();
    }
    let takes_gzip = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|coding| coding.trim().starts_with("gzip")));
    let cache = if asset.immutable {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    let mut response = match (&prepared.gzipped, takes_gzip) {
        (Some(gzipped), true) => {
            ([(header::CONTENT_ENCODING, "gzip")], gzipped.clone()).into_response()
        }
        _ => asset.bytes.into_response(),
    };
    let response_headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, asset.media_type),
        (header::CACHE_CONTROL, cache),
        (header::VARY, "accept-encoding"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ] {
        response_headers.insert(name, HeaderValue::from_static(value));
    }
    response_headers.insert(header::ETAG, prepared.etag.clone());
    if path == "index.html" {
        response_headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        );
        response_headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    response
}

/// A file's ETag and gzipped bytes (`None` where gzip would not make it smaller).
struct Prepared {
    etag: HeaderValue,
    gzipped: Option<Vec<u8>>,
}

/// Every file prepared, once (about 600 KB to compress: tens of milliseconds, on the first
/// request for the console).
fn prepared() -> &'static HashMap<&'static str, Prepared> {
    static PREPARED: OnceLock<HashMap<&'static str, Prepared>> = OnceLock::new();
    PREPARED.get_or_init(|| {
        tidemark_console::all()
            .map(|(path, asset)| (path, prepare(asset.bytes)))
            .collect()
    })
}

fn prepare(bytes: &[u8]) -> Prepared {
    // SipHash with fixed keys: the same bytes give the same tag in every run of a build,
    // and a changed file a different one.
    let mut hasher = std::hash::DefaultHasher::new();
    bytes.hash(&mut hasher);
    let etag = HeaderValue::try_from(format!("\"{:016x}\"", hasher.finish()))
        .unwrap_or_else(|_| unreachable!("hex digits in quotes are a valid header value"));
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let gzipped = encoder
        .write_all(bytes)
        .and_then(|()| encoder.finish())
        .ok()
        .filter(|gzipped| gzipped.len() < bytes.len());
    Prepared { etag, gzipped }
}

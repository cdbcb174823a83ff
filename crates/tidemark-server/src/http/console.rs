//! The web console's files (`tidemark_console`): `/` answers the page, `/console/...` its
//! scripts, styles and vendored libraries. They are open to everyone, tokens or not: they
//! hold no data, and the page asks for a token when a route it calls needs one.
//!
//! Every file is gzipped when the console is first asked for (about 600 KB, once per
//! process) and kept, with an ETag per encoding, so a browser that has a file is answered
//! 304. The page is sent with a Content-Security-Policy that lets it load only this
//! server's scripts and talk only to this server, and may not be framed (a framed console
//! could be clicked into dropping a stream).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::sync::OnceLock;

use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
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
    serve("index.html", &headers)
}

async fn file(Path(path): Path<String>, headers: HeaderMap) -> Response {
    serve(&path, &headers)
}

/// What the page may load and reach: this server only. Inline styles are allowed because
/// CodeMirror and uPlot position their elements with them.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

fn serve(path: &str, headers: &HeaderMap) -> Response {
    let Some(file) = prepared().get(path) else {
        return ApiError::not_found("not_found", "the console has no such file").into_response();
    };
    let (body, etag, gzip) = match &file.gzipped {
        Some((bytes, etag)) if takes_gzip(headers) => (bytes.clone(), etag, true),
        _ => (Bytes::from_static(file.asset.bytes), &file.etag, false),
    };
    let cache = if file.asset.immutable() {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    let mut response = if is_current(headers, etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut response = body.into_response();
        let content_type = HeaderValue::from_static(file.asset.media_type);
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
        if gzip {
            let gzip = HeaderValue::from_static("gzip");
            response
                .headers_mut()
                .insert(header::CONTENT_ENCODING, gzip);
        }
        response
    };
    let mut set = |name: HeaderName, value: HeaderValue| response.headers_mut().insert(name, value);
    set(header::ETAG, etag.clone());
    set(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    set(header::VARY, HeaderValue::from_static("accept-encoding"));
    set(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    set(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if path == "index.html" {
        let policy = HeaderValue::from_static(CONTENT_SECURITY_POLICY);
        set(header::CONTENT_SECURITY_POLICY, policy);
        set(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    response
}

/// Whether the request's Accept-Encoding takes gzip (`gzip;q=0` refuses it).
fn takes_gzip(headers: &HeaderMap) -> bool {
    let Some(accepted) = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    accepted.split(',').any(|coding| {
        let mut parts = coding.split(';');
        let name = parts.next().unwrap_or_default().trim();
        let quality = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        name.eq_ignore_ascii_case("gzip") && quality > 0.0
    })
}

/// Whether If-None-Match names `etag` (a list, weak or not, or `*`).
fn is_current(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let Some(tags) = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let ours = etag.to_str().unwrap_or_default();
    tags.split(',')
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == ours || tag == "*")
}

/// A file, its ETag, and its gzipped bytes with theirs (`None` where gzip would not make
/// it smaller).
struct Prepared {
    asset: Asset,
    etag: HeaderValue,
    gzipped: Option<(Bytes, HeaderValue)>,
}

/// Every file prepared, once: tens of milliseconds, on the first request for the console.
fn prepared() -> &'static HashMap<&'static str, Prepared> {
    static PREPARED: OnceLock<HashMap<&'static str, Prepared>> = OnceLock::new();
    PREPARED.get_or_init(|| {
        tidemark_console::all()
            .map(|asset| (asset.path, prepare(asset)))
            .collect()
    })
}

fn prepare(asset: Asset) -> Prepared {
    // SipHash with fixed keys: the same bytes give the same tag in every run of a build,
    // and a changed file a different one. The gzipped body is another representation, so
    // it has a tag of its own.
    let mut hasher = std::hash::DefaultHasher::new();
    asset.bytes.hash(&mut hasher);
    let digest = hasher.finish();
    let tag = |suffix: &str| {
        HeaderValue::try_from(format!("\"{digest:016x}{suffix}\""))
            .unwrap_or_else(|_| unreachable!("hex digits in quotes are a valid header value"))
    };
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let gzipped = encoder
        .write_all(asset.bytes)
        .and_then(|()| encoder.finish())
        .ok()
        .filter(|gzipped| gzipped.len() < asset.bytes.len())
        .map(|gzipped| (Bytes::from(gzipped), tag("-gzip")));
    Prepared {
        asset,
        etag: tag(""),
        gzipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(name: HeaderName, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn gzip_is_taken_unless_refused() {
        for (accepted, takes) in [
            ("gzip", true),
            ("gzip, deflate, br", true),
            ("br, GZIP;q=0.5", true),
            ("gzip;q=0", false),
            ("gzip; q=0.0", false),
            ("deflate", false),
            ("x-gzip", false),
        ] {
            let given = headers(header::ACCEPT_ENCODING, accepted);
            assert_eq!(takes_gzip(&given), takes, "{accepted}");
        }
        assert!(!takes_gzip(&HeaderMap::new()));
    }

    #[test]
    fn a_current_copy_is_named_alone_in_a_list_or_weakly() {
        let etag = HeaderValue::from_static("\"00ff\"");
        for (sent, current) in [
            ("\"00ff\"", true),
            ("W/\"00ff\"", true),
            ("\"abcd\", \"00ff\"", true),
            ("*", true),
            ("\"00fe\"", false),
            ("00ff", false),
        ] {
            assert_eq!(
                is_current(&headers(header::IF_NONE_MATCH, sent), &etag),
                current,
                "{sent}"
            );
        }
    }
}

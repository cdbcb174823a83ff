//! The native HTTP API (`/v1`): streams, appends as NDJSON, SQL queries.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value as Json};
use tidemark_core::json::event_to_json;
use tidemark_core::EventBatch;

use ureq::tls::{parse_pem, Certificate, PemItem, RootCerts, TlsConfig};

use crate::{Ack, ClientError};

/// Answers larger than this are refused rather than read into memory.
const MAX_ANSWER_BYTES: u64 = 1 << 30;

/// A client of the HTTP API. Cheap to share between threads.
pub struct HttpClient {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl HttpClient {
    /// `base` is the server's address, e.g. `http://127.0.0.1:8080`, `https://db:8080`, or
    /// `127.0.0.1:8080` (plain HTTP). An `https` server's certificate is checked against
    /// the Mozilla root certificates.
    pub fn new(base: &str, token: Option<&str>) -> HttpClient {
        HttpClient::with_timeout(base, token, None)
    }

    /// Like [`HttpClient::new`], with a bound on each whole request: a server that stops
    /// answering (paused, partitioned) then fails the request instead of hanging it.
    pub fn with_timeout(base: &str, token: Option<&str>, timeout: Option<Duration>) -> HttpClient {
        HttpClient::build(base, token, timeout, None)
    }

    /// Like [`HttpClient::new`], trusting only the certificate authorities in the PEM file
    /// `ca` (a private CA, or a self-signed server certificate).
    pub fn with_ca(base: &str, token: Option<&str>, ca: &Path) -> Result<HttpClient, ClientError> {
        let pem = std::fs::read(ca)
            .map_err(|e| std::io::Error::new(e.kind(), format!("reading {}: {e}", ca.display())))?;
        let certs: Vec<Certificate<'static>> = parse_pem(&pem)
            .filter_map(|item| match item {
                Ok(PemItem::Certificate(cert)) => Some(Ok(cert)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            })
            .collect::<Result<_, _>>()
            .map_err(|e| ClientError::Protocol(format!("{}: {e}", ca.display())))?;
        if certs.is_empty() {
            return Err(ClientError::Protocol(format!(
                "{} holds no PEM certificate",
                ca.display()
            )));
        }
        Ok(HttpClient::build(
            base,
            token,
            None,
            Some(RootCerts::new_with_certs(&certs)),
        ))
    }

    fn build(
        base: &str,
        token: Option<&str>,
        timeout: Option<Duration>,
        roots: Option<RootCerts>,
    ) -> HttpClient {
        let mut tls = TlsConfig::builder();
        if let Some(roots) = roots {
            tls = tls.root_certs(roots);
        }
        let agent = ureq::Agent::config_builder()
            // Refusals carry a JSON body worth reading; status codes are handled here.
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_global(timeout)
            .tls_config(tls.build())
            .build()
            .into();
        let base = base.trim().trim_end_matches('/');
        let base = if base.contains("://") {
            base.to_string()
        } else {
            format!("http://{base}")
        };
        HttpClient {
            base,
            token: token.map(str::to_string),
            agent,
        }
    }

    /// The server's address as requests use it.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Creates a stream with a strict schema spec such as `SYMBOL:STRING,PRICE:DOUBLE`
    /// (idempotent for the same schema), partitioned by day.
    pub fn create_stream(&self, name: &str, schema: &str) -> Result<Json, ClientError> {
        self.create_stream_with(name, schema, false, None)
    }

    /// Creates a stream; `evolving` lets writes add fields to its schema, `partition` (a
    /// duration such as `1h` or `7d`; `None`: a day) sets its time partitions.
    pub fn create_stream_with(
        &self,
        name: &str,
        schema: &str,
        evolving: bool,
        partition: Option<&str>,
    ) -> Result<Json, ClientError> {
        let mut body = json!({"name": name, "schema": schema, "evolving": evolving});
        if let Some(partition) = partition {
            body["partition"] = json!(partition);
        }
        let body = body.to_string();
        self.request(
            "POST",
            "/v1/streams",
            Some(("application/json", body.into_bytes())),
        )
    }

    pub fn stream_info(&self, name: &str) -> Result<Json, ClientError> {
        self.request(
            "GET",
            &format!("/v1/streams/{}", percent_encode(name)),
            None,
        )
    }

    /// Appends `batch` as NDJSON and waits until it is durable.
    pub fn append(&self, stream: &str, batch: &EventBatch) -> Result<Ack, ClientError> {
        self.append_tagged(stream, batch, None)
    }

    /// [`HttpClient::append`] with a (producer id, sequence) tag, sent as the
    /// `Tidemark-Producer` header: a cluster applies a batch sent again with it once.
    pub fn append_tagged(
        &self,
        stream: &str,
        batch: &EventBatch,
        producer: Option<(u64, u64)>,
    ) -> Result<Ack, ClientError> {
        let mut body = Vec::with_capacity(batch.len() * 64);
        for row in 0..batch.len() {
            // Cannot fail: a JSON value always serialises.
            let _ = serde_json::to_writer(&mut body, &event_to_json(batch, row));
            body.push(b'\n');
        }
        let tag: Vec<(&str, String)> = producer
            .map(|(id, sequence)| ("Tidemark-Producer", format!("{id}/{sequence}")))
            .into_iter()
            .collect();
        let answer = self.request_with(
            "POST",
            &format!("/v1/streams/{}/events", percent_encode(stream)),
            Some(("application/x-ndjson", body)),
            &tag,
        )?;
        let field = |name| answer.get(name).and_then(Json::as_u64);
        // Both or neither: an answer with one of them is not one to trust.
        let positions = match (field("firstPosition"), field("lastPosition")) {
            (Some(first), Some(last)) => Some((first, last)),
            (None, None) => None,
            _ => return Err(ClientError::Protocol(format!("unexpected answer {answer}"))),
        };
        match (field("lsn"), field("events")) {
            (Some(lsn), Some(events)) => Ok(Ack {
                lsn,
                events,
                server_time: None,
                positions,
            }),
            _ => Err(ClientError::Protocol(format!("unexpected answer {answer}"))),
        }
    }

    /// Runs a SQL query; the answer is `{"columns": [...], "rows": [[...], ...]}`.
    pub fn query(&self, sql: &str) -> Result<Json, ClientError> {
        self.query_with_times(sql, "rfc3339")
    }

    /// [`HttpClient::query`] with timestamps written as `time` says: `rfc3339` or `ns`.
    pub fn query_with_times(&self, sql: &str, time: &str) -> Result<Json, ClientError> {
        let body = json!({"sql": sql, "time": time}).to_string();
        self.request(
            "POST",
            "/v1/query",
            Some(("application/json", body.into_bytes())),
        )
    }

    /// Appends NDJSON events tagged with a producer id and sequence number: a cluster
    /// applies a batch retried with the same tag once, so a batch whose outcome is unknown
    /// (timeout, leader change) can be sent again safely.
    pub fn append_ndjson_tagged(
        &self,
        stream: &str,
        ndjson: Vec<u8>,
        producer: u64,
        sequence: u64,
    ) -> Result<Json, ClientError> {
        self.request_with(
            "POST",
            &format!("/v1/streams/{}/events", percent_encode(stream)),
            Some(("application/x-ndjson", ndjson)),
            &[("Tidemark-Producer", format!("{producer}/{sequence}"))],
        )
    }

    /// Sends a request and returns its JSON answer; refusals become [`ClientError`]s.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Json, ClientError> {
        self.request_with(method, path, body, &[])
    }

    /// The events of a stream's time range as the server writes them (`GET
    /// /v1/streams/{s}/events`): NDJSON, or CSV when `csv`. `params` are that route's query
    /// parameters (`from`, `to`, `last`, `fields`, `where` (repeatable), `limit`, `time`).
    pub fn scan(
        &self,
        stream: &str,
        params: &[(&str, String)],
        csv: bool,
    ) -> Result<String, ClientError> {
        let path = events_path(stream, params);
        let accept = if csv {
            "text/csv"
        } else {
            "application/x-ndjson"
        };
        let (status, retry_after, text) =
            self.send("GET", &path, None, &[("Accept", accept.to_string())])?;
        if (200..300).contains(&status) {
            return Ok(text);
        }
        let answer: Json = serde_json::from_str(&text).unwrap_or(Json::String(text));
        Err(refusal(status, retry_after, &answer))
    }

    /// A read by position of a stream (`GET /v1/streams/{s}/events` with `after`,
    /// `consumer`, `limit`, `follow`, `wait`, `time`: docs/consuming.md), as the server
    /// sends it: NDJSON lines of `{"position", "event"}` (heartbeats and a last error line
    /// too, when following), read as they arrive (what the reader holds that was not read
    /// yet is its `buffer()`: empty, the next line waits for the server). A refusal before
    /// the first line is an error here.
    pub fn read_positions(
        &self,
        stream: &str,
        params: &[(&str, String)],
    ) -> Result<std::io::BufReader<Box<dyn std::io::Read + Send>>, ClientError> {
        let url = format!("{}{}", self.base, events_path(stream, params));
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let accept = [("Accept", "application/x-ndjson".to_string())];
        let response = with_headers(self.agent.get(&url), &auth, &accept)
            .call()
            .map_err(|e| ClientError::Io(std::io::Error::other(format!("{}: {e}", self.base))))?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            let retry_after = retry_after_seconds(&response);
            let text = response
                .into_body()
                .with_config()
                .limit(MAX_ANSWER_BYTES)
                .read_to_string()
                .map_err(|e| ClientError::Io(std::io::Error::other(e.to_string())))?;
            let answer: Json = serde_json::from_str(&text).unwrap_or(Json::String(text));
            return Err(refusal(status, retry_after, &answer));
        }
        // A follow has no end: no limit on what is read, line by line as it comes.
        let body = response
            .into_body()
            .into_with_config()
            .limit(u64::MAX)
            .reader();
        let body: Box<dyn std::io::Read + Send> = Box::new(body);
        Ok(std::io::BufReader::new(body))
    }

    fn request_with(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
        headers: &[(&str, String)],
    ) -> Result<Json, ClientError> {
        let (status, retry_after, text) = self.send(method, path, body, headers)?;
        let answer: Json = serde_json::from_str(&text).unwrap_or(Json::String(text));
        if (200..300).contains(&status) {
            return Ok(answer);
        }
        Err(refusal(status, retry_after, &answer))
    }

    /// Sends a request; its status, Retry-After (seconds) and body.
    fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
        headers: &[(&str, String)],
    ) -> Result<(u16, Option<u64>, String), ClientError> {
        let url = format!("{}{path}", self.base);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let response = match (method, body) {
            ("GET", _) => with_headers(self.agent.get(&url), &auth, headers).call(),
            ("DELETE", _) => with_headers(self.agent.delete(&url), &auth, headers).call(),
            (_, body) => {
                let (content_type, bytes) = body.unwrap_or(("application/json", Vec::new()));
                let request = match method {
                    "PUT" => self.agent.put(&url),
                    _ => self.agent.post(&url),
                };
                with_headers(request, &auth, headers)
                    .header("Content-Type", content_type)
                    .send(&bytes[..])
            }
        };
        let mut response = response.map_err(|e| {
            let kind = match &e {
                ureq::Error::Io(e) => e.kind(),
                _ => std::io::ErrorKind::Other,
            };
            let what = match &e {
                ureq::Error::Io(e) => format!("cannot reach {}: {e}", self.base),
                e => format!("{}: {e}", self.base),
            };
            ClientError::Io(std::io::Error::new(kind, what))
        })?;
        let status = response.status().as_u16();
        let retry_after = retry_after_seconds(&response);
        let text = response
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER_BYTES)
            .read_to_string()
            .map_err(|e| ClientError::Io(std::io::Error::other(e.to_string())))?;
        Ok((status, retry_after, text))
    }
}

/// The path of a stream's events with `params` as its query string.
fn events_path(stream: &str, params: &[(&str, String)]) -> String {
    let query: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{k}={}", percent_encode(v)))
        .collect();
    format!(
        "/v1/streams/{}/events?{}",
        percent_encode(stream),
        query.join("&")
    )
}

/// An answer's `Retry-After`, in seconds.
fn retry_after_seconds(response: &ureq::http::Response<ureq::Body>) -> Option<u64> {
    response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}

/// The error a refusal (a status outside 2xx) with the JSON `answer` means.
fn refusal(status: u16, retry_after: Option<u64>, answer: &Json) -> ClientError {
    let message = answer
        .get("message")
        .and_then(Json::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| answer.to_string());
    if status == 429 {
        let ms = answer
            .get("retryAfterMs")
            .and_then(Json::as_u64)
            .or(retry_after.map(|s| s * 1000))
            .unwrap_or(1000);
        return ClientError::TryLater {
            retry_after: Duration::from_millis(ms),
            message,
        };
    }
    let code = answer
        .get("error")
        .and_then(Json::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("HTTP {status}"));
    ClientError::Refused { code, message }
}

fn with_headers<B>(
    request: ureq::RequestBuilder<B>,
    auth: &Option<String>,
    headers: &[(&str, String)],
) -> ureq::RequestBuilder<B> {
    let mut request = match auth {
        Some(value) => request.header("Authorization", value),
        None => request,
    };
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    request
}

/// Percent-encodes `segment` for a URL path segment or query value: everything but the
/// unreserved characters of RFC 3986.
pub fn percent_encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(super::percent_encode("a b/c%é"), "a%20b%2Fc%25%C3%A9");
        assert_eq!(super::percent_encode("ticks-1.x_y~"), "ticks-1.x_y~");
    }

    #[test]
    fn an_address_without_a_scheme_is_plain_http() {
        assert_eq!(
            HttpClient::new("127.0.0.1:8080", None).base(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            HttpClient::new(" https://db:8080/ ", None).base(),
            "https://db:8080"
        );
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = std::env::temp_dir().join(format!("tidemark-ca-{}", std::process::id()));
        std::fs::write(&dir, "not a certificate").unwrap();
        let refused = HttpClient::with_ca("https://x", None, &dir);
        std::fs::remove_file(&dir).unwrap();
        assert!(refused.is_err());
        assert!(HttpClient::with_ca("https://x", None, Path::new("/nonexistent/ca.pem")).is_err());
    }
}

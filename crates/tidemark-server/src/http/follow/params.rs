//! What a read by position asks for: its query string and `Accept` header.

use std::time::Duration;

use axum::http::{header, HeaderMap};
use tidemark_query::Times;

use super::render::Format;
use crate::consume::Start;
use crate::error::ApiError;

/// Events answered by one read when the client names no `limit`.
const DEFAULT_LIMIT: usize = 1_000;
/// The most events one read answers: what a follow renders at a time, and so what a client
/// that stops reading can hold on the server.
const MAX_LIMIT: usize = 10_000;
/// The longest long poll (`wait`).
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Whether a request for the events of a stream is a read by position: it names one of
/// this module's parameters, or asks for Server-Sent Events. (`from` alone is a scan's;
/// beside one of these it says where a read by position starts.)
pub fn is_position_read(raw: Option<&str>, headers: &HeaderMap) -> bool {
    let named = form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .any(|(key, _)| matches!(key.as_ref(), "after" | "follow" | "wait" | "consumer"));
    named || accepts(headers, Format::Sse.content_type())
}

/// Whether the request's `Accept` names `media_type`.
fn accepts(headers: &HeaderMap, media_type: &str) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains(media_type))
}

/// The format the client asks for: Server-Sent Events or Arrow by `Accept`, else NDJSON.
pub fn format(headers: &HeaderMap) -> Format {
    [Format::Sse, Format::Arrow]
        .into_iter()
        .find(|f| accepts(headers, f.content_type()))
        .unwrap_or(Format::Ndjson)
}

/// The query string of a read by position.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Where the read starts, when the client says with `after` or `from`.
    start: Option<Start>,
    /// Read after the position this named consumer committed (unless `after` or `from`
    /// says where).
    consumer: Option<String>,
    pub limit: usize,
    pub follow: bool,
    pub wait: Option<Duration>,
    pub times: Times,
}

impl Params {
    pub fn parse(raw: Option<&str>, headers: &HeaderMap) -> Result<Params, ApiError> {
        let mut params = Params {
            start: None,
            consumer: None,
            limit: DEFAULT_LIMIT,
            follow: false,
            wait: None,
            times: Times::Nanoseconds,
        };
        for (key, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
            match key.as_ref() {
                "after" if value == "earliest" => params.start_at(Start::Earliest)?,
                "after" => params.start_at(Start::After(parse_number(
                    &value,
                    "after",
                    "a position or \"earliest\"",
                )?))?,
                "from" => {
                    let now = tidemark_query::time::now_ns();
                    let time = tidemark_query::time::parse_instant(&value, now)
                        .map_err(|e| ApiError::bad_request(format!("from: {e}")))?;
                    params.start_at(Start::FromTime(time))?
                }
                "limit" => {
                    let limit: usize = parse_number(&value, "limit", "a count of events")?;
                    if limit == 0 || limit > MAX_LIMIT {
                        return Err(ApiError::bad_request(format!(
                            "limit must be 1 to {MAX_LIMIT} for a read by position, not {limit}"
                        )));
                    }
                    params.limit = limit;
                }
                "follow" => {
                    params.follow = match value.as_ref() {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        other => {
                            return Err(ApiError::bad_request(format!(
                                "follow must be true or false, not {other:?}"
                            )))
                        }
                    }
                }
                "wait" => {
                    let ms: u64 = parse_number(&value, "wait", "milliseconds")?;
                    params.wait = Some(Duration::from_millis(ms).min(MAX_WAIT));
                }
                "time" => params.times = parse_times(&value)?,
                "consumer" => params.consumer = Some(value.into_owned()),
                "to" | "last" | "fields" | "where" | "consistency" => {
                    return Err(ApiError::bad_request(format!(
                        "{key} is a parameter of a scan by time; a read by position takes \
                         after, from, consumer, limit, follow, wait and time"
                    )))
                }
                other => {
                    return Err(ApiError::bad_request(format!(
                        "unknown parameter {other:?} (after, from, consumer, limit, follow, \
                         wait, time)"
                    )))
                }
            }
        }
        // A browser's EventSource reconnects with the id of the last event it received.
        if format(headers) == Format::Sse {
            if let Some(last) = headers.get("last-event-id").and_then(|v| v.to_str().ok()) {
                // Where the browser got to wins over where the page first asked to start.
                params.start = Some(Start::After(parse_number(
                    last,
                    "Last-Event-ID",
                    "a position",
                )?));
            }
        }
        if params.follow && params.wait.is_some() {
            return Err(ApiError::bad_request(
                "follow and wait do not go together: a follow waits for ever, a wait once",
            ));
        }
        Ok(params)
    }
}

impl Params {
    /// Where the read starts: where the client says, else after its named consumer's
    /// position, else at the earliest event held.
    pub fn start(&self) -> Start {
        match (&self.start, &self.consumer) {
            (Some(start), _) => start.clone(),
            (None, Some(consumer)) => Start::Consumer(consumer.clone()),
            (None, None) => Start::Earliest,
        }
    }

    fn start_at(&mut self, start: Start) -> Result<(), ApiError> {
        if self.start.is_some() {
            return Err(ApiError::bad_request(
                "say where to start once: after=POSITION, after=earliest or from=TIME",
            ));
        }
        self.start = Some(start);
        Ok(())
    }
}

fn parse_number<T: std::str::FromStr>(value: &str, name: &str, what: &str) -> Result<T, ApiError> {
    value
        .parse()
        .map_err(|_| ApiError::bad_request(format!("{name} {value:?} is not {what}")))
}

fn parse_times(value: &str) -> Result<Times, ApiError> {
    match value {
        "ns" => Ok(Times::Nanoseconds),
        "rfc3339" => Ok(Times::Rfc3339),
        other => Err(ApiError::bad_request(format!(
            "time must be \"ns\" or \"rfc3339\", not {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn params(query: &str) -> Result<Params, ApiError> {
        Params::parse(Some(query), &HeaderMap::new())
    }

    #[test]
    fn parameters_are_checked_and_scan_ones_refused_by_name() {
        let p = params("after=41&limit=5&time=rfc3339").unwrap();
        assert_eq!(
            (p.start, p.limit, p.follow),
            (Some(Start::After(41)), 5, false)
        );
        assert_eq!(
            params("after=earliest").unwrap().start,
            Some(Start::Earliest)
        );
        assert_eq!(
            params("from=1000&follow=true").unwrap().start,
            Some(Start::FromTime(1000))
        );
        assert_eq!(
            params("from=1970-01-01T00:00:01Z&wait=0").unwrap().start,
            Some(Start::FromTime(1_000_000_000))
        );
        assert!(params("follow=true").unwrap().follow);
        assert_eq!(params("wait=999999").unwrap().wait, Some(MAX_WAIT));
        for bad in [
            "after=-1",
            "after=latest",
            "limit=0",
            "limit=10001",
            "follow=yes",
            "wait=soon",
            "from=yesterday",
        ] {
            assert!(params(bad).is_err(), "{bad}");
        }
        let e = params("after=1&to=2024-01-01").unwrap_err();
        assert!(e.message.contains("scan by time"), "{}", e.message);
        let e = params("after=1&from=2024-01-01").unwrap_err();
        assert!(e.message.contains("once"), "{}", e.message);
        assert!(params("follow=true&wait=10").is_err());
    }

    #[test]
    fn an_event_source_resumes_after_its_last_event_id() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert("last-event-id", HeaderValue::from_static("17"));
        assert!(is_position_read(None, &headers));
        let p = Params::parse(Some("follow=true"), &headers).unwrap();
        assert_eq!(p.start, Some(Start::After(17)));
        // The browser reconnects to the page's URL: where it got to wins over where the
        // page first asked to start.
        assert_eq!(
            Params::parse(Some("after=3&follow=true"), &headers)
                .unwrap()
                .start,
            Some(Start::After(17))
        );
        assert!(!is_position_read(Some("from=1"), &HeaderMap::new()));
    }

    #[test]
    fn the_format_is_chosen_by_accept() {
        let mut headers = HeaderMap::new();
        assert_eq!(format(&headers), Format::Ndjson);
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/vnd.apache.arrow.stream"),
        );
        assert_eq!(format(&headers), Format::Arrow);
    }
}

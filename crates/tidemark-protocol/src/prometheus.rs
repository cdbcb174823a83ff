//! Prometheus remote write 1.0 and remote read, as bytes: the protobuf messages of
//! `prometheus/prompb` (`remote.proto`, `types.proto`) and their snappy block framing.
//!
//! The messages are declared here with `prost`'s derive rather than generated from the
//! `.proto` files: only the fields a remote-write sender fills and a remote-read client asks
//! for are needed, and a build script with `protoc` would be one more tool on every machine.
//! Fields Tidemark cannot store (exemplars, native histograms) are still decoded as raw bytes
//! so that a request that carries them is refused, not silently stripped of them.

use prost::Message;

/// Every message here holds strings; a decoded request is bounded by its inflated size.
#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
    /// Metric metadata (type, help, unit): sent on its own by Prometheus every minute.
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub metadata: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TimeSeries {
    /// `__name__` and the other labels; Prometheus sends them sorted by name.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    /// Exemplars (not stored: a request with any is refused).
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub exemplars: Vec<Vec<u8>>,
    /// Native histograms (not stored: a request with any is refused).
    #[prost(bytes = "vec", repeated, tag = "4")]
    pub histograms: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Eq, Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Milliseconds since the epoch.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ReadRequest {
    #[prost(message, repeated, tag = "1")]
    pub queries: Vec<Query>,
    /// Answer forms the client takes, in its order of preference; empty means SAMPLES.
    #[prost(int32, repeated, tag = "2")]
    pub accepted_response_types: Vec<i32>,
}

/// `ReadRequest.ResponseType.SAMPLES`: a [`ReadResponse`] of whole series.
pub const RESPONSE_SAMPLES: i32 = 0;

#[derive(Clone, PartialEq, Message)]
pub struct Query {
    /// Milliseconds since the epoch, both ends included.
    #[prost(int64, tag = "1")]
    pub start_timestamp_ms: i64,
    #[prost(int64, tag = "2")]
    pub end_timestamp_ms: i64,
    #[prost(message, repeated, tag = "3")]
    pub matchers: Vec<LabelMatcher>,
}

#[derive(Clone, PartialEq, Eq, Message)]
pub struct LabelMatcher {
    /// A [`MatchType`] as its number.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub value: String,
}

/// How a [`LabelMatcher`] compares a label's value (a missing label's value is "").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchType {
    /// `=`
    Equal,
    /// `!=`
    NotEqual,
    /// `=~`: the whole value matches the RE2 expression.
    Regex,
    /// `!~`
    NotRegex,
}

impl MatchType {
    pub fn from_wire(number: i32) -> Option<MatchType> {
        Some(match number {
            0 => MatchType::Equal,
            1 => MatchType::NotEqual,
            2 => MatchType::Regex,
            3 => MatchType::NotRegex,
            _ => return None,
        })
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct ReadResponse {
    /// One per query, in the order of the request.
    #[prost(message, repeated, tag = "1")]
    pub results: Vec<QueryResult>,
}

#[derive(Clone, PartialEq, Message)]
pub struct QueryResult {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrometheusError {
    #[error("the body is not a snappy block: {0}")]
    Snappy(String),
    #[error("the body inflates to {inflated} bytes, more than the limit of {limit}")]
    TooLarge { inflated: usize, limit: usize },
    #[error("the body is not a {message} protobuf message: {reason}")]
    Protobuf {
        message: &'static str,
        reason: String,
    },
}

/// The bytes a snappy block says it inflates to (read from its header, before inflating).
pub fn inflated_len(body: &[u8]) -> Result<usize, PrometheusError> {
    snap::raw::decompress_len(body).map_err(|e| PrometheusError::Snappy(e.to_string()))
}

/// A remote-write body: a snappy block of a `WriteRequest`, inflating to at most `limit`.
pub fn decode_write(body: &[u8], limit: usize) -> Result<WriteRequest, PrometheusError> {
    decode(body, limit, "WriteRequest")
}

/// A remote-read body: a snappy block of a `ReadRequest`, inflating to at most `limit`.
pub fn decode_read(body: &[u8], limit: usize) -> Result<ReadRequest, PrometheusError> {
    decode(body, limit, "ReadRequest")
}

/// A remote-read answer (what a client reads): a snappy block of a `ReadResponse`.
pub fn decode_read_response(body: &[u8], limit: usize) -> Result<ReadResponse, PrometheusError> {
    decode(body, limit, "ReadResponse")
}

/// Any message as its snappy-compressed protobuf bytes (a remote-write body, a remote-read
/// answer).
pub fn encode<M: Message>(message: &M) -> Vec<u8> {
    // Compressing into a Vec fails only for inputs over ~4 GiB, which no answer reaches
    // (answers are bounded by `limits.max_result_bytes`); an empty body would then be
    // refused by the client, not read wrongly.
    snap::raw::Encoder::new()
        .compress_vec(&message.encode_to_vec())
        .unwrap_or_default()
}

fn decode<M: Message + Default>(
    body: &[u8],
    limit: usize,
    message: &'static str,
) -> Result<M, PrometheusError> {
    // The length a snappy block announces is checked before anything is allocated for it.
    let inflated = inflated_len(body)?;
    if inflated > limit {
        return Err(PrometheusError::TooLarge { inflated, limit });
    }
    let bytes = snap::raw::Decoder::new()
        .decompress_vec(body)
        .map_err(|e| PrometheusError::Snappy(e.to_string()))?;
    M::decode(bytes.as_slice()).map_err(|e| PrometheusError::Protobuf {
        message,
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, samples: &[(i64, f64)]) -> TimeSeries {
        TimeSeries {
            labels: vec![Label {
                name: "__name__".into(),
                value: name.into(),
            }],
            samples: samples
                .iter()
                .map(|&(timestamp, value)| Sample { value, timestamp })
                .collect(),
            exemplars: vec![],
            histograms: vec![],
        }
    }

    #[test]
    fn a_write_request_round_trips_through_snappy_and_protobuf() {
        let request = WriteRequest {
            timeseries: vec![series("up", &[(1, 1.0), (2, f64::INFINITY)])],
            metadata: vec![],
        };
        let body = encode(&request);
        assert_eq!(decode_write(&body, 1 << 20), Ok(request));
    }

    #[test]
    fn a_body_inflating_beyond_the_limit_is_refused_before_it_is_inflated() {
        let big = WriteRequest {
            timeseries: vec![series(&"x".repeat(10_000), &[(1, 1.0)])],
            metadata: vec![],
        };
        let body = encode(&big);
        assert!(body.len() < 1_000, "snappy compresses the repeated name");
        assert!(matches!(
            decode_write(&body, 1_000),
            Err(PrometheusError::TooLarge { limit: 1_000, .. })
        ));
    }

    #[test]
    fn garbage_is_refused_with_what_it_is_not() {
        assert!(matches!(
            decode_write(b"\xff\xff\xff\xff\xff\xff", 1 << 20),
            Err(PrometheusError::Snappy(_))
        ));
        let not_protobuf = snap::raw::Encoder::new().compress_vec(b"\xff\xff").unwrap();
        assert!(matches!(
            decode_read(&not_protobuf, 1 << 20),
            Err(PrometheusError::Protobuf {
                message: "ReadRequest",
                ..
            })
        ));
    }

    #[test]
    fn exemplars_and_histograms_are_kept_as_bytes_to_be_refused() {
        let mut with = series("m", &[(1, 1.0)]);
        with.exemplars.push(vec![1, 2, 3]);
        with.histograms.push(vec![4]);
        let body = encode(&WriteRequest {
            timeseries: vec![with],
            metadata: vec![],
        });
        let decoded = decode_write(&body, 1 << 20).unwrap();
        assert_eq!(decoded.timeseries[0].exemplars.len(), 1);
        assert_eq!(decoded.timeseries[0].histograms.len(), 1);
    }

    #[test]
    fn match_types_are_the_four_of_the_wire() {
        assert_eq!(MatchType::from_wire(0), Some(MatchType::Equal));
        assert_eq!(MatchType::from_wire(3), Some(MatchType::NotRegex));
        assert_eq!(MatchType::from_wire(4), None);
    }
}

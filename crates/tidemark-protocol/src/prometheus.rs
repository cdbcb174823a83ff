//! Prometheus remote write 1.0 and remote read, as bytes: the protobuf messages of
//! `prometheus/prompb` (`remote.proto`, `types.proto`) and their snappy block framing.
//!
//! The messages are declared here with `prost`'s derive rather than generated from the
//! `.proto` files: only the fields a remote-write sender fills and a remote-read client asks
//! for are needed, and a build script with `protoc` would be one more tool on every machine.
//! Fields Tidemark cannot store (exemplars, native histograms) are still decoded as raw bytes
//! so that a request that carries them is refused, not silently stripped of them.

use prost::Message;

/// A decoded request can hold many times its inflated size in small messages: a server
/// admits [`write_request_bytes`] before decoding one.
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

/// A snappy block inflated, if it inflates to at most `limit` bytes (checked from its
/// header before anything is allocated).
pub fn inflate(body: &[u8], limit: usize) -> Result<Vec<u8>, PrometheusError> {
    let inflated = inflated_len(body)?;
    if inflated > limit {
        return Err(PrometheusError::TooLarge { inflated, limit });
    }
    snap::raw::Decoder::new()
        .decompress_vec(body)
        .map_err(|e| PrometheusError::Snappy(e.to_string()))
}

/// An inflated `WriteRequest` decoded (see [`write_request_bytes`] for what it will hold).
pub fn decode_write_inflated(bytes: &[u8]) -> Result<WriteRequest, PrometheusError> {
    WriteRequest::decode(bytes).map_err(|e| protobuf_error("WriteRequest", e.to_string()))
}

/// The most memory the `WriteRequest` in `bytes` (inflated) takes once decoded, found by
/// walking its fields without decoding them, so a server can admit it first. Decoded
/// messages take far more than their wire bytes when they are small: an empty series is
/// 2 bytes on the wire and a 96-byte struct in memory, a label of two empty strings 2
/// bytes and 48, and each `Vec` may have doubled its capacity as prost pushed into it.
pub fn write_request_bytes(bytes: &[u8]) -> Result<usize, PrometheusError> {
    use std::mem::size_of;
    const ALLOCATION: usize = 16;
    // The request's two `Vec`s (series, metadata) reserve room for four at their first push:
    // one series alone takes four series' room (found by the property test below: a
    // series of one empty label and one zero sample, 724 bytes admitted for 744 held).
    let mut total = 4 * size_of::<TimeSeries>() + 4 * size_of::<Vec<u8>>();
    walk_fields(bytes, &mut |field, payload| {
        match (field, payload) {
            (1, Some(series)) => {
                // A `Vec`'s first push reserves room for four (`RawVec`'s minimum).
                total +=
                    2 * size_of::<TimeSeries>() + 4 * (size_of::<Label>() + size_of::<Sample>());
                walk_fields(series, &mut |field, payload| {
                    total += match (field, payload) {
                        (1, Some(label)) => 2 * size_of::<Label>() + 2 * ALLOCATION + label.len(),
                        (2, Some(_)) => 2 * size_of::<Sample>(),
                        (3 | 4, Some(raw)) => 4 * size_of::<Vec<u8>>() + ALLOCATION + raw.len(),
                        _ => 0,
                    };
                    Ok(())
                })?;
            }
            (3, Some(raw)) => total += 4 * size_of::<Vec<u8>>() + ALLOCATION + raw.len(),
            _ => {}
        }
        Ok(())
    })?;
    Ok(total)
}

/// Calls `visit(field number, Some(payload))` for each length-delimited field of the
/// protobuf message in `bytes`, `visit(field, None)` for the others; an error if the bytes
/// are not a well-formed sequence of fields.
fn walk_fields(
    mut bytes: &[u8],
    visit: &mut impl FnMut(u64, Option<&[u8]>) -> Result<(), PrometheusError>,
) -> Result<(), PrometheusError> {
    let malformed = |what: &str| protobuf_error("WriteRequest", what.to_string());
    while !bytes.is_empty() {
        let key = varint(&mut bytes).ok_or_else(|| malformed("a truncated field key"))?;
        let field = key >> 3;
        let skip = match key & 7 {
            0 => {
                varint(&mut bytes).ok_or_else(|| malformed("a truncated varint"))?;
                0
            }
            1 => 8,
            5 => 4,
            2 => {
                let len = varint(&mut bytes).ok_or_else(|| malformed("a truncated length"))?;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&len| len <= bytes.len())
                    .ok_or_else(|| malformed("a length past the end of the message"))?;
                let (payload, rest) = bytes.split_at(len);
                visit(field, Some(payload))?;
                bytes = rest;
                continue;
            }
            other => return Err(malformed(&format!("wire type {other}"))),
        };
        if skip > bytes.len() {
            return Err(malformed("a truncated fixed-size field"));
        }
        bytes = &bytes[skip..];
        visit(field, None)?;
    }
    Ok(())
}

/// A base-128 varint (at most 10 bytes) from the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Some(value);
        }
    }
    None
}

fn protobuf_error(message: &'static str, reason: String) -> PrometheusError {
    PrometheusError::Protobuf { message, reason }
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
    let bytes = inflate(body, limit)?;
    M::decode(bytes.as_slice()).map_err(|e| protobuf_error(message, e.to_string()))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What a decoded request holds on the heap, counted from its capacities.
    fn heap_bytes(request: &WriteRequest) -> usize {
        use std::mem::size_of;
        let raw = |v: &Vec<Vec<u8>>| {
            v.capacity() * size_of::<Vec<u8>>() + v.iter().map(|b| b.capacity()).sum::<usize>()
        };
        request.timeseries.capacity() * size_of::<TimeSeries>()
            + raw(&request.metadata)
            + request
                .timeseries
                .iter()
                .map(|t| {
                    t.labels.capacity() * size_of::<Label>()
                        + t.labels
                            .iter()
                            .map(|l| l.name.capacity() + l.value.capacity())
                            .sum::<usize>()
                        + t.samples.capacity() * size_of::<Sample>()
                        + raw(&t.exemplars)
                        + raw(&t.histograms)
                })
                .sum::<usize>()
    }

    proptest! {
        #[test]
        fn a_request_is_admitted_for_at_least_what_it_takes_decoded(
            series in prop::collection::vec(
                (
                    prop::collection::vec(("[a-z]{0,12}", "[a-z0-9]{0,20}"), 0..12),
                    prop::collection::vec((any::<i64>(), any::<f64>()), 0..20),
                    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..8), 0..3),
                ),
                0..40,
            ),
        ) {
            let request = WriteRequest {
                timeseries: series
                    .into_iter()
                    .map(|(labels, samples, exemplars)| TimeSeries {
                        labels: labels
                            .into_iter()
                            .map(|(name, value)| Label { name, value })
                            .collect(),
                        samples: samples
                            .into_iter()
                            .map(|(timestamp, value)| Sample { value, timestamp })
                            .collect(),
                        exemplars,
                        histograms: Vec::new(),
                    })
                    .collect(),
                metadata: vec![b"help".to_vec()],
            };
            let bytes = request.encode_to_vec();
            let decoded = decode_write_inflated(&bytes).unwrap();
            prop_assert_eq!(&decoded, &request);
            let admitted = write_request_bytes(&bytes).unwrap();
            prop_assert!(admitted >= heap_bytes(&decoded), "{} < {}", admitted, heap_bytes(&decoded));
        }

        #[test]
        fn walking_garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = write_request_bytes(&bytes);
        }
    }

    #[test]
    fn empty_series_are_admitted_for_their_structs_not_their_two_bytes() {
        // 100,000 empty series: 200 KB on the wire, about 10 MB decoded.
        let bytes: Vec<u8> = [0x0a, 0x00].repeat(100_000);
        let decoded = decode_write_inflated(&bytes).unwrap();
        let admitted = write_request_bytes(&bytes).unwrap();
        assert!(admitted >= heap_bytes(&decoded));
        assert!(
            admitted > 40 * bytes.len(),
            "{admitted} bytes for {} on the wire",
            bytes.len()
        );
        for malformed in [&[0x0a, 0x05, 0x00][..], &[0x0b], &[0x08], &[0x0a, 0x80]] {
            assert!(write_request_bytes(malformed).is_err(), "{malformed:?}");
        }
    }

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

//! W1 against a running server: the client's batching producer sends the events over the
//! binary protocol or HTTP; a trial ends when the producer has every event acknowledged
//! (durable on the server). Between trials the stream is cleared with the two-step clear of
//! the ChronicleDB API, as the published benchmark did.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tidemark_client::{
    BinaryClient, ClientError, FullBuffer, HttpClient, Producer, ProducerOptions, Transport,
};
use tidemark_query::time::{format_instant, now_ns};

use crate::w1::{cores, generate, progress_bar, schema, Trial, STREAM};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Binary,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Binary => "binary",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServerInsertConfig {
    pub http: String,
    pub binary: SocketAddr,
    pub token: Option<String>,
    pub protocol: Protocol,
    pub event_counts: Vec<usize>,
    pub trials: usize,
    pub buffer_sizes: Vec<usize>,
    pub full: FullBuffer,
    /// Batches in flight at once per producer.
    pub max_in_flight: usize,
    pub progress: bool,
}

/// Runs the trials; each row of the result is one trial.
pub fn run_server(config: &ServerInsertConfig) -> Result<Vec<Trial>, ClientError> {
    let http = HttpClient::new(&config.http, config.token.as_deref());
    http.create_stream(STREAM, &schema().to_spec())?;
    let transport: Arc<dyn Transport> = match config.protocol {
        Protocol::Http => Arc::new(HttpClient::new(&config.http, config.token.as_deref())),
        Protocol::Binary => Arc::new(BinaryClient::connect(
            config.binary,
            config.token.as_deref(),
        )?),
    };
    let measured_on = format!("{} {}-core", format_instant(now_ns()), cores());
    let schema = Arc::new(schema());
    let mut trials = Vec::new();
    for &buffer_bytes in &config.buffer_sizes {
        for &count in &config.event_counts {
            for trial in 1..=config.trials {
                clear(&http)?;
                // Generated before the clock starts, in pieces the producer re-cuts to its
                // buffer size.
                let batches = generate(count, 10_000, now_ns(), trial as u64);
                let bar = progress_bar(
                    config.progress,
                    count,
                    &format!(
                        "{} buffer {}, {count} events, trial {trial}/{}",
                        config.protocol.name(),
                        human_bytes(buffer_bytes),
                        config.trials
                    ),
                );
                let producer = Producer::new(
                    transport.clone(),
                    STREAM,
                    schema.clone(),
                    ProducerOptions {
                        buffer_bytes,
                        max_delay: Duration::from_millis(100),
                        max_in_flight: config.max_in_flight,
                        full: config.full,
                        retry_for: Duration::from_secs(60),
                        // Nothing fails on purpose here; a retry would end the trial late.
                        idempotent: false,
                    },
                );
                let started = Instant::now();
                for batch in &batches {
                    let mut row = 0;
                    while row < batch.len() {
                        match producer.push_batch(batch, row) {
                            Ok(next) => row = next,
                            // Non-blocking mode: the application would do other work; the
                            // benchmark just tries again shortly.
                            Err(ClientError::WouldBlock) => {
                                std::thread::sleep(Duration::from_micros(50))
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    bar.inc(batch.len() as u64);
                }
                let acknowledged = producer.close()?;
                let elapsed = started.elapsed();
                bar.finish_and_clear();
                if acknowledged != count as u64 {
                    return Err(ClientError::Protocol(format!(
                        "{acknowledged} of {count} events acknowledged"
                    )));
                }
                let buffer_type = match config.full {
                    FullBuffer::Block => "blocking",
                    FullBuffer::WouldBlock => "non-blocking",
                };
                trials.push(Trial::timed(
                    format!("server-{}", config.protocol.name()),
                    buffer_type,
                    buffer_bytes,
                    count,
                    trial,
                    elapsed,
                    &measured_on,
                ));
            }
        }
    }
    Ok(trials)
}

/// The two-step clear: DELETE answers a token, the confirmation clears.
fn clear(http: &HttpClient) -> Result<(), ClientError> {
    let path = format!("/api/event-store/streams/{STREAM}/events");
    let request = http.request("DELETE", &path, None)?;
    let body = json!({"streamName": request["streamName"], "token": request["token"]});
    http.request(
        "POST",
        "/api/event-store/clear-request-confirmation",
        Some(("application/json", body.to_string().into_bytes())),
    )?;
    Ok(())
}

/// `1KB`, `10MB`: the buffer sizes as workloads.md writes them.
pub fn human_bytes(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}MB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}KB", b >> 10),
        b => format!("{b}B"),
    }
}

/// Parses `1KB`, `10kb`, `1MB`, `512` (bytes) into bytes (binary multiples).
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let t = text.trim().to_ascii_uppercase();
    let (digits, scale) = if let Some(d) = t.strip_suffix("MB") {
        (d, 1 << 20)
    } else if let Some(d) = t.strip_suffix("KB") {
        (d, 1 << 10)
    } else if let Some(d) = t.strip_suffix('B') {
        (d, 1)
    } else {
        (t.as_str(), 1)
    };
    digits
        .trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{text:?} is not a size (examples: 1KB, 100KB, 1MB, 10MB)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_trip() {
        for (text, bytes) in [
            ("1KB", 1024),
            ("10kb", 10 * 1024),
            ("1MB", 1 << 20),
            ("10MB", 10 << 20),
            ("512", 512),
        ] {
            assert_eq!(parse_bytes(text), Ok(bytes));
        }
        for bad in ["", "0", "MB", "1GB", "-1KB"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
        assert_eq!(human_bytes(10 << 20), "10MB");
        assert_eq!(human_bytes(100 * 1024), "100KB");
        assert_eq!(human_bytes(1000), "1000B");
    }
}

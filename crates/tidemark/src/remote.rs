//! How a command reaches a running server: its address, token and the CA to trust, and the
//! server's answers turned back into what the same command prints for a data directory.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use serde_json::Value as Json;
use tidemark_client::{ClientError, HttpClient};
use tidemark_core::{EventBatch, Schema};
use tidemark_engine::{ConsumerInfo, Partition, Retention, StreamInfo};

/// `--server URL`: run the command through a server instead of on `--data-dir`.
#[derive(clap::Args, Clone, Default)]
pub struct Remote {
    /// A server's HTTP address (http://127.0.0.1:8080, https://db:8080, or 127.0.0.1:8080);
    /// without it the command works on --data-dir, which no server may hold open.
    #[arg(long)]
    pub server: Option<String>,
    /// Bearer token for the server (also from TIDEMARK_TOKEN).
    #[arg(long, env = "TIDEMARK_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A PEM file of the certificate authorities to trust for an https server (default: the
    /// Mozilla roots).
    #[arg(long, requires = "server")]
    pub ca: Option<PathBuf>,
}

impl Remote {
    /// The client for `--server`, if one was given.
    pub fn client(&self) -> Result<Option<HttpClient>> {
        self.server
            .as_deref()
            .map(|server| client(server, self.token.as_deref(), self.ca.as_ref()))
            .transpose()
    }
}

/// The HTTP client for `server` (`http://host:port`, `https://...`, or `host:port`).
pub fn client(server: &str, token: Option<&str>, ca: Option<&PathBuf>) -> Result<HttpClient> {
    Ok(match ca {
        Some(ca) => HttpClient::with_ca(server, token, ca)?,
        None => HttpClient::new(server, token),
    })
}

/// A stream's info as the server's `GET /v1/streams/{s}` gives it.
pub fn stream_info(client: &HttpClient, name: &str) -> Result<StreamInfo> {
    let answer = client.stream_info(name)?;
    info_of(&answer).with_context(|| format!("an unexpected answer from the server: {answer}"))
}

fn info_of(answer: &Json) -> Result<StreamInfo> {
    let fields: Vec<String> = answer["schema"]
        .as_array()
        .ok_or_else(|| anyhow!("no schema"))?
        .iter()
        .map(|f| {
            format!(
                "{}:{}",
                f["name"].as_str().unwrap_or("?"),
                f["type"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let count = |key: &str| answer[key].as_u64().unwrap_or(0);
    let range = &answer["timeRange"];
    let flushed = count("flushedEvents");
    let bytes = count("bytesOnDisk");
    Ok(StreamInfo {
        name: answer["name"].as_str().unwrap_or_default().to_string(),
        schema: Arc::new(Schema::parse_spec(&fields.join(","))?),
        evolving: answer["evolving"] == true,
        event_count: count("eventCount"),
        time_range: range["first"].as_i64().zip(range["last"].as_i64()),
        bytes_on_disk: bytes,
        tiered_bytes: count("tieredBytes"),
        flushed_events: flushed,
        compressed_bytes_per_event: (flushed > 0).then(|| bytes as f64 / flushed as f64),
        segments: count("segments") as usize,
        retention: Retention {
            max_age_ns: answer["retention"]["maxAgeNs"].as_i64(),
            max_bytes: answer["retention"]["maxBytes"].as_u64(),
        },
        out_of_order_window_ns: answer["outOfOrderWindow"]["ns"].as_i64(),
        own_out_of_order_window: answer["outOfOrderWindow"]["isDefault"] == false,
        // A server from before partitions has streams of a day.
        partition: answer["partition"]["ns"]
            .as_i64()
            .and_then(|ns| Partition::new(ns).ok())
            .unwrap_or_default(),
        next_position: answer["nextPosition"].as_u64(),
        consumers: answer["consumers"]
            .as_array()
            .map(|consumers| consumers.iter().filter_map(consumer_of).collect())
            .unwrap_or_default(),
    })
}

fn consumer_of(consumer: &Json) -> Option<ConsumerInfo> {
    Some(ConsumerInfo {
        name: consumer["name"].as_str()?.to_string(),
        position: consumer["position"].as_u64()?,
        behind: consumer["behind"].as_u64()?,
    })
}

/// Appends a batch through the server, waiting out back-pressure (429: nothing was stored,
/// send it again after the hint). Returns the events stored.
pub fn append(client: &HttpClient, stream: &str, batch: &EventBatch) -> Result<u64> {
    loop {
        match client.append(stream, batch) {
            Ok(ack) => return Ok(ack.events),
            Err(ClientError::TryLater { retry_after, .. }) => std::thread::sleep(retry_after),
            Err(e) => return Err(e.into()),
        }
    }
}

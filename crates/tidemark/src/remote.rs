//! How a command reaches a running server: its address, token and the CA to trust.

use std::path::PathBuf;

use anyhow::Result;
use tidemark_client::HttpClient;

/// The HTTP client for `server` (`http://host:port`, `https://...`, or `host:port`).
pub fn client(server: &str, token: Option<&str>, ca: Option<&PathBuf>) -> Result<HttpClient> {
    Ok(match ca {
        Some(ca) => HttpClient::with_ca(server, token, ca)?,
        None => HttpClient::new(server, token),
    })
}

//! A real server on ephemeral ports, in this process, for the integration tests.

// Each test file uses a different part of this module.
#![allow(dead_code)]

use serde_json::Value as Json;
use tidemark_client::{ClientError, HttpClient};

pub use tidemark_testkit::TestServer;

/// A request whose answer is expected: the JSON, or the refusal's (code, message).
pub fn call(
    client: &HttpClient,
    method: &str,
    path: &str,
    body: Option<Json>,
) -> Result<Json, (String, String)> {
    let body = body.map(|b| ("application/json", b.to_string().into_bytes()));
    client.request(method, path, body).map_err(|e| match e {
        ClientError::Refused { code, message } => (code, message),
        ClientError::TryLater { message, .. } => ("overloaded".into(), message),
        other => ("client".into(), other.to_string()),
    })
}

/// Creates stream `name` with the schema spec `schema` (`"SYMBOL:STRING,PRICE:DOUBLE"`).
pub fn create(server: &TestServer, name: &str, schema: &str) {
    call(
        &server.client(),
        "POST",
        "/v1/streams",
        Some(serde_json::json!({"name": name, "schema": schema})),
    )
    .unwrap();
}

/// Appends the events of `ndjson` (one JSON object a line) to `stream`.
pub fn append(server: &TestServer, stream: &str, ndjson: &str) -> Result<Json, String> {
    server
        .client()
        .request(
            "POST",
            &format!("/v1/streams/{stream}/events"),
            Some(("application/x-ndjson", ndjson.as_bytes().to_vec())),
        )
        .map_err(|e| e.to_string())
}

/// The Python with the packages of requirements-test.txt (DuckDB, the InfluxDB clients):
/// `make test` makes one in `.venv` and names it in `TIDEMARK_TEST_PYTHON`. Without it a
/// test that needs it fails rather than pass unchecked.
pub fn python() -> std::path::PathBuf {
    if let Some(python) = std::env::var_os("TIDEMARK_TEST_PYTHON") {
        return std::path::PathBuf::from(python);
    }
    let workspace_venv =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(
        workspace_venv.exists(),
        "no Python with the test packages: run `make test` (it makes .venv from \
         requirements-test.txt), or set TIDEMARK_TEST_PYTHON"
    );
    workspace_venv
}

/// Runs `tests/python/{script}` with `args` in [`python`] and returns what it printed;
/// a failing script fails the test with its output.
pub fn run_python_script(script: &str, args: &[&str]) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let output = std::process::Command::new(python())
        .arg(path)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{script}:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// Status, `Retry-After` and body of a raw request.
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<String>,
    pub bytes: Vec<u8>,
    /// `bytes` as text (lossy), for messages.
    pub body: String,
}

/// POSTs `body` with `headers` to `path`; any status is an answer.
pub fn post(server: &TestServer, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut request = agent.post(&format!("{}{path}", server.url()));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut response = request.send(body).unwrap();
    let bytes = response.body_mut().read_to_vec().unwrap();
    Answer {
        status: response.status().as_u16(),
        retry_after: response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string()),
        body: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
    }
}

/// The server's `/metrics` text.
pub fn metrics_text(server: &TestServer) -> String {
    metrics_text_with(server, None)
}

/// [`metrics_text`] from a server with tokens, presenting `token`.
pub fn metrics_text_with(server: &TestServer, token: Option<&str>) -> String {
    let agent: ureq::Agent = ureq::Agent::config_builder().build().into();
    let mut request = agent.get(&format!("{}/metrics", server.url()));
    if let Some(token) = token {
        request = request.header("Authorization", &format!("Bearer {token}"));
    }
    request.call().unwrap().body_mut().read_to_string().unwrap()
}

/// An HTTP write whose body stops arriving after `bytes` bytes, holding that much of the
/// write budget until the connection is dropped; returned once the server has admitted them.
pub fn hold_write_budget(server: &TestServer, bytes: usize) -> std::net::TcpStream {
    use std::io::Write as _;
    let mut slow = std::net::TcpStream::connect(server.http).unwrap();
    let head = format!(
        "POST /write HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        bytes + 1
    );
    slow.write_all(head.as_bytes()).unwrap();
    slow.write_all(&vec![b'#'; bytes]).unwrap();
    let held = format!("tidemark_ingest_bytes_in_flight {bytes}\n");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !metrics_text(server).contains(&held) {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            metrics_text(server)
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    slow
}

/// A port free on 127.0.0.1 now (for a program the test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

//! A real server on ephemeral ports, in this process, for the integration tests.

// Each test file uses a different part of this module.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread::JoinHandle;

use serde_json::Value as Json;
use tidemark_client::{ClientError, HttpClient};
use tidemark_engine::Options;
use tidemark_server::{Config, Server};

pub struct TestServer {
    pub http: SocketAddr,
    pub binary: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    pub dir: tempfile::TempDir,
}

impl TestServer {
    pub fn start(configure: impl FnOnce(&mut Config)) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config {
            data_dir: dir.path().to_path_buf(),
            http: "127.0.0.1:0".parse().unwrap(),
            binary: "127.0.0.1:0".parse().unwrap(),
            ..Config::default()
        };
        configure(&mut config);
        let (addrs_tx, addrs_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let server = Server::bind(config, Options::default()).await.unwrap();
                addrs_tx
                    .send((server.http_addr(), server.binary_addr()))
                    .unwrap();
                server
                    .run(async move {
                        let _ = stop_rx.await;
                    })
                    .await
                    .unwrap();
            });
        });
        let (http, binary) = addrs_rx.recv().unwrap();
        TestServer {
            http,
            binary,
            stop: Some(stop_tx),
            thread: Some(thread),
            dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.http)
    }

    pub fn client(&self) -> HttpClient {
        HttpClient::new(&self.url(), None)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

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

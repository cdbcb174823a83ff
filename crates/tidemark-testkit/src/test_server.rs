//! A real server on ephemeral ports over a fresh directory, in the test's process: the
//! server's integration tests drive it over HTTP, the binary protocol, Graphite and pg.

use std::net::SocketAddr;

use tidemark_bench::background_server::BackgroundServer;
use tidemark_client::HttpClient;
use tidemark_engine::Options;
use tidemark_server::Config;

pub struct TestServer {
    pub http: SocketAddr,
    pub binary: SocketAddr,
    pub graphite: Option<SocketAddr>,
    pub pg: Option<SocketAddr>,
    server: Option<BackgroundServer>,
    pub dir: tempfile::TempDir,
}

impl TestServer {
    pub fn start(configure: impl FnOnce(&mut Config)) -> TestServer {
        TestServer::start_with(configure, Options::default())
    }

    pub fn start_with(configure: impl FnOnce(&mut Config), options: Options) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config {
            data_dir: dir.path().to_path_buf(),
            http: "127.0.0.1:0".parse().unwrap(),
            binary: "127.0.0.1:0".parse().unwrap(),
            ..Config::default()
        };
        configure(&mut config);
        let server = BackgroundServer::start(config, options).unwrap();
        TestServer {
            http: server.http_addr(),
            binary: server.binary_addr(),
            graphite: server.graphite_addr(),
            pg: server.pg_addr(),
            server: Some(server),
            dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.http)
    }

    pub fn client(&self) -> HttpClient {
        HttpClient::new(&self.url(), None)
    }

    /// Stops the server as SIGTERM would: returns once it has stopped (requests in flight
    /// finished, or dropped after `limits.shutdown_grace_ms`).
    pub fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.stop().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // Stopped before its directory is removed.
        if let Some(server) = self.server.take() {
            let _ = server.stop();
        }
    }
}

//! With a certificate configured, both listeners speak TLS (and only TLS). The test
//! certificate in `tests/tls/` is for localhost and 127.0.0.1, signed by the test CA `ca.pem`
//! (whose key was thrown away), valid until 2125.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::TestServer;
use tidemark_protocol::{decode_frame, Request, Response};
use tidemark_server::config::Tls;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tls")
        .join(name)
}

fn connector() -> TlsConnector {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(fixture("ca.pem")).unwrap())
        .unwrap();
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// Sends `request` over TLS and reads until the server closes.
async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> Vec<u8> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector().connect(name, tcp).await.unwrap();
    tls.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // Read until a whole answer is there (the binary protocol keeps the connection open).
    loop {
        let n = tls.read(&mut buf).await.unwrap_or(0);
        answer.extend_from_slice(&buf[..n]);
        if n == 0 || decode_frame(&answer, 1 << 20).ok().flatten().is_some() {
            return answer;
        }
    }
}

#[test]
fn both_listeners_speak_tls_only() {
    let server = TestServer::start(|c| {
        c.tls = Some(Tls {
            cert: fixture("cert.pem"),
            key: fixture("key.pem"),
        })
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let http = exchange(
            server.http,
            b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )
        .await;
        let http = String::from_utf8_lossy(&http);
        assert!(http.starts_with("HTTP/1.1 200"), "{http}");
        assert!(http.contains("\"status\":\"pass\""), "{http}");

        let mut ping = Vec::new();
        Request::Ping.encode(5, &mut ping).unwrap();
        let answer = exchange(server.binary, &ping).await;
        let (frame, _) = decode_frame(&answer, 1 << 20).unwrap().unwrap();
        assert_eq!(frame.request_id, 5);
        assert_eq!(
            Response::decode(&frame).unwrap(),
            Response::Ack {
                lsn: 0,
                events: 0,
                service_micros: 0,
                positions: None,
            }
        );
    });
    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain =
        tidemark_client::HttpClient::new(&server.url(), None).request("GET", "/health", None);
    assert!(plain.is_err(), "{plain:?}");
}

#[test]
fn a_missing_or_bad_certificate_stops_the_start() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (cert, key) in [
        (fixture("nope.pem"), fixture("key.pem")),
        (fixture("key.pem"), fixture("key.pem")),
        (fixture("cert.pem"), fixture("cert.pem")),
    ] {
        let config = tidemark_server::Config {
            data_dir: dir.path().to_path_buf(),
            http: "127.0.0.1:0".parse().unwrap(),
            binary: "127.0.0.1:0".parse().unwrap(),
            tls: Some(Tls {
                cert: cert.clone(),
                key: key.clone(),
            }),
            ..Default::default()
        };
        let started = runtime.block_on(tidemark_server::Server::bind(config, Default::default()));
        let err = started
            .err()
            .unwrap_or_else(|| panic!("{cert:?} / {key:?} accepted"));
        assert!(err.to_string().contains("tls."), "{err}");
    }
}

//! TLS for both listeners, through rustls (with the `ring` provider), when the configuration
//! names a certificate chain and a private key (PEM files).
//!
//! Handshakes run in their own tasks, never in the accept loop, so a client that connects and
//! stalls cannot hold up the others; a handshake that takes longer than
//! [`HANDSHAKE_TIMEOUT`] is dropped.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::config::ConfigError;

pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads the certificate chain and key and builds the acceptor both listeners share.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, ConfigError> {
    let invalid = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        ConfigError::Invalid(format!("tls.{what} {}: {e}", path.display()))
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| invalid("cert", cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid("cert", cert, &e))?;
    if chain.is_empty() {
        return Err(invalid("cert", cert, &"no certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| invalid("key", key, &e))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::Invalid(format!("tls: {e}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| ConfigError::Invalid(format!("tls: {e}")))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts TCP connections and hands over those whose handshake completed.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: AbortHandle,
}

impl TlsListener {
    pub fn new(listener: TcpListener, acceptor: TlsAcceptor) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (done, ready) = mpsc::channel(64);
        let accepting = tokio::spawn(async move {
            loop {
                let (socket, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a TLS connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                crate::socket::set_up(&socket);
                let (acceptor, done) = (acceptor.clone(), done.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await {
                        Ok(Ok(stream)) => {
                            let _ = done.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        })
        .abort_handle();
        Ok(TlsListener {
            ready,
            local,
            accepting,
        })
    }

    /// The next connection with a completed handshake.
    pub async fn next(&mut self) -> Option<(TlsStream<TcpStream>, SocketAddr)> {
        self.ready.recv().await
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.next().await {
            Some(accepted) => accepted,
            // The accept loop only ends when the listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

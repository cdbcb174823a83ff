//! A server on a thread of its own, with its own async runtime: for programs and tests that
//! are not async (the benchmark's in-process server; the integration tests, through
//! `tidemark-testkit`). Its listeners are bound when [`BackgroundServer::start`] returns; it
//! shuts down gracefully when stopped or dropped.
//!
//! Must never know about: what is served; it drives [`tidemark_server::Server`]'s public
//! API as `tidemark serve` does.

use std::net::SocketAddr;
use std::thread::JoinHandle;

use tidemark_engine::Options;
use tokio::sync::oneshot;

use tidemark_server::{Config, ServeError, Server};

pub struct BackgroundServer {
    bound: Bound,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), ServeError>>>,
}

/// The addresses the server's listeners are bound to.
struct Bound {
    http: SocketAddr,
    binary: SocketAddr,
    graphite: Option<SocketAddr>,
    pg: Option<SocketAddr>,
}

impl BackgroundServer {
    /// Opens the stores of `config`, binds its listeners and serves on a new thread.
    pub fn start(config: Config, options: Options) -> Result<BackgroundServer, ServeError> {
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("tidemark-server".into())
            .spawn(move || -> Result<(), ServeError> {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
                    .map_err(ServeError::Http)?;
                runtime.block_on(async move {
                    let server = match Server::bind(config, options).await {
                        Ok(server) => server,
                        Err(e) => {
                            let _ = bound_tx.send(Err(e));
                            return Ok(());
                        }
                    };
                    let _ = bound_tx.send(Ok(Bound {
                        http: server.http_addr(),
                        binary: server.binary_addr(),
                        graphite: server.graphite_addr(),
                        pg: server.pg_addr(),
                    }));
                    server
                        .run(async move {
                            let _ = stopped.await;
                        })
                        .await
                })
            })
            .map_err(ServeError::Http)?;
        let bound = match bound_rx.recv() {
            Ok(Ok(addrs)) => addrs,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            // The thread ended before binding: its runtime did not start.
            Err(_) => {
                return Err(match thread.join() {
                    Ok(Err(e)) => e,
                    _ => ServeError::Http(std::io::Error::other(
                        "the server thread ended before binding",
                    )),
                })
            }
        };
        Ok(BackgroundServer {
            bound,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.bound.http
    }

    pub fn binary_addr(&self) -> SocketAddr {
        self.bound.binary
    }

    /// The Graphite plaintext address, when the configuration turns the listener on.
    pub fn graphite_addr(&self) -> Option<SocketAddr> {
        self.bound.graphite
    }

    /// The PostgreSQL wire address, when the configuration turns the listener on.
    pub fn pg_addr(&self) -> Option<SocketAddr> {
        self.bound.pg
    }

    /// Shuts the server down (requests in flight finish) and returns how serving ended.
    pub fn stop(mut self) -> Result<(), ServeError> {
        self.shut_down()
    }

    fn shut_down(&mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(outcome)) => outcome,
            Some(Err(_)) => Err(ServeError::Http(std::io::Error::other(
                "the server thread panicked",
            ))),
            None => Ok(()),
        }
    }
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        let _ = self.shut_down();
    }
}

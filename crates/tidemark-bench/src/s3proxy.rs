//! S3Proxy, the real S3-compatible server, started on 127.0.0.1 with SigV4 authorization
//! over a fresh directory: the bucket `bench tier` tiers to, and (through
//! `tidemark-testkit`) the one the tests of every crate that tiers use.
//!
//! It is installed into `.peers/s3proxy` by `peers/install.sh s3proxy` (which `.ci/run`
//! runs); [`S3Proxy::start`] says [`S3ProxyError::NotInstalled`] without it, and whether
//! that skips or fails is the caller's choice.
//!
//! Owns: the server's process, port, configuration and data directory (removed with it).
//! Must never know about: what is stored in the bucket, or the engine.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tidemark_tier::{Bucket, Credentials, TierError, TierLocation};

pub const ACCESS_KEY: &str = "tidemark-test";
pub const SECRET: &str = "tidemark-test-secret";
pub const BUCKET: &str = "tier-test";

/// S3Proxy's logging at INFO (see the file: logback's default, DEBUG, makes S3Proxy
/// several times slower and fills the disk).
const LOGBACK: &str = include_str!("../../../peers/s3proxy/logback.xml");

/// How long S3Proxy (a JVM) may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Why S3Proxy is not serving.
#[derive(Debug, thiserror::Error)]
pub enum S3ProxyError {
    #[error("S3Proxy is not installed ({}): peers/install.sh s3proxy", .0.display())]
    NotInstalled(PathBuf),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("S3Proxy did not listen on {addr} within {START_TIMEOUT:?} (its log: {})", .log.display())]
    NotListening { addr: SocketAddr, log: PathBuf },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> S3ProxyError {
    let what = what.into();
    move |source| S3ProxyError::Io { what, source }
}

/// S3Proxy serving a fresh directory; killed when dropped.
pub struct S3Proxy {
    child: Child,
    pub endpoint: String,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl S3Proxy {
    /// S3Proxy with bucket [`BUCKET`], listening when this returns.
    pub fn start() -> Result<S3Proxy, S3ProxyError> {
        let libs = libs();
        if !libs.is_dir() {
            return Err(S3ProxyError::NotInstalled(libs));
        }
        let dir = tempfile::tempdir().map_err(io("creating S3Proxy's directory"))?;
        let data = dir.path().join("data");
        // A bucket of the filesystem backend is a directory under its base.
        std::fs::create_dir_all(data.join(BUCKET)).map_err(io("creating S3Proxy's bucket"))?;
        let addr = {
            let listener =
                TcpListener::bind("127.0.0.1:0").map_err(io("finding a port for S3Proxy"))?;
            listener
                .local_addr()
                .map_err(io("finding a port for S3Proxy"))?
        };
        let endpoint = format!("http://{addr}");
        let properties = dir.path().join("s3proxy.conf");
        std::fs::write(
            &properties,
            format!(
                "s3proxy.endpoint={endpoint}\n\
                 s3proxy.authorization=aws-v2-or-v4\n\
                 s3proxy.identity={ACCESS_KEY}\n\
                 s3proxy.credential={SECRET}\n\
                 jclouds.provider=filesystem\n\
                 jclouds.filesystem.basedir={}\n",
                data.display()
            ),
        )
        .map_err(io(format!("writing {}", properties.display())))?;
        let logback = dir.path().join("logback.xml");
        std::fs::write(&logback, LOGBACK).map_err(io(format!("writing {}", logback.display())))?;
        let child = spawn(dir.path(), &libs)?;
        // Owned before waiting: a proxy that never listens is still killed (on drop).
        let proxy = S3Proxy {
            child,
            endpoint,
            addr,
            dir,
        };
        proxy.wait_until_listening()?;
        Ok(proxy)
    }

    /// The location of `prefix` in [`BUCKET`] on this server.
    pub fn location(&self, prefix: &str) -> Result<TierLocation, TierError> {
        Ok(TierLocation::parse(&format!("s3://{BUCKET}/{prefix}"))?
            .with_endpoint(&self.endpoint)
            .with_region("us-east-1"))
    }

    /// The bucket at `prefix`, signing with the test key and `secret`.
    pub fn bucket(&self, prefix: &str, secret: &str) -> Result<Bucket, TierError> {
        Bucket::open(self.location(prefix)?, Some(credentials(secret)))
    }

    /// The file holding object `name` of the bucket (the filesystem backend keeps each
    /// object as a file): tests tamper with objects there.
    pub fn object_path(&self, name: &str) -> PathBuf {
        self.dir.path().join("data").join(BUCKET).join(name)
    }

    /// Stops the server (as a crash would: SIGKILL); [`S3Proxy::restart`] brings it back
    /// on the same port and directory.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn restart(&mut self) -> Result<(), S3ProxyError> {
        self.stop();
        self.child = spawn(self.dir.path(), &libs())?;
        self.wait_until_listening()
    }

    fn wait_until_listening(&self) -> Result<(), S3ProxyError> {
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_err() {
            if Instant::now() >= deadline {
                return Err(S3ProxyError::NotListening {
                    addr: self.addr,
                    log: self.dir.path().join("s3proxy.log"),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }
}

/// The test access key with `secret` (a wrong one is refused as S3 refuses it).
pub fn credentials(secret: &str) -> Credentials {
    Credentials {
        access_key_id: ACCESS_KEY.into(),
        secret_access_key: secret.into(),
        session_token: None,
    }
}

/// Where `peers/install.sh s3proxy` puts S3Proxy's jars, in this source tree.
fn libs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.peers/s3proxy/libs")
}

fn spawn(dir: &Path, libs: &Path) -> Result<Child, S3ProxyError> {
    let log_path = dir.join("s3proxy.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io(format!("opening {}", log_path.display())))?;
    Command::new("java")
        .arg(format!(
            "-Dlogback.configurationFile={}",
            dir.join("logback.xml").display()
        ))
        .arg("-cp")
        .arg(format!("{}/*", libs.display()))
        .arg("org.gaul.s3proxy.Main")
        .arg("--properties")
        .arg(dir.join("s3proxy.conf"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(io("starting S3Proxy with java"))
}

impl Drop for S3Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

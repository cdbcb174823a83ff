//! S3Proxy for tests (feature `s3proxy`): the real S3-compatible server, started on
//! 127.0.0.1 with SigV4 authorization over a fresh directory. The tests of every crate that
//! tiers (this one, the engine's, the server's) start it through here.
//!
//! It is installed into `.peers/s3proxy` by `peers/install.sh s3proxy` (which `.ci/run`
//! runs). Without it [`S3Proxy::start`] fails under CI (`CI` set) and answers `None` (the
//! test skips, saying why) elsewhere.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Bucket, Credentials, TierLocation};

pub const ACCESS_KEY: &str = "tidemark-test";
pub const SECRET: &str = "tidemark-test-secret";
pub const BUCKET: &str = "tier-test";

/// S3Proxy's logging at INFO (see the file: logback's default, DEBUG, makes S3Proxy
/// several times slower and fills the disk).
const LOGBACK: &str = include_str!("../../../peers/s3proxy/logback.xml");

/// S3Proxy serving a fresh directory; killed when dropped.
pub struct S3Proxy {
    child: Child,
    pub endpoint: String,
    dir: tempfile::TempDir,
}

impl S3Proxy {
    /// S3Proxy with bucket [`BUCKET`], or `None` (skip) when it is not installed outside CI.
    pub fn start() -> Option<S3Proxy> {
        let libs = libs();
        if !libs.is_dir() {
            assert!(
                std::env::var_os("CI").is_none(),
                "S3Proxy is not installed ({}): peers/install.sh s3proxy",
                libs.display()
            );
            eprintln!("skipped: S3Proxy is not installed (peers/install.sh s3proxy)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        // A bucket of the filesystem backend is a directory under its base.
        std::fs::create_dir_all(data.join(BUCKET)).unwrap();
        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let endpoint = format!("http://127.0.0.1:{port}");
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
        .unwrap();
        std::fs::write(dir.path().join("logback.xml"), LOGBACK).unwrap();
        let child = spawn(dir.path());
        let proxy = S3Proxy {
            child,
            endpoint,
            dir,
        };
        wait_for(&proxy.endpoint);
        Some(proxy)
    }

    /// The location of `prefix` in [`BUCKET`] on this server.
    pub fn location(&self, prefix: &str) -> TierLocation {
        TierLocation::parse(&format!("s3://{BUCKET}/{prefix}"))
            .unwrap()
            .with_endpoint(&self.endpoint)
            .with_region("us-east-1")
    }

    pub fn bucket(&self, prefix: &str, secret: &str) -> Bucket {
        Bucket::open(self.location(prefix), Some(credentials(secret))).unwrap()
    }

    /// The directory holding object `name` of the bucket (the filesystem backend keeps
    /// each object as a file): tests tamper with objects there.
    pub fn object_path(&self, name: &str) -> PathBuf {
        self.dir.path().join("data").join(BUCKET).join(name)
    }

    /// Stops the server (as a crash would: SIGKILL); [`S3Proxy::restart`] brings it back
    /// on the same port and directory.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn restart(&mut self) {
        self.stop();
        self.child = spawn(self.dir.path());
        wait_for(&self.endpoint);
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

fn libs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.peers/s3proxy/libs")
}

fn spawn(dir: &std::path::Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("s3proxy.log"))
        .unwrap();
    Command::new("java")
        .arg(format!(
            "-Dlogback.configurationFile={}",
            dir.join("logback.xml").display()
        ))
        .arg("-cp")
        .arg(format!("{}/*", libs().display()))
        .arg("org.gaul.s3proxy.Main")
        .arg("--properties")
        .arg(dir.join("s3proxy.conf"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("java runs S3Proxy")
}

fn wait_for(endpoint: &str) {
    let addr: SocketAddr = endpoint
        .trim_start_matches("http://")
        .parse()
        .expect("an address");
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < deadline, "S3Proxy did not start in 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for S3Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A runtime for a test's async calls on a [`Bucket`].
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

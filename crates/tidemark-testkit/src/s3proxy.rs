//! S3Proxy for tests: the real S3-compatible server (`tidemark_bench::s3proxy`), started
//! for a test. The tests of every crate that tiers (the bucket's, the engine's, the
//! server's and the CLI's) start it through here.
//!
//! It is installed into `.peers/s3proxy` by `peers/install.sh s3proxy` (which `.ci/run`
//! runs). Without it [`S3Proxy::start`] fails under CI (`CI` set) and answers `None` (the
//! test skips, saying why) elsewhere.

use std::path::PathBuf;

use tidemark_bench::s3proxy::{self as launcher, S3ProxyError};
use tidemark_tier::{Bucket, TierLocation};

pub use launcher::{credentials, ACCESS_KEY, BUCKET, SECRET};

/// S3Proxy serving a fresh directory; killed when dropped.
pub struct S3Proxy {
    proxy: launcher::S3Proxy,
    pub endpoint: String,
}

impl S3Proxy {
    /// S3Proxy with bucket [`BUCKET`], or `None` (skip) when it is not installed outside CI.
    pub fn start() -> Option<S3Proxy> {
        match launcher::S3Proxy::start() {
            Ok(proxy) => Some(S3Proxy {
                endpoint: proxy.endpoint.clone(),
                proxy,
            }),
            Err(S3ProxyError::NotInstalled(libs)) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "S3Proxy is not installed ({}): peers/install.sh s3proxy",
                    libs.display()
                );
                eprintln!("skipped: S3Proxy is not installed (peers/install.sh s3proxy)");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// The location of `prefix` in [`BUCKET`] on this server.
    pub fn location(&self, prefix: &str) -> TierLocation {
        self.proxy.location(prefix).expect("a valid prefix")
    }

    pub fn bucket(&self, prefix: &str, secret: &str) -> Bucket {
        self.proxy.bucket(prefix, secret).expect("a bucket")
    }

    /// The file holding object `name` of the bucket (the filesystem backend keeps each
    /// object as a file): tests tamper with objects there.
    pub fn object_path(&self, name: &str) -> PathBuf {
        self.proxy.object_path(name)
    }

    /// Stops the server (as a crash would: SIGKILL); [`S3Proxy::restart`] brings it back
    /// on the same port and directory.
    pub fn stop(&mut self) {
        self.proxy.stop();
    }

    pub fn restart(&mut self) {
        if let Err(e) = self.proxy.restart() {
            panic!("{e}");
        }
    }
}

/// A runtime for a test's async calls on a [`Bucket`].
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

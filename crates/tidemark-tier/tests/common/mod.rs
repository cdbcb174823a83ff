//! S3Proxy for the tests: the real S3-compatible server, started on 127.0.0.1.
#![allow(dead_code)] // each test binary uses its part

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tidemark_tier::{Bucket, Credentials, TierLocation};

pub const ACCESS_KEY: &str = "tidemark-test";
pub const SECRET: &str = "tidemark-test-secret";
pub const BUCKET: &str = "tier-test";

/// S3Proxy serving a fresh directory; killed when dropped.
pub struct S3Proxy {
    child: Child,
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

impl S3Proxy {
    /// S3Proxy with bucket [`BUCKET`], or `None` (skip) when it is not installed outside CI.
    pub fn start() -> Option<S3Proxy> {
        let libs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.peers/s3proxy/libs");
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
        let log = std::fs::File::create(dir.path().join("s3proxy.log")).unwrap();
        let child = Command::new("java")
            .arg("-cp")
            .arg(format!("{}/*", libs.display()))
            .arg("org.gaul.s3proxy.Main")
            .arg("--properties")
            .arg(&properties)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("java runs S3Proxy");
        let proxy = S3Proxy {
            child,
            endpoint,
            _dir: dir,
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < deadline, "S3Proxy did not start in 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(proxy)
    }

    pub fn bucket(&self, prefix: &str, secret: &str) -> Bucket {
        let location = TierLocation::parse(&format!("s3://{BUCKET}/{prefix}"))
            .unwrap()
            .with_endpoint(&self.endpoint)
            .with_region("us-east-1");
        let credentials = Credentials {
            access_key_id: ACCESS_KEY.into(),
            secret_access_key: secret.into(),
            session_token: None,
        };
        Bucket::open(location, Some(credentials)).unwrap()
    }
}

impl Drop for S3Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

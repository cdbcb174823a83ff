//! The bucket operations against a real S3-compatible server: S3Proxy 4.1.0 on its
//! filesystem backend (`peers/install.sh s3proxy`, which `.ci/run` runs), started here on
//! 127.0.0.1 with SigV4 authorization, so a wrong secret is refused as S3 would refuse it.
//!
//! Without S3Proxy the tests fail under CI (`CI` set) and are skipped with the reason
//! elsewhere.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tidemark_tier::{Bucket, Credentials, TierError, TierLocation};

const ACCESS_KEY: &str = "tidemark-test";
const SECRET: &str = "tidemark-test-secret";
const BUCKET: &str = "tier-test";

/// S3Proxy serving a fresh directory; killed when dropped.
struct S3Proxy {
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl S3Proxy {
    /// S3Proxy with bucket [`BUCKET`], or `None` (skip) when it is not installed outside CI.
    fn start() -> Option<S3Proxy> {
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

    fn bucket(&self, prefix: &str, secret: &str) -> Bucket {
        let location = TierLocation::parse(&format!("s3://{BUCKET}/{prefix}"))
            .unwrap()
            .with_endpoint(&self.endpoint)
            .with_region("us-east-1");
        let credentials = Credentials {
            access_key_id: ACCESS_KEY.into(),
            secret_access_key: secret.into(),
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn objects_are_put_read_by_range_listed_and_deleted_under_the_prefix() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let bucket = proxy.bucket("node-1/", SECRET);
    let other = proxy.bucket("node-2", SECRET);
    runtime().block_on(async {
        let segment: Bytes = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        bucket.put("s/0001.seg", segment.clone()).await.unwrap();
        bucket
            .put("manifest.json", Bytes::from_static(b"{}"))
            .await
            .unwrap();
        other
            .put("s/0001.seg", Bytes::from_static(b"theirs"))
            .await
            .unwrap();

        let footer = bucket
            .get_range("s/0001.seg", 199_000..200_000)
            .await
            .unwrap();
        assert_eq!(footer, segment.slice(199_000..200_000));
        let listed = bucket.list().await.unwrap();
        let names: Vec<(&str, u64)> = listed.iter().map(|o| (o.name.as_str(), o.size)).collect();
        assert_eq!(names, [("manifest.json", 2), ("s/0001.seg", 200_000)]);

        let beyond = bucket.get_range("s/0001.seg", 199_000..300_000).await;
        assert!(
            beyond.is_err(),
            "a range past the end is never a short answer"
        );
        let missing = bucket.get_range("s/0002.seg", 0..10).await.unwrap_err();
        assert!(matches!(missing, TierError::NotFound(_)), "{missing}");

        bucket.delete("s/0001.seg").await.unwrap();
        bucket.delete("s/0001.seg").await.unwrap();
        let names: Vec<String> = bucket
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.name)
            .collect();
        assert_eq!(names, ["manifest.json"]);
        assert_eq!(
            other.get_range("s/0001.seg", 0..6).await.unwrap(),
            Bytes::from_static(b"theirs"),
            "another prefix is another tier"
        );
    });
}

#[test]
fn a_wrong_secret_is_refused_as_denied_not_retried_as_unavailable() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let bucket = proxy.bucket("node-1", "not-the-secret");
    runtime().block_on(async {
        let refused = bucket.put("x", Bytes::from_static(b"x")).await.unwrap_err();
        assert!(matches!(refused, TierError::Denied(_)), "{refused:?}");
        assert!(!refused.is_transient());
    });
}

#[test]
fn a_bucket_that_is_down_is_unavailable_and_worth_a_retry() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let location = TierLocation::parse("s3://nobody-here/x")
        .unwrap()
        .with_endpoint(format!("http://127.0.0.1:{port}"))
        .with_region("us-east-1");
    let credentials = Credentials {
        access_key_id: ACCESS_KEY.into(),
        secret_access_key: SECRET.into(),
    };
    let bucket = Bucket::open(location, Some(credentials)).unwrap();
    runtime().block_on(async {
        let down = bucket.put("x", Bytes::from_static(b"x")).await.unwrap_err();
        assert!(matches!(down, TierError::Unavailable(_)), "{down:?}");
        assert!(down.is_transient());
    });
}

#[test]
fn object_names_that_would_leave_the_prefix_are_refused() {
    let location = TierLocation::parse("s3://some-bucket/p")
        .unwrap()
        .with_endpoint("http://127.0.0.1:9")
        .with_region("us-east-1");
    let bucket = Bucket::open(location, None).unwrap();
    runtime().block_on(async {
        for name in ["", "../x", "a//b", "./a", "a/"] {
            let refused = bucket.put(name, Bytes::new()).await.unwrap_err();
            assert!(
                matches!(refused, TierError::Config(_)),
                "{name:?}: {refused:?}"
            );
        }
    });
}

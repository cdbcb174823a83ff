//! The bucket operations against a real S3-compatible server: S3Proxy 4.1.0 on its
//! filesystem backend (`peers/install.sh s3proxy`, which `.ci/run` runs), started here on
//! 127.0.0.1 with SigV4 authorization, so a wrong secret is refused as S3 would refuse it.
//!
//! Without S3Proxy the tests fail under CI (`CI` set) and are skipped with the reason
//! elsewhere.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

use bytes::Bytes;
use tidemark_testkit::s3proxy::{runtime, S3Proxy, ACCESS_KEY, SECRET};
use tidemark_tier::{Bucket, Credentials, TierError, TierLocation, Verified};

#[test]
fn objects_are_put_read_by_range_listed_and_deleted_under_the_prefix() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let bucket = proxy.bucket("node-1/", SECRET);
    let other = proxy.bucket("node-2", SECRET);
    runtime().block_on(async {
        let segment: Bytes = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let verified = bucket.put("s/0001.seg", segment.clone()).await.unwrap();
        assert_eq!(
            verified,
            Verified::ByEtag,
            "S3's MD5 ETag: no second transfer"
        );
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

        assert_eq!(
            bucket.get("manifest.json", 2).await.unwrap(),
            Bytes::from_static(b"{}")
        );
        let too_big = bucket.get("manifest.json", 1).await.unwrap_err();
        assert!(matches!(too_big, TierError::Mismatch { .. }), "{too_big:?}");
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

/// The payload is not signed (Bucket::open), so S3Proxy stores a body changed on the way
/// as if it had been sent: the put must find it by the ETag's MD5 and fail, never answer
/// verified.
#[test]
fn a_body_changed_on_the_way_fails_the_put() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let relay = tampering_relay(
        proxy
            .endpoint
            .trim_start_matches("http://")
            .parse()
            .unwrap(),
    );
    let through_relay = Bucket::open(
        TierLocation::parse(&format!(
            "s3://{}/tampered",
            tidemark_testkit::s3proxy::BUCKET
        ))
        .unwrap()
        .with_endpoint(format!("http://{relay}"))
        .with_region("us-east-1"),
        Some(tidemark_testkit::s3proxy::credentials(SECRET)),
    )
    .unwrap();
    let direct = proxy.bucket("tampered", SECRET);
    runtime().block_on(async {
        let sent = Bytes::from(vec![TAMPERED; 100_000]);
        let failed = through_relay.put("s.seg", sent.clone()).await.unwrap_err();
        assert!(matches!(failed, TierError::Mismatch { .. }), "{failed:?}");
        // The relay did change what was stored: the check, not luck, refused it.
        let stored = direct.get("s.seg", 1 << 20).await.unwrap();
        assert_eq!(stored.len(), sent.len());
        assert_ne!(stored, sent);
    });
}

/// The byte the tampered bodies are made of: never in an HTTP request's head.
const TAMPERED: u8 = 0xff;

/// A relay to `upstream` that changes the first [`TAMPERED`] byte each connection sends
/// (a body's first byte) and passes everything else, answers included, as it is.
fn tampering_relay(upstream: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let mut server = TcpStream::connect(upstream).unwrap();
            let (mut answers, mut to_client) =
                (server.try_clone().unwrap(), client.try_clone().unwrap());
            std::thread::spawn(move || std::io::copy(&mut answers, &mut to_client));
            std::thread::spawn(move || {
                let (mut buf, mut changed) = (vec![0; 64 << 10], false);
                while let Ok(n @ 1..) = client.read(&mut buf) {
                    if !changed {
                        if let Some(at) = buf[..n].iter().position(|&b| b == TAMPERED) {
                            buf[at] ^= 1;
                            changed = true;
                        }
                    }
                    if server.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
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
        session_token: None,
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

#[test]
fn an_object_is_copied_between_prefixes_inside_the_bucket() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let cluster = proxy.bucket("cluster", SECRET);
    let (leader, follower) = (
        cluster.within("node-1/gen-000000").unwrap(),
        cluster
            .within("node-2")
            .unwrap()
            .within("gen-000003")
            .unwrap(),
    );
    assert_eq!(leader.location().prefix, "cluster/node-1/gen-000000");
    assert_eq!(follower.location().prefix, "cluster/node-2/gen-000003");
    assert_eq!(
        follower
            .at_prefix("/cluster/node-1/gen-000000/")
            .unwrap()
            .location(),
        leader.location()
    );
    assert!(cluster.within("../elsewhere").is_err());
    runtime().block_on(async {
        let segment: Bytes = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        leader.put("segments/7.seg", segment.clone()).await.unwrap();
        follower
            .copy_from(&leader, "segments/7.seg", segment.len() as u64)
            .await
            .unwrap();
        assert_eq!(
            follower.get("segments/7.seg", 1 << 20).await.unwrap(),
            segment
        );
        // The copy is the follower's own: the leader deleting its object leaves it.
        leader.delete("segments/7.seg").await.unwrap();
        assert_eq!(follower.list().await.unwrap().len(), 1);

        let gone = follower
            .copy_from(&leader, "segments/7.seg", segment.len() as u64)
            .await
            .unwrap_err();
        assert!(matches!(gone, TierError::NotFound(_)), "{gone:?}");
        leader
            .put("segments/8.seg", segment.slice(..10))
            .await
            .unwrap();
        let short = follower
            .copy_from(&leader, "segments/8.seg", segment.len() as u64)
            .await
            .unwrap_err();
        assert!(matches!(short, TierError::Mismatch { .. }), "{short:?}");
    });
}

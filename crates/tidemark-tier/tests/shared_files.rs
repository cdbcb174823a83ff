//! Credentials found as the AWS tools find them: with no keys in the environment, the
//! profile `AWS_PROFILE` of the shared credentials file is used, and S3Proxy (which checks
//! signatures) takes the upload. Alone in its test binary: it sets environment variables.

use bytes::Bytes;
use tidemark_testkit::s3proxy::{runtime, S3Proxy, ACCESS_KEY, BUCKET, SECRET};
use tidemark_tier::{Bucket, TierError, TierLocation};

#[test]
fn keys_come_from_the_profile_of_the_shared_credentials_file() {
    let Some(proxy) = S3Proxy::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials");
    let config = dir.path().join("config");
    std::fs::write(
        &credentials,
        format!(
            "[default]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = wrong\n\n\
             [tier]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET}\n"
        ),
    )
    .unwrap();
    std::fs::write(&config, "[profile tier]\nregion = us-east-1\n").unwrap();
    for name in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
    ] {
        std::env::remove_var(name);
    }
    std::env::set_var("AWS_SHARED_CREDENTIALS_FILE", &credentials);
    std::env::set_var("AWS_CONFIG_FILE", &config);
    let location = || {
        TierLocation::parse(&format!("s3://{BUCKET}/p"))
            .unwrap()
            .with_endpoint(&proxy.endpoint)
    };
    runtime().block_on(async {
        std::env::set_var("AWS_PROFILE", "tier");
        let bucket = Bucket::open(location(), None).unwrap();
        bucket
            .put("x", Bytes::from_static(b"from the file"))
            .await
            .unwrap();

        std::env::set_var("AWS_PROFILE", "default");
        let wrong = Bucket::open(location(), None).unwrap();
        let refused = wrong.put("y", Bytes::from_static(b"y")).await.unwrap_err();
        assert!(matches!(refused, TierError::Denied(_)), "{refused:?}");
    });
}

//! Where a tier's objects live: a bucket, a prefix inside it, and how to reach it.

use crate::TierError;

/// A bucket and prefix as `[tier] url` names them (`s3://bucket/prefix`), with the endpoint
/// of an S3-compatible server and a region when they are not AWS's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierLocation {
    pub bucket: String,
    /// Without slashes at either end; empty for the bucket's root.
    pub prefix: String,
    /// `http(s)://host:port` of an S3-compatible server; `None` for AWS itself.
    pub endpoint: Option<String>,
    /// `None`: the environment's (`AWS_REGION`, `AWS_DEFAULT_REGION`), else `us-east-1`.
    pub region: Option<String>,
}

impl TierLocation {
    /// The location `url` (`s3://bucket[/prefix]`) names.
    pub fn parse(url: &str) -> Result<TierLocation, TierError> {
        let invalid = |why: &str| TierError::Config(format!("tier url {url:?}: {why}"));
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| invalid("must start with s3://"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        // S3's bucket naming rules: 3 to 63 of lower-case letters, digits, dots and dashes.
        let valid_bucket = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        if !valid_bucket {
            return Err(invalid(
                "the bucket must be 3 to 63 lower-case letters, digits, dots or dashes",
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|part| part == "." || part == "..") {
            return Err(invalid("the prefix may not hold . or .. parts"));
        }
        Ok(TierLocation {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            endpoint: None,
            region: None,
        })
    }

    /// The same location reached through `endpoint` (an S3-compatible server).
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> TierLocation {
        self.endpoint = Some(endpoint.into());
        self
    }

    pub fn with_region(mut self, region: impl Into<String>) -> TierLocation {
        self.region = Some(region.into());
        self
    }

    /// `s3://bucket/prefix`, as parsed.
    pub fn url(&self) -> String {
        match self.prefix.as_str() {
            "" => format!("s3://{}", self.bucket),
            prefix => format!("s3://{}/{prefix}", self.bucket),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_a_bucket_and_a_prefix_without_its_slashes() {
        let location = TierLocation::parse("s3://my-bucket/tidemark/node-1/").unwrap();
        assert_eq!(location.bucket, "my-bucket");
        assert_eq!(location.prefix, "tidemark/node-1");
        assert_eq!(location.url(), "s3://my-bucket/tidemark/node-1");
        let root = TierLocation::parse("s3://my-bucket").unwrap();
        assert_eq!(
            (root.bucket.as_str(), root.prefix.as_str()),
            ("my-bucket", "")
        );
    }

    #[test]
    fn what_is_not_a_bucket_url_is_refused_with_the_reason() {
        for (url, says) in [
            ("my-bucket/x", "s3://"),
            ("https://my-bucket/x", "s3://"),
            ("s3://", "3 to 63"),
            ("s3://Upper/x", "lower-case"),
            ("s3://a_b/x", "lower-case"),
            ("s3://ok-bucket/a/../b", ".."),
        ] {
            let error = TierLocation::parse(url).unwrap_err().to_string();
            assert!(error.contains(says), "{url}: {error}");
        }
    }
}

//! A bucket's objects under the tier's prefix: put (verified), ranged get, list, delete.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use md5::{Digest, Md5};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};

use crate::aws_files::Profile;
use crate::credentials::Credentials;
use crate::{TierError, TierLocation};

/// The MD5 of `bytes` as S3 spells it in a single-part upload's ETag (without the quotes).
pub(crate) fn md5_hex(bytes: &[u8]) -> String {
    format!("{:x}", Md5::digest(bytes))
}

/// An object in the bucket, named as the tier names it (without the prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    pub name: String,
    pub size: u64,
}

/// How an upload was found to be stored as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verified {
    /// The ETag the bucket answered is the MD5 of the bytes sent (S3's single-part PUT).
    ByEtag,
    /// The object was read back and compared (costs a second transfer).
    ByReadBack,
}

/// The objects of one tier location.
#[derive(Debug, Clone)]
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    location: TierLocation,
}

impl Bucket {
    /// The bucket at `location`. Credentials, unless given: as the AWS tools find them —
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`, else the
    /// profile `AWS_PROFILE` (or `default`) of the shared files `~/.aws/credentials` and
    /// `~/.aws/config`, else the container and instance credentials of AWS itself. The
    /// region: the location's, else `AWS_REGION` / `AWS_DEFAULT_REGION`, else the
    /// profile's, else `us-east-1`. Nothing is requested yet: a bucket that cannot be
    /// reached fails its first call.
    pub fn open(
        location: TierLocation,
        credentials: Option<Credentials>,
    ) -> Result<Bucket, TierError> {
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&location.bucket)
            // Few retries here: the caller retries a failed upload later with its own
            // backoff and shows the error meanwhile, rather than hanging on one for minutes.
            .with_retry(RetryConfig {
                max_retries: 2,
                retry_timeout: Duration::from_secs(10),
                ..RetryConfig::default()
            })
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(60)),
            );
        let from_env = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
        let profile = Profile::from_environment();
        let region = location.region.clone().or_else(|| {
            let in_env = from_env("AWS_REGION") || from_env("AWS_DEFAULT_REGION");
            profile.region.clone().filter(|_| !in_env)
        });
        if let Some(region) = region {
            builder = builder.with_region(region);
        }
        // The payload's SHA-256 is left out of the signature unless AWS_UNSIGNED_PAYLOAD
        // says otherwise (as AWS's own SDKs do over TLS). It adds nothing to what each put
        // checks anyway — the ETag's MD5 against the bytes sent, so a body changed on the
        // way is found — and over plain HTTP it could not protect reads (responses are not
        // signed); TLS protects both. It costs a SHA-256 pass at both ends: `bench tier`
        // against S3Proxy uploaded 133–147 MB/s signed, 199–213 MB/s unsigned.
        if !from_env("AWS_UNSIGNED_PAYLOAD") {
            builder = builder.with_unsigned_payload(true);
        }
        let credentials = credentials.or_else(|| {
            let in_env = from_env("AWS_ACCESS_KEY_ID");
            profile.credentials().filter(|_| !in_env)
        });
        if let Some(endpoint) = &location.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        if let Some(credentials) = credentials {
            builder = builder
                .with_access_key_id(credentials.access_key_id)
                .with_secret_access_key(credentials.secret_access_key);
            if let Some(token) = credentials.session_token {
                builder = builder.with_token(token);
            }
        }
        let store = builder
            .build()
            .map_err(|e| TierError::Config(e.to_string()))?;
        Ok(Bucket {
            store: Arc::new(store),
            location,
        })
    }

    /// A bucket on any store (tests: one whose ETags are not MD5s).
    #[cfg(test)]
    fn on(store: Arc<dyn ObjectStore>, location: TierLocation) -> Bucket {
        Bucket { store, location }
    }

    pub fn location(&self) -> &TierLocation {
        &self.location
    }

    /// The same bucket, reached the same way, under `sub` inside this prefix: a part of
    /// the prefix given to one owner (a cluster node, one generation of its data).
    pub fn within(&self, sub: &str) -> Result<Bucket, TierError> {
        let prefix = self.path(sub)?.to_string();
        Ok(Bucket {
            store: self.store.clone(),
            location: TierLocation {
                prefix,
                ..self.location.clone()
            },
        })
    }

    /// The same bucket, reached the same way, at another `prefix` (from the bucket's root).
    pub fn at_prefix(&self, prefix: &str) -> Result<Bucket, TierError> {
        let root = Bucket {
            store: self.store.clone(),
            location: TierLocation {
                prefix: String::new(),
                ..self.location.clone()
            },
        };
        match prefix.trim_matches('/') {
            "" => Ok(root),
            prefix => root.within(prefix),
        }
    }

    /// Copies object `name` of `source` (a prefix of the same bucket) to `name` here, inside
    /// the bucket (no byte passes through this process), and checks the copy holds `len`
    /// bytes. The copy's content is checked where it is read: every chunk carries its
    /// CRC32C in the segment's footer.
    pub async fn copy_from(&self, source: &Bucket, name: &str, len: u64) -> Result<(), TierError> {
        if source.location.bucket != self.location.bucket {
            return Err(TierError::Config(format!(
                "copy from bucket {:?} into {:?}: objects are copied within one bucket",
                source.location.bucket, self.location.bucket
            )));
        }
        let (from, to) = (source.path(name)?, self.path(name)?);
        self.store
            .copy(&from, &to)
            .await
            .map_err(|e| TierError::from_store(from.as_ref(), e))?;
        let size = self
            .store
            .head(&to)
            .await
            .map_err(|e| TierError::from_store(to.as_ref(), e))?
            .size;
        if size != len {
            return Err(TierError::Mismatch {
                name: to.to_string(),
                what: format!("the copy holds {size} bytes, the original {len}"),
            });
        }
        Ok(())
    }

    /// Uploads `bytes` as `name` and checks what the bucket stored: the MD5 its ETag
    /// carries for a single-part upload, else the object read back. Only then is it done.
    pub async fn put(&self, name: &str, bytes: Bytes) -> Result<Verified, TierError> {
        let digest = md5_hex(&bytes);
        self.put_digested(name, bytes, digest).await
    }

    /// [`Bucket::put`] of bytes whose MD5 (`md5_hex`) the caller has computed — off the
    /// runtime, which serves the other uploads and reads meanwhile.
    pub(crate) async fn put_digested(
        &self,
        name: &str,
        bytes: Bytes,
        digest: String,
    ) -> Result<Verified, TierError> {
        let path = self.path(name)?;
        let stored = self
            .store
            .put(&path, PutPayload::from_bytes(bytes.clone()))
            .await
            .map_err(|e| TierError::from_store(name, e))?;
        let etag = stored.e_tag.unwrap_or_default();
        if etag.trim_matches('"') == digest {
            return Ok(Verified::ByEtag);
        }
        // No MD5 ETag (encrypted buckets, some S3-compatible servers): compare the bytes.
        let read_back = self.get_range(name, 0..bytes.len() as u64).await?;
        let size = self
            .store
            .head(&path)
            .await
            .map_err(|e| TierError::from_store(name, e))?
            .size;
        if read_back != bytes || size != bytes.len() as u64 {
            return Err(TierError::Mismatch {
                name: name.to_string(),
                what: format!(
                    "the bucket holds {size} bytes other than the {} sent (ETag {etag:?})",
                    bytes.len()
                ),
            });
        }
        Ok(Verified::ByReadBack)
    }

    /// Bytes `range` of object `name`; exactly those, or an error.
    pub async fn get_range(&self, name: &str, range: Range<u64>) -> Result<Bytes, TierError> {
        let path = self.path(name)?;
        let expected = range.end.saturating_sub(range.start);
        let bytes = self
            .store
            .get_range(&path, range.clone())
            .await
            .map_err(|e| TierError::from_store(name, e))?;
        if bytes.len() as u64 != expected {
            return Err(TierError::Mismatch {
                name: name.to_string(),
                what: format!(
                    "asked for bytes {range:?}, the bucket answered {} bytes",
                    bytes.len()
                ),
            });
        }
        Ok(bytes)
    }

    /// The whole of object `name`, refused unread if it holds more than `max_bytes` (what a
    /// bucket answers is untrusted: its size must not decide what is allocated).
    pub async fn get(&self, name: &str, max_bytes: u64) -> Result<Bytes, TierError> {
        let path = self.path(name)?;
        let got = self
            .store
            .get(&path)
            .await
            .map_err(|e| TierError::from_store(name, e))?;
        let size = got.meta.size;
        if size > max_bytes {
            return Err(TierError::Mismatch {
                name: name.to_string(),
                what: format!("it holds {size} bytes, more than the {max_bytes} expected at most"),
            });
        }
        let bytes = got
            .bytes()
            .await
            .map_err(|e| TierError::from_store(name, e))?;
        if bytes.len() as u64 != size {
            return Err(TierError::Mismatch {
                name: name.to_string(),
                what: format!("{} bytes of {size} arrived", bytes.len()),
            });
        }
        Ok(bytes)
    }

    /// Every object under the prefix, by name.
    pub async fn list(&self) -> Result<Vec<StoredObject>, TierError> {
        let prefix = self.prefix();
        let listed: Vec<_> = self
            .store
            .list(prefix.as_ref())
            .try_collect()
            .await
            .map_err(|e| TierError::from_store(&self.location.url(), e))?;
        let mut objects: Vec<StoredObject> = listed
            .into_iter()
            .map(|meta| {
                let full = meta.location.to_string();
                let name = match self.location.prefix.as_str() {
                    "" => full,
                    prefix => full
                        .strip_prefix(prefix)
                        .map(|rest| rest.trim_start_matches('/').to_string())
                        .unwrap_or(full),
                };
                StoredObject {
                    name,
                    size: meta.size,
                }
            })
            .collect();
        objects.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(objects)
    }

    /// Deletes object `name`; one that is not there is no error (a delete may be retried).
    pub async fn delete(&self, name: &str) -> Result<(), TierError> {
        let path = self.path(name)?;
        match self.store.delete(&path).await {
            Ok(()) => Ok(()),
            Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(TierError::from_store(name, e)),
        }
    }

    fn prefix(&self) -> Option<Path> {
        (!self.location.prefix.is_empty()).then(|| Path::from(self.location.prefix.as_str()))
    }

    /// The object's key: the prefix, then `name` (relative, no empty or dot parts).
    fn path(&self, name: &str) -> Result<Path, TierError> {
        let valid = !name.is_empty()
            && name
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..");
        if !valid {
            return Err(TierError::Config(format!(
                "object name {name:?}: relative, without empty, . or .. parts"
            )));
        }
        let key = match self.location.prefix.as_str() {
            "" => name.to_string(),
            prefix => format!("{prefix}/{name}"),
        };
        Path::parse(&key).map_err(|e| TierError::Config(format!("object name {name:?}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn a_store_whose_etags_are_not_md5s_is_verified_by_reading_back() {
        // InMemory's ETags are counters: the upload is checked by its bytes instead.
        let location = TierLocation::parse("s3://some-bucket/p").unwrap();
        let bucket = Bucket::on(Arc::new(InMemory::new()), location);
        runtime().block_on(async {
            let bytes = Bytes::from_static(b"a sealed segment");
            let verified = bucket.put("s/1.seg", bytes.clone()).await.unwrap();
            assert_eq!(verified, Verified::ByReadBack);
            assert_eq!(bucket.get_range("s/1.seg", 0..16).await.unwrap(), bytes);
            let listed = bucket.list().await.unwrap();
            assert_eq!(
                listed,
                [StoredObject {
                    name: "s/1.seg".into(),
                    size: 16
                }]
            );
        });
    }
}

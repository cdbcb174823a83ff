//! Tidemark's object storage: named objects in an S3 or S3-compatible bucket, under a
//! prefix, each upload verified before it counts.
//!
//! Owns: where the bucket is (`s3://bucket/prefix`, an endpoint for S3-compatible servers,
//! a region), credentials as every AWS tool finds them (the environment, then the shared
//! files `~/.aws/credentials` and `~/.aws/config`), and the four
//! things tiering does with a bucket — put an object and check what the bucket stored, read
//! a byte range of one, list them, delete one — each failure a typed [`TierError`] that says
//! whether trying again can help. Built on Apache Arrow's `object_store` (pinned; behind
//! this one module, so no other crate names it). [`BlockingBucket`] serves callers without
//! an async runtime.
//!
//! Must never know about: segments, streams, the manifest or the engine. What an object
//! holds and when it is uploaded or deleted is the caller's; this crate moves bytes.

mod aws_files;
mod blocking;
mod bucket;
mod credentials;
mod error;
mod location;

pub use blocking::BlockingBucket;
pub use bucket::{Bucket, StoredObject, Verified};
pub use credentials::Credentials;
pub use error::TierError;
pub use location::TierLocation;

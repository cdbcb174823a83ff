//! A [`Bucket`] for threads that are not async: the engine's tiering thread and its
//! readers (scans run on plain threads or in `spawn_blocking`).
//!
//! Each call runs on the bucket's own single-threaded runtime, kept on a thread of its own,
//! and the calling thread waits on a channel for the answer. That works from any thread,
//! an async runtime's worker included (where `Runtime::block_on` would panic), and the
//! runtime is dropped on its own thread, never inside another runtime.

use std::future::Future;
use std::ops::Range;
use std::sync::{mpsc, Arc};

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::{Bucket, StoredObject, TierError, TierLocation, Verified};

/// A [`Bucket`] whose calls block the calling thread until they are done.
#[derive(Debug, Clone)]
pub struct BlockingBucket {
    bucket: Bucket,
    runtime: Arc<RuntimeThread>,
}

/// The runtime's thread; it stops when the last [`BlockingBucket`] clone is dropped.
#[derive(Debug)]
struct RuntimeThread {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for RuntimeThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl BlockingBucket {
    /// Starts the thread that runs `bucket`'s requests.
    pub fn new(bucket: Bucket) -> Result<BlockingBucket, TierError> {
        let unavailable = |e: std::io::Error| TierError::Config(format!("tier runtime: {e}"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(unavailable)?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("tidemark-bucket".into())
            .spawn(move || {
                // Drives every request spawned on `handle` until told to stop.
                let _ = runtime.block_on(stopped);
            })
            .map_err(unavailable)?;
        Ok(BlockingBucket {
            bucket,
            runtime: Arc::new(RuntimeThread {
                handle,
                stop: Some(stop),
            }),
        })
    }

    pub fn location(&self) -> &TierLocation {
        self.bucket.location()
    }

    /// [`Bucket::within`], on the same runtime thread.
    pub fn within(&self, sub: &str) -> Result<BlockingBucket, TierError> {
        Ok(BlockingBucket {
            bucket: self.bucket.within(sub)?,
            runtime: self.runtime.clone(),
        })
    }

    /// [`Bucket::at_prefix`], on the same runtime thread.
    pub fn at_prefix(&self, prefix: &str) -> Result<BlockingBucket, TierError> {
        Ok(BlockingBucket {
            bucket: self.bucket.at_prefix(prefix)?,
            runtime: self.runtime.clone(),
        })
    }

    /// [`Bucket::copy_from`].
    pub fn copy_from(
        &self,
        source: &BlockingBucket,
        name: &str,
        len: u64,
    ) -> Result<(), TierError> {
        let (bucket, source, name) = (self.bucket.clone(), source.bucket.clone(), name.to_string());
        self.run(async move { bucket.copy_from(&source, &name, len).await })
    }

    /// [`Bucket::put`]; the MD5 is computed on the calling thread, so that uploads from
    /// several threads hash at once rather than in turn on the runtime's one thread.
    pub fn put(&self, name: &str, bytes: Bytes) -> Result<Verified, TierError> {
        let (bucket, name) = (self.bucket.clone(), name.to_string());
        let digest = crate::bucket::md5_hex(&bytes);
        self.run(async move { bucket.put_digested(&name, bytes, digest).await })
    }

    /// [`Bucket::get_range`].
    pub fn get_range(&self, name: &str, range: Range<u64>) -> Result<Bytes, TierError> {
        let (bucket, name) = (self.bucket.clone(), name.to_string());
        self.run(async move { bucket.get_range(&name, range).await })
    }

    /// [`Bucket::get`].
    pub fn get(&self, name: &str, max_bytes: u64) -> Result<Bytes, TierError> {
        let (bucket, name) = (self.bucket.clone(), name.to_string());
        self.run(async move { bucket.get(&name, max_bytes).await })
    }

    /// [`Bucket::list`].
    pub fn list(&self) -> Result<Vec<StoredObject>, TierError> {
        let bucket = self.bucket.clone();
        self.run(async move { bucket.list().await })
    }

    /// [`Bucket::delete`].
    pub fn delete(&self, name: &str) -> Result<(), TierError> {
        let (bucket, name) = (self.bucket.clone(), name.to_string());
        self.run(async move { bucket.delete(&name).await })
    }

    fn run<T: Send + 'static>(
        &self,
        request: impl Future<Output = Result<T, TierError>> + Send + 'static,
    ) -> Result<T, TierError> {
        let (answer, answered) = mpsc::sync_channel(1);
        self.runtime.handle.spawn(async move {
            let _ = answer.send(request.await);
        });
        answered.recv().unwrap_or_else(|_| {
            Err(TierError::Unavailable(
                "the bucket's runtime stopped before answering".into(),
            ))
        })
    }
}

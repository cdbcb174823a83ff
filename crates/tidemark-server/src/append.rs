//! The one way an append reaches a store, whatever protocol brought it (the native and
//! ChronicleDB routes, the binary protocol): the body, admitted as it arrived, is decoded
//! against the stream's schema (in place or on the blocking pool, as its size says),
//! submitted through [`Store`], and counted in `/metrics` once durable. Its admission is
//! held until then. Protocols whose rows name their fields go through [`crate::ingest`],
//! which creates and grows streams first and counts the same way.
//!
//! Must never know about: how a transport reads a body or answers a refusal (it is given
//! the body, and hands back the refusal to map).

use std::sync::Arc;

use tidemark_core::{Command, EventBatch, ProducerSeq, Schema};

use crate::admission::Permit;
use crate::metrics::Metrics;
use crate::store::{in_place_or_blocking, Ack, Store, StoreError};

/// An append as a transport received it.
pub struct Append {
    pub stream: String,
    /// What the client sent, decoded against the stream's schema by the transport's decoder.
    pub body: Vec<u8>,
    /// The body's bytes on the write budget, given back once the append is answered.
    pub permit: Permit,
    /// The producer tag of a retry-safe append.
    pub producer: Option<ProducerSeq>,
}

/// Why an append was not stored: the store refused it, or its body did not decode (in the
/// decoder's terms, which the transport answers as they are).
#[derive(Debug)]
pub enum AppendError<E> {
    Store(StoreError),
    Decode(E),
}

impl<E> From<StoreError> for AppendError<E> {
    fn from(e: StoreError) -> AppendError<E> {
        AppendError::Store(e)
    }
}

/// Decodes `append`'s body with `decode` against its stream's schema and stores the batch;
/// answers once it is durable, counted as appended.
pub async fn append<E, D>(
    store: &Store,
    metrics: &Metrics,
    append: Append,
    decode: D,
) -> Result<Ack, AppendError<E>>
where
    E: Send + 'static,
    D: FnOnce(&[u8], &Arc<Schema>) -> Result<EventBatch, E> + Send + 'static,
{
    let Append {
        stream,
        body,
        permit,
        producer,
    } = append;
    let schema = store.stream_schema(&stream).await?;
    let bytes = body.len();
    let batch = in_place_or_blocking(bytes, move || decode(&body, &schema))
        .await?
        .map_err(AppendError::Decode)?;
    let command = Command::Append {
        name: stream,
        batch,
        producer,
    };
    let ack = store.submit(command).await?;
    drop(permit);
    metrics.appended(ack.events as usize, bytes);
    Ok(ack)
}

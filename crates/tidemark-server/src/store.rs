//! Where a namespace's writes go: straight into an embedded database, or through the Raft
//! cluster this node belongs to. Reads always go to a local database ([`Store::db`]): the
//! embedded one, or this node's replica of the cluster.

use std::sync::Arc;

use tidemark_cluster::Cluster;
use tidemark_core::{EventBatch, Schema};
use tidemark_engine::{Db, Retention};

use crate::error::ApiError;
use crate::http::blocking;

#[derive(Clone)]
pub enum Store {
    Embedded(Arc<Db>),
    Replicated(Arc<Cluster>),
}

/// A catalog change.
pub enum Change {
    CreateStream { name: String, schema: Schema },
    DropStream { name: String },
    Clear { name: String },
    SetRetention { name: String, retention: Retention },
}

/// An acknowledged append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The log position (embedded) or Raft index (cluster) of the batch.
    pub position: u64,
    pub events: u64,
    /// The producer's sequence number had been applied before: nothing was appended.
    pub duplicate: bool,
}

/// A producer id and the batch's sequence number, for exactly-once retries in a cluster.
pub type ProducerTag = Option<(u64, u64)>;

impl Store {
    /// The local database that answers reads.
    pub fn db(&self) -> Arc<Db> {
        match self {
            Store::Embedded(db) => db.clone(),
            Store::Replicated(cluster) => cluster.db(),
        }
    }

    /// The schema a write to `name` is decoded against (in a cluster, after catching up
    /// with the leader if this node does not know the stream yet: [`Cluster::stream_schema`]).
    pub async fn stream_schema(
        &self,
        name: &str,
        retry_after_ms: u32,
    ) -> Result<Arc<Schema>, ApiError> {
        match self {
            Store::Embedded(db) => db
                .stream_schema(name)
                .map_err(|e| ApiError::from_engine(e, retry_after_ms)),
            Store::Replicated(cluster) => cluster
                .stream_schema(name)
                .await
                .map_err(|e| ApiError::from_cluster(e, retry_after_ms)),
        }
    }

    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        match self {
            Store::Embedded(_) => None,
            Store::Replicated(cluster) => Some(cluster),
        }
    }

    pub async fn change(&self, change: Change, retry_after_ms: u32) -> Result<(), ApiError> {
        match self {
            Store::Embedded(db) => {
                let db = db.clone();
                blocking(move || match change {
                    Change::CreateStream { name, schema } => db.create_stream(&name, schema),
                    Change::DropStream { name } => db.drop_stream(&name),
                    Change::Clear { name } => db.clear(&name),
                    Change::SetRetention { name, retention } => db.set_retention(&name, retention),
                })
                .await?
                .map_err(|e| ApiError::from_engine(e, retry_after_ms))
            }
            Store::Replicated(cluster) => match change {
                Change::CreateStream { name, schema } => cluster.create_stream(&name, schema).await,
                Change::DropStream { name } => cluster.drop_stream(&name).await,
                Change::Clear { name } => cluster.clear(&name).await,
                Change::SetRetention { name, retention } => {
                    cluster.set_retention(&name, retention).await
                }
            }
            .map_err(|e| ApiError::from_cluster(e, retry_after_ms)),
        }
    }

    /// Appends a decoded batch; answers once it is durable (embedded: fsync'd; cluster:
    /// committed on a quorum). Embedded stores ignore the producer tag: without failover
    /// there is no ambiguous retry to deduplicate.
    pub async fn append(
        &self,
        stream: String,
        batch: EventBatch,
        producer: ProducerTag,
        retry_after_ms: u32,
    ) -> Result<Appended, ApiError> {
        match self {
            Store::Embedded(db) => {
                let db = db.clone();
                let ack = blocking(move || db.append(&stream, batch))
                    .await?
                    .map_err(|e| ApiError::from_engine(e, retry_after_ms))?;
                Ok(Appended {
                    position: ack.lsn,
                    events: ack.events as u64,
                    duplicate: false,
                })
            }
            Store::Replicated(cluster) => {
                let ack = cluster
                    .append(&stream, &batch, producer)
                    .await
                    .map_err(|e| ApiError::from_cluster(e, retry_after_ms))?;
                Ok(Appended {
                    position: ack.index,
                    events: ack.events,
                    duplicate: ack.duplicate,
                })
            }
        }
    }
}

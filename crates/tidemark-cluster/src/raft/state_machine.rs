//! openraft's state machine over an engine replica.
//!
//! Applying an entry hands its command to [`Replica::apply_replicated`] at the entry's index: the
//! batch goes into the memtable and nothing is written (the Raft log already holds it).
//! Producer tags are checked here: a (producer, sequence) at or below the last one applied
//! for that producer is a retry and is answered [`Outcome::Duplicate`] without applying
//! (the table is bounded: see [`crate::producers`]).
//!
//! A snapshot is the replica's sealed segments plus its manifest, hard-linked into
//! `snapshots/<name>/` (no copy), plus the producer table and the Raft metadata. It is built
//! while applying waits (openraft asks for the builder on the state machine's task): the
//! flush that precedes it then leaves nothing of the applied entries in memory, so the
//! snapshot is exactly the state after its last log id, producer table included.
//!
//! Installing a snapshot received from the leader turns it into a new generation of the
//! replica's directory (`sm/gen-N`, again by hard links) and swaps the open database.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use futures_util::{Stream, TryStreamExt};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::EntryPayload;
use serde::{Deserialize, Serialize};
use tidemark_core::sync::IgnorePoison;
use tidemark_core::Command;
use tidemark_engine::{CommandLog, EngineError, Options, Replica};

use super::log_store::{load_small, store_small};
use super::{io_error, FailureKind, LogId, Membership, Outcome, SnapshotMeta, TypeConfig};
use crate::producers::{self, ProducerTable};

/// A snapshot on disk: a replica directory (MANIFEST, segments/) plus `state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotDir(pub PathBuf);

pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotDir>;

/// What a snapshot holds beside the replica's files.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotState {
    pub meta: SnapshotMeta,
    /// Least recently seen first ([`ProducerTable::recency_order`]).
    pub producers: Vec<(u64, producers::Last)>,
}

const STATE_FILE: &str = "state";

#[derive(Clone)]
pub struct StateMachine {
    shared: Arc<Shared>,
}

/// The replica and what the cluster's server reads from it.
pub struct Shared {
    dir: PathBuf,
    options: Options,
    db: RwLock<Arc<Replica>>,
    /// The Raft log, for what each generation of the replica reports of it.
    log: Arc<dyn CommandLog>,
    inner: tokio::sync::Mutex<Inner>,
}

struct Inner {
    generation: u64,
    last_applied: Option<LogId>,
    membership: Membership,
    producers: ProducerTable,
    current: Option<SnapshotState>,
}

impl StateMachine {
    /// Opens the replica under `dir` (`sm/` and `snapshots/`), resuming from the newest
    /// snapshot: openraft re-applies the log after it, and the replica skips what its own
    /// checkpoint already holds.
    pub fn open(
        dir: &Path,
        options: Options,
        log: Arc<dyn CommandLog>,
    ) -> io::Result<StateMachine> {
        let sm_dir = dir.join("sm");
        let snapshots = dir.join("snapshots");
        fs::create_dir_all(&sm_dir)?;
        fs::create_dir_all(&snapshots)?;
        let generation: u64 = load_small(&sm_dir.join("CURRENT"))?.unwrap_or(0);
        remove_other_entries(&sm_dir, &[generation_name(generation), "CURRENT".into()])?;
        let current = newest_snapshot(&snapshots)?;
        let db = Replica::open(
            sm_dir.join(generation_name(generation)),
            generation_options(&options, generation)?,
            log.clone(),
        )
        .map_err(io_error)?;
        sweep_other_generations(&options, generation);
        let (last_applied, membership, producers) = match &current {
            Some(s) => (
                s.meta.last_log_id,
                s.meta.last_membership.clone(),
                ProducerTable::from_recency_order(&s.producers, producers::CAPACITY),
            ),
            None => (None, Membership::default(), ProducerTable::default()),
        };
        Ok(StateMachine {
            shared: Arc::new(Shared {
                dir: dir.to_path_buf(),
                options,
                db: RwLock::new(Arc::new(db)),
                log,
                inner: tokio::sync::Mutex::new(Inner {
                    generation,
                    last_applied,
                    membership,
                    producers,
                    current,
                }),
            }),
        })
    }

    /// The replica as it is now (a snapshot install replaces it).
    pub fn db(&self) -> Arc<Replica> {
        self.shared.db.read().ignore_poison().clone()
    }

    fn snapshots_dir(&self) -> PathBuf {
        self.shared.dir.join("snapshots")
    }

    fn apply_one(&self, inner: &mut Inner, index: u64, bytes: &[u8]) -> Outcome {
        let db = self.db();
        let command = match tidemark_core::command::decode(bytes) {
            Ok(command) => command,
            Err(e) => {
                db.skip_position(index);
                return Outcome::Failed {
                    kind: FailureKind::Invalid,
                    message: e.to_string(),
                };
            }
        };
        let producer = match &command {
            Command::Append { producer, .. } => *producer,
            _ => None,
        };
        if let Some(p) = producer {
            if inner.producers.is_retry(&p) {
                db.skip_position(index);
                return Outcome::Duplicate;
            }
        }
        match db.apply_replicated(index, command) {
            Ok(applied) => {
                if let Some(p) = producer {
                    inner.producers.record(&p);
                }
                Outcome::Applied {
                    events: applied.events as u64,
                    positions: applied.positions.map(|p| (p.first, p.last)),
                }
            }
            Err(e) => Outcome::Failed {
                kind: match e {
                    EngineError::UnknownStream(_) => FailureKind::UnknownStream,
                    EngineError::StreamExists { .. } => FailureKind::StreamExists,
                    _ => FailureKind::Invalid,
                },
                message: e.to_string(),
            },
        }
    }
}

fn generation_name(generation: u64) -> String {
    format!("gen-{generation:06}")
}

/// The options of the replica's generation `generation`: with a tier, its objects go under
/// a prefix of their own (`<node's prefix>/gen-N`), so that one generation never names,
/// overwrites or sweeps another's (a crash between opening a new generation and naming it
/// `CURRENT` leaves the old one whole).
fn generation_options(options: &Options, generation: u64) -> io::Result<Options> {
    let mut options = options.clone();
    if let Some(tier) = &options.tier {
        options.tier = Some(
            tier.within(&generation_name(generation))
                .map_err(io_error)?,
        );
    }
    Ok(options)
}

/// Deletes, in the background, the objects of every generation but `current` under the
/// node's prefix: generations a snapshot replaced (their directories are gone already, or
/// go at the next start). A failure is logged; the next start tries again.
fn sweep_other_generations(options: &Options, current: u64) {
    let Some(tier) = &options.tier else {
        return;
    };
    let bucket = tier.bucket.clone();
    let keep = format!("{}/", generation_name(current));
    let sweep = move || {
        let objects = bucket.list().map_err(|e| e.to_string())?;
        let mut deleted = 0;
        for object in objects.iter().filter(|o| !o.name.starts_with(&keep)) {
            bucket.delete(&object.name).map_err(|e| e.to_string())?;
            deleted += 1;
        }
        if deleted > 0 {
            tracing::info!(deleted, kept = %keep, "deleted the objects of replaced generations");
        }
        Ok::<_, String>(())
    };
    let spawned = std::thread::Builder::new()
        .name("tidemark-tier-generations".into())
        .spawn(move || {
            if let Err(e) = sweep() {
                tracing::warn!(error = %e, "deleting the objects of replaced generations failed; the next start tries again");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "could not start deleting the objects of replaced generations");
    }
}

/// Deletes everything in `dir` but `keep`: generations and snapshots left by a crash.
fn remove_other_entries(dir: &Path, keep: &[String]) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if keep.contains(&name) {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            fs::remove_dir_all(&path)?;
        } else {
            fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// The newest complete snapshot (one with a readable `state` file); others are removed.
fn newest_snapshot(dir: &Path) -> io::Result<Option<SnapshotState>> {
    let mut best: Option<(String, SnapshotState)> = None;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let state: Option<SnapshotState> =
            load_small(&entry.path().join(STATE_FILE)).unwrap_or(None);
        if let Some(state) = state {
            if best
                .as_ref()
                .is_none_or(|(_, b)| state.meta.last_log_id > b.meta.last_log_id)
            {
                best = Some((name, state));
            }
        }
    }
    let keep: Vec<String> = best.iter().map(|(n, _)| n.clone()).collect();
    remove_other_entries(dir, &keep)?;
    Ok(best.map(|(_, s)| s))
}

fn snapshot_name(meta: &SnapshotMeta) -> String {
    match &meta.last_log_id {
        Some(id) => format!("snap-{:020}", id.index()),
        None => "snap-none".into(),
    }
}

/// A snapshot's state and the directory its files were linked into, before it is named.
type Prepared = (SnapshotState, PathBuf);

/// Builds the snapshot prepared by `try_create_snapshot_builder`.
pub struct Builder {
    machine: StateMachine,
    prepared: Result<Prepared, String>,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    type SnapshotData = SnapshotDir;

    async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
        let (state, building) = self.prepared.clone().map_err(io_error)?;
        store_small(&building.join(STATE_FILE), &state)?;
        let snapshots = self.machine.snapshots_dir();
        let path = snapshots.join(snapshot_name(&state.meta));
        if path.exists() {
            fs::remove_dir_all(&path)?;
        }
        fs::rename(&building, &path)?;
        // The snapshot's name is what says it is complete: make the rename durable before
        // anything (a log purge) relies on the snapshot.
        tidemark_storage::fsutil::sync_dir(&snapshots).map_err(io_error)?;
        let mut inner = self.machine.shared.inner.lock().await;
        if inner
            .current
            .as_ref()
            .is_none_or(|c| c.meta.last_log_id <= state.meta.last_log_id)
        {
            inner.current = Some(state.clone());
        }
        drop(inner);
        newest_snapshot(&snapshots)?;
        tracing::info!(snapshot = %path.display(), "built a snapshot");
        Ok(Snapshot {
            meta: state.meta,
            snapshot: SnapshotDir(path),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotDir;
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, Membership)> {
        let inner = self.shared.inner.lock().await;
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> io::Result<()>
    where
        S: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + Send,
    {
        let mut inner = self.shared.inner.lock().await;
        while let Some((entry, responder)) = entries.try_next().await? {
            let index = entry.index();
            // Each entry once, in index order: the replica's positions and the producer
            // table count on it.
            let expected = inner.last_applied.map_or(0, |l| l.index() + 1);
            assert_eq!(
                index, expected,
                "entries are applied in index order, each once (last applied: {:?})",
                inner.last_applied
            );
            let outcome = match &entry.payload {
                EntryPayload::Normal(payload) => {
                    let machine = self.clone();
                    tokio::task::block_in_place(|| machine.apply_one(&mut inner, index, &payload.0))
                }
                EntryPayload::Membership(m) => {
                    inner.membership = Membership::new(Some(entry.log_id()), m.clone());
                    self.db().skip_position(index);
                    Outcome::NOTHING
                }
                EntryPayload::Blank => {
                    self.db().skip_position(index);
                    Outcome::NOTHING
                }
            };
            inner.last_applied = Some(entry.log_id());
            if let Some(responder) = responder {
                responder.send(outcome);
            }
        }
        Ok(())
    }

    async fn try_create_snapshot_builder(&mut self, force: bool) -> Option<Builder> {
        match self.prepare_snapshot().await {
            Ok(prepared) => Some(Builder {
                machine: self.clone(),
                prepared: Ok(prepared),
            }),
            // A snapshot the policy asked for can wait for the next one.
            Err(e) if !force => {
                tracing::error!(error = %e, "preparing a snapshot failed; deferring it");
                None
            }
            // One a follower needs must be answered: the builder reports the failure.
            Err(e) => Some(Builder {
                machine: self.clone(),
                prepared: Err(e.to_string()),
            }),
        }
    }

    async fn get_snapshot_builder(&mut self) -> Builder {
        // openraft calls `try_create_snapshot_builder`; this older entry point must exist.
        match self.try_create_snapshot_builder(true).await {
            Some(builder) => builder,
            None => Builder {
                machine: self.clone(),
                prepared: Err("no snapshot could be prepared".into()),
            },
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotDir,
    ) -> io::Result<()> {
        let mut inner = self.shared.inner.lock().await;
        let state: SnapshotState = load_small(&snapshot.0.join(STATE_FILE))?
            .ok_or_else(|| io_error("the snapshot has no state file"))?;
        let next = inner.generation + 1;
        let sm_dir = self.shared.dir.join("sm");
        let gen_dir = sm_dir.join(generation_name(next));
        let options = generation_options(&self.shared.options, next)?;
        let log = self.shared.log.clone();
        let from = snapshot.0.clone();
        let db = {
            let gen_dir = gen_dir.clone();
            tokio::task::spawn_blocking(move || -> io::Result<Replica> {
                link_replica(&from, &gen_dir)?;
                Replica::open(&gen_dir, options, log).map_err(io_error)
            })
            .await
            .map_err(io_error)??
        };
        let old = std::mem::replace(&mut *self.shared.db.write().ignore_poison(), Arc::new(db));
        store_small(&sm_dir.join("CURRENT"), &next)?;
        let old_dir = sm_dir.join(generation_name(inner.generation));
        inner.generation = next;
        // Readers still holding the old database keep its open files; the directory goes
        // now if nobody does, else at the next start. Closing it joins its flush and tiering
        // threads (a tiering round may be waiting on a request or a flush): that happens
        // off this task, which the Raft core waits on.
        let options = self.shared.options.clone();
        tokio::task::spawn_blocking(move || {
            if Arc::into_inner(old).is_some() {
                let _ = fs::remove_dir_all(&old_dir);
                sweep_other_generations(&options, next);
            }
        });
        let snapshots = self.snapshots_dir();
        let path = snapshots.join(snapshot_name(meta));
        if snapshot.0 != path {
            if path.exists() {
                fs::remove_dir_all(&path)?;
            }
            fs::rename(&snapshot.0, &path)?;
            tidemark_storage::fsutil::sync_dir(&snapshots).map_err(io_error)?;
        }
        // Its tiered objects are this node's copies now: a follower sent this snapshot
        // later copies them from here.
        if path.join(tidemark_engine::tier::TIER_SOURCE_FILE).exists() {
            self.db().write_tier_source(&path).map_err(io_error)?;
        }
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        inner.producers = ProducerTable::from_recency_order(&state.producers, producers::CAPACITY);
        inner.current = Some(SnapshotState {
            meta: meta.clone(),
            producers: state.producers,
        });
        drop(inner);
        newest_snapshot(&snapshots)?;
        tracing::info!(snapshot = %path.display(), "installed a snapshot from the leader");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        let inner = self.shared.inner.lock().await;
        Ok(inner.current.as_ref().map(|s| Snapshot {
            meta: s.meta.clone(),
            snapshot: SnapshotDir(self.snapshots_dir().join(snapshot_name(&s.meta))),
        }))
    }
}

impl StateMachine {
    /// Flushes the replica and links its checkpoint into a new snapshot directory. Runs
    /// while no entry is being applied (see the module documentation).
    async fn prepare_snapshot(&self) -> io::Result<Prepared> {
        let inner = self.shared.inner.lock().await;
        let state = SnapshotState {
            meta: SnapshotMeta {
                last_log_id: inner.last_applied,
                last_membership: inner.membership.clone(),
            },
            producers: inner.producers.recency_order(),
        };
        let expected_start = inner.last_applied.as_ref().map_or(0, |l| l.index() + 1);
        let building = self
            .snapshots_dir()
            .join(format!("building-{}", snapshot_name(&state.meta)));
        if building.exists() {
            fs::remove_dir_all(&building)?;
        }
        let db = self.db();
        let target = building.clone();
        let exported = tokio::task::spawn_blocking(move || db.export_checkpoint(&target))
            .await
            .map_err(io_error)?
            .map_err(io_error)?;
        drop(inner);
        if exported.log_start < expected_start {
            return Err(io_error(format!(
                "the replica's checkpoint starts at {} but the snapshot needs {expected_start}",
                exported.log_start
            )));
        }
        Ok((state, building))
    }
}

/// Hard-links the replica files of snapshot `from` (MANIFEST, segments/) into `to`.
pub(crate) fn link_replica(from: &Path, to: &Path) -> io::Result<()> {
    if to.exists() {
        fs::remove_dir_all(to)?;
    }
    fs::create_dir_all(to.join("segments"))?;
    for entry in fs::read_dir(from.join("segments"))? {
        let entry = entry?;
        fs::hard_link(entry.path(), to.join("segments").join(entry.file_name()))?;
    }
    fs::copy(from.join("MANIFEST"), to.join("MANIFEST"))?;
    let tier_source = from.join(tidemark_engine::tier::TIER_SOURCE_FILE);
    if tier_source.exists() {
        fs::copy(
            &tier_source,
            to.join(tidemark_engine::tier::TIER_SOURCE_FILE),
        )?;
    }
    fs::File::open(to.join("MANIFEST"))?.sync_all()?;
    fs::File::open(to.join("segments"))?.sync_all()?;
    fs::File::open(to)?.sync_all()?;
    Ok(())
}

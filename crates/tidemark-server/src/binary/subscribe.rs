//! A binary-protocol subscription (SUBSCRIBE, `docs/protocol.md`): a stream's events by
//! position, sent as EVENTS frames while the subscriber has credit.
//!
//! Credit is bytes: each EVENTS frame's length is taken from it, a read asks for no more
//! than what is left (at least one event), and the subscription waits while it has none.
//! CREDIT frames grant more (at most [`MAX_CREDIT`] held); UNSUBSCRIBE ends it (answered
//! ACK), as does a subscription that does not follow once it has caught up. Any other end is
//! an ERROR (or TRY_LATER) with the subscription's request id.
//!
//! Credit is the subscriber's word, not a proof that it read anything: what bounds the
//! server's memory is apart from it. A subscription's frames not yet written to its socket
//! hold at most [`MAX_UNWRITTEN`] bytes (a frame takes that much of a semaphore, given back
//! by the connection's writer once written), so a subscriber that grants without reading
//! costs the server that, plus the one read being encoded, and appends never wait for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tidemark_engine::{Engine, EngineError, PositionRequest};
use tidemark_protocol::encode_events;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::{Outbox, Refused, ACK_NOTHING};
use crate::consume::{self, Start};
use crate::state::AppState;
use crate::store::StoreError;

/// The most credit a subscription holds: a subscriber's grants beyond it are capped.
pub const MAX_CREDIT: u64 = 8 << 20;
/// The most bytes of a subscription's frames queued and not yet written to its socket.
pub const MAX_UNWRITTEN: u32 = 8 << 20;
/// The most events one EVENTS frame holds.
const MAX_EVENTS_PER_FRAME: usize = 10_000;

/// The credit a subscription may spend, shared between the connection's reader (which
/// grants it) and the subscription's task (which spends it).
#[derive(Debug, Default)]
pub struct Credit {
    bytes: AtomicU64,
    ended: AtomicBool,
    changed: Notify,
}

impl Credit {
    fn new(bytes: u32) -> Credit {
        let credit = Credit::default();
        credit.grant(bytes);
        credit
    }

    /// Adds `bytes`, up to [`MAX_CREDIT`] in all.
    pub fn grant(&self, bytes: u32) {
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_add(u64::from(bytes)).min(MAX_CREDIT))
            });
        self.changed.notify_one();
    }

    /// Asks the subscription to end (UNSUBSCRIBE).
    pub fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.changed.notify_one();
    }

    pub fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    fn spend(&self, bytes: usize) {
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(bytes as u64))
            });
    }

    /// Waits until there is credit (its amount) or the subscription is to end (`None`).
    async fn available(&self) -> Option<u64> {
        loop {
            if self.is_ended() {
                return None;
            }
            let held = self.bytes.load(Ordering::Acquire);
            if held > 0 {
                return Some(held);
            }
            self.changed.notified().await;
        }
    }
}

/// A subscription being served: what SUBSCRIBE asked for.
pub struct Subscription {
    pub state: AppState,
    pub outbox: Outbox,
    pub request_id: u64,
    pub stream: String,
    pub start: Start,
    pub follow: bool,
    pub credit: Arc<Credit>,
    /// Its slot of `limits.max_subscriptions`, held while it runs.
    pub slot: OwnedSemaphorePermit,
}

impl Subscription {
    /// The credit of a new subscription granting `bytes`.
    pub fn credit(bytes: u32) -> Arc<Credit> {
        Arc::new(Credit::new(bytes))
    }

    /// Serves the subscription to its end, and says how it ended: ACK when unsubscribed
    /// or caught up without following, else the refusal.
    pub async fn run(self) {
        let db = self.state.db(crate::state::Namespace::Replicated);
        let answer = match self.serve(&db).await {
            Ok(()) => Ok(ACK_NOTHING),
            Err(e) => Err(Refused::store(e, self.state.retry_after_ms())),
        };
        self.outbox.send(self.request_id, answer).await;
        drop(self.slot);
    }

    async fn serve(&self, db: &Engine) -> Result<(), StoreError> {
        let mut watch = db.watch_positions(&self.stream)?;
        watch.borrow_and_update();
        let mut stopping = self.state.stopping();
        let unwritten = Arc::new(Semaphore::new(MAX_UNWRITTEN as usize));
        let mut after = consume::start_after(&self.state, db, &self.stream, &self.start).await?;
        loop {
            let credit = tokio::select! {
                credit = self.credit.available() => credit,
                () = consume::until_stopping(&mut stopping) => return Err(consume::stopping()),
            };
            let Some(credit) = credit else {
                return Ok(());
            };
            let max_bytes = usize::try_from(credit)
                .unwrap_or(usize::MAX)
                .min(PositionRequest::DEFAULT_MAX_BYTES);
            let read =
                consume::read(db, &self.stream, after, MAX_EVENTS_PER_FRAME, max_bytes).await?;
            consume::still_there(&watch, &self.stream)?;
            let next_position = read.next_position;
            if let (Some(first), Some(last)) = (read.events.position_at(0), read.last_position()) {
                // A read answers consecutive positions after the one asked for.
                assert!(
                    after.is_none_or(|a| first == a + 1),
                    "a read after {after:?} began at {first}"
                );
                let frame = self.encode(first, next_position, read.events).await?;
                self.credit.spend(frame.len());
                // A frame larger than the bound takes all of it: it goes alone.
                let share =
                    u32::try_from(frame.len()).map_or(MAX_UNWRITTEN, |n| n.min(MAX_UNWRITTEN));
                let held = tokio::select! {
                    held = unwritten.clone().acquire_many_owned(share) => held,
                    () = consume::until_stopping(&mut stopping) => return Err(consume::stopping()),
                };
                let Ok(held) = held else {
                    return Ok(()); // Never closed while this task holds it.
                };
                if !self.outbox.send_frame(frame, held).await {
                    return Ok(()); // The connection is gone.
                }
                after = Some(last);
            }
            let caught_up = after.is_none_or(|last| last + 1 >= next_position);
            if !caught_up {
                continue;
            }
            if !self.follow {
                return Ok(());
            }
            tokio::select! {
                changed = watch.changed() => {
                    watch.borrow_and_update();
                    if changed.is_err() {
                        return Err(EngineError::UnknownStream(self.stream.clone()).into());
                    }
                }
                () = self.ended() => return Ok(()),
                () = consume::until_stopping(&mut stopping) => return Err(consume::stopping()),
            }
        }
    }

    /// Resolves once the subscriber unsubscribed. (A grant wakes it too: it looks again.
    /// An end between the look and the wait is not missed: `Notify` keeps it.)
    async fn ended(&self) {
        while !self.credit.is_ended() {
            self.credit.changed.notified().await;
        }
    }

    /// The EVENTS frame of `events`, encoded on the blocking pool (a frame is megabytes).
    async fn encode(
        &self,
        first: u64,
        next_position: u64,
        events: tidemark_core::EventBatch,
    ) -> Result<Vec<u8>, StoreError> {
        let request_id = self.request_id;
        let encoded = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            encode_events(request_id, first, next_position, &events, &mut out).map(|()| out)
        })
        .await;
        match encoded {
            Ok(Ok(frame)) => Ok(frame),
            Ok(Err(too_long)) => Err(StoreError::new(
                crate::store::StoreErrorKind::TooLarge,
                format!("an EVENTS frame of {} bytes", too_long.0),
            )),
            Err(e) => Err(StoreError::new(
                crate::store::StoreErrorKind::Internal,
                format!("encoding events failed: {e}"),
            )),
        }
    }
}

//! Who may hold a connection: a connection starts in one of `pg.max_starting` starting slots
//! and, once authenticated, takes one of `pg.max_connections` session slots. The two are
//! apart so that clients which never authenticate cannot take the sessions' room; and a new
//! connection that finds every starting slot taken closes the oldest starter rather than
//! being refused, so that a flood of silent connections delays a real client by at most the
//! time it takes to send its password, never locks it out.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// The slots of one listener.
pub struct Slots {
    starting: Mutex<Starting>,
    max_starting: usize,
    sessions: Arc<Semaphore>,
}

#[derive(Default)]
struct Starting {
    next_id: u64,
    /// Starters, oldest first, each with the signal that closes it.
    queue: VecDeque<(u64, Arc<Notify>)>,
}

/// A starting slot, given back when dropped.
pub struct StartingSlot {
    slots: Arc<Slots>,
    id: u64,
    evicted: Arc<Notify>,
}

/// A session slot, held by an authenticated connection until it closes.
pub struct SessionSlot {
    _permit: OwnedSemaphorePermit,
}

impl Slots {
    pub fn new(max_starting: usize, max_sessions: usize) -> Arc<Slots> {
        assert!(max_starting > 0 && max_sessions > 0);
        Arc::new(Slots {
            starting: Mutex::new(Starting::default()),
            max_starting,
            sessions: Arc::new(Semaphore::new(max_sessions)),
        })
    }

    /// A starting slot for a new connection, closing the oldest starter if all are taken.
    pub fn start(self: &Arc<Self>) -> StartingSlot {
        let evicted = Arc::new(Notify::new());
        let mut starting = self.lock();
        if starting.queue.len() >= self.max_starting {
            if let Some((_, oldest)) = starting.queue.pop_front() {
                // Stored if the oldest is not waiting right now: it sees it at its next wait.
                oldest.notify_one();
            }
        }
        let id = starting.next_id;
        starting.next_id += 1;
        starting.queue.push_back((id, evicted.clone()));
        assert!(starting.queue.len() <= self.max_starting);
        StartingSlot {
            slots: self.clone(),
            id,
            evicted,
        }
    }

    /// A session slot, or `None` when every one is taken.
    pub fn session(&self) -> Option<SessionSlot> {
        match self.sessions.clone().try_acquire_owned() {
            Ok(permit) => Some(SessionSlot { _permit: permit }),
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Starting> {
        // The queue is valid after any panic: every change is one push or one removal.
        self.starting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    #[cfg(test)]
    fn starters(&self) -> usize {
        self.lock().queue.len()
    }
}

impl StartingSlot {
    /// Completes once a newer connection took this slot.
    pub async fn evicted(&self) {
        self.evicted.notified().await
    }
}

impl Drop for StartingSlot {
    fn drop(&mut self) {
        let mut starting = self.slots.lock();
        if let Some(at) = starting.queue.iter().position(|(id, _)| *id == self.id) {
            starting.queue.remove(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_new_starter_closes_the_oldest_and_sessions_are_apart() {
        let slots = Slots::new(2, 1);
        let first = slots.start();
        let second = slots.start();
        let third = slots.start();
        assert_eq!(slots.starters(), 2);
        tokio::time::timeout(Duration::from_secs(5), first.evicted())
            .await
            .expect("the oldest starter is told to close");
        let not_yet = tokio::time::timeout(Duration::from_millis(20), second.evicted()).await;
        assert!(not_yet.is_err(), "only the oldest is closed");
        drop(first);
        assert_eq!(slots.starters(), 2, "an evicted slot is already given back");
        drop(third);
        assert_eq!(slots.starters(), 1);
        // Starters take nothing from sessions, and sessions are bounded.
        let session = slots.session().expect("a session slot");
        assert!(slots.session().is_none());
        drop(session);
        assert!(slots.session().is_some());
        drop(second);
        assert_eq!(slots.starters(), 0);
    }
}

//! The one policy for poisoned locks, stated once: **a lock whose holder panicked is
//! entered anyway** ([`IgnorePoison`]).
//!
//! Why: a panic is a bug in the thread that panicked, and that thread reports it; the other
//! threads — other requests, the flusher, the Raft tasks — must go on serving, and refusing
//! every later lock would turn one failed request into a dead process. This is sound only
//! because of a rule every lock holder in Tidemark keeps: the guarded state is valid at
//! every point where the holder could panic (updates are computed first and stored in one
//! step). Where a panic would interrupt a change that cannot be left half done, the code
//! records the failure itself instead of relying on poison: a log's group-commit writer
//! marks the log failed (`tidemark_storage::group_commit`), so that nothing is acknowledged
//! after it.
//!
//! (Tidemark's crates share this module through `tidemark-core` because it is the one crate
//! they all depend on; it holds no lock of its own.)

use std::sync::{LockResult, PoisonError};

/// Enters a lock (or returns from a condition-variable wait) whether or not a holder
/// panicked, by the policy of this module.
pub trait IgnorePoison<Guard> {
    fn ignore_poison(self) -> Guard;
}

impl<Guard> IgnorePoison<Guard> for LockResult<Guard> {
    fn ignore_poison(self) -> Guard {
        self.unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_lock_whose_holder_panicked_is_entered_with_what_it_held() {
        let shared = Arc::new(Mutex::new(7));
        let holder = shared.clone();
        let panicked = std::thread::spawn(move || {
            let _guard = holder.lock().ignore_poison();
            panic!("a bug while holding the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(shared.is_poisoned());
        assert_eq!(*shared.lock().ignore_poison(), 7);
    }
}

//! Stopping a query from outside it: at its deadline, or when its client leaves.
//!
//! DataFusion stops a query when its stream is dropped, but only between polls: work inside
//! one poll (a function over a large value, evaluated while planning or over one batch) runs
//! to its end. A [`Stop`] is the query's flag and deadline, checked by the stream between
//! batches and by Tidemark's functions inside their long loops (`crate::bounded`), so that
//! a query stops within milliseconds of its deadline or of its client's departure, however
//! it spends its time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::common::DataFusionError;

/// A query's deadline and its cancellation flag; clones share the flag.
#[derive(Debug, Clone, Default)]
pub struct Stop(Option<Arc<StopState>>);

#[derive(Debug)]
struct StopState {
    cancelled: AtomicBool,
    deadline: Instant,
    timeout: Duration,
}

impl Stop {
    /// A query that stops only when its stream is dropped.
    pub fn never() -> Stop {
        Stop(None)
    }

    /// A query that stops `timeout` from now, or when cancelled.
    pub fn after(timeout: Duration) -> Stop {
        let now = Instant::now();
        Stop(Some(Arc::new(StopState {
            cancelled: AtomicBool::new(false),
            deadline: now
                .checked_add(timeout)
                .unwrap_or(now + Duration::from_secs(1 << 32)),
            timeout,
        })))
    }

    /// Whether this is [`Stop::never`]: nothing to check.
    pub fn is_never(&self) -> bool {
        self.0.is_none()
    }

    /// When the query stops by itself, if it has a deadline.
    pub fn deadline(&self) -> Option<Instant> {
        self.0.as_ref().map(|s| s.deadline)
    }

    /// Stops the query at its next check.
    pub fn cancel(&self) {
        if let Some(state) = &self.0 {
            state.cancelled.store(true, Ordering::Relaxed);
        }
    }

    /// A guard that cancels the query when dropped: held by whatever waits for the answer,
    /// so that a client that leaves (its request's future dropped) stops its query.
    pub fn cancel_on_drop(&self) -> CancelOnDrop {
        CancelOnDrop(self.clone())
    }

    /// Whether the query must stop now, and why.
    pub fn check(&self) -> Result<(), Refusal> {
        let Some(state) = &self.0 else {
            return Ok(());
        };
        if state.cancelled.load(Ordering::Relaxed) {
            return Err(Refusal::Cancelled);
        }
        if Instant::now() >= state.deadline {
            return Err(Refusal::Timeout(state.timeout));
        }
        Ok(())
    }
}

/// Cancels its query when dropped ([`Stop::cancel_on_drop`]).
#[derive(Debug)]
pub struct CancelOnDrop(Stop);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Why Tidemark stopped or refused a query from inside DataFusion: carried through
/// DataFusion's errors (as an external error, or inside an I/O error from a spill file) and
/// turned back into its [`crate::SqlError`] at the end.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Refusal {
    /// The query itself asks for more than a query may have (a value, its memory, the spill
    /// budget): the same query would be refused again.
    #[error("{0}")]
    TooLarge(String),
    /// What all queries share is in use (the server's query memory, its spill budget, the
    /// free disk, the query slots): the same query may pass shortly.
    #[error("{0}")]
    Exhausted(String),
    #[error("the query ran longer than {0:?}")]
    Timeout(Duration),
    #[error("the query was cancelled: its client left")]
    Cancelled,
}

impl From<Refusal> for DataFusionError {
    fn from(refusal: Refusal) -> DataFusionError {
        DataFusionError::External(Box::new(refusal))
    }
}

impl Refusal {
    /// The refusal somewhere in `error`'s chain of sources, if there is one.
    pub(crate) fn find<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refusal> {
        let mut next = Some(error);
        // Bounded: a chain is a few levels deep.
        for _ in 0..64 {
            let error = next?;
            if let Some(refusal) = error.downcast_ref::<Refusal>() {
                return Some(refusal);
            }
            next = match error.downcast_ref::<std::io::Error>() {
                // An I/O error's source skips the error it wraps: that one is next.
                Some(io) => io
                    .get_ref()
                    .map(|inner| inner as &(dyn std::error::Error + 'static)),
                None => error.source(),
            };
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_trips_at_its_deadline_or_when_cancelled() {
        assert!(Stop::never().check().is_ok());
        let stop = Stop::after(Duration::from_secs(3600));
        assert!(stop.check().is_ok());
        drop(stop.cancel_on_drop());
        assert!(matches!(stop.check(), Err(Refusal::Cancelled)));
        let stop = Stop::after(Duration::ZERO);
        assert!(matches!(stop.check(), Err(Refusal::Timeout(_))));
    }

    #[test]
    fn a_refusal_is_found_inside_datafusion_and_io_errors() {
        let inside_io = std::io::Error::other(Refusal::Exhausted("disk".into()));
        let arrow = datafusion::arrow::error::ArrowError::IoError("spill".into(), inside_io);
        let error = DataFusionError::ArrowError(Box::new(arrow), None).context("sorting");
        assert!(matches!(Refusal::find(&error), Some(Refusal::Exhausted(m)) if m == "disk"));
        let external: DataFusionError = Refusal::Cancelled.into();
        let shared = DataFusionError::Shared(Arc::new(external));
        assert!(matches!(Refusal::find(&shared), Some(Refusal::Cancelled)));
        assert!(Refusal::find(&DataFusionError::Plan("x".into())).is_none());
    }
}

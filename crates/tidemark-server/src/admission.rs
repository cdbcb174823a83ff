//! Admission control: a bound on request bytes in flight over every connection and protocol.
//! A request that would cross it is refused at once (429 / TRY_LATER) rather than queued, so
//! memory stays bounded under any overload and the client decides when to retry.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct Admission {
    limit: usize,
    in_flight: AtomicUsize,
    requests: AtomicUsize,
}

/// Bytes admitted for one request; released when dropped.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    bytes: usize,
}

impl Admission {
    pub fn new(limit: usize) -> Arc<Admission> {
        Arc::new(Admission {
            limit,
            in_flight: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
        })
    }

    /// Admits `bytes` more, or `None` if that would cross the limit.
    pub fn try_admit(self: &Arc<Self>, bytes: usize) -> Option<Permit> {
        self.reserve(bytes)?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        Some(Permit {
            admission: self.clone(),
            bytes,
        })
    }

    fn reserve(&self, bytes: usize) -> Option<()> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                current
                    .checked_add(bytes)
                    .filter(|&total| total <= self.limit)
            })
            .ok()
            .map(|_| ())
    }

    pub fn bytes_in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn requests_in_flight(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Permit {
    /// Admits `bytes` more for the same request (a body whose length was not announced);
    /// `false` if that would cross the limit.
    pub fn grow(&mut self, bytes: usize) -> bool {
        if bytes == 0 {
            return true;
        }
        if self.admission.reserve(bytes).is_none() {
            return false;
        }
        self.bytes += bytes;
        true
    }
}

impl Permit {
    /// Gives back `bytes` of what this permit holds (all it holds at most).
    pub fn shrink(&mut self, bytes: usize) {
        let bytes = bytes.min(self.bytes);
        self.admission.in_flight.fetch_sub(bytes, Ordering::AcqRel);
        self.bytes -= bytes;
    }

    /// The bytes this permit holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether `bytes` more could ever be admitted for this request (with nothing else in
    /// flight): if not, waiting does not help.
    pub fn could_grow(&self, bytes: usize) -> bool {
        self.bytes
            .checked_add(bytes)
            .is_some_and(|total| total <= self.admission.limit)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.admission
            .in_flight
            .fetch_sub(self.bytes, Ordering::AcqRel);
        self.admission.requests.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_holds_and_permits_give_back() {
        let admission = Admission::new(100);
        let a = admission.try_admit(60).unwrap();
        assert!(admission.try_admit(41).is_none());
        let mut b = admission.try_admit(40).unwrap();
        assert!(!b.grow(1));
        assert_eq!(
            (admission.bytes_in_flight(), admission.requests_in_flight()),
            (100, 2)
        );
        drop(a);
        assert!(b.grow(60));
        b.shrink(30);
        assert_eq!(admission.bytes_in_flight(), 70);
        b.shrink(usize::MAX);
        assert_eq!((admission.bytes_in_flight(), b.bytes()), (0, 0));
        assert!(b.grow(60));
        drop(b);
        assert_eq!(
            (admission.bytes_in_flight(), admission.requests_in_flight()),
            (0, 0)
        );
        assert!(admission.try_admit(usize::MAX).is_none());
    }
}

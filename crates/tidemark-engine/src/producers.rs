//! The producer table: the last (sequence, part) applied for each producer id, so that a
//! batch retried after a timeout, a lost answer, a restart or a leader change is applied
//! once. A cluster keeps one in its state machine (and its snapshots); an embedded
//! database in its state (and its manifest).
//!
//! It is bounded. Every client thread is a producer of its own, so without a bound the
//! table would grow with every client that ever wrote. Beyond [`CAPACITY`] producers, the
//! one seen least recently is forgotten, and a retry from it would be applied again — a
//! retry comes seconds after its first attempt, by which time 100,000 other producers
//! would have had to write.
//!
//! Recency is the order in which entries were applied, never the wall clock: every replica
//! applies the same entries in the same order, so every replica forgets the same producer
//! at the same entry. (A replica that forgot a different one would apply a retried batch
//! that the others skip.) A snapshot lists the producers from least to most recently seen,
//! which is all a replica restored from it needs to keep deciding the same way.

use std::collections::{BTreeMap, HashMap};

use tidemark_core::ProducerSeq;

/// The most producers remembered. The same on every node (a constant, not an option): the
/// table decides which entries apply.
pub const CAPACITY: usize = 100_000;

/// A producer's last applied (sequence, part).
pub type Last = (u64, u32);

#[derive(Debug, Clone)]
pub struct ProducerTable {
    /// Producer id → its last tag and when it was seen (a tick of `clock`).
    last: HashMap<u64, (Last, u64)>,
    /// Tick → producer, oldest first.
    by_recency: BTreeMap<u64, u64>,
    clock: u64,
    capacity: usize,
}

impl Default for ProducerTable {
    fn default() -> Self {
        ProducerTable::with_capacity(CAPACITY)
    }
}

impl ProducerTable {
    pub fn with_capacity(capacity: usize) -> ProducerTable {
        ProducerTable {
            last: HashMap::new(),
            by_recency: BTreeMap::new(),
            clock: 0,
            capacity: capacity.max(1),
        }
    }

    /// The table a snapshot listed, least recently seen first.
    pub fn from_recency_order(entries: &[(u64, Last)], capacity: usize) -> ProducerTable {
        let mut table = ProducerTable::with_capacity(capacity);
        for &(producer, (sequence, part)) in entries {
            table.record(&ProducerSeq {
                producer,
                sequence,
                part,
            });
        }
        table
    }

    /// The producers, least recently seen first: what a snapshot stores.
    pub fn recency_order(&self) -> Vec<(u64, Last)> {
        self.by_recency
            .values()
            .filter_map(|producer| Some((*producer, self.last.get(producer)?.0)))
            .collect()
    }

    /// Whether `tag` was applied already (it is at or before its producer's last).
    pub fn is_retry(&self, tag: &ProducerSeq) -> bool {
        self.last
            .get(&tag.producer)
            .is_some_and(|&(last, _)| !tag.follows(last))
    }

    /// Notes that the entry tagged `tag` was applied; forgets the least recently seen
    /// producer if that makes one too many.
    pub fn record(&mut self, tag: &ProducerSeq) {
        self.clock += 1;
        let last = (tag.sequence, tag.part);
        if let Some((_, seen)) = self.last.insert(tag.producer, (last, self.clock)) {
            self.by_recency.remove(&seen);
        }
        self.by_recency.insert(self.clock, tag.producer);
        while self.last.len() > self.capacity {
            let Some((_, oldest)) = self.by_recency.pop_first() else {
                break;
            };
            self.last.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tag(producer: u64, sequence: u64) -> ProducerSeq {
        ProducerSeq {
            producer,
            sequence,
            part: 0,
        }
    }

    #[test]
    fn a_tag_at_or_before_the_last_is_a_retry() {
        let mut table = ProducerTable::default();
        assert!(!table.is_retry(&tag(1, 5)));
        table.record(&tag(1, 5));
        assert!(table.is_retry(&tag(1, 5)));
        assert!(table.is_retry(&tag(1, 4)));
        assert!(!table.is_retry(&tag(1, 6)));
        assert!(!table.is_retry(&tag(2, 5)), "another producer");
        // The parts of a split batch share the sequence.
        let part = |p| ProducerSeq {
            part: p,
            ..tag(1, 6)
        };
        table.record(&part(0));
        assert!(table.is_retry(&part(0)));
        assert!(!table.is_retry(&part(1)));
    }

    #[test]
    fn the_least_recently_seen_producer_is_forgotten() {
        let mut table = ProducerTable::with_capacity(3);
        for producer in [1, 2, 3] {
            table.record(&tag(producer, 10));
        }
        table.record(&tag(1, 11)); // 1 is now the most recent; 2 the least
        table.record(&tag(4, 10));
        assert_eq!(table.recency_order().len(), 3);
        assert!(!table.is_retry(&tag(2, 10)), "2 was forgotten");
        for producer in [1, 3, 4] {
            assert!(table.is_retry(&tag(producer, 10)), "{producer} is kept");
        }
        assert_eq!(
            table.recency_order(),
            vec![(3, (10, 0)), (1, (11, 0)), (4, (10, 0))]
        );
    }

    /// The simplest table that does the same: a list in recency order.
    #[derive(Default, Clone)]
    struct Model(Vec<(u64, Last)>);

    impl Model {
        fn is_retry(&self, t: &ProducerSeq) -> bool {
            self.0
                .iter()
                .any(|&(p, last)| p == t.producer && !t.follows(last))
        }
        fn record(&mut self, t: &ProducerSeq, capacity: usize) {
            self.0.retain(|&(p, _)| p != t.producer);
            self.0.push((t.producer, (t.sequence, t.part)));
            if self.0.len() > capacity {
                self.0.remove(0);
            }
        }
    }

    proptest! {
        /// Against the model, with the table restored from its snapshot list at random
        /// points (as a replica restarted from a snapshot would be): the same answers.
        #[test]
        fn matches_the_model_across_snapshots(
            capacity in 1usize..6,
            ops in prop::collection::vec((0u64..8, 0u64..6, any::<bool>()), 1..200),
        ) {
            let mut table = ProducerTable::with_capacity(capacity);
            let mut model = Model::default();
            for (producer, sequence, restore) in ops {
                if restore {
                    table = ProducerTable::from_recency_order(&table.recency_order(), capacity);
                }
                let t = tag(producer, sequence);
                let retry = table.is_retry(&t);
                prop_assert_eq!(retry, model.is_retry(&t));
                if !retry {
                    table.record(&t);
                    model.record(&t, capacity);
                }
                prop_assert_eq!(table.recency_order(), model.0.clone());
            }
        }
    }
}

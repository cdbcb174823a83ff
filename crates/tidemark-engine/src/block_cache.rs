//! Decoded segment blocks kept for reads by position ([`crate::read`]): consumers read a
//! stream in order, a window at a time, so the block a read ended in is the one the next
//! read begins in, and consumers catching up on the same stream read the same blocks at
//! about the same time. Decoding a block is most of what such a read costs; kept here, each
//! block is decoded about once however many reads and consumers take it.
//!
//! At most [`BlockCache::CAPACITY_BYTES`] of decoded blocks and [`BlockCache::MAX_BLOCKS`]
//! of them, the least recently used dropped first. Written here rather than taken from a
//! crate, as the tier's page cache is: none in the tree does it, and with at most a few
//! hundred entries, finding the least recently used by a scan costs nothing next to the
//! decode it saves.
//!
//! Must never know about: how blocks are decoded or which reads use them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tidemark_core::sync::IgnorePoison;
use tidemark_core::EventBatch;

/// Which decoded block: of which segment (by the address of its `Arc`), which block, read
/// under a schema of how many fields (a stream's schema only grows, so its length names its
/// version).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    segment: usize,
    block: usize,
    fields: usize,
}

#[derive(Debug)]
struct Entry<S> {
    /// Keeps the segment's allocation (not the segment: its file closes when it is retired)
    /// while its blocks are here, so that its address, the key, is not another segment's.
    _segment: Weak<S>,
    block: Arc<EventBatch>,
    bytes: usize,
    last_use: u64,
}

#[derive(Debug)]
struct Blocks<S> {
    entries: HashMap<Key, Entry<S>>,
    bytes: usize,
    clock: u64,
}

/// Decoded blocks of segments `S` (the engine's [`crate::segment::Segment`]).
#[derive(Debug)]
pub(crate) struct BlockCache<S> {
    inner: Mutex<Blocks<S>>,
}

impl<S> Default for BlockCache<S> {
    fn default() -> Self {
        BlockCache {
            inner: Mutex::new(Blocks {
                entries: HashMap::new(),
                bytes: 0,
                clock: 0,
            }),
        }
    }
}

impl<S> BlockCache<S> {
    /// A few default-sized blocks (4 MiB of values) for each of a dozen streams being
    /// caught up on at once.
    pub(crate) const CAPACITY_BYTES: usize = 64 << 20;
    /// Small blocks (narrow events) are cheap to decode; a bound on their number keeps the
    /// scan for the least recently used short.
    pub(crate) const MAX_BLOCKS: usize = 256;

    /// Block `block` of `segment` decoded under a schema of `fields` fields: from the cache,
    /// or by `decode`, then kept.
    pub(crate) fn get_or_decode<E>(
        &self,
        segment: &Arc<S>,
        block: usize,
        fields: usize,
        decode: impl FnOnce() -> Result<EventBatch, E>,
    ) -> Result<Arc<EventBatch>, E> {
        let key = Key {
            segment: Arc::as_ptr(segment) as usize,
            block,
            fields,
        };
        if let Some(found) = self.lookup(key) {
            return Ok(found);
        }
        // Decoded without the lock: two readers may both decode a block, never wait on one.
        let decoded = Arc::new(decode()?);
        self.insert(key, segment, decoded.clone());
        Ok(decoded)
    }

    fn lookup(&self, key: Key) -> Option<Arc<EventBatch>> {
        let mut inner = self.inner.lock().ignore_poison();
        inner.clock += 1;
        let now = inner.clock;
        let entry = inner.entries.get_mut(&key)?;
        entry.last_use = now;
        Some(entry.block.clone())
    }

    fn insert(&self, key: Key, segment: &Arc<S>, block: Arc<EventBatch>) {
        let bytes = block.heap_bytes();
        if bytes > Self::CAPACITY_BYTES {
            return;
        }
        let mut inner = self.inner.lock().ignore_poison();
        inner.clock += 1;
        let last_use = inner.clock;
        if let Some(old) = inner.entries.insert(
            key,
            Entry {
                _segment: Arc::downgrade(segment),
                block,
                bytes,
                last_use,
            },
        ) {
            inner.bytes -= old.bytes;
        }
        inner.bytes += bytes;
        while inner.bytes > Self::CAPACITY_BYTES || inner.entries.len() > Self::MAX_BLOCKS {
            let Some(oldest) = inner
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_use)
                .map(|(k, _)| *k)
            else {
                break;
            };
            if let Some(dropped) = inner.entries.remove(&oldest) {
                inner.bytes -= dropped.bytes;
            }
        }
        // What is held is what the entries add up to, within both bounds.
        assert!(inner.bytes <= Self::CAPACITY_BYTES && inner.entries.len() <= Self::MAX_BLOCKS);
        debug_assert_eq!(
            inner.bytes,
            inner.entries.values().map(|e| e.bytes).sum::<usize>()
        );
    }

    /// Decoded blocks held, and their bytes.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let inner = self.inner.lock().ignore_poison();
        (inner.entries.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::{BatchBuilder, Schema, Value};

    fn block(events: usize, value_bytes: usize) -> EventBatch {
        let schema = Arc::new(Schema::parse_spec("P:BYTES").unwrap());
        let mut b = BatchBuilder::new(schema, events);
        for i in 0..events {
            b.push_row(i as i64, None, &[Value::Bytes(vec![b'x'; value_bytes])])
                .unwrap();
        }
        b.finish()
    }

    #[test]
    fn a_block_is_decoded_once_until_it_is_the_least_recently_used() {
        let cache = BlockCache::<u8>::default();
        let (a, b) = (Arc::new(1u8), Arc::new(2u8));
        let decodes = std::cell::Cell::new(0);
        let get = |segment: &Arc<u8>, index: usize, fields: usize| {
            cache
                .get_or_decode(segment, index, fields, || {
                    decodes.set(decodes.get() + 1);
                    Ok::<_, ()>(block(4, 10))
                })
                .unwrap()
        };
        get(&a, 0, 1);
        get(&a, 0, 1);
        assert_eq!(decodes.get(), 1, "the second read is a hit");
        // Another block, another segment, another schema version: each its own entry.
        get(&a, 1, 1);
        get(&b, 0, 1);
        get(&a, 0, 2);
        assert_eq!(decodes.get(), 4);
        assert_eq!(cache.held().0, 4);
        // Filled past its count, the least recently used goes first.
        get(&a, 0, 1); // used now: kept
        for i in 0..BlockCache::<u8>::MAX_BLOCKS {
            get(&b, 100 + i, 1);
        }
        assert_eq!(cache.held().0, BlockCache::<u8>::MAX_BLOCKS);
        let before = decodes.get();
        get(&b, 100 + BlockCache::<u8>::MAX_BLOCKS - 1, 1);
        assert_eq!(decodes.get(), before, "a recent block is still held");
        get(&a, 1, 1);
        assert_eq!(decodes.get(), before + 1, "the oldest block was dropped");
    }

    #[test]
    fn the_bytes_held_stay_within_the_capacity() {
        let cache = BlockCache::<u8>::default();
        let segment = Arc::new(0u8);
        // Blocks of ~1 MiB: the capacity holds fewer of them than the count allows.
        for i in 0..100 {
            cache
                .get_or_decode(&segment, i, 1, || Ok::<_, ()>(block(1024, 1024)))
                .unwrap();
            let (_, bytes) = cache.held();
            assert!(bytes <= BlockCache::<u8>::CAPACITY_BYTES);
        }
        let (blocks, bytes) = cache.held();
        assert!(
            blocks < 100 && bytes > BlockCache::<u8>::CAPACITY_BYTES / 2,
            "{blocks} {bytes}"
        );
        // A block larger than the whole cache is answered, not kept.
        let huge = cache
            .get_or_decode(&segment, 1000, 1, || Ok::<_, ()>(block(80, 1 << 20)))
            .unwrap();
        assert_eq!(huge.len(), 80);
        assert_eq!(cache.held(), (blocks, bytes));
    }
}

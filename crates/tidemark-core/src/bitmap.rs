//! A growable bitmap with a constant-time rank: the validity of a [`crate::Column`], where a
//! null must cost one bit (issue 42: sparse streams name few of many fields per event).
//!
//! Hand-written rather than taken from a crate: the core crate keeps its dependencies few
//! (bitvec or arrow-buffer would be the only users of theirs here), and a column needs just
//! push, truncate, appending a range of another bitmap, and the rank that maps a row to the
//! index of its value among the valid rows.

use std::ops::Range;

const WORD: usize = 64;
/// Words per rank block. A block's rank is a `u32` per 512 bits (1/16 bit per row), and a
/// rank costs at most this many word popcounts: row-by-row readers (a scan's filter, JSON
/// and CSV output) rank every row of a column with nulls.
const BLOCK: usize = 8;

/// Bits in row order, least significant bit of each word first: the bytes of its words in
/// little-endian order are the packed form the wire and segment formats use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bitmap {
    /// Bits past `len` are always zero, so words compare, count and serialise as the bits.
    words: Vec<u64>,
    len: usize,
    /// `ranks[k]`: set bits in `words[..k * BLOCK]`; one entry per block that has a word.
    ranks: Vec<u32>,
}

impl Bitmap {
    /// `len` bits, all `bit`.
    pub fn repeat(bit: bool, len: usize) -> Bitmap {
        let mut bitmap = Bitmap::default();
        bitmap.resize(len, bit);
        bitmap
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, i: usize) -> bool {
        assert!(i < self.len, "bit {i} of {}", self.len);
        self.words[i / WORD] >> (i % WORD) & 1 == 1
    }

    pub fn push(&mut self, bit: bool) {
        if self.len.is_multiple_of(WORD) {
            self.words.push(0);
            self.extend_ranks();
        }
        let last = self.words.len() - 1;
        self.words[last] |= u64::from(bit) << (self.len % WORD);
        self.len += 1;
    }

    /// Grows (with `bit`) or shrinks to `len` bits.
    pub fn resize(&mut self, len: usize, bit: bool) {
        if len <= self.len {
            self.truncate(len);
            return;
        }
        let word = if bit { u64::MAX } else { 0 };
        while self.len < len {
            self.append_word_bits(word, (len - self.len).min(WORD));
        }
    }

    /// Keeps the first `len` bits (no-op if there are fewer).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        self.words.truncate(len.div_ceil(WORD));
        if !len.is_multiple_of(WORD) {
            let last = self.words.len() - 1;
            self.words[last] &= low_bits(len % WORD);
        }
        // Each kept block's rank counts only words before the block, which are unchanged.
        self.ranks.truncate(self.words.len().div_ceil(BLOCK));
        self.len = len;
    }

    /// Appends `other`'s bits at `range`.
    pub fn extend_from(&mut self, other: &Bitmap, range: Range<usize>) {
        assert!(
            range.start <= range.end && range.end <= other.len,
            "bits {range:?} of {}",
            other.len
        );
        let mut at = range.start;
        while at < range.end {
            let count = (range.end - at).min(WORD);
            self.append_word_bits(other.word_at(at), count);
            at += count;
        }
    }

    /// Set bits before bit `i` (`i <= len`): the index of row `i`'s value among the valid
    /// rows' values.
    pub fn rank(&self, i: usize) -> usize {
        assert!(i <= self.len, "rank {i} of {} bits", self.len);
        let word = i / WORD;
        // The block holding word `word`; when `i == len` ends a block, the last one.
        let block = (word / BLOCK).min(self.ranks.len().saturating_sub(1));
        let base = self.ranks.get(block).map_or(0, |&r| r as usize);
        let whole = count(&self.words[block * BLOCK..word]);
        let part = match i % WORD {
            0 => 0,
            bits => (self.words[word] & low_bits(bits)).count_ones() as usize,
        };
        base + whole + part
    }

    /// Set bits in `range`: a word's popcount for up to 64 bits, two ranks beyond.
    pub fn count_ones_in(&self, range: Range<usize>) -> usize {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "bits {range:?} of {}",
            self.len
        );
        match range.len() {
            0 => 0,
            short @ 1..=WORD => (self.word_at(range.start) & low_bits(short)).count_ones() as usize,
            _ => self.rank(range.end) - self.rank(range.start),
        }
    }

    pub fn count_ones(&self) -> usize {
        self.rank(self.len)
    }

    pub fn count_zeros(&self) -> usize {
        self.len - self.count_ones()
    }

    pub fn iter(&self) -> impl Iterator<Item = bool> + '_ {
        (0..self.len).map(|i| self.words[i / WORD] >> (i % WORD) & 1 == 1)
    }

    /// The positions of the set bits in `range`, ascending; skips a clear word at once.
    pub fn ones(&self, range: Range<usize>) -> impl Iterator<Item = usize> + '_ {
        assert!(range.start <= range.end && range.end <= self.len);
        let first = range.start / WORD;
        let last = range.end.div_ceil(WORD);
        self.words[first..last]
            .iter()
            .enumerate()
            .flat_map(move |(k, &word)| {
                let base = (first + k) * WORD;
                let mut rest = word;
                std::iter::from_fn(move || {
                    (rest != 0).then(|| {
                        let bit = rest.trailing_zeros() as usize;
                        rest &= rest - 1;
                        base + bit
                    })
                })
            })
            .filter(move |i| range.contains(i))
    }

    /// Gives back what the words and ranks reserved beyond what they hold.
    pub fn shrink_to_fit(&mut self) {
        self.words.shrink_to_fit();
        self.ranks.shrink_to_fit();
    }

    /// Heap bytes: the words and the rank blocks.
    pub fn heap_bytes(&self) -> usize {
        let bytes = self.words.len() * 8 + self.ranks.len() * 4;
        debug_assert_eq!(bytes, Bitmap::heap_bytes_for(self.len));
        bytes
    }

    /// [`Bitmap::heap_bytes`] of a bitmap of `len` bits, whatever they are: what admitting
    /// `len` rows of a column charges for its validity.
    pub fn heap_bytes_for(len: usize) -> usize {
        let words = len.div_ceil(WORD);
        words * 8 + words.div_ceil(BLOCK) * 4
    }

    /// The words (bits past `len` zero) and `len`, for buffers that take words as they are
    /// (Arrow's null buffers have this layout).
    pub fn into_words(self) -> (Vec<u64>, usize) {
        (self.words, self.len)
    }

    /// Appends the `ceil(len / 8)` bytes of the packed form (`bytes::pack_bits`'s layout).
    pub fn write_bytes(&self, out: &mut Vec<u8>) {
        let bytes = self.len.div_ceil(8);
        out.extend(self.words.iter().flat_map(|w| w.to_le_bytes()).take(bytes));
    }

    /// `len` bits set at `ones` and nowhere else; `None` unless `ones` strictly increase
    /// and are all below `len` (the positions come from disk, so they are checked).
    pub fn from_ones(ones: impl IntoIterator<Item = usize>, len: usize) -> Option<Bitmap> {
        let mut words = vec![0u64; len.div_ceil(WORD)];
        let mut next = 0;
        for i in ones {
            if i < next || i >= len {
                return None;
            }
            words[i / WORD] |= 1 << (i % WORD);
            next = i + 1;
        }
        let mut bitmap = Bitmap {
            words,
            len,
            ranks: Vec::new(),
        };
        bitmap.extend_ranks();
        Some(bitmap)
    }

    /// Reads `len` bits from their packed form; `None` unless there are `ceil(len / 8)` bytes.
    /// Bits past `len` in the last byte are ignored, as `bytes::unpack_bits` ignores them.
    pub fn from_bytes(bytes: &[u8], len: usize) -> Option<Bitmap> {
        if bytes.len() != len.div_ceil(8) {
            return None;
        }
        let mut bitmap = Bitmap {
            words: bytes
                .chunks(8)
                .map(|chunk| {
                    let mut word = [0u8; 8];
                    word[..chunk.len()].copy_from_slice(chunk);
                    u64::from_le_bytes(word)
                })
                .collect(),
            len,
            ranks: Vec::new(),
        };
        if !len.is_multiple_of(WORD) {
            let last = bitmap.words.len() - 1;
            bitmap.words[last] &= low_bits(len % WORD);
        }
        bitmap.extend_ranks();
        Some(bitmap)
    }

    /// The `count` (≤ 64) low bits of `word` appended.
    fn append_word_bits(&mut self, word: u64, count: usize) {
        assert!(count <= WORD);
        let mut word = word & low_bits(count);
        let mut count = count;
        while count > 0 {
            let used = self.len % WORD;
            if used == 0 {
                self.words.push(0);
            }
            let last = self.words.len() - 1;
            self.words[last] |= word << used;
            let taken = count.min(WORD - used);
            self.len += taken;
            count -= taken;
            word = if taken == WORD { 0 } else { word >> taken };
        }
        self.extend_ranks();
    }

    /// Up to 64 bits from bit `at` on, low bit first (bits past `len` read as zero).
    fn word_at(&self, at: usize) -> u64 {
        let (word, shift) = (at / WORD, at % WORD);
        let low = self.words[word] >> shift;
        match self.words.get(word + 1) {
            Some(next) if shift != 0 => low | next << (WORD - shift),
            _ => low,
        }
    }

    /// Adds the ranks of blocks whose first word has been pushed since.
    fn extend_ranks(&mut self) {
        while self.ranks.len() < self.words.len().div_ceil(BLOCK) {
            let block = self.ranks.len();
            let rank = match block.checked_sub(1) {
                None => 0,
                Some(prev) => {
                    self.ranks[prev] as usize + count(&self.words[prev * BLOCK..block * BLOCK])
                }
            };
            // Rows are u32-indexed throughout (`Column::take`, string offsets), so a column
            // never holds more set bits than a u32 counts.
            let rank = u32::try_from(rank).expect("a column of more than u32::MAX rows");
            self.ranks.push(rank);
        }
    }
}

impl FromIterator<bool> for Bitmap {
    fn from_iter<I: IntoIterator<Item = bool>>(bits: I) -> Bitmap {
        let mut bitmap = Bitmap::default();
        for bit in bits {
            bitmap.push(bit);
        }
        bitmap
    }
}

fn low_bits(n: usize) -> u64 {
    if n >= WORD {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

fn count(words: &[u64]) -> usize {
    words.iter().map(|w| w.count_ones() as usize).sum()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::bytes::{pack_bits, unpack_bits};

    proptest! {
        /// Every operation agrees with a `Vec<bool>`, across word and rank-block borders.
        #[test]
        fn agrees_with_a_vector_of_bools(
            runs in prop::collection::vec((any::<bool>(), 0usize..5_000), 1..8),
            cut in 0usize..40_000,
            from in 0usize..40_000,
            span in 0usize..6_000,
        ) {
            let mut model = Vec::new();
            let mut bits = Bitmap::default();
            for (i, &(bit, n)) in runs.iter().enumerate() {
                model.extend(std::iter::repeat_n(bit, n));
                if i % 2 == 0 {
                    bits.resize(model.len(), bit);
                } else {
                    (0..n).for_each(|_| bits.push(bit));
                }
            }
            let cut = cut.min(model.len());
            model.truncate(cut);
            bits.truncate(cut);
            let from = from.min(model.len());
            let to = (from + span).min(model.len());
            let copy = bits.clone();
            bits.extend_from(&copy, from..to);
            model.extend_from_within(from..to);

            prop_assert_eq!(bits.len(), model.len());
            prop_assert!(bits.iter().eq(model.iter().copied()));
            prop_assert_eq!(&bits, &model.iter().copied().collect::<Bitmap>());
            for i in (0..=model.len()).step_by(97).chain([model.len()]) {
                prop_assert_eq!(bits.rank(i), model[..i].iter().filter(|b| **b).count());
            }
            let lo = from.min(model.len());
            let ones: Vec<usize> = (lo..model.len()).filter(|&i| model[i]).collect();
            prop_assert_eq!(bits.ones(lo..model.len()).collect::<Vec<_>>(), ones);
            for len in [0, 1, 2, 63, 64, 65, span] {
                let hi = (lo + len).min(model.len());
                let want = model[lo..hi].iter().filter(|b| **b).count();
                prop_assert_eq!(bits.count_ones_in(lo..hi), want);
            }
            let all: Vec<usize> = (0..model.len()).filter(|&i| model[i]).collect();
            let rebuilt = Bitmap::from_ones(all.iter().copied(), model.len());
            prop_assert_eq!(rebuilt.as_ref(), Some(&bits));
            if let Some(&last) = all.last() {
                prop_assert!(Bitmap::from_ones(all.iter().copied(), last).is_none());
                let repeated = all.iter().chain([&last]).copied();
                prop_assert!(Bitmap::from_ones(repeated, model.len()).is_none());
            }
            let mut packed = Vec::new();
            pack_bits(&model, &mut packed);
            let mut written = Vec::new();
            bits.write_bytes(&mut written);
            prop_assert_eq!(&written, &packed);
            let read = Bitmap::from_bytes(&packed, model.len()).unwrap();
            prop_assert_eq!(&read, &bits);
            prop_assert_eq!(unpack_bits(&written, model.len()).unwrap(), model);
        }
    }

    #[test]
    fn a_bit_costs_a_bit() {
        let n = 1_000_000;
        let bits = Bitmap::repeat(false, n);
        // The bits, and the rank index: a u32 per 512 bits.
        let bound = n / 8 + n / 128 + 1_024;
        assert!(bits.heap_bytes() <= bound, "{}", bits.heap_bytes());
        assert_eq!(bits.count_ones(), 0);
        assert!(Bitmap::from_bytes(&[0xff], 9).is_none());
        assert_eq!(Bitmap::from_bytes(&[0xff], 3).unwrap().count_ones(), 3);
    }
}

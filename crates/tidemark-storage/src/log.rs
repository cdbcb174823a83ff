//! Framing of log records, and the names of log files.
//!
//! The log is one logical byte sequence split over files named by the position (LSN, "log
//! sequence number": the byte offset in that sequence) of their first byte. A record's LSN
//! is the position of its frame:
//!
//! ```text
//! frame := u32 payload length | u32 CRC32C of the payload
//!          | u64 (bit 63: the frame starts a write; bits 0-62: the LSN of this frame) | payload
//! ```
//!
//! The stored LSN lets recovery tell a frame that belongs at this position from stale or
//! misplaced bytes that happen to carry a valid checksum. Its top bit ([`STARTS_WRITE`]) is
//! not part of the LSN: it marks the first frame of each write (one `writev` and its
//! `fdatasync`), which is how recovery tells a torn last write from corruption
//! ([`scan_after_damage`]). A reader stops at the first frame that is incomplete, claims an
//! impossible length, sits at the wrong LSN or fails its checksum.

use std::path::Path;

use crate::StorageError;

pub const FRAME_HEADER: usize = 16;

/// The largest payload a frame may carry; a longer length field means a torn write.
pub const MAX_PAYLOAD: usize = 1 << 30;

/// Starts a frame in `out` (cleared): room for the header, then the caller appends the
/// payload and calls [`end_frame`]. Building the frame in place spares the write path a copy.
pub fn begin_frame(out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&[0; FRAME_HEADER]);
}

/// Fills in the length and checksum of a frame begun with [`begin_frame`]. A payload over
/// [`MAX_PAYLOAD`] is refused: recovery would take its length for a torn write.
pub fn end_frame(frame: &mut [u8]) -> Result<(), StorageError> {
    end_frame_with_tail(frame, &[])
}

/// [`end_frame`] for a frame whose payload ends with `tail`, bytes that are written after
/// `head` from a buffer of their own (so a large payload need not be copied into the frame).
pub fn end_frame_with_tail(head: &mut [u8], tail: &[u8]) -> Result<(), StorageError> {
    let payload = head.len().saturating_sub(FRAME_HEADER) + tail.len();
    if head.len() < FRAME_HEADER || payload == 0 || payload > MAX_PAYLOAD {
        return Err(StorageError::Encode(format!(
            "a log record of {payload} bytes (1 to {MAX_PAYLOAD} are possible)"
        )));
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head[FRAME_HEADER..]), tail);
    head[0..4].copy_from_slice(&(payload as u32).to_le_bytes());
    head[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Sets the position of a finished frame: the last step, taken once the LSN is known.
pub fn set_frame_lsn(frame: &mut [u8], lsn: u64) {
    debug_assert!(lsn & STARTS_WRITE == 0, "LSN {lsn} reaches the flag bit");
    frame[8..16].copy_from_slice(&lsn.to_le_bytes());
}

/// The top bit of a frame's stored LSN: set on the first frame of every write (the frames
/// one `writev` writes and one `fdatasync` makes durable), clear on the others. LSNs are
/// byte offsets and never come near 2^63. Readers mask it off before comparing the LSN with
/// the frame's position. The checksum covers the payload only, so a flip of this bit alone
/// goes unnoticed: it changes no record, only where recovery thinks a write began.
///
/// Logs written before the flag existed (log format 2 and older) have it on no frame.
pub const STARTS_WRITE: u64 = 1 << 63;

/// Marks a frame (its header is enough) as the first of a write ([`STARTS_WRITE`]).
pub fn mark_starts_write(frame: &mut [u8]) {
    frame[15] |= 0x80;
}

/// A frame that checks out: at its place, whole, with a matching checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameAt {
    /// Its LSN (the flag masked off).
    pub lsn: u64,
    /// Header and payload.
    pub len: usize,
    /// Whether it carries [`STARTS_WRITE`].
    pub starts_write: bool,
}

/// The frame at `pos` of `buf` (whose first byte is at `start_lsn`), or why there is none.
pub fn frame_at(buf: &[u8], pos: usize, start_lsn: u64) -> Result<FrameAt, String> {
    let rest = buf.get(pos..).unwrap_or_default();
    if rest.len() < FRAME_HEADER {
        return Err(format!("{} bytes of a frame header", rest.len()));
    }
    let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
    let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
    let field = lsn_field(rest);
    let lsn = field & !STARTS_WRITE;
    let Some(expected_lsn) = start_lsn.checked_add(pos as u64) else {
        return Err(format!("position {pos} is past the largest LSN"));
    };
    if len == 0 || len > MAX_PAYLOAD {
        return Err(format!("impossible record length {len}"));
    }
    if lsn != expected_lsn {
        return Err(format!("frame says LSN {lsn}, it sits at {expected_lsn}"));
    }
    if rest.len() < FRAME_HEADER + len {
        return Err(format!(
            "record of {len} bytes, {} present",
            rest.len() - FRAME_HEADER
        ));
    }
    if !crate::checksum_matches(&rest[FRAME_HEADER..FRAME_HEADER + len], crc) {
        return Err(format!("checksum mismatch at LSN {lsn}"));
    }
    Ok(FrameAt {
        lsn,
        len: FRAME_HEADER + len,
        starts_write: field & STARTS_WRITE != 0,
    })
}

/// The LSN stored in the header at the start of `frame` (the write mark masked off): what
/// [`set_frame_lsn`] wrote.
pub fn frame_lsn(frame: &[u8]) -> u64 {
    lsn_field(frame) & !STARTS_WRITE
}

/// The stored LSN field (flag included) of the header at the start of `header`.
fn lsn_field(header: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&header[8..16]);
    u64::from_le_bytes(bytes)
}

/// How a sequence of frames ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameEnd {
    /// Every byte belonged to a whole, valid frame.
    Clean,
    /// The bytes from `valid_len` on are not a valid frame.
    Torn { valid_len: usize, reason: String },
}

/// The valid frames at the start of `buf`, whose first byte is at `start_lsn`, and how the
/// bytes ended.
pub fn read_frames(buf: &[u8], start_lsn: u64) -> (Vec<(u64, &[u8])>, FrameEnd) {
    let mut frames = Vec::new();
    let mut pos = 0usize;
    while pos < buf.len() {
        match frame_at(buf, pos, start_lsn) {
            Ok(frame) => {
                frames.push((frame.lsn, &buf[pos + FRAME_HEADER..pos + frame.len]));
                pos += frame.len;
            }
            Err(reason) => {
                return (
                    frames,
                    FrameEnd::Torn {
                        valid_len: pos,
                        reason,
                    },
                )
            }
        }
    }
    (frames, FrameEnd::Clean)
}

/// The valid frames found after the damage in a log file ([`scan_after_damage`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AfterDamage {
    /// How many valid frames lie after the damage, and their bytes (headers included).
    pub records: u64,
    pub bytes: u64,
    /// Where (in the bytes scanned) the first of them that starts a write lies, if one
    /// does: then the damaged write was not the last one.
    pub later_write: Option<usize>,
}

/// Looks for valid frames after `damage` (where [`read_frames`] stopped) in `buf`, whose
/// first byte is at `start_lsn`: at every byte offset past the damage, cheaply (the stored
/// LSN must be the offset's, flag masked off, before length and checksum are looked at).
/// Every offset, even inside a frame found valid: hopping over it would trust its length,
/// and a frame forged inside a payload could then hide the next write's first frame. (One
/// forged with the flag can only make a torn tail look like corruption: the open is
/// refused, nothing is lost.)
///
/// This is what tells a torn tail from corruption. The log writer issues a write only once
/// the write before it is fsync'd, and marks each write's first frame ([`STARTS_WRITE`]): a
/// valid frame that starts a write after the damage ([`AfterDamage::later_write`]) proves
/// the damaged write had been durable, so the damage is corruption of acknowledged records,
/// not a crash. Damage followed only by frames without the flag lies in the last write,
/// which a crash may have left with some of its pages on disk and others not: a torn tail.
/// (Old bytes of a reused file never count: their stored LSNs are smaller than their
/// positions.)
pub fn scan_after_damage(buf: &[u8], start_lsn: u64, damage: usize) -> AfterDamage {
    let mut found = AfterDamage::default();
    let mut pos = damage.saturating_add(1);
    while pos < buf.len() && buf.len() - pos >= FRAME_HEADER {
        let here = start_lsn.wrapping_add(pos as u64);
        if lsn_field(&buf[pos..]) & !STARTS_WRITE == here {
            if let Ok(frame) = frame_at(buf, pos, start_lsn) {
                found.records += 1;
                found.bytes += frame.len as u64;
                if frame.starts_write && found.later_write.is_none() {
                    found.later_write = Some(pos);
                }
            }
        }
        pos += 1;
    }
    found
}

/// The file name of the log file starting at `lsn`.
pub fn file_name(lsn: u64) -> String {
    format!("{lsn:020}.log")
}

/// The starting LSN of a log file, if `path` is named like one.
pub fn parse_file_name(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let digits = name.strip_suffix(".log")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(start: u64, payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            let mut frame = Vec::new();
            begin_frame(&mut frame);
            frame.extend_from_slice(p);
            end_frame(&mut frame).unwrap();
            set_frame_lsn(&mut frame, start + out.len() as u64);
            out.extend_from_slice(&frame);
        }
        out
    }

    #[test]
    fn empty_records_are_refused() {
        let mut frame = Vec::new();
        begin_frame(&mut frame);
        assert!(end_frame(&mut frame).is_err());
    }

    #[test]
    fn a_frame_with_a_tail_equals_the_whole_frame() {
        let whole = frames(7, &[b"head and tail"]);
        for split in 0..=13 {
            let mut head = Vec::new();
            begin_frame(&mut head);
            head.extend_from_slice(&b"head and tail"[..split]);
            let tail = &b"head and tail"[split..];
            end_frame_with_tail(&mut head, tail).unwrap();
            set_frame_lsn(&mut head, 7);
            head.extend_from_slice(tail);
            assert_eq!(head, whole, "split at {split}");
        }
        let mut head = Vec::new();
        begin_frame(&mut head);
        assert!(end_frame_with_tail(&mut head, b"").is_err());
        assert!(end_frame_with_tail(&mut [0; 3], b"tail").is_err());
    }

    #[test]
    fn reads_back_and_stops_at_damage() {
        let buf = frames(100, &[b"one", b"two!", b"three"]);
        let (got, end) = read_frames(&buf, 100);
        assert_eq!(end, FrameEnd::Clean);
        assert_eq!(
            got.iter().map(|f| f.1).collect::<Vec<_>>(),
            [&b"one"[..], b"two!", b"three"]
        );
        assert_eq!(got[1].0, 100 + (FRAME_HEADER + 3) as u64);

        // Every truncation ends cleanly at a frame boundary or reports a torn tail there.
        for cut in 0..buf.len() {
            let (got, end) = read_frames(&buf[..cut], 100);
            let valid: usize = got.iter().map(|f| FRAME_HEADER + f.1.len()).sum();
            match end {
                FrameEnd::Clean => assert_eq!(valid, cut),
                FrameEnd::Torn { valid_len, .. } => assert_eq!(valid_len, valid),
            }
        }
        // A flipped byte anywhere never yields a frame that was not written.
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x40;
            let (got, _) = read_frames(&bad, 100);
            let originals = read_frames(&buf, 100).0;
            assert!(got.len() < 3, "flip at {i} went unnoticed");
            assert_eq!(&originals[..got.len()], &got[..]);
        }
        // The same bytes at another position are refused.
        assert_eq!(read_frames(&buf, 0).0.len(), 0);
    }

    /// Frames for each write of `writes` from LSN `start`, the first of each write marked
    /// as the log writer marks it; the bytes and (start, end, write) of every frame.
    fn writes(start: u64, writes: &[Vec<Vec<u8>>]) -> (Vec<u8>, Vec<(usize, usize, usize)>) {
        let (mut out, mut frames) = (Vec::new(), Vec::new());
        for (w, payloads) in writes.iter().enumerate() {
            for (i, p) in payloads.iter().enumerate() {
                let mut frame = Vec::new();
                begin_frame(&mut frame);
                frame.extend_from_slice(p);
                end_frame(&mut frame).unwrap();
                set_frame_lsn(&mut frame, start + out.len() as u64);
                if i == 0 {
                    mark_starts_write(&mut frame);
                }
                frames.push((out.len(), out.len() + frame.len(), w));
                out.extend_from_slice(&frame);
            }
        }
        (out, frames)
    }

    fn five_writes() -> (Vec<u8>, Vec<(usize, usize, usize)>) {
        let payloads: Vec<Vec<Vec<u8>>> = (0..5u8)
            .map(|w| (0..3u8).map(|i| vec![w * 16 + i; 1 + i as usize]).collect())
            .collect();
        writes(1000, &payloads)
    }

    #[test]
    fn the_write_mark_is_not_part_of_the_lsn() {
        let (buf, frames) = five_writes();
        let (read, end) = read_frames(&buf, 1000);
        assert_eq!(end, FrameEnd::Clean);
        assert_eq!(read.len(), frames.len());
        for ((lsn, _), (at, _, _)) in read.iter().zip(&frames) {
            assert_eq!(*lsn, 1000 + *at as u64);
        }
        let starts: Vec<bool> = frames
            .iter()
            .map(|(at, _, _)| frame_at(&buf, *at, 1000).unwrap().starts_write)
            .collect();
        assert_eq!(starts, (0..15).map(|i| i % 3 == 0).collect::<Vec<_>>());
    }

    /// What recovery decides for damage to `bad` (from `good`): `Some(true)` corruption,
    /// `Some(false)` a torn tail, `None` nothing to decide (every frame reads back).
    fn verdict(good: &[u8], bad: &[u8]) -> Option<(usize, bool)> {
        let (read, end) = read_frames(bad, 1000);
        match end {
            FrameEnd::Clean => {
                assert_eq!(read, read_frames(good, 1000).0, "a frame changed unnoticed");
                None
            }
            FrameEnd::Torn { valid_len, .. } => {
                let after = scan_after_damage(bad, 1000, valid_len);
                Some((valid_len, after.later_write.is_some()))
            }
        }
    }

    /// A flip of each bit, and a 4-byte overwrite, at every position of a log of five
    /// writes: corruption exactly when the damage leaves a later write's first frame
    /// intact after it, a torn tail when it reaches into the last write; a flipped write
    /// mark alone is no damage.
    #[test]
    fn damage_followed_by_a_later_write_is_corruption_and_in_the_last_write_torn() {
        let (good, frames) = five_writes();
        let last_write = frames.iter().find(|f| f.2 == 4).unwrap().0;
        let frame_of = |at: usize| frames.iter().find(|f| f.0 <= at && at < f.1).unwrap().0;
        let mut damaged: Vec<Vec<u8>> = Vec::new();
        for at in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[at] ^= 1 << bit;
                damaged.push(bad);
            }
            for pattern in [[0u8; 4], [0xff; 4], [0xde, 0xad, 0xbe, 0xef]] {
                let mut bad = good.clone();
                let end = (at + 4).min(bad.len());
                bad[at..end].copy_from_slice(&pattern[..end - at]);
                damaged.push(bad);
            }
        }
        let (mut corrupt, mut torn) = (0, 0);
        for bad in damaged {
            // A write mark flipped alone changes no record: not damage.
            let mark = |i: usize| i == frame_of(i) + 15 && good[i] ^ bad[i] == 0x80;
            let changed: Vec<usize> = (0..good.len())
                .filter(|&i| good[i] != bad[i] && !mark(i))
                .collect();
            let first = changed.first().copied().unwrap_or(usize::MAX);
            let mark_only = changed.is_empty();
            match verdict(&good, &bad) {
                None => assert!(mark_only, "damage at {changed:?} went unnoticed"),
                Some((damage, is_corrupt)) => {
                    assert!(!mark_only);
                    assert_eq!(damage, frame_of(first), "{changed:?}");
                    let in_last_write = changed.iter().any(|&i| i >= last_write);
                    assert_eq!(is_corrupt, !in_last_write, "damage at {changed:?}");
                    if is_corrupt {
                        corrupt += 1;
                    } else {
                        torn += 1;
                    }
                }
            }
        }
        assert!(corrupt > 1000 && torn > 100, "{corrupt} {torn}");
    }

    /// The last write torn by a crash: any of its frames lost (zeros, or the old bytes a
    /// reused file held there), the others landed. Never corruption.
    #[test]
    fn a_torn_last_write_is_never_corruption() {
        let (good, frames) = five_writes();
        let last: Vec<_> = frames.iter().filter(|f| f.2 == 4).collect();
        let (old, _) = writes(0, &[vec![vec![7; 40]; 4]]); // a reused file's earlier life
        for lost in 0..1u32 << last.len() {
            for filler in [None, Some(&old)] {
                let mut bad = good.clone();
                for (i, (from, to, _)) in last.iter().enumerate() {
                    if lost & (1 << i) != 0 {
                        for at in *from..*to {
                            bad[at] = filler.map_or(0, |old| old[at % old.len()]);
                        }
                    }
                }
                if let Some((_, is_corrupt)) = verdict(&good, &bad) {
                    assert!(!is_corrupt, "frames {lost:b} of the last write lost");
                }
            }
        }
    }

    /// Frames written before writes were marked carry no mark: damage is never provably
    /// corruption, as before.
    #[test]
    fn unmarked_frames_never_prove_corruption() {
        let (mut good, frames) = five_writes();
        for (at, _, _) in &frames {
            good[at + 15] &= 0x7f;
        }
        let mut bad = good.clone();
        bad[frames[1].0 + FRAME_HEADER] ^= 1;
        assert_eq!(verdict(&good, &bad), Some((frames[1].0, false)));
        let after = scan_after_damage(&bad, 1000, frames[1].0);
        assert_eq!(after.records, frames.len() as u64 - 2);
        assert_eq!(after.later_write, None);
    }

    #[test]
    fn file_names() {
        let name = file_name(42);
        assert_eq!(parse_file_name(Path::new(&name)), Some(42));
        assert_eq!(parse_file_name(Path::new("42.log")), None);
        assert_eq!(parse_file_name(Path::new("00000000000000000042.tmp")), None);
    }

    proptest::proptest! {
        /// Bytes after damage that are not frames of this log (garbage, or frames of an
        /// earlier life of the file) never count as a later write.
        #[test]
        fn garbage_after_damage_is_never_a_later_write(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            start in 0u64..1000,
        ) {
            let (old, _) = writes(start.saturating_sub(500), &[vec![vec![3; 20], vec![4; 30]]]);
            let buf: Vec<u8> = bytes.iter().chain(&old).copied().collect();
            let after = scan_after_damage(&buf, start, 0);
            proptest::prop_assert_eq!(after.later_write, None);
        }

        #[test]
        fn garbage_is_never_a_frame(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200), start in 0u64..1000) {
            let (frames, _) = read_frames(&bytes, start);
            // A random frame would need a matching LSN and CRC32C: never in practice.
            proptest::prop_assert!(frames.is_empty());
        }
    }
}

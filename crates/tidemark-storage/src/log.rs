//! Framing of log records, and the names of log files.
//!
//! The log is one logical byte sequence split over files named by the position (LSN, "log
//! sequence number": the byte offset in that sequence) of their first byte. A record's LSN
//! is the position of its frame:
//!
//! ```text
//! frame := u32 payload length | u32 CRC32C of the payload | u64 LSN of this frame | payload
//! ```
//!
//! The stored LSN lets recovery tell a frame that belongs at this position from stale or
//! misplaced bytes that happen to carry a valid checksum. A reader stops at the first frame
//! that is incomplete, claims an impossible length, sits at the wrong LSN or fails its
//! checksum: that is the torn tail of a write that was never acknowledged.

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
    frame[8..16].copy_from_slice(&lsn.to_le_bytes());
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
        let torn = |reason: String| FrameEnd::Torn {
            valid_len: pos,
            reason,
        };
        let rest = &buf[pos..];
        if rest.len() < FRAME_HEADER {
            return (
                frames,
                torn(format!("{} bytes of a frame header", rest.len())),
            );
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let mut lsn_bytes = [0u8; 8];
        lsn_bytes.copy_from_slice(&rest[8..16]);
        let lsn = u64::from_le_bytes(lsn_bytes);
        let expected_lsn = start_lsn + pos as u64;
        if len == 0 || len > MAX_PAYLOAD {
            return (frames, torn(format!("impossible record length {len}")));
        }
        if lsn != expected_lsn {
            return (
                frames,
                torn(format!("frame says LSN {lsn}, it sits at {expected_lsn}")),
            );
        }
        if rest.len() < FRAME_HEADER + len {
            return (
                frames,
                torn(format!(
                    "record of {len} bytes, {} present",
                    rest.len() - FRAME_HEADER
                )),
            );
        }
        let payload = &rest[FRAME_HEADER..FRAME_HEADER + len];
        if !crate::checksum_matches(payload, crc) {
            return (frames, torn(format!("checksum mismatch at LSN {lsn}")));
        }
        frames.push((lsn, payload));
        pos += FRAME_HEADER + len;
    }
    (frames, FrameEnd::Clean)
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

    #[test]
    fn file_names() {
        let name = file_name(42);
        assert_eq!(parse_file_name(Path::new(&name)), Some(42));
        assert_eq!(parse_file_name(Path::new("42.log")), None);
        assert_eq!(parse_file_name(Path::new("00000000000000000042.tmp")), None);
    }

    proptest::proptest! {
        #[test]
        fn garbage_is_never_a_frame(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200), start in 0u64..1000) {
            let (frames, _) = read_frames(&bytes, start);
            // A random frame would need a matching LSN and CRC32C: never in practice.
            proptest::prop_assert!(frames.is_empty());
        }
    }
}

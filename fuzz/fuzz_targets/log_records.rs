//! Log bytes as recovery reads them: frames, then commands (and the records of log format
//! 1, read once to upgrade), then append bodies; and recovery's scan after damage, on the
//! input as it is and on a valid log of several writes damaged where the input says.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tidemark_core::command::{self, Command};
use tidemark_core::Schema;
use tidemark_storage::bytes::Reader;
use tidemark_storage::legacy_record::Record;
use tidemark_storage::log::{
    begin_frame, end_frame, frame_at, mark_starts_write, read_frames, scan_after_damage,
    set_frame_lsn, FrameEnd,
};

fuzz_target!(|data: &[u8]| {
    let schema =
        Arc::new(Schema::parse_spec("S:STRING,I:INTEGER,F:DOUBLE,B:BOOLEAN,X:BYTES").unwrap());
    let decode_batch = |body: &[u8]| {
        let mut r = Reader::new(body, "batch");
        let _ = tidemark_core::wire::decode_batch(&mut r, &schema);
    };
    // Frames (with checksums) at LSN 0, and the bytes taken directly as payloads so that
    // the decoders are reached without forging a CRC.
    let (frames, end) = read_frames(data, 0);
    for payload in frames.iter().map(|f| f.1).chain([data]) {
        if let Ok(Command::Append { batch, .. }) = command::decode(payload) {
            decode_batch(batch);
        }
        if let Ok(Record::Append { body, .. }) = Record::decode(payload) {
            decode_batch(body);
        }
    }
    if let FrameEnd::Torn { valid_len, .. } = end {
        check_scan(data, 0, valid_len);
    }
    damaged_log(data);
});

/// What the scan after damage reports must be true of the bytes.
fn check_scan(buf: &[u8], start: u64, damage: usize) -> Option<usize> {
    let after = scan_after_damage(buf, start, damage);
    assert!(after.bytes <= after.records.saturating_mul(1 << 31));
    if let Some(at) = after.later_write {
        assert!(at > damage && after.records > 0);
        let frame = frame_at(buf, at, start).expect("the later write's frame is valid");
        assert!(frame.starts_write);
        assert_eq!(frame.lsn, start + at as u64);
    }
    after.later_write
}

/// Builds a valid log of several writes from the input (each write's first frame marked,
/// as the log writer marks it), damages it where the input says, and holds recovery's
/// verdict to the rule: whenever a later write's first frame survives whole after the
/// damage, the damage is never taken for a torn tail.
fn damaged_log(data: &[u8]) {
    let mut input = data.iter().copied();
    let mut next = || input.next().unwrap_or(0);
    let start = u64::from(next()) * 4096;
    let writes = 1 + next() % 6;
    // (offset, end, starts a write) of every frame
    let (mut log, mut frames) = (Vec::new(), Vec::new());
    for _ in 0..writes {
        for i in 0..1 + next() % 4 {
            let len = 1 + usize::from(next() % 40);
            let mut frame = Vec::new();
            begin_frame(&mut frame);
            frame.extend((0..len).map(|_| next()));
            end_frame(&mut frame).unwrap();
            set_frame_lsn(&mut frame, start + log.len() as u64);
            if i == 0 {
                mark_starts_write(&mut frame);
            }
            frames.push((log.len(), log.len() + frame.len(), i == 0));
            log.extend_from_slice(&frame);
        }
    }
    let original = log.clone();
    let (intact, end) = read_frames(&log, start);
    assert_eq!((intact.len(), end), (frames.len(), FrameEnd::Clean));
    // Up to three damaged spans: at, length, and the bytes xor'd in.
    for _ in 0..1 + next() % 3 {
        let at = (usize::from(next()) << 8 | usize::from(next())) % log.len();
        let len = 1 + usize::from(next() % 8);
        for i in at..(at + len).min(log.len()) {
            log[i] ^= next().max(1);
        }
    }
    let (read, end) = read_frames(&log, start);
    for (i, (lsn, _)) in read.iter().enumerate() {
        assert!(*lsn >= start && *lsn < start + log.len() as u64);
        if i > 0 {
            assert!(*lsn > read[i - 1].0);
        }
    }
    let FrameEnd::Torn { valid_len, .. } = end else {
        return;
    };
    let later_write = check_scan(&log, start, valid_len);
    let survivor = frames.iter().find(|(from, to, starts)| {
        *starts && *from > valid_len && log[*from..*to] == original[*from..*to]
    });
    if let Some((from, _, _)) = survivor {
        let found = later_write.expect("a later write survived the damage: not a torn tail");
        assert!(found <= *from);
    }
}

//! A whole segment file: open (footer), then every block with every field. Then the same
//! bytes as a pack, with a segment claimed at a range the input's last 16 bytes choose
//! (a manifest is untrusted too), and as a tiered segment's stub.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidemark_storage::segment::{SegmentMeta, SegmentStub};

fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempfile::tempdir() else { return };
    let path = dir.path().join("x.seg");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok((file, meta)) = SegmentMeta::open(&path) {
        read_every_block(&file, &meta);
    }
    let Some(tail) = data.len().checked_sub(16).map(|at| &data[at..]) else {
        return;
    };
    let word = |i: usize| u64::from_le_bytes(tail[i..i + 8].try_into().unwrap_or([0; 8]));
    let (start, len) = (word(0), word(8));
    let Ok(file) = std::fs::File::open(&path) else { return };
    if let Ok(meta) = SegmentMeta::read(&file, &path, start..start.saturating_add(len)) {
        read_every_block(&file, &meta);
    }
    // The same bytes as a tiered segment's stub (its footer alone, kept on local disk).
    if let Ok(stub) = SegmentStub::from_bytes(data.to_vec(), start, len) {
        let _ = SegmentMeta::read(&stub, &path, stub.range());
    }
});

fn read_every_block(file: &std::fs::File, meta: &SegmentMeta) {
    let fields: Vec<usize> = (0..meta.schema.len()).collect();
    for block in 0..meta.blocks.len() {
        if let Ok(batch) = meta.read_block(file, block, &fields, true) {
            assert_eq!(batch.len(), meta.blocks[block].count());
        }
    }
}

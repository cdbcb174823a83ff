//! A whole segment file: open (footer), then every block with every field.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidemark_storage::segment::SegmentMeta;

fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempfile::tempdir() else { return };
    let path = dir.path().join("x.seg");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok((file, meta)) = SegmentMeta::open(&path) {
        let fields: Vec<usize> = (0..meta.schema.len()).collect();
        for block in 0..meta.blocks.len() {
            if let Ok(batch) = meta.read_block(&file, block, &fields, true) {
                assert_eq!(batch.len(), meta.blocks[block].count());
            }
        }
    }
});

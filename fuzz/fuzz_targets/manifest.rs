//! The manifest as recovery reads it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidemark_storage::manifest::Manifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(manifest) = Manifest::decode(data) {
        let _ = manifest.log_start();
    }
});

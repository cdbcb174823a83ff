//! Bytes a cluster node reads from other nodes and from its Raft files: commands, log
//! entries, node-to-node requests and answers, snapshot offers, vote and commit files.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tidemark_cluster::raft::decode_untrusted(data);
});

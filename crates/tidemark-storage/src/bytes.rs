//! The byte helpers of `tidemark-core`, reporting malformed input as [`StorageError::Corrupt`].

pub use tidemark_core::bytes::{
    pack_bits, put_bytes, put_i64, put_u32, put_u64, put_u8, unpack_bits, Malformed, TooLong,
};

use crate::StorageError;

/// A bounds-checked reader of file bytes.
pub type Reader<'a> = tidemark_core::bytes::Reader<'a, StorageError>;

impl Malformed for StorageError {
    fn malformed(what: &str, detail: String) -> StorageError {
        StorageError::corrupt(what, detail)
    }
}

impl From<TooLong> for StorageError {
    fn from(e: TooLong) -> StorageError {
        StorageError::Encode(e.to_string())
    }
}

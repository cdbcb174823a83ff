//! Little-endian encoding helpers and a bounds-checked reader for untrusted bytes, shared by
//! every byte format in Tidemark (log records, segments, the binary protocol).
//!
//! The reader is generic over its error type so that each format reports failures in its
//! own terms (a corrupt file, a malformed frame) without mapping at every call site.

use std::marker::PhantomData;

/// How a byte format reports that its input is malformed.
pub trait Malformed {
    /// `what` names the structure being read; `detail` says what was wrong with it.
    fn malformed(what: &str, detail: String) -> Self;
}

/// A byte string longer than a u32 length prefix can describe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} bytes in one length-prefixed field (at most 4 GiB)")]
pub struct TooLong(pub usize);

pub fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// A length-prefixed (u32) byte string.
pub fn put_bytes(out: &mut Vec<u8>, v: &[u8]) -> Result<(), TooLong> {
    let len = u32::try_from(v.len()).map_err(|_| TooLong(v.len()))?;
    put_u32(out, len);
    out.extend_from_slice(v);
    Ok(())
}

/// Reads values from a byte slice, failing with `E::malformed` instead of reading past
/// the end.
pub struct Reader<'a, E> {
    buf: &'a [u8],
    pos: usize,
    what: &'a str,
    error: PhantomData<fn() -> E>,
}

impl<'a, E: Malformed> Reader<'a, E> {
    /// `what` names the structure being read, for error messages.
    pub fn new(buf: &'a [u8], what: &'a str) -> Reader<'a, E> {
        Reader {
            buf,
            pos: 0,
            what,
            error: PhantomData,
        }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn corrupt(&self, detail: impl Into<String>) -> E {
        E::malformed(self.what, detail.into())
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], E> {
        if n > self.remaining() {
            return Err(self.corrupt(format!(
                "needs {n} bytes at offset {}, only {} left",
                self.pos,
                self.remaining()
            )));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], E> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, E> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u32(&mut self) -> Result<u32, E> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, E> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub fn i64(&mut self) -> Result<i64, E> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    pub fn i128(&mut self) -> Result<i128, E> {
        Ok(i128::from_le_bytes(self.array()?))
    }

    /// A count that will size an allocation: refused if it exceeds `max`.
    pub fn count(&mut self, max: usize, of: &str) -> Result<usize, E> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(self.corrupt(format!("{n} {of}, at most {max} are possible")));
        }
        Ok(n)
    }

    /// A length-prefixed (u32) byte string.
    pub fn bytes(&mut self) -> Result<&'a [u8], E> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    /// Fails unless every byte was consumed.
    pub fn finish(self) -> Result<(), E> {
        if self.remaining() != 0 {
            return Err(self.corrupt(format!("{} unexpected trailing bytes", self.remaining())));
        }
        Ok(())
    }
}

/// Packs booleans eight to a byte, least significant bit first.
pub fn pack_bits(bits: &[bool], out: &mut Vec<u8>) {
    for chunk in bits.chunks(8) {
        let mut byte = 0u8;
        for (i, &bit) in chunk.iter().enumerate() {
            byte |= u8::from(bit) << i;
        }
        out.push(byte);
    }
}

/// Unpacks `n` booleans written by [`pack_bits`].
pub fn unpack_bits(bytes: &[u8], n: usize) -> Option<Vec<bool>> {
    if bytes.len() != n.div_ceil(8) {
        return None;
    }
    Some((0..n).map(|i| bytes[i / 8] & (1 << (i % 8)) != 0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Bad;
    impl Malformed for Bad {
        fn malformed(_: &str, _: String) -> Bad {
            Bad
        }
    }
    type Reader<'a> = super::Reader<'a, Bad>;

    #[test]
    fn reader_refuses_overruns() {
        let mut out = Vec::new();
        put_u32(&mut out, 7);
        put_bytes(&mut out, b"abc").unwrap();
        let mut r = Reader::new(&out, "test");
        assert_eq!(r.u32().unwrap(), 7);
        assert_eq!(r.bytes().unwrap(), b"abc");
        assert!(r.u8().is_err());
        let mut r = Reader::new(&[255, 255, 255, 255], "test");
        assert!(r.bytes().is_err());
        let mut r = Reader::new(&[9, 0, 0, 0], "test");
        assert!(r.count(8, "things").is_err());
    }

    #[test]
    fn bits_round_trip() {
        for n in [0, 1, 7, 8, 9, 100] {
            let bits: Vec<bool> = (0..n).map(|i| i % 3 == 0).collect();
            let mut packed = Vec::new();
            pack_bits(&bits, &mut packed);
            assert_eq!(unpack_bits(&packed, n), Some(bits));
        }
        assert_eq!(unpack_bits(&[0], 9), None);
    }
}

//! Segments: immutable, columnar, compressed events of one stream in time order, each in
//! a file of its own or written back to back with others into a pack ([`PackWriter`]).
//! Block offsets count from the start of the file either way, so a packed segment is read
//! exactly like a lone one once [`SegmentMeta::read`] has its footer.
//!
//! ```text
//! segment := "TMSEG001", block*, footer, u32 footer len, u32 CRC32C(footer), "TMSEGEND"
//! block   := chunk(tstart), [chunk(tend)], [chunk(position)], chunk(field)*
//!            (chunks: see crate::codec)
//! footer  := u32 version (5), u32 body length, deflate(body)
//! body    := u32 len + schema JSON, u32 block count, block entry*,
//!            u32 group size, u32 group count, summary*
//! block entry := u64 offset, u8 flags (1: has tend, 2: has positions),
//!                [u64 least position, u64 greatest position] (when it has positions),
//!                u32 chunk count, (u32 len, u32 CRC32C)*, summary
//! summary := u64 count, i64 min tstart, i64 max tstart, field summary*
//! field summary := u64 count, u64 nulls, u8 kind (0 none, 1 int, 2 float, 3 bytes),
//!                  [u64 min, u64 max, 16-byte sum, i64 first ts, u64 first, i64 last ts, u64 last]
//!                  (int, float) | [prefix least, prefix greatest] (bytes)
//! prefix  := u8 length (| 0x80: the value was longer), up to 16 bytes of the value
//! ```
//!
//! Each event's position in its stream (see `tidemark_core::EventBatch::positions`) is a
//! LONG chunk like `tend`, null for events stored before streams had positions; the block
//! entry keeps the least and greatest so that a read from a position skips the blocks
//! before it unread. A STRING or BYTES field's summary (kind 3, since version 5) keeps the
//! first 16 bytes of its least and greatest value, so a scan for a value no block holds
//! (`SYMBOL = 'aapl'`) reads none. Footers of version 3 and earlier have no positions (their flags are 0
//! or 1); version 2 footers are read as version 3 ones; version 1 footers hold the body
//! uncompressed. Compressing it matters for small segments of wide streams: one block of a
//! 365-field stream has a footer of about 79 KB (the schema JSON, an ~80-byte summary per
//! field for the block and again for its group), more than the compressed values of a
//! 150-event flush. Deflate because its stream format needs nothing hand-written and the
//! crate (pure Rust) is in the tree.
//!
//! The footer is read once when a segment is opened and kept in memory, so an aggregate over
//! a range that covers whole blocks (or whole groups of blocks) is answered from summaries
//! without reading or decoding any event. Each chunk carries its own checksum so a query
//! reads and verifies only the columns it needs.
//!
//! Blocks are cut at `max_block_events` or after `max_block_bytes` of values, and also
//! where an event crosses a multiple of
//! `block_align_ns` once the block holds `min_block_events`: with the default one-minute
//! alignment, buckets of a minute or longer almost never split a block, so bucketed
//! aggregates over flushed data decode nothing.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tidemark_core::sync::IgnorePoison;
use tidemark_core::{
    BatchBuilder, BatchSummary, Bounds, BytesBounds, Column, ColumnData, EventBatch, FieldSummary,
    FieldType, Num, NumSummary, Prefix, Schema, Sum,
};

use crate::bytes::{put_bytes, put_i64, put_u32, put_u64, put_u8, Reader};
use crate::codec::{decode_column, decode_timestamps, encode_column, encode_timestamps};
use crate::fsutil::{start_writeback, TempPath};
use crate::pace::WritePace;
use crate::StorageError;

const MAGIC: &[u8; 8] = b"TMSEG001";
const END_MAGIC: &[u8; 8] = b"TMSEGEND";
/// The footer version written: 5 since a STRING or BYTES field's summary may hold the
/// bounds of its values (summary kind 3, which a version-4 binary would take for
/// corruption). Version 4 (since blocks may hold positions), version 3 (since a chunk may
/// list the rows of a sparse column, [`crate::codec`], with the footer of version 2),
/// [`FOOTER_V2`] and [`FOOTER_V1`] are still read.
const VERSION: u32 = 5;
const FOOTER_V4: u32 = 4;
const FOOTER_V3: u32 = 3;
const FOOTER_V2: u32 = 2;
const FOOTER_V1: u32 = 1;
/// A footer body longer than this is refused (when written, and when read, before it is
/// inflated): far above a real one (a 1000-field block's entry is about 90 KB), and it
/// bounds what a damaged or hostile length can make a reader allocate.
const MAX_FOOTER_BODY: usize = 256 << 20;
const TAIL: usize = 16;
/// No block may claim more events than this.
pub const MAX_BLOCK_EVENTS: usize = 1 << 20;

/// Where a segment's bytes are read from: its file on local disk, or (a tiered segment) an
/// object in a bucket behind a cache, or the local stub of one ([`SegmentStub`]). Offsets
/// count from the start of the file the segment was written to, as its footer's do.
pub trait ReadAt {
    /// Fills `buf` with the bytes at `offset`: all of them, or an error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), StorageError>;
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), StorageError> {
        self.read_exact_at(buf, offset).map_err(|e| {
            let detail = format!("reading {} bytes at {offset}: {e}", buf.len());
            match e.kind() {
                std::io::ErrorKind::UnexpectedEof => StorageError::corrupt("segment", detail),
                _ => StorageError::io("read segment", "", e),
            }
        })
    }
}

/// What stays on local disk of a segment whose bytes moved to a bucket: its magic number,
/// footer and tail, so that opening it reads its footer ([`SegmentMeta::read`]) without a
/// request to the bucket.
///
/// ```text
/// stub := "TMSEG001", footer, u32 footer len, u32 CRC32C(footer), "TMSEGEND"
/// ```
///
/// The footer's own checksum covers it as in the segment; the stub's length says where the
/// footer began in the segment.
#[derive(Debug, Clone)]
pub struct SegmentStub {
    bytes: Vec<u8>,
    /// Where the segment starts in the file it was written to (a pack's offset, else 0).
    origin: u64,
    /// The segment's length.
    len: u64,
}

impl SegmentStub {
    /// The length of a segment's tail (footer length, footer CRC32C, end marker).
    pub const TAIL: usize = TAIL;

    /// The stub of `segment` (all of its bytes), which starts at `origin` of its file.
    pub fn of(segment: &[u8], origin: u64) -> Result<SegmentStub, StorageError> {
        let corrupt = |detail: &str| StorageError::corrupt("segment", detail.to_string());
        if segment.len() < MAGIC.len() + TAIL || !segment.starts_with(MAGIC) {
            return Err(corrupt("not a segment (no magic number)"));
        }
        let tail = &segment[segment.len() - TAIL..];
        if &tail[8..] != END_MAGIC {
            return Err(corrupt("no end marker"));
        }
        let footer_len = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]) as usize;
        if footer_len > segment.len() - MAGIC.len() - TAIL {
            return Err(corrupt("footer length exceeds the segment"));
        }
        let footer_start = segment.len() - TAIL - footer_len;
        let mut bytes = Vec::with_capacity(MAGIC.len() + footer_len + TAIL);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&segment[footer_start..]);
        Ok(SegmentStub {
            bytes,
            origin,
            len: segment.len() as u64,
        })
    }

    /// How many bytes at the end of a segment of `len` bytes its stub needs (footer and
    /// tail), from the last [`SegmentStub::TAIL`] bytes of it: what is fetched of an object
    /// to rebuild its stub (`tidemark restore`).
    pub fn footer_span(tail: &[u8], len: u64) -> Result<u64, StorageError> {
        let corrupt = |detail: String| StorageError::corrupt("segment tail", detail);
        if tail.len() != TAIL || &tail[8..] != END_MAGIC {
            return Err(corrupt("no end marker".into()));
        }
        let footer_len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
        // A footer is its version and length words, then at most MAX_FOOTER_BODY bytes.
        if footer_len > MAX_FOOTER_BODY as u64 + 8 {
            return Err(corrupt(format!(
                "footer length {footer_len} is over the limit"
            )));
        }
        if footer_len + (MAGIC.len() + TAIL) as u64 > len {
            return Err(corrupt(format!(
                "footer length {footer_len} exceeds the segment's {len} bytes"
            )));
        }
        Ok(footer_len + TAIL as u64)
    }

    /// The stub of the segment of `len` bytes at `origin` whose footer and tail are
    /// `footer_and_tail`.
    pub fn from_footer(
        footer_and_tail: &[u8],
        origin: u64,
        len: u64,
    ) -> Result<SegmentStub, StorageError> {
        let mut bytes = Vec::with_capacity(MAGIC.len() + footer_and_tail.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(footer_and_tail);
        SegmentStub::from_bytes(bytes, origin, len)
    }

    /// A stub read back (from its file), of the segment of `len` bytes at `origin`.
    pub fn from_bytes(bytes: Vec<u8>, origin: u64, len: u64) -> Result<SegmentStub, StorageError> {
        if bytes.len() < MAGIC.len() + TAIL
            || bytes.len() as u64 > len
            || origin.checked_add(len).is_none()
        {
            return Err(StorageError::corrupt(
                "segment stub",
                format!("{} bytes for a segment of {len}", bytes.len()),
            ));
        }
        Ok(SegmentStub { bytes, origin, len })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The range of the segment in its file, for [`SegmentMeta::read`].
    pub fn range(&self) -> Range<u64> {
        self.origin..self.origin + self.len
    }

    /// Where the footer begins, counted from the start of the segment's file.
    fn footer_start(&self) -> u64 {
        self.origin + self.len - (self.bytes.len() - MAGIC.len()) as u64
    }
}

impl ReadAt for SegmentStub {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), StorageError> {
        let end = offset.saturating_add(buf.len() as u64);
        let from = if offset >= self.origin && end <= self.origin + MAGIC.len() as u64 {
            offset - self.origin
        } else if offset >= self.footer_start() && end <= self.origin + self.len {
            offset - self.footer_start() + MAGIC.len() as u64
        } else {
            return Err(StorageError::corrupt(
                "segment stub",
                format!("bytes {offset}..{end} are not in the stub (only in the bucket)"),
            ));
        };
        let from = from as usize;
        buf.copy_from_slice(&self.bytes[from..from + buf.len()]);
        Ok(())
    }
}

/// How a segment is cut into blocks and compressed.
#[derive(Debug, Clone)]
pub struct SegmentOptions {
    pub max_block_events: usize,
    /// Blocks are also cut after this many bytes of values (strings and byte arrays at
    /// their length, other values at 8 bytes): wide events make small blocks, so a block's
    /// buffers stay well below the allocator's mmap threshold and a range read decompresses
    /// little it does not need.
    pub max_block_bytes: usize,
    pub min_block_events: usize,
    /// Cut blocks at multiples of this many nanoseconds (0 = never).
    pub block_align_ns: i64,
    /// Blocks per group summary in the footer.
    pub group_size: usize,
    /// pco compression level, 0–12.
    pub pco_level: usize,
    /// Threads compressing the blocks of one segment.
    pub encode_threads: usize,
    /// The rate the file's bytes go to the disk at (`None`: as fast as it takes them).
    pub pace: Option<Arc<WritePace>>,
}

impl Default for SegmentOptions {
    fn default() -> Self {
        SegmentOptions {
            max_block_events: 64 * 1024,
            max_block_bytes: 4 << 20,
            min_block_events: 1024,
            block_align_ns: 60_000_000_000,
            group_size: 16,
            pco_level: 4,
            encode_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            pace: None,
        }
    }
}

/// Where a block is and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockMeta {
    pub offset: u64,
    pub has_tend: bool,
    /// The least and greatest position of the block's events, when any has one (they then
    /// have a chunk of positions).
    pub positions: Option<(u64, u64)>,
    /// (length, CRC32C) of tstart, then tend and positions if present, then each field.
    pub chunks: Vec<(u32, u32)>,
    pub summary: BatchSummary,
}

impl BlockMeta {
    pub fn count(&self) -> usize {
        self.summary.count as usize
    }

    /// The index of the chunk of positions, when the block has one.
    fn positions_chunk(&self) -> Option<usize> {
        self.positions.map(|_| 1 + usize::from(self.has_tend))
    }

    /// The index of the chunk of the first field.
    fn first_field_chunk(&self) -> usize {
        1 + usize::from(self.has_tend) + usize::from(self.positions.is_some())
    }

    fn chunk_offset(&self, index: usize) -> u64 {
        self.offset
            + self.chunks[..index]
                .iter()
                .map(|c| u64::from(c.0))
                .sum::<u64>()
    }
}

/// The footer of a segment, kept in memory while the segment is live.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentMeta {
    pub schema: Arc<Schema>,
    pub blocks: Vec<BlockMeta>,
    pub group_size: usize,
    /// Summary of blocks `[i * group_size, (i + 1) * group_size)`.
    pub groups: Vec<BatchSummary>,
    /// Bytes the segment occupies: its whole file, or its range of a pack.
    pub bytes: u64,
}

impl SegmentMeta {
    pub fn event_count(&self) -> u64 {
        self.blocks.iter().map(|b| b.summary.count).sum()
    }

    pub fn min_ts(&self) -> Option<i64> {
        self.blocks.iter().map(|b| b.summary.min_ts).min()
    }

    pub fn max_ts(&self) -> Option<i64> {
        self.blocks.iter().map(|b| b.summary.max_ts).max()
    }

    /// Reads the events of block `index`, with only the fields at `fields` (indexes in the
    /// schema, in that order) and with `tend` when `with_tend`.
    pub fn read_block(
        &self,
        file: &(impl ReadAt + ?Sized),
        index: usize,
        fields: &[usize],
        with_tend: bool,
    ) -> Result<EventBatch, StorageError> {
        self.read_block_as(file, index, &self.schema, fields, with_tend)
    }

    /// [`SegmentMeta::read_block`] under `schema`, the stream's schema now, which extends
    /// the segment's own (`Schema::extends`, checked when the segment is opened): `fields`
    /// are indexes in `schema`, and a field the segment predates reads as null.
    pub fn read_block_as(
        &self,
        file: &(impl ReadAt + ?Sized),
        index: usize,
        schema: &Schema,
        fields: &[usize],
        with_tend: bool,
    ) -> Result<EventBatch, StorageError> {
        let extras = Extras {
            tend: with_tend,
            positions: false,
        };
        self.read_block_with(file, index, schema, fields, extras)
    }

    /// [`SegmentMeta::read_block_as`], with the columns besides the fields that `extras`
    /// asks for.
    pub fn read_block_with(
        &self,
        file: &(impl ReadAt + ?Sized),
        index: usize,
        schema: &Schema,
        fields: &[usize],
        extras: Extras,
    ) -> Result<EventBatch, StorageError> {
        // The whole prefix is compared once, when the segment is opened; per block only what
        // would decode wrong: a field read at a type other than the one it was written as.
        if let Some(&f) = fields.iter().find(|&&f| {
            self.schema
                .fields()
                .get(f)
                .is_some_and(|own| own.ty != schema.fields()[f].ty)
        }) {
            return Err(StorageError::corrupt(
                "segment",
                format!(
                    "field {f} was written as {}, the stream's schema {} reads it as another type",
                    self.schema.fields()[f].ty,
                    schema
                ),
            ));
        }
        let block = &self.blocks[index];
        let n = block.count();
        let tstart = decode_timestamps(&self.read_chunk(file, block, 0)?, n)?;
        let first_field = block.first_field_chunk();
        let tend = if extras.tend && block.has_tend {
            Some(decode_column(
                &self.read_chunk(file, block, 1)?,
                tidemark_core::FieldType::Long,
                n,
            )?)
        } else {
            None
        };
        let columns = fields
            .iter()
            .map(|&f| {
                let ty = schema.fields()[f].ty;
                if f < self.schema.len() {
                    decode_column(&self.read_chunk(file, block, first_field + f)?, ty, n)
                } else {
                    Ok(Column::nulls(ty, n))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let corrupt =
            |e: tidemark_core::CoreError| StorageError::corrupt("segment block", e.to_string());
        let batch = EventBatch::new(Arc::new(schema.project(fields)), tstart, tend, columns)
            .map_err(corrupt)?;
        match block.positions_chunk().filter(|_| extras.positions) {
            None => Ok(batch),
            Some(chunk) => {
                let chunk = self.read_chunk(file, block, chunk)?;
                let positions = decode_column(&chunk, tidemark_core::FieldType::Long, n)?;
                let batch = batch.with_positions(positions).map_err(corrupt)?;
                check_position_range(&batch, block)?;
                Ok(batch)
            }
        }
    }

    fn read_chunk(
        &self,
        file: &(impl ReadAt + ?Sized),
        block: &BlockMeta,
        index: usize,
    ) -> Result<Vec<u8>, StorageError> {
        let (len, crc) = block.chunks[index];
        let mut buf = vec![0u8; len as usize];
        file.read_at(&mut buf, block.chunk_offset(index))?;
        if !crate::checksum_matches(&buf, crc) {
            return Err(StorageError::corrupt(
                "segment",
                format!(
                    "checksum mismatch in a chunk at offset {}",
                    block.chunk_offset(index)
                ),
            ));
        }
        Ok(buf)
    }

    /// Opens a segment file and reads its footer.
    pub fn open(path: &Path) -> Result<(File, SegmentMeta), StorageError> {
        let file = File::open(path).map_err(|e| StorageError::io("open segment", path, e))?;
        let file_bytes = file
            .metadata()
            .map_err(|e| StorageError::io("stat segment", path, e))?
            .len();
        let meta = SegmentMeta::read(&file, path, 0..file_bytes)?;
        Ok((file, meta))
    }

    /// Reads the footer of the segment that occupies `range` of `file` (all of a segment
    /// file, or one segment's part of a pack file, see [`PackWriter`]). `path` names the
    /// file in errors.
    pub fn read(
        file: &(impl ReadAt + ?Sized),
        path: &Path,
        range: Range<u64>,
    ) -> Result<SegmentMeta, StorageError> {
        let corrupt =
            |detail: String| StorageError::corrupt(format!("segment {}", path.display()), detail);
        let bytes = range.end.saturating_sub(range.start);
        if bytes < (MAGIC.len() + TAIL) as u64 {
            return Err(corrupt(format!("only {bytes} bytes at {}", range.start)));
        }
        let mut tail = [0u8; TAIL];
        file.read_at(&mut tail, range.end - TAIL as u64)?;
        if &tail[8..] != END_MAGIC {
            return Err(corrupt(
                "no end marker (not a segment, or cut short)".into(),
            ));
        }
        let footer_len = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]) as u64;
        let footer_crc = u32::from_le_bytes([tail[4], tail[5], tail[6], tail[7]]);
        if footer_len > bytes - (MAGIC.len() + TAIL) as u64 {
            return Err(corrupt(format!(
                "footer length {footer_len} exceeds the segment"
            )));
        }
        let footer_start = range.end - TAIL as u64 - footer_len;
        let mut footer = vec![0u8; footer_len as usize];
        file.read_at(&mut footer, footer_start)?;
        if !crate::checksum_matches(&footer, footer_crc) {
            return Err(corrupt("footer checksum mismatch".into()));
        }
        let mut magic = [0u8; 8];
        file.read_at(&mut magic, range.start)?;
        if &magic != MAGIC {
            return Err(corrupt("bad magic number".into()));
        }
        decode_footer(&footer, range.start..footer_start, bytes).map_err(|e| corrupt(e.to_string()))
    }
}

/// Which of a block's columns besides its fields a read decodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extras {
    pub tend: bool,
    pub positions: bool,
}

/// The least and greatest position of `batch`, when any of its events has one.
fn position_range(batch: &EventBatch) -> Option<(u64, u64)> {
    let positions = batch.positions()?;
    let ColumnData::Long(values) = positions.data() else {
        return None;
    };
    let least = *values.iter().min()?;
    let greatest = *values.iter().max()?;
    Some((least as u64, greatest as u64))
}

/// Refuses a block whose positions are not those its footer entry promises (a reader
/// skips blocks by that range).
fn check_position_range(batch: &EventBatch, block: &BlockMeta) -> Result<(), StorageError> {
    let found = position_range(batch);
    if found != block.positions {
        return Err(StorageError::corrupt(
            "segment block",
            format!(
                "positions {found:?} where the footer says {:?}",
                block.positions
            ),
        ));
    }
    Ok(())
}

/// Cuts `batch` (sorted by tstart) into blocks and writes it to `path` through a temporary
/// file that is fsync'd and renamed. The caller fsyncs the directory.
pub fn write_segment(
    path: &Path,
    batch: &EventBatch,
    options: &SegmentOptions,
) -> Result<SegmentMeta, StorageError> {
    write_segment_unsynced(path, batch, options)?.finish()
}

/// Like [`write_segment`], but returns once the file is written and its writeback started,
/// before its fsync: a caller with many segments to write writes them all, then finishes
/// them, and the file system commits them together instead of one journal commit each
/// (2000 streams flush 2000 small segments at once).
pub fn write_segment_unsynced(
    path: &Path,
    batch: &EventBatch,
    options: &SegmentOptions,
) -> Result<UnsyncedSegment, StorageError> {
    let mut out = SegmentWriter::create(path.with_extension("tmp"))?;
    out.pace = options.pace.clone();
    let meta = write_image(&mut out, batch, options)?;
    Ok(UnsyncedSegment {
        file: out.close(path)?,
        meta,
    })
}

/// Writes one segment (magic to end marker) at the writer's offset; its block offsets
/// are offsets in the file, so a pack's segments need no translation when read.
fn write_image(
    out: &mut SegmentWriter,
    batch: &EventBatch,
    options: &SegmentOptions,
) -> Result<SegmentMeta, StorageError> {
    debug_assert!(batch.is_sorted());
    let ranges = block_ranges(batch, options);
    let start = out.offset;
    out.write(MAGIC)?;
    let mut blocks = Vec::with_capacity(ranges.len());
    // A few blocks per encoding thread at a time, written before the next are encoded: the
    // compressed image of a whole memtable held at once was the peak of a flush.
    let wave = ENCODE_WAVE_PER_THREAD * options.encode_threads.max(1);
    for ranges in ranges.chunks(wave) {
        for block in encode_blocks(batch, ranges, options)? {
            let block_offset = out.offset;
            let mut chunks = Vec::with_capacity(block.chunks.len());
            for chunk in &block.chunks {
                out.write(chunk)?;
                let len = u32::try_from(chunk.len())
                    .map_err(|_| StorageError::Encode("a chunk over 4 GiB".into()))?;
                chunks.push((len, crc32c::crc32c(chunk)));
            }
            blocks.push(BlockMeta {
                offset: block_offset,
                has_tend: block.has_tend,
                positions: block.positions,
                chunks,
                summary: block.summary,
            });
        }
    }
    let group_size = options.group_size.max(1);
    let groups = group_summaries(&blocks, group_size);
    let mut meta = SegmentMeta {
        schema: batch.schema().clone(),
        blocks,
        group_size,
        groups,
        bytes: 0,
    };
    // The footer's shape, asserted where it is made: a group summary for every
    // `group_size` blocks (which reading it back checks too), blocks in file order, and
    // every event of the batch in exactly one block (which summaries answer for).
    assert_eq!(
        meta.groups.len(),
        meta.blocks.len().div_ceil(group_size),
        "group summaries of a segment footer"
    );
    assert!(
        meta.blocks.windows(2).all(|w| w[0].offset < w[1].offset),
        "blocks of a segment out of file order"
    );
    assert_eq!(
        meta.blocks.iter().map(|b| b.summary.count).sum::<u64>(),
        batch.len() as u64,
        "events of a segment's blocks"
    );
    assert!(
        meta.blocks.iter().all(|b| b
            .positions
            .is_none_or(|(least, greatest)| least <= greatest)),
        "a block's position range reversed"
    );
    let footer = encode_footer(&meta)?;
    out.write(&footer)?;
    out.write(&(footer.len() as u32).to_le_bytes())?;
    out.write(&crc32c::crc32c(&footer).to_le_bytes())?;
    out.write(END_MAGIC)?;
    meta.bytes = out.offset - start;
    Ok(meta)
}

/// A file written under its temporary name, not yet durable; dropped unfinished, it is
/// deleted.
pub struct UnsyncedFile {
    file: File,
    tmp: TempPath,
    path: PathBuf,
}

impl UnsyncedFile {
    /// Where [`UnsyncedFile::finish`] puts the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Fsyncs the file and renames it into place. The caller fsyncs the directory.
    pub fn finish(self) -> Result<(), StorageError> {
        self.file
            .sync_all()
            .map_err(|e| StorageError::io("fsync", self.tmp.path(), e))?;
        self.tmp.rename_to(&self.path)
    }
}

/// A segment written to a file of its own, not yet durable (see [`UnsyncedFile`]).
pub struct UnsyncedSegment {
    pub file: UnsyncedFile,
    pub meta: SegmentMeta,
}

impl UnsyncedSegment {
    /// Fsyncs the file and renames it into place. The caller fsyncs the directory.
    pub fn finish(self) -> Result<SegmentMeta, StorageError> {
        self.file.finish()?;
        Ok(self.meta)
    }
}

/// Writes several segments one after another into one file, a *pack*: each is a whole
/// segment image (magic to end marker) at the range [`PackWriter::append`] returns, read
/// back with [`SegmentMeta::read`]. Small segments share a pack so that a flush of
/// thousands of streams creates a few files instead of thousands (on ext4, creating files
/// next to recently deleted ones was half of such a flush's time).
pub struct PackWriter {
    out: SegmentWriter,
    path: PathBuf,
}

impl PackWriter {
    /// Starts a pack that [`PackWriter::close`] will put at `path`.
    pub fn create(path: &Path) -> Result<PackWriter, StorageError> {
        Ok(PackWriter {
            out: SegmentWriter::create(path.with_extension("tmp"))?,
            path: path.to_path_buf(),
        })
    }

    /// Appends one segment; returns where it is in the pack and its footer.
    pub fn append(
        &mut self,
        batch: &EventBatch,
        options: &SegmentOptions,
    ) -> Result<(Range<u64>, SegmentMeta), StorageError> {
        let start = self.out.offset;
        self.out.pace = options.pace.clone();
        let meta = write_image(&mut self.out, batch, options)?;
        Ok((start..self.out.offset, meta))
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.out.offset
    }

    /// Ends the pack: every appended segment is in the returned file, to be finished.
    pub fn close(self) -> Result<UnsyncedFile, StorageError> {
        self.out.close(&self.path)
    }
}

/// Bytes a segment writer hands to the kernel between two requests to start their
/// writeback ([`start_writeback`]), and the step its pace ([`WritePace`]) spaces: large
/// enough to be one efficient write, small enough that a segment reaches the disk as a
/// trickle of them (a log fsync behind one waits for a millisecond or two of writing).
const WRITEBACK_STEP: u64 = 1 << 20;

/// Appends to a new file through a buffer, counting its offset, starting the writeback
/// of every [`WRITEBACK_STEP`] bytes as they pass and keeping its pace.
struct SegmentWriter {
    out: BufWriter<File>,
    tmp: TempPath,
    offset: u64,
    written_back: u64,
    pace: Option<Arc<WritePace>>,
}

impl SegmentWriter {
    fn create(tmp: PathBuf) -> Result<SegmentWriter, StorageError> {
        let tmp = TempPath::new(tmp);
        let file =
            File::create(tmp.path()).map_err(|e| StorageError::io("create", tmp.path(), e))?;
        Ok(SegmentWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            tmp,
            offset: 0,
            written_back: 0,
            pace: None,
        })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), StorageError> {
        self.out
            .write_all(bytes)
            .map_err(|e| StorageError::io("write", self.tmp.path(), e))?;
        self.offset += bytes.len() as u64;
        if self.offset - self.written_back >= WRITEBACK_STEP {
            self.out
                .flush()
                .map_err(|e| StorageError::io("write", self.tmp.path(), e))?;
            let step = self.offset - self.written_back;
            start_writeback(self.out.get_ref(), self.written_back, step);
            self.written_back = self.offset;
            if let Some(pace) = &self.pace {
                pace.wrote(step);
            }
        }
        Ok(())
    }

    /// Flushes the buffer and starts the writeback of the rest of the file, to be put at
    /// `path` when finished.
    fn close(self, path: &Path) -> Result<UnsyncedFile, StorageError> {
        let tmp = self.tmp;
        let file = self
            .out
            .into_inner()
            .map_err(|e| StorageError::io("write", tmp.path(), e.into_error()))?;
        start_writeback(&file, self.written_back, 0);
        if let Some(pace) = &self.pace {
            pace.wrote(self.offset - self.written_back);
        }
        Ok(UnsyncedFile {
            file,
            tmp,
            path: path.to_path_buf(),
        })
    }
}

/// Blocks each encoding thread compresses before they are written: enough to keep the
/// threads busy, few enough that memory holds a handful of compressed blocks, not a segment.
const ENCODE_WAVE_PER_THREAD: usize = 4;

/// One block, compressed: its chunks in file order and its summary.
struct EncodedBlock {
    chunks: Vec<Vec<u8>>,
    has_tend: bool,
    positions: Option<(u64, u64)>,
    summary: BatchSummary,
}

fn encode_block(
    batch: &EventBatch,
    rows: Range<usize>,
    level: usize,
) -> Result<EncodedBlock, StorageError> {
    let mut builder = BatchBuilder::with_capacities(batch.schema().clone(), rows.len(), |i| {
        batch.column(i).value_range(rows.clone()).len()
    });
    builder
        .extend_from(batch, rows)
        .map_err(|e| StorageError::Encode(e.to_string()))?;
    let block = builder.finish();
    let summary = BatchSummary::of(&block, Bounds::Kept)
        .ok_or_else(|| StorageError::Encode("an empty block".into()))?;
    let mut chunks = Vec::with_capacity(block.columns().len() + 2);
    let mut chunk = Vec::new();
    encode_timestamps(block.tstart(), level, &mut chunk)?;
    chunks.push(std::mem::take(&mut chunk));
    for extra in block.tend().into_iter().chain(block.positions()) {
        encode_column(extra, level, &mut chunk)?;
        chunks.push(std::mem::take(&mut chunk));
    }
    for column in block.columns() {
        encode_column(column, level, &mut chunk)?;
        chunks.push(std::mem::take(&mut chunk));
    }
    Ok(EncodedBlock {
        chunks,
        has_tend: block.tend().is_some(),
        positions: position_range(&block),
        summary,
    })
}

/// Compresses the blocks on `options.encode_threads` threads (blocks are independent);
/// returns them in order.
fn encode_blocks(
    batch: &EventBatch,
    ranges: &[Range<usize>],
    options: &SegmentOptions,
) -> Result<Vec<EncodedBlock>, StorageError> {
    let threads = options.encode_threads.clamp(1, ranges.len().max(1));
    let level = options.pco_level;
    if threads == 1 {
        return ranges
            .iter()
            .map(|r| encode_block(batch, r.clone(), level))
            .collect();
    }
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<EncodedBlock, StorageError>>>> =
        ranges.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(rows) = ranges.get(i) else { break };
                let encoded = encode_block(batch, rows.clone(), level);
                *slots[i].lock().ignore_poison() = Some(encoded);
            });
        }
    });
    slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .ignore_poison()
                .unwrap_or_else(|| Err(StorageError::Encode("a block was not encoded".into())))
        })
        .collect()
}

/// Row ranges of the blocks of a sorted batch.
pub fn block_ranges(batch: &EventBatch, options: &SegmentOptions) -> Vec<std::ops::Range<usize>> {
    // A row's bytes are those of the values it holds (a string at its length plus an
    // offset, any other value at 8 bytes): a null costs nothing here, so the rows of a
    // sparse, wide stream make blocks as long as a dense stream's. (Counting 8 bytes for
    // every field cut a 1,000-field stream into blocks of 512 events, and every block keeps
    // a chunk and a summary per field in the footer, in memory while the segment lives.)
    let sparse = |c: &&Column| {
        c.validity().is_some() || matches!(c.data(), ColumnData::String(_) | ColumnData::Bytes(_))
    };
    let dense = batch.columns().iter().filter(|c| !sparse(c)).count();
    let fixed = 8 * (1 + dense + usize::from(batch.tend().is_some()));
    let mut row_bytes = vec![fixed; batch.len()];
    for column in batch.columns().iter().filter(sparse) {
        let valid = column.valid_rows(0..batch.len());
        match column.data() {
            ColumnData::String(v) | ColumnData::Bytes(v) => {
                for (row, len) in valid.zip(v.lengths()) {
                    row_bytes[row] += 8 + len as usize;
                }
            }
            _ => valid.for_each(|row| row_bytes[row] += 8),
        }
    }
    ranges_of(batch.tstart(), |row| row_bytes[row], options)
}

/// Cuts at `max_block_events`, after `max_block_bytes`, and where an event crosses an
/// alignment boundary (once the block has `min_block_events`).
fn ranges_of(
    tstart: &[i64],
    row_bytes: impl Fn(usize) -> usize,
    options: &SegmentOptions,
) -> Vec<std::ops::Range<usize>> {
    let max = options.max_block_events.clamp(1, MAX_BLOCK_EVENTS);
    let align = options.block_align_ns;
    // The first instant of the alignment period after the one the block started in.
    let next_boundary = |ts: i64| match align {
        a if a > 0 => (ts.div_euclid(a) + 1).saturating_mul(a),
        _ => i64::MAX,
    };
    let mut ranges = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    let mut boundary = tstart.first().map_or(i64::MAX, |&t| next_boundary(t));
    for i in 1..=tstart.len() {
        let len = i - start;
        bytes += row_bytes(i - 1);
        let cut = i == tstart.len()
            || len >= max
            || bytes >= options.max_block_bytes
            || (tstart[i] >= boundary && len >= options.min_block_events);
        if cut {
            ranges.push(start..i);
            start = i;
            bytes = 0;
            if let Some(&t) = tstart.get(i) {
                boundary = next_boundary(t);
            }
        }
    }
    ranges
}

fn group_summaries(blocks: &[BlockMeta], group_size: usize) -> Vec<BatchSummary> {
    blocks
        .chunks(group_size)
        .map(|group| {
            let mut summary = group[0].summary.clone();
            for block in &group[1..] {
                summary.merge(&block.summary);
            }
            summary
        })
        .collect()
}

fn encode_footer(meta: &SegmentMeta) -> Result<Vec<u8>, StorageError> {
    let body = encode_footer_body(meta)?;
    if body.len() > MAX_FOOTER_BODY {
        return Err(StorageError::Encode(format!(
            "a segment footer of {} bytes (at most {MAX_FOOTER_BODY})",
            body.len()
        )));
    }
    let mut out = Vec::with_capacity(8 + body.len() / 4);
    put_u32(&mut out, VERSION);
    put_u32(&mut out, body.len() as u32);
    let mut deflater = flate2::write::DeflateEncoder::new(out, flate2::Compression::default());
    let deflate = |e: std::io::Error| StorageError::Encode(format!("deflating the footer: {e}"));
    deflater.write_all(&body).map_err(deflate)?;
    deflater.finish().map_err(deflate)
}

fn encode_footer_body(meta: &SegmentMeta) -> Result<Vec<u8>, StorageError> {
    encode_footer_body_of(meta, VERSION)
}

/// The footer body as `version` wrote it (the bounds of STRING and BYTES values since
/// version 5): tests make older segments so.
fn encode_footer_body_of(meta: &SegmentMeta, version: u32) -> Result<Vec<u8>, StorageError> {
    let bounds = version >= VERSION;
    let mut out = Vec::new();
    let schema = serde_json::to_vec(meta.schema.as_ref())
        .map_err(|e| StorageError::Encode(e.to_string()))?;
    put_bytes(&mut out, &schema)?;
    put_u32(&mut out, meta.blocks.len() as u32);
    for block in &meta.blocks {
        put_u64(&mut out, block.offset);
        let flags = u8::from(block.has_tend) | (u8::from(block.positions.is_some()) << 1);
        put_u8(&mut out, flags);
        if let Some((least, greatest)) = block.positions {
            put_u64(&mut out, least);
            put_u64(&mut out, greatest);
        }
        put_u32(&mut out, block.chunks.len() as u32);
        for &(len, crc) in &block.chunks {
            put_u32(&mut out, len);
            put_u32(&mut out, crc);
        }
        put_summary(&mut out, &block.summary, bounds);
    }
    put_u32(&mut out, meta.group_size as u32);
    put_u32(&mut out, meta.groups.len() as u32);
    for group in &meta.groups {
        put_summary(&mut out, group, bounds);
    }
    Ok(out)
}

/// Decodes the footer of the segment whose magic number and blocks are at `segment` of
/// its file (the footer starts at its end) and which occupies `bytes` in all.
fn decode_footer(
    footer: &[u8],
    segment: Range<u64>,
    bytes: u64,
) -> Result<SegmentMeta, StorageError> {
    let mut r = Reader::new(footer, "segment footer");
    match r.u32()? {
        version @ (VERSION | FOOTER_V4 | FOOTER_V3 | FOOTER_V2) => {
            let body = inflate_footer_body(&mut r)?;
            decode_footer_body(&body, version, segment, bytes)
        }
        FOOTER_V1 => decode_footer_body(r.take(r.remaining())?, FOOTER_V1, segment, bytes),
        version => Err(r.corrupt(format!("unsupported segment version {version}"))),
    }
}

/// The rest of `r`, inflated to exactly the length it declares.
fn inflate_footer_body(r: &mut Reader<'_>) -> Result<Vec<u8>, StorageError> {
    use std::io::Read;
    let len = r.u32()? as usize;
    if len > MAX_FOOTER_BODY {
        return Err(r.corrupt(format!("a footer body of {len} bytes")));
    }
    let compressed = r.take(r.remaining())?;
    // Capacity for a typical ratio; a lying length grows the Vec only as bytes arrive.
    let mut body = Vec::with_capacity(len.min(compressed.len().saturating_mul(16)));
    // One byte past the declared length is enough to tell a lie, and stops a bomb there.
    flate2::read::DeflateDecoder::new(compressed)
        .take(len as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| r.corrupt(format!("footer body does not inflate: {e}")))?;
    if body.len() != len {
        return Err(r.corrupt(format!(
            "footer body inflates to {} bytes, not the {len} declared",
            body.len()
        )));
    }
    Ok(body)
}

fn decode_footer_body(
    footer: &[u8],
    version: u32,
    segment: Range<u64>,
    bytes: u64,
) -> Result<SegmentMeta, StorageError> {
    // Flags a block of this version can have: positions since version 4.
    let known_flags: u8 = if version >= FOOTER_V4 { 0b11 } else { 0b01 };
    let footer_start = segment.end;
    let mut r = Reader::new(footer, "segment footer");
    let schema: Schema =
        serde_json::from_slice(r.bytes()?).map_err(|e| r.corrupt(format!("schema: {e}")))?;
    let fields = schema.len();
    let block_count = r.count(footer.len() / 8, "blocks")?;
    let mut blocks = Vec::with_capacity(block_count);
    let mut expected_offset = segment.start + MAGIC.len() as u64;
    for _ in 0..block_count {
        let offset = r.u64()?;
        let flags = r.u8()?;
        if flags & !known_flags != 0 {
            return Err(r.corrupt(format!(
                "bad block flags {flags} in a version {version} footer"
            )));
        }
        let has_tend = flags & 1 != 0;
        let positions = if flags & 2 != 0 {
            let (least, greatest) = (r.u64()?, r.u64()?);
            if least > greatest || greatest > tidemark_core::MAX_POSITION {
                return Err(r.corrupt(format!("block positions {least}..={greatest}")));
            }
            Some((least, greatest))
        } else {
            None
        };
        let chunk_count = r.count(fields + 3, "chunks")?;
        if chunk_count != 1 + usize::from(has_tend) + usize::from(positions.is_some()) + fields {
            return Err(r.corrupt(format!("{chunk_count} chunks for {fields} fields")));
        }
        let chunks = (0..chunk_count)
            .map(|_| Ok((r.u32()?, r.u32()?)))
            .collect::<Result<Vec<_>, StorageError>>()?;
        let summary = get_summary(&mut r, &schema, version)?;
        let length: u64 = chunks.iter().map(|c| u64::from(c.0)).sum();
        if offset != expected_offset || offset + length > footer_start {
            return Err(r.corrupt(format!(
                "block at {offset} of {length} bytes is out of place"
            )));
        }
        if summary.count == 0 || summary.count as usize > MAX_BLOCK_EVENTS {
            return Err(r.corrupt(format!("block of {} events", summary.count)));
        }
        expected_offset = offset + length;
        blocks.push(BlockMeta {
            offset,
            has_tend,
            positions,
            chunks,
            summary,
        });
    }
    if expected_offset != footer_start {
        return Err(r.corrupt("blocks do not end where the footer starts"));
    }
    let group_size = r.u32()? as usize;
    let group_count = r.count(block_count, "groups")?;
    if group_size == 0 || group_count != block_count.div_ceil(group_size) {
        return Err(r.corrupt(format!(
            "{group_count} groups of {group_size} for {block_count} blocks"
        )));
    }
    let groups = (0..group_count)
        .map(|_| get_summary(&mut r, &schema, version))
        .collect::<Result<Vec<_>, _>>()?;
    r.finish()?;
    Ok(SegmentMeta {
        schema: Arc::new(schema),
        blocks,
        group_size,
        groups,
        bytes,
    })
}

fn put_summary(out: &mut Vec<u8>, s: &BatchSummary, bounds: bool) {
    put_u64(out, s.count);
    put_i64(out, s.min_ts);
    put_i64(out, s.max_ts);
    for f in &s.fields {
        put_u64(out, f.count);
        put_u64(out, f.nulls);
        if let Some(bounds) = f.bytes.as_ref().filter(|_| bounds) {
            put_u8(out, 3);
            for prefix in [&bounds.least, &bounds.greatest] {
                let len = prefix.bytes().len() as u8;
                put_u8(out, len | if prefix.is_cut() { CUT } else { 0 });
                out.extend_from_slice(prefix.bytes());
            }
            continue;
        }
        let Some(n) = &f.num else {
            put_u8(out, 0);
            continue;
        };
        let bits = |v: Num| match v {
            Num::I(i) => i as u64,
            Num::F(f) => f.to_bits(),
        };
        put_u8(out, if matches!(n.min, Num::I(_)) { 1 } else { 2 });
        put_u64(out, bits(n.min));
        put_u64(out, bits(n.max));
        let sum: [u8; 16] = match n.sum {
            Sum::I(v) => v.to_le_bytes(),
            Sum::F(v) => u128::from(v.to_bits()).to_le_bytes(),
        };
        out.extend_from_slice(&sum);
        put_i64(out, n.first.0);
        put_u64(out, bits(n.first.1));
        put_i64(out, n.last.0);
        put_u64(out, bits(n.last.1));
    }
}

/// In a stored prefix's length byte: the value was longer than the prefix.
const CUT: u8 = 0x80;

fn get_prefix(r: &mut Reader) -> Result<Prefix, StorageError> {
    let head = r.u8()?;
    let bytes = r.take(usize::from(head & !CUT))?;
    Prefix::from_parts(bytes, head & CUT != 0)
        .ok_or_else(|| r.corrupt(format!("a value prefix of {} bytes", bytes.len())))
}

fn get_summary(
    r: &mut Reader,
    schema: &Schema,
    version: u32,
) -> Result<BatchSummary, StorageError> {
    let count = r.u64()?;
    let min_ts = r.i64()?;
    let max_ts = r.i64()?;
    if min_ts > max_ts {
        return Err(r.corrupt("summary time range is reversed"));
    }
    let mut out = Vec::with_capacity(schema.len());
    for field in schema.fields() {
        let present = r.u64()?;
        let nulls = r.u64()?;
        let kind = r.u8()?;
        let mut bytes = None;
        let num = match kind {
            0 => None,
            3 if version >= VERSION
                && present > 0
                && matches!(field.ty, FieldType::String | FieldType::Bytes) =>
            {
                let (least, greatest) = (get_prefix(r)?, get_prefix(r)?);
                bytes = Some(
                    BytesBounds::new(least, greatest)
                        .ok_or_else(|| r.corrupt("a field's least value above its greatest"))?,
                );
                None
            }
            1 | 2 => {
                let val = |b: u64| {
                    if kind == 1 {
                        Num::I(b as i64)
                    } else {
                        Num::F(f64::from_bits(b))
                    }
                };
                let min = val(r.u64()?);
                let max = val(r.u64()?);
                let raw = r.i128()?;
                let sum = if kind == 1 {
                    Sum::I(raw)
                } else {
                    Sum::F(f64::from_bits(raw as u64))
                };
                let first = (r.i64()?, val(r.u64()?));
                let last = (r.i64()?, val(r.u64()?));
                Some(NumSummary {
                    min,
                    max,
                    sum,
                    first,
                    last,
                })
            }
            other => return Err(r.corrupt(format!("bad summary kind {other}"))),
        };
        if present.checked_add(nulls) != Some(count) {
            return Err(r.corrupt("field summary counts do not add up"));
        }
        out.push(FieldSummary {
            count: present,
            nulls,
            num,
            bytes,
        });
    }
    Ok(BatchSummary {
        count,
        min_ts,
        max_ts,
        fields: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::{AggFn, FieldType, Value};

    fn batch(n: i64, step: i64) -> EventBatch {
        let schema = Arc::new(Schema::parse_spec("S:STRING,I:INTEGER,F:FLOAT").unwrap());
        let mut b = BatchBuilder::new(schema, n as usize);
        for i in 0..n {
            let tend = (i % 5 == 0).then_some(i * step + 1);
            let price = if i % 7 == 0 {
                Value::Null
            } else {
                Value::Float(i as f32 * 0.5)
            };
            b.push_row(
                i * step,
                tend,
                &[
                    Value::String(format!("s{}", i % 3)),
                    Value::Integer(i as i32),
                    price,
                ],
            )
            .unwrap();
        }
        b.finish()
    }

    #[test]
    fn write_open_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.seg");
        let data = batch(10_000, 100_000_000); // 0.1 s apart: 1000 s in all
        let options = SegmentOptions {
            group_size: 4,
            ..SegmentOptions::default()
        };
        let written = write_segment(&path, &data, &options).unwrap();
        let (file, meta) = SegmentMeta::open(&path).unwrap();
        assert_eq!(meta, written);
        assert_eq!(meta.event_count(), 10_000);
        assert_eq!(meta.bytes, std::fs::metadata(&path).unwrap().len());
        // 600 events a minute: blocks are minute-aligned once they hold the minimum.
        for block in &meta.blocks {
            let minute = |t: i64| t.div_euclid(60_000_000_000);
            assert!(block.count() >= 1024 || block.summary.max_ts == data.tstart()[9_999]);
            assert!(minute(block.summary.max_ts) - minute(block.summary.min_ts) <= 2);
        }
        let mut row = 0;
        for i in 0..meta.blocks.len() {
            let b = meta.read_block(&file, i, &[2, 0], true).unwrap();
            for r in 0..b.len() {
                assert_eq!(b.tstart()[r], data.tstart()[row]);
                assert_eq!(b.tend_at(r), data.tend_at(row));
                assert_eq!(
                    b.row(r),
                    vec![data.column(2).value(row), data.column(0).value(row)]
                );
                row += 1;
            }
        }
        assert_eq!(row, 10_000);
        let mut total = meta.groups[0].clone();
        for g in &meta.groups[1..] {
            total.merge(g);
        }
        assert_eq!(total, BatchSummary::of(&data, Bounds::Kept).unwrap());
        assert_eq!(
            total.fields[2].eval(AggFn::Max, FieldType::Float),
            Value::Float(4999.5)
        );
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.seg");
        let data = batch(300, 1_000);
        let options = SegmentOptions {
            max_block_events: 100,
            ..SegmentOptions::default()
        };
        write_segment(&path, &data, &options).unwrap();
        let good = std::fs::read(&path).unwrap();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            let outcome = SegmentMeta::open(&path).and_then(|(file, meta)| {
                (0..meta.blocks.len())
                    .map(|b| meta.read_block(&file, b, &[0, 1, 2], true))
                    .collect::<Result<Vec<_>, _>>()
            });
            assert!(
                outcome.is_err(),
                "flip at byte {i} of {} went unnoticed",
                good.len()
            );
        }
    }

    #[test]
    fn a_stub_holds_the_footer_of_a_segment_at_any_offset_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.pack");
        let options = SegmentOptions {
            max_block_events: 100,
            ..SegmentOptions::default()
        };
        let lone = dir.path().join("lone.seg");
        write_segment(&lone, &batch(300, 1_000), &options).unwrap();
        let segment = std::fs::read(&lone).unwrap();
        // The same segment as the second of a pack: its footer's offsets count from there.
        let mut pack = PackWriter::create(&path).unwrap();
        pack.append(&batch(50, 7), &options).unwrap();
        let (range, meta) = pack.append(&batch(300, 1_000), &options).unwrap();
        pack.close().unwrap().finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let origin = range.start;
        let in_pack = &bytes[range.start as usize..range.end as usize];

        let stub = SegmentStub::of(in_pack, origin).unwrap();
        assert!(stub.bytes().len() < in_pack.len(), "only the footer");
        let reread = SegmentStub::from_bytes(stub.bytes().to_vec(), origin, meta.bytes).unwrap();
        assert_eq!(
            SegmentMeta::read(&reread, &path, reread.range()).unwrap(),
            meta
        );
        // A block is not in the stub: an error, never zeros.
        let error = meta.read_block(&reread, 0, &[0], false).unwrap_err();
        assert!(error.to_string().contains("not in the stub"), "{error}");
        // Its footer, read from a stub, names the blocks where the pack has them.
        let file = File::open(&path).unwrap();
        let from_pack = meta.read_block(&file, 2, &[0, 1, 2], true).unwrap();
        assert_eq!(from_pack.len(), 100);

        assert!(SegmentStub::of(&segment[..segment.len() - 3], 0).is_err());
        assert!(SegmentStub::of(b"TMSEG001", 0).is_err());
        assert!(SegmentStub::from_bytes(vec![0; 10], 0, 5).is_err());
        let tail = &in_pack[in_pack.len() - TAIL..];
        let span = SegmentStub::footer_span(tail, meta.bytes).unwrap();
        assert_eq!(span as usize, stub.bytes().len() - MAGIC.len());
        let mut huge = tail.to_vec();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            SegmentStub::footer_span(&huge, u64::MAX).is_err(),
            "over the footer limit"
        );
        let mut damaged = stub.bytes().to_vec();
        damaged[12] ^= 1;
        let damaged = SegmentStub::from_bytes(damaged, origin, meta.bytes).unwrap();
        assert!(SegmentMeta::read(&damaged, &path, damaged.range()).is_err());
    }

    /// `file` with its footer replaced by `footer` (tail and checksum made to match).
    fn with_footer(file: &[u8], footer: &[u8]) -> Vec<u8> {
        let old_len =
            u32::from_le_bytes(file[file.len() - 16..file.len() - 12].try_into().unwrap());
        let mut out = file[..file.len() - TAIL - old_len as usize].to_vec();
        out.extend_from_slice(footer);
        out.extend_from_slice(&(footer.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(footer).to_le_bytes());
        out.extend_from_slice(END_MAGIC);
        out
    }

    /// `meta` as a footer older than version 5 holds it: no bounds of STRING and BYTES
    /// values.
    fn without_bytes_bounds(mut meta: SegmentMeta) -> SegmentMeta {
        let summaries = meta.blocks.iter_mut().map(|b| &mut b.summary);
        for summary in summaries.chain(meta.groups.iter_mut()) {
            for field in &mut summary.fields {
                field.bytes = None;
            }
        }
        meta
    }

    /// A footer's bytes: `version`, then `body` deflated.
    fn deflated_footer(version: u32, body: &[u8]) -> Vec<u8> {
        let mut footer = Vec::new();
        put_u32(&mut footer, version);
        put_u32(&mut footer, body.len() as u32);
        let mut deflater =
            flate2::write::DeflateEncoder::new(footer, flate2::Compression::default());
        deflater.write_all(body).unwrap();
        deflater.finish().unwrap()
    }

    /// Version 5 keeps the bounds of a STRING field's values per block and group; a
    /// version-4 segment (none) is still read, and a version-4 footer that holds bounds is
    /// refused as damaged.
    #[test]
    fn string_bounds_are_kept_and_version_4_footers_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.seg");
        let written = three_blocks_in_two_groups(&path);
        let (_, meta) = SegmentMeta::open(&path).unwrap();
        assert_eq!(meta, written);
        // Field S holds s0, s1, s2 in every block.
        let bounds = meta.blocks[1].summary.fields[0].bytes.unwrap();
        assert_eq!(
            (bounds.least.bytes(), bounds.greatest.bytes()),
            (&b"s0"[..], &b"s2"[..])
        );
        assert!(bounds.excludes(b"aapl") && !bounds.excludes(b"s1"));
        assert_eq!(meta.groups[0].fields[0].bytes, Some(bounds));
        assert_eq!(
            meta.blocks[0].summary.fields[1].bytes, None,
            "an INTEGER has none"
        );

        let good = std::fs::read(&path).unwrap();
        let v4 = deflated_footer(
            FOOTER_V4,
            &encode_footer_body_of(&written, FOOTER_V4).unwrap(),
        );
        std::fs::write(&path, with_footer(&good, &v4)).unwrap();
        let (file, old) = SegmentMeta::open(&path).unwrap();
        let expected = without_bytes_bounds(written.clone());
        assert_eq!(
            (&old.blocks, &old.groups),
            (&expected.blocks, &expected.groups)
        );
        let block = old.read_block(&file, 2, &[0, 1, 2], true).unwrap();
        assert_eq!(block.tstart()[0], 2_000 * 1_000_000);

        let lying = deflated_footer(FOOTER_V4, &encode_footer_body(&written).unwrap());
        std::fs::write(&path, with_footer(&good, &lying)).unwrap();
        let error = SegmentMeta::open(&path).unwrap_err();
        assert!(error.to_string().contains("summary kind 3"), "{error}");
    }

    /// A segment at `path` of 3,000 events a millisecond apart in blocks of 1,000, groups of 2.
    fn three_blocks_in_two_groups(path: &Path) -> SegmentMeta {
        let options = SegmentOptions {
            max_block_events: 1_000,
            group_size: 2,
            ..SegmentOptions::default()
        };
        write_segment(path, &batch(3_000, 1_000_000), &options).unwrap()
    }

    #[test]
    fn version_1_footers_are_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.seg");
        let written = three_blocks_in_two_groups(&path);
        let mut v1 = Vec::new();
        put_u32(&mut v1, FOOTER_V1);
        v1.extend_from_slice(&encode_footer_body_of(&written, FOOTER_V1).unwrap());
        let file = with_footer(&std::fs::read(&path).unwrap(), &v1);
        std::fs::write(&path, &file).unwrap();
        let (file, meta) = SegmentMeta::open(&path).unwrap();
        let written = without_bytes_bounds(written);
        assert_eq!(meta.blocks, written.blocks);
        assert_eq!(meta.groups, written.groups);
        assert_eq!(meta.bytes, file.metadata().unwrap().len());
        let block = meta.read_block(&file, 2, &[0, 1, 2], true).unwrap();
        assert_eq!(block.tstart()[0], 2_000 * 1_000_000);
    }

    #[test]
    fn positions_are_kept_per_event_and_ranged_per_block() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.seg");
        // Appended out of time order: sorted, the positions are no longer in row order.
        let appended = batch(3_000, 1_000_000).take(&(0..3_000u32).rev().collect::<Vec<_>>());
        let data = appended.with_positions_from(10_000).sorted();
        let options = SegmentOptions {
            max_block_events: 1_000,
            ..SegmentOptions::default()
        };
        let meta = write_segment(&path, &data, &options).unwrap();
        let file = File::open(&path).unwrap();
        let with = Extras {
            tend: true,
            positions: true,
        };
        for (i, block) in meta.blocks.iter().enumerate() {
            let read = meta
                .read_block_with(&file, i, &meta.schema, &[0, 1, 2], with)
                .unwrap();
            let rows = i * 1_000..(i + 1) * 1_000;
            let want: Vec<_> = rows.clone().map(|r| data.position_at(r)).collect();
            let got: Vec<_> = (0..read.len()).map(|r| read.position_at(r)).collect();
            assert_eq!(got, want, "block {i}");
            let least = want.iter().flatten().min().copied().unwrap();
            let greatest = want.iter().flatten().max().copied().unwrap();
            assert_eq!(block.positions, Some((least, greatest)));
            // Asked for without positions, a block reads as it did before they existed.
            let plain = meta.read_block(&file, i, &[0, 1, 2], true).unwrap();
            assert_eq!(plain, read.clone().without_positions());
        }
        let (_, reopened) = SegmentMeta::open(&path).unwrap();
        assert_eq!(reopened.blocks, meta.blocks);

        // A footer whose range does not hold the block's positions is caught on read.
        let mut lying = meta.clone();
        lying.blocks[1].positions = Some((0, 5));
        let body = encode_footer_body(&lying).unwrap();
        let good = std::fs::read(&path).unwrap();
        std::fs::write(&path, with_footer(&good, &deflated_footer(VERSION, &body))).unwrap();
        let (file, lied) = SegmentMeta::open(&path).unwrap();
        let error = lied
            .read_block_with(&file, 1, &lied.schema, &[0], with)
            .unwrap_err();
        assert!(matches!(error, StorageError::Corrupt { .. }), "{error}");

        // A version 3 footer cannot have positions: the flag is refused there.
        std::fs::write(
            &path,
            with_footer(&good, &deflated_footer(FOOTER_V3, &body)),
        )
        .unwrap();
        let error = SegmentMeta::open(&path).unwrap_err();
        assert!(error.to_string().contains("flags"), "{error}");
    }

    #[test]
    fn a_footer_that_lies_about_its_length_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.seg");
        let written = write_segment(&path, &batch(500, 1_000), &SegmentOptions::default()).unwrap();
        let good = std::fs::read(&path).unwrap();
        let body = encode_footer_body(&written).unwrap();
        for declared in [body.len() - 1, body.len() + 1, MAX_FOOTER_BODY + 1] {
            let mut footer = Vec::new();
            put_u32(&mut footer, VERSION);
            put_u32(&mut footer, declared as u32);
            let mut deflater =
                flate2::write::DeflateEncoder::new(footer, flate2::Compression::default());
            deflater.write_all(&body).unwrap();
            std::fs::write(&path, with_footer(&good, &deflater.finish().unwrap())).unwrap();
            let error = SegmentMeta::open(&path).unwrap_err();
            assert!(matches!(error, StorageError::Corrupt { .. }), "{error}");
        }
        // Bytes that are not deflate at all.
        let mut footer = Vec::new();
        put_u32(&mut footer, VERSION);
        put_u32(&mut footer, 100);
        footer.extend_from_slice(&[0xff; 40]);
        std::fs::write(&path, with_footer(&good, &footer)).unwrap();
        assert!(SegmentMeta::open(&path).is_err());
    }

    #[test]
    fn a_wide_small_segments_footer_is_compressed() {
        // 365 float fields, 150 events: the shape of one host's flush in W2.
        let fields = (0..365)
            .map(|j| format!("series_{j}:DOUBLE"))
            .collect::<Vec<_>>();
        let schema = Arc::new(Schema::parse_spec(&fields.join(",")).unwrap());
        let mut b = BatchBuilder::new(schema, 150);
        for i in 0..150i64 {
            let row: Vec<Value> = (0..365).map(|j| Value::Double((i * j) as f64)).collect();
            b.push_row(i * 1_000_000_000, None, &row).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.seg");
        let written = write_segment(&path, &b.finish(), &SegmentOptions::default()).unwrap();
        let body = encode_footer_body(&written).unwrap().len();
        let footer = encode_footer(&written).unwrap().len();
        assert!(footer * 4 < body, "footer {footer} bytes, body {body}");
        assert_eq!(SegmentMeta::open(&path).unwrap().1, written);
    }

    #[test]
    fn parallel_encoding_writes_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let data = batch(5_000, 7_000_000);
        let mut files = Vec::new();
        for threads in [1, 3] {
            let options = SegmentOptions {
                max_block_events: 300,
                encode_threads: threads,
                ..SegmentOptions::default()
            };
            let path = dir.path().join(format!("{threads}.seg"));
            write_segment(&path, &data, &options).unwrap();
            files.push(std::fs::read(&path).unwrap());
        }
        assert_eq!(files[0], files[1]);
    }

    #[test]
    fn block_cuts() {
        let opts = SegmentOptions {
            max_block_events: 4,
            min_block_events: 2,
            block_align_ns: 10,
            ..SegmentOptions::default()
        };
        let ts = [0, 1, 2, 3, 4, 5, 11, 12, 13, 25, 31];
        assert_eq!(ranges_of(&ts, |_| 8, &opts), vec![0..4, 4..6, 6..9, 9..11]);
        assert!(ranges_of(&[], |_| 8, &opts).is_empty());
        // Wide rows: cut after the byte budget, whatever the count and the alignment.
        let wide = SegmentOptions {
            max_block_bytes: 100,
            ..opts
        };
        let sizes = [60, 60, 10, 95, 10, 200, 1, 1, 1, 1, 1];
        assert_eq!(
            ranges_of(&ts, |row| sizes[row], &wide),
            vec![0..2, 2..4, 4..6, 6..9, 9..11]
        );
    }

    /// A segment of several writeback steps reads back whole once finished; before that
    /// only its temporary file exists, and dropping it unfinished leaves no file at all.
    #[test]
    fn unsynced_segments_appear_only_when_finished() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::parse_spec("PAYLOAD:BYTES").unwrap());
        let mut b = BatchBuilder::new(schema, 300);
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        for i in 0..300 {
            // Incompressible, so the file spans more than two writeback steps.
            let payload: Vec<u8> = (0..64 << 10)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng as u8
                })
                .collect();
            b.push_row(i, None, &[Value::Bytes(payload)]).unwrap();
        }
        let data = b.finish();
        let options = SegmentOptions::default();
        let names = |dir: &Path| {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };

        let path = dir.path().join("1.seg");
        let unsynced = write_segment_unsynced(&path, &data, &options).unwrap();
        assert_eq!(names(dir.path()), ["1.tmp"]);
        assert_eq!(unsynced.file.path(), path);
        let written = unsynced.finish().unwrap();
        assert_eq!(names(dir.path()), ["1.seg"]);
        assert!(written.bytes > 2 * WRITEBACK_STEP, "{}", written.bytes);
        let (file, meta) = SegmentMeta::open(&path).unwrap();
        assert_eq!(meta, written);
        let mut row = 0;
        for i in 0..meta.blocks.len() {
            let block = meta.read_block(&file, i, &[0], false).unwrap();
            for r in 0..block.len() {
                assert_eq!(block.row(r), data.row(row));
                row += 1;
            }
        }
        assert_eq!(row, 300);

        drop(write_segment_unsynced(&dir.path().join("2.seg"), &data, &options).unwrap());
        assert_eq!(names(dir.path()), ["1.seg"]);
    }

    #[test]
    fn a_pack_holds_segments_that_read_back_by_their_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7.pack");
        let options = SegmentOptions {
            group_size: 2,
            ..SegmentOptions::default()
        };
        let batches = [batch(3, 1_000), batch(5_000, 100_000_000), batch(1, 7)];
        let mut pack = PackWriter::create(&path).unwrap();
        let written: Vec<_> = batches
            .iter()
            .map(|b| pack.append(b, &options).unwrap())
            .collect();
        assert_eq!(pack.bytes(), written[2].0.end);
        let unsynced = pack.close().unwrap();
        assert!(!path.exists(), "only the temporary file until finished");
        unsynced.finish().unwrap();

        let file = File::open(&path).unwrap();
        assert_eq!(file.metadata().unwrap().len(), written[2].0.end);
        for ((range, meta), data) in written.iter().zip(&batches) {
            assert_eq!(written[0].0.start, 0);
            assert_eq!(meta.bytes, range.end - range.start);
            assert_eq!(
                &SegmentMeta::read(&file, &path, range.clone()).unwrap(),
                meta
            );
            let mut row = 0;
            for i in 0..meta.blocks.len() {
                let b = meta.read_block(&file, i, &[0, 1, 2], true).unwrap();
                for r in 0..b.len() {
                    assert_eq!(b.row(r), data.row(row));
                    row += 1;
                }
            }
            assert_eq!(row, data.len());
        }
        // Ranges that are not exactly one segment are refused, not misread.
        let (first, second) = (&written[0].0, &written[1].0);
        for wrong in [
            first.start..second.end,
            first.start + 1..first.end,
            first.start..first.end - 1,
            second.start - 8..second.end,
            0..0,
        ] {
            assert!(
                SegmentMeta::read(&file, &path, wrong.clone()).is_err(),
                "{wrong:?}"
            );
        }
    }

    #[test]
    fn wide_events_make_small_blocks() {
        let schema = Arc::new(Schema::parse_spec("PAYLOAD:BYTES,N:INTEGER").unwrap());
        let mut b = BatchBuilder::new(schema, 100);
        for i in 0..100 {
            b.push_row(
                i,
                None,
                &[Value::Bytes(vec![b'x'; 1000]), Value::Integer(1)],
            )
            .unwrap();
        }
        let batch = b.finish();
        let opts = SegmentOptions {
            max_block_bytes: 10_000,
            block_align_ns: 0,
            ..SegmentOptions::default()
        };
        // 1000 bytes of payload + 8 × (tstart, PAYLOAD, N) = 1024 bytes a row: 10 rows a block.
        let ranges = block_ranges(&batch, &opts);
        assert_eq!(ranges.len(), 10);
        assert!(ranges.iter().all(|r| r.len() == 10), "{ranges:?}");
    }

    #[test]
    fn sparse_wide_events_make_blocks_as_long_as_dense_ones() {
        // 1,000 fields, each event naming one: 8 bytes of values an event, not 8,000.
        let spec: Vec<String> = (0..1000).map(|i| format!("F{i}:DOUBLE")).collect();
        let schema = Arc::new(Schema::parse_spec(&spec.join(",")).unwrap());
        let n = 20_000;
        let mut b = BatchBuilder::new(schema, n);
        for i in 0..n {
            let mut row = vec![Value::Null; 1000];
            row[i % 1000] = Value::Double(i as f64);
            b.push_row(i as i64, None, &row).unwrap();
        }
        let batch = b.finish();
        let opts = SegmentOptions {
            max_block_bytes: 100_000,
            block_align_ns: 0,
            ..SegmentOptions::default()
        };
        // 16 bytes an event (tstart and its one value): 6,250 events a block.
        let ranges = block_ranges(&batch, &opts);
        assert_eq!(ranges.len(), 4, "{ranges:?}");
        assert_eq!(ranges[0], 0..6250);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Random files, and valid files with random damage or cut short, never panic the
        /// reader and never decode to events that were not written.
        #[test]
        fn damaged_files_never_panic(
            garbage in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
            flips in proptest::collection::vec((proptest::prelude::any::<usize>(), 1u8..=255), 0..3),
            cut in proptest::prelude::any::<usize>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("x.seg");
            std::fs::write(&path, &garbage).unwrap();
            proptest::prop_assert!(SegmentMeta::open(&path).is_err());

            let data = batch(200, 1_000);
            let options = SegmentOptions { max_block_events: 64, ..SegmentOptions::default() };
            write_segment(&path, &data, &options).unwrap();
            let mut bytes = std::fs::read(&path).unwrap();
            for &(at, mask) in &flips {
                let i = at % bytes.len();
                bytes[i] ^= mask;
            }
            if cut % 4 == 0 {
                bytes.truncate(cut % bytes.len());
            }
            std::fs::write(&path, &bytes).unwrap();
            if let Ok((file, meta)) = SegmentMeta::open(&path) {
                for b in 0..meta.blocks.len() {
                    if let Ok(block) = meta.read_block(&file, b, &[0, 1, 2], true) {
                        // Whatever decodes must be exactly what was written.
                        let first = block.tstart()[0] / 1_000;
                        for r in 0..block.len() {
                            let row = (first as usize) + r;
                            proptest::prop_assert_eq!(block.tstart()[r], data.tstart()[row]);
                            proptest::prop_assert_eq!(block.row(r), data.row(row));
                        }
                    }
                }
            }
        }
    }
}

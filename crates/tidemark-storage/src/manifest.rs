//! The manifest: a checkpoint of the database's catalog and of which segment files hold which
//! stream's flushed events. Replaced atomically ([`crate::fsutil::write_atomic`]) after every
//! flush; the log holds every change since.
//!
//! ```text
//! manifest := "TMMANI01", u32 len, u32 CRC32C(body), body (JSON of [`Manifest`])
//! ```
//!
//! JSON keeps the file readable by a person in an emergency; it is small (no per-block data,
//! which lives in segment footers) and written once per flush, not per append.
//!
//! A segment is the file `segments/<id>.seg` unless [`Manifest::packed`] places it in a
//! range of a pack file `segments/<pack>.pack` (see [`crate::segment::PackWriter`]); a pack
//! is live while the manifest places any segment in it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tidemark_core::{Partition, Retention, Schema};

use crate::StorageError;

const MAGIC: &[u8; 8] = b"TMMANI01";

/// A stream's number in its database: assigned when its creation is applied, used to name
/// its state and files, never carried by a command (commands name streams).
pub type StreamId = u32;

/// The log format of data directories this build writes: log frames holding commands of
/// `tidemark_core::command`, the first frame of every write marked
/// ([`crate::log::STARTS_WRITE`]). Format 2 had no marks (a build of format 2 would take a
/// marked frame for a torn one and cut the log there, so it must refuse the directory: it
/// refuses formats above its own); format 1 held the records of [`crate::legacy_record`],
/// and manifests written by those builds carry no `log_format` and read as 1. This build
/// reads all three. Each command carries its own codec version, so commands of a newer
/// version do not change the format of the log (an older build refuses such a command by
/// its version).
pub const LOG_FORMAT: u32 = 3;

fn legacy_log_format() -> u32 {
    1
}
pub const FILE_NAME: &str = "MANIFEST";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// How the log this manifest points into is written ([`LOG_FORMAT`]).
    #[serde(default = "legacy_log_format")]
    pub log_format: u32,
    /// Every log record before this LSN is reflected in this manifest or in the memtable
    /// ranges that [`ManifestStream::replay_from`] points at.
    pub checkpoint_lsn: u64,
    pub next_stream_id: StreamId,
    /// Segment ids and pack ids come from this one counter.
    pub next_segment_id: u64,
    pub streams: Vec<ManifestStream>,
    /// The segments that live in a pack, by segment id. Absent from manifests written
    /// before packs existed, which read as none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub packed: BTreeMap<u64, PackedSegment>,
    /// The idempotent producers' last applied (producer, sequence, part), least recently
    /// seen first, as of `checkpoint_lsn` (an embedded database's; absent: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub producers: Vec<(u64, u64, u32)>,
    /// Positions of logged appends at or after [`Manifest::log_start`] and before
    /// `checkpoint_lsn` that were skipped as producers' retries: replay skips them again
    /// (`producers` is already past their tags, so it cannot tell them apart).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retried: Vec<u64>,
    /// The segments whose bytes live in the tier's bucket, by segment id: only their stub
    /// ([`crate::segment::SegmentStub`], [`stub_path`]) is on local disk. Absent from
    /// manifests written before tiering, which read as none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tiered: BTreeMap<u64, TieredSegment>,
}

/// Where a tiered segment's bytes are: an object holding exactly the segment, uploaded
/// from `origin` of the file it was written to (its block offsets count from there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TieredSegment {
    /// The object's name under the tier's prefix.
    pub object: String,
    pub origin: u64,
    pub len: u64,
    /// CRC32C of the object's bytes, as uploaded.
    pub crc32c: u32,
}

/// Where a segment lives inside a pack file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackedSegment {
    pub pack: u64,
    pub offset: u64,
    pub len: u64,
}

impl PackedSegment {
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset.saturating_add(self.len)
    }
}

/// The file of segment `id` when it has one of its own, in the data directory `dir`.
pub fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join("segments").join(format!("{id:012}.seg"))
}

/// The local stub of tiered segment `id` in the data directory `dir`.
pub fn stub_path(dir: &Path, id: u64) -> PathBuf {
    dir.join("segments").join(format!("{id:012}.stub"))
}

/// The file of pack `id` in the data directory `dir`.
pub fn pack_path(dir: &Path, id: u64) -> PathBuf {
    dir.join("segments").join(format!("{id:012}.pack"))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestStream {
    pub id: StreamId,
    pub name: String,
    pub schema: Schema,
    /// Whether the schema may grow (`tidemark_core::Command::AddFields`). Absent from
    /// manifests written before schemas could grow, which read as strict.
    #[serde(default)]
    pub evolving: bool,
    pub retention: Retention,
    /// The stream's own out-of-order window in nanoseconds (absent: the database's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_order_window_ns: Option<i64>,
    /// The stream's time partitions (no segment written since partitions exist holds
    /// events of two); absent from manifests written before, which read as a day.
    #[serde(default, rename = "partition_ns")]
    pub partition: Partition,
    /// Appends to this stream at or after this LSN are not in its segments and must be
    /// replayed from the log.
    pub replay_from: u64,
    /// The position the first append replayed from `replay_from` gives its first event
    /// (the stream's next position when nothing is to be replayed). Absent from manifests
    /// written before streams had positions, and for a stream that gives none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_position: Option<u64>,
    /// The stream's named consumers and the position each has read to. Absent: none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub consumers: BTreeMap<String, u64>,
    /// Segment ids in the order their events were inserted (oldest first).
    pub segments: Vec<u64>,
}

impl Manifest {
    pub fn empty() -> Manifest {
        Manifest {
            log_format: LOG_FORMAT,
            checkpoint_lsn: 0,
            next_stream_id: 1,
            next_segment_id: 1,
            streams: Vec::new(),
            packed: BTreeMap::new(),
            producers: Vec::new(),
            retried: Vec::new(),
            tiered: BTreeMap::new(),
        }
    }

    /// The file holding segment `id` of the database in `dir`, and its range there when
    /// it shares a pack (`None`: the whole file).
    pub fn segment_location(&self, dir: &Path, id: u64) -> (PathBuf, Option<PackedSegment>) {
        match self.packed.get(&id) {
            Some(packed) => (pack_path(dir, packed.pack), Some(*packed)),
            None => (segment_path(dir, id), None),
        }
    }

    /// Every local file the manifest's segments live in, each once (tiered segments have
    /// only their stubs here, which are not listed).
    pub fn segment_files(&self, dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self
            .streams
            .iter()
            .flat_map(|s| &s.segments)
            .filter(|id| !self.tiered.contains_key(id))
            .map(|&id| self.segment_location(dir, id).0)
            .collect();
        files.sort();
        files.dedup();
        files
    }

    /// Where replay must start: no record before it is needed any more.
    pub fn log_start(&self) -> u64 {
        self.streams
            .iter()
            .map(|s| s.replay_from)
            .fold(self.checkpoint_lsn, u64::min)
    }

    pub fn encode(&self) -> Result<Vec<u8>, StorageError> {
        // Written from a consistent catalog: anything else is a bug, not bad input.
        if let Err(broken) = self.check() {
            debug_assert!(false, "writing a broken manifest: {broken}");
            return Err(StorageError::Encode(format!(
                "the manifest to write is broken: {broken}"
            )));
        }
        let body =
            serde_json::to_vec_pretty(self).map_err(|e| StorageError::Encode(e.to_string()))?;
        let mut out = Vec::with_capacity(body.len() + 16);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Manifest, StorageError> {
        let corrupt = |detail: &str| StorageError::corrupt("manifest", detail);
        if bytes.len() < 16 || &bytes[..8] != MAGIC {
            return Err(corrupt("bad magic number"));
        }
        let len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
        let crc = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        let body = &bytes[16..];
        if body.len() != len {
            return Err(corrupt("length does not match the file"));
        }
        if !crate::checksum_matches(body, crc) {
            return Err(corrupt("checksum mismatch"));
        }
        let manifest: Manifest = serde_json::from_slice(body)
            .map_err(|e| StorageError::corrupt("manifest", e.to_string()))?;
        manifest
            .check()
            .map_err(|detail| StorageError::corrupt("manifest", detail))?;
        Ok(manifest)
    }

    /// What every manifest must hold, checked where one is written (a violation there is a
    /// bug: the assertion in [`Manifest::encode`]) and where one is read (there, damage or a
    /// foreign file: [`StorageError::Corrupt`]). Stream ids and names are unique and below
    /// the next id; segment ids are unique across streams and below the next segment id; a
    /// packed segment is one a stream names, in a pack numbered below the next id; replay
    /// points are not past the checkpoint.
    pub fn check(&self) -> Result<(), String> {
        let mut ids = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        let mut segments = std::collections::HashSet::new();
        for stream in &self.streams {
            if stream.id >= self.next_stream_id || !ids.insert(stream.id) {
                return Err(format!(
                    "stream id {} is repeated or not below the next id {}",
                    stream.id, self.next_stream_id
                ));
            }
            if !names.insert(stream.name.as_str()) {
                return Err(format!("stream {:?} is listed twice", stream.name));
            }
            if stream.replay_from > self.checkpoint_lsn {
                return Err(format!(
                    "stream {:?} replays from {}, after the checkpoint at {}",
                    stream.name, stream.replay_from, self.checkpoint_lsn
                ));
            }
            for &segment in &stream.segments {
                if segment >= self.next_segment_id || !segments.insert(segment) {
                    return Err(format!(
                        "segment {segment} is repeated or not below the next id {}",
                        self.next_segment_id
                    ));
                }
            }
        }
        for (segment, packed) in &self.packed {
            if !segments.contains(segment) || packed.pack >= self.next_segment_id {
                return Err(format!(
                    "packed segment {segment} (pack {}) is named by no stream or its pack is not below the next id",
                    packed.pack
                ));
            }
        }
        for (segment, tiered) in &self.tiered {
            if !segments.contains(segment) || self.packed.contains_key(segment) {
                return Err(format!(
                    "tiered segment {segment} (object {}) is named by no stream or also packed",
                    tiered.object
                ));
            }
        }
        Ok(())
    }

    /// Reads the manifest in `dir`; `None` if there is none yet.
    pub fn load(dir: &Path) -> Result<Option<Manifest>, StorageError> {
        let path = dir.join(FILE_NAME);
        match std::fs::read(&path) {
            Ok(bytes) => Manifest::decode(&bytes).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StorageError::io("read", path, e)),
        }
    }

    pub fn store(&self, dir: &Path) -> Result<(), StorageError> {
        crate::fsutil::write_atomic(&dir.join(FILE_NAME), &self.encode()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let mut m = Manifest::empty();
        m.checkpoint_lsn = 500;
        m.next_stream_id = 2;
        m.next_segment_id = 11;
        m.streams.push(ManifestStream {
            id: 1,
            name: "s".into(),
            schema: Schema::parse_spec("A:LONG").unwrap(),
            evolving: true,
            retention: Retention::default(),
            out_of_order_window_ns: None,
            partition: Partition::DAY,
            replay_from: 300,
            next_position: None,
            consumers: BTreeMap::new(),
            segments: vec![4, 9, 10],
        });
        assert_eq!(m.log_start(), 300);
        let old_format = m.encode().unwrap();
        m.packed.insert(
            9,
            PackedSegment {
                pack: 8,
                offset: 0,
                len: 100,
            },
        );
        m.packed.insert(
            10,
            PackedSegment {
                pack: 8,
                offset: 100,
                len: 50,
            },
        );
        let d = Path::new("d");
        assert_eq!(
            m.segment_files(d),
            [segment_path(d, 4), pack_path(d, 8)],
            "a pack is listed once"
        );
        assert_eq!(
            m.segment_location(d, 10).1.map(|p| p.range()),
            Some(100..150)
        );
        let mut without_packs = m.clone();
        without_packs.packed.clear();
        assert_eq!(Manifest::decode(&old_format).unwrap(), without_packs);
        let bytes = m.encode().unwrap();
        assert_eq!(Manifest::decode(&bytes).unwrap(), m);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(Manifest::decode(&bad).is_err(), "flip at {i}");
        }
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), None);
        m.store(dir.path()).unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), Some(m));
    }

    #[test]
    fn a_stream_without_a_partition_has_a_day() {
        let stream = ManifestStream {
            id: 1,
            name: "s".into(),
            schema: Schema::parse_spec("A:LONG").unwrap(),
            evolving: false,
            retention: Retention::default(),
            out_of_order_window_ns: None,
            partition: Partition::new(3_600_000_000_000).unwrap(),
            replay_from: 0,
            next_position: None,
            consumers: BTreeMap::new(),
            segments: vec![],
        };
        let mut json = serde_json::to_value(&stream).unwrap();
        assert_eq!(json["partition_ns"], 3_600_000_000_000i64);
        assert_eq!(
            serde_json::from_value::<ManifestStream>(json.clone()).unwrap(),
            stream
        );
        json.as_object_mut().unwrap().remove("partition_ns");
        let old: ManifestStream = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(old.partition, Partition::DAY);
        json["partition_ns"] = 5.into();
        assert!(serde_json::from_value::<ManifestStream>(json).is_err());
    }

    #[test]
    fn a_manifest_that_breaks_its_invariants_is_refused_when_read() {
        let mut m = Manifest::empty();
        m.checkpoint_lsn = 10;
        m.next_stream_id = 3;
        m.next_segment_id = 5;
        let stream = |id, name: &str, segments: Vec<u64>| ManifestStream {
            id,
            name: name.into(),
            schema: Schema::parse_spec("A:LONG").unwrap(),
            evolving: true,
            retention: Retention::default(),
            out_of_order_window_ns: None,
            partition: Partition::DAY,
            replay_from: 10,
            next_position: None,
            consumers: BTreeMap::new(),
            segments,
        };
        m.streams = vec![stream(1, "a", vec![1, 2]), stream(2, "b", vec![3])];
        assert_eq!(Manifest::decode(&m.encode().unwrap()).unwrap(), m);
        let broken = [
            {
                let mut b = m.clone();
                b.streams[1].id = 1;
                b
            },
            {
                let mut b = m.clone();
                b.streams[1].name = "a".into();
                b
            },
            {
                let mut b = m.clone();
                b.streams[1].segments = vec![2];
                b
            },
            {
                let mut b = m.clone();
                b.streams[0].segments = vec![9];
                b
            },
            {
                let mut b = m.clone();
                b.streams[0].replay_from = 11;
                b
            },
            {
                let mut b = m.clone();
                b.packed.insert(
                    4,
                    PackedSegment {
                        pack: 4,
                        offset: 0,
                        len: 1,
                    },
                );
                b
            },
        ];
        for b in broken {
            assert!(b.check().is_err(), "{b:?}");
            // Bytes as a damaged or foreign file would carry them: refused on read.
            let body = serde_json::to_vec_pretty(&b).unwrap();
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
            bytes.extend_from_slice(&body);
            assert!(Manifest::decode(&bytes).is_err(), "{b:?}");
        }
    }

    #[test]
    fn a_manifest_without_a_log_format_is_of_format_1() {
        let mut m = Manifest::empty();
        assert_eq!(m.log_format, LOG_FORMAT);
        let mut json: serde_json::Value = serde_json::to_value(&m).unwrap();
        json.as_object_mut().unwrap().remove("log_format");
        let old: Manifest = serde_json::from_value(json).unwrap();
        m.log_format = 1;
        assert_eq!(old, m);
    }
}

//! The physical limit: what this machine's disk does for a plain sequential write with an
//! fsync after every chunk. Every throughput is quoted next to it, measured in the same run.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Writes `total_bytes` to a new file under `dir` in chunks of `chunk_bytes`, calling
/// `fdatasync` after each chunk; returns the elapsed time. The file is removed afterwards.
pub fn sequential_fsync(
    dir: &Path,
    total_bytes: usize,
    chunk_bytes: usize,
) -> std::io::Result<Duration> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("physical-limit.tmp");
    let chunk: Vec<u8> = (0..chunk_bytes.max(1))
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let mut file = File::create(&path)?;
    let started = Instant::now();
    let mut written = 0;
    while written < total_bytes {
        let n = chunk.len().min(total_bytes - written);
        file.write_all(&chunk[..n])?;
        file.sync_data()?;
        written += n;
    }
    let elapsed = started.elapsed();
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(elapsed)
}

/// Writes `total_bytes` to a new file under `dir` (no fsync), then reads it back
/// sequentially in chunks of `chunk_bytes`; returns how long the read took. Just written,
/// the file is read from the page cache: the rate a consumer catching up on recent data
/// can at best reach. The file is removed afterwards.
pub fn sequential_read(
    dir: &Path,
    total_bytes: usize,
    chunk_bytes: usize,
) -> std::io::Result<Duration> {
    use std::io::Read;
    std::fs::create_dir_all(dir)?;
    let path = dir.join("cached-read.tmp");
    let mut chunk: Vec<u8> = (0..chunk_bytes.max(1))
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    {
        let mut file = std::io::BufWriter::new(File::create(&path)?);
        let mut written = 0;
        while written < total_bytes {
            let n = chunk.len().min(total_bytes - written);
            file.write_all(&chunk[..n])?;
            written += n;
        }
        file.flush()?;
    }
    let mut file = File::open(&path)?;
    let started = Instant::now();
    let mut read = 0;
    loop {
        let n = file.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        read += n;
    }
    let elapsed = started.elapsed();
    drop(file);
    std::fs::remove_file(&path)?;
    if read != total_bytes {
        return Err(std::io::Error::other(format!(
            "read {read} bytes of the {total_bytes} written"
        )));
    }
    Ok(elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let took = sequential_fsync(dir.path(), 10_000, 3_000).unwrap();
        assert!(took > Duration::ZERO);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // A size that is no multiple of the chunk: the last read is short, and counted.
        let took = sequential_read(dir.path(), 10_001, 3_000).unwrap();
        assert!(took > Duration::ZERO);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

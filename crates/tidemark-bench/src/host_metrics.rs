//! Real machine metrics for W2: a sampler of this host's /proc (CPU, memory, disks, network
//! per device, load, vmstat; a few hundred series) and the recording file they are saved in.
//!
//! A recording is a gzip'd CSV: a header `time_s,<series>...` and one row a second. Series
//! names are lower-case `[a-z0-9_]` so the same name is a Tidemark field and a Prometheus
//! metric. The set of series is fixed by the first sample; a series missing from a later
//! sample (a device gone) is written empty and read back as its previous value.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flate2::bufread::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

/// The most series a recording may hold (a Tidemark stream has at most 1024 fields).
pub const MAX_SERIES: usize = 1000;
/// The most rows a recording may hold: a week at one a second.
pub const MAX_ROWS: usize = 7 * 24 * 3600;

#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("reading the recording: {0}")]
    Io(#[from] std::io::Error),
    #[error("recording line {line}: {reason}")]
    Invalid { line: usize, reason: String },
}

/// One sample of every series, in the order of its names.
pub type Sample = Vec<(String, f64)>;

/// Reads every series of this host now.
pub fn sample() -> std::io::Result<Sample> {
    let read = |path: &str| std::fs::read_to_string(path);
    let mut out = Vec::new();
    parse_stat(&read("/proc/stat")?, &mut out);
    parse_loadavg(&read("/proc/loadavg")?, &mut out);
    parse_meminfo(&read("/proc/meminfo")?, &mut out);
    parse_diskstats(&read("/proc/diskstats")?, &mut out);
    parse_net_dev(&read("/proc/net/dev")?, &mut out);
    parse_vmstat(&read("/proc/vmstat")?, &mut out);
    let mut seen = HashSet::new();
    out.retain(|(name, _)| seen.insert(name.clone()));
    Ok(out)
}

/// `[a-z0-9_]` only: what is left of a /proc name, lower-cased, everything else as `_`.
fn series_name(parts: &[&str]) -> String {
    let joined = parts.join("_").to_ascii_lowercase();
    let mut name: String = joined
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    while name.ends_with('_') {
        name.pop();
    }
    name
}

const CPU_FIELDS: [&str; 8] = [
    "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
];

fn parse_stat(text: &str, out: &mut Sample) {
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(key) = words.next() else { continue };
        if key.starts_with("cpu") {
            for (field, value) in CPU_FIELDS.iter().zip(words) {
                if let Ok(v) = value.parse::<f64>() {
                    out.push((series_name(&[key, field]), v));
                }
            }
        } else if matches!(
            key,
            "intr" | "ctxt" | "processes" | "procs_running" | "procs_blocked" | "softirq"
        ) {
            if let Some(Ok(v)) = words.next().map(str::parse::<f64>) {
                out.push((series_name(&["stat", key]), v));
            }
        }
    }
}

fn parse_loadavg(text: &str, out: &mut Sample) {
    let words: Vec<&str> = text.split_whitespace().collect();
    for (i, name) in ["load1", "load5", "load15"].iter().enumerate() {
        if let Some(Ok(v)) = words.get(i).map(|w| w.parse::<f64>()) {
            out.push((name.to_string(), v));
        }
    }
}

fn parse_meminfo(text: &str, out: &mut Sample) {
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        if let Some(Ok(v)) = rest.split_whitespace().next().map(str::parse::<f64>) {
            out.push((series_name(&["mem", key]), v));
        }
    }
}

const DISK_FIELDS: [&str; 11] = [
    "reads",
    "reads_merged",
    "sectors_read",
    "read_ms",
    "writes",
    "writes_merged",
    "sectors_written",
    "write_ms",
    "in_flight",
    "io_ms",
    "weighted_io_ms",
];

fn parse_diskstats(text: &str, out: &mut Sample) {
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(device) = words.get(2) else { continue };
        // Loop devices come and go with snaps and images; they are not this host's disks.
        if device.starts_with("loop") || device.starts_with("ram") {
            continue;
        }
        for (field, value) in DISK_FIELDS.iter().zip(&words[3..]) {
            if let Ok(v) = value.parse::<f64>() {
                out.push((series_name(&["disk", device, field]), v));
            }
        }
    }
}

const NET_FIELDS: [&str; 16] = [
    "rx_bytes",
    "rx_packets",
    "rx_errs",
    "rx_drop",
    "rx_fifo",
    "rx_frame",
    "rx_compressed",
    "rx_multicast",
    "tx_bytes",
    "tx_packets",
    "tx_errs",
    "tx_drop",
    "tx_fifo",
    "tx_colls",
    "tx_carrier",
    "tx_compressed",
];

fn parse_net_dev(text: &str, out: &mut Sample) {
    for line in text.lines() {
        let Some((device, rest)) = line.split_once(':') else {
            continue;
        };
        let device = device.trim();
        for (field, value) in NET_FIELDS.iter().zip(rest.split_whitespace()) {
            if let Ok(v) = value.parse::<f64>() {
                out.push((series_name(&["net", device, field]), v));
            }
        }
    }
}

fn parse_vmstat(text: &str, out: &mut Sample) {
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if let (Some(key), Some(Ok(v))) = (words.next(), words.next().map(str::parse::<f64>)) {
            out.push((series_name(&["vm", key]), v));
        }
    }
}

/// Series sampled once a second: the names, and a row of values per second.
#[derive(Debug, Clone, PartialEq)]
pub struct Recording {
    pub names: Vec<String>,
    /// Unix seconds of each row.
    pub times: Vec<i64>,
    /// `rows[i][j]`: series `j` at `times[i]`.
    pub rows: Vec<Vec<f64>>,
}

impl Recording {
    pub fn series(&self) -> usize {
        self.names.len()
    }

    /// Reads a recording file, gzip'd or plain.
    pub fn load(path: &Path) -> Result<Recording, RecordingError> {
        Self::read(BufReader::new(std::fs::File::open(path)?))
    }

    /// Reads a recording, gzip'd or plain (told apart by the gzip magic bytes).
    pub fn read(mut input: impl BufRead) -> Result<Recording, RecordingError> {
        if input.fill_buf()?.starts_with(&[0x1f, 0x8b]) {
            Self::read_csv(BufReader::new(GzDecoder::new(input)))
        } else {
            Self::read_csv(input)
        }
    }

    fn read_csv(input: impl BufRead) -> Result<Recording, RecordingError> {
        let mut lines = input.lines();
        let header = lines.next().transpose()?.ok_or(RecordingError::Invalid {
            line: 1,
            reason: "empty file".into(),
        })?;
        let mut columns = header.split(',');
        if columns.next() != Some("time_s") {
            return Err(RecordingError::Invalid {
                line: 1,
                reason: "the header must start with time_s".into(),
            });
        }
        let names: Vec<String> = columns.map(str::to_string).collect();
        if names.is_empty() || names.len() > MAX_SERIES {
            return Err(RecordingError::Invalid {
                line: 1,
                reason: format!("{} series; 1 to {MAX_SERIES} are allowed", names.len()),
            });
        }
        let mut seen = HashSet::new();
        for name in &names {
            let valid = !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !name.as_bytes()[0].is_ascii_digit();
            if !valid || !seen.insert(name.as_str()) {
                return Err(RecordingError::Invalid {
                    line: 1,
                    reason: format!("series name {name:?} is invalid or repeated"),
                });
            }
        }
        let mut recording = Recording {
            names,
            times: Vec::new(),
            rows: Vec::new(),
        };
        for (i, line) in lines.enumerate() {
            let line_no = i + 2;
            let line = line?;
            if line.is_empty() {
                continue;
            }
            if recording.rows.len() == MAX_ROWS {
                return Err(RecordingError::Invalid {
                    line: line_no,
                    reason: format!("more than {MAX_ROWS} rows"),
                });
            }
            recording.push_line(&line, line_no)?;
        }
        if recording.rows.is_empty() {
            return Err(RecordingError::Invalid {
                line: 2,
                reason: "no rows".into(),
            });
        }
        Ok(recording)
    }

    fn push_line(&mut self, line: &str, line_no: usize) -> Result<(), RecordingError> {
        let invalid = |reason: String| RecordingError::Invalid {
            line: line_no,
            reason,
        };
        let mut cells = line.split(',');
        let time: i64 = cells
            .next()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| invalid("the time is not a whole number of seconds".into()))?;
        if self.times.last().is_some_and(|&last| time <= last) {
            return Err(invalid(format!("time {time} is not after the row before")));
        }
        let previous = self.rows.last();
        let mut row = Vec::with_capacity(self.names.len());
        for (j, cell) in cells.enumerate() {
            if j == self.names.len() {
                return Err(invalid("more values than series".into()));
            }
            let value = if cell.is_empty() {
                previous.map_or(0.0, |p| p[j])
            } else {
                cell.parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| invalid(format!("{cell:?} is not a finite number")))?
            };
            row.push(value);
        }
        if row.len() != self.names.len() {
            return Err(invalid(format!(
                "{} values for {} series",
                row.len(),
                self.names.len()
            )));
        }
        self.times.push(time);
        self.rows.push(row);
        Ok(())
    }

    /// Writes the recording as plain CSV (wrap `out` in gzip for the file).
    pub fn write(&self, mut out: impl Write) -> std::io::Result<()> {
        writeln!(out, "time_s,{}", self.names.join(","))?;
        for (time, row) in self.times.iter().zip(&self.rows) {
            write!(out, "{time}")?;
            for v in row {
                write!(out, ",{v}")?;
            }
            writeln!(out)?;
        }
        Ok(())
    }
}

/// Samples this host once a second for `seconds` and writes the gzip'd recording to `path`
/// as it goes, calling `progress` after each sample with the count so far.
pub fn record(
    seconds: u64,
    path: &Path,
    mut progress: impl FnMut(u64),
) -> Result<(), RecordingError> {
    let first = sample()?;
    let names: Vec<String> = first.iter().map(|(n, _)| n.clone()).collect();
    let file = std::fs::File::create(path)?;
    let mut out = GzEncoder::new(std::io::BufWriter::new(file), Compression::best());
    writeln!(out, "time_s,{}", names.join(","))?;
    let mut next = unix_now();
    let mut current = first;
    for taken in 1..=seconds {
        write!(out, "{}", next.as_secs())?;
        for name in &names {
            // A series gone since the first sample is written empty: "as before".
            match lookup(&current, name) {
                Some(v) => write!(out, ",{v}")?,
                None => write!(out, ",")?,
            }
        }
        writeln!(out)?;
        progress(taken);
        if taken == seconds {
            break;
        }
        next += Duration::from_secs(1);
        if let Some(wait) = next.checked_sub(unix_now()) {
            std::thread::sleep(wait);
        }
        current = sample()?;
    }
    out.finish()?.flush()?;
    Ok(())
}

fn lookup(sample: &Sample, name: &str) -> Option<f64> {
    sample.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files_into_named_series() {
        let mut out = Sample::new();
        parse_stat(
            "cpu  10 0 5 100 1 0 2 0 0 0\ncpu0 4 0 2 50 1 0 1 0 0 0\nintr 99 0 0\nctxt 7\n",
            &mut out,
        );
        parse_meminfo("MemTotal: 100 kB\nActive(anon): 5 kB\n", &mut out);
        parse_diskstats(
            "7 0 loop0 1 2 3 4 5 6 7 8 9 10 11\n254 0 vda 1 2 3 4 5 6 7 8 9 10 11 12 13\n",
            &mut out,
        );
        parse_net_dev(
            "Inter-| head\n face |bytes\n  eth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n",
            &mut out,
        );
        let find = |name: &str| lookup(&out, name);
        assert_eq!(find("cpu_user"), Some(10.0));
        assert_eq!(find("cpu0_idle"), Some(50.0));
        assert_eq!(find("stat_intr"), Some(99.0));
        assert_eq!(find("stat_ctxt"), Some(7.0));
        assert_eq!(find("mem_active_anon"), Some(5.0));
        assert_eq!(find("disk_vda_sectors_written"), Some(7.0));
        assert_eq!(find("disk_loop0_reads"), None, "loop devices are skipped");
        assert_eq!(find("net_eth0_tx_bytes"), Some(9.0));
        assert_eq!(
            out.iter().filter(|(n, _)| n.starts_with("disk_")).count(),
            11
        );
        assert_eq!(
            out.iter().filter(|(n, _)| n.starts_with("net_")).count(),
            16
        );
    }

    #[test]
    fn this_host_has_a_few_hundred_valid_series() {
        let sample = sample().expect("/proc readable");
        assert!(sample.len() > 100, "{} series", sample.len());
        let names: HashSet<&str> = sample.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.len(), sample.len(), "names are unique");
        assert!(sample.iter().all(|(n, v)| {
            n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                && v.is_finite()
        }));
    }

    #[test]
    fn recording_round_trips_and_fills_gaps_with_the_previous_value() {
        let text = "time_s,a,b\n100,1,2.5\n101,,3\n102,4,-1e-3\n";
        let recording = Recording::read(text.as_bytes()).expect("valid");
        assert_eq!(recording.names, ["a", "b"]);
        assert_eq!(recording.times, [100, 101, 102]);
        assert_eq!(recording.rows, [[1.0, 2.5], [1.0, 3.0], [4.0, -0.001]]);
        let mut written = Vec::new();
        recording.write(&mut written).expect("write");
        assert_eq!(
            Recording::read(written.as_slice()).expect("reread"),
            recording
        );
        let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
        recording.write(&mut gz).expect("write");
        let gzipped = gz.finish().expect("gzip");
        assert_eq!(
            Recording::read(gzipped.as_slice()).expect("gunzip"),
            recording
        );
    }

    #[test]
    fn bad_recordings_are_refused_with_the_line() {
        for (text, line) in [
            ("", 1),
            ("time,a\n1,2\n", 1),
            ("time_s,a,a\n1,2,3\n", 1),
            ("time_s,a b\n1,2\n", 1),
            ("time_s,a\n", 2),
            ("time_s,a\n1,x\n", 2),
            ("time_s,a\n1,NaN\n", 2),
            ("time_s,a\n1,2\n1,3\n", 3),
            ("time_s,a\n1,2,3\n", 2),
            ("time_s,a,b\n1,2\n", 2),
        ] {
            match Recording::read(text.as_bytes()) {
                Err(RecordingError::Invalid { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
                other => panic!("{text:?} gave {other:?}"),
            }
        }
    }
}

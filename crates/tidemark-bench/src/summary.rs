//! `summary.csv`: one row per figure of a benchmark run, with the columns
//! `workload,system,variant,metric,value,unit` (e.g. `W1,tidemark,embedded 10000000 events,
//! median_events_per_second,25900000,events/s`), so runs can be compared by a script.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use tidemark_query::output::csv_cell;

pub const HEADER: &str = "workload,system,variant,metric,value,unit";

/// One figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub workload: String,
    pub system: String,
    pub variant: String,
    pub metric: String,
    pub value: f64,
    pub unit: String,
}

impl Figure {
    pub fn new(
        workload: &str,
        system: &str,
        variant: &str,
        metric: &str,
        value: f64,
        unit: &str,
    ) -> Figure {
        Figure {
            workload: workload.into(),
            system: system.into(),
            variant: variant.into(),
            metric: metric.into(),
            value,
            unit: unit.into(),
        }
    }

    fn csv_row(&self) -> String {
        let value = if self.value.fract() == 0.0 && self.value.abs() < 1e15 {
            format!("{}", self.value as i64)
        } else {
            format!("{:.4}", self.value)
        };
        [
            csv_cell(&self.workload),
            csv_cell(&self.system),
            csv_cell(&self.variant),
            csv_cell(&self.metric),
            value,
            csv_cell(&self.unit),
        ]
        .join(",")
    }
}

/// Appends `figures` to `DIR/summary.csv`, writing the header when the file is new, so that
/// several workloads of one run share the file.
pub fn append_summary(dir: &Path, figures: &[Figure]) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("summary.csv");
    let new = !path.exists();
    let mut file = OpenOptions::new().create(true).append(true).open(&path)?;
    let mut text = String::new();
    if new {
        text.push_str(HEADER);
        text.push('\n');
    }
    for figure in figures {
        text.push_str(&figure.csv_row());
        text.push('\n');
    }
    file.write_all(text.as_bytes())?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_append_under_one_header() {
        let dir = tempfile::tempdir().unwrap();
        append_summary(
            dir.path(),
            &[Figure::new(
                "W1",
                "tidemark",
                "embedded, 10 events",
                "median_events_per_second",
                1234.0,
                "events/s",
            )],
        )
        .unwrap();
        let path = append_summary(
            dir.path(),
            &[Figure::new(
                "W1",
                "redis",
                "appendfsync \"always\"",
                "ratio",
                2.5,
                "x",
            )],
        )
        .unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        assert_eq!(
            text,
            "workload,system,variant,metric,value,unit\n\
             W1,tidemark,\"embedded, 10 events\",median_events_per_second,1234,events/s\n\
             W1,redis,\"appendfsync \"\"always\"\"\",ratio,2.5000,x\n"
        );
    }
}

//! `summary.csv`: one row per figure of a benchmark run, with the columns
//! `workload,system,variant,metric,value,unit` (e.g. `W1,tidemark,embedded 10000000 events,
//! median_events_per_second,25900000,events/s`), so runs can be compared by a script; and
//! the same rows as a markdown table in `summary.md`, for people.

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

    fn value_text(&self) -> String {
        if self.value.fract() == 0.0 && self.value.abs() < 1e15 {
            format!("{}", self.value as i64)
        } else {
            format!("{:.4}", self.value)
        }
    }

    fn markdown_row(&self) -> String {
        let cell = |text: &str| text.replace('|', "\\|");
        format!(
            "| {} | {} | {} | {} | {} | {} |",
            cell(&self.workload),
            cell(&self.system),
            cell(&self.variant),
            cell(&self.metric),
            self.value_text(),
            cell(&self.unit)
        )
    }

    fn csv_row(&self) -> String {
        let value = self.value_text();
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

/// The header of `summary.md`'s table.
pub const MARKDOWN_HEADER: &str =
    "| workload | system | variant | metric | value | unit |\n|---|---|---|---|---:|---|";

/// Appends `figures` to `DIR/summary.csv` and `DIR/summary.md`, writing the headers when
/// the files are new, so that several workloads of one run share them.
pub fn append_summary(dir: &Path, figures: &[Figure]) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let csv = dir.join("summary.csv");
    append_rows(&csv, HEADER, figures.iter().map(Figure::csv_row))?;
    append_rows(
        &dir.join("summary.md"),
        MARKDOWN_HEADER,
        figures.iter().map(Figure::markdown_row),
    )?;
    Ok(csv)
}

/// Appends `rows` to `path`, after `header` when the file is new.
pub fn append_rows(
    path: &Path,
    header: &str,
    rows: impl Iterator<Item = String>,
) -> std::io::Result<()> {
    let new = !path.exists();
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    let mut text = String::new();
    if new {
        text.push_str(header);
        text.push('\n');
    }
    for row in rows {
        text.push_str(&row);
        text.push('\n');
    }
    file.write_all(text.as_bytes())
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
        let markdown = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
        assert_eq!(
            markdown,
            format!(
                "{MARKDOWN_HEADER}\n\
                 | W1 | tidemark | embedded, 10 events | median_events_per_second | 1234 | events/s |\n\
                 | W1 | redis | appendfsync \"always\" | ratio | 2.5000 | x |\n"
            )
        );
    }
}

//! The one way a workload's results are written as CSV: a header line and one line per
//! result, in a file of the output directory (created if needed).

use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `header` and `rows` (each a CSV line without its newline) to `dir/file`, and
/// returns the file's path.
pub fn write(
    dir: &Path,
    file: &str,
    header: &str,
    rows: impl IntoIterator<Item = String>,
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(file);
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path)?);
    writeln!(out, "{header}")?;
    for row in rows {
        writeln!(out, "{row}")?;
    }
    out.flush()?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_header_comes_first_then_one_line_per_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = super::write(
            dir.path().join("out").as_path(),
            "x.csv",
            "a,b",
            ["1,2".into(), "3,4".into()],
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(path).unwrap(), "a,b\n1,2\n3,4\n");
    }
}

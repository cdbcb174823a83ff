//! `tidemark bench all`: every workload in turn, each in its own folder, their figures
//! gathered into one summary; a workload that cannot run here is skipped and named.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::{
    append, clear_summary, consume, insert, lines, metrics, pipeline, python, sql, tier,
    Unavailable,
};
use crate::summary::{append_rows, HEADER, MARKDOWN_HEADER};

/// One workload of `bench all`, run with its output folder.
type Workload<'a> = Box<dyn FnOnce(PathBuf) -> anyhow::Result<()> + 'a>;

/// How one workload of `bench all` ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    Ran,
    /// It could not run here; why and how to install what it needs.
    Skipped(String),
    Failed(String),
}

impl Outcome {
    fn of(result: &anyhow::Result<()>) -> Outcome {
        match result {
            Ok(()) => Outcome::Ran,
            // Wherever it was wrapped with context.
            Err(e) => match e.chain().find_map(|c| c.downcast_ref::<Unavailable>()) {
                Some(unavailable) => Outcome::Skipped(unavailable.to_string()),
                None => Outcome::Failed(format!("{e:#}")),
            },
        }
    }
}

/// The end of `bench all`: the skipped workloads, each with its reason, then the failed
/// ones; an error (exit 1) only if a workload that could run failed.
fn verdict(outcomes: &[(&str, Outcome)], out: &mut impl std::io::Write) -> anyhow::Result<()> {
    let skipped: Vec<_> = outcomes
        .iter()
        .filter_map(|(name, o)| match o {
            Outcome::Skipped(why) => Some((name, why)),
            _ => None,
        })
        .collect();
    if !skipped.is_empty() {
        writeln!(out, "skipped {} workloads:", skipped.len())?;
        for (name, why) in skipped {
            writeln!(out, "  {name}: {why}")?;
        }
    }
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Failed(_)))
        .map(|(name, _)| *name)
        .collect();
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}

pub fn all(quick: bool, peers: &str, out: &Path) -> anyhow::Result<()> {
    use insert::{InsertArgs, Target};
    let workloads: Vec<(&str, Workload)> = vec![
        (
            "insert-embedded",
            Box::new(|dir| insert::run(InsertArgs::defaults(Target::Embedded, quick, peers, dir))),
        ),
        (
            "insert-server",
            Box::new(|dir| insert::run(InsertArgs::defaults(Target::Server, quick, peers, dir))),
        ),
        (
            "insert-cluster",
            // Peers ran next to the server target already.
            Box::new(|dir| insert::run(InsertArgs::defaults(Target::Cluster, quick, "none", dir))),
        ),
        (
            "metrics",
            Box::new(|dir| metrics::run(metrics::MetricsArgs::defaults(quick, peers, dir))),
        ),
        (
            "append",
            Box::new(|dir| append::run(append::AppendArgs::defaults(quick, peers, dir))),
        ),
        (
            "consume",
            Box::new(|dir| consume::run(consume::ConsumeArgs::defaults(quick, peers, dir))),
        ),
        (
            "lines",
            Box::new(|dir| lines::run(lines::LinesArgs::defaults(quick, peers, dir))),
        ),
        (
            "pipeline",
            Box::new(|dir| pipeline::run(pipeline::PipelineArgs::defaults(quick, peers, dir))),
        ),
        (
            "tier",
            Box::new(|dir| tier::run(tier::TierArgs::defaults(quick, dir))),
        ),
        (
            "python",
            Box::new(|dir| python::run(python::PythonArgs::defaults(quick, peers, dir))),
        ),
        (
            "sql",
            Box::new(|dir| sql::run(sql::SqlArgs::defaults(quick, dir))),
        ),
    ];
    clear_summary(out)?;
    let mut outcomes = Vec::new();
    for (name, work) in workloads {
        let dir = out.join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        println!("\n== {name} (output in {}) ==", dir.display());
        let result = work(dir.clone());
        let outcome = Outcome::of(&result);
        match &outcome {
            Outcome::Ran => gather(&dir, out)?,
            Outcome::Skipped(why) => println!("{name} skipped: {why}"),
            Outcome::Failed(why) => println!("{name} failed: {why}"),
        }
        outcomes.push((name, outcome));
    }
    println!(
        "\nfigures of every workload that ran: {}",
        out.join("summary.md").display()
    );
    verdict(&outcomes, &mut std::io::stdout().lock())
}

/// Appends the figures a workload wrote in `dir` to the run's `summary.csv` and `summary.md`.
fn gather(dir: &Path, out: &Path) -> anyhow::Result<()> {
    for (file, header) in [("summary.csv", HEADER), ("summary.md", MARKDOWN_HEADER)] {
        let Ok(text) = std::fs::read_to_string(dir.join(file)) else {
            continue;
        };
        let skip = header.lines().count();
        let rows = text.lines().skip(skip).map(str::to_string);
        append_rows(&out.join(file), header, rows)
            .with_context(|| format!("writing {}", out.join(file).display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable() -> anyhow::Error {
        Unavailable {
            missing: ".venv/bin/python cannot import tidemark".into(),
            install: "make .venv/installed".into(),
        }
        .into()
    }

    #[test]
    fn a_workload_that_cannot_run_is_skipped_wherever_its_error_was_wrapped() {
        assert_eq!(Outcome::of(&Ok(())), Outcome::Ran);
        let wrapped = Err(unavailable().context("bench python"));
        let Outcome::Skipped(why) = Outcome::of(&wrapped) else {
            panic!("{:?}", Outcome::of(&wrapped));
        };
        assert!(why.contains("cannot import tidemark") && why.contains("make .venv/installed"));
        let failed = Err(anyhow::anyhow!(
            "the Python benchmark failed (exit status: 1)"
        ));
        assert!(matches!(Outcome::of(&failed), Outcome::Failed(_)));
    }

    #[test]
    fn bench_all_exits_0_when_every_workload_that_could_run_did() {
        let skipped = |why: &str| Outcome::Skipped(why.into());
        let mut printed = Vec::new();
        let outcomes = [
            ("insert-embedded", Outcome::Ran),
            (
                "tier",
                skipped("S3Proxy is not installed (install: peers/install.sh s3proxy)"),
            ),
            (
                "python",
                skipped("no tidemark package (install: make .venv/installed)"),
            ),
        ];
        verdict(&outcomes, &mut printed).unwrap();
        let printed = String::from_utf8(printed).unwrap();
        assert_eq!(
            printed,
            "skipped 2 workloads:\n  tier: S3Proxy is not installed (install: peers/install.sh \
             s3proxy)\n  python: no tidemark package (install: make .venv/installed)\n"
        );
        // A failure of one that could run is still an error, naming only the failed.
        let outcomes = [
            ("insert-embedded", Outcome::Failed("disk full".into())),
            ("tier", skipped("S3Proxy is not installed")),
        ];
        let error = verdict(&outcomes, &mut Vec::new()).unwrap_err();
        assert_eq!(error.to_string(), "failed: insert-embedded");
        let mut printed = Vec::new();
        verdict(&[("lines", Outcome::Ran)], &mut printed).unwrap();
        assert!(printed.is_empty());
    }
}

//! `tidemark restore`: a data directory rebuilt from its tier's bucket alone.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use tidemark_tier::{BlockingBucket, Bucket, TierLocation};

use crate::data_dir::DataDir;

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The tier's bucket and prefix, as the server's `[tier] url` named it.
    #[arg(long, value_name = "s3://BUCKET/PREFIX")]
    from: String,
    /// An S3-compatible server's address (`[tier] endpoint`); leave out for AWS.
    #[arg(long)]
    endpoint: Option<String>,
    /// The bucket's region (`[tier] region`); leave out: AWS_REGION, the profile's, else us-east-1.
    #[arg(long)]
    region: Option<String>,
    #[command(flatten)]
    dir: DataDir,
}

pub fn run(args: RestoreArgs) -> Result<()> {
    let mut location = TierLocation::parse(&args.from)?;
    if let Some(endpoint) = args.endpoint {
        location = location.with_endpoint(endpoint);
    }
    if let Some(region) = args.region {
        location = location.with_region(region);
    }
    let bucket = BlockingBucket::new(Bucket::open(location, None)?)?;
    let dir = &args.dir.data_dir;
    let bar = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template("restoring [{bar:40}] {pos}/{len} segments") {
        bar.set_style(style.progress_chars("=> "));
    }
    let restored = tidemark_engine::restore(&bucket, dir, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .with_context(|| format!("restoring {} from {}", dir.display(), args.from))?;
    bar.finish_and_clear();
    println!(
        "restored {}: {} streams, {} segments, {} events, {} in the bucket",
        dir.display(),
        restored.streams,
        restored.segments,
        restored.events,
        crate::tier::size_text(restored.bytes)
    );
    for (stream, newest) in &restored.newest {
        match newest {
            Some(ns) => println!(
                "  {stream}: events up to {}",
                tidemark_core::time::format_instant(*ns)
            ),
            None => println!("  {stream}: no events (none had moved to the bucket)"),
        }
    }
    println!(
        "lost with the old disk: {} segments that had not moved yet, and every event written after them",
        restored.local_segments_lost
    );
    println!("serve it with the same [tier] section (its prefix is this directory's alone now)");
    Ok(())
}

//! `tidemark verify`: opening replays the log and checks every segment footer; reading every
//! event of every stream then checks every block's checksums.

use anyhow::{bail, Result};
use tidemark_engine::ScanRequest;

use crate::streams::open;
use crate::DataDir;

pub fn run(dir: DataDir) -> Result<()> {
    let db = open(&dir)?;
    let mut damaged = 0;
    for name in db.list_streams() {
        let info = db.stream_info(&name)?;
        let mut read = 0u64;
        let outcome = db.scan(&name, &ScanRequest::default()).and_then(|scan| {
            for batch in scan {
                read += batch?.len() as u64;
            }
            Ok(())
        });
        match outcome {
            Ok(()) if read == info.event_count => {
                println!("ok       {name}: {read} events, {} segments", info.segments)
            }
            Ok(()) => {
                damaged += 1;
                println!(
                    "MISMATCH {name}: read {read} events, summaries say {}",
                    info.event_count
                );
            }
            Err(e) => {
                damaged += 1;
                println!("DAMAGED  {name}: {e} (after {read} events)");
            }
        }
    }
    if damaged > 0 {
        bail!("{damaged} damaged streams in {}", dir.data_dir.display());
    }
    Ok(())
}

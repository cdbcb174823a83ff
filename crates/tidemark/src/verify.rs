//! `tidemark verify`: opening replays the log and checks every segment footer; reading every
//! event of every stream then checks every block's checksums (and, in an agent's spool,
//! every record of the spool's log). `--repair` first cuts a corrupt log at its damage,
//! saving every byte it cuts (`Db::repair_log`).

use anyhow::{anyhow, bail, Context, Result};
use tidemark_engine::{
    Db, Engine, Evidence, OpenError, Options, RepairedLog, ScanRequest, Spool, SpoolOptions,
};

use crate::data_dir::DataDir;

#[derive(clap::Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    dir: DataDir,
    /// If the log is corrupt (a damaged record followed by acknowledged ones: opening is
    /// refused), cut it at the damage so that the database opens again, first saving every
    /// byte cut into wal/damaged-LSN.bin, with a note beside it. The records after the
    /// damage are NOT restored.
    #[arg(long)]
    repair: bool,
}

pub fn run(args: VerifyArgs) -> Result<()> {
    let dir = &args.dir.data_dir;
    if !dir.exists() {
        bail!(
            "there is no database at {} (pass --data-dir)",
            dir.display()
        );
    }
    if !dir.join("segments").is_dir() {
        if dir.join("raft").is_dir() {
            bail!(
                "{} is a cluster node's data directory: verify reads a server's or an agent's. \
                 A node whose Raft log is damaged is rebuilt from its peers (`tidemark cluster \
                 remove-node`, move its data directory aside, start it with an empty one, \
                 `tidemark cluster add-node`: docs/cluster.md, \"Replacing a node's data\")",
                dir.display()
            );
        }
        bail!("{} is not a Tidemark data directory", dir.display());
    }
    // An agent's spool is opened as the agent opens it: as a plain database, a checkpoint
    // could delete log files whose records were never forwarded.
    let spool = dir.join(tidemark_agent::POSITION_FILE).exists();
    if args.repair {
        match Db::repair_log(dir).map_err(|e| opening_failed(dir, e))? {
            Some(repaired) => report_repair(&repaired, spool, dir),
            None => println!("log      not corrupt: nothing to repair"),
        }
    }
    let limits = SpoolOptions {
        max_bytes: u64::MAX,
        min_free_bytes: 0,
    };
    let damaged = if spool {
        let spool =
            Spool::open(dir, Options::default(), limits).map_err(|e| opening_failed(dir, e))?;
        let mut damaged = check_streams(&spool.engine())?;
        match read_spool(&spool) {
            Ok((records, bytes)) => println!(
                "ok       spool: {records} records ({bytes} bytes) from LSN {}",
                spool.spooled_start()
            ),
            Err((e, records)) => {
                damaged += 1;
                println!("DAMAGED  spool: {e} (after {records} records)");
            }
        }
        damaged
    } else {
        let db = Db::open(dir, Options::default()).map_err(|e| opening_failed(dir, e))?;
        check_streams(&db)?
    };
    if damaged > 0 {
        bail!("{damaged} damaged streams in {}", dir.display());
    }
    Ok(())
}

/// Reads every event of every stream, checking every block's checksums: how many streams
/// are damaged (each reported as it is read).
fn check_streams(db: &Engine) -> Result<usize> {
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
    Ok(damaged)
}

fn opening_failed(dir: &std::path::Path, e: OpenError) -> anyhow::Error {
    match e {
        OpenError::Locked(_) => {
            // verify reads the files themselves, which the running process changes under
            // it (and --repair cuts its log): it works on a directory no process holds.
            anyhow!(
                "{e}: probably a running `tidemark serve` or `tidemark agent`; stop it first \
                 (verify reads the directory's files, not a server)"
            )
        }
        e => anyhow::Error::new(e).context(format!("opening {}", dir.display())),
    }
}

fn report_repair(repaired: &RepairedLog, spool: bool, dir: &std::path::Path) {
    let damage = &repaired.damage;
    let why = match &damage.evidence {
        Evidence::LaterWrite { lsn } => format!("a later write follows it at LSN {lsn}"),
        Evidence::NotLastFile => "it is not the last log file".to_string(),
        Evidence::BeforeReplayPoint { from } => format!("it lies before LSN {from}"),
    };
    println!(
        "REPAIRED log: {} was corrupt at byte {} (LSN {}: {}; {why})",
        damage.file.display(),
        damage.offset,
        damage.lsn,
        damage.reason
    );
    println!(
        "         cut there; every byte from the damage on ({} bytes) saved to {}",
        repaired.saved_bytes,
        repaired.saved.display()
    );
    for moved in &repaired.moved {
        println!(
            "         a later log file moved aside whole: {}",
            moved.display()
        );
    }
    println!(
        "         {} valid records ({} bytes) followed the damage: they had been acknowledged \
         and are NOT restored (they stay in the saved bytes; {} says what they are)",
        damage.records_after,
        damage.bytes_after,
        repaired.note.display()
    );
    if spool {
        println!(
            "         this is an agent's spool: the records after the damage will not be \
             forwarded"
        );
        if let Some(forwarded) = forwarded_mark(dir).filter(|&f| f > damage.lsn) {
            println!(
                "         forwarding.json says forwarding reached LSN {forwarded}, past the cut: \
                 the agent will refuse to start on this spool"
            );
        }
    }
}

/// The agent's forwarded mark, if its position file says one.
fn forwarded_mark(dir: &std::path::Path) -> Option<u64> {
    let bytes = std::fs::read(dir.join(tidemark_agent::POSITION_FILE)).ok()?;
    let position: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    position.get("forwarded")?.as_u64()
}

/// Reads every record a spool holds, checking each frame again: how many and their bytes,
/// or the error and how many were read before it.
fn read_spool(db: &Spool) -> std::result::Result<(u64, u64), (anyhow::Error, u64)> {
    let (mut at, end) = (db.spooled_start(), db.spooled_end());
    let (mut records, mut bytes) = (0u64, 0u64);
    while at < end {
        let read = db
            .read_spooled(at, 8 << 20)
            .with_context(|| format!("reading the spool's log at LSN {at}"))
            .map_err(|e| (e, records))?;
        let Some(last) = read.last() else { break };
        let next = last.end();
        records += read.len() as u64;
        bytes += next - at;
        at = next;
    }
    Ok((records, bytes))
}

//! `--data-dir`, the embedded database's directory, as every command that opens one takes it.
//! Its own module, not the crate root's: the commands import it, and the root imports them.

use std::path::PathBuf;

/// Where the embedded database lives.
#[derive(clap::Args, Clone)]
pub struct DataDir {
    /// The database directory (`serve`, `streams create`, `put` and `demo` create it).
    #[arg(long, default_value = DEFAULT_DATA_DIR, global = true)]
    pub data_dir: PathBuf,
}

/// `--data-dir` when it is not given.
pub const DEFAULT_DATA_DIR: &str = "tidemark-data";

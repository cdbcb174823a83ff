//! `tidemark serve`: the server, configured by a TOML file and flags (flags win).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use tidemark_engine::Options;
use tidemark_server::config::{Graphite, Tier, Tls};
use tidemark_server::{shutdown_signal, Config, Server};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// A TOML configuration file (see docs/server.md); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the data lives [default: tidemark-data]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The HTTP address [default: 127.0.0.1:8080]
    #[arg(long)]
    http: Option<SocketAddr>,
    /// The binary protocol address [default: 127.0.0.1:8081]
    #[arg(long)]
    binary: Option<SocketAddr>,
    /// Listen for Graphite plaintext (`path value timestamp` lines) here, e.g.
    /// 127.0.0.1:2003 [default: off]; lines go to the stream `[graphite] stream` names
    /// (default `graphite`).
    #[arg(long)]
    graphite: Option<SocketAddr>,
    /// Listen for the PostgreSQL wire protocol (psql, psycopg, pandas) here
    /// [default: off; `--pg` alone: 127.0.0.1:8432]. With a read token set, the password is a token.
    #[arg(long, num_args = 0..=1, default_missing_value = "127.0.0.1:8432")]
    pg: Option<SocketAddr>,
    /// This node's id in the cluster configuration (with --cluster-config).
    #[arg(long)]
    node_id: Option<u64>,
    /// Run as a node of the Raft cluster this file describes (see docs/cluster.md); the
    /// listen addresses then come from it.
    #[arg(long)]
    cluster_config: Option<PathBuf>,
    /// TLS certificate chain (PEM); with --tls-key, both listeners speak TLS only.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Move old segments to this bucket and prefix (s3://BUCKET/PREFIX; docs/tiering.md);
    /// the rest of `[tier]` from the file or its defaults.
    #[arg(long, value_name = "s3://BUCKET/PREFIX")]
    tier: Option<String>,
    /// An S3-compatible server's address for the tier (`[tier] endpoint`).
    #[arg(long)]
    tier_endpoint: Option<String>,
    /// A segment moves once its newest event is this old (`[tier] after`) [default: 1d].
    #[arg(long)]
    tier_after: Option<String>,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    if let Some(http) = args.http {
        config.http = http;
    }
    if let Some(binary) = args.binary {
        config.binary = binary;
    }
    if let Some(listen) = args.graphite {
        // The flag sets the address; the file's other [graphite] settings stay.
        let mut graphite = config
            .graphite
            .take()
            .unwrap_or_else(|| Graphite::new(listen, Graphite::default_stream()));
        graphite.listen = listen;
        config.graphite = Some(graphite);
    }
    if let Some(listen) = args.pg {
        // The flag sets the address; the file's other [pg] settings stay.
        let mut pg = config.pg.take().unwrap_or_default();
        pg.listen = listen;
        config.pg = Some(pg);
    }
    if let Some(id) = args.node_id {
        config.node_id = id;
    }
    if let Some(path) = args.cluster_config {
        config.cluster = Some(path);
    }
    if let (Some(cert), Some(key)) = (args.tls_cert, args.tls_key) {
        config.tls = Some(Tls { cert, key });
    }
    if let Some(url) = args.tier {
        config.tier = Some(Tier {
            url,
            ..config.tier.take().unwrap_or_else(|| Tier::new(""))
        });
    }
    if let Some(tier) = &mut config.tier {
        if let Some(endpoint) = args.tier_endpoint {
            tier.endpoint = Some(endpoint);
        }
        if let Some(after) = args.tier_after {
            tier.after = after;
        }
    } else if args.tier_endpoint.is_some() || args.tier_after.is_some() {
        anyhow::bail!("--tier-endpoint and --tier-after need --tier or a [tier] section");
    }
    let runtime = crate::serve::long_running_runtime()?;
    runtime.block_on(async move {
        let data_dir = config.data_dir.clone();
        let tls = config.tls.is_some();
        let role = match &config.cluster {
            Some(_) => format!(" as cluster node {}", config.node_id),
            None => String::new(),
        };
        let server = Server::bind(config, Options::default()).await?;
        tracing::info!(
            http = %server.http_addr(),
            binary = %server.binary_addr(),
            data_dir = %data_dir.display(),
            "tidemark is serving"
        );
        // The addresses also go to stdout, for scripts and for people.
        let scheme = if tls { "https" } else { "http" };
        let graphite = server
            .graphite_addr()
            .map(|addr| format!("  graphite {addr}"))
            .unwrap_or_default();
        let pg = server
            .pg_addr()
            .map(|addr| format!("  postgresql {addr}"))
            .unwrap_or_default();
        println!(
            "tidemark serving {}{role} — HTTP {scheme}://{}  binary {}{}{graphite}{pg}  (Ctrl-C stops)",
            data_dir.display(),
            server.http_addr(),
            server.binary_addr(),
            if tls { " (TLS)" } else { "" }
        );
        server.run(shutdown_signal()).await?;
        tracing::info!("stopped");
        anyhow::Ok(())
    })
}

/// The runtime of a long-running process (`serve`, `agent`), with the allocator's trimmer
/// started beside it.
pub(crate) fn long_running_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    crate::allocator::spawn_trimmer();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

//! The server's configuration: a TOML file, overridden by command-line flags.
//!
//! ```toml
//! data_dir = "tidemark-data"
//! http = "127.0.0.1:8080"
//! binary = "127.0.0.1:8081"
//! node_id = 1                    # this node's id in the cluster file
//! cluster = "cluster.toml"        # optional: run as a node of this Raft cluster; the
//!                                 # listen addresses then come from the cluster file
//!
//! [limits]
//! max_body_bytes = 67108864       # larger requests get 413
//! max_in_flight_bytes = 268435456 # beyond this, 429 / TRY_LATER
//! retry_after_ms = 200            # the hint given with 429 / TRY_LATER
//! read_timeout_ms = 20000         # headers, and each pause inside a body or frame
//! shutdown_grace_ms = 10000       # on SIGTERM / Ctrl-C, time for requests in flight
//! max_result_bytes = 67108864     # what a query may hold (sorts, groups, joins); beyond, 400
//! query_timeout_ms = 300000       # a SQL query running longer is stopped (400 query_timeout)
//! query_memory_bytes = 1073741824 # what all SQL queries hold together; beyond, 503
//! query_spill_bytes = 4294967296  # what all SQL queries spill together (0: never spill)
//! min_free_disk_bytes = 2147483648 # no spilling while the data disk has less free
//! max_value_bytes = 16777216      # the largest value a SQL function may make; beyond, 400
//! max_concurrent_queries = 64     # SQL queries running at once; one more gets 503
//! max_binary_connections = 1024   # binary-protocol connections at once; one more is refused
//! max_pending_clears = 1024       # clear requests awaiting confirmation; one more gets 429
//! max_subscriptions = 1024        # reads that follow a stream at once; one more gets 503
//!
//! [auth]                          # optional; without tokens every route is open
//! read_token = "…"
//! write_token = "…"               # appends, deletes, clears, admin routes
//!
//! [tls]                           # optional; both listeners then speak TLS only
//! cert = "server.crt"             # PEM certificate chain
//! key = "server.key"              # PEM private key
//!
//! [graphite]                      # optional: a Graphite plaintext listener
//! listen = "127.0.0.1:2003"       # plain TCP: no TLS, no tokens (Graphite has neither)
//! stream = "graphite"             # the stream every line goes to
//!
//! [pg]                            # optional: a PostgreSQL wire protocol listener
//! listen = "127.0.0.1:8432"       # the default; TLS and tokens as [tls] and [auth] say
//!
//! [tier]                          # optional: old segments move to S3 (docs/tiering.md)
//! url = "s3://bucket/prefix"      # this server's alone (a cluster node's: prefix/node-<id>)
//! endpoint = "http://127.0.0.1:9000"  # an S3-compatible server; absent: AWS
//! region = "eu-west-1"            # absent: AWS_REGION, the AWS profile's, else us-east-1
//! after = "1d"                    # a segment moves once its newest event is this old
//! local_cache_bytes = 1073741824  # tiered data kept in memory for reads
//! check_every = "10s"             # how often segments are looked at; retries back off
//! ```
//!
//! The tier's credentials are AWS's: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, else
//! the profile `AWS_PROFILE` of `~/.aws/credentials`, as every S3 tool finds them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub data_dir: PathBuf,
    pub http: SocketAddr,
    pub binary: SocketAddr,
    pub node_id: u64,
    /// The cluster configuration file (see `tidemark_cluster::config`); without it the
    /// replicated store is embedded.
    pub cluster: Option<PathBuf>,
    pub limits: Limits,
    pub auth: Auth,
    pub tls: Option<Tls>,
    pub graphite: Option<Graphite>,
    pub pg: Option<Pg>,
    pub tier: Option<Tier>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// The largest request body (HTTP) or frame (binary protocol) accepted.
    pub max_body_bytes: usize,
    /// Request bytes being received, decoded or appended at once, over all connections.
    pub max_in_flight_bytes: usize,
    /// How long clients are told to wait after 429 / TRY_LATER.
    pub retry_after_ms: u32,
    /// A request's headers must arrive within this time (a keep-alive connection idle this
    /// long is closed), and a body or binary frame whose bytes stop coming for this long
    /// is dropped with its connection.
    pub read_timeout_ms: u64,
    /// After SIGTERM or Ctrl-C, requests in flight get this long to finish; connections
    /// still open then are closed.
    pub shutdown_grace_ms: u64,
    /// What a SQL query may hold in memory at once (a sort, the groups of an aggregate, a
    /// join's table), and the most an events answer built whole may take.
    pub max_result_bytes: usize,
    /// A SQL query still running after this long is stopped, answered or not: one query
    /// (a cross join, `generate_series` to 10^18) must not hold a core forever.
    pub query_timeout_ms: u64,
    /// What all SQL queries may hold in memory together (each at most `max_result_bytes`
    /// of it); a query that needs more than what is left spills or is refused (503, retry).
    pub query_memory_bytes: usize,
    /// What all SQL queries may have spilled to disk at once (in `query-spill/` inside the
    /// data directory); 0: queries never spill.
    pub query_spill_bytes: u64,
    /// Queries do not spill while the disk holding the data directory has less free space
    /// than this: it is kept for the server's own writes.
    pub min_free_disk_bytes: u64,
    /// The largest value a SQL function may make (`repeat`, `lpad`, `concat`...); no larger
    /// than `max_result_bytes` in effect.
    pub max_value_bytes: usize,
    /// SQL queries running at once, over HTTP and PostgreSQL together; one more is refused
    /// at once (503, retry).
    pub max_concurrent_queries: usize,
    /// Binary-protocol connections served at once; one more is answered `ERROR UNAVAILABLE`
    /// (request id 0) and closed. Each holds a reader, a writer and an answer queue.
    pub max_binary_connections: usize,
    /// Clear requests (ChronicleDB's two-step clear) issued and not yet confirmed or
    /// expired; one more is refused (429) until one is confirmed or expires.
    pub max_pending_clears: usize,
    /// Reads that follow a stream (`follow=true`, or waiting with `wait`) served at once;
    /// one more is refused (503, retry). Each holds a task, a watch of its stream and at
    /// most one answer chunk waiting for its client.
    pub max_subscriptions: usize,
}

impl Limits {
    pub fn read_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.read_timeout_ms)
    }

    pub fn shutdown_grace(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.shutdown_grace_ms)
    }

    pub fn query_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.query_timeout_ms)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Auth {
    /// Grants the read routes.
    pub read_token: Option<String>,
    /// Grants every route: appends, deletes, clears, admin routes and reads.
    pub write_token: Option<String>,
}

/// The certificate chain and key (PEM files) that turn TLS on for both listeners.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A listener for Graphite's plaintext protocol (`path value timestamp` lines).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Graphite {
    pub listen: SocketAddr,
    /// The stream every line goes to (created on the first line, with fields `path` and
    /// `value`, and one more per Graphite tag).
    #[serde(default = "Graphite::default_stream")]
    pub stream: String,
    /// The most fields Graphite lines may grow the stream to (`path`, `value` and a field
    /// per tag name): Graphite has no tokens, so what any sender may add to a schema, and
    /// to the memory of every later write, is bounded here. A line bringing a tag beyond it
    /// is refused (and logged as a bad line).
    #[serde(default = "Graphite::default_max_fields")]
    pub max_fields: usize,
}

impl Graphite {
    pub fn default_stream() -> String {
        "graphite".to_string()
    }

    pub fn default_max_fields() -> usize {
        32
    }

    /// The listener at `listen` writing to `stream`, its other settings at their defaults.
    pub fn new(listen: SocketAddr, stream: String) -> Graphite {
        Graphite {
            listen,
            stream,
            max_fields: Graphite::default_max_fields(),
        }
    }
}

/// A listener for the PostgreSQL wire protocol (SQL from psql, psycopg, pandas...), and what
/// one of its clients may hold (docs/server.md, "PostgreSQL connections").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Pg {
    pub listen: SocketAddr,
    /// Sessions (authenticated connections) served at once; one more is refused with
    /// "too many clients".
    pub max_connections: usize,
    /// Connections still starting (before their password is checked) at once; a new one past
    /// it closes the oldest, so that clients that never finish cannot lock others out.
    pub max_starting: usize,
    /// A connection must be authenticated within this time.
    pub startup_timeout_ms: u64,
    /// A session that sends nothing for this long is closed.
    pub idle_timeout_ms: u64,
    /// The largest message a session may send (a statement's text, a Bind's parameters).
    /// Before authentication only the startup and password messages, of at most 10,000
    /// bytes, are read.
    pub max_message_bytes: usize,
    /// Named prepared statements and portals one session may hold.
    pub max_prepared: usize,
    /// The bytes of those (statement text and bound parameters) one session may hold.
    pub max_prepared_bytes: usize,
    /// The bytes of every session's prepared statements and portals together.
    pub max_prepared_bytes_total: usize,
}

impl Pg {
    pub fn default_listen() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 8432))
    }

    /// The listener at `listen` with every limit at its default.
    pub fn at(listen: SocketAddr) -> Pg {
        Pg {
            listen,
            ..Pg::default()
        }
    }

    /// Checks the values that no type can.
    fn validate(&self) -> Result<(), ConfigError> {
        let pg = self;
        for (name, value) in [
            ("pg.max_connections", pg.max_connections as u64),
            ("pg.max_starting", pg.max_starting as u64),
            ("pg.startup_timeout_ms", pg.startup_timeout_ms),
            ("pg.idle_timeout_ms", pg.idle_timeout_ms),
            ("pg.max_prepared_bytes", pg.max_prepared_bytes as u64),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid(format!("{name} must be > 0")));
            }
        }
        // Below it a password or a short statement could not be sent at all.
        if pg.max_message_bytes < PG_MIN_MESSAGE_BYTES {
            return Err(ConfigError::Invalid(format!(
                "pg.max_message_bytes must be at least {PG_MIN_MESSAGE_BYTES}"
            )));
        }
        if pg.max_prepared_bytes_total < pg.max_prepared_bytes {
            return Err(ConfigError::Invalid(format!(
                "pg.max_prepared_bytes_total ({}) must be at least pg.max_prepared_bytes ({})",
                pg.max_prepared_bytes_total, pg.max_prepared_bytes
            )));
        }
        Ok(())
    }

    pub fn startup_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.startup_timeout_ms)
    }

    pub fn idle_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.idle_timeout_ms)
    }
}

impl Default for Pg {
    fn default() -> Self {
        Pg {
            listen: Pg::default_listen(),
            max_connections: 256,
            max_starting: 64,
            startup_timeout_ms: 10_000,
            // PostgreSQL never closes an idle session by default; a bound is kept here so that
            // forgotten sessions give their slots back, long enough for pooled connections.
            idle_timeout_ms: 3_600_000,
            max_message_bytes: 16 << 20,
            max_prepared: 1_000,
            max_prepared_bytes: 16 << 20,
            max_prepared_bytes_total: 256 << 20,
        }
    }
}

/// Where and when old segments move to object storage (`tidemark_engine::tier`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    /// `s3://bucket/prefix`.
    pub url: String,
    /// `http(s)://host:port` of an S3-compatible server; absent for AWS.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// A segment moves once its newest event is this old (a duration: `1h`, `7d`).
    #[serde(default = "Tier::default_after")]
    pub after: String,
    #[serde(default = "Tier::default_cache_bytes")]
    pub local_cache_bytes: u64,
    #[serde(default = "Tier::default_check_every")]
    pub check_every: String,
}

impl Tier {
    /// The tier at `url` with every other setting at its default.
    pub fn new(url: &str) -> Tier {
        Tier {
            url: url.to_string(),
            endpoint: None,
            region: None,
            after: Tier::default_after(),
            local_cache_bytes: Tier::default_cache_bytes(),
            check_every: Tier::default_check_every(),
        }
    }

    fn default_after() -> String {
        "1d".into()
    }

    fn default_cache_bytes() -> u64 {
        1 << 30
    }

    fn default_check_every() -> String {
        "10s".into()
    }

    /// The engine's options for this tier: its bucket (credentials as AWS tools find
    /// them), checked but not contacted yet.
    pub fn options(&self) -> Result<tidemark_engine::TierOptions, ConfigError> {
        let invalid = |e: &dyn std::fmt::Display| ConfigError::Invalid(format!("tier: {e}"));
        let duration = |name: &str, text: &str| {
            tidemark_query::time::parse_duration(text)
                .map(|ns| std::time::Duration::from_nanos(ns.unsigned_abs()))
                .map_err(|e| ConfigError::Invalid(format!("tier.{name}: {e}")))
        };
        let mut location =
            tidemark_tier::TierLocation::parse(&self.url).map_err(|e| invalid(&e))?;
        if let Some(endpoint) = &self.endpoint {
            location = location.with_endpoint(endpoint);
        }
        if let Some(region) = &self.region {
            location = location.with_region(region);
        }
        let interval = duration("check_every", &self.check_every)?;
        if interval.is_zero() {
            return Err(invalid(&"check_every must be above 0"));
        }
        let after = duration("after", &self.after)?;
        let bucket = tidemark_tier::Bucket::open(location, None).map_err(|e| invalid(&e))?;
        Ok(tidemark_engine::TierOptions {
            bucket: tidemark_tier::BlockingBucket::new(bucket).map_err(|e| invalid(&e))?,
            after,
            cache_bytes: self.local_cache_bytes,
            interval,
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("tidemark-data"),
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
            binary: SocketAddr::from(([127, 0, 0, 1], 8081)),
            node_id: 1,
            cluster: None,
            limits: Limits::default(),
            auth: Auth::default(),
            tls: None,
            graphite: None,
            pg: None,
            tier: None,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 64 << 20,
            max_in_flight_bytes: 256 << 20,
            retry_after_ms: 200,
            // Above the 15 s for which common clients (ureq, requests' urllib3) keep an idle
            // connection for reuse, so that they do not reuse one the server just closed.
            read_timeout_ms: 20_000,
            shutdown_grace_ms: 10_000,
            max_result_bytes: 64 << 20,
            query_timeout_ms: 300_000,
            query_memory_bytes: 1 << 30,
            query_spill_bytes: 4 << 30,
            min_free_disk_bytes: 2 << 30,
            max_value_bytes: 16 << 20,
            max_concurrent_queries: 64,
            max_binary_connections: 1024,
            max_pending_clears: 1024,
            max_subscriptions: 1024,
        }
    }
}

impl Auth {
    pub fn is_enabled(&self) -> bool {
        self.read_token.is_some() || self.write_token.is_some()
    }
}

/// The smallest `pg.max_message_bytes`: PostgreSQL's own limit on messages before
/// authentication.
pub const PG_MIN_MESSAGE_BYTES: usize = 10_000;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Reads a TOML configuration file; missing keys take their defaults.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let config: Config = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source: Box::new(source),
        })?;
        Ok(config)
    }

    /// Checks the values that no type can: called before the server starts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let limits = &self.limits;
        if limits.max_body_bytes == 0 {
            return Err(ConfigError::Invalid(
                "limits.max_body_bytes must be > 0".into(),
            ));
        }
        // Otherwise one request of the largest allowed size could never be admitted and
        // its client would retry forever.
        if limits.max_in_flight_bytes < limits.max_body_bytes {
            return Err(ConfigError::Invalid(format!(
                "limits.max_in_flight_bytes ({}) must be at least limits.max_body_bytes ({})",
                limits.max_in_flight_bytes, limits.max_body_bytes
            )));
        }
        for (name, value) in [
            ("limits.read_timeout_ms", limits.read_timeout_ms),
            ("limits.query_timeout_ms", limits.query_timeout_ms),
            ("limits.max_result_bytes", limits.max_result_bytes as u64),
            ("limits.max_value_bytes", limits.max_value_bytes as u64),
            (
                "limits.max_concurrent_queries",
                limits.max_concurrent_queries as u64,
            ),
            (
                "limits.max_binary_connections",
                limits.max_binary_connections as u64,
            ),
            (
                "limits.max_pending_clears",
                limits.max_pending_clears as u64,
            ),
            ("limits.max_subscriptions", limits.max_subscriptions as u64),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid(format!("{name} must be > 0")));
            }
        }
        for (name, token) in [
            ("auth.read_token", &self.auth.read_token),
            ("auth.write_token", &self.auth.write_token),
        ] {
            if token.as_deref().is_some_and(|t| t.len() < 16) {
                return Err(ConfigError::Invalid(format!(
                    "{name} must be at least 16 characters"
                )));
            }
        }
        if let Some(pg) = &self.pg {
            pg.validate()?;
        }
        if let Some(graphite) = &self.graphite {
            if graphite.max_fields < 2 {
                return Err(ConfigError::Invalid(
                    "graphite.max_fields must be at least 2 (path and value)".into(),
                ));
            }
            tidemark_core::name::validate_new_stream_name(&graphite.stream)
                .map_err(|e| ConfigError::Invalid(format!("graphite.stream: {e}")))?;
        }
        self.replicated_tier_options()?;
        Ok(())
    }

    /// The tier options of the replicated store, with `[tier]`. A cluster node tiers its
    /// own segments under `node-<id>` inside the prefix (docs/tiering.md, "In a cluster"):
    /// one `[tier]` section serves every node.
    pub fn replicated_tier_options(
        &self,
    ) -> Result<Option<tidemark_engine::TierOptions>, ConfigError> {
        let Some(tier) = &self.tier else {
            return Ok(None);
        };
        let options = tier.options()?;
        if self.cluster.is_none() {
            return Ok(Some(options));
        }
        options
            .within(&format!("node-{}", self.node_id))
            .map(Some)
            .map_err(|e| ConfigError::Invalid(format!("tier: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_overrides_only_what_it_names() {
        let config: Config = toml::from_str(
            "http = \"127.0.0.1:9000\"\n[limits]\nmax_body_bytes = 1024\n[auth]\nwrite_token = \"0123456789abcdef\"\n[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"",
        )
        .unwrap();
        assert_eq!(config.http.port(), 9000);
        assert_eq!(config.binary, Config::default().binary);
        assert_eq!(config.limits.max_body_bytes, 1024);
        assert_eq!(
            config.limits.retry_after_ms,
            Limits::default().retry_after_ms
        );
        assert!(config.auth.is_enabled());
        assert_eq!(
            config.tls.as_ref().map(|t| t.key.clone()),
            Some(PathBuf::from("k.pem"))
        );
        config.validate().unwrap();
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert!(toml::from_str::<Config>("htp = \"127.0.0.1:9000\"").is_err());
        assert!(toml::from_str::<Config>("http = \"nowhere\"").is_err());
        let mut config = Config::default();
        config.limits.max_in_flight_bytes = config.limits.max_body_bytes - 1;
        assert!(config.validate().is_err());
        let mut config = Config::default();
        config.auth.read_token = Some("short".into());
        assert!(config.validate().is_err());
    }

    #[test]
    fn a_tier_section_names_its_bucket_and_durations() {
        let config: Config = toml::from_str(
            "[tier]\nurl = \"s3://my-bucket/node-1\"\nendpoint = \"http://127.0.0.1:9000\"\nafter = \"2h\"",
        )
        .unwrap();
        config.validate().unwrap();
        let options = config.tier.as_ref().unwrap().options().unwrap();
        assert_eq!(options.after, std::time::Duration::from_secs(7200));
        assert_eq!(options.interval, std::time::Duration::from_secs(10));
        assert_eq!(options.cache_bytes, 1 << 30);
        assert_eq!(options.bucket.location().url(), "s3://my-bucket/node-1");

        for (bad, says) in [
            ("url = \"my-bucket/x\"", "s3://"),
            ("url = \"s3://my-bucket\"\nafter = \"soon\"", "tier.after"),
            (
                "url = \"s3://my-bucket\"\ncheck_every = \"0s\"",
                "check_every",
            ),
        ] {
            let config: Config = toml::from_str(&format!("[tier]\n{bad}")).unwrap();
            let error = config.validate().unwrap_err().to_string();
            assert!(error.contains(says), "{bad}: {error}");
        }
        // A cluster node tiers under a part of the prefix of its own.
        let mut clustered = config.clone();
        clustered.cluster = Some("cluster.toml".into());
        clustered.node_id = 2;
        clustered.validate().unwrap();
        let options = clustered.replicated_tier_options().unwrap().unwrap();
        assert_eq!(
            options.bucket.location().url(),
            "s3://my-bucket/node-1/node-2"
        );
        let embedded = config.replicated_tier_options().unwrap().unwrap();
        assert_eq!(embedded.bucket.location().url(), "s3://my-bucket/node-1");
    }

    #[test]
    fn the_sql_limits_are_read_and_checked() {
        let config: Config = toml::from_str(
            "[limits]\nquery_memory_bytes = 1000\nquery_spill_bytes = 0\nmin_free_disk_bytes = 5\nmax_value_bytes = 7\nmax_concurrent_queries = 3",
        )
        .unwrap();
        let limits = &config.limits;
        assert_eq!(
            (
                limits.query_memory_bytes,
                limits.query_spill_bytes,
                limits.min_free_disk_bytes,
                limits.max_value_bytes,
                limits.max_concurrent_queries
            ),
            (1000, 0, 5, 7, 3)
        );
        config.validate().unwrap();
        let defaults = Limits::default();
        assert_eq!(defaults.query_memory_bytes, 1 << 30);
        assert_eq!(defaults.query_spill_bytes, 4 << 30);
        for refused in ["max_value_bytes = 0", "max_concurrent_queries = 0"] {
            let config: Config = toml::from_str(&format!("[limits]\n{refused}")).unwrap();
            assert!(config.validate().is_err(), "{refused}");
        }
    }
}

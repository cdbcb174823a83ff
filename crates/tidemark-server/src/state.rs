//! What every handler shares: the stores, admission control, metrics, pending clear
//! requests, and the configuration.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_cluster::Cluster;
use tidemark_core::sync::IgnorePoison;
use tidemark_engine::{Db, Engine, OpenError, Options};
use tidemark_sql::system_catalog::SystemCatalog;
use tidemark_sql::{PlanCache, QueryResources, ResourceLimits, SqlOptions};

use crate::admission::Admission;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::{Store, StoreError, StoreErrorKind};

/// Which store a request addresses. On a single node both live in one process; in a
/// cluster only `Replicated` is replicated, `Local` never leaves the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Namespace {
    Replicated,
    Local,
}

impl Namespace {
    pub fn label(self) -> &'static str {
        match self {
            Namespace::Replicated => "replicated",
            Namespace::Local => "local",
        }
    }
}

/// The largest body of a control request (stream creation, retention, a query, membership):
/// JSON of a few fields. Such bodies draw on their own budget
/// ([`AppState::control_admission`]), so that reads and control requests never take room
/// from appends, nor appends from them.
pub const MAX_CONTROL_BODY: usize = 1 << 20;

/// Bytes of control and query request bodies in flight at once, over all connections
/// (each at most [`MAX_CONTROL_BODY`]).
pub const CONTROL_IN_FLIGHT_BYTES: usize = 64 << 20;
// One control body of the largest size must fit in the control budget.
const _: () = assert!(CONTROL_IN_FLIGHT_BYTES >= MAX_CONTROL_BODY);

/// How long a clear token stays valid.
pub const CLEAR_TOKEN_TTL: Duration = Duration::from_secs(300);

#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    replicated: Store,
    local: Store,
    admission: Arc<Admission>,
    control_admission: Arc<Admission>,
    metrics: Metrics,
    config: Config,
    started: Instant,
    clear_requests: Mutex<HashMap<String, ClearRequest>>,
    /// SQL statements planned before, for the replicated namespace (the one SQL reads).
    plans: PlanCache,
    /// What all SQL queries share: their memory pool, spill space and slots.
    sql: Arc<QueryResources>,
    /// The replicated namespace's `pg_catalog`, whose oids clients keep between queries.
    system_catalog: SystemCatalog,
    /// More Prometheus text for `/metrics`, from a program built on the server (the agent).
    extra_metrics: std::sync::OnceLock<ExtraMetrics>,
    /// Slots of reads that follow a stream (`limits.max_subscriptions`).
    subscriptions: Arc<tokio::sync::Semaphore>,
    /// Set when the server stops: follows end (they would hold their connections open for
    /// ever, past the shutdown grace).
    stopping: tokio::sync::watch::Sender<bool>,
}

/// Renders more Prometheus text for `/metrics` (a program built on the server gives it with
/// its HTTP front).
pub type ExtraMetrics = Arc<dyn Fn() -> String + Send + Sync>;

struct ClearRequest {
    namespace: Namespace,
    stream: String,
    issued: Instant,
}

/// How many SQL statements a server keeps planned: more than a dashboard's panels, each a
/// few kilobytes.
const PLANNED_STATEMENTS: usize = 256;

/// The directory of the node-local store inside the data directory.
pub const LOCAL_DIR: &str = "local";

/// The directory SQL queries spill to, inside the data directory (on the disk whose free
/// space `limits.min_free_disk_bytes` keeps): emptied whenever the server starts.
pub const SPILL_DIR: &str = "query-spill";

impl AppState {
    /// Opens the stores under `config.data_dir`: the node-local one in `local/` beneath it,
    /// and the replicated one either embedded in the directory itself (so the CLI's
    /// `--data-dir` reads it directly) or, when given (a cluster's replica, an agent's
    /// spool), that one.
    pub fn open(
        config: Config,
        options: Options,
        replicated: Option<Store>,
    ) -> Result<AppState, OpenError> {
        // Only the replicated store tiers (a cluster's replica was given its tier when the
        // cluster started): the node-local one is small, and its segment ids would collide
        // with the replicated store's under one prefix.
        let local_options = Options {
            tier: None,
            ..options.clone()
        };
        let replicated = match replicated {
            Some(store) => store,
            None => {
                let options = Options {
                    tier: config
                        .replicated_tier_options()
                        .map_err(|e| OpenError::InvalidOptions(e.to_string()))?,
                    ..options
                };
                Store::Embedded(Arc::new(Db::open(&config.data_dir, options)?))
            }
        };
        let local = Db::open(config.data_dir.join(LOCAL_DIR), local_options)?;
        let limits = &config.limits;
        let max_subscriptions = limits.max_subscriptions;
        let spill_dir = config.data_dir.join(SPILL_DIR);
        let sql = QueryResources::new(ResourceLimits {
            memory_bytes: limits.query_memory_bytes,
            spill_bytes: limits.query_spill_bytes,
            spill_dir: spill_dir.clone(),
            min_free_disk_bytes: limits.min_free_disk_bytes,
            // A value is held by its query: no larger than what a query may hold.
            max_value_bytes: limits.max_value_bytes.min(limits.max_result_bytes),
            max_queries: limits.max_concurrent_queries,
        })
        .map_err(|e| {
            OpenError::InvalidOptions(format!(
                "the query spill directory {}: {e}",
                spill_dir.display()
            ))
        })?;
        let system_catalog = {
            let store = replicated.clone();
            SystemCatalog::new(move || store.db())
        };
        Ok(AppState {
            inner: Arc::new(Inner {
                replicated,
                local: Store::Embedded(Arc::new(local)),
                admission: Admission::new(config.limits.max_in_flight_bytes),
                control_admission: Admission::new(CONTROL_IN_FLIGHT_BYTES),
                metrics: Metrics::default(),
                config,
                started: Instant::now(),
                clear_requests: Mutex::new(HashMap::new()),
                plans: PlanCache::new(PLANNED_STATEMENTS),
                sql,
                system_catalog,
                extra_metrics: std::sync::OnceLock::new(),
                subscriptions: Arc::new(tokio::sync::Semaphore::new(max_subscriptions)),
                stopping: tokio::sync::watch::channel(false).0,
            }),
        })
    }

    /// A slot for a read that follows a stream, held while it runs; `None` while
    /// `limits.max_subscriptions` others run.
    pub fn subscription_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.inner.subscriptions.clone().try_acquire_owned().ok()
    }

    /// Tells the reads that follow a stream to end: the server is stopping.
    pub fn stop_subscriptions(&self) {
        self.inner.stopping.send_replace(true);
    }

    /// Changes to `true` when the server stops (see [`AppState::stop_subscriptions`]).
    pub fn stopping(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.stopping.subscribe()
    }

    /// Reads that follow a stream now.
    pub fn subscriptions(&self) -> usize {
        self.inner.config.limits.max_subscriptions - self.inner.subscriptions.available_permits()
    }

    /// The local database that answers reads of `namespace`.
    pub fn db(&self, namespace: Namespace) -> Engine {
        self.store(namespace).db()
    }

    /// Adds `render`'s text to `/metrics` (once; later calls change nothing).
    pub fn set_extra_metrics(&self, render: ExtraMetrics) {
        let _ = self.inner.extra_metrics.set(render);
    }

    /// The text a program built on the server adds to `/metrics`.
    pub fn extra_metrics(&self) -> Option<String> {
        self.inner.extra_metrics.get().map(|render| render())
    }

    /// SQL statements planned before ([`tidemark_sql::plans`]).
    pub fn plans(&self) -> &PlanCache {
        &self.inner.plans
    }

    /// What all SQL queries share ([`tidemark_sql::resources`]).
    pub fn sql_resources(&self) -> &Arc<QueryResources> {
        &self.inner.sql
    }

    /// How a SQL query of a client runs: `limits.max_result_bytes` of memory at most, within
    /// what all queries share. The caller sets its stop (deadline, client gone).
    pub fn sql_options(&self) -> SqlOptions {
        SqlOptions {
            memory_bytes: self.inner.config.limits.max_result_bytes,
            resources: Some(self.inner.sql.clone()),
            system_catalog: Some(self.inner.system_catalog.clone()),
            ..SqlOptions::default()
        }
    }

    /// Where writes to `namespace` go.
    pub fn store(&self, namespace: Namespace) -> &Store {
        match namespace {
            Namespace::Replicated => &self.inner.replicated,
            Namespace::Local => &self.inner.local,
        }
    }

    /// The cluster this node belongs to, if it runs as a cluster node.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.inner.replicated.cluster()
    }

    /// The budget of append bodies (`limits.max_in_flight_bytes`).
    pub fn admission(&self) -> &Arc<Admission> {
        &self.inner.admission
    }

    /// The budget of control and query bodies, apart from the appends' so that neither
    /// can starve the other.
    pub fn control_admission(&self) -> &Arc<Admission> {
        &self.inner.control_admission
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn data_dir(&self) -> &Path {
        &self.inner.config.data_dir
    }

    pub fn uptime(&self) -> Duration {
        self.inner.started.elapsed()
    }

    pub fn retry_after_ms(&self) -> u32 {
        self.inner.config.limits.retry_after_ms
    }

    /// Issues a single-use token that confirms clearing `stream`; refused (overloaded) while
    /// `limits.max_pending_clears` others await confirmation.
    pub fn issue_clear_token(
        &self,
        namespace: Namespace,
        stream: &str,
    ) -> Result<String, StoreError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| StoreError::internal(format!("no randomness for a token: {e}")))?;
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut pending = self.clear_requests();
        pending.retain(|_, r| r.issued.elapsed() < CLEAR_TOKEN_TTL);
        let bound = self.inner.config.limits.max_pending_clears;
        if pending.len() >= bound {
            // Refused rather than evicting another's: a token handed out stays good for its
            // five minutes.
            return Err(StoreError::new(
                StoreErrorKind::Overloaded,
                format!(
                    "{bound} clear requests await confirmation (limits.max_pending_clears): \
                     confirm one, or retry once one expires"
                ),
            ));
        }
        pending.insert(
            token.clone(),
            ClearRequest {
                namespace,
                stream: stream.to_string(),
                issued: Instant::now(),
            },
        );
        assert!(
            pending.len() <= bound,
            "at most the bound of clear requests pending"
        );
        Ok(token)
    }

    /// Takes the clear request of `token` if it is valid for `stream` and not expired. A
    /// confirmation that names another stream is refused and leaves the token valid for its
    /// own (a client's slip must not cost it the request); an expired token is removed.
    pub fn redeem_clear_token(&self, token: &str, stream: &str) -> Option<Namespace> {
        let mut pending = self.clear_requests();
        let request = pending.get(token)?;
        if request.issued.elapsed() >= CLEAR_TOKEN_TTL {
            pending.remove(token);
            return None;
        }
        if request.stream != stream {
            return None;
        }
        pending.remove(token).map(|request| request.namespace)
    }

    fn clear_requests(&self) -> std::sync::MutexGuard<'_, HashMap<String, ClearRequest>> {
        self.inner.clear_requests.lock().ignore_poison()
    }
}

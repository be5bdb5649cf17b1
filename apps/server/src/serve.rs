//! Running the service: [`Config`] — what a door (`whyslow server`, a
//! test, an embedding program) asks for, validated where it is built —
//! opened into the handlers' [`AppState`], and [`serve`], which answers on
//! a socket (HTTP or HTTPS) and keeps the store (retention, compaction)
//! until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::objects::{ObjectLocation, Objects};
use crate::symbols::SymbolStore;
use crate::{router, AppState, ClickHouseConfig, ClickHouseStore, SqliteStore, Store, StoreError};

/// Where the service keeps its data.
#[derive(Debug, Clone)]
pub enum StoreChoice {
    /// The embedded store (SQLite and columnar segments) in a directory.
    Embedded(PathBuf),
    /// ClickHouse, for scale.
    ClickHouse(ClickHouseConfig),
}

impl StoreChoice {
    /// Opens the store, with a line that says which.
    pub fn open(&self) -> Result<(Box<dyn Store>, String), ConfigError> {
        match self {
            StoreChoice::Embedded(dir) => {
                let store = SqliteStore::open(dir).map_err(|source| ConfigError::Open {
                    what: format!("the store in {}", dir.display()),
                    source,
                })?;
                Ok((Box::new(store), format!("data {}", dir.display())))
            }
            StoreChoice::ClickHouse(cfg) => {
                let store =
                    ClickHouseStore::open(cfg.clone()).map_err(|source| ConfigError::Open {
                        what: format!("the ClickHouse store at {}", cfg.url),
                        source,
                    })?;
                Ok((
                    Box::new(store),
                    format!("ClickHouse {}, database {}", cfg.url, cfg.database),
                ))
            }
        }
    }
}

/// Fix proposals from a model (EROICA's first step), asked for from a
/// session page; never by default.
#[derive(Clone)]
pub struct FixConfig {
    /// The model.
    pub endpoint: whyslow_pipeline::suggest::Endpoint,
    /// The jobs' code, so excerpts go with the findings.
    pub source_roots: Vec<PathBuf>,
    /// Seconds for one exchange with the model.
    pub timeout_s: f64,
}

impl std::fmt::Debug for FixConfig {
    // The endpoint holds the key: it is left out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixConfig")
            .field("source_roots", &self.source_roots)
            .field("timeout_s", &self.timeout_s)
            .finish_non_exhaustive()
    }
}

/// What the service is asked to run with.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where its data is kept.
    pub store: StoreChoice,
    /// Where uploaded symbols are kept, when not in the data directory or
    /// the object store.
    pub symbols: Option<PathBuf>,
    /// Object storage for symbol files and the archive of raw uploads.
    pub objects: Option<ObjectLocation>,
    /// Seconds after upload when the embedded store moves a profile into a
    /// columnar segment.
    pub compact_after_s: u64,
    /// Days uploads are kept.
    pub retention_days: u32,
    /// Fix proposals (None: off).
    pub fix: Option<FixConfig>,
}

/// Why the service cannot start as configured.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A setting out of its range.
    #[error("{0}")]
    Invalid(String),
    /// A store that does not open.
    #[error("opening {what}: {source}")]
    Open {
        /// Which.
        what: String,
        /// Why.
        #[source]
        source: StoreError,
    },
}

impl Config {
    /// Refuses settings that cannot be used, whichever door built them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(f) = &self.fix {
            if !(f.timeout_s.is_finite() && f.timeout_s > 0.0) {
                return Err(ConfigError::Invalid(format!(
                    "--llm-timeout {}: want seconds > 0",
                    f.timeout_s
                )));
            }
        }
        Ok(())
    }

    /// Opens the stores into the handlers' state, with a line that says
    /// where the data is.
    pub fn open(self) -> Result<(Arc<AppState>, String), ConfigError> {
        self.validate()?;
        let (store, mut said) = self.store.open()?;
        let objects = match &self.objects {
            Some(loc) => Some(Arc::new(Objects::open(loc).map_err(|source| {
                ConfigError::Open {
                    what: format!("the object store {loc}"),
                    source,
                }
            })?)),
            None => None,
        };
        let symbols = self.symbols_store(objects.as_ref())?;
        if let Some(o) = &objects {
            said = format!("{said}; objects in {}", o.location());
        }
        let fix = self.fix.map(|f| {
            crate::fix::FixSetting::new(
                f.endpoint,
                f.source_roots,
                f.timeout_s,
                whyslow_fix::DEFAULT_MAX_CODE_BYTES,
            )
        });
        let state = AppState {
            retention_days: self.retention_days,
            compact_after_s: self.compact_after_s,
            store,
            symbols,
            raw: objects,
            metrics: Default::default(),
            fix,
            tokens: Default::default(),
            identities: Default::default(),
        };
        Ok((Arc::new(state), said))
    }

    /// The symbol store: in the object store (index copies kept locally,
    /// per data directory or per process), else `symbols`, else the data
    /// directory's `symbols/`; none with ClickHouse alone.
    fn symbols_store(
        &self,
        objects: Option<&Arc<Objects>>,
    ) -> Result<Option<SymbolStore>, ConfigError> {
        let data = match &self.store {
            StoreChoice::Embedded(dir) => Some(dir),
            StoreChoice::ClickHouse(_) => None,
        };
        let open = |what: String, r: Result<SymbolStore, StoreError>| {
            r.map(Some)
                .map_err(|source| ConfigError::Open { what, source })
        };
        match (objects, &self.symbols, data) {
            (Some(o), _, _) => {
                let cache = match data {
                    Some(d) => d.join("symbol-cache"),
                    None => std::env::temp_dir()
                        .join(format!("whyslow-symbol-cache-{}", std::process::id())),
                };
                open(
                    format!("the symbol store in {}", o.location()),
                    SymbolStore::with_objects(o.clone(), "symbols", &cache),
                )
            }
            (None, Some(dir), _) => open(
                format!("the symbol store {}", dir.display()),
                SymbolStore::open(dir),
            ),
            (None, None, Some(data)) => {
                let dir = data.join("symbols");
                open(
                    format!("the symbol store {}", dir.display()),
                    SymbolStore::open(&dir),
                )
            }
            (None, None, None) => Ok(None),
        }
    }
}

/// Seconds since the Unix epoch, now.
pub(crate) fn now_unix_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Serves `router` on `listen` (over TLS with `tls`) until SIGINT/SIGTERM;
/// `on_bound` gets the bound address (port 0 picks a free one).
pub async fn serve(
    state: Arc<AppState>,
    listen: SocketAddr,
    tls: Option<Tls>,
    on_bound: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    // Retention: every hour, uploads older than the retention go.
    let keeper = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
        loop {
            tick.tick().await;
            let st = keeper.clone();
            let cutoff = now_unix_s() - i64::from(st.retention_days.max(1)) * 86_400;
            match tokio::task::spawn_blocking(move || st.store.expire(cutoff)).await {
                Ok(Ok(n)) if n > 0 => eprintln!(
                    "whyslow: retention: removed {n} uploads older than {} days",
                    keeper.retention_days
                ),
                Ok(Err(e)) => eprintln!("whyslow: retention failed: {e}"),
                _ => {}
            }
        }
    });
    // Profiles a few minutes old move into columnar segments (the embedded
    // store; recent ones stay rows, so retries of recent batches dedup on
    // them and the newest profiles read without a segment).
    let compactor = state.clone();
    tokio::spawn(async move {
        let every = compactor.compact_after_s.clamp(1, 60);
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(every));
        loop {
            tick.tick().await;
            let st = compactor.clone();
            let before = now_unix_s() - st.compact_after_s as i64;
            match tokio::task::spawn_blocking(move || st.store.compact(before)).await {
                Ok(Ok((moved, written))) => {
                    let m = &compactor.metrics;
                    m.profiles_compacted.inc_by(moved);
                    m.compactions.inc_by(written);
                }
                Ok(Err(e)) => eprintln!("whyslow: compacting profiles failed: {e}"),
                Err(_) => {}
            }
        }
    });
    let stopped = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    let Some(tls) = tls else {
        on_bound(listener.local_addr()?);
        return axum::serve(listener, router(state))
            .with_graceful_shutdown(stopped)
            .await;
    };
    // rustls with the ring provider (installed once per process).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = axum_server::tls_rustls::RustlsConfig::from_pem_file(&tls.cert, &tls.key)
        .await
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "TLS certificate {} / key {}: {e}",
                    tls.cert.display(),
                    tls.key.display()
                ),
            )
        })?;
    let std_listener = listener.into_std()?;
    on_bound(std_listener.local_addr()?);
    let handle = axum_server::Handle::new();
    let stopper = handle.clone();
    tokio::spawn(async move {
        stopped.await;
        stopper.graceful_shutdown(Some(std::time::Duration::from_secs(10)));
    });
    axum_server::from_tcp_rustls(std_listener, config)
        .handle(handle)
        .serve(router(state).into_make_service())
        .await
}

/// A PEM certificate chain and its private key, for HTTPS.
#[derive(Debug, Clone)]
pub struct Tls {
    /// Certificate chain (PEM).
    pub cert: std::path::PathBuf,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: std::path::PathBuf,
}

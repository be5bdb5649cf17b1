//! `whyslow server` (issue 14): the central service, and `whyslow server
//! token create` for its tenants' bearer tokens.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use whyslow_server::objects::ObjectLocation;
use whyslow_server::{
    ClickHouseConfig, ClickHouseStore, Config, FixConfig, SqliteStore, StoreChoice, Tls,
};

/// `whyslow server`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ServerArgs {
    #[command(subcommand)]
    command: Option<ServerCommand>,
    /// Data directory (the embedded store: SQLite).
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    #[command(flatten)]
    clickhouse: ClickHouseArgs,
    /// Where uploaded symbols are kept (default: DATA/symbols with --data;
    /// with --clickhouse, symbol upload is off unless this or
    /// --object-store is given).
    #[arg(long, value_name = "DIR", conflicts_with = "object_store")]
    symbols: Option<PathBuf>,
    #[command(flatten)]
    objects: ObjectArgs,
    /// Seconds after upload when the embedded store moves a profile from
    /// its SQLite row into a compressed columnar segment under
    /// DATA/segments (checked every minute at most).
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    compact_after: u64,
    /// Address to listen on (port 0: any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Let session pages ask a model for a fix (EROICA's first step; a
    /// button, never by default): the model is WHYSLOW_LLM_URL,
    /// WHYSLOW_LLM_MODEL and WHYSLOW_LLM_API_KEY (or _FILE), read at start.
    #[arg(long)]
    suggest_fix: bool,
    /// With --suggest-fix: the jobs' code, so excerpts go with the findings
    /// (without it, only the findings are sent). Repeatable.
    #[arg(long, value_name = "DIR", requires = "suggest_fix")]
    source_root: Vec<PathBuf>,
    /// With --suggest-fix: seconds for one exchange with the model.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 120.0,
        requires = "suggest_fix"
    )]
    llm_timeout: f64,
}

/// Object storage for symbol files and raw uploads.
#[derive(Args, Debug, Clone)]
struct ObjectArgs {
    /// Object storage for symbol files (under symbols/) and an archive of
    /// every accepted upload as it came (under raw/): s3://BUCKET[/PREFIX]
    /// (credentials and region from AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION; unsigned requests without them)
    /// or file:///DIR.
    #[arg(long, value_name = "URL")]
    object_store: Option<String>,
    /// The endpoint of an S3-compatible server (MinIO, SeaweedFS, …), e.g.
    /// http://127.0.0.1:8333 (path-style requests).
    #[arg(long, value_name = "URL", requires = "object_store")]
    s3_endpoint: Option<String>,
}

impl ObjectArgs {
    fn open(&self) -> Result<Option<whyslow_server::objects::Objects>> {
        let Some(url) = &self.object_store else {
            return Ok(None);
        };
        let loc = whyslow_server::objects::ObjectLocation::parse(url, self.s3_endpoint.as_deref())?;
        let o = whyslow_server::objects::Objects::open(&loc)
            .with_context(|| format!("opening the object store {loc}"))?;
        Ok(Some(o))
    }
}

/// The scale-out store instead of `--data`.
#[derive(Args, Debug, Clone)]
struct ClickHouseArgs {
    /// ClickHouse's HTTP endpoint (e.g. http://127.0.0.1:8123): store
    /// tokens, fingerprints and profiles there instead of in --data.
    #[arg(long, value_name = "URL")]
    clickhouse: Option<String>,
    /// ClickHouse database (created if missing).
    #[arg(long, default_value = "whyslow", value_name = "NAME")]
    clickhouse_database: String,
    /// ClickHouse user; the password comes from $WHYSLOW_CLICKHOUSE_PASSWORD.
    #[arg(long, value_name = "USER")]
    clickhouse_user: Option<String>,
    /// Days fingerprints, profiles and collective records are kept
    /// (ClickHouse: a TTL; the embedded store: removed every hour).
    #[arg(long, default_value_t = 30, value_name = "DAYS")]
    retention_days: u32,
}

impl ClickHouseArgs {
    fn config(&self, url: &str, database: &str) -> ClickHouseConfig {
        ClickHouseConfig {
            url: url.to_string(),
            database: database.to_string(),
            user: self.clickhouse_user.clone(),
            password: std::env::var("WHYSLOW_CLICKHOUSE_PASSWORD").ok(),
            retention_days: self.retention_days,
        }
    }
}

/// The store `--data` or `--clickhouse` names.
fn store_choice(data: Option<&PathBuf>, ch: &ClickHouseArgs) -> Result<StoreChoice> {
    match (data, &ch.clickhouse) {
        (Some(_), Some(_)) => anyhow::bail!("give --data DIR or --clickhouse URL, not both"),
        (None, Some(url)) => Ok(StoreChoice::ClickHouse(ch.config(url, &ch.clickhouse_database))),
        (Some(dir), None) => Ok(StoreChoice::Embedded(dir.clone())),
        (None, None) => anyhow::bail!(
            "--data DIR (the embedded store) or --clickhouse URL is required (where the server keeps its data)"
        ),
    }
}

#[derive(Subcommand, Debug)]
enum ServerCommand {
    /// Bearer tokens of tenants.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Runs the storage conformance checks (the ones every backend passes in
    /// whyslow's tests) against a scratch store: a temporary SQLite
    /// directory, or a scratch database of --clickhouse that is dropped
    /// afterwards. Exit 0 when the backend behaves.
    CheckStore {
        #[command(flatten)]
        clickhouse: ClickHouseArgs,
        /// Also check this object store (objects are written under a
        /// scratch prefix and deleted).
        #[command(flatten)]
        objects: ObjectArgs,
    },
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Creates a tenant (if new) and a token for it; prints the token as the
    /// last line (only its hash is stored: keep it).
    Create {
        /// Data directory of the server.
        #[arg(long, value_name = "DIR")]
        data: Option<PathBuf>,
        #[command(flatten)]
        clickhouse: ClickHouseArgs,
        /// Tenant name (letters, digits, -_.:@).
        #[arg(long)]
        tenant: String,
    },
}

/// Runs `whyslow server …`.
pub fn run(args: ServerArgs) -> Result<u8> {
    match args.command {
        Some(ServerCommand::Token(TokenCommand::Create {
            data,
            clickhouse,
            tenant,
        })) => {
            let (store, _) = store_choice(data.as_ref(), &clickhouse)?.open()?;
            let token = store.create_token(&tenant)?;
            eprintln!("whyslow: new token for tenant {tenant:?} (shown once; the server keeps only its hash):");
            println!("{token}");
            Ok(0)
        }
        Some(ServerCommand::CheckStore {
            clickhouse,
            objects,
        }) => {
            if let Some(o) = objects.open()? {
                whyslow_server::objects::conformance(&o)
                    .map_err(|e| anyhow::anyhow!("the object store {}: {e}", o.location()))?;
                eprintln!(
                    "whyslow: the object store {} passes the conformance checks",
                    o.location()
                );
            }
            let scratch = format!(
                "whyslow_check_{}_{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis())
                    .unwrap_or(0)
            );
            let result = match &clickhouse.clickhouse {
                Some(url) => {
                    let store = ClickHouseStore::open(clickhouse.config(url, &scratch))
                        .with_context(|| format!("opening a scratch database at {url}"))?;
                    let r = whyslow_server::conformance(&store);
                    store
                        .drop_database()
                        .with_context(|| format!("dropping the scratch database {scratch}"))?;
                    r.map(|()| format!("ClickHouse at {url} (scratch database {scratch}, dropped)"))
                }
                None => {
                    let dir = std::env::temp_dir().join(&scratch);
                    let store = SqliteStore::open(&dir)
                        .with_context(|| format!("opening {}", dir.display()))?;
                    let r = whyslow_server::conformance(&store);
                    drop(store);
                    let _ = std::fs::remove_dir_all(&dir);
                    r.map(|()| "the embedded SQLite store".to_string())
                }
            };
            match result {
                Ok(what) => {
                    eprintln!("whyslow: {what} passes the storage conformance checks");
                    Ok(0)
                }
                Err(e) => anyhow::bail!("{e}"),
            }
        }
        None => serve(args),
    }
}

/// `whyslow server` without a subcommand: the service until SIGINT/SIGTERM.
fn serve(args: ServerArgs) -> Result<u8> {
    let fix = if args.suggest_fix {
        let endpoint = whyslow_pipeline::suggest::endpoint_from_env()
            .map_err(|e| anyhow::anyhow!("--suggest-fix: {e}"))?;
        eprintln!(
            "whyslow server: session pages may ask {} at {} for fixes",
            endpoint.model, endpoint.base
        );
        Some(FixConfig {
            endpoint,
            source_roots: args.source_root.clone(),
            timeout_s: args.llm_timeout,
        })
    } else {
        None
    };
    let objects = match &args.objects.object_store {
        Some(url) => Some(ObjectLocation::parse(
            url,
            args.objects.s3_endpoint.as_deref(),
        )?),
        None => None,
    };
    let config = Config {
        store: store_choice(args.data.as_ref(), &args.clickhouse)?,
        symbols: args.symbols.clone(),
        objects,
        compact_after_s: args.compact_after,
        retention_days: args.clickhouse.retention_days,
        fix,
    };
    let (state, data) = config.open()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(Tls {
            cert: cert.clone(),
            key: key.clone(),
        }),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    rt.block_on(whyslow_server::serve(state, args.listen, tls, |addr| {
        eprintln!("whyslow: server listening on {scheme}://{addr} ({data})");
    }))
    .with_context(|| format!("serving on {}", args.listen))?;
    eprintln!("whyslow: server stopped");
    Ok(0)
}

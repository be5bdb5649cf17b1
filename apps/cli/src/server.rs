//! `whyslow server` (issue 14): the central service, and `whyslow server
//! token create` for its tenants' bearer tokens.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use whyslow_server::{AppState, SqliteStore, Store};

/// `whyslow server`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ServerArgs {
    #[command(subcommand)]
    command: Option<ServerCommand>,
    /// Data directory (the embedded store: SQLite).
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Address to listen on (port 0: any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
}

#[derive(Subcommand, Debug)]
enum ServerCommand {
    /// Bearer tokens of tenants.
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Creates a tenant (if new) and a token for it; prints the token as the
    /// last line (only its hash is stored: keep it).
    Create {
        /// Data directory of the server.
        #[arg(long, value_name = "DIR")]
        data: PathBuf,
        /// Tenant name (letters, digits, -_.:@).
        #[arg(long)]
        tenant: String,
    },
}

/// Runs `whyslow server …`.
pub fn run(args: ServerArgs) -> Result<u8> {
    match args.command {
        Some(ServerCommand::Token(TokenCommand::Create { data, tenant })) => {
            let store = SqliteStore::open(&data)
                .with_context(|| format!("opening the store in {}", data.display()))?;
            let token = store.create_token(&tenant)?;
            eprintln!("whyslow: new token for tenant {tenant:?} (shown once; the server keeps only its hash):");
            println!("{token}");
            Ok(0)
        }
        None => {
            let data = args
                .data
                .context("--data DIR is required (where the server keeps its store)")?;
            let store = SqliteStore::open(&data)
                .with_context(|| format!("opening the store in {}", data.display()))?;
            let state = Arc::new(AppState {
                store: Box::new(store),
                metrics: Default::default(),
            });
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(whyslow_server::serve(state, args.listen, |addr| {
                eprintln!(
                    "whyslow: server listening on http://{addr} (data {})",
                    data.display()
                );
            }))
            .with_context(|| format!("serving on {}", args.listen))?;
            eprintln!("whyslow: server stopped");
            Ok(0)
        }
    }
}

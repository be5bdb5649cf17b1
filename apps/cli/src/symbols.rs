//! `whyslow symbols upload`: ELF files (stripped binaries' debug files, or
//! the binaries themselves) to `whyslow server`, once per Build-ID and in
//! parts, so that profiles from nodes without symbols are named centrally
//! (SysOM-AI §3.4).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

/// `whyslow symbols`.
#[derive(Args, Debug)]
pub struct SymbolsArgs {
    #[command(subcommand)]
    command: SymbolsCommand,
}

#[derive(Subcommand, Debug)]
enum SymbolsCommand {
    /// Uploads ELF files' symbol tables to a server under their Build-ID
    /// (skipped when the server has it already).
    Upload {
        /// ELF files (executables, shared libraries, separate debug files).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The server, e.g. http://host:7070 or https://host:7070.
        #[arg(long)]
        server: String,
        /// File holding the tenant's bearer token.
        #[arg(long, value_name = "FILE")]
        token_file: PathBuf,
        /// PEM file of the CA certificates an https:// server's certificate
        /// must chain to (default: Mozilla's root certificates).
        #[arg(long, value_name = "PEM")]
        ca_file: Option<PathBuf>,
        /// Size of the parts a file is sent in (at most 64 MiB).
        #[arg(long, default_value_t = 64.0, value_name = "MIB")]
        part_mib: f64,
    },
}

/// Runs `whyslow symbols …`.
pub fn run(args: SymbolsArgs) -> Result<u8> {
    let SymbolsCommand::Upload {
        files,
        server,
        token_file,
        ca_file,
        part_mib,
    } = args.command;
    if !(part_mib > 0.0 && part_mib <= 64.0) {
        bail!("--part-mib {part_mib}: expected more than 0 and at most 64");
    }
    let part = ((part_mib * 1048576.0) as usize).max(1);
    let token = std::fs::read_to_string(&token_file)
        .with_context(|| format!("reading the token from {}", token_file.display()))?
        .trim()
        .to_string();
    let agent =
        whyslow_agent::upload::http_client(Duration::from_secs(300), false, ca_file.as_deref())?;
    let base = server.trim_end_matches('/');
    let auth = format!("Bearer {token}");
    let mut failed = 0;
    for f in &files {
        let id = match whyslow_stacks::elf::ElfModule::open(f) {
            Ok(m) => m.build_id,
            Err(e) => {
                eprintln!("whyslow: {}: skipped: {e}", f.display());
                failed += 1;
                continue;
            }
        };
        let Some(id) = id else {
            eprintln!(
                "whyslow: {}: skipped: the file has no Build-ID",
                f.display()
            );
            failed += 1;
            continue;
        };
        let url = format!("{base}/api/v1/symbols/{id}");
        let mut r = agent
            .get(&url)
            .header("Authorization", &auth)
            .call()
            .with_context(|| format!("asking {url}"))?;
        match r.status().as_u16() {
            200 => {
                eprintln!(
                    "whyslow: {}: the server has Build-ID {id} already",
                    f.display()
                );
                continue;
            }
            404 => {}
            code => bail!(
                "{url} answered {code}: {}",
                r.body_mut().read_to_string().unwrap_or_default()
            ),
        }
        let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        let parts: Vec<&[u8]> = bytes.chunks(part).collect();
        let of = parts.len();
        for (i, p) in parts.iter().enumerate() {
            let url = format!("{base}/api/v1/symbols/{id}/parts/{i}?of={of}");
            let mut r = agent
                .put(&url)
                .header("Authorization", &auth)
                .send(*p)
                .with_context(|| format!("sending part {i} of {of} of {}", f.display()))?;
            let code = r.status().as_u16();
            let body = r.body_mut().read_to_string().unwrap_or_default();
            match code {
                201 => eprintln!(
                    "whyslow: {}: Build-ID {id}: {of} part(s), indexed: {}",
                    f.display(),
                    body.trim()
                ),
                202 => {}
                _ => bail!(
                    "{}: part {i} of {of}: {url} answered {code}: {}",
                    f.display(),
                    body.trim()
                ),
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

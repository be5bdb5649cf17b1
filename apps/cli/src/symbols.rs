//! `whyslow symbols upload`: ELF files (stripped binaries' debug files, or
//! the binaries themselves) to `whyslow server`, once per Build-ID and in
//! parts, so that profiles from nodes without symbols are named centrally
//! (SysOM-AI §3.4).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use whyslow_agent::symbols;

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
        /// The program or library a separate debug file among FILES belongs
        /// to (same Build-ID; repeat for several): profiles carry offsets in
        /// the program's file, which only its load segments map to the debug
        /// file's addresses.
        #[arg(long, value_name = "FILE")]
        module: Vec<PathBuf>,
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
        module,
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
    let mut failed = 0;
    for f in &files {
        let id = match whyslow_stacks::elf::build_id_of(f) {
            Ok(Some(id)) => id,
            Ok(None) => {
                eprintln!(
                    "whyslow: {}: skipped: the file has no Build-ID",
                    f.display()
                );
                failed += 1;
                continue;
            }
            Err(e) => {
                eprintln!("whyslow: {}: skipped: {e}", f.display());
                failed += 1;
                continue;
            }
        };
        // A separate debug file needs the load segments of its program.
        let layout = match whyslow_stacks::elf::ElfModule::open(f) {
            Ok(m) if !m.code_in_file => {
                let of_module = module.iter().find(|p| {
                    whyslow_stacks::elf::build_id_of(p)
                        .ok()
                        .flatten()
                        .is_some_and(|b| b == id)
                });
                let Some(p) = of_module else {
                    eprintln!(
                        "whyslow: {}: skipped: a separate debug file; pass the program or library \
                         with Build-ID {id} as --module FILE",
                        f.display()
                    );
                    failed += 1;
                    continue;
                };
                Some(
                    whyslow_stacks::symindex::layout_of(p)
                        .with_context(|| format!("reading {}", p.display()))?,
                )
            }
            _ => None,
        };
        match symbols::send(&agent, &server, &token, &id, (f, layout.as_deref()), part) {
            Ok(symbols::Sent::Had) => eprintln!(
                "whyslow: {}: the server has Build-ID {id} already",
                f.display()
            ),
            Ok(symbols::Sent::Indexed { parts, answer }) => eprintln!(
                "whyslow: {}: Build-ID {id}: {parts} part(s), indexed: {answer}",
                f.display()
            ),
            Err(symbols::SendError::Read(e)) => {
                eprintln!("whyslow: {}: skipped: {e}", f.display());
                failed += 1;
            }
            Err(e) => bail!("{}: {e}", f.display()),
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

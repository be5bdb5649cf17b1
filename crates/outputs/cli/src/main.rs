//! `whyslow`: which function, on which workers, is slowing a training job, and why.
//!
//! The binary is glue over the library crates: `whyslow-ingest` reads traces,
//! `whyslow-summarize` builds fingerprints (PerfTracker §4.2),
//! `whyslow-localize` names abnormal (function, workers) (§4.3) and
//! `whyslow-report` renders the result.
//!
//! Exit codes (documented in the README):
//! - 0: the analysis ran (whether or not it found anomalies);
//! - 1: an error stopped it (nothing readable, an output not writable, a bad
//!   file under `--strict`, a bad config);
//! - 2: bad command line;
//! - 3: anomalies were found and `--fail-on-anomaly` was given;
//! - 4: the data could not support a verdict (no worker had events).

mod agent;
mod commands;
mod flows;
mod sample;

use std::io::{self, Write};
use std::process::ExitCode;

use clap::Parser;

use commands::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match commands::run(cli) {
        Ok(code) => code,
        Err(err) => {
            // A closed pipe (`whyslow analyze … | head`) is not an error.
            if err
                .chain()
                .filter_map(|e| e.downcast_ref::<io::Error>())
                .any(|e| e.kind() == io::ErrorKind::BrokenPipe)
            {
                return ExitCode::SUCCESS;
            }
            let _ = io::stdout().flush();
            let chain: Vec<String> = err.chain().map(|e| e.to_string()).collect();
            eprintln!("whyslow: error: {}", chain.join(": "));
            ExitCode::from(1)
        }
    }
}

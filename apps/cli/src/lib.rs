//! `whyslow`: which function, on which workers, is slowing a training job, and why.
//!
//! The command line is glue over the library crates: `whyslow-ingest` reads
//! traces, `whyslow-summarize` builds fingerprints (PerfTracker §4.2),
//! `whyslow-localize` names abnormal (function, workers) (§4.3) and
//! `whyslow-report` renders the result. It is a library too, so that the
//! Python package runs the same command (`python -m whyslow analyze …`).
//!
//! Exit codes (documented in docs/commands/analyze.md):
//! - 0: the analysis ran (whether or not it found anomalies);
//! - 1: an error stopped it (nothing readable, an output not writable, a bad
//!   file under `--strict`, traces of different jobs, a bad config);
//! - 2: bad command line;
//! - 3: anomalies were found and `--fail-on-anomaly` was given;
//! - 4: the data could not support a verdict (no worker had events).

use std::ffi::OsString;
use std::io::{self, Write};

use clap::Parser;

#[cfg(feature = "node")]
mod collectives;
mod commands;
mod diagnose;
mod flows;
mod hang;
mod profile;
#[cfg(feature = "node")]
mod record;
mod sample;
#[cfg(feature = "server")]
mod server;
#[cfg(feature = "node")]
mod symbols;

/// Runs the `whyslow` command line on `args` (the program name first) and
/// returns its exit code; errors are printed to stderr as one line.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    if let Some(line) = args
        .get(1)
        .and_then(|a| a.to_str())
        .and_then(absent_command)
    {
        eprintln!("whyslow: {line}");
        return 2;
    }
    let cli = match commands::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are "errors" that print to stdout and exit 0.
            let _ = e.print();
            return u8::try_from(e.exit_code()).unwrap_or(2);
        }
    };
    match commands::run(cli) {
        Ok(code) => code,
        Err(err) => {
            // A closed pipe (`whyslow analyze … | head`) is not an error.
            if err
                .chain()
                .filter_map(|e| e.downcast_ref::<io::Error>())
                .any(|e| e.kind() == io::ErrorKind::BrokenPipe)
            {
                return 0;
            }
            let _ = io::stdout().flush();
            eprintln!("whyslow: error: {}", error_line(&err));
            1
        }
    }
}

/// An error and its causes in one line, each cause said once: a message
/// that already quotes its cause (most library errors do) is not followed
/// by that cause again.
pub fn error_line(err: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for e in err.chain() {
        let text = e.to_string();
        if parts.iter().any(|p| p.contains(&text)) {
            continue;
        }
        parts.push(text);
    }
    parts.join(": ")
}

/// Commands this build left out (the Python wheel's command line has no
/// node agent or server): one line saying where they are.
fn absent_command(name: &str) -> Option<String> {
    let node = ["agent", "profile", "collectives", "symbols"];
    let left_out = (!cfg!(feature = "node") && node.contains(&name))
        || (!cfg!(feature = "server") && name == "server");
    left_out.then(|| {
        format!(
            "`whyslow {name}` is in the full binary, not in this build (the Python package's): \
             install it with `cargo install --locked --path apps/cli` from a clone, or use the \
             image (docs/deploy.md)"
        )
    })
}

#[cfg(test)]
mod error_line_tests {
    #[test]
    fn each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        #[derive(Debug)]
        struct Quoting(std::io::Error);
        impl std::fmt::Display for Quoting {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "/x.json: {}", self.0)
            }
        }
        impl std::error::Error for Quoting {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = anyhow::Error::new(Quoting(io)).context("reading the topology");
        assert_eq!(
            super::error_line(&e),
            "reading the topology: /x.json: No such file or directory"
        );
    }
}

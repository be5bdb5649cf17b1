//! Reads a node agent's spool (what `whyslow agent --profile-spool` writes,
//! one directory per host or all in one, searched recursively) into
//! [`DiagnoseEvidence`] for the cross-layer diagnosis (SysOM-AI §3.1):
//!
//! * `*.pb.gz`: stack profiles (pprof), of ranks, their blocked time, or
//!   whole hosts;
//! * `*.collectives.jsonl`: collective records (SysOM-AI §3.2), one
//!   `whyslow_model::collective::CollectiveRecord` per line;
//! * `*.os.jsonl`: OS signal readings, one `whyslow_model::os::OsSample`
//!   per line.
//!
//! A file or line that does not parse is skipped and said in the evidence's
//! notes; only a directory that cannot be read is an error.
#![deny(missing_docs)]

use std::path::{Path, PathBuf};

use whyslow_model::diagnosis::DiagnoseEvidence;

/// A spool that cannot be read at all.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct SpoolError {
    /// The file or directory.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

/// What a spool held besides its evidence.
#[derive(Debug, Clone, Default)]
pub struct Spool {
    /// The evidence.
    pub evidence: DiagnoseEvidence,
    /// Profile files found (`*.pb.gz`), readable or not.
    pub profile_files: usize,
}

fn files(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) -> Result<(), SpoolError> {
    let rd = std::fs::read_dir(dir).map_err(|source| SpoolError {
        path: dir.to_path_buf(),
        source,
    })?;
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, suffix, out)?;
        } else if p.to_string_lossy().ends_with(suffix) {
            out.push(p);
        }
    }
    Ok(())
}

/// Every record of the `*SUFFIX` files under `dir`, one JSON value per
/// line, files in name order; lines that do not parse are skipped and
/// counted in a note.
pub fn jsonl_records<T: serde::de::DeserializeOwned>(
    dir: &Path,
    suffix: &str,
    notes: &mut Vec<String>,
) -> Result<Vec<T>, SpoolError> {
    let mut paths = Vec::new();
    files(dir, suffix, &mut paths)?;
    paths.sort();
    let mut out = Vec::new();
    for f in paths {
        let text = std::fs::read(&f).map_err(|source| SpoolError {
            path: f.clone(),
            source,
        })?;
        let mut file = whyslow_codec::JsonlValues::<T>::default();
        file.push_batch(&String::from_utf8_lossy(&text));
        if !file.bad.is_empty() {
            notes.push(format!(
                "{}: {} line(s) skipped ({})",
                f.display(),
                file.bad.len(),
                file.bad
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        out.append(&mut file.values);
    }
    Ok(out)
}

/// Reads the spool under `dir`.
pub fn read_spool(dir: &Path) -> Result<Spool, SpoolError> {
    let mut paths = Vec::new();
    files(dir, ".pb.gz", &mut paths)?;
    paths.sort();
    let mut evidence = DiagnoseEvidence::default();
    for f in &paths {
        let bytes = std::fs::read(f).map_err(|source| SpoolError {
            path: f.clone(),
            source,
        })?;
        match whyslow_codec::from_pprof(&bytes) {
            Ok(p) => evidence.profiles.push(p),
            Err(e) => evidence.notes.push(format!(
                "skipped {}: not a readable profile: {e}",
                f.display()
            )),
        }
    }
    evidence.collectives = jsonl_records(dir, ".collectives.jsonl", &mut evidence.notes)?;
    evidence.os_samples = jsonl_records(dir, ".os.jsonl", &mut evidence.notes)?;
    Ok(Spool {
        evidence,
        profile_files: paths.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_and_lines_are_noted_and_the_rest_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host-a");
        std::fs::create_dir_all(&host).unwrap();
        std::fs::write(host.join("rank-0.pb.gz"), b"not a profile").unwrap();
        std::fs::write(
            host.join("rank-0.os.jsonl"),
            "{\"nonsense\": 1}\n\n\u{0}\u{ff}garbage\n",
        )
        .unwrap();
        let spool = read_spool(dir.path()).unwrap();
        assert_eq!(spool.profile_files, 1);
        assert!(spool.evidence.profiles.is_empty());
        assert!(spool.evidence.os_samples.is_empty());
        let notes = spool.evidence.notes.join("\n");
        assert!(
            notes.contains("rank-0.pb.gz: not a readable profile"),
            "{notes}"
        );
        assert!(
            notes.contains("rank-0.os.jsonl: 2 line(s) skipped"),
            "{notes}"
        );
        assert!(read_spool(&dir.path().join("absent")).is_err());
    }
}

//! Uploads the stack profiles from the spool to `whyslow server` (the
//! ranks' under their job, the node's under each job with a rank on it),
//! and the ranks' collective records once each period's file is complete
//! (SysOM-AI §3.4: nodes send profiles to a central service that keeps and
//! shows them; §7: a node buffers while the service is away). The spool is
//! the buffer: a profile is uploaded after it is written, retried while the
//! server does not answer, and dropped only by the spool's own size cap.
//! Each upload carries a batch id made of the node and the file's name, so
//! a retry after a lost answer is stored once.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::events::AgentEvent;

/// The oldest host profile uploaded: its period ran beside the jobs on the
/// node now.
const HOST_MAX_AGE: Duration = Duration::from_secs(120);

/// Where and as whom to upload.
#[derive(Debug, Clone)]
pub struct Upload {
    /// The server's base URL (`http://host:7070` or `https://…`).
    pub server: String,
    /// The tenant's bearer token.
    pub token: String,
    /// This node's name (part of each batch id).
    pub node: String,
    /// PEM file of the CA certificates an `https://` server's certificate
    /// must chain to; `None`: Mozilla's root certificates.
    pub ca_file: Option<PathBuf>,
    /// Also send the symbol files of the profiled modules
    /// (`--upload-symbols`).
    pub symbols: Option<crate::symbols::SymbolUploads>,
}

/// An HTTP client for `whyslow server`: plain HTTP, or HTTPS (rustls)
/// checked against the certificates of `ca_file` (PEM), else against
/// Mozilla's root certificates. An unreadable or empty CA file is an error
/// naming it.
pub fn http_client(
    timeout: Duration,
    status_as_error: bool,
    ca_file: Option<&Path>,
) -> anyhow::Result<ureq::Agent> {
    use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};
    let roots = match ca_file {
        None => RootCerts::WebPki,
        Some(f) => {
            let pem = fs::read(f).map_err(|e| anyhow::anyhow!("--ca-file {}: {e}", f.display()))?;
            let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                anyhow::bail!("--ca-file {}: no PEM certificate in it", f.display());
            }
            RootCerts::new_with_certs(&certs)
        }
    };
    Ok(ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(status_as_error)
        .tls_config(TlsConfig::builder().root_certs(roots).build())
        .build()
        .into())
}

/// The characters a batch id may hold (the server's name rule).
fn id_part(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.:@".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The spool's profiles to upload, oldest name first, as (job, file,
/// batch id suffix): each rank profile (`<job>/<…>.pb.gz`) once under its
/// job; each host profile (`host/…`: every process of the node) under each
/// of `jobs` (the jobs with a rank on this node, each with when it was last
/// seen registered) seen at or after the profile's period began (what ran
/// beside them: a job that ended before the next pass still gets the
/// periods it ran in), when it is younger than [`HOST_MAX_AGE`] (an older
/// period may be from before those jobs started).
fn spooled(
    spool: &Path,
    jobs: &[(String, SystemTime)],
    last: bool,
) -> Vec<(String, PathBuf, String)> {
    let mut out: Vec<(String, PathBuf, String)> = rank_files(spool, last)
        .into_iter()
        .map(|(j, p)| (j, p, String::new()))
        .collect();
    if let Ok(files) = fs::read_dir(spool.join("host")) {
        for f in files.flatten() {
            let p = f.path();
            let young = f
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default() < HOST_MAX_AGE);
            if p.to_string_lossy().ends_with(".pb.gz") && young {
                let began = period_start(&p);
                for (j, seen) in jobs {
                    if began.is_none_or(|b| *seen >= b) {
                        out.push((j.clone(), p.clone(), format!("@{}", id_part(j))));
                    }
                }
            }
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    out
}

/// When a host profile's period began: the Unix seconds its name ends with
/// (`<node>-host-<s>.pb.gz`).
fn period_start(path: &Path) -> Option<SystemTime> {
    let name = path.file_name()?.to_str()?.strip_suffix(".pb.gz")?;
    let secs: u64 = name.rsplit_once('-')?.1.parse().ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(secs))
}

/// Collective records and OS readings are appended to one file per rank
/// and period (`<stem>-<unix s>.collectives.jsonl`, `….os.jsonl`): a file
/// is complete once a later period's file of the same rank exists, or it
/// was left alone this long.
const RECORDS_SETTLED: Duration = Duration::from_secs(60);

/// Record files by suffix, and where the server takes them
/// (`/api/v1/jobs/{job}/{what}/{batch}`): what the server's diagnosis reads
/// beside the profiles.
const RECORD_KINDS: [(&str, &str); 2] =
    [(".collectives.jsonl", "collectives"), (".os.jsonl", "os")];

/// The record kind of a file name: (suffix, what).
fn record_kind(name: &str) -> Option<(&'static str, &'static str)> {
    RECORD_KINDS
        .into_iter()
        .find(|(suffix, _)| name.ends_with(suffix))
}

/// Whether a record file is complete (see [`RECORDS_SETTLED`]).
fn records_complete(path: &Path, siblings: &[PathBuf]) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some((suffix, _)) = record_kind(&name) else {
        return true;
    };
    let Some((stem, t)) = name.trim_end_matches(suffix).rsplit_once('-') else {
        return true;
    };
    let t: u64 = t.parse().unwrap_or(0);
    let later = siblings.iter().any(|p| {
        let n = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        n.ends_with(suffix)
            && n.trim_end_matches(suffix)
                .rsplit_once('-')
                .is_some_and(|(s, u)| s == stem && u.parse::<u64>().unwrap_or(0) > t)
    });
    later
        || fs::metadata(path)
            .and_then(|m| m.modified())
            .is_ok_and(|m| m.elapsed().unwrap_or_default() >= RECORDS_SETTLED)
}

/// The rank profiles and complete record files of the spool
/// (all record files on the `last` pass), by job directory.
fn rank_files(spool: &Path, last: bool) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let Ok(jobs) = fs::read_dir(spool) else {
        return out;
    };
    for job in jobs.flatten() {
        let Ok(name) = job.file_name().into_string() else {
            continue;
        };
        if name == "host" || name.starts_with('.') || !job.path().is_dir() {
            continue;
        }
        let Ok(files) = fs::read_dir(job.path()) else {
            continue;
        };
        let files: Vec<PathBuf> = files.flatten().map(|f| f.path()).collect();
        for p in &files {
            let n = p.to_string_lossy();
            if n.ends_with(".pb.gz")
                || (record_kind(&n).is_some() && (last || records_complete(p, &files)))
            {
                out.push((name.clone(), p.clone()));
            }
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out
}

/// Why an upload did not go.
enum Refused {
    /// The server refused this profile (400, 404, 413: it cannot be
    /// stored as it is); the others still go.
    This(String),
    /// The server is away, overloaded or refuses us (401): later, all.
    Later(String),
}

/// One file to the server (`what`: `profiles`, `collectives` or `os`):
/// `Ok(true)` stored now, `Ok(false)` it had it.
fn post(
    up: &Upload,
    agent: &ureq::Agent,
    what: &str,
    job: &str,
    batch: &str,
    body: &[u8],
) -> Result<bool, Refused> {
    let url = format!(
        "{}/api/v1/jobs/{}/{what}/{}",
        up.server.trim_end_matches('/'),
        id_part(job),
        batch
    );
    match agent
        .post(&url)
        .header("Authorization", &format!("Bearer {}", up.token))
        .header("Content-Type", "application/octet-stream")
        .send(body)
    {
        Ok(r) => Ok(r.status().as_u16() == 201),
        Err(ureq::Error::StatusCode(code @ (400 | 404 | 413))) => {
            Err(Refused::This(format!("HTTP {code} for {url}")))
        }
        Err(ureq::Error::StatusCode(code)) => Err(Refused::Later(format!("HTTP {code} for {url}"))),
        Err(e) => Err(Refused::Later(e.to_string())),
    }
}

/// Sends the symbol files of the modules in `body` (a stored profile) that
/// the server may lack; a server that went away is logged by the next
/// profile upload, and the modules are offered again with a later profile.
fn offer_symbols(
    up: &Upload,
    agent: &ureq::Agent,
    symbols: &mut crate::symbols::SymbolUploader,
    body: &[u8],
) {
    // Profiles are the agent's own: a bound on their decompressed size only
    // guards against a spool file replaced by something else.
    let Ok(profile) = whyslow_stack_output::from_pprof_limited(body, 256 << 20) else {
        return;
    };
    if let Ok(o) = symbols.offer(agent, &up.server, &up.token, &profile) {
        if !o.sent.is_empty() || !o.skipped.is_empty() {
            AgentEvent::SymbolsUploaded {
                server: &up.server,
                sent: &o.sent,
                had: o.had,
                skipped: &o.skipped,
            }
            .emit();
        }
    }
}

/// Uploads what the spool holds every `every` until `stop`; the last pass
/// runs after `stop` so a short job's profiles still go.
/// `registrations` is the agent's directory, whose live registrations name
/// the jobs host profiles go to.
pub fn run(
    up: Upload,
    spool: PathBuf,
    registrations: PathBuf,
    every: Duration,
    stop: Arc<AtomicBool>,
) {
    let agent = match http_client(Duration::from_secs(30), true, up.ca_file.as_deref()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("whyslow agent: uploads off: {e}");
            return;
        }
    };
    let mut done: HashSet<(PathBuf, String)> = HashSet::new();
    // Jobs seen registered, and when last: host profiles go to the jobs
    // that ran in their period, though the job may have ended since.
    let mut seen: HashMap<String, SystemTime> = HashMap::new();
    let mut failing = false;
    let mut symbols = up.symbols.clone().map(crate::symbols::SymbolUploader::new);
    loop {
        let last = stop.load(Ordering::Relaxed);
        let (mut stored, mut dup) = (0usize, 0usize);
        let now = SystemTime::now();
        for r in crate::registry::live(&registrations) {
            if !r.job.is_empty() {
                seen.insert(r.job, now);
            }
        }
        seen.retain(|_, t| now.duration_since(*t).unwrap_or_default() < HOST_MAX_AGE);
        let mut jobs: Vec<(String, SystemTime)> = seen.clone().into_iter().collect();
        jobs.sort();
        let files = spooled(&spool, &jobs, last);
        // Files the cap removed are forgotten.
        done.retain(|(p, _)| p.exists());
        for (job, path, suffix) in files {
            let key = (path.clone(), job.clone());
            if done.contains(&key) {
                continue;
            }
            // Profiles are written atomically, record files appended to:
            // skip one that may still be written to (younger than a second).
            let fresh = fs::metadata(&path)
                .and_then(|m| m.modified())
                .map(|t| t.elapsed().unwrap_or_default() < Duration::from_secs(1))
                .unwrap_or(true);
            if fresh && !last {
                continue;
            }
            let Ok(body) = fs::read(&path) else { continue };
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let (what, stem) = match record_kind(&name) {
                Some((suffix, what)) => (what, name.trim_end_matches(suffix).to_string()),
                None => ("profiles", name.trim_end_matches(".pb.gz").to_string()),
            };
            // A period without a record leaves an empty file: nothing to send.
            if what != "profiles" && body.iter().all(u8::is_ascii_whitespace) {
                done.insert(key);
                continue;
            }
            let batch = id_part(&format!("{}@{stem}{suffix}", up.node));
            match post(&up, &agent, what, &job, &batch, &body) {
                Ok(new) => {
                    if new {
                        stored += 1
                    } else {
                        dup += 1
                    }
                    done.insert(key);
                    failing = false;
                    if let (Some(s), "profiles") = (symbols.as_mut(), what) {
                        offer_symbols(&up, &agent, s, &body);
                    }
                }
                Err(Refused::This(reason)) => {
                    // A profile the server cannot take (a file cut short by
                    // a crash) must not hold back the ones after it.
                    AgentEvent::UploadFailed {
                        server: &up.server,
                        reason: format!("{}: {reason}; skipped", path.display()),
                    }
                    .emit();
                    done.insert(key);
                }
                Err(Refused::Later(reason)) => {
                    if !failing {
                        AgentEvent::UploadFailed {
                            server: &up.server,
                            reason,
                        }
                        .emit();
                    }
                    failing = true;
                    break;
                }
            }
        }
        if stored + dup > 0 {
            AgentEvent::Uploaded {
                server: &up.server,
                profiles: stored,
                duplicates: dup,
            }
            .emit();
        }
        if last {
            return;
        }
        let t0 = Instant::now();
        while t0.elapsed() < every && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_ids_keep_to_the_servers_names_and_host_profiles_go_to_each_job() {
        assert_eq!(id_part("node 1/a.b@c"), "node_1_a.b@c");
        let d = std::env::temp_dir().join(format!("whyslow-upload-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        for f in [
            "job-a/h-rank0-pid1-10.pb.gz",
            "job-a/h-rank0-pid1-10.pb.gz.tmp",
            "host/h-host-10.pb.gz",
            "job-b/x.pb.gz",
        ] {
            let p = d.join(f);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, b"x").unwrap();
        }
        let now = SystemTime::now();
        let jobs = [("job-a".to_string(), now), ("job b".to_string(), now)];
        let got: Vec<_> = spooled(&d, &jobs, false)
            .into_iter()
            .map(|(j, p, s)| (j, p.file_name().unwrap().to_string_lossy().into_owned(), s))
            .collect();
        let row = |j: &str, f: &str, s: &str| (j.to_string(), f.to_string(), s.to_string());
        assert_eq!(
            got,
            vec![
                row("job b", "h-host-10.pb.gz", "@job_b"),
                row("job-a", "h-host-10.pb.gz", "@job-a"),
                row("job-a", "h-rank0-pid1-10.pb.gz", ""),
                row("job-b", "x.pb.gz", "")
            ]
        );
        // No job on the node: host profiles wait.
        assert_eq!(spooled(&d, &[], false).len(), 2);
        // A job last seen before a host period began does not get it; one
        // seen since does, though it is gone now.
        fs::write(d.join("host/h-host-2000000000.pb.gz"), b"x").unwrap();
        let before = UNIX_EPOCH + Duration::from_secs(1_999_999_990);
        let after = UNIX_EPOCH + Duration::from_secs(2_000_000_002);
        let host_files = |jobs: &[(String, SystemTime)]| {
            spooled(&d, jobs, false)
                .into_iter()
                .filter(|(_, p, _)| p.ends_with("h-host-2000000000.pb.gz"))
                .count()
        };
        assert_eq!(host_files(&[("gone".to_string(), before)]), 0);
        assert_eq!(host_files(&[("ended".to_string(), after)]), 1);
        let _ = fs::remove_dir_all(&d);
    }

    /// A rank's collective records go once their period is over: a later
    /// period's file exists, or the file was left alone a minute; the
    /// current one only on the last pass.
    #[test]
    fn collective_records_and_os_readings_go_when_their_period_is_complete() {
        let d = std::env::temp_dir().join(format!("whyslow-upload-rec-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        for f in [
            "job-a/h-rank0-pid1-100.collectives.jsonl",
            "job-a/h-rank0-pid1-130.collectives.jsonl",
            "job-a/h-rank1-pid2-130.collectives.jsonl",
            "job-a/h-rank0-pid1-100.os.jsonl",
            "job-a/h-rank0-pid1-130.os.jsonl",
        ] {
            let p = d.join(f);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, b"{}\n").unwrap();
        }
        let names = |last| -> Vec<String> {
            rank_files(&d, last)
                .into_iter()
                .map(|(_, p)| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(
            names(false),
            vec![
                "h-rank0-pid1-100.collectives.jsonl",
                "h-rank0-pid1-100.os.jsonl"
            ]
        );
        assert_eq!(names(true).len(), 5);
        assert_eq!(record_kind("x-1.os.jsonl"), Some((".os.jsonl", "os")));
        assert_eq!(record_kind("x-1.pb.gz"), None);
        // Left alone for a minute: complete.
        let old = std::time::SystemTime::now() - Duration::from_secs(120);
        let f = fs::File::options()
            .write(true)
            .open(d.join("job-a/h-rank1-pid2-130.collectives.jsonl"))
            .unwrap();
        f.set_modified(old).unwrap();
        assert_eq!(names(false).len(), 3);
        let _ = fs::remove_dir_all(&d);
    }
}

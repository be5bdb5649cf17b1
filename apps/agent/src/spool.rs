//! The profiling spool (`--profile-spool DIR`): where every collector's
//! output waits for `whyslow diagnose` and the uploader. One [`Spool`] owns
//! its layout, its writes, the rotation of record files and the size cap:
//!
//! ```text
//! DIR/<job>/<host>-rank<r>-pid<p>-<unix s>.pb.gz              CPU profile
//! DIR/<job>/<host>-rank<r>-pid<p>-offcpu-<unix s>.pb.gz       off-CPU profile
//! DIR/<job>/<host>-rank<r>-pid<p>-<unix s>.collectives.jsonl  collective records
//! DIR/<job>/<host>-rank<r>-pid<p>-<unix s>.os.jsonl           OS readings
//! DIR/host/<node>-host-<unix s>.pb.gz                         host profile
//! ```
//!
//! (`unknown-job` for a process without a job, `x` for a rank it did not
//! give, `host` for a host it did not give; other characters than
//! `[A-Za-z0-9._-]` become `_`.) Profiles are written whole and atomically
//! (a hidden temporary file in the same directory, then rename), so a
//! reader never sees half of one. Records are appended to one file per
//! process, kind and period (`--profile-period`): the first append after a
//! period starts the next file. After each profile and at each rotation the
//! oldest spool files go until the spool holds at most `--profile-spool-mib`.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::registry::Process;

/// What the agent writes into its spool: profiles, collective records, OS
/// readings (the files the cap counts).
const SPOOL_SUFFIXES: [&str; 3] = [".pb.gz", ".collectives.jsonl", ".os.jsonl"];

/// A kind of record file (appended, one per process and period).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// `*.collectives.jsonl`: `whyslow_model` collective records.
    Collectives,
    /// `*.os.jsonl`: `whyslow_model::os::OsSample` lines.
    Os,
}

impl RecordKind {
    /// The file suffix, without its leading dot.
    pub fn suffix(self) -> &'static str {
        match self {
            RecordKind::Collectives => "collectives.jsonl",
            RecordKind::Os => "os.jsonl",
        }
    }
}

/// A spool write that failed: `writing <path>: <error>`.
#[derive(Debug)]
pub struct SpoolError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub error: std::io::Error,
}

impl std::fmt::Display for SpoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "writing {}: {}", self.path.display(), self.error)
    }
}

impl std::error::Error for SpoolError {}

/// A process's record files being appended to, by process and kind.
type OpenRecords = HashMap<((i32, Option<u64>), RecordKind), Open>;

/// The record file a process is appending to.
#[derive(Debug)]
struct Open {
    path: PathBuf,
    period_start: SystemTime,
}

/// The spool: layout, atomic writes, rotation and the size cap, shared by
/// every collector (`Arc<Spool>`; its methods take `&self`).
#[derive(Debug)]
pub struct Spool {
    root: PathBuf,
    cap_bytes: u64,
    period: Duration,
    records: Mutex<OpenRecords>,
}

impl Spool {
    /// The spool at `root`, holding at most `cap_bytes`, record files
    /// rotated every `period`.
    pub fn new(root: PathBuf, cap_bytes: u64, period: Duration) -> Self {
        Spool {
            root,
            cap_bytes,
            period,
            records: Mutex::new(HashMap::new()),
        }
    }

    /// The spool directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of `p`'s files: its job's.
    pub fn process_dir(&self, p: &Process) -> PathBuf {
        let job = if p.job.is_empty() {
            "unknown-job".to_string()
        } else {
            file_name_part(&p.job)
        };
        self.root.join(job)
    }

    /// `<job>/<host>-rank<r>-pid<p>[-<tag>]-<unix_s>.<suffix>`: a file of
    /// `p` (suffix without its dot).
    pub fn process_file(
        &self,
        p: &Process,
        tag: Option<&str>,
        unix_s: u64,
        suffix: &str,
    ) -> PathBuf {
        let tag = tag.map(|t| format!("{t}-")).unwrap_or_default();
        self.process_dir(p)
            .join(format!("{}-{tag}{unix_s}.{suffix}", file_stem(p)))
    }

    /// `host/<node>-host-<unix_s>.pb.gz`: a host profile.
    pub fn host_file(&self, node: &str, unix_s: u64) -> PathBuf {
        self.root
            .join("host")
            .join(format!("{}-host-{unix_s}.pb.gz", file_name_part(node)))
    }

    /// Writes a whole file (a profile) atomically, creating its directory,
    /// then keeps the spool under its cap.
    pub fn write(&self, path: &Path, bytes: &[u8]) -> Result<(), SpoolError> {
        let err = |error| SpoolError {
            path: path.to_path_buf(),
            error,
        };
        if let Some(d) = path.parent() {
            fs::create_dir_all(d).map_err(err)?;
        }
        write_atomic(path, bytes).map_err(err)?;
        self.enforce_cap();
        Ok(())
    }

    /// Starts `p`'s record file of `kind` now (when the collector begins
    /// with the process: its first file is named after that moment).
    pub fn start_records(&self, p: &Process, kind: RecordKind) {
        self.start_records_at(p, kind, SystemTime::now());
    }

    fn start_records_at(&self, p: &Process, kind: RecordKind, now: SystemTime) {
        let open = Open {
            path: self.process_file(p, None, unix_secs(now), kind.suffix()),
            period_start: now,
        };
        self.lock().insert((p.key(), kind), open);
    }

    /// Appends `text` to `p`'s record file of `kind`, rotating it (and
    /// keeping the spool under its cap) when its period is over.
    pub fn append(&self, p: &Process, kind: RecordKind, text: &str) -> Result<(), SpoolError> {
        self.append_at(p, kind, text, SystemTime::now())
    }

    fn append_at(
        &self,
        p: &Process,
        kind: RecordKind,
        text: &str,
        now: SystemTime,
    ) -> Result<(), SpoolError> {
        let mut records = self.lock();
        let open = records.entry((p.key(), kind)).or_insert_with(|| Open {
            path: self.process_file(p, None, unix_secs(now), kind.suffix()),
            period_start: now,
        });
        if now.duration_since(open.period_start).unwrap_or_default() >= self.period {
            open.period_start = now;
            open.path = self.process_file(p, None, unix_secs(now), kind.suffix());
            self.enforce_cap();
        }
        append(&open.path, text).map_err(|error| SpoolError {
            path: open.path.clone(),
            error,
        })
    }

    /// Forgets `p`'s record files (it exited; what was written stays).
    pub fn end_records(&self, p: &Process) {
        self.lock().retain(|(key, _), _| *key != p.key());
    }

    /// Removes the oldest spool files until the spool holds at most its
    /// cap; returns how many went.
    pub fn enforce_cap(&self) -> usize {
        enforce_cap(&self.root, self.cap_bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OpenRecords> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Removes the oldest files the agent wrote under `spool` (profiles and
/// record files, by modification time) until it holds at most `cap` bytes;
/// returns how many were removed.
pub fn enforce_cap(spool: &Path, cap: u64) -> usize {
    let mut files = Vec::new();
    let mut stack = vec![spool.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                stack.push(e.path());
            } else if SPOOL_SUFFIXES
                .iter()
                .any(|x| e.file_name().to_string_lossy().ends_with(x))
            {
                let t = md.modified().unwrap_or(UNIX_EPOCH);
                files.push((t, e.path(), md.len()));
            }
        }
    }
    let mut total: u64 = files.iter().map(|f| f.2).sum();
    files.sort();
    let mut removed = 0;
    for (_, path, len) in files {
        if total <= cap {
            break;
        }
        if fs::remove_file(&path).is_ok() {
            total -= len;
            removed += 1;
        }
    }
    removed
}

/// `s` with every character but `[A-Za-z0-9._-]` replaced by `_`: a part
/// of a file name.
pub fn file_name_part(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `<host>-rank<r>-pid<p>`: the start of every spool file of a process.
pub fn file_stem(p: &Process) -> String {
    format!(
        "{}-rank{}-pid{}",
        file_name_part(if p.host.is_empty() { "host" } else { &p.host }),
        p.rank.map(|r| r.to_string()).unwrap_or_else(|| "x".into()),
        p.pid
    )
}

/// Seconds since the Unix epoch of `t` (0 before it).
pub fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Writes `bytes` to `path` atomically: a temporary file in the same
/// directory ([`tmp_path`]), synced, then renamed over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = tmp_path(path);
    let written = fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    match written.and_then(|_| fs::rename(&tmp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// `.NAME.<agent pid>.tmp` next to `path`: hidden, and with none of the
/// suffixes readers look for (`.pb.gz`, `.request.json`, …).
pub fn tmp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

/// Appends `text` to `path`, creating it and its directory.
fn append(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d)?;
    }
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use whyslow_model::wire::ProcessRegistration;

    /// A fresh directory under the system's temporary one, removed on drop.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(name: &str) -> Self {
            let d =
                std::env::temp_dir().join(format!("whyslow-spool-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&d);
            fs::create_dir_all(&d).unwrap();
            TempDir(d)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn process(pid: i32, job: &str, rank: Option<u32>) -> Process {
        let mut reg = ProcessRegistration::from_json(&format!(r#"{{"pid": {pid}}}"#)).unwrap();
        reg.job = job.into();
        reg.host = "h 1".into();
        reg.rank = rank;
        Process {
            reg,
            start_ticks: Some(5),
        }
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(d)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn the_layout_names_processes_jobs_and_the_host() {
        let s = Spool::new("/s".into(), 0, Duration::from_secs(30));
        let p = process(42, "job/a", Some(3));
        assert_eq!(
            s.process_file(&p, None, 7, "pb.gz"),
            Path::new("/s/job_a/h_1-rank3-pid42-7.pb.gz")
        );
        assert_eq!(
            s.process_file(&process(1, "", None), Some("offcpu"), 7, "pb.gz"),
            Path::new("/s/unknown-job/h_1-rankx-pid1-offcpu-7.pb.gz")
        );
        assert_eq!(s.host_file("n1", 9), Path::new("/s/host/n1-host-9.pb.gz"));
        let t = tmp_path(Path::new("/d/rank-1.done"));
        assert!(t
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(".rank-1.done."));
        assert!(t.to_string_lossy().ends_with(".tmp"));
    }

    #[test]
    fn writes_are_atomic_and_leave_no_temporary_file() {
        let d = TempDir::new("atomic");
        let s = Spool::new(d.0.clone(), u64::MAX, Duration::from_secs(30));
        let path = s.process_file(&process(1, "j", Some(0)), None, 10, "pb.gz");
        s.write(&path, b"first").unwrap();
        s.write(&path, b"second").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        assert_eq!(names(&d.0.join("j")), vec!["h_1-rank0-pid1-10.pb.gz"]);
        // A failed write names the file and leaves nothing behind.
        fs::create_dir_all(d.0.join("j/dir.pb.gz")).unwrap();
        let e = s.write(&d.0.join("j/dir.pb.gz"), b"x").unwrap_err();
        assert!(e.to_string().starts_with("writing "), "{e}");
        assert_eq!(
            names(&d.0.join("j")),
            vec!["dir.pb.gz", "h_1-rank0-pid1-10.pb.gz"]
        );
    }

    #[test]
    fn record_files_rotate_each_period() {
        let d = TempDir::new("rotate");
        let s = Spool::new(d.0.clone(), u64::MAX, Duration::from_secs(30));
        let p = process(9, "j", Some(2));
        s.start_records_at(&p, RecordKind::Collectives, at(100));
        s.append_at(&p, RecordKind::Collectives, "a\n", at(110))
            .unwrap();
        s.append_at(&p, RecordKind::Collectives, "b\n", at(129))
            .unwrap();
        // OS readings of the same process: their own file, started by the
        // first append.
        s.append_at(&p, RecordKind::Os, "o\n", at(120)).unwrap();
        s.append_at(&p, RecordKind::Collectives, "c\n", at(131))
            .unwrap();
        let j = d.0.join("j");
        assert_eq!(
            names(&j),
            vec![
                "h_1-rank2-pid9-100.collectives.jsonl",
                "h_1-rank2-pid9-120.os.jsonl",
                "h_1-rank2-pid9-131.collectives.jsonl"
            ]
        );
        let read = |n: &str| fs::read_to_string(j.join(n)).unwrap();
        assert_eq!(read("h_1-rank2-pid9-100.collectives.jsonl"), "a\nb\n");
        assert_eq!(read("h_1-rank2-pid9-131.collectives.jsonl"), "c\n");
        // A process that ended starts over; another process (a recycled
        // pid) has files of its own.
        s.end_records(&p);
        s.append_at(&p, RecordKind::Collectives, "d\n", at(140))
            .unwrap();
        let mut q = p.clone();
        q.start_ticks = Some(6);
        q.reg.rank = Some(4);
        s.append_at(&q, RecordKind::Collectives, "e\n", at(140))
            .unwrap();
        assert_eq!(read("h_1-rank2-pid9-140.collectives.jsonl"), "d\n");
        assert_eq!(read("h_1-rank4-pid9-140.collectives.jsonl"), "e\n");
    }

    #[test]
    fn the_cap_removes_the_oldest_spool_files_first() {
        let d = TempDir::new("cap");
        // Three 100-byte files, oldest first a, b, c (in two directories),
        // and a file that is not the agent's.
        for (name, age) in [
            ("j/a.pb.gz", 300),
            ("host/b.pb.gz", 200),
            ("j/c.os.jsonl", 100),
        ] {
            let p = d.0.join(name);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, [0u8; 100]).unwrap();
            let f = fs::File::options().write(true).open(&p).unwrap();
            f.set_modified(SystemTime::now() - Duration::from_secs(age))
                .unwrap();
        }
        fs::write(d.0.join("j/notes.txt"), [0u8; 1000]).unwrap();
        let s = Spool::new(d.0.clone(), 250, Duration::from_secs(30));
        assert_eq!(s.enforce_cap(), 1);
        assert_eq!(names(&d.0.join("j")), vec!["c.os.jsonl", "notes.txt"]);
        assert_eq!(names(&d.0.join("host")), vec!["b.pb.gz"]);
        // A write goes over the cap again: the oldest goes (b), the new
        // file stays.
        let s = Spool::new(d.0.clone(), 200, Duration::from_secs(30));
        s.write(&d.0.join("host/new.pb.gz"), &[0u8; 100]).unwrap();
        assert_eq!(names(&d.0.join("host")), vec!["new.pb.gz"]);
        assert_eq!(enforce_cap(&d.0, 0), 2);
        assert_eq!(names(&d.0.join("j")), vec!["notes.txt"]);
    }
}

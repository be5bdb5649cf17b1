//! Always-on CPU profiling of registered training processes (SysOM-AI §3.3):
//! every process that registered (`proc-<pid>.json` in the agent directory,
//! written by `import whyslow`) is profiled in consecutive periods; each
//! period's profile is written to the spool as gzip pprof with the process's
//! labels (job, rank, host, pid), ready to upload. The spool is bounded: the
//! oldest profiles go first.
//!
//! With `--profile-host` (or `--profile-cgroup`) the eBPF sampler profiles
//! every process of the host (or of the cgroups) too, stacks counted in the
//! kernel and drained every 5 s, one profile per period under
//! `host/` in the spool: interference often comes from a process that never
//! registered (SysOM-AI §3.3). Where eBPF cannot load, one line says why and
//! the rest of the agent goes on.
//!
//! Caps: at most `max_processes` processes at once, `hz` samples per second
//! per thread (the CPU cost is per sample, BENCHMARKS.md), and the spool's
//! size. A process that exits or whose pid was recycled is dropped.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use whyslow_model::wire::ProcessRegistration;

use crate::daemon::proc_start_ticks;
use crate::events::AgentEvent;

/// `whyslow agent` options of the always-on profiler.
#[derive(Args, Debug, Clone)]
pub struct ProfilerArgs {
    /// Profile registered processes continuously and keep their profiles
    /// (gzip pprof, one per process and period) in this spool directory.
    #[arg(long, value_name = "DIR")]
    pub profile_spool: Option<PathBuf>,
    /// Samples per second per thread.
    #[arg(long, default_value_t = 99, value_name = "HZ")]
    pub profile_hz: u64,
    /// Length of one profile, seconds.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub profile_period: f64,
    /// Spool size cap, MiB (oldest profiles removed first).
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub profile_spool_mib: u64,
    /// Most processes profiled at once.
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub profile_max_processes: usize,
    /// Also profile every process of the host with the eBPF sampler (kernel
    /// and frame-pointer stacks), into `host/` in the spool.
    #[arg(long)]
    pub profile_host: bool,
    /// Like --profile-host, limited to the processes of this cgroup directory
    /// and its descendants (repeat for several): cgroup v2 filtered in the
    /// kernel, v1 by the directories' member processes.
    #[arg(long, value_name = "DIR")]
    pub profile_cgroup: Vec<PathBuf>,
    /// This node's name in the host profiles' `host` label (default: the
    /// kernel's host name), to match the `host` its ranks register with.
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// Percent of the host profiler's ticks that take a stack (1-100).
    #[arg(long, default_value_t = 100.0, value_name = "PCT")]
    pub profile_sampling_rate: f64,
    /// How the eBPF profilers (host, cgroup, off-CPU) walk user stacks:
    /// `fp` the kernel's frame-pointer walk; `hybrid` DWARF rows from each
    /// module's .eh_frame in BPF maps, else validated frame-pointer steps
    /// (full stacks for code without frame pointers, such as CPython; costs
    /// compiling and loading each new module's rows, once per file).
    #[arg(long, default_value = "fp", value_name = "fp|dwarf|hybrid")]
    pub profile_unwind: whyslow_stacks::ebpf::UserUnwind,
    /// Also profile the registered processes' off-CPU time (eBPF on
    /// sched_switch: the µs each thread spent blocked — reads, locks,
    /// sleeps — under the kernel and user stacks it blocked with), into the
    /// spool as `*-offcpu-<t>.pb.gz` (label `kind=offcpu`, counts in µs).
    #[arg(long)]
    pub profile_offcpu: bool,
    /// Also trace the gloo collectives of registered processes (eBPF
    /// uprobes), into the spool as `*.collectives.jsonl`: the input of
    /// `whyslow diagnose`'s slow-rank detection.
    #[arg(long)]
    pub trace_collectives: bool,
    /// Seconds between two readings of each registered process's OS signals
    /// (run-queue delay, context switches, migrations, its CPUs' interrupts
    /// and softirqs) into the spool as `*.os.jsonl`; 0 turns them off.
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS")]
    pub os_interval: f64,
    /// Upload the ranks' profiles from the spool to this `whyslow server`
    /// (`http://host:7070`, or `https://…` when the server has TLS), every
    /// 5 s; while it
    /// does not answer they wait in the spool (bounded by
    /// --profile-spool-mib). The token comes from --token-file or
    /// `$WHYSLOW_TOKEN`.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// File holding the tenant's token for --server.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA certificates an https:// --server's certificate
    /// must chain to (default: Mozilla's root certificates).
    #[arg(long, value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
    /// With --server: also send the symbols of every module in the uploaded
    /// profiles to the server's store, once per Build-ID (it is asked
    /// first): the separate debug file under --debug-dir when the node has
    /// one, else the module file. The server then names frames that came
    /// without a name (SysOM-AI §3.4).
    #[arg(long)]
    pub upload_symbols: bool,
    /// Root of separate debug files, looked up as
    /// `DIR/.build-id/xx/yyyy.debug` (Debian's -dbgsym, Fedora's -debuginfo).
    #[arg(long, default_value = "/usr/lib/debug", value_name = "DIR")]
    pub debug_dir: PathBuf,
    /// Symbol files larger than this are not sent, MiB.
    #[arg(long, default_value_t = 1024, value_name = "MIB")]
    pub upload_symbols_max_mib: u64,
}

/// This node's name: --node-name, else the kernel's hostname.
fn node_name(args: &ProfilerArgs) -> String {
    args.node_name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "host".into())
    })
}

/// Where to upload, from the options and the environment; `None` without a
/// server, an error for a server without a token.
pub fn upload_target(args: &ProfilerArgs) -> anyhow::Result<Option<crate::upload::Upload>> {
    // Not $WHYSLOW_SERVER: the ranks' setting, which an agent started
    // from their environment must not pick up without its own token.
    let Some(server) = args.server.clone().filter(|s| !s.trim().is_empty()) else {
        if args.upload_symbols {
            anyhow::bail!("--upload-symbols sends them to --server URL: add it");
        }
        return Ok(None);
    };
    if !(server.starts_with("http://") || server.starts_with("https://")) {
        anyhow::bail!("--server {server}: expected an http:// or https:// URL");
    }
    let token = match &args.token_file {
        Some(f) => std::fs::read_to_string(f)
            .map_err(|e| anyhow::anyhow!("--token-file {}: {e}", f.display()))?
            .trim()
            .to_string(),
        None => std::env::var("WHYSLOW_TOKEN")
            .unwrap_or_default()
            .trim()
            .to_string(),
    };
    if token.is_empty() {
        anyhow::bail!("--server {server} needs a token: --token-file FILE or WHYSLOW_TOKEN");
    }
    Ok(Some(crate::upload::Upload {
        server,
        token,
        node: node_name(args),
        ca_file: args.ca_file.clone(),
        symbols: args.upload_symbols.then(|| crate::symbols::SymbolUploads {
            debug_dir: args.debug_dir.clone(),
            max_bytes: args.upload_symbols_max_mib.saturating_mul(1 << 20),
        }),
    }))
}

pub(crate) fn alive(r: &ProcessRegistration) -> bool {
    match (proc_start_ticks(r.pid), r.proc_start_ticks) {
        (Some(now), Some(then)) => now == then,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// The registrations in `dir` (files that do not parse are skipped: the
/// writer replaces them atomically, so a bad one is not ours to judge).
pub fn registrations(dir: &Path) -> Vec<ProcessRegistration> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<ProcessRegistration> = rd
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("proc-") && n.ends_with(".json")
        })
        .filter_map(|e| fs::read_to_string(e.path()).ok())
        .filter_map(|t| ProcessRegistration::from_json(&t).ok())
        .collect();
    out.sort_by_key(|r| r.pid);
    out
}

/// What the agent writes into its spool: profiles, collective records, OS
/// readings.
const SPOOL_SUFFIXES: [&str; 3] = [".pb.gz", ".collectives.jsonl", ".os.jsonl"];

/// Removes the oldest files the agent wrote under `spool` (of
/// [`SPOOL_SUFFIXES`]) until it holds at most `cap` bytes; returns how many
/// were removed.
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

fn file_name_part(s: &str) -> String {
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

/// Stops profiling `reg` after `e`, saying why unless the process is gone
/// (not permitted or not supported: trying again would only repeat the line).
fn give_up(reg: &ProcessRegistration, e: whyslow_stacks::StackError) {
    if alive(reg) {
        AgentEvent::ProfileFailed {
            pid: reg.pid,
            reason: e.to_string(),
        }
        .emit();
    }
}

/// Profiles one process, period after period, until it exits or `stop`.
fn profile_loop(
    reg: ProcessRegistration,
    args: ProfilerArgs,
    spool: PathBuf,
    stop: Arc<AtomicBool>,
    shared: whyslow_stacks::Shared,
) {
    let opts = whyslow_stacks::ProfileOptions {
        hz: args.profile_hz.clamp(1, 999),
        duration: Duration::from_secs_f64(args.profile_period.max(1.0)),
        ..Default::default()
    };
    let mut profiler = match whyslow_stacks::ProcessProfiler::new(reg.pid, &opts, &shared) {
        Ok(p) => p,
        Err(e) => return give_up(&reg, e),
    };
    let job = if reg.job.is_empty() {
        "unknown-job".to_string()
    } else {
        file_name_part(&reg.job)
    };
    let dir = spool.join(job);
    while !stop.load(Ordering::Relaxed) && alive(&reg) {
        if !crate::governor::hold(&stop) {
            return;
        }
        match profiler.profile(opts.duration, &stop) {
            Ok((mut profile, stats)) => {
                for (k, v) in reg.labels() {
                    profile.labels.insert(k, v);
                }
                let unix_s = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let name = format!("{}-{unix_s}.pb.gz", file_stem(&reg));
                let path = dir.join(name);
                let written = fs::create_dir_all(&dir)
                    .and_then(|_| fs::write(&path, whyslow_stack_output::to_pprof(&profile)));
                match written {
                    Ok(()) => {
                        AgentEvent::ProfileWritten {
                            pid: reg.pid,
                            rank: reg.rank,
                            samples: stats.samples,
                            path: &path,
                        }
                        .emit();
                        enforce_cap(&spool, args.profile_spool_mib.saturating_mul(1 << 20));
                    }
                    Err(e) => AgentEvent::ProfileFailed {
                        pid: reg.pid,
                        reason: format!("writing {}: {e}", path.display()),
                    }
                    .emit(),
                }
            }
            Err(e) => return give_up(&reg, e),
        }
    }
}

/// Profiles the host (or the cgroups) with the eBPF sampler, period after
/// period, until `stop`.
fn host_loop(
    args: ProfilerArgs,
    spool: PathBuf,
    stop: Arc<AtomicBool>,
    shared: whyslow_stacks::Shared,
) {
    use whyslow_stacks::ebpf;
    let target = if args.profile_cgroup.is_empty() {
        ebpf::Target::Host
    } else {
        ebpf::Target::Cgroups(args.profile_cgroup.clone())
    };
    let hz = args.profile_hz.clamp(10, 999);
    let rate = (args.profile_sampling_rate / 100.0).clamp(0.001, 1.0);
    let opts = ebpf::EbpfOptions {
        hz,
        sampling_rate: rate,
        target,
        measure: false,
        off_cpu: false,
        unwind: args.profile_unwind,
        max_cfi_rows: whyslow_stacks::ebpf::DEFAULT_MAX_CFI_ROWS,
    };
    let mut sampler = match ebpf::EbpfSampler::open(&opts) {
        Ok(s) => s,
        Err(e) => {
            return AgentEvent::ProfileFailed {
                pid: 0,
                reason: format!("host profile (eBPF) not started: {e}"),
            }
            .emit()
        }
    };
    let host = node_name(&args);
    let dir = spool.join("host");
    let period = Duration::from_secs_f64(args.profile_period.max(1.0));
    let drain_every = Duration::from_secs(5).min(period);
    let mut symbols = ebpf::Symbolizer::new(shared, true);
    AgentEvent::ProfileStarted {
        pid: 0,
        rank: None,
        job: "host",
    }
    .emit();
    while !stop.load(Ordering::Relaxed) && !crate::governor::stopped() {
        let start_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let t0 = std::time::Instant::now();
        let mut builder = whyslow_model::stack::StackProfileBuilder::new();
        builder.label("host", host.clone());
        builder.label(
            "scope",
            if args.profile_cgroup.is_empty() {
                "host"
            } else {
                "cgroup"
            },
        );
        let mut last = t0;
        let mut failed = None;
        while t0.elapsed() < period && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            sampler.poll();
            if last.elapsed() >= drain_every {
                last = std::time::Instant::now();
                match sampler.drain() {
                    Ok(c) => symbols.add(&c, &mut builder),
                    Err(e) => failed = Some(e),
                }
                symbols.refresh();
            }
        }
        match sampler.drain() {
            Ok(c) => symbols.add(&c, &mut builder),
            Err(e) => failed = Some(e),
        }
        if let Some(e) = failed {
            return AgentEvent::ProfileFailed {
                pid: 0,
                reason: format!("host profile (eBPF) stopped: {e}"),
            }
            .emit();
        }
        let profile = builder.finish(
            hz as f64 * rate,
            start_unix_ns,
            t0.elapsed().as_nanos() as u64,
        );
        let path = dir.join(format!(
            "{}-host-{}.pb.gz",
            file_name_part(&host),
            start_unix_ns / 1_000_000_000
        ));
        let written = fs::create_dir_all(&dir)
            .and_then(|_| fs::write(&path, whyslow_stack_output::to_pprof(&profile)));
        match written {
            Ok(()) => {
                AgentEvent::ProfileWritten {
                    pid: 0,
                    rank: None,
                    samples: profile.total(),
                    path: &path,
                }
                .emit();
                enforce_cap(&spool, args.profile_spool_mib.saturating_mul(1 << 20));
            }
            Err(e) => AgentEvent::ProfileFailed {
                pid: 0,
                reason: format!("writing {}: {e}", path.display()),
            }
            .emit(),
        }
    }
}

/// Off-CPU profiles of the registered processes (beyond SysOM-AI, which
/// lists blocked time as a limitation of CPU sampling), period after period
/// until `stop`: one eBPF program on sched_switch for all of them, one
/// profile per process and period, labelled like its CPU profiles plus
/// `kind=offcpu`. A thread's blocked interval is counted when it runs
/// again, in the period that sees it wake.
fn offcpu_loop(
    dir: PathBuf,
    args: ProfilerArgs,
    spool: PathBuf,
    stop: Arc<AtomicBool>,
    shared: whyslow_stacks::Shared,
) {
    use whyslow_stacks::ebpf;
    let opts = ebpf::EbpfOptions {
        hz: 99,
        sampling_rate: 1.0,
        target: ebpf::Target::Pids(Vec::new()),
        measure: false,
        off_cpu: true,
        unwind: args.profile_unwind,
        max_cfi_rows: whyslow_stacks::ebpf::DEFAULT_MAX_CFI_ROWS,
    };
    let mut sampler = match ebpf::EbpfSampler::open(&opts) {
        Ok(s) => s,
        Err(e) => {
            return AgentEvent::ProfileFailed {
                pid: 0,
                reason: format!("off-CPU profile (eBPF) not started: {e}"),
            }
            .emit()
        }
    };
    let period = Duration::from_secs_f64(args.profile_period.max(1.0));
    let mut symbols = ebpf::Symbolizer::new(shared, false);
    let mut traced: HashMap<u32, ProcessRegistration> = HashMap::new();
    while !stop.load(Ordering::Relaxed) && !crate::governor::stopped() {
        let start = SystemTime::now();
        let start_unix_ns = start
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let t0 = std::time::Instant::now();
        let mut builders: HashMap<u32, whyslow_model::stack::StackProfileBuilder> = HashMap::new();
        while t0.elapsed() < period && !stop.load(Ordering::Relaxed) {
            for reg in registrations(&dir) {
                let pid = reg.pid as u32;
                if reg.pid > 0 && !traced.contains_key(&pid) && alive(&reg) {
                    if let Err(e) = sampler.add_pid(pid) {
                        return AgentEvent::ProfileFailed {
                            pid: reg.pid,
                            reason: format!("off-CPU profile: {e}"),
                        }
                        .emit();
                    }
                    traced.insert(pid, reg);
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let counted = match sampler.drain() {
            Ok(c) => c,
            Err(e) => {
                return AgentEvent::ProfileFailed {
                    pid: 0,
                    reason: format!("off-CPU profile (eBPF) stopped: {e}"),
                }
                .emit()
            }
        };
        let mut by_pid: HashMap<u32, Vec<ebpf::CountedStack>> = HashMap::new();
        for c in counted {
            by_pid.entry(c.pid).or_default().push(c);
        }
        for (pid, stacks) in by_pid {
            let b = builders.entry(pid).or_default();
            symbols.add(&stacks, b);
        }
        symbols.refresh();
        let elapsed = t0.elapsed().as_nanos() as u64;
        for (pid, b) in builders {
            let Some(reg) = traced.get(&pid) else {
                continue;
            };
            let mut profile = b.finish(1e6, start_unix_ns, elapsed);
            for (k, v) in reg.labels() {
                profile.labels.insert(k, v);
            }
            profile.labels.insert("kind".into(), "offcpu".into());
            let job = if reg.job.is_empty() {
                "unknown-job".to_string()
            } else {
                file_name_part(&reg.job)
            };
            let out = spool.join(job);
            let path = out.join(format!(
                "{}-offcpu-{}.pb.gz",
                file_stem(reg),
                unix_secs(start)
            ));
            let written = fs::create_dir_all(&out)
                .and_then(|_| fs::write(&path, whyslow_stack_output::to_pprof(&profile)));
            match written {
                Ok(()) => AgentEvent::ProfileWritten {
                    pid: reg.pid,
                    rank: reg.rank,
                    samples: profile.total(),
                    path: &path,
                }
                .emit(),
                Err(e) => AgentEvent::ProfileFailed {
                    pid: reg.pid,
                    reason: format!("writing {}: {e}", path.display()),
                }
                .emit(),
            }
        }
        enforce_cap(&spool, args.profile_spool_mib.saturating_mul(1 << 20));
        // Processes that exited leave the filter.
        let gone: Vec<u32> = traced
            .iter()
            .filter(|(_, r)| !alive(r))
            .map(|(&p, _)| p)
            .collect();
        for pid in gone {
            let _ = sampler.remove_pid(pid);
            traced.remove(&pid);
        }
    }
}

/// Watches `dir` for registrations and runs one profiling thread per live
/// registered process (at most `max_processes`), until `stop`; with
/// `--profile-host`/`--profile-cgroup`, one more thread for the host.
pub fn run(dir: PathBuf, args: ProfilerArgs, stop: Arc<AtomicBool>) -> Option<JoinHandle<()>> {
    let spool = args.profile_spool.clone()?;
    // Where the spool is, for rank 0's report (written atomically).
    let info = whyslow_model::wire::AgentInfo {
        pid: std::process::id(),
        spool: std::path::absolute(&spool)
            .ok()
            .map(|p| p.to_string_lossy().into_owned()),
    };
    if let Ok(text) = serde_json::to_string(&info) {
        let tmp = dir.join(format!(".{}.tmp", whyslow_model::wire::AgentInfo::FILE));
        let _ = fs::write(&tmp, text)
            .and_then(|_| fs::rename(&tmp, dir.join(whyslow_model::wire::AgentInfo::FILE)));
    }
    Some(std::thread::spawn(move || {
        let shared = whyslow_stacks::Shared::new();
        let host = (args.profile_host || !args.profile_cgroup.is_empty()).then(|| {
            let (a, s, st, sh) = (args.clone(), spool.clone(), stop.clone(), shared.clone());
            std::thread::spawn(move || host_loop(a, s, st, sh))
        });
        let collectives = args.trace_collectives.then(|| {
            let (d, a, s, st) = (dir.clone(), args.clone(), spool.clone(), stop.clone());
            std::thread::spawn(move || collectives_loop(d, a, s, st))
        });
        let offcpu = args.profile_offcpu.then(|| {
            let (d, a, s, st, sh) = (
                dir.clone(),
                args.clone(),
                spool.clone(),
                stop.clone(),
                shared.clone(),
            );
            std::thread::spawn(move || offcpu_loop(d, a, s, st, sh))
        });
        let os = (args.os_interval > 0.0).then(|| {
            let (d, a, s, st) = (dir.clone(), args.clone(), spool.clone(), stop.clone());
            std::thread::spawn(move || os_loop(d, a, s, st))
        });
        let mut running: HashMap<i32, JoinHandle<()>> = HashMap::new();
        let mut refused: BTreeMap<i32, ()> = BTreeMap::new();
        while !stop.load(Ordering::Relaxed) {
            running.retain(|_, h| !h.is_finished());
            for reg in registrations(&dir) {
                if running.contains_key(&reg.pid) || refused.contains_key(&reg.pid) || !alive(&reg)
                {
                    continue;
                }
                if crate::governor::stopped() {
                    break;
                }
                if running.len() >= args.profile_max_processes {
                    refused.insert(reg.pid, ());
                    AgentEvent::ProfileFailed {
                        pid: reg.pid,
                        reason: format!(
                            "not profiled: {} processes already are (--profile-max-processes)",
                            args.profile_max_processes
                        ),
                    }
                    .emit();
                    continue;
                }
                AgentEvent::ProfileStarted {
                    pid: reg.pid,
                    rank: reg.rank,
                    job: &reg.job,
                }
                .emit();
                let (a, s, st, sh) = (args.clone(), spool.clone(), stop.clone(), shared.clone());
                let pid = reg.pid;
                running.insert(
                    pid,
                    std::thread::spawn(move || profile_loop(reg, a, s, st, sh)),
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        for (_, h) in running {
            let _ = h.join();
        }
        if let Some(h) = host {
            let _ = h.join();
        }
        if let Some(h) = collectives {
            let _ = h.join();
        }
        if let Some(h) = os {
            let _ = h.join();
        }
        if let Some(h) = offcpu {
            let _ = h.join();
        }
    }))
}

/// One traced process: where its records go.
struct Traced {
    reg: ProcessRegistration,
    path: PathBuf,
    period_start: SystemTime,
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The records file of `reg` for the period that began at `start`, with
/// `suffix` (`collectives.jsonl`, `os.jsonl`).
fn records_path(
    spool: &Path,
    reg: &ProcessRegistration,
    start: SystemTime,
    suffix: &str,
) -> PathBuf {
    let job = if reg.job.is_empty() {
        "unknown-job".to_string()
    } else {
        file_name_part(&reg.job)
    };
    spool
        .join(job)
        .join(format!("{}-{}.{suffix}", file_stem(reg), unix_secs(start)))
}

/// `host-rank<r>-pid<p>`: the start of every spool file of a process.
fn file_stem(reg: &ProcessRegistration) -> String {
    format!(
        "{}-rank{}-pid{}",
        file_name_part(if reg.host.is_empty() {
            "host"
        } else {
            &reg.host
        }),
        reg.rank
            .map(|r| r.to_string())
            .unwrap_or_else(|| "x".into()),
        reg.pid
    )
}

/// Traces the gloo collectives of registered processes (SysOM-AI §3.2), and
/// NCCL's calls of those that map libnccl, until `stop`: one records file
/// per process and profile period in the spool.
/// A process that has not loaded gloo yet is tried again at each scan.
fn collectives_loop(dir: PathBuf, args: ProfilerArgs, spool: PathBuf, stop: Arc<AtomicBool>) {
    use whyslow_collectives::{gloo_library, GlooTracer, Sequencer};
    let mut tracer = match GlooTracer::open() {
        Ok(t) => t,
        Err(e) => {
            return AgentEvent::CollectivesFailed {
                pid: 0,
                reason: e.to_string(),
            }
            .emit()
        }
    };
    let period = Duration::from_secs_f64(args.profile_period.max(1.0));
    let mut traced: HashMap<u32, Traced> = HashMap::new();
    let mut refused: BTreeMap<i32, ()> = BTreeMap::new();
    let mut sequencer = Sequencer::with_clock_offset(
        whyslow_sampler::clock::realtime_ns() - whyslow_sampler::clock::monotonic_ns(),
    );
    let mut last_scan = std::time::Instant::now() - Duration::from_secs(10);
    let mut pending: Vec<whyslow_collectives::GlooEvent> = Vec::new();
    // NCCL's calls (GPU jobs), traced once a process maps libnccl: the host
    // side, for when NCCL does not load whyslow's profiler plugin.
    let mut nccl: Option<whyslow_collectives::nccl::NcclTracer> = None;
    let mut nccl_done: BTreeMap<u32, ()> = BTreeMap::new();
    let mut nccl_sequencer = whyslow_collectives::nccl::NcclSequencer::with_clock_offset(
        whyslow_sampler::clock::realtime_ns() - whyslow_sampler::clock::monotonic_ns(),
    );
    let mut pending_nccl: Vec<whyslow_collectives::nccl::NcclEvent> = Vec::new();
    // Calls in flight longer than OPEN_AFTER are written once as open
    // records (a hang: `whyslow hang`, `diagnose`), keyed by process,
    // thread and entry.
    let mut reported_open: BTreeMap<(u32, u32, u64), ()> = BTreeMap::new();
    let mut last_open_scan = std::time::Instant::now();
    loop {
        // On stop, one last round writes everything still pending.
        let stopping = stop.load(Ordering::Relaxed);
        if !stopping && last_scan.elapsed() >= Duration::from_millis(500) {
            last_scan = std::time::Instant::now();
            for reg in registrations(&dir) {
                let pid = reg.pid as u32;
                if reg.pid <= 0
                    || traced.contains_key(&pid)
                    || refused.contains_key(&reg.pid)
                    || !alive(&reg)
                {
                    continue;
                }
                // Not yet: torch.distributed may load later than registration.
                let Some(lib) = gloo_library(pid) else {
                    continue;
                };
                match tracer.attach(pid, &lib) {
                    Ok(0) => {
                        refused.insert(reg.pid, ());
                        AgentEvent::CollectivesFailed {
                            pid: reg.pid,
                            reason: format!("{} exports no gloo collective", lib.display()),
                        }
                        .emit();
                    }
                    Ok(n) => {
                        AgentEvent::CollectivesTraced {
                            pid: reg.pid,
                            rank: reg.rank,
                            functions: n,
                            library: &lib,
                        }
                        .emit();
                        let now = SystemTime::now();
                        traced.insert(
                            pid,
                            Traced {
                                path: records_path(&spool, &reg, now, "collectives.jsonl"),
                                reg,
                                period_start: now,
                            },
                        );
                    }
                    Err(e) => {
                        refused.insert(reg.pid, ());
                        AgentEvent::CollectivesFailed {
                            pid: reg.pid,
                            reason: e.to_string(),
                        }
                        .emit();
                    }
                }
            }
            for (&pid, t) in &traced {
                if nccl_done.contains_key(&pid) {
                    continue;
                }
                let Some(lib) = whyslow_collectives::nccl::nccl_library(pid) else {
                    continue;
                };
                nccl_done.insert(pid, ());
                if nccl.is_none() {
                    match whyslow_collectives::nccl::NcclTracer::open() {
                        Ok(n) => nccl = Some(n),
                        Err(e) => {
                            AgentEvent::CollectivesFailed {
                                pid: t.reg.pid,
                                reason: format!("NCCL tracer: {e}"),
                            }
                            .emit();
                            continue;
                        }
                    }
                }
                let Some(n) = nccl.as_mut() else { continue };
                match n.attach(pid, &lib) {
                    Ok(k) => AgentEvent::CollectivesTraced {
                        pid: t.reg.pid,
                        rank: t.reg.rank,
                        functions: k,
                        library: &lib,
                    }
                    .emit(),
                    Err(e) => AgentEvent::CollectivesFailed {
                        pid: t.reg.pid,
                        reason: e.to_string(),
                    }
                    .emit(),
                }
            }
            let gone: Vec<u32> = traced
                .iter()
                .filter(|(_, t)| !alive(&t.reg))
                .map(|(&p, _)| p)
                .collect();
            for pid in gone {
                tracer.detach(pid);
                sequencer.forget(pid);
                if let Some(n) = nccl.as_mut() {
                    n.detach(pid);
                }
                traced.remove(&pid);
            }
        }
        let wait = if stopping { 0 } else { 200 };
        pending.extend(tracer.poll(Duration::from_millis(wait)));
        // In entry order per process (the sequence numbers count that way);
        // a call still in flight on another thread of the process returns
        // later, so events younger than a second wait for the next round.
        pending.sort_by_key(|e| (e.pid, e.entry_ns));
        let now_ns = monotonic_ns();
        let (ready, young): (Vec<_>, Vec<_>) = pending
            .drain(..)
            .partition(|e| stopping || now_ns.saturating_sub(e.exit_ns) > 1_000_000_000);
        pending = young;
        if let Some(n) = nccl.as_mut() {
            pending_nccl.extend(n.poll(Duration::ZERO));
        }
        pending_nccl.sort_by_key(|e| (e.pid, e.entry_ns));
        let (ready_nccl, young_nccl): (Vec<_>, Vec<_>) = pending_nccl
            .drain(..)
            .partition(|e| stopping || now_ns.saturating_sub(e.exit_ns) > 1_000_000_000);
        pending_nccl = young_nccl;
        let mut lines: HashMap<u32, String> = HashMap::new();
        for e in &ready_nccl {
            let Some(t) = traced.get(&e.pid) else {
                continue;
            };
            if let Some(r) = nccl_sequencer.record(e, &t.reg.job, t.reg.rank) {
                if let Ok(j) = serde_json::to_string(&r) {
                    let l = lines.entry(e.pid).or_default();
                    l.push_str(&j);
                    l.push('\n');
                }
            }
        }
        for e in &ready {
            let Some(t) = traced.get(&e.pid) else {
                continue;
            };
            let global = t.reg.rank;
            if let Some(r) = sequencer.record(e, &t.reg.job, global) {
                if let Ok(j) = serde_json::to_string(&r) {
                    let l = lines.entry(e.pid).or_default();
                    l.push_str(&j);
                    l.push('\n');
                }
            }
        }
        if last_open_scan.elapsed() >= Duration::from_secs(1) {
            last_open_scan = std::time::Instant::now();
            let open = tracer.in_flight();
            let now = monotonic_ns();
            reported_open.retain(|k, _| open.iter().any(|e| (e.pid, e.tid, e.entry_ns) == *k));
            for mut e in open {
                let key = (e.pid, e.tid, e.entry_ns);
                if now.saturating_sub(e.entry_ns) < OPEN_AFTER_NS
                    || reported_open.contains_key(&key)
                {
                    continue;
                }
                let Some(t) = traced.get(&e.pid) else {
                    continue;
                };
                e.exit_ns = now;
                if let Some(mut r) = sequencer.record(&e, &t.reg.job, t.reg.rank) {
                    r.open = true;
                    if let Ok(j) = serde_json::to_string(&r) {
                        reported_open.insert(key, ());
                        let l = lines.entry(e.pid).or_default();
                        l.push_str(&j);
                        l.push('\n');
                    }
                }
            }
        }
        for (pid, text) in lines {
            let Some(t) = traced.get_mut(&pid) else {
                continue;
            };
            if t.period_start.elapsed().unwrap_or_default() >= period {
                t.period_start = SystemTime::now();
                t.path = records_path(&spool, &t.reg, t.period_start, "collectives.jsonl");
                enforce_cap(&spool, args.profile_spool_mib.saturating_mul(1 << 20));
            }
            if let Err(e) = append(&t.path, &text) {
                AgentEvent::CollectivesFailed {
                    pid: pid as i32,
                    reason: format!("writing {}: {e}", t.path.display()),
                }
                .emit();
            }
        }
        if stopping {
            return;
        }
    }
}

/// A collective in flight this long is written as an open record: far
/// beyond any healthy collective (they take ms), well before PyTorch's
/// collective timeouts (10-30 min).
const OPEN_AFTER_NS: u64 = 10_000_000_000;

/// CLOCK_MONOTONIC in ns (the clock of bpf_ktime_get_ns).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Appends `text` to `path`, creating it and its directory.
fn append(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(d) = path.parent() {
        fs::create_dir_all(d)?;
    }
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(text.as_bytes())
}

/// Reads the OS signals of every registered live process every
/// `--os-interval` seconds until `stop` (SysOM-AI §3.1's OS layer): one
/// `whyslow_model::os::OsSample` line per process and reading, in one file
/// per process and profile period. Plain `/proc` reads: nothing is attached
/// to the process.
fn os_loop(dir: PathBuf, args: ProfilerArgs, spool: PathBuf, stop: Arc<AtomicBool>) {
    use whyslow_sampler::os::OsSignals;
    struct Watched {
        reg: ProcessRegistration,
        signals: OsSignals,
        path: PathBuf,
        period_start: SystemTime,
    }
    let interval = Duration::from_secs_f64(args.os_interval.max(0.1));
    let period = Duration::from_secs_f64(args.profile_period.max(1.0));
    let mut watched: HashMap<i32, Watched> = HashMap::new();
    let mut next = std::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if std::time::Instant::now() < next {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        next += interval;
        for reg in registrations(&dir) {
            if reg.pid <= 0 || watched.contains_key(&reg.pid) || !alive(&reg) {
                continue;
            }
            if let Some(signals) = OsSignals::open(reg.pid) {
                let now = SystemTime::now();
                watched.insert(
                    reg.pid,
                    Watched {
                        path: records_path(&spool, &reg, now, "os.jsonl"),
                        reg,
                        signals,
                        period_start: now,
                    },
                );
            }
        }
        watched.retain(|_, w| alive(&w.reg));
        for w in watched.values_mut() {
            let Some(mut sample) = w.signals.sample() else {
                continue;
            };
            sample.job = w.reg.job.clone();
            sample.host = w.reg.host.clone();
            sample.rank = w.reg.rank;
            let Ok(mut line) = serde_json::to_string(&sample) else {
                continue;
            };
            line.push('\n');
            if w.period_start.elapsed().unwrap_or_default() >= period {
                w.period_start = SystemTime::now();
                w.path = records_path(&spool, &w.reg, w.period_start, "os.jsonl");
            }
            if let Err(e) = append(&w.path, &line) {
                AgentEvent::ProfileFailed {
                    pid: w.reg.pid,
                    reason: format!("writing {}: {e}", w.path.display()),
                }
                .emit();
            }
        }
    }
}

//! The agent's collectors and their options (`whyslow agent
//! --profile-spool DIR …`): always-on CPU profiles of the registered
//! training processes (SysOM-AI §3.3), and by option the host's profile,
//! the off-CPU profiles, the collective calls and the OS readings. Each is
//! a [`Collector`](crate::collector::Collector) in [`crate::sources`]; they
//! see the registered processes through one
//! [`Registry`](crate::registry::Registry) and write into one
//! [`Spool`](crate::spool::Spool), ready to upload.
//!
//! Caps: at most `--profile-max-processes` processes profiled at once,
//! `--profile-hz` samples per second per thread (the CPU cost is per
//! sample, BENCHMARKS.md), the spool's size (`--profile-spool-mib`, the
//! oldest files go first), and the agent's own CPU and memory
//! ([`crate::governor`]).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use clap::Args;

use crate::collector::Collector;
use crate::registry::Registry;
use crate::spool::Spool;

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
    /// How the eBPF profilers (host, cgroup, off-CPU) walk user stacks.
    /// Default `hybrid`: DWARF rows from each module's .eh_frame in BPF
    /// maps, else validated frame-pointer steps (full stacks for code
    /// without frame pointers, such as CPython; costs compiling each
    /// module's rows once per file, when a process mapping it is first
    /// sampled or, for large ones, when a sample lands in it, and once per
    /// machine with a Build-ID: kept in $WHYSLOW_CACHE_DIR, default
    /// ~/.cache/whyslow, at most 1 GiB, empty to turn off; rows capped at
    /// 4 Mi, 64 MiB of kernel memory, modules no process maps and those not
    /// sampled for a minute evicted first). `fp`: the kernel's frame-pointer
    /// walk (8 % of frames right on CPython without frame pointers).
    /// `dwarf`: rows only.
    #[arg(long, default_value = "hybrid", value_name = "fp|dwarf|hybrid")]
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

/// The collectors `cfg` turns on, in start order: the per-process CPU
/// profiles always; the host profile, collectives, off-CPU profiles and OS
/// readings by their options.
pub fn collectors(
    cfg: &Arc<ProfilerArgs>,
    spool: &Arc<Spool>,
    stop: &Arc<AtomicBool>,
) -> Vec<Box<dyn Collector>> {
    use crate::sources::{collectives, host, offcpu, os, profile};
    let shared = whyslow_stacks::Shared::new();
    let mut out: Vec<Box<dyn Collector>> = Vec::new();
    if cfg.profile_host || !cfg.profile_cgroup.is_empty() {
        out.push(Box::new(host::Host::new(
            cfg.clone(),
            node_name(cfg),
            shared.clone(),
        )));
    }
    if cfg.trace_collectives {
        out.push(Box::new(collectives::Collectives::new()));
    }
    if cfg.profile_offcpu {
        out.push(Box::new(offcpu::OffCpu::new(cfg.clone(), shared.clone())));
    }
    if cfg.os_interval > 0.0 {
        out.push(Box::new(os::Os::new(cfg.os_interval)));
    }
    out.push(Box::new(profile::Profiles::new(
        cfg.clone(),
        spool.clone(),
        stop.clone(),
        shared,
    )));
    out
}

/// With `--profile-spool`: runs the [`collectors`] over the registrations
/// in `dir` until `stop` (see [`crate::collector`]); the handle returns
/// once their last profiles and records are written.
pub fn run(dir: PathBuf, cfg: Arc<ProfilerArgs>, stop: Arc<AtomicBool>) -> Option<JoinHandle<()>> {
    let root = cfg.profile_spool.clone()?;
    // Where the spool is, for rank 0's report (written atomically).
    let info = whyslow_model::wire::AgentInfo {
        pid: std::process::id(),
        spool: std::path::absolute(&root)
            .ok()
            .map(|p| p.to_string_lossy().into_owned()),
    };
    if let Ok(text) = serde_json::to_string(&info) {
        let _ = crate::spool::write_atomic(
            &dir.join(whyslow_model::wire::AgentInfo::FILE),
            text.as_bytes(),
        );
    }
    let spool = Arc::new(Spool::new(
        root,
        cfg.profile_spool_mib.saturating_mul(1 << 20),
        Duration::from_secs_f64(cfg.profile_period.max(1.0)),
    ));
    Some(std::thread::spawn(move || {
        let collectors = collectors(&cfg, &spool, &stop);
        crate::collector::run(collectors, Registry::new(dir), spool, stop);
    }))
}

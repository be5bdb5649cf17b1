//! Remediation hints for known patterns (PerfTracker §6 cases, EROICA's
//! production cases). A hint is a pure function of a [`Finding`].

use whyslow_model::{Finding, FunctionKind, Reason, Resource, UtilizationSource};

/// True when every worker of the comparison group is flagged (or, for reports
/// without `group_workers`, when the peers' β is ~0 and no point is unflagged).
fn on_all_workers(f: &Finding) -> bool {
    if f.group_workers > 0 {
        f.workers.len() >= f.group_workers
    } else {
        !f.points.is_empty() && f.points.iter().all(|p| p.flagged)
    }
}

/// True when only part of the group is flagged, at most `frac` of it.
fn on_subset(f: &Finding, frac: f64) -> bool {
    let total = if f.group_workers > 0 {
        f.group_workers
    } else {
        f.points.len()
    };
    total > 0 && f.workers.len() < total && (f.workers.len() as f64) <= frac * total as f64
}

fn is_peer(f: &Finding) -> bool {
    matches!(f.reason, Reason::PeerOutlier | Reason::Both)
}

/// μ of the flagged workers is clearly below their peers' (at most 85% of it).
fn low_mu(f: &Finding) -> bool {
    f.mu.peers > 0.0 && f.mu.value <= 0.85 * f.mu.peers
}

/// μ of the flagged workers is clearly above their peers' (at least 115% of it).
fn high_mu(f: &Finding) -> bool {
    f.mu.value > 0.0 && f.mu.value >= 1.15 * f.mu.peers
}

/// The flagged workers get clearly less of a CPU over all their critical-path
/// CPU work than their peers (below 80% of it): the host, not the function.
fn cpu_starved(f: &Finding) -> bool {
    f.resource == Resource::Cpu
        && f.resource_mu
            .is_some_and(|r| r.peers > 0.0 && r.value < 0.8 * r.peers)
}

const CPU_STARVED: &str = "These workers' CPU work runs with less CPU than their peers' over \
     all of their critical-path CPU work, not only in this function: the host's CPU is \
     contended. Look for other processes on the cores (`top`, `pidstat -t`), a CPU limit \
     or throttling (cgroup `cpu.max`, `cpu.stat` nr_throttled), CPU affinity shared with \
     data-loader workers, or a lower CPU frequency.";

/// σ of the flagged workers is clearly below their peers' (at most 60% of it).
fn low_sigma(f: &Finding) -> bool {
    f.sigma.peers > 0.0 && f.sigma.value <= 0.6 * f.sigma.peers
}

/// The frames of a Python stack (outermost first, `;`-joined), lower-cased.
fn lower_frames(name: &str) -> Vec<String> {
    name.split(';').map(|s| s.trim().to_lowercase()).collect()
}

/// The function name of a frame `file.py(123): name`, or the whole frame.
fn frame_fn(frame: &str) -> &str {
    match frame.rfind("): ") {
        Some(i) => frame[i + 3..].trim(),
        None => frame.trim(),
    }
}

fn is_data_loading(frames: &[String]) -> bool {
    frames.iter().any(|fr| {
        let func = frame_fn(fr);
        fr.contains("recv_into")
            || func == "_recv"
            || func.ends_with("._recv")
            || func.contains("_recv_bytes")
            || (fr.contains("socket") && (func.contains("read") || func.contains("recv")))
            || func == "_next_data"
            || func.ends_with("._next_data")
            || (fr.contains("dataloader") && func.contains("__next__"))
    })
}

/// The innermost frame waits (socket/pipe receive, file read, poll, queue
/// get, lock, sleep) rather than computes.
fn innermost_waits(frames: &[String]) -> bool {
    let Some(last) = frames.last() else {
        return false;
    };
    let func = frame_fn(last);
    [
        "recv", "read", "poll", "select", "wait", "sleep", "acquire", "accept", "_get", "get",
    ]
    .iter()
    .any(|w| func.contains(w))
        || last.contains("socket")
        || last.contains("queue")
        || last.contains("connection.py")
        || last.contains("selectors.py")
        || last.contains("threading.py")
}

/// Measured CPU utilization of the training thread says it waits (≤ 30 %)
/// or computes (≥ 60 %); `None` when not measured.
fn cpu_busy(f: &Finding) -> Option<bool> {
    if f.util_source == UtilizationSource::None || f.resource != Resource::Cpu {
        return None;
    }
    if f.mu.value <= 0.3 {
        Some(false)
    } else if f.mu.value >= 0.6 {
        Some(true)
    } else {
        None
    }
}

/// A user-annotated region (`record_function`, `## name ##`, `[param|…]`,
/// `Optimizer.step#…`) rather than one operator: it spans whatever runs inside.
fn is_annotation(name: &str) -> bool {
    let n = name.trim();
    (n.starts_with("##") && n.ends_with("##"))
        || (n.starts_with('[') && n.ends_with(']'))
        || n.starts_with("ProfilerStep#")
        || (n.contains('#') && !n.contains("::"))
}

fn is_gc(frames: &[String]) -> bool {
    frames.iter().any(|fr| {
        let func = frame_fn(fr);
        fr.contains("gc.collect")
            || func == "collect"
            || func.ends_with("gc.collect")
            || func.contains("method collect of")
            || func == "gc"
            || fr.starts_with("gc.py")
            || fr.contains("/gc.py")
    })
}

/// A remediation hint for a finding that matches a known pattern (PerfTracker
/// §6 and EROICA's cases), or `None`:
///
/// * Python stack through socket `recv_into`/`_recv`/`read` or a DataLoader's
///   `__next__`/`_next_data` → slow data loading from storage (§6.2 P1).
/// * Python `gc`/`collect`, or a Python function with high β on a random
///   subset of workers → garbage-collection pauses (§6.2 P3).
/// * Other Python function with high β on all workers → CPU-bound code (§6.2 P2).
/// * Python function or CPU op on a subset whose workers get clearly less
///   CPU over all their critical-path CPU work than their peers (whether
///   flagged as peer outliers or above their expected range) → contended
///   host CPU.
/// * GPU kernel, peer outlier with lower μ on a subset → GPU throttling (§6.1 P1).
/// * Intra-host communication (NVLink) with low μ, or communication over PCIe
///   with high μ, on a subset → NVLink degraded/down (§6.1 P2).
/// * Inter-host communication (NIC) on a few workers with low μ and low σ →
///   slow NIC or link (§3's ring example).
/// * Communication with high β on all workers → not overlapped / network-bound.
/// * Memory operations or CPU ops above their expected range on all workers →
///   host↔device copies or synchronization on the critical path.
pub fn hint(f: &Finding, job: &Job) -> Option<String> {
    let all = on_all_workers(f);
    match f.kind {
        FunctionKind::Python => python_hint(f, job, all),
        FunctionKind::GpuKernel => gpu_kernel_hint(f, all),
        FunctionKind::Comm => comm_hint(f, all),
        FunctionKind::Memory => memory_hint(f, all),
        FunctionKind::CpuOp => cpu_op_hint(f, job, all),
    }
}

/// Python functions: starved of CPU, input loading or preprocessing, GC pauses, rank-dependent work, CPU-bound steps.
fn python_hint(f: &Finding, job: &Job, all: bool) -> Option<String> {
    let waits_for = if job.gpus {
        "keeps the GPUs waiting"
    } else {
        "holds up the step"
    };
    let frames = lower_frames(&f.function);
    // Starved of CPU in the rest of their work too: the host, even
    // when the function is the DataLoader's next (a storage wait
    // leaves the other work's CPU share alone), and whichever rule
    // flagged it (the comparison with the peers is in resource_mu).
    if !all && cpu_starved(f) {
        return Some(CPU_STARVED.into());
    }
    if is_data_loading(&frames) {
        // Waiting for input, or computing it in the training process?
        let waiting = cpu_busy(f).map_or_else(|| innermost_waits(&frames), |busy| !busy);
        return Some(if waiting {
            "The training loop waits for input (DataLoader next / socket receive on \
                 the critical path): data arrives slower than it is consumed. Use more \
                 DataLoader workers with prefetching and pin_memory, cache or pre-shard \
                 the data locally, or read from a faster (parallel) file system."
                .into()
        } else {
            format!(
                "Input preprocessing runs in the training process itself, inside the \
                     DataLoader's next (CPU work, not waiting): it {waits_for}. Move it into \
                     DataLoader workers (num_workers > 0, persistent_workers, prefetch_factor){}, \
                     or precompute it offline.",
                if job.gpus {
                    " or onto the GPU (GPU transforms, DALI)"
                } else {
                    ""
                }
            )
        });
    }
    if is_preprocessing(&frames) {
        return Some(format!(
            "CPU-heavy data preprocessing (image/array transforms) runs in the \
                 training process: it {waits_for}. Move it into DataLoader workers \
                 (num_workers > 0){}, or precompute it offline.",
            if job.gpus {
                " or onto the GPU (GPU transforms, DALI)"
            } else {
                ""
            }
        ));
    }
    if is_gc(&frames) {
        return Some(
            "Python garbage-collection pauses on these workers: every other worker \
                 waits for the one collecting. Call gc.freeze() after setup and \
                 gc.disable(), then run gc.collect() on all ranks at the same step \
                 boundary (e.g. every 100-200 steps)."
                .into(),
        );
    }
    if !all && on_subset(f, 0.5) && f.beta.peers < f.beta.value * 0.5 {
        return Some(
            "Only these workers spend this time in this Python function, and every \
                 other worker waits for them at the next collective: look for \
                 rank-dependent work (logging, checkpointing, evaluation or extra \
                 preprocessing on some ranks) or uneven data. If the function itself \
                 does little (a context manager's __init__, an accessor), it is more \
                 likely Python garbage-collection pauses landing in it (PerfTracker §6): \
                 gc.freeze() after setup, then gc.collect() on all ranks at the same step."
                .into(),
        );
    }
    if all && job.gpus {
        return Some(
            "This Python function keeps the GPUs waiting on every worker: the job \
                 is bound by CPU work in it. Profile it (py-spy, torch.profiler with \
                 stacks), move the work to the GPU or out of the step loop, or reduce \
                 kernel-launch overhead (torch.compile, CUDA graphs)."
                .into(),
        );
    }
    if all {
        return Some(
            "This Python function takes more of every worker's step than Python \
                 code should: profile it (py-spy, torch.profiler with stacks) and move \
                 the work out of the step loop or into vectorized operators."
                .into(),
        );
    }
    None
}

/// GPU kernels slower on some workers: throttling or uneven work.
fn gpu_kernel_hint(f: &Finding, all: bool) -> Option<String> {
    if is_peer(f) && !all && low_mu(f) {
        Some(
            "This kernel runs slower with lower SM activity on these workers than \
                 on their peers: likely GPU throttling (power/thermal) or a degraded GPU. \
                 Check `nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE,POWER` on their \
                 hosts (clock throttle reasons, HW slowdown) and the DCGM/XID logs."
                .into(),
        )
    } else if is_peer(f) && !all {
        Some(
            "This kernel takes a larger share of the critical path on these workers \
                 than on their peers: check for uneven work (data/sequence-length \
                 imbalance) or slower GPUs (`nvidia-smi -q -d PERFORMANCE`)."
                .into(),
        )
    } else {
        None
    }
}

/// Communication: a degraded link on some workers, or not overlapped on all.
fn comm_hint(f: &Finding, all: bool) -> Option<String> {
    if is_peer(f) && !all {
        if (f.resource == Resource::Nvlink && low_mu(f))
            || (f.resource == Resource::Pcie && high_mu(f))
        {
            return Some(
                "Intra-host communication on these workers uses the link differently \
                     from their peers: NVLink is likely degraded or down and traffic falls \
                     back to PCIe. Check `nvidia-smi nvlink -s` and `nvidia-smi topo -m` \
                     on their hosts."
                    .into(),
            );
        }
        if f.resource == Resource::Nic && low_mu(f) && low_sigma(f) && on_subset(f, 0.25) {
            return Some(
                "Steady low NIC throughput on these workers while their peers \
                     fluctuate (waiting for them): a slow NIC or network link on their \
                     hosts. Check `ibstat` / `ethtool <dev>` (speed, errors), the bond, \
                     and the switch port or optics they connect to."
                    .into(),
            );
        }
        if low_mu(f) {
            return Some(
                "Communication is slower with lower link utilization on these workers \
                     than on their peers: check their links (`nvidia-smi nvlink -s`, \
                     `ibstat`, `ethtool`) and the switch ports they use."
                    .into(),
            );
        }
        None
    } else if all || matches!(f.reason, Reason::Unexpected) {
        Some(
            "Communication takes a large share of the critical path on all workers: \
                 it is not overlapped with computation, or the job is network-bound. \
                 Enable overlap (DDP bucket sizes, FSDP prefetch, async tensor \
                 parallelism), reduce communication volume, or check the cluster's \
                 network bandwidth (nccl-tests)."
                .into(),
        )
    } else {
        None
    }
}

/// Memory operations on the critical path.
fn memory_hint(f: &Finding, all: bool) -> Option<String> {
    if all || matches!(f.reason, Reason::Unexpected) {
        Some(
            "Memory operations (copies/allocation) are on the critical path: \
                 frequent host-device transfers or allocations. Use pinned memory with \
                 non_blocking copies, keep tensors on the GPU, avoid `.item()`/`.cpu()` \
                 in the step loop, and check allocator churn (torch.cuda.memory_stats)."
                .into(),
        )
    } else {
        None
    }
}

/// CPU operators: synchronization, starvation, annotations, launch-bound jobs.
fn cpu_op_hint(f: &Finding, job: &Job, all: bool) -> Option<String> {
    if f.function.to_lowercase().contains("synchronize") {
        Some(
            "The GPUs idle while the CPU synchronizes: excessive synchronization \
                 (`.item()`, `.cpu()`, `torch.cuda.synchronize()`, host-side checks). \
                 Remove syncs from the step loop."
                .into(),
        )
    } else if !all && cpu_starved(f) {
        Some(CPU_STARVED.into())
    } else if is_annotation(&f.function) {
        (all || matches!(f.reason, Reason::Unexpected)).then(|| {
            "This is a user-annotated region (record_function), not one operator: \
                 its critical-path time is whatever runs inside it. Look at the findings \
                 for the functions within it, or profile with stacks to see what it waits for."
                .into()
        })
    } else if (all || matches!(f.reason, Reason::Unexpected)) && job.gpus {
        Some(
            "A CPU operator keeps the GPUs waiting: the job is CPU/launch-bound. \
                 Check CPU affinity and contention, and reduce launch overhead \
                 (torch.compile, CUDA graphs, larger batches)."
                .into(),
        )
    } else {
        None
    }
}

/// What the hints need to know about the job as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Job {
    /// Some worker ran GPU kernels or device memory operations.
    pub gpus: bool,
}

/// Image/array preprocessing libraries and transforms in the stack.
fn is_preprocessing(frames: &[String]) -> bool {
    frames.iter().any(|fr| {
        let func = frame_fn(fr);
        fr.contains("scipy/ndimage")
            || fr.contains("/pil/")
            || fr.starts_with("pil/")
            || fr.contains("torchvision/transforms")
            || fr.contains("image_transforms")
            || fr.contains("image_processing")
            || fr.contains("albumentations")
            || fr.contains("cv2")
            || func.contains("zoom")
            || func.contains("resize")
    })
}

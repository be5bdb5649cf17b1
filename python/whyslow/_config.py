"""whyslow's configuration: keyword arguments of ``whyslow.init`` override
``WHYSLOW_*`` environment variables, which override the defaults below."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Mapping, Optional

_TRUE = {"1", "true", "yes", "on"}


@dataclasses.dataclass
class Config:
    """Every setting, its environment variable and its default.

    ============================  ===========================  ===================
    field                         environment variable         default
    ============================  ===========================  ===================
    disable                       WHYSLOW_DISABLE              0 (1: do nothing)
    auto                          WHYSLOW_AUTO                 1 (activate on import under torchrun)
    report_dir                    WHYSLOW_REPORT_DIR           ./whyslow-reports
    job_id                        WHYSLOW_JOB_ID               TORCHELASTIC_RUN_ID, else "local"
    window_s                      WHYSLOW_WINDOW_S             20 (profiling window, seconds)
    window_iters                  WHYSLOW_WINDOW_ITERS         0 (>0: window in iterations instead)
    window_max_mb                 WHYSLOW_WINDOW_MAX_MB        1024 (the window ends early when the rank's memory grew by this much; 0: no limit)
    m                             WHYSLOW_M                    10 (§4.1 M)
    n                             WHYSLOW_N                    50 (§4.1 N)
    threshold                     WHYSLOW_THRESHOLD            0.05 (§4.1: 5 %)
    block_factor                  WHYSLOW_BLOCK_FACTOR         5 (§4.1: blocked at 5× mean)
    block_min_s                   WHYSLOW_BLOCK_MIN_S          1 (and never below this many seconds)
    hang_grace_s                  WHYSLOW_HANG_GRACE_S         10 (a stall must last this much longer to be gathered as a hang)
    hang_gather_s                 WHYSLOW_HANG_GATHER_S        20 (after a stall, wait this long for every rank's stacks)
    hang_quiet_s                  WHYSLOW_HANG_QUIET_S         3.5 (...but no longer than this after the last rank answered: the rest cannot run Python)
    flight_recorder               WHYSLOW_FLIGHT_RECORDER      1 (turn PyTorch's Flight Recorder on unless TORCH_FR_BUFFER_SIZE is set)
    suggest_fix                   WHYSLOW_SUGGEST_FIX          0 (1: after each report, ask the configured model for a fix; docs/commands/analyze.md)
    k                             WHYSLOW_K                    200 (§4.1 K)
    recent                        WHYSLOW_RECENT               10·N (iterations of "recent")
    baseline                      WHYSLOW_BASELINE             rolling_mean | shortest_iteration
    cooldown_s                    WHYSLOW_COOLDOWN_S           300 (between windows)
    max_per_hour                  WHYSLOW_MAX_PER_HOUR         6
    poll_s                        WHYSLOW_POLL_S               0.5 (store/trigger polling period)
    lead_s                        WHYSLOW_LEAD_S               2 (target iteration this far ahead)
    collect_timeout_s             WHYSLOW_COLLECT_TIMEOUT_S    120 (rank 0 waits this long)
    keep_traces                   WHYSLOW_KEEP_TRACES          0 (1: keep raw Chrome traces)
    localize_config               WHYSLOW_LOCALIZE_CONFIG      "" (TOML file for the localizer)
    cuda                          WHYSLOW_CUDA                 auto (profile CUDA when available)
    signal                        WHYSLOW_SIGNAL               1 (SIGUSR2 asks for a profile)
    exit_wait_s                   WHYSLOW_EXIT_WAIT_S          60 (at exit, wait for the report)
    log_level                     WHYSLOW_LOG_LEVEL            INFO
    sample_hz                     WHYSLOW_SAMPLE_HZ            1000 (0: off)
    sample_ifaces                 WHYSLOW_SAMPLE_IFACES        "" (e.g. ``eth0`` or ``veth0:1000``)
    agent_dir                     WHYSLOW_AGENT_DIR            "" (directory shared with ``whyslow agent``)
    ready_file                    WHYSLOW_READY_FILE           "" (touched when the first step ends)
    server                        WHYSLOW_SERVER               "" (``whyslow server`` URL: upload fingerprints)
    token                         WHYSLOW_TOKEN                "" (its bearer token)
    ============================  ===========================  ===================

    ``server``: when set (``http://host:7070``), every rank also uploads its
    fingerprint of each window to ``whyslow server``
    (``/api/v1/jobs/<job id>/sessions/<session folder>/fingerprints``, with
    ``token``), where the job's report is computed centrally (docs/server.md).
    An upload that fails logs one line; the local report is written as before.

    ``sample_hz``: when > 0, the utilization sampler (whyslow-sampler) runs
    in this process during each profiling window at this rate (1–10000 Hz):
    CPU of the training thread, NIC throughput of ``sample_ifaces`` (a comma
    list of ``name`` or ``name:mbit`` for links without a reported speed),
    the GPU when built with NVML. The samples go next to the trace
    (``rank-<r>.samples.csv``) and the fingerprint's μ/σ then come from them
    (``util_source: "samples"``) instead of the trace alone. On by default
    at 1 kHz, only during windows (PerfTracker §4.2 samples hardware
    utilization during the profiling window; the sampler's own measured cost,
    2–4 % of one core at 1 kHz, is in BENCHMARKS.md). Set 0 on machines where
    ranks share oversubscribed CPUs (whyslow's own CI): there the training
    threads' CPU availability differs across ranks for reasons outside the
    job, and the μ/σ of CPU work would differ spuriously.

    ``ready_file``: when set, each rank creates this (empty) file once, as
    its first training step ends: a harness (whyslow's testbed) times its
    faults from when the job trains, not from launch, without the script's
    help. A failure to create it is logged once and ignored.

    ``agent_dir``: when set, the rank does not sample itself: a privileged
    ``whyslow agent --samples-dir DIR`` sidecar (PerfTracker §5: an
    unprivileged training container next to a privileged monitor, sharing a
    Kubernetes emptyDir) samples it. At window start the rank writes
    ``DIR/rank-<r>.request.json`` (rate ``sample_hz``, or 1000 when 0;
    interfaces ``sample_ifaces``), at window end ``DIR/rank-<r>.stop``; after
    exporting the trace it waits at most 5 s (in the background thread) for
    ``DIR/rank-<r>.done`` and uses ``DIR/rank-<r>.samples.csv`` like
    in-process samples. Any failure logs one line and the window is
    summarized without samples. Protocol: docs/agent.md.
    """

    disable: bool = False
    auto: bool = True
    report_dir: str = "./whyslow-reports"
    job_id: str = ""
    window_s: float = 20.0
    window_iters: int = 0
    window_max_mb: float = 1024.0
    m: int = 10
    n: int = 50
    threshold: float = 0.05
    block_factor: float = 5.0
    block_min_s: float = 1.0
    hang_grace_s: float = 10.0
    hang_gather_s: float = 20.0
    hang_quiet_s: float = 3.5
    flight_recorder: bool = True
    suggest_fix: bool = False
    k: int = 200
    recent: int = 0
    baseline: str = "rolling_mean"
    cooldown_s: float = 300.0
    max_per_hour: int = 6
    poll_s: float = 0.5
    lead_s: float = 2.0
    collect_timeout_s: float = 120.0
    keep_traces: bool = False
    localize_config: str = ""
    cuda: str = "auto"
    signal: bool = True
    exit_wait_s: float = 60.0
    log_level: str = "INFO"
    sample_hz: float = 1000.0
    sample_ifaces: str = ""
    agent_dir: str = ""
    ready_file: str = ""
    server: str = ""
    token: str = ""

    @classmethod
    def from_env(
        cls, env: Optional[Mapping[str, str]] = None, **overrides: Any
    ) -> "Config":
        env = os.environ if env is None else env
        cfg = cls()
        for f in dataclasses.fields(cls):
            raw = env.get("WHYSLOW_" + f.name.upper())
            if raw is not None and raw != "":
                setattr(cfg, f.name, _parse(f.type, raw, f.name))
        for name, value in overrides.items():
            if not hasattr(cfg, name):
                raise TypeError("whyslow.init: unknown setting %r" % name)
            setattr(cfg, name, value)
        if not cfg.job_id:
            cfg.job_id = env.get("TORCHELASTIC_RUN_ID") or "local"
        if cfg.job_id in ("none", ""):
            cfg.job_id = "local"
        if not cfg.recent:
            cfg.recent = 10 * cfg.n
        return cfg

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def _parse(typ: Any, raw: str, name: str) -> Any:
    t = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if t == "bool":
            return raw.strip().lower() in _TRUE
        if t == "int":
            return int(raw)
        if t == "float":
            return float(raw)
    except ValueError:
        raise ValueError("WHYSLOW_%s: cannot read %r as %s" % (name.upper(), raw, t))
    return raw

"""Type stubs of the native module whyslow._whyslow (apps/python)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

__version__: str
NOTHING: int
ITERATION: int
SLOWDOWN: int

class Detector:
    """PerfTracker §4.1 iteration and degradation detector."""

    def __init__(
        self,
        m: int = 10,
        n: int = 50,
        threshold: float = 0.05,
        block_factor: float = 5.0,
        k: int = 200,
        recent: Optional[int] = None,
        baseline: str = "rolling_mean",
        block_min_s: float = 0.0,
    ) -> None: ...
    def next(self, t_ns: int) -> int: ...
    def step(self, t_ns: int) -> int: ...
    def check_blocked(self, now_ns: int) -> Optional[Tuple[int, float]]: ...
    def pause(self) -> None: ...
    def resume(self, now_ns: int) -> None: ...
    def reset(self) -> None: ...
    def clear_statistics(self) -> None: ...
    @property
    def phase(self) -> str: ...
    @property
    def pattern(self) -> Optional[List[str]]: ...
    @property
    def iterations(self) -> int: ...
    @property
    def events(self) -> int: ...
    @property
    def redetections(self) -> int: ...
    @property
    def mean_ns(self) -> Optional[float]: ...
    @property
    def baseline_ns(self) -> Optional[float]: ...
    @property
    def last_duration_ns(self) -> Optional[int]: ...
    @property
    def last_slowdown(self) -> Optional[Tuple[float, float]]: ...
    @property
    def paused(self) -> bool: ...

class TriggerPolicy:
    """Cooldown and hourly cap on profiling windows."""

    def __init__(self, cooldown_s: float = 300.0, max_per_hour: int = 6) -> None: ...
    def check(self, now_ns: int) -> Optional[str]: ...
    def record(self, now_ns: int) -> None: ...
    def try_acquire(self, now_ns: int) -> Optional[str]: ...
    def in_last_hour(self, now_ns: int) -> int: ...

def cli_main(args: Sequence[str]) -> int:
    """Runs the ``whyslow`` command line (``["analyze", "traces/"]``) in this
    process; returns its exit code (0 ok, 1 error, 2 usage, 3 anomalies with
    ``--fail-on-anomaly``, 4 could not judge)."""
    ...

def summarize_trace(
    trace_path: str,
    out_path: Optional[str] = None,
    rank: Optional[int] = None,
    host: Optional[str] = None,
    group: Optional[str] = None,
    max_functions: int = 100,
    beta_floor: float = 0.001,
    samples_path: Optional[str] = None,
    job: Optional[str] = None,
) -> str: ...
def localize_fingerprints(
    fingerprints: Sequence[str],
    report_dir: str,
    world_size: Optional[int] = None,
    config_toml: Optional[str] = None,
    source_roots: Optional[Sequence[str]] = None,
    warnings: Optional[Sequence[str]] = None,
    iterations: Optional[Sequence[Tuple[int, float]]] = None,
    cross_layer: Optional[str] = None,
) -> str: ...
def kineto_base_ns(trace_path: str) -> Optional[int]: ...

class NetWatch:
    def __init__(self) -> None: ...
    def sample(self) -> Optional[str]: ...

class Sampler:
    @staticmethod
    def start(
        rate_hz: float,
        pid: Optional[int] = None,
        tid: Optional[int] = None,
        interfaces: Optional[Sequence[str]] = None,
    ) -> "Sampler": ...
    def stop(self) -> None: ...
    def write(self, path: str, worker: Optional[int] = None, base_ns: int = 0) -> Dict[str, Any]: ...
    @property
    def running(self) -> bool: ...

def parse_wire(kind: str, text: str) -> str:
    """Parses a wire record (``"request"`` or ``"done"`` of the agent
    protocol, ``"session"``) as whyslow's Rust side does and returns it as
    Rust writes it; ValueError names the bad field."""

def rebase_samples_file(src: str, dst: str, shift_ns: int) -> int:
    """Copies a samples file with ``shift_ns`` subtracted from every
    timestamp; returns the number of samples."""

def analyze_paths(
    paths: List[str],
    world_size: Optional[int] = None,
    strict: bool = False,
    source_roots: Optional[List[str]] = None,
    config_toml: Optional[str] = None,
    steps: Optional[Tuple[int, int]] = None,
) -> str: ...
def diagnose_spool(
    spool: str,
    fingerprints: Optional[List[str]] = None,
    html_path: Optional[str] = None,
    baseline: Optional[Tuple[float, float]] = None,
    window: Optional[Tuple[float, float]] = None,
    until: Optional[float] = None,
) -> str: ...
def diagnosis_table(report_json: str) -> str: ...
def report_html(report_json: str) -> str: ...
def report_table(report_json: str) -> str: ...

def hang_report(folder: str, world_size: Optional[int] = None, min_wait_s: Optional[float] = None,
                html_path: Optional[str] = None) -> Tuple[str, str]: ...

def fix_request(report_json: str, source_roots: Sequence[str], model: str,
                max_code_bytes: int = 16384) -> Tuple[str, int]: ...
def fix_answer(report_json: str, model: str, code_bytes: int, source_roots: Sequence[str],
               answer: Optional[str] = None, error: Optional[str] = None) -> Tuple[str, Optional[str]]: ...

"""whyslow's analysis from Python and notebooks: the same library calls as
the ``whyslow`` command line and the server (one job pipeline, one
diagnosis), with typed results.

>>> import whyslow
>>> report = whyslow.analyze("traces/")            # like `whyslow analyze traces/`
>>> report.verdict, report.missing_workers
>>> report.findings[0].function, report.findings[0].workers
>>> report.to_pandas()                             # one row per finding
>>> report                                         # in Jupyter: the HTML report
>>> d = whyslow.diagnose("agent-spool/")           # like `whyslow diagnose agent-spool/`
>>> d.layer, [s.rank for s in d.stragglers]
>>> d.to_pandas("cpu_diff")

PerfTracker §4.2–§4.3 (fingerprints, localization) and SysOM-AI §3.1
(cross-layer diagnosis). pandas is needed only for ``to_pandas``.
"""

from __future__ import annotations

import html
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _whyslow

__all__ = ["analyze", "diagnose", "hang", "suggest_fix", "Report", "Finding", "Stat", "Diagnosis", "Straggler", "Hang", "Culprit"]

PathLike = Union[str, "os.PathLike[str]"]


def _pandas():
    try:
        import pandas
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("to_pandas() needs pandas (pip install pandas)") from e
    return pandas


def _frame(html_page: str, height: int = 640) -> str:
    """A whole HTML page shown inline (a notebook cell) in its own frame, so
    its styles and scripts do not meet the notebook's."""
    return ('<iframe srcdoc="%s" style="width:100%%;height:%dpx;border:1px solid #ddd" '
            'sandbox="allow-scripts"></iframe>' % (html.escape(html_page, quote=True), height))


@dataclass(frozen=True)
class Stat:
    """A worker-set's value against its peers' (β, μ or σ)."""
    value: float
    peers: float

    @classmethod
    def _of(cls, d: Dict[str, Any]) -> "Stat":
        return cls(float(d.get("value", 0.0)), float(d.get("peers", 0.0)))


@dataclass(frozen=True)
class Finding:
    """An abnormal (function, workers): PerfTracker §4.3."""
    function: str
    kind: str
    workers: List[int]
    reason: str
    resource: str
    beta: Stat
    mu: Stat
    sigma: Stat
    hint: Optional[str]
    source_excerpt: Optional[str]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def _of(cls, d: Dict[str, Any]) -> "Finding":
        ex = d.get("source_excerpt")
        return cls(
            function=d["function"], kind=d["kind"], workers=list(d["workers"]),
            reason=d["reason"], resource=d["resource"], beta=Stat._of(d["beta"]),
            mu=Stat._of(d["mu"]), sigma=Stat._of(d["sigma"]), hint=d.get("hint"),
            source_excerpt=(ex.get("text") if isinstance(ex, dict) else ex), raw=d)


@dataclass(frozen=True)
class Straggler:
    """A rank late into its group's collectives (SysOM-AI §3.2)."""
    rank: int
    group: str
    late_us: float
    t: float


class Diagnosis:
    """The cross-layer diagnosis (SysOM-AI §3.1): the same JSON as
    ``whyslow diagnose --format json`` and the server's
    ``GET /api/v1/jobs/{job}/diagnosis``."""

    TABLES = ("stragglers", "cpu_diff", "offcpu_diff", "os_diff", "network_diff",
              "gpu_diff", "regressions", "collective_groups", "groups")

    def __init__(self, raw: Dict[str, Any], page: Optional[str] = None):
        self.raw = raw
        self._page = page
        self.layer: str = raw.get("layer", "none")
        self.stragglers: List[Straggler] = [
            Straggler(int(s["rank"]), s["group"], float(s["late_us"]), float(s["t"]))
            for s in raw.get("stragglers", [])]
        self.cpu_diff: List[Dict[str, Any]] = raw.get("cpu_diff", [])
        self.offcpu_diff: List[Dict[str, Any]] = raw.get("offcpu_diff", [])
        self.os_diff: List[Dict[str, Any]] = raw.get("os_diff", [])
        self.network_diff: List[Dict[str, Any]] = raw.get("network_diff", [])
        self.gpu_diff: List[Dict[str, Any]] = raw.get("gpu_diff", [])
        self.regressions: List[Dict[str, Any]] = raw.get("regressions", [])
        self.notes: List[str] = raw.get("notes", [])
        self.baseline: Tuple[float, float] = tuple(raw.get("baseline", (0.0, 0.0)))  # type: ignore
        self.window: Tuple[float, float] = tuple(raw.get("window", (0.0, 0.0)))  # type: ignore

    @classmethod
    def from_json(cls, text: str) -> "Diagnosis":
        return cls(json.loads(text))

    def to_json(self) -> str:
        return json.dumps(self.raw, indent=1)

    def to_pandas(self, table: str = "stragglers"):
        """One of :attr:`TABLES` as a DataFrame (one row per entry)."""
        if table not in self.TABLES:
            raise ValueError("table %r: one of %s" % (table, ", ".join(self.TABLES)))
        return _pandas().json_normalize(self.raw.get(table, []))

    def __str__(self) -> str:
        return _whyslow.diagnosis_table(json.dumps(self.raw))

    def __repr__(self) -> str:
        late = ", ".join("rank %d" % s.rank for s in self.stragglers) or "no late rank"
        return "<whyslow.Diagnosis: %s; layer %s>" % (late, self.layer)

    def _repr_html_(self) -> str:
        if self._page is None:
            return "<pre>%s</pre>" % html.escape(str(self))
        return _frame(self._page, 900)


class Report:
    """A job's report (PerfTracker §4.3, EROICA's output): the same JSON as
    ``whyslow analyze --format json`` and the server's session report."""

    def __init__(self, raw: Dict[str, Any]):
        self.raw = raw
        self.verdict: str = raw.get("verdict", "no_anomaly")
        self.workers: int = int(raw.get("workers", 0))
        self.missing_workers: List[int] = list(raw.get("missing_workers", []))
        self.findings: List[Finding] = [Finding._of(f) for f in raw.get("findings", [])]
        self.warnings: List[str] = list(raw.get("warnings", []))
        self.not_judged: List[str] = list(raw.get("not_judged", []))
        self.iterations: Optional[Dict[str, Any]] = raw.get("iterations")
        cl = raw.get("cross_layer")
        self.cross_layer: Optional[Diagnosis] = Diagnosis(cl) if cl else None
        # A model's proposed fix (EROICA's first step), when one was asked for.
        self.fix: Optional[Dict[str, Any]] = raw.get("fix")
        self.fix_error: Optional[str] = raw.get("fix_error")

    @classmethod
    def from_json(cls, text: str) -> "Report":
        return cls(json.loads(text))

    @classmethod
    def load(cls, path: PathLike) -> "Report":
        """A ``report.json`` written by the command line or the package."""
        with open(path) as f:
            return cls.from_json(f.read())

    def to_json(self) -> str:
        return json.dumps(self.raw, indent=1)

    def to_pandas(self):
        """The findings, one row each: function, kind, workers, reason,
        resource, β/μ/σ and their peers', hint."""
        rows = [{
            "function": f.function, "kind": f.kind, "workers": f.workers, "reason": f.reason,
            "resource": f.resource, "beta": f.beta.value, "beta_peers": f.beta.peers,
            "mu": f.mu.value, "mu_peers": f.mu.peers, "sigma": f.sigma.value,
            "sigma_peers": f.sigma.peers, "hint": f.hint,
        } for f in self.findings]
        cols = ["function", "kind", "workers", "reason", "resource", "beta", "beta_peers",
                "mu", "mu_peers", "sigma", "sigma_peers", "hint"]
        return _pandas().DataFrame(rows, columns=cols)

    def __str__(self) -> str:
        return _whyslow.report_table(json.dumps(self.raw))

    def __repr__(self) -> str:
        return "<whyslow.Report: %s, %d finding(s), %d worker(s)%s>" % (
            self.verdict, len(self.findings), self.workers,
            ", missing %s" % self.missing_workers if self.missing_workers else "")

    def _repr_html_(self) -> str:
        return _frame(_whyslow.report_html(json.dumps(self.raw)))


def _paths(p: Union[PathLike, Sequence[PathLike]]) -> List[str]:
    if isinstance(p, (str, os.PathLike)):
        return [os.fspath(p)]
    return [os.fspath(x) for x in p]


def analyze(paths: Union[PathLike, Sequence[PathLike]], *, world_size: Optional[int] = None,
            strict: bool = False, source_roots: Optional[Sequence[PathLike]] = None,
            config: Optional[PathLike] = None, steps: Optional[Tuple[int, int]] = None) -> Report:
    """Reads every worker's trace (PyTorch profiler/Kineto, generic events),
    hardware samples and fingerprints under ``paths``, fingerprints them and
    names the abnormal (function, workers): ``whyslow analyze`` as a call.
    ``source_roots`` (default: the working directory) is where Python
    findings' code is quoted from; ``config`` a localize TOML file. Raises
    ValueError when the inputs cannot be judged (nothing readable, traces of
    different jobs, a refusal under ``strict``)."""
    toml = None
    if config is not None:
        with open(config) as f:
            toml = f.read()
    roots = _paths(source_roots) if source_roots is not None else [os.getcwd()]
    text = _whyslow.analyze_paths(_paths(paths), world_size=world_size, strict=strict,
                                  source_roots=roots, config_toml=toml, steps=steps)
    return Report.from_json(text)


def diagnose(spool: PathLike, *, fingerprints: Optional[Union[PathLike, Sequence[PathLike]]] = None,
             baseline: Optional[Tuple[float, float]] = None,
             window: Optional[Tuple[float, float]] = None,
             until: Optional[float] = None) -> Diagnosis:
    """The cross-layer diagnosis over a node agent's spool (``whyslow agent
    --profile-spool``): late ranks, the layer (GPU, CPU, OS, network), the
    CPU/off-CPU/OS/network/GPU diffs and the regressions since the baseline —
    ``whyslow diagnose`` as a call. ``fingerprints`` (fingerprints or traces
    per rank) give the GPU layer. Raises ValueError when the spool holds
    nothing to diagnose."""
    fps = _paths(fingerprints) if fingerprints is not None else None
    with tempfile.TemporaryDirectory(prefix="whyslow-diagnose-") as d:
        page_path = os.path.join(d, "diagnose.html")
        text = _whyslow.diagnose_spool(os.fspath(spool), fingerprints=fps, html_path=page_path,
                                       baseline=baseline, window=window, until=until)
        with open(page_path) as f:
            page = f.read()
    return Diagnosis(json.loads(text), page)


class Culprit:
    """A rank a hung job waits for (``whyslow hang``)."""

    def __init__(self, raw: Dict[str, Any]):
        self.raw = raw
        self.rank: int = int(raw["rank"])
        self.reason: str = raw["reason"]
        self.group: str = raw.get("group_desc") or raw.get("group", "")
        self.op: str = raw.get("op", "")
        self.seq: int = int(raw.get("seq", 0))
        self.detail: str = raw.get("detail", "")
        self.waited_by: List[int] = [int(r) for r in raw.get("waited_by", [])]
        stack = raw.get("stack") or {}
        self.stack: List[str] = [
            "%s (%s:%s)" % (f["function"], f.get("file", ""), f.get("line", 0)) if f.get("file") else f["function"]
            for f in stack.get("frames", [])]

    def __repr__(self) -> str:
        return "<whyslow.Culprit rank %d: %s, %s seq %d of %s>" % (
            self.rank, self.reason, self.op, self.seq, self.group)


class Hang:
    """A hang's verdict: the same JSON as ``whyslow hang --format json``,
    the online package's ``hang-report.json`` and the server's ``GET
    /api/v1/jobs/{job}/hang``."""

    def __init__(self, raw: Dict[str, Any], page: Optional[str] = None):
        self.raw = raw
        self._page = page
        self.hang: bool = bool(raw.get("hang"))
        self.verdict: str = raw.get("verdict", "")
        self.culprits: List[Culprit] = [Culprit(c) for c in raw.get("culprits", [])]
        self.waiting: List[Dict[str, Any]] = raw.get("waiting", [])
        self.notes: List[str] = raw.get("notes", [])

    def to_json(self) -> str:
        return json.dumps(self.raw, indent=1)

    def to_pandas(self, table: str = "culprits"):
        """``culprits`` or ``waiting`` as a DataFrame."""
        if table not in ("culprits", "waiting"):
            raise ValueError("table %r: culprits or waiting" % table)
        return _pandas().json_normalize(self.raw.get(table, []))

    def __str__(self) -> str:
        return self.verdict

    def __repr__(self) -> str:
        return "<whyslow.Hang: %s>" % self.verdict

    def _repr_html_(self) -> str:
        if self._page is None:
            return "<pre>%s</pre>" % html.escape(self.verdict)
        return _frame(self._page, 700)


def hang(folder: PathLike, *, world_size: Optional[int] = None,
         min_wait_s: Optional[float] = None) -> Hang:
    """Who a hung job waits for, from what its ranks left in ``folder``
    (PyTorch Flight Recorder dumps, whyslow's stack files, an agent's
    collective records and profiles) — ``whyslow hang`` as a call. Raises
    ValueError exactly where the command exits 1: a folder that cannot be
    read or holds nothing a rank left, a world size or bound out of range."""
    with tempfile.TemporaryDirectory(prefix="whyslow-hang-") as d:
        page_path = os.path.join(d, "hang.html")
        text, _ = _whyslow.hang_report(os.fspath(folder), world_size, min_wait_s, page_path)
        with open(page_path) as f:
            page = f.read()
    return Hang(json.loads(text), page)


def suggest_fix(report: Union["Report", PathLike], *, source_roots: Optional[Sequence[PathLike]] = None,
                url: Optional[str] = None, model: Optional[str] = None,
                timeout_s: float = 120.0, dry_run: bool = False) -> Union["Report", str]:
    """EROICA's first step: asks an OpenAI-compatible model (``url`` or
    WHYSLOW_LLM_URL, ``model`` or WHYSLOW_LLM_MODEL, the key from
    WHYSLOW_LLM_API_KEY or _FILE) for a fix of ``report`` (a Report or a
    ``report.json`` path), with the findings and their code under
    ``source_roots`` (default: the working directory). Returns the Report
    with ``fix`` (``.fix["patch"]``, ``.fix["applies"]``) or ``fix_error``;
    with ``dry_run`` the request body, sent nowhere. Never raises for the
    endpoint: its failure is ``fix_error``."""
    from ._fix import suggest_fix as _suggest

    if isinstance(report, Report):
        text = json.dumps(report.raw)
    else:
        with open(os.fspath(report)) as f:
            text = f.read()
    roots = _paths(source_roots) if source_roots is not None else [os.getcwd()]
    out, _ = _suggest(text, roots, url=url, model=model, timeout_s=timeout_s, dry_run=dry_run)
    return out if dry_run else Report.from_json(out)

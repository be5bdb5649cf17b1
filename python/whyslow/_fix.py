"""EROICA's first step from Python: one request to an OpenAI-compatible
chat-completions API with the report's findings and their code, its answer
put into the report. The request, the answer's meaning and the patch check
are the Rust library's (`whyslow_fix`, the same calls as `whyslow analyze
--suggest-fix`); only the HTTP exchange is Python's.

Settings: WHYSLOW_LLM_URL (base URL; the request goes to
{base}/chat/completions), WHYSLOW_LLM_MODEL, WHYSLOW_LLM_API_KEY or
WHYSLOW_LLM_API_KEY_FILE. The key goes only in the Authorization header.
"""

from __future__ import annotations

import json
import os
import time
from typing import Optional, Sequence, Tuple

from . import _whyslow

#: Seconds for the whole exchange, unless given.
DEFAULT_TIMEOUT_S = 120.0


def _key() -> Optional[str]:
    k = os.environ.get("WHYSLOW_LLM_API_KEY", "").strip()
    if k:
        return k
    f = os.environ.get("WHYSLOW_LLM_API_KEY_FILE", "")
    if f:
        with open(f) as fh:
            return fh.read().strip() or None
    return None


def _post(url: str, body: str, key: Optional[str], timeout_s: float) -> Tuple[Optional[str], Optional[str]]:
    """(answer body, None) or (None, why in one line); never raises."""
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(url, data=body.encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.read(8 << 20).decode(errors="replace"), None
    except urllib.error.HTTPError as e:
        try:
            detail = e.read(4096).decode(errors="replace")
            msg = json.loads(detail).get("error", {}).get("message", "")
        except Exception:
            msg = ""
        return None, "%s: HTTP %d%s" % (url, e.code, (": " + msg.splitlines()[0]) if msg else "")
    except Exception as e:  # URLError, timeouts, resets
        return None, "%s: %s" % (url, str(e).splitlines()[0] if str(e) else type(e).__name__)


def suggest_fix(report_json: str, source_roots: Sequence[str], *, url: Optional[str] = None,
                model: Optional[str] = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                dry_run: bool = False) -> Tuple[str, Optional[str]]:
    """Asks for a fix of the report (its JSON text). Returns (the report JSON
    with ``fix`` or ``fix_error``, the patch or None); with ``dry_run``,
    (the request body, None) and nothing is sent."""
    url = (url or os.environ.get("WHYSLOW_LLM_URL", "")).strip().rstrip("/")
    model = model or os.environ.get("WHYSLOW_LLM_MODEL") or "default"
    roots = [os.fspath(r) for r in source_roots]
    body, code_bytes = _whyslow.fix_request(report_json, roots, model)
    if dry_run:
        return body, None
    if not url:
        return _whyslow.fix_answer(report_json, model, code_bytes, roots,
                                   error="WHYSLOW_LLM_URL is not set (the model's base URL)")
    try:
        key = _key()
    except OSError as e:
        return _whyslow.fix_answer(report_json, model, code_bytes, roots,
                                   error="WHYSLOW_LLM_API_KEY_FILE: %s" % e)
    endpoint = url + "/chat/completions"
    started = time.monotonic()
    answer, why = _post(endpoint, body, key, timeout_s)
    seconds = round(time.monotonic() - started, 2)
    if answer is None:
        return _whyslow.fix_answer(report_json, model, code_bytes, roots, error=why)
    report, patch = _whyslow.fix_answer(report_json, model, code_bytes, roots, answer=answer,
                                        seconds=seconds)
    r = json.loads(report)
    if r.get("fix_error"):
        r["fix_error"] = "%s: %s" % (endpoint, r["fix_error"])
        report = json.dumps(r, indent=2)
    return report, patch


def suggest_fix_for_session(sdir: str, source_roots: Sequence[str], log) -> None:
    """The online package, after a report is written (a background thread,
    never the training path): asks, rewrites ``report.json`` (and
    ``report.html`` when present) with the answer, writes ``fix.patch``
    beside them; one log line either way."""
    path = os.path.join(sdir, "report.json")
    with open(path) as f:
        report_json = f.read()
    report, patch = suggest_fix(report_json, source_roots)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(report)
    os.replace(tmp, path)
    html_path = os.path.join(sdir, "report.html")
    if os.path.exists(html_path):
        with open(html_path, "w") as f:
            f.write(_whyslow.report_html(report))
    r = json.loads(report)
    if patch:
        with open(os.path.join(sdir, "fix.patch"), "w") as f:
            f.write(patch)
    if r.get("fix"):
        fx = r["fix"]
        log.warning("whyslow: a model's proposed fix (%s, %d bytes of code sent) in %s%s",
                    fx.get("model"), fx.get("code_bytes", 0), path,
                    "; patch: %s (%s)" % (os.path.join(sdir, "fix.patch"),
                                          "applies" if fx.get("applies") else "does not apply")
                    if patch else "")
    else:
        log.warning("whyslow: no fix proposal: %s", r.get("fix_error", "?"))

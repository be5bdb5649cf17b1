"""Binding and configuration unit tests (no torch needed)."""

import json
import os

import pytest

import whyslow
from whyslow import _whyslow
from whyslow._config import Config

MS = 1_000_000


def feed(d, n, dur_ms, t):
    code = 0
    for _ in range(n):
        d.next(t)
        code = d.step(t + dur_ms * MS)
        t += dur_ms * MS
    return t, code


def test_detector_binding_follows_section_4_1():
    d = _whyslow.Detector()
    t, _ = feed(d, 11, 100, 0)
    assert d.phase == "monitoring" and d.pattern == ["next", "step"]
    t, code = feed(d, 100, 100, t)
    assert code == _whyslow.ITERATION
    codes = []
    for _ in range(20):
        t, c = feed(d, 1, 120, t)
        codes.append(c)
    assert codes.index(_whyslow.SLOWDOWN) == 12  # the 13th slow iteration
    mean, base = d.last_slowdown
    assert base == pytest.approx(100 * MS)
    assert d.check_blocked(t + 499 * MS) is None or d.mean_ns * 5 <= 499 * MS
    with pytest.raises(ValueError):
        _whyslow.Detector(baseline="nope")
    with pytest.raises(ValueError):
        _whyslow.Detector(m=1)


def test_policy_binding():
    p = _whyslow.TriggerPolicy(10.0, 2)
    assert p.try_acquire(0) is None
    assert "cooldown" in p.check(1 * 10**9)
    assert p.try_acquire(11 * 10**9) is None
    assert "profiles in the last hour" in p.check(30 * 10**9)


def test_config_env_and_overrides():
    c = Config.from_env({"WHYSLOW_WINDOW_S": "7", "WHYSLOW_KEEP_TRACES": "1",
                         "TORCHELASTIC_RUN_ID": "job42"}, n=20)
    assert c.window_s == 7.0 and c.keep_traces and c.n == 20 and c.recent == 200
    assert c.job_id == "job42" and c.report_dir == "./whyslow-reports"
    with pytest.raises(TypeError):
        Config.from_env({}, bogus=1)
    with pytest.raises(ValueError):
        Config.from_env({"WHYSLOW_N": "many"})


def test_summarize_errors_are_value_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError):
        _whyslow.summarize_trace(str(bad))


def test_import_outside_torchrun_does_nothing():
    assert whyslow.tracker() is None or "RANK" in os.environ


def test_readme_settings_table_matches_the_config():
    """python/README.md lists every WHYSLOW_* setting the Config reads, and no other."""
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "python", "whyslow", "_config.py")) as f:
        code = set(re.findall(r"\b(WHYSLOW_[A-Z_]+)\b", f.read()))
    with open(os.path.join(root, "python", "README.md")) as f:
        table = set()
        for line in f:
            if line.startswith("| `WHYSLOW_"):
                table.update(re.findall(r"`(WHYSLOW_[A-Z_]+)`", line.split("|")[1]))
    assert code - table == set(), "settings missing from python/README.md"
    assert table - code == set(), "python/README.md documents settings the code does not read"



def test_the_command_line_ships_in_the_package(tmp_path):
    """`python -m whyslow analyze` and the wheel's `whyslow` are the CLI."""
    import subprocess
    import sys
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    demo = os.path.join(root, "examples", "data", "slow-rank-cpu-gloo")
    p = subprocess.run([sys.executable, "-m", "whyslow", "analyze", demo, "--format", "json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    rep = json.loads(p.stdout)
    assert rep["verdict"] == "anomalies"
    assert rep["findings"][0]["workers"] == [2], rep["findings"][0]
    assert "injected_slow_rank_work" in rep["findings"][0]["function"]
    exe = os.path.join(os.path.dirname(sys.executable), "whyslow")
    assert os.path.exists(exe), "the wheel installs no `whyslow` command"
    p = subprocess.run([exe, "--version"], stdout=subprocess.PIPE, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith(b"whyslow "), p.stdout
    # A usage error is an exit code, not the end of the calling interpreter.
    assert _whyslow.cli_main(["no-such-command"]) == 2
    # Issue 47: the full binary's commands, asked of the wheel's, say in one
    # line where they are; output cut short by a closed pipe (`| head`) is no
    # traceback.
    for cmd in ("agent", "server", "profile"):
        p = subprocess.run([exe, cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        said = (p.stdout + p.stderr).decode().strip().splitlines()
        assert p.returncode != 0 and len(said) == 1, (cmd, p.returncode, said)
        assert "full binary" in said[0] and "cargo install" in said[0], said
    p = subprocess.run("%s analyze --help | head -1" % exe, shell=True, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    assert b"Traceback" not in p.stderr and b"BrokenPipe" not in p.stderr, p.stderr.decode()
    # `trigger` stays Python's own subcommand.
    p = subprocess.run([sys.executable, "-m", "whyslow", "trigger", "--report-dir", str(tmp_path),
                        "--job", "j"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert p.returncode == 0 and (tmp_path / "j" / "TRIGGER").exists(), p.stderr.decode()


def test_agent_wire_round_trips_between_python_and_rust(tmp_path):
    """docs/agent.md: what the rank writes is what the Rust agent reads, and
    the done record the agent writes carries what the rank reads back."""
    import json
    from whyslow._agent import AgentWindow
    w = AgentWindow(str(tmp_path), rank=3, pid=os.getpid(), tid=os.getpid(), rate_hz=500.0,
                    interfaces=["lo:1000"], window_s=2.0, session=7)
    text = (tmp_path / "rank-3.request.json").read_text()
    written = json.loads(text)
    read = json.loads(_whyslow.parse_wire("request", text))
    for key in ("pid", "tid", "rank", "rate_hz", "interfaces", "time_base_ns", "id",
                "proc_start_ticks"):
        assert read[key] == written[key], key
    assert set(written) <= set(read), "fields the agent does not know: %s" % (set(written) - set(read))
    # The done record as the agent writes it has what AgentWindow.collect uses.
    done = json.loads(_whyslow.parse_wire("done", json.dumps(
        {"id": w.id, "rank": 3, "pid": os.getpid(), "reason": "stop file",
         "samples": "rank-3.samples.csv", "extra": None})))
    assert {"id", "samples", "time_base_ns"} <= set(done) and done["id"] == w.id
    with pytest.raises(ValueError, match="pid"):
        _whyslow.parse_wire("request", '{"pid": "x"}')


def test_session_record_round_trips_between_python_and_rust():
    """The session record ranks agree on: what Python writes, Rust reads
    (whyslow_model::wire::SessionRecord) with the same values, and back."""
    import json
    from whyslow._session import read_session, session_record
    s = session_record(session=3, target=140, iters=60, window_s=2.5, reason="slowdown +80 %",
                       proposer=1, world_size=4)
    back = read_session(json.dumps(s).encode())
    assert back == s
    for key, bad in (("iters", 0), ("proposer", 4), ("stamp", "../x"), ("target", "soon")):
        with pytest.raises(ValueError, match=key):
            read_session(json.dumps(dict(s, **{key: bad})))


def test_agent_registration_round_trips_and_is_removed_at_exit(tmp_path):
    """`import whyslow` registers the process with the node agent
    (whyslow_model::wire::ProcessRegistration, proc-<pid>.json): what
    Python writes, Rust reads; a bad job id is refused; unregister removes it."""
    import json
    from whyslow import _agent, _whyslow
    path = _agent.register(str(tmp_path), rank=3, local_rank=1, world_size=8, job="job-a", host="h1")
    assert os.path.basename(path) == "proc-%d.json" % os.getpid()
    with open(path) as f:
        rec = json.load(f)
    assert (rec["pid"], rec["rank"], rec["job"], rec["host"]) == (os.getpid(), 3, "job-a", "h1")
    assert rec["proc_start_ticks"] > 0
    assert json.loads(_whyslow.parse_wire("register", json.dumps(rec))) == rec
    with pytest.raises(ValueError, match="job"):
        _agent.register(str(tmp_path), rank=0, local_rank=0, world_size=1, job="../x", host="h")
    _agent.unregister(path)
    assert not os.path.exists(path)


def test_the_agent_names_its_spool_for_rank_0(tmp_path):
    """`whyslow agent --profile-spool S` writes agent.json
    (whyslow_model::wire::AgentInfo) in its registration directory: what the
    agent writes, the package reads (collect's cross_layer); a bad one is
    refused with the field."""
    import json
    import signal
    import subprocess
    import time
    from test_agent import whyslow_bin
    from whyslow import _whyslow
    exe = whyslow_bin()
    if exe is None:
        pytest.fail("no whyslow binary (build it: cargo build -p whyslow)")
    reg, spool = tmp_path / "reg", tmp_path / "spool"
    reg.mkdir()
    agent = subprocess.Popen([exe, "agent", "--samples-dir", str(reg), "--profile-spool", str(spool),
                              "--os-interval", "0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        path = reg / "agent.json"
        for _ in range(100):
            if path.exists():
                break
            time.sleep(0.1)
        info = json.loads(_whyslow.parse_wire("agent", path.read_text()))
        assert info == {"pid": agent.pid, "spool": str(spool)}
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
    with pytest.raises(ValueError, match="pid"):
        _whyslow.parse_wire("agent", '{"pid": "x"}')


def test_a_profiling_window_ends_when_memory_grows_past_the_cap(monkeypatch):
    """torch.profiler keeps the window's events in memory: past
    WHYSLOW_WINDOW_MAX_MB of growth the window ends early (a 696-iteration
    window once grew a rank to 5.7 GB and got it OOM-killed); 0 turns the
    cap off."""
    from whyslow import _window
    rss = {"mb": 500.0}
    monkeypatch.setattr(_window, "_rss_mb", lambda: rss["mb"])
    session = {"iters": 1000, "window_s": 0.0}
    for cap, ends in ((256.0, True), (0.0, False)):
        rss["mb"] = 500.0
        w = _window.ProfileWindow(Config(window_max_mb=cap), session, rank=0, start_step=0, t0=0)
        w.prof = type("P", (), {"step": lambda self: None})()
        assert not w.tick(4, 1)
        rss["mb"] = 900.0  # +400 MB
        assert w.tick(8, 2) is ends
        assert (w.ended_for_memory is not None) is ends


def test_the_profiler_starts_and_stops_only_once_the_other_threads_are_idle():
    """torch's Python tracer walks every thread state unlocked when it starts
    and stops; a gloo worker creating one at that moment crashed a rank
    (SIGSEGV, issue 9). The window waits, bounded, until no other thread of
    the process is runnable: at once when they sleep, ≤ the bound when one
    keeps running."""
    import hashlib
    import threading
    import time as _time

    from whyslow import _window

    t0 = _time.monotonic()
    assert _window._wait_for_idle_threads(2.0) < 50
    assert _time.monotonic() - t0 < 1.0

    stop, tid = threading.Event(), []
    data = b"x" * (8 << 20)

    def spin():  # hashlib releases the GIL: this thread stays runnable
        tid.append(threading.get_native_id())
        while not stop.is_set():
            hashlib.sha256(data).digest()

    th = threading.Thread(target=spin, daemon=True)
    th.start()
    try:
        while not tid:
            _time.sleep(0.001)
        seen = any(tid[0] in _window._runnable_threads() for _ in range(200))
        assert seen, "a thread hashing 8 MB blocks was never seen runnable"
        t0 = _time.monotonic()
        assert _window._wait_for_idle_threads(0.1) > 0
        assert _time.monotonic() - t0 < 1.0
    finally:
        stop.set()
        th.join()
    t0 = _time.monotonic()
    assert _window._wait_for_idle_threads(2.0) < 50
    assert _time.monotonic() - t0 < 1.0


def test_fingerprints_wait_on_disk_while_the_server_is_away(tmp_path):
    """Issue 14 / SysOM-AI §7: an upload that finds no server (or a 5xx) is
    kept on local disk and sent, oldest first, before the next one once the
    server answers; a refusal (4xx) is not kept; kept uploads over an hour
    old are dropped."""
    import http.server
    import threading
    import time as _time

    from whyslow import _collect

    got, mode = [], {"status": 503}

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            code = mode["status"]
            if code == 201:
                got.append((self.path, json.loads(body)["w"]))
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cfg = Config.from_env({"WHYSLOW_SERVER": "http://127.0.0.1:%d" % srv.server_address[1],
                           "WHYSLOW_TOKEN": "t", "WHYSLOW_REPORT_DIR": str(tmp_path),
                           "WHYSLOW_JOB_ID": "job/1"})
    pending = tmp_path / "job%2F1" / ".upload-pending"
    try:
        # The server answers 503, then is gone altogether: both kept.
        assert not _collect.upload(cfg, str(tmp_path / "s1"), '{"w": 1}', 0)
        down = Config.from_env({"WHYSLOW_SERVER": "http://127.0.0.1:9", "WHYSLOW_TOKEN": "t",
                                "WHYSLOW_REPORT_DIR": str(tmp_path), "WHYSLOW_JOB_ID": "job/1"})
        assert not _collect.upload(down, str(tmp_path / "s2"), '{"w": 2}', 0)
        assert sorted(os.listdir(pending)) == ["s1-rank0.json", "s2-rank0.json"]
        # Back: the kept ones go first, in order, then the new one.
        mode["status"] = 201
        os.utime(pending / "s1-rank0.json", (_time.time() - 20, _time.time() - 20))
        assert _collect.upload(cfg, str(tmp_path / "s3"), '{"w": 3}', 0)
        assert [w for _, w in got] == [1, 2, 3], got
        assert all(p.startswith("/api/v1/jobs/job%2F1/sessions/s") for p, _ in got)
        assert os.listdir(pending) == []
        # A refusal is not kept.
        mode["status"] = 400
        assert not _collect.upload(cfg, str(tmp_path / "s4"), '{"w": 4}', 0)
        assert os.listdir(pending) == []
        # Away again; a kept upload older than the bound is dropped.
        mode["status"] = 503
        assert not _collect.upload(cfg, str(tmp_path / "s5"), '{"w": 5}', 0)
        old = _time.time() - _collect.PENDING_MAX_AGE_S - 60
        os.utime(pending / "s5-rank0.json", (old, old))
        mode["status"] = 201
        assert _collect.upload(cfg, str(tmp_path / "s6"), '{"w": 6}', 0)
        assert [w for _, w in got][-1] == 6 and 5 not in [w for _, w in got]
    finally:
        srv.shutdown()


REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEMO = os.path.join(REPO, "examples", "data", "slow-rank-cpu-gloo")
SINGLE = os.path.join(REPO, "tests", "fixtures", "kineto", "single")


def test_the_package_judges_as_the_command_line_does(tmp_path):
    """The job pipeline behind the package (issue 26): three of the demo's
    four ranks name rank 2 and report rank 3 missing from the world size
    the traces carry; fingerprints of two different jobs are refused."""
    fps = [_whyslow.summarize_trace(os.path.join(DEMO, "rank-%d.json.gz" % r)) for r in range(3)]
    assert all(json.loads(f)["job"]["world_size"] == 4 for f in fps)
    _whyslow.localize_fingerprints(fps, str(tmp_path / "report"))
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["missing_workers"] == [3]
    assert any(f["workers"] == [2] for f in report["findings"]), report["findings"]

    mixed = [_whyslow.summarize_trace(os.path.join(SINGLE, n))
             for n in ("a100-rank3of8.json.gz", "mi250-rocm.json.gz")]
    with pytest.raises(ValueError, match="2 different jobs"):
        _whyslow.localize_fingerprints(mixed, str(tmp_path / "mixed"))


def test_analyze_and_diagnose_from_a_notebook(tmp_path):
    """`whyslow.analyze` / `whyslow.diagnose` (issue 26): typed results of the
    same library calls as the command line; tables for pandas; the HTML
    report inline."""
    report = whyslow.analyze(DEMO)
    assert report.verdict == "anomalies" and report.missing_workers == []
    top = report.findings[0]
    assert top.workers == [2] and "injected_slow_rank_work" in top.function, top
    assert top.beta.value > top.beta.peers
    assert "<iframe" in report._repr_html_() and "Why is this training job slow?" in report._repr_html_()
    assert "injected_slow_rank_work" in str(report)
    pd = pytest.importorskip("pandas", reason="to_pandas needs pandas")
    df = report.to_pandas()
    assert isinstance(df, pd.DataFrame) and len(df) == len(report.findings)
    assert df.loc[0, "workers"] == [2]
    # Three of four ranks: rank 3 named missing, as the command line says.
    three = whyslow.analyze([os.path.join(DEMO, "rank-%d.json.gz" % r) for r in range(3)])
    assert three.missing_workers == [3]
    with pytest.raises(ValueError, match="different jobs"):
        whyslow.analyze([os.path.join(SINGLE, "a100-rank3of8.json.gz"),
                         os.path.join(SINGLE, "mi250-rocm.json.gz")])
    # A recorded agent spool: the late rank and its layer.
    d = whyslow.diagnose(os.path.join(REPO, "tests", "fixtures", "diagnose", "noisy-neighbour", "agent"))
    assert [s.rank for s in d.stragglers] == [2], d.notes
    assert d.layer == "os" and d.cpu_diff[0]["function"] == "sh (process)", d.cpu_diff[:1]
    assert "late rank 2" in d._repr_html_()
    assert len(d.to_pandas("stragglers")) == 1
    with pytest.raises(ValueError, match="nothing to diagnose"):
        whyslow.diagnose(str(tmp_path))
    # Issue 45: a bad period is refused here as on the command line.
    spool = os.path.join(REPO, "tests", "fixtures", "diagnose", "noisy-neighbour", "agent")
    with pytest.raises(ValueError, match="needs 0 <= A < B"):
        whyslow.diagnose(spool, baseline=(5.0, 2.0))


def test_the_flight_recorder_is_on_by_default_but_never_over_the_users_setting(monkeypatch):
    from whyslow import _hang

    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    _hang.enable_flight_recorder()
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == _hang.FR_DEFAULT_ENTRIES
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    _hang.enable_flight_recorder()
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == "0"
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE")
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "100")
    _hang.enable_flight_recorder()
    assert "TORCH_FR_BUFFER_SIZE" not in os.environ


def test_a_hang_report_from_recorded_dumps(tmp_path):
    # The binding the online package calls: the same verdict as `whyslow hang`.
    root = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hang", "sleep")
    report, table = _whyslow.hang_report(root, 4)
    r = json.loads(report)
    assert [c["rank"] for c in r["culprits"]] == [2], table
    assert "stalled_data_loader" in table
    html = tmp_path / "hang.html"
    _whyslow.hang_report(root, None, None, str(html))
    assert "waits-for graph" in html.read_text()
    with pytest.raises(ValueError):
        _whyslow.hang_report(str(tmp_path / "missing"))


def test_whyslow_hang_as_a_call():
    root = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hang", "mismatch")
    h = whyslow.hang(root)
    assert h.hang and [c.rank for c in h.culprits] == [2]
    assert h.culprits[0].reason == "mismatch" and h.culprits[0].group == "dp"
    assert "waits-for graph" in h._repr_html_()
    healthy = whyslow.hang(os.path.join(os.path.dirname(__file__), "..", "fixtures", "hang", "healthy"))
    assert not healthy.hang and not healthy.culprits


def test_whyslow_hang_raises_value_error_where_the_cli_exits_1(tmp_path):
    # Issue 42: a folder that cannot be read, one of garbage, a world size
    # out of range: ValueError with the cause, as `whyslow hang` exits 1.
    with pytest.raises(ValueError, match="cannot list the folder"):
        whyslow.hang(tmp_path / "nonexistent")
    (tmp_path / "_dump_3").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "x.json").write_text("junk")
    with pytest.raises(ValueError, match="nothing a rank left.*_dump_3"):
        whyslow.hang(tmp_path)
    root = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hang", "sleep")
    with pytest.raises(ValueError, match="world size"):
        whyslow.hang(root, world_size=4_000_000_000)
    big = whyslow.hang(root, world_size=1_000_000)
    assert [c.rank for c in big.culprits][:1] == [2]


def _stand_in(status, answer):
    """An OpenAI-compatible stand-in: records requests, replays `answer`."""
    import http.server
    import threading

    seen = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
            seen.append((self.path, dict(self.headers), body))
            data = answer.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return "http://127.0.0.1:%d/v1" % srv.server_address[1], seen, srv


def test_suggest_fix_from_python_makes_the_command_lines_request(tmp_path, monkeypatch):
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    report = whyslow.analyze(os.path.join(root, "examples", "data", "slow-rank-cpu-gloo"),
                             source_roots=[os.path.join(root, "examples")])
    content = ("Remove the injected call.\n```diff\n--- a/train.py\n+++ b/train.py\n@@ -214,2 +214,2 @@\n"
               "                 if a.fault == \"slow-rank\" and rank == a.fault_rank:\n"
               "-                    injected_slow_rank_work(a.fault_ms)\n+                    pass\n```\n")
    url, seen, srv = _stand_in(200, json.dumps({"choices": [{"message": {"content": content}}]}))
    monkeypatch.setenv("WHYSLOW_LLM_API_KEY", "sk-py-secret")
    try:
        fixed = whyslow.suggest_fix(report, source_roots=[os.path.join(root, "examples")], url=url,
                                    model="stand-in")
    finally:
        srv.shutdown()
    assert fixed.fix and fixed.fix["applies"] is True, fixed.fix
    assert fixed.fix["model"] == "stand-in"
    (path, headers, body), = seen
    assert path == "/v1/chat/completions"
    assert headers.get("Authorization") == "Bearer sk-py-secret"
    assert "sk-py-secret" not in body and "sk-py-secret" not in json.dumps(fixed.raw)
    assert "def injected_slow_rank_work" in json.loads(body)["messages"][1]["content"]
    # --dry-run's twin: the body, sent nowhere.
    dry = whyslow.suggest_fix(report, source_roots=[os.path.join(root, "examples")], url=url,
                              model="stand-in", dry_run=True)
    assert json.loads(dry)["model"] == "stand-in" and len(seen) == 1
    # A server that is down: the report, with fix_error, nothing raised.
    down = whyslow.suggest_fix(report, url="http://127.0.0.1:9/v1", timeout_s=5)
    assert down.fix is None and "127.0.0.1:9" in down.fix_error
    assert [f.function for f in down.findings] == [f.function for f in report.findings]


def test_fingerprints_carry_the_schedulers_name_and_labels_and_the_network():
    """Issue 30: the job's real identity from the rank's environment
    (Slurm, Kubernetes' downward API, torchrun) goes into the fingerprint's
    `job` beside what the trace said; issue 29: the window's network too."""
    import json
    from whyslow import _collect

    fp = json.dumps({"worker": 3, "job": {"id": "run-1", "world_size": 8}})
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "llama-pretrain", "SLURM_STEP_ID": "0",
           "TORCHELASTIC_RUN_ID": "run-1", "HOME": "/root"}
    out = json.loads(_collect.annotate(fp, json.dumps({"pid": 1, "host": "", "signals": {}}),
                                       "node7", env=env))
    assert out["job"]["id"] == "run-1" and out["job"]["world_size"] == 8
    assert out["job"]["name"] == "llama-pretrain"
    assert out["job"]["labels"] == {"slurm.job_id": "4242", "slurm.job_name": "llama-pretrain",
                                    "slurm.step_id": "0", "torch.run_id": "run-1"}
    assert out["network"]["host"] == "node7" and out["network"]["rank"] == 3
    k8s = {"POD_NAMESPACE": "ml", "POD_NAME": "train-0-abc", "K8S_JOB_NAME": "train"}
    name, labels = _collect.scheduler_identity(k8s)
    assert name == "train" and labels["k8s.pod"] == "train-0-abc"
    # Nothing known: the fingerprint is left as it was.
    assert json.loads(_collect.annotate(fp, None, "h", env={})) == json.loads(fp)


def test_registration_carries_the_schedulers_identity(tmp_path, monkeypatch):
    # Issue 30: the node agent labels a rank's profiles with what the
    # scheduler calls the job; the registration is where it learns it.
    from whyslow import _agent
    monkeypatch.setenv("SLURM_JOB_ID", "8812")
    monkeypatch.setenv("SLURM_JOB_NAME", "llama-pretrain")
    monkeypatch.setenv("POD_NAMESPACE", "ml")
    path = _agent.register(str(tmp_path), rank=3, local_rank=1, world_size=8, job="run-1", host="n1")
    with open(path) as f:
        rec = json.load(f)
    assert rec["job_name"] == "llama-pretrain"
    assert rec["scheduler"]["slurm.job_id"] == "8812"
    assert rec["scheduler"]["k8s.namespace"] == "ml"
    _agent.unregister(path)
    assert not os.path.exists(path)

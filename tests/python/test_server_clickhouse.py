"""`whyslow server` on its scale-out store (issue 14): ClickHouse over its
HTTP interface. ClickHouse's engine runs in-process from PyPI (chdb, behind
chdb_http.py), or a real server is used when WHYSLOW_CLICKHOUSE_URL is set.
The storage conformance checks pass on it (`whyslow server check-store`),
and the API behaves as on the embedded store: tokens per tenant, uploads,
the report of a session, isolation, retries, and data that outlives a
killed server."""

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from conftest import whyslow_server_cmd

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "fixtures", "testbed", "slow-link-busy-host")


def _whyslow(*args):
    return whyslow_server_cmd(*args)


@pytest.fixture
def clickhouse(tmp_path):
    url = os.environ.get("WHYSLOW_CLICKHOUSE_URL")
    if url:
        yield url
        return
    try:
        import chdb  # noqa: F401
    except ImportError:
        pytest.fail("chdb is not installed (pip install chdb; scripts/test-python installs it), "
                    "and WHYSLOW_CLICKHOUSE_URL names no ClickHouse server")
    shim = subprocess.Popen([sys.executable, os.path.join(HERE, "chdb_http.py"), str(tmp_path / "ch"), "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = shim.stdout.readline().decode()
        assert "http://" in line, line + shim.stderr.read().decode()
        yield "http://" + line.split("http://")[1].strip()
    finally:
        shim.kill()
        shim.wait()


def _server(args):
    srv = subprocess.Popen(_whyslow("server", *args, "--listen", "127.0.0.1:0"), stderr=subprocess.PIPE)
    line = srv.stderr.readline().decode()
    assert "http://" in line, line + srv.stderr.read().decode()
    return srv, "http://" + line.split("http://")[1].split()[0]


def _call(url, path, token=None, data=None):
    headers = {"Authorization": "Bearer " + token} if token else {}
    req = urllib.request.Request(url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None


def test_the_server_runs_on_clickhouse(clickhouse, tmp_path):
    db = "whyslow_test_%d" % os.getpid()
    ch = ["--clickhouse", clickhouse, "--clickhouse-database", db]
    check = subprocess.run(_whyslow("server", "check-store", "--clickhouse", clickhouse),
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr
    assert "passes the storage conformance checks" in check.stderr, check.stderr

    def token(tenant):
        p = subprocess.run(_whyslow("server", "token", "create", *ch, "--tenant", tenant),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip().splitlines()[-1]

    ta, tb = token("team-a"), token("team-b")
    srv, url = _server(ch)
    try:
        files = sorted(f for f in os.listdir(FIXTURE) if f.endswith(".fingerprint.json"))
        assert len(files) == 4, "fixture missing: %s" % FIXTURE
        for f in files + files[:1]:  # the first again: a retry replaces it
            with open(os.path.join(FIXTURE, f), "rb") as fh:
                code, body = _call(url, "/api/v1/jobs/j1/sessions/s1/fingerprints", ta, fh.read())
            assert code == 201, (f, code, body)
        code, jobs = _call(url, "/api/v1/jobs", ta)
        assert code == 200 and [(j["job"], j["fingerprints"], j["sessions"]) for j in jobs] == [("j1", 4, 1)], jobs
        assert _call(url, "/api/v1/jobs", tb) == (200, [])
        assert _call(url, "/api/v1/jobs")[0] == 401
        assert _call(url, "/api/v1/jobs/j1/sessions/s1/report", tb)[0] == 404

        # The central report is the local one over the same fingerprints.
        code, central = _call(url, "/api/v1/jobs/j1/sessions/s1/report", ta)
        assert code == 200 and central["workers"] == 4, central
        local = subprocess.run(_whyslow("localize", FIXTURE, "--format", "json"),
                               capture_output=True, text=True, timeout=120)
        assert local.returncode == 0, local.stderr
        key = lambda r: sorted((f["function"], tuple(f["workers"])) for f in r["findings"])
        assert key(central) == key(json.loads(local.stdout)), (key(central), local.stdout[:2000])

        # A killed server loses nothing that was acknowledged.
        srv.send_signal(signal.SIGKILL)
        srv.wait(timeout=30)
        srv, url = _server(ch)
        code, jobs = _call(url, "/api/v1/jobs", ta)
        assert code == 200 and jobs[0]["fingerprints"] == 4, jobs
    finally:
        srv.kill()
        srv.wait(timeout=30)


def test_the_stores_rust_tests_pass_on_clickhouse(clickhouse):
    """The Rust tests whose ClickHouse half needs a server (the Rust phase
    skips it, with that reason): the store's conformance suite, and the
    server's API in-process (flame graphs, the cross-job function query,
    racing retries against the group commit, the same answer as the
    embedded store), here against the stand-in (or WHYSLOW_CLICKHOUSE_URL).
    Same workspace features as the Rust phase, so nothing is rebuilt."""
    root = os.path.join(HERE, "..", "..")
    env = dict(os.environ, WHYSLOW_CLICKHOUSE_URL=clickhouse)
    env.pop("WHYSLOW_SKIP_LOG", None)
    p = subprocess.run(
        ["cargo", "test", "--workspace", "--locked", "--lib", "--test", "api", "--",
         "passes_the_conformance_checks_when_a_server_is_given", "every_store",
         "exactly_once", "refused_with_the_reason"],
        cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    assert "skipped:" not in out, out[-6000:]
    ran = sum(int(n) for n in __import__("re").findall(r"test result: ok\. (\d+) passed", out))
    assert ran >= 4, out[-6000:]

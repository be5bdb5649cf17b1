"""`whyslow server`'s API against its own OpenAPI description
(`apps/server/api/openapi.json`), fuzzed by schemathesis (issue 14, item
4): random and boundary requests to every operation, with and without the
token. The checks: no 5xx, only the status codes and content types the
description names, responses that match its schemas, requests that violate
the schema refused, and no /api route answering without the token.

Left out: schemathesis's `positive_data_acceptance`, which expects every
schema-valid request to succeed. A body the schema can only call "binary"
or "an object" (a pprof profile, a fingerprint) is rightly refused with 400
when its content is not one; the Rust tests check those refusals one by one.

A fixed seed: the same cases each run (a failure reproduces)."""

import os
import shutil
import subprocess
import sys

from conftest import whyslow_server_cmd


def _whyslow(*args):
    return whyslow_server_cmd(*args)


def test_api_matches_its_openapi_description_under_fuzzing(tmp_path):
    st = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    st = st if os.path.exists(st) else shutil.which("schemathesis")
    assert st, "schemathesis is not installed (scripts/test-python installs it: pip install schemathesis)"
    data = str(tmp_path / "server-data")
    tok = subprocess.run(_whyslow("server", "token", "create", "--data", data, "--tenant", "fuzz"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
    token = tok.stdout.decode().strip().splitlines()[-1]
    log = open(tmp_path / "server.log", "w+b")
    srv = subprocess.Popen(_whyslow("server", "--data", data, "--listen", "127.0.0.1:0"),
                           stderr=subprocess.PIPE)
    pump = None
    try:
        line = srv.stderr.readline().decode()
        assert "http://" in line, line
        url = "http://" + line.split("http://")[1].split()[0]
        # The rest of the server's log goes to a file (a full pipe would
        # stall it).
        pump = subprocess.Popen(["cat"], stdin=srv.stderr, stdout=log)
        run = subprocess.run(
            [st, "run", url + "/api/v1/openapi.json",
             "-H", "Authorization: Bearer " + token,
             "--max-examples", "40", "--seed", "1",
             "--exclude-checks", "positive_data_acceptance"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900,
            env=dict(os.environ, NO_COLOR="1"))
        out = run.stdout.decode(errors="replace")
        assert run.returncode == 0, out[-8000:]
        assert " passed" in out and "generated" in out, out[-3000:]
        alive = srv.poll() is None
        assert alive, "the server died under fuzzing"
    finally:
        srv.terminate()
        srv.wait(timeout=30)
        if pump is not None:
            pump.wait(timeout=10)
        log.seek(0)
        text = log.read().decode(errors="replace")
        assert "panicked" not in text, text[-3000:]

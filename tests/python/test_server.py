"""The online package and `whyslow server` (issue 14): with WHYSLOW_SERVER
and WHYSLOW_TOKEN set, every rank uploads its window's fingerprint; the
server's report for the session names the same function on the same ranks
as rank 0's local report. The server runs from the installed package
(`python -m whyslow server`), with its embedded store."""

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

from conftest import whyslow_server_cmd, SIM_COMPUTE, finding_for, needs_torch, torchrun

pytestmark = needs_torch


def _whyslow(*args):
    return whyslow_server_cmd(*args)


def test_ranks_upload_fingerprints_and_the_server_reports_the_job(tmp_path):
    data = str(tmp_path / "server-data")
    tok = subprocess.run(_whyslow("server", "token", "create", "--data", data, "--tenant", "ml-team"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
    token = tok.stdout.decode().strip().splitlines()[-1]
    srv = subprocess.Popen(_whyslow("server", "--data", data, "--listen", "127.0.0.1:0"),
                           stderr=subprocess.PIPE)
    try:
        line = srv.stderr.readline().decode()
        assert "http://" in line, line
        url = "http://" + line.split("http://")[1].split()[0]
        run = torchrun(tmp_path, ["--iters", "300", "--fault-at", "100", "--log-every", "50",
                                  "--fault", "slow-rank", "--fault-rank", "2", "--fault-ms", "80"]
                       + SIM_COMPUTE,
                       env={"WHYSLOW_SERVER": url, "WHYSLOW_TOKEN": token,
                            # A Slurm-like identity (issue 30): the job list shows it.
                            "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "llama-pretrain"})
        assert run.rc == 0, run.out[-3000:]
        assert "not uploaded" not in run.out, run.out[-3000:]
        reps = run.reports()
        assert reps, run.out[-3000:]
        sdir, local = reps[0]
        job, session = os.path.basename(os.path.dirname(sdir)), os.path.basename(sdir)

        def get(path):
            req = urllib.request.Request(url + path, headers={"Authorization": "Bearer " + token})
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())

        jobs = get("/api/v1/jobs")
        assert [j["job"] for j in jobs] == [job], jobs
        assert jobs[0]["fingerprints"] >= 4, jobs
        assert jobs[0]["name"] == "llama-pretrain", jobs
        assert jobs[0]["labels"]["slurm.job_id"] == "4242", jobs
        central = get("/api/v1/jobs/%s/sessions/%s/report" % (job, session))
        assert central["workers"] == 4
        hits = finding_for(central, "injected_slow_rank_work")
        assert hits and hits[0]["workers"] == [2], [(f["function"][-60:], f["workers"]) for f in central["findings"]]
        assert finding_for(local, "injected_slow_rank_work")[0]["workers"] == [2]
        # The UI shows the job's report in a real browser (sign-in link:
        # the token in the URL's fragment, which no server sees).
        _report_in_browser(tmp_path, url, token, job, session)
        # Without the token: 401.
        try:
            urllib.request.urlopen(url + "/api/v1/jobs", timeout=10)
            assert False, "no 401"
        except urllib.error.HTTPError as e:
            assert e.code == 401
    finally:
        srv.terminate()
        srv.wait(timeout=30)


def _report_in_browser(tmp_path, url, token, job, session):
    """Headless Chromium opens the session's page of the web UI: the job,
    the session and the finding are on it, the token is not."""
    browser = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                    if shutil.which(b)), None)
    if browser is None:
        if os.environ.get("WHYSLOW_REQUIRE_BROWSER"):
            pytest.fail("WHYSLOW_REQUIRE_BROWSER is set but no chromium is on PATH")
        print("browser check skipped: no chromium on PATH (apt-get install chromium)")
        return
    page = "/ui/jobs/%s/sessions/%s" % (urllib.parse.quote(job, safe=""), urllib.parse.quote(session, safe=""))
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          "--user-data-dir=%s" % (tmp_path / "chromium"),
                          "--virtual-time-budget=20000", "--dump-dom",
                          "%s/ui/login?next=%s#token=%s" % (url, urllib.parse.quote(page, safe="/"), token)],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    dom = out.stdout
    assert ("job %s" % job) in dom and ("session %s" % session) in dom, dom[:3000]
    assert "injected_slow_rank_work" in dom, dom[:3000]
    assert token not in dom

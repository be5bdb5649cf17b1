"""The deployment files (issue 30, deploy/): the Kubernetes manifests
validate against the Kubernetes API's schemas (kubernetes-validate, strict:
no unknown fields), the systemd units pass `systemd-analyze verify`, and the
Slurm task prolog gives a job's ranks the agent, the server, the token and
the job's Slurm identity without overriding what the job set."""

import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DEPLOY = os.path.join(ROOT, "deploy")


def test_kubernetes_manifests_validate_against_the_api_schemas():
    kv = pytest.importorskip("kubernetes_validate",
                             reason="kubernetes-validate is not installed (scripts/test-python installs it)")
    files = sorted(glob.glob(os.path.join(DEPLOY, "kubernetes", "*.yaml")))
    files = [f for f in files if not f.endswith("kustomization.yaml")]
    assert len(files) >= 5, files
    assert kv
    beside = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
    exe = beside if os.path.exists(beside) else shutil.which("kubernetes-validate")
    assert exe, "kubernetes-validate's command is not beside %s" % sys.executable
    out = subprocess.run([exe, "--strict", "--kubernetes-version", "1.30"] + files,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    kinds = out.stdout + out.stderr
    for kind in ("statefulset/whyslow-server", "daemonset/whyslow-agent", "service/whyslow-server",
                 "job/example-training"):
        assert kind in kinds, kinds
    # Every file is listed by the kustomization or is the example job.
    kust = open(os.path.join(DEPLOY, "kubernetes", "kustomization.yaml")).read()
    for f in files:
        name = os.path.basename(f)
        assert name in kust or name.startswith("example-"), name


def test_systemd_units_verify(tmp_path):
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze is not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "whyslow"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    for unit in sorted(glob.glob(os.path.join(DEPLOY, "systemd", "*.service"))):
        text = open(unit).read().replace("/usr/local/bin/whyslow", str(fake))
        dst = tmp_path / os.path.basename(unit)
        dst.write_text(text)
        out = subprocess.run([exe, "verify", str(dst)], capture_output=True, text=True, timeout=60)
        problems = [line for line in (out.stdout + out.stderr).splitlines()
                    if os.path.basename(unit) in line or "Unknown" in line]
        assert out.returncode == 0 and not problems, out.stdout + out.stderr


def _prolog(tmp_path, env):
    conf = tmp_path / "slurm.env"
    token = tmp_path / "token"
    token.write_text("wsk_site_token\n")
    agent = tmp_path / "agent"
    agent.mkdir(exist_ok=True)
    conf.write_text("WHYSLOW_SERVER=http://whyslow.site:7070\nWHYSLOW_TOKEN_FILE=%s\n"
                    "WHYSLOW_AGENT_DIR=%s\n" % (token, agent))
    base = {"PATH": os.environ["PATH"], "WHYSLOW_SLURM_ENV": str(conf)}
    base.update(env)
    out = subprocess.run(["sh", os.path.join(DEPLOY, "slurm", "task-prolog.sh")], env=base,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return dict(line[len("export "):].split("=", 1) for line in out.stdout.splitlines()), agent


def test_slurm_task_prolog_registers_the_ranks_with_the_jobs_identity(tmp_path):
    got, agent = _prolog(tmp_path, {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "llama 70b/pretrain"})
    assert got == {
        "WHYSLOW_AGENT_DIR": str(agent),
        "WHYSLOW_SERVER": "http://whyslow.site:7070",
        "WHYSLOW_TOKEN": "wsk_site_token",
        "WHYSLOW_JOB_ID": "slurm-4242-llama_70b_pretrain",
    }, got
    # What the job set itself wins; outside Slurm no job id is made up.
    got, _ = _prolog(tmp_path, {"SLURM_JOB_ID": "7", "WHYSLOW_SERVER": "http://mine:1",
                                "WHYSLOW_JOB_ID": "my-run"})
    assert "WHYSLOW_SERVER" not in got and "WHYSLOW_JOB_ID" not in got, got
    got, _ = _prolog(tmp_path, {})
    assert "WHYSLOW_JOB_ID" not in got and got["WHYSLOW_SERVER"] == "http://whyslow.site:7070"

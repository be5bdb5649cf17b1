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


def _tolerates(t, taint):
    """Kubernetes' rule: a toleration matches a taint by key (none: any),
    effect (none: any), and value unless the operator is Exists."""
    if t.get("key") not in (None, "", taint["key"]):
        return False
    if t.get("effect") not in (None, "", taint["effect"]):
        return False
    return t.get("operator", "Equal") == "Exists" or t.get("value") == taint.get("value")


def test_the_agent_runs_on_gpu_nodes():
    # Issue 47: GPU nodes carry nvidia.com/gpu:NoSchedule (the GPU
    # operator's default); a DaemonSet without a matching toleration never
    # runs there.
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (kubernetes-validate brings it)")
    with open(os.path.join(DEPLOY, "kubernetes", "agent.yaml")) as f:
        ds = next(d for d in yaml.safe_load_all(f) if d and d.get("kind") == "DaemonSet")
    tolerations = ds["spec"]["template"]["spec"].get("tolerations", [])
    for taint in ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                  {"key": "nvidia.com/gpu", "effect": "NoExecute"},
                  {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
        assert any(_tolerates(t, taint) for t in tolerations), (taint, tolerations)


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


def _image_tools():
    missing = [t for t in ("podman", "mmdebstrap") if shutil.which(t) is None]
    if missing:
        why = "%s not installed (apt-get install podman mmdebstrap runc)" % ", ".join(missing)
        if os.environ.get("WHYSLOW_REQUIRE_IMAGE") == "1":
            pytest.fail(why)
        pytest.skip(why)


def _podman_run_args():
    # This VM refuses the rlimits podman asks for by default (RLIMIT_NOFILE
    # 1048576, RLIMIT_NPROC at the host's) and crun refuses its hybrid
    # cgroups: runc with explicit, lower limits runs.
    args = ["--ulimit", "nofile=16384:16384", "--ulimit", "nproc=4096:4096"]
    if shutil.which("runc"):
        args = ["--runtime", "runc"] + args
    return args


def test_image_builds_and_runs_the_server_and_the_agent(tmp_path):
    # Issue 30: one image (Debian root by mmdebstrap, no registry), the
    # server as user 10001, the agent as root with the DaemonSet's
    # capabilities instead of --privileged.
    _image_tools()
    from test_agent import whyslow_bin
    exe = whyslow_bin()
    if exe is None:
        pytest.fail("no whyslow binary (cargo build -p whyslow)")
    tag = "localhost/whyslow-test:%d" % os.getpid()
    b = subprocess.run([os.path.join(DEPLOY, "image", "build"), "--tag", tag, "--binary", exe],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    out = b.stdout.decode(errors="replace")
    assert b.returncode == 0, out
    size_mb = int(out.rsplit(", ", 2)[-2].split(" MB")[0].rsplit(" ", 1)[-1])
    assert size_mb < 120, out  # release: 34 MB; a stripped debug binary adds ~20
    run = ["podman", "run", "--rm"] + _podman_run_args()
    try:
        v = subprocess.run(run + [tag, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=60)
        assert v.returncode == 0 and v.stdout.decode().startswith("whyslow "), v.stdout.decode()
        # The server: non-root, answers /healthz.
        import socket
        import time
        import urllib.request
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        name = "whyslow-server-%d" % os.getpid()
        srv = subprocess.Popen(["podman", "run", "--rm", "--name", name, "--network", "host"]
                               + _podman_run_args()
                               + [tag, "server", "--data", "/data", "--listen", "127.0.0.1:%d" % port],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            body, deadline = None, time.monotonic() + 30
            while body is None and time.monotonic() < deadline and srv.poll() is None:
                try:
                    with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=2) as r:
                        body = r.read().decode()
                except OSError:
                    time.sleep(0.3)
            assert body is not None, "the server in the image did not answer"
            top = subprocess.run(["podman", "top", name, "user"], stdout=subprocess.PIPE, timeout=30)
            assert "10001" in top.stdout.decode(), top.stdout.decode()
        finally:
            subprocess.run(["podman", "rm", "-f", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=60)
            srv.wait(timeout=30)
        # The agent: host PID, the listed capabilities, a read-only root;
        # its host profile (eBPF) lands in the spool.
        spool, reg = tmp_path / "spool", tmp_path / "reg"
        spool.mkdir()
        reg.mkdir()
        aname = "whyslow-agent-%d" % os.getpid()
        caps = "BPF,PERFMON,SYS_PTRACE,SYS_ADMIN,SYS_RESOURCE,DAC_READ_SEARCH"
        mounts = ["-v", "%s:/var/lib/whyslow/agent" % reg, "-v", "%s:/var/lib/whyslow/spool" % spool]
        for p in ("/sys/kernel/debug", "/sys/kernel/tracing"):
            if os.path.isdir(p):
                mounts += ["-v", "%s:%s" % (p, p)]
        subprocess.run(["podman", "run", "-d", "--name", aname, "--pid", "host", "--user", "0",
                        "--cap-drop", "ALL", "--cap-add", caps, "--read-only"] + _podman_run_args() + mounts
                       + [tag, "agent", "--samples-dir", "/var/lib/whyslow/agent",
                          "--profile-spool", "/var/lib/whyslow/spool", "--profile-host",
                          "--profile-period", "1", "--node-name", "n1"],
                       check=True, stdout=subprocess.DEVNULL, timeout=60)
        try:
            deadline = time.monotonic() + 30
            while not glob.glob(str(spool / "host" / "*.pb.gz")) and time.monotonic() < deadline:
                time.sleep(0.5)
            logs = subprocess.run(["podman", "logs", aname], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=30).stdout.decode(errors="replace")
            assert glob.glob(str(spool / "host" / "*.pb.gz")), logs[-3000:]
        finally:
            subprocess.run(["podman", "rm", "-f", aname], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=60)
    finally:
        subprocess.run(["podman", "rmi", "-f", tag], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=60)

"""The multi-host testbed (testbed/run) for real: 4 emulated hosts (network
namespaces on leaf/spine bridges), one torchrun per host, gloo over TCP on
the testbed's addresses, whyslow sampling CPU and NIC at 1 kHz.

* slow-link (PerfTracker §3, Fig. 3-5): one host's link throttled to
  50 Mbit/s; the ring allreduce of the host's worker must stand out with
  low and steady NIC throughput (low μ, low σ) from ring peers that
  fluctuate. (At 200 Mbit/s the job slowed by only 2×, the detector's
  threshold, and not at all where compute took as long as the throttled
  allreduce: a CI run had healthy iterations of 117 ms, the throttled ones
  120 ms, and wrote no report. At 50 Mbit/s iterations take 8-10× longer;
  BENCHMARKS.md.)
* cpu-hog: busy loops inside one host's CPU cgroup (each emulated host is
  capped at its share of this machine's cores); its CPU work must stand out
  with lower CPU availability (μ).
* none: no finding (or no report at all).
* --agent (SysOM-AI §3.1): one whyslow agent per host traces the ranks'
  gloo collectives, profiles them and reads their OS signals; `whyslow
  diagnose DIR/agent` names no late rank on a healthy run, and when every
  rank starts a costly per-iteration call (log-stats) it names no late rank
  but the new call as a regression against the job's own healthy start;
  with 2 % packet loss on one host's link, the network layer and that host
  (its TCP retransmissions).

Needs root and network namespaces; skipped otherwise (testbed/run exit 77).
"""

import json
import os
import statistics
import subprocess
import sys
import time

import pytest

from conftest import ROOT, TEST_ENV, TRAIN, needs_torch

RUN = os.path.join(ROOT, "testbed", "run")
SKIP = 77  # testbed/run: network namespaces not permitted here

# whyslow settings of these runs (measured with them; BENCHMARKS.md): the
# e2e tests' settings. The faults slow iterations 2-3x while healthy runs of
# 4 hosts capped at half a core each drift by up to +60 %, so the +100 %
# threshold fits here too; 3 s windows.
TESTBED_ENV = dict(TEST_ENV)
del TESTBED_ENV["WHYSLOW_SAMPLE_HZ"]  # testbed/run samples CPU and NIC at 1 kHz


def _netns_reason():
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces, tc)"
    name = "wstbprobe%d" % os.getpid()
    try:
        p = subprocess.run(["ip", "netns", "add", name], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    except OSError as e:
        return "the testbed needs iproute2 (ip): %s" % e
    if p.returncode != 0:
        return "`ip netns add` failed: %s" % p.stdout.decode(errors="replace").strip()
    subprocess.run(["ip", "netns", "del", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return None


_REASON = _netns_reason()
pytestmark = [needs_torch, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]


class Result:
    def __init__(self, rc, out, d, wall):
        self.rc, self.out, self.dir, self.wall = rc, out, d, wall

    def report(self):
        p = os.path.join(self.dir, "report.json")
        if not os.path.exists(p):
            return None
        with open(p) as f:
            return json.load(f)

    def logs(self):
        text = [self.out[-3000:]]
        for r in range(4):
            p = os.path.join(self.dir, "host-%d.log" % r)
            if os.path.exists(p):
                with open(p) as f:
                    text.append("--- host %d\n%s" % (r, f.read()[-1500:]))
        return "\n".join(text)


# The fault comes --fault-after seconds after the first step, but the job is
# counted in iterations: after the fault, the detector needs its 30-iteration
# window, the 1 s lead and a 3 s profile, about 7 s. A healthy iteration takes
# 28-35 ms here (faster on an idle machine), so a fault at 6 s in a 200-iteration
# job came as the job ended (a busy-core run: detected at step 195, profile set
# for step 203 of 200, no report). Faults come at 4 s, and a fault that slows
# iterations only ~2x (cpu-hog) gets a job long enough to be profiled.
FAULT_AFTER_S = 4


def run_testbed(tmp_path, fault, iters, fault_after=FAULT_AFTER_S, hosts=4, env_extra=None,
                script_args=(), tb_args=()):
    out = str(tmp_path / "tb")
    env = dict(os.environ)
    env.update(TESTBED_ENV)
    env["WHYSLOW_KEEP_TRACES"] = "1"  # the fingerprints' samples, for a failure's post-mortem
    env.update(env_extra or {})
    cmd = [sys.executable, RUN, "--hosts", str(hosts), "--fault", fault,
           "--fault-after", str(fault_after), "--out", out, "--timeout", "150"] + list(tb_args) + [
           "--", TRAIN, "--iters", str(iters), "--log-every", "50"] + list(script_args)
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=300)
    res = Result(p.returncode, p.stdout.decode(errors="replace"), out, time.monotonic() - t0)
    if res.rc == SKIP:
        pytest.skip("testbed/run: " + res.out.strip().splitlines()[-1])
    assert res.rc == 0, res.logs()
    return res


def _brief(rep):
    return [(f["function"][-60:], f["kind"], f["workers"], f["reason"],
             round(f["mu"]["value"], 3), round(f["mu"]["peers"], 3),
             f["mu"].get("peer_count"), f.get("resource_mu")) for f in rep["findings"]]


def _peer_median(finding, key, worker):
    vals = [p[key] for p in finding["points"] if p["worker"] != worker]
    return statistics.median(vals)


def _own(finding, key, worker):
    return [p[key] for p in finding["points"] if p["worker"] == worker][0]


def test_slow_link_names_the_throttled_host(tmp_path):
    host = 1  # rank 1 runs on host 1 (one process per host)
    res = run_testbed(tmp_path, "slow-link:host=%d,rate=50mbit" % host, iters=200)
    rep = res.report()
    assert rep is not None, "no report\n" + res.logs()
    assert rep["workers"] == 4 and rep["missing_workers"] == []
    assert rep["utilization_source"] == "samples", rep["utilization_source"]
    comm = [f for f in rep["findings"] if f["kind"] == "comm" and "all_reduce" in f["function"]
            and f["resource"] == "nic"]
    assert comm, "no allreduce finding: %s\n%s" % (_brief(rep), res.logs())
    f = comm[0]
    assert f["workers"] == [host], _brief(rep)
    assert f["util_source"] == "samples"
    # Steady and slow (PerfTracker Fig. 5c) vs. peers that wait and burst (Fig. 5b).
    mu, sigma = _own(f, "mu", host), _own(f, "sigma", host)
    assert mu < _peer_median(f, "mu", host), f["points"]
    assert sigma < _peer_median(f, "sigma", host), f["points"]
    assert f["mu"]["value"] < f["mu"]["peers"] and f["sigma"]["value"] < f["sigma"]["peers"]


def test_in_process_report_names_the_lossy_hosts_collective(tmp_path):
    # 2 % loss on host 1's link, no agent: the ranks read their own TCP
    # counters and connections over the window (issue 29). Before, the
    # report named aten::mm on worker 2 (BENCHMARKS.md): loss makes every
    # rank of the ring wait alike, and no compute function is to blame.
    host = 1
    res = run_testbed(tmp_path, "slow-link:host=%d,rate=10gbit,loss=2%%" % host, iters=400,
                      fault_after=5)
    rep = res.report()
    assert rep is not None, "no report\n" + res.logs()
    show = json.dumps({"network": rep.get("network"), "findings": _brief(rep)}, indent=1)
    assert rep.get("network") and rep["network"][0]["ranks"] == [host], show
    first = rep["findings"][0]
    assert first["kind"] == "comm" and first["workers"] == [host], show
    assert "loses packets" in first["hint"], first["hint"]


def test_cpu_hog_flags_the_host_cpu_work(tmp_path):
    host = 2
    # 8 busy loops in the host's cgroup (a half-core cap): with 4, a busy loop
    # elsewhere on the machine starved the peers almost as much (worker 2's
    # CPU share 0.33 vs 0.40, 1 failure in 3 busy-core runs); with 8, 0.15
    # vs 0.40. 350 iterations: detection comes near step 100 and the report
    # soon after; a busy-core run with 500 (about 200 ms each once hogged)
    # wrote its report but did not end within the 150 s limit. The limit is
    # 240 s here for machines slower still.
    res = run_testbed(tmp_path, "cpu-hog:host=%d,procs=8" % host, iters=350,
                      tb_args=("--timeout", "240"))
    rep = res.report()
    assert rep is not None, "no report\n" + res.logs()
    assert rep["workers"] == 4 and rep["missing_workers"] == []
    cpu = [f for f in rep["findings"] if f["kind"] in ("python", "cpu_op") and f["resource"] == "cpu"
           and f["workers"] == [host] and f["util_source"] == "samples"]
    assert cpu, "no Python/CPU finding on rank %d: %s\n%s" % (host, _brief(rep), res.logs())
    # Lower CPU availability: the hogged worker's CPU share over the rest of
    # its critical-path CPU work is below its peers' (report's resource_mu).
    # The function's own μ is not always comparable: the peers often hide
    # the hogged worker's slow operators behind their allreduce wait, so no
    # peer has them on its critical path (a CI run flagged aten::sum,
    # AccumulateGrad and forward frames on worker 2 only; 1 run in ~8).
    # (The same "clearly less CPU" as the contended-host hint: below 80 %.)
    starved = [f for f in cpu if f.get("resource_mu")
               and f["resource_mu"]["value"] < 0.8 * f["resource_mu"]["peers"]]
    assert starved, "no finding on rank %d with a lower CPU share than its peers: %s\n%s" % (
        host, _brief(rep), res.logs())
    assert any("contended" in (f.get("hint") or "") for f in starved), _brief(rep)


def test_healthy_run_has_no_finding(tmp_path):
    res = run_testbed(tmp_path, "none", iters=200)
    rep = res.report()
    assert rep is None or rep["findings"] == [], _brief(rep)


def test_exec_fault_runs_in_the_host_from_training_start_without_the_scripts_help(tmp_path):
    """A script whose ready signals do not reach the testbed (train.py
    --no-ready-file; whyslow's WHYSLOW_READY_FILE pointed elsewhere): the
    testbed learns training start from the hosts' traffic, and the exec
    fault runs in host 2's namespace from then + --fault-after to the end."""
    elsewhere = tmp_path / "whyslow-ready"
    probe = tmp_path / "probe.sh"
    marker = tmp_path / "probe-alive"
    probe.write_text("#!/bin/sh\nip -o -4 addr show eth0\ncat /proc/self/cgroup\n"
                     "touch %s\nexec sleep 600\n" % marker)
    probe.chmod(0o755)
    res = run_testbed(tmp_path, "exec:host=2,cmd=%s" % probe, iters=150, fault_after=3,
                      env_extra={"WHYSLOW_READY_FILE": str(elsewhere)},
                      script_args=["--no-ready-file"])
    with open(os.path.join(res.dir, "testbed.json")) as f:
        meta = json.load(f)
    assert meta["ready_by"] == "traffic", (meta, res.logs())
    assert elsewhere.exists()  # whyslow signalled its first step where told
    assert meta["ready_after_s"] < 60, meta
    # On time: --fault-after after training start, give or take the 0.1 s loop.
    late = meta["fault_at_s"] - meta["ready_after_s"] - 3
    assert -0.05 <= late < 1.0, meta
    with open(os.path.join(res.dir, "exec-fault.log")) as f:
        log = f.read()
    assert "10.99.0.3/" in log, log  # host 2's address: its namespace
    assert marker.exists()
    # Killed when the job ended: no sleep of the probe is left.
    left = subprocess.run(["pgrep", "-f", "sleep 600"], stdout=subprocess.PIPE).stdout.split()
    assert not left, left


def _diagnose(res):
    from test_agent import whyslow_bin
    out = subprocess.run([whyslow_bin(), "diagnose", os.path.join(res.dir, "agent"),
                          "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         timeout=120)
    assert out.returncode == 0, out.stderr.decode() + res.logs()
    rep = json.loads(out.stdout)
    shown = {k: rep[k] for k in ("stragglers", "layer", "cpu_diff", "regressions", "os_diff",
                                 "network_diff",
                                 "collective_groups", "groups", "baseline", "window", "notes")}
    shown["cpu_diff"] = shown["cpu_diff"][:6]
    shown["regressions"] = shown["regressions"][:8]
    show = json.dumps(shown, indent=1)[:8000]
    return rep, show


def _server_diagnosis(res):
    """The diagnosis `whyslow server` gives of the testbed's job
    (`testbed/run --server`: the agents uploaded their spools, the ranks
    their fingerprints) — started again on the run's store, as
    OUT/server.json says it can be."""
    import socket
    import urllib.request
    from test_agent import whyslow_bin
    with open(os.path.join(res.dir, "server.json")) as f:
        srv = json.load(f)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen([whyslow_bin(), "server", "--data", srv["data"],
                             "--listen", "127.0.0.1:%d" % port],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = "http://127.0.0.1:%d" % port
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=2).read()
                break
            except OSError:
                time.sleep(0.1)
        req = urllib.request.Request("%s/api/v1/jobs/%s/diagnosis" % (url, srv["job"]),
                                     headers={"Authorization": "Bearer " + srv["token"]})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())
    finally:
        proc.terminate()
        proc.wait(10)


def _same_verdict(local, central, show):
    """`whyslow diagnose OUT/agent` and the server's diagnosis agree: the
    late ranks, the layer and the top of each diff."""
    cshow = json.dumps({k: central[k] for k in ("stragglers", "layer", "cpu_diff", "os_diff",
                                                "regressions", "notes")}, indent=1)[:6000]
    both = show + "\n--- server:\n" + cshow
    assert [s["rank"] for s in central["stragglers"]] == [s["rank"] for s in local["stragglers"]], both
    assert central["layer"] == local["layer"], both
    for key, fields in (("cpu_diff", ("scope", "rank", "function")), ("os_diff", ("rank", "signal")),
                        ("offcpu_diff", ("rank", "function")), ("network_diff", ("host",)),
                        ("regressions", ("function",))):
        ltop = [tuple(d[f] for f in fields) for d in local[key][:1]]
        ctop = [tuple(d[f] for f in fields) for d in central[key][:1]]
        assert ltop == ctop, (key, both)


def _agent_args():
    from test_agent import whyslow_bin
    exe = whyslow_bin()
    if exe is None:
        pytest.fail("no whyslow binary (build it: cargo build -p whyslow)")
    # 2 s periods: a period reaching into start-up or shutdown is left out
    # by diagnose, and 600 iterations last 10-20 s.
    return ["--agent", "--agent-period", "2", "--whyslow", exe]


def test_agents_name_the_new_per_iteration_call_and_no_late_rank(tmp_path):
    # Every rank starts logging its weights' statistics (20 ms of Python per
    # iteration) 8 s into training: all slow alike. The online package's own
    # detector is kept out (its profiling window would be a regression of
    # its own: torch.profiler and whyslow's post-processing rose from 0 to
    # 18-23 % of the ranks' CPU in a run without this).
    # Hosts float over the cores (see the healthy run below).
    res = run_testbed(tmp_path, "log-stats:ms=20", iters=600, fault_after=8,
                      tb_args=_agent_args() + ["--float-cores"],
                      env_extra={"WHYSLOW_THRESHOLD": "100"})
    rep, show = _diagnose(res)
    assert {len(g["mean_late_us"]) for g in rep["collective_groups"]} == {4}, show
    assert rep["stragglers"] == [], show
    names = [r["function"] for r in rep["regressions"][:5]]
    assert any("log_tensor_stats" in n for n in names), show
    assert rep["layer"] == "cpu", show


def test_agents_name_the_noisy_neighbour_of_the_late_rank(tmp_path):
    # Busy loops start in host 2's CPU cgroup (its capacity, half a core
    # here, is shared with them) 5 s into training: rank 2 waits for a CPU
    # and enters its collectives late. Its agent profiles the host's cgroup:
    # the neighbour, a process that never registered, tops the CPU diff.
    host = 2
    res = run_testbed(tmp_path, "cpu-hog:host=%d,procs=2" % host, iters=400, fault_after=5,
                      tb_args=_agent_args() + ["--server"], env_extra={"WHYSLOW_THRESHOLD": "100"})
    rep, show = _diagnose(res)
    # The central service says the same of the same job (one brain, issue 26).
    _same_verdict(rep, _server_diagnosis(res), show)
    assert [s["rank"] for s in rep["stragglers"]] == [host], show
    assert rep["layer"] in ("cpu", "os"), show
    # (The busy loop's own frames are under it: `dash+0x…` with hybrid
    # unwinding, the agent's default; the process alone with frame pointers.)
    top = rep["cpu_diff"][0]
    assert (top["scope"], top["rank"], top["stack"].split(";")[0]) == (
        "host", host, "sh (process)"), show
    # The scheduler's side: rank 2 waited for a CPU more than its peers.
    assert any(d["rank"] == host and d["signal"] == "runqueue_delay_ms_per_s"
               for d in rep["os_diff"]), show


def test_agents_name_the_kernel_path_of_a_file_lookup_storm(tmp_path):
    # A neighbour on host 2 stats and opens files at the end of a deep path
    # from 4 threads (tests/python/stat_storm.py: its time is in the kernel's
    # path walk) 5 s into training, in host 2's CPU cgroup: rank 2 is late,
    # and the host's diff shows the kernel path, not only a process name.
    host = 2
    storm = tmp_path / "storm.sh"
    storm.write_text("#!/bin/sh\nexec %s %s 4\n" % (sys.executable,
                                                     os.path.join(os.path.dirname(__file__), "stat_storm.py")))
    storm.chmod(0o755)
    res = run_testbed(tmp_path, "exec:host=%d,cmd=%s" % (host, storm), iters=400, fault_after=5,
                      tb_args=_agent_args(), env_extra={"WHYSLOW_THRESHOLD": "100"})
    rep, show = _diagnose(res)
    assert [s["rank"] for s in rep["stragglers"]] == [host], show
    assert rep["layer"] in ("cpu", "os"), show
    on_host = [d for d in rep["cpu_diff"] if d["scope"] == "host"]
    assert on_host and on_host[0]["rank"] == host, show
    lookup = ("path_lookupat", "filename_lookup", "link_path_walk", "walk_component",
              "path_openat", "do_filp_open", "vfs_statx", "lookup_fast", "d_alloc_parallel")
    kernel = [d for d in on_host[:12] if any(k in d["function"] for k in lookup)]
    assert kernel, show
    assert kernel[0]["stack"].split(";")[0].endswith("(process)"), show


def test_agents_name_a_softirq_storm_on_the_late_ranks_core(tmp_path):
    # 3 hosts on 2 cores: hosts 0 and 2 share core 0, host 1 has core 1 to
    # itself, so a softirq storm on host 1's core is on no peer's. A UDP
    # flood (tests/python/udp_flood.py: loopback delivery runs NET_RX in the
    # sender's softirq on its core) starts on host 1, in its cgroup and on
    # its core, 5 s into training: rank 1 is late, the OS layer names NET_RX
    # on its CPUs, and the host's diff shows the receive path.
    host = 1
    flood = tmp_path / "flood.sh"
    flood.write_text("#!/bin/sh\nexec %s %s 2\n" % (sys.executable,
                                                    os.path.join(os.path.dirname(__file__),
                                                                 "udp_flood.py")))
    flood.chmod(0o755)
    res = run_testbed(tmp_path, "exec:host=%d,cmd=%s" % (host, flood), iters=400, fault_after=5,
                      hosts=3, tb_args=_agent_args(), env_extra={"WHYSLOW_THRESHOLD": "100"})
    rep, show = _diagnose(res)
    assert [s["rank"] for s in rep["stragglers"]] == [host], show
    assert rep["layer"] == "os", show
    net_rx = [d for d in rep["os_diff"]
              if d["rank"] == host and d["signal"] == "softirq_NET_RX_per_cpu_s"]
    assert net_rx, show
    # The evidence in the kernel stacks: the softirq's handler on host 1,
    # under the process that raised it (the flood).
    assert net_rx[0].get("handler_scope") == "host", show
    assert net_rx[0]["handler_stack"].endswith("net_rx_action"), show
    assert net_rx[0]["handler_stack"].split(";")[0] == "python (process)", show


def test_agents_name_the_host_that_drops_packets(tmp_path):
    # 2 % of the packets in and out of host 1's link are dropped (netem, or
    # nftables where the kernel has none) 5 s into training. Nobody enters
    # the collectives late: every rank of the ring waits on the lossy link
    # alike, and PerfTracker's NIC pattern (low, steady throughput) does not
    # show it either (BENCHMARKS.md: the in-process report named aten::mm).
    # What loss leaves is in the TCP counters at both ends of the lossy
    # path: segments reach host 1 out of order, and the peer that sends to
    # it resends them. (nftables drops host 1's own packets before they
    # leave, which TCP sees as a local error to retry, not as loss.)
    host = 1
    res = run_testbed(tmp_path, "slow-link:host=%d,rate=10gbit,loss=2%%" % host, iters=400,
                      fault_after=5, tb_args=_agent_args() + ["--float-cores"],
                      env_extra={"WHYSLOW_THRESHOLD": "100"})
    rep, show = _diagnose(res)
    lossy = rep["network_diff"]
    show = json.dumps({"layer": rep["layer"], "network_diff": lossy}, indent=1) + "\n" + show
    assert rep["layer"] == "network", show
    sides = {r: h["side"] for h in lossy for r in h["ranks"]}
    assert sides.get(host) in ("receives", "both"), show
    assert "sends" in sides.values() or sides[host] == "both", show
    # Host 1 first and standing out; the others named only for resending,
    # which the ring's hosts do alike (1-2 % on 2026-11-26, 0.1-0.2 % on
    # 2026-11-25) or only the one sending into host 1 (2.3 % against 0.24 %
    # on 2026-11-27): host 1's out-of-order segments explain them, so none of
    # them stands out.
    assert lossy[0]["ranks"] == [host] and lossy[0]["stands_out"], show
    assert all(h["side"] == "sends" and not h["stands_out"] for h in lossy[1:]), show


# At 200 Mbit/s the shaped connections of a CI run delivered 21-22 MB/s
# per busy second against 60-80 MB/s of the ring's other links (hosts capped
# at half a core each): 0.27-0.37x, on both sides of the detector's 0.3x
# (network.rs, `slow_share`). A connection starved by a busy receiver shows
# 0.45x with a queue (the file-lookup storm), so the bar is not lowered; the
# 200 Mbit/s case is under the detector's stated resolution and not tested.
@pytest.mark.parametrize("rate", ["50mbit"])
def test_agents_name_the_host_behind_a_slow_link_without_loss(tmp_path, rate):
    # Host 1's link shaped both ways (tbf), nothing dropped on purpose: no
    # rank is late (the ring waits on the link alike), the loss counters
    # stay low, and the temporal baseline sees gloo's transport thread wait
    # longer (BENCHMARKS.md: `diagnose` said `cpu`). What the link leaves is
    # in its connections: they deliver a fraction of what the others do
    # while busy, behind a queue (smoothed RTT far above the lowest).
    host = 1
    res = run_testbed(tmp_path, "slow-link:host=%d,rate=%s" % (host, rate), iters=300,
                      fault_after=5, tb_args=_agent_args() + ["--float-cores"],
                      env_extra={"WHYSLOW_THRESHOLD": "100"})
    rep, show = _diagnose(res)
    net = rep["network_diff"]
    show = json.dumps({"layer": rep["layer"], "network_diff": net}, indent=1) + "\n" + show
    assert rep["layer"] == "network", show
    assert net and net[0]["ranks"] == [host] and net[0]["stands_out"], show
    first = net[0]
    if first["cause"] == "slow":
        m = {x["name"]: x for x in first["measures"]}
        assert m["sending_rate_mbit_s"]["value"] < 0.3 * m["sending_rate_mbit_s"]["peers"], show
    # No other host is named as the slow link.
    assert not [h for h in net[1:] if h["cause"] == "slow"], show


def test_agents_on_a_healthy_run_name_nothing(tmp_path):
    # Hosts float over the cores, capped by their cgroups: with hosts pinned
    # round robin, a busy process outside the testbed on core 1 made hosts 1
    # and 3 late by 3.5-4.5 ms at 22 ms per collective (their ranks got 20 %
    # fewer samples), every collective: a real noisy neighbour of those two
    # hosts, rightly named, but not a healthy run.
    res = run_testbed(tmp_path, "none", iters=600,
                      tb_args=_agent_args() + ["--float-cores", "--server"],
                      env_extra={"WHYSLOW_THRESHOLD": "100"})
    rep, show = _diagnose(res)
    central = _server_diagnosis(res)
    _same_verdict(rep, central, show)
    assert {len(g["mean_late_us"]) for g in rep["collective_groups"]} == {4}, show
    assert rep["stragglers"] == [] and central["stragglers"] == [], show
    # Whether the machine slowed the job, by the job's own clock (rank 0's
    # ms/iter every 50 iterations): a CI run's healthy job went from 52 to
    # 58 ms/iter two thirds in, on every rank (load outside the testbed),
    # and whyslow rightly said the collectives came slower from then on.
    # Silence is demanded of a job that kept its pace; of one that did not,
    # that whyslow saw the slowdown where it was and named no late rank.
    ms = _ms_per_iter(res)
    first, second = ms[1:len(ms) // 2], ms[len(ms) // 2:]
    slowed = statistics.mean(second) >= 1.1 * statistics.mean(first)
    if not slowed:
        assert central["layer"] == "none", central
        assert rep["regressions"] == [], show
        assert rep["layer"] == "none", show
    else:
        print("the healthy job slowed by its own clock (%s ms/iter): its slowdown is judged" % ms)
        assert rep["layer"] == "none" or any("came slower from" in n for n in rep["notes"]), show


def _ms_per_iter(res):
    """Rank 0's ms/iter per logged stretch (examples/train.py's log line)."""
    with open(os.path.join(res.dir, "host-0.log")) as f:
        return [float(line.split()[-2]) for line in f if line.startswith("iter ") and "ms/iter" in line]


def test_a_hang_across_hosts_names_its_culprit(tmp_path):
    # Issue 27 across 4 hosts: rank 2 (host h2) sleeps in Python at step
    # 150; the others wait in tp and dp collectives over TCP. The evidence
    # travels through the job's store between hosts; the hung job runs
    # until the testbed's timeout (exit 4), long after the report.
    import glob
    import hang_cases

    out = str(tmp_path / "tb")
    env = dict(os.environ)
    env.update(TESTBED_ENV)
    env["WHYSLOW_HANG_GATHER_S"] = "8"
    env["WHYSLOW_HANG_GRACE_S"] = "3"
    train = os.path.join(ROOT, "tests", "python", "hang_train.py")
    cmd = [sys.executable, RUN, "--hosts", "4", "--fault", "none", "--out", out, "--timeout", "45",
           "--", train, "--hang", "sleep", "--hang-rank", "2", "--hang-at", "150"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=300)
    text = p.stdout.decode(errors="replace")
    if p.returncode == SKIP:
        pytest.skip("testbed/run: " + text.strip().splitlines()[-1])
    assert p.returncode == 4, text[-3000:]  # the job hung until the timeout
    found = glob.glob(os.path.join(out, "whyslow-reports", "*", "hang-*", "hang-report.json"))
    assert found, Result(p.returncode, text, out, 0).logs()
    report = json.load(open(found[0]))
    ok, why = hang_cases.judge(report, hang_cases.CASES["sleep"]["truth"])
    assert ok, "%s\n%s" % (why, open(found[0].replace(".json", ".txt")).read())

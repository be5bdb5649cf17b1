"""Reproduces the SIGSEGV of torch.profiler's Python tracer racing gloo's
worker threads (issue 9), and shows whyslow's guard against it.

    torchrun --nproc-per-node 2 benches/profiler_thread_race.py --windows 3000
    torchrun --nproc-per-node 2 benches/profiler_thread_race.py --windows 3000 --wait-idle

A 2-rank DistributedDataParallel job on gloo opens short profiling windows
(``with_stack=True``, 3 steps each) from its optimizer-step post-hook, as
whyslow's windows do. Starting and stopping the Python tracer walks every
Python thread state without the interpreter's head lock; a gloo worker that
frees a finished all-reduce at that moment creates a thread state through
pybind11 and the tracer dereferences it half-initialized. Without the guard
a rank dies of SIGSEGV after some hundreds of windows on a loaded 2-core
machine; with ``--wait-idle`` the windows start and stop only once the
rank's other threads are idle (``whyslow._window._wait_for_idle_threads``).
Exit 0 and ``done N`` when all windows ran without a crash."""

import argparse
import faulthandler
import threading

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerAction, ProfilerActivity, profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=3000)
    ap.add_argument("--wait-idle", action="store_true",
                    help="wait for idle threads before the profiler starts and stops (whyslow's guard)")
    a = ap.parse_args()
    faulthandler.enable()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    wait = lambda: None  # noqa: E731
    if a.wait_idle:
        from whyslow._window import _wait_for_idle_threads as wait

    stop = threading.Event()

    def watchdog():  # a Python thread that keeps waking, like whyslow's
        while not stop.wait(0.0005):
            pass

    threading.Thread(target=watchdog, daemon=True).start()

    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = {"steps": 0, "prof": None, "windows": 0}

    def post_step(_opt, _args, _kwargs):
        state["steps"] += 1
        n = state["steps"]
        if n % 6 == 0:
            prof = profile(activities=[ProfilerActivity.CPU], with_stack=True,
                           schedule=lambda _s: ProfilerAction.RECORD)
            wait()
            prof.start()
            state["prof"] = prof
        elif n % 6 == 3 and state["prof"] is not None:
            wait()
            state["prof"].stop()
            state["prof"] = None
            state["windows"] += 1
            if rank == 0 and state["windows"] % 100 == 0:
                print("windows", state["windows"], flush=True)
        elif state["prof"] is not None:
            state["prof"].step()

    register_optimizer_step_post_hook(post_step)
    for _ in range(6 * a.windows + 3):  # the last window's stop comes 3 steps after its start
        loss = model(torch.randn(16, 256)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    stop.set()
    dist.destroy_process_group()
    print("done", state["windows"], flush=True)


if __name__ == "__main__":
    main()

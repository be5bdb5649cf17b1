"""A small data-parallel training job with injectable faults, for whyslow.

    torchrun --nproc-per-node 4 examples/train.py --iters 600 --fault slow-rank --fault-rank 2

`import whyslow` below is the only whyslow line (remove it and use
`whyslow-run torchrun …` for the zero-code variant). CPU with gloo; CUDA with
nccl when available (one GPU per local rank, round robin).

Faults start at iteration --fault-at (the job is healthy before):
  slow-rank   extra Python work on one rank (injected_slow_rank_work)
  slow-data   slow Dataset.__getitem__ on all ranks (injected_slow_data)
  slow-read   one rank reads each batch from slow storage: it blocks in
              read(2) (injected_slow_read), off the CPU, for --fault-ms
  gc-storm    gc.collect() storms on a random rank each iteration (injected_gc_storm)
  heavy-comm  an extra all_reduce of a large tensor (injected_heavy_comm)
  log-stats   every rank logs statistics of its weights each iteration, in
              Python (log_tensor_stats): a costly per-iteration call that
              slows all ranks alike, no rank late
  extra-kernel  one rank launches extra kernels each iteration (a large
              sort: injected_extra_kernels; CUDA kernels on a GPU)
  big-batch   one rank computes on its batch repeated --batch-scale times:
              the same kernels, each call slower (injected_big_batch)
  none        healthy throughout

--sim-compute-ms M stands in for accelerator time on CPU-only machines: the
training thread waits M ms per iteration (in simulated_device_compute) as it
would wait for the GPU, so that several ranks sharing few cores are not
CPU-bound and their iteration times stay steady (the end-to-end tests use it).
"""

import argparse
import gc
import os
import random
import sys
import time

import whyslow  # noqa: F401  (activates itself under torchrun)

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

FAULT_ACTIVE = False
FAULT_MS = 10.0


def injected_slow_rank_work(ms):
    """Pure-Python busy work for about `ms` milliseconds."""
    end = time.perf_counter() + ms / 1e3
    x = 0
    while time.perf_counter() < end:
        for i in range(200):
            x += i * i
    return x


def injected_slow_data(ms):
    """A slow storage read: sleeps `ms` milliseconds."""
    time.sleep(ms / 1e3)


class SlowStorage:
    """Storage that answers a read `ms` milliseconds after it was asked:
    a thread sleeps, then writes the bytes into a pipe the reader blocks
    on."""

    def __init__(self):
        import threading
        self.requests, self.ask = os.pipe()
        self.data, self.answer = os.pipe()

        def serve():
            while True:
                ms = os.read(self.requests, 8)
                if not ms:
                    return
                time.sleep(int.from_bytes(ms, "little") / 1e3)
                os.write(self.answer, b"b")

        threading.Thread(target=serve, daemon=True).start()


_STORAGE = None


def injected_slow_read(ms):
    """A batch read from slow storage: blocked in read(2) for `ms` ms."""
    global _STORAGE
    if _STORAGE is None:
        _STORAGE = SlowStorage()
    os.write(_STORAGE.ask, int(ms).to_bytes(8, "little"))
    os.read(_STORAGE.data, 1)


def injected_gc_storm(n):
    """Creates cyclic garbage and collects it `n` times."""
    for _ in range(n):
        junk = [[] for _ in range(20000)]
        for a, b in zip(junk, junk[1:]):
            a.append(b)
            b.append(a)
        del junk
        gc.collect()


def injected_extra_kernels(t, calls):
    """Extra work on the accelerator: `calls` sorts of `t`."""
    for _ in range(calls):
        torch.sort(t)


def injected_big_batch(x, y, scale):
    """The batch repeated `scale` times: every kernel of the step does
    `scale` times the work under the same name."""
    return x.repeat(scale, 1), y.repeat(scale)


def simulated_device_compute(ms):
    """Waits as a training thread waits for its accelerator."""
    time.sleep(ms / 1e3)


def injected_heavy_comm(t):
    """An extra all_reduce of a large tensor."""
    dist.all_reduce(t)


class Synthetic(Dataset):
    def __init__(self, n, dim, classes, per_sample_ms):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)
        self.per_sample_ms = per_sample_ms

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if FAULT_ACTIVE and self.per_sample_ms > 0:
            injected_slow_data(self.per_sample_ms)
        return self.x[i], self.y[i]


def main():
    global FAULT_ACTIVE
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--fault", default="none",
                    choices=["none", "slow-rank", "slow-data", "slow-read", "gc-storm", "heavy-comm",
                             "log-stats", "extra-kernel", "big-batch"])
    ap.add_argument("--fault-at", type=int, default=150, help="first faulty iteration")
    ap.add_argument("--fault-after-s", type=float, default=-1.0,
                    help=">= 0: the fault starts this many seconds after the first iteration "
                         "instead of at --fault-at (each rank on its own clock; testbed/run)")
    ap.add_argument("--fault-rank", type=int, default=1)
    ap.add_argument("--fault-ms", type=float, default=15.0,
                    help="slow-rank: ms of extra work per iteration; slow-data: ms per batch")
    ap.add_argument("--comm-mb", type=float, default=16.0, help="heavy-comm tensor size")
    ap.add_argument("--gc-rounds", type=int, default=3)
    ap.add_argument("--kernel-elems", type=int, default=1 << 22, help="extra-kernel: elements sorted")
    ap.add_argument("--kernel-calls", type=int, default=8, help="extra-kernel: sorts per iteration")
    ap.add_argument("--batch-scale", type=int, default=8, help="big-batch: batch repeated this often")
    ap.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"],
                    help="auto: nccl with CUDA, gloo without (several ranks sharing one GPU need gloo)")
    ap.add_argument("--trigger-at", type=int, default=-1,
                    help="call whyslow.trigger() at this iteration (on-demand profile)")
    ap.add_argument("--sim-compute-ms", type=float, default=0.0,
                    help="ms per iteration of simulated accelerator time (CPU-only runs)")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--no-ready-file", action="store_true",
                    help="do not create $TESTBED_READY_FILE (as a script unaware of the testbed)")
    ap.add_argument("--times-out", default="", help="write per-iteration times (s) here (rank 0)")
    a = ap.parse_args()

    cuda = torch.cuda.is_available()
    torch.set_num_threads(1)
    backend = a.backend if a.backend != "auto" else ("nccl" if cuda else "gloo")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")

    model = nn.Sequential(
        nn.Linear(a.dim, a.hidden), nn.ReLU(),
        nn.Linear(a.hidden, a.hidden), nn.ReLU(),
        nn.Linear(a.hidden, 10),
    ).to(dev)
    model = DDP(model, device_ids=[dev.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    per_sample_ms = a.fault_ms / a.batch if a.fault == "slow-data" else 0.0
    ds = Synthetic(a.batch * 64, a.dim, 10, per_sample_ms)
    loader = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=0, drop_last=True)
    comm = torch.zeros(int(a.comm_mb * 2**20 / 4), device=dev) if a.fault == "heavy-comm" else None
    sort_me = torch.rand(a.kernel_elems, device=dev) if a.fault == "extra-kernel" else None
    rng = random.Random(1234)  # same sequence on every rank

    it = 0
    times = []
    t_last = time.perf_counter()
    t_first = None
    # testbed/run counts --fault-after from the moment training runs: rank 0
    # creates this file after its first iteration.
    ready_file = os.environ.get("TESTBED_READY_FILE") if rank == 0 and not a.no_ready_file else None
    fault_onset_logged = False
    while it < a.iters:
        for x, y in loader:
            if it >= a.iters:
                break
            if a.fault_after_s >= 0:
                if t_first is None:
                    t_first = time.perf_counter()
                FAULT_ACTIVE = a.fault != "none" and time.perf_counter() - t_first >= a.fault_after_s
            else:
                FAULT_ACTIVE = a.fault != "none" and it >= a.fault_at
            one_rank = ("slow-rank", "slow-read", "extra-kernel", "big-batch")
            if FAULT_ACTIVE and not fault_onset_logged and (rank == 0 or (a.fault in one_rank and rank == a.fault_rank)):
                fault_onset_logged = True
                print("fault %s onset at iteration %d, time %.3f (rank %d)" % (a.fault, it, time.time(), rank),
                      flush=True)
            if it == a.trigger_at:
                whyslow.trigger("on-demand (examples/train.py --trigger-at %d)" % it)
            x, y = x.to(dev), y.to(dev)
            if FAULT_ACTIVE and a.fault == "big-batch" and rank == a.fault_rank:
                x, y = injected_big_batch(x, y, a.batch_scale)
            out = model(x)
            loss = loss_fn(out, y)
            if a.sim_compute_ms > 0:
                simulated_device_compute(a.sim_compute_ms)
            if FAULT_ACTIVE:
                if a.fault == "slow-rank" and rank == a.fault_rank:
                    injected_slow_rank_work(a.fault_ms)
                elif a.fault == "slow-read" and rank == a.fault_rank:
                    injected_slow_read(a.fault_ms)
                elif a.fault == "extra-kernel" and rank == a.fault_rank:
                    injected_extra_kernels(sort_me, a.kernel_calls)
                elif a.fault == "gc-storm" and rng.randrange(world) == rank:
                    injected_gc_storm(a.gc_rounds)
                elif a.fault == "heavy-comm":
                    injected_heavy_comm(comm)
                elif a.fault == "log-stats":
                    log_tensor_stats(model, a.fault_ms)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            it += 1
            now = time.perf_counter()
            times.append(now - t_last)
            t_last = now
            if ready_file and it == 1:
                with open(ready_file, "w") as f:
                    f.write("%.6f\n" % time.time())
            if rank == 0 and a.log_every and it % a.log_every == 0:
                recent = times[-a.log_every:]
                print("iter %d loss %.3f %.1f ms/iter" % (it, loss.item(), 1e3 * sum(recent) / len(recent)),
                      flush=True)
    if cuda:
        torch.cuda.synchronize()
    if rank == 0 and a.times_out:
        with open(a.times_out, "w") as f:
            f.write("\n".join("%.6f" % t for t in times))
    dist.barrier()
    # Free the DDP model while Python is fully alive: its reducer holds gloo
    # work and tensors in reference cycles, and left to the collector at
    # interpreter exit a gloo thread may take the GIL during finalization,
    # which aborts the process ("terminate called without an active exception").
    del model, opt, loader
    gc.collect()
    dist.destroy_process_group()


def log_tensor_stats(model, ms):
    """Verbose logging of the weights' statistics, element by element in
    Python for about `ms` milliseconds (kept, not printed)."""
    end = time.perf_counter() + ms / 1e3
    lines = []
    while time.perf_counter() < end:
        for name, p in model.named_parameters():
            row = p.detach().reshape(-1)[:64].tolist()
            mean = sum(row) / len(row)
            var = sum((v - mean) ** 2 for v in row) / len(row)
            lines.append("%s mean %.6f var %.6f" % (name, mean, var))
            if time.perf_counter() >= end:
                break
    return len(lines)


if __name__ == "__main__":
    sys.exit(main())

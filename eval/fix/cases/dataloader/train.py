"""Trains a small classifier on records read one by one from storage."""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Records(Dataset):
    """One record per storage read (about 2 ms each: a network file system)."""

    def __init__(self, n, dim):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.002)  # the storage round trip
        return self.x[i], self.y[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--trace-dir", default="")
    ap.add_argument("--times-out", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Records(16 * a.iters, 256), batch_size=16, shuffle=True)
    prof = profiler(a.trace_dir, rank)
    times, t = [], time.perf_counter()
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if prof:
            prof.step()
        now = time.perf_counter()
        times.append(now - t)
        t = now
    if prof:
        prof.stop()
    if rank == 0 and a.times_out:
        with open(a.times_out, "w") as f:
            f.write("\n".join("%.6f" % s for s in times))
    dist.destroy_process_group()


def profiler(trace_dir, rank):
    if not trace_dir:
        return None
    from torch.profiler import ProfilerActivity, profile, schedule

    p = profile(activities=[ProfilerActivity.CPU], with_stack=True,
                schedule=schedule(wait=10, warmup=2, active=8, repeat=1),
                on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(trace_dir, "rank-%d.json" % rank)))
    p.start()
    return p


if __name__ == "__main__":
    main()

"""Trains a small classifier on features standardized per sample."""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

BATCH = 64


def standardize(batch):
    """Each sample to zero mean and unit variance."""
    out = []
    for row in batch.tolist():
        mean = sum(row) / len(row)
        var = sum((v - mean) ** 2 for v in row) / len(row)
        out.append([(v - mean) / (var ** 0.5 + 1e-6) for v in row])
    return torch.tensor(out)


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
    g = torch.Generator().manual_seed(rank)
    data = TensorDataset(torch.randn(BATCH * a.iters, 256, generator=g) * 3 + 1,
                         torch.randint(0, 10, (BATCH * a.iters,), generator=g))
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    prof = profiler(a.trace_dir, rank)
    times, t = [], time.perf_counter()
    for step, (x, y) in enumerate(loader):
        x = standardize(x)
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

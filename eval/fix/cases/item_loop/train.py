"""Trains a small classifier and tracks its running accuracy."""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

BATCH = 2048


def count_correct(logits, labels):
    """How many predictions match their label."""
    pred = logits.argmax(dim=1)
    correct = 0
    for i in range(len(labels)):
        if pred[i].item() == labels[i].item():
            correct += 1
    return correct


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
    seen = right = 0
    prof = profiler(a.trace_dir, rank)
    times, t = [], time.perf_counter()
    for step, (x, y) in enumerate(loader):
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += len(y)
        right += count_correct(out.detach(), y)
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

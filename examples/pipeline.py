"""A pipeline- and data-parallel training job (1F1B), for whyslow's flow analysis.

    torchrun --nnodes 4 ... examples/pipeline.py --pp 2 --steps 20 --steps-out DIR

World = pp × dp ranks; rank r is stage r // dp, data-parallel index r % dp. Each
step runs --microbatches micro-batches through the stages with the 1F1B schedule
(warm-up forwards, one-forward-one-backward, cool-down backwards): activations
go forward and their gradients backward with point-to-point send/recv between
neighbouring stages. Gradients are all-reduced across the stage's data-parallel
group in buckets, each launched as soon as the last micro-batch's backward has
produced it (as DistributedDataParallel does), so the all-reduces overlap the
remaining backward compute. --pp 1 gives a data-parallel-only job.

Layer compute is simulated accelerator time (a sleep in forward and backward,
like waiting for a GPU), so many ranks share few cores without becoming
CPU-bound. The layers' widths differ, so the buckets differ in size.

Ground truth for whyslow's tests: with --steps-out DIR every rank writes
DIR/steps-rank<r>.json (its stage, DP group, PP peers and the wall-clock end
of every step); with --torch-trace DIR it also runs torch.profiler over every
step and writes DIR/rank<r>.json, whose ProfilerStep#N spans are the steps'
boundaries as PyTorch's own profiler saw them. CPU with gloo.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


class SimulatedKernel(torch.autograd.Function):
    """Identity whose forward and backward wait like a kernel on a device."""

    @staticmethod
    def forward(ctx, x, fwd_ms, bwd_ms):
        ctx.bwd_ms = bwd_ms
        time.sleep(fwd_ms / 1e3)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.bwd_ms / 1e3)
        return g, None, None


class Layer(nn.Module):
    def __init__(self, d_in, d_out, fwd_ms, bwd_ms):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)
        self.fwd_ms, self.bwd_ms = fwd_ms, bwd_ms

    def forward(self, x):
        return torch.relu(SimulatedKernel.apply(self.lin(x), self.fwd_ms, self.bwd_ms))


class BucketedAllReduce:
    """All-reduces gradients in buckets over `group` once every parameter of a
    bucket has its gradient for the step (post-accumulate-grad hooks), while
    backward goes on; `finish` waits and averages."""

    def __init__(self, params, group, size, bucket_params):
        self.group, self.size = group, size
        self.buckets = [params[i:i + bucket_params] for i in range(0, len(params), bucket_params)]
        self.bucket_of = {}
        for b, ps in enumerate(self.buckets):
            for p in ps:
                self.bucket_of[p] = b
        self.armed = False
        self.pending = []
        self.ready = [0] * len(self.buckets)
        for p in params:
            p.register_post_accumulate_grad_hook(self.on_grad)

    def arm(self):
        """The next backward is the step's last for these parameters."""
        self.armed = True
        self.ready = [0] * len(self.buckets)

    def on_grad(self, p):
        if not self.armed:
            return
        b = self.bucket_of[p]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[b]])
            work = dist.all_reduce(flat, group=self.group, async_op=True)
            self.pending.append((b, flat, work))

    def finish(self):
        for b, flat, work in self.pending:
            work.wait()
            flat /= self.size
            off = 0
            for q in self.buckets[b]:
                n = q.grad.numel()
                q.grad.copy_(flat[off:off + n].view_as(q.grad))
                off += n
        self.pending = []
        self.armed = False


def one_f_one_b(stages, stage, microbatches):
    """The 1F1B order of one stage: a list of ('F'|'B', micro-batch)."""
    warmup = min(stages - stage - 1, microbatches)
    order = [("F", m) for m in range(warmup)]
    f, b = warmup, 0
    while f < microbatches:
        order.append(("F", f))
        f += 1
        order.append(("B", b))
        b += 1
    order += [("B", m) for m in range(b, microbatches)]
    return order


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pp", type=int, default=2, help="pipeline stages")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--mb-size", type=int, default=32, help="samples per micro-batch")
    ap.add_argument("--widths", default="256,512,384,256",
                    help="layer widths of each stage, input first; with --pp > 1 the "
                         "last equals the first (a stage's output is the next one's input)")
    ap.add_argument("--fwd-ms", type=float, default=8.0, help="simulated forward time per layer")
    ap.add_argument("--bwd-ms", type=float, default=16.0, help="simulated backward time per layer")
    ap.add_argument("--optim-ms", type=float, default=40.0, help="simulated optimizer time")
    ap.add_argument("--bucket-layers", type=int, default=1, help="layers per all-reduce bucket")
    ap.add_argument("--steps-out", default="", help="write DIR/steps-rank<r>.json")
    ap.add_argument("--torch-trace", default="",
                    help="profile every step with torch.profiler; write DIR/rank<r>.json")
    a = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % a.pp:
        raise SystemExit("world size %d is not a multiple of --pp %d" % (world, a.pp))
    dp = world // a.pp
    stage, dpi = rank // dp, rank % dp
    groups = [dist.new_group([s * dp + i for i in range(dp)]) for s in range(a.pp)]
    prev_rank = rank - dp if stage > 0 else None
    next_rank = rank + dp if stage < a.pp - 1 else None

    widths = [int(w) for w in a.widths.split(",")]
    if a.pp > 1 and widths[0] != widths[-1]:
        raise SystemExit("--widths: the last width must equal the first with --pp > 1")
    torch.manual_seed(stage)
    model = nn.Sequential(*[Layer(i, o, a.fwd_ms, a.bwd_ms) for i, o in zip(widths, widths[1:])])
    params = [p for layer in reversed(model) for p in layer.parameters()]  # backward order
    reducer = BucketedAllReduce(params, groups[stage], dp, 2 * a.bucket_layers) if dp > 1 else None
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1000 + rank)
    d_in, d_out = widths[0], widths[-1]
    order = one_f_one_b(a.pp, stage, a.microbatches)

    prof = None
    if a.torch_trace:
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        # Record every step: each prof.step() closes one ProfilerStep#N span.
        prof = profile(activities=[ProfilerActivity.CPU],
                       schedule=lambda _step: ProfilerAction.RECORD)
        prof.start()
    ends = []
    for step in range(a.steps):
        opt.zero_grad(set_to_none=True)
        inputs, outputs, sends = {}, {}, []
        for kind, m in order:
            if kind == "F":
                if prev_rank is None:
                    x = torch.randn(a.mb_size, d_in)
                else:
                    x = torch.empty(a.mb_size, d_in)
                    dist.recv(x, prev_rank)
                x.requires_grad_(prev_rank is not None)
                y = model(x)
                inputs[m], outputs[m] = x, y
                if next_rank is not None:
                    # Non-blocking: in 1F1B neighbours send to each other at once.
                    sends.append(dist.isend(y.detach().contiguous(), next_rank))
            else:
                if reducer is not None and m == a.microbatches - 1:
                    reducer.arm()
                y = outputs.pop(m)
                if next_rank is None:
                    y.pow(2).mean().backward()
                else:
                    g = torch.empty(a.mb_size, d_out)
                    dist.recv(g, next_rank)
                    y.backward(g)
                x = inputs.pop(m)
                if prev_rank is not None:
                    sends.append(dist.isend(x.grad.contiguous(), prev_rank))
        for w in sends:
            w.wait()
        if reducer is not None:
            reducer.finish()
        time.sleep(a.optim_ms / 1e3)
        opt.step()
        ends.append(time.time())
        if prof is not None:
            prof.step()
        if rank == 0 and (step + 1) % 5 == 0:
            print("step %d: %.1f ms" % (step + 1, 1e3 * (ends[-1] - ends[-2]) if len(ends) > 1 else 0),
                  flush=True)
    if a.steps_out:
        os.makedirs(a.steps_out, exist_ok=True)
        path = os.path.join(a.steps_out, "steps-rank%d.json" % rank)
        with open(path + ".tmp", "w") as f:
            json.dump({"rank": rank, "world": world, "pp": a.pp, "dp": dp, "stage": stage,
                       "dp_index": dpi, "dp_group": [stage * dp + i for i in range(dp)],
                       "pp_peers": [r for r in (prev_rank, next_rank) if r is not None],
                       "host": os.environ.get("TESTBED_HOST", ""), "step_end_unix_s": ends}, f)
        os.replace(path + ".tmp", path)
    if prof is not None:
        prof.stop()
        os.makedirs(a.torch_trace, exist_ok=True)
        path = os.path.join(a.torch_trace, "rank%d.json" % rank)
        prof.export_chrome_trace(path + ".tmp")
        os.replace(path + ".tmp", path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

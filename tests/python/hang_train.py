"""A 4-rank job laid out as 2 data-parallel x 2 tensor-parallel ranks
(gloo, CPU), with one injected hang, for whyslow's hang analysis
(tests/python/test_hang.py, scripts/make-hang-fixtures).

Groups: tp = {0,1}, {2,3}; dp = {0,2}, {1,3}; the default group = all.
Each step: compute, all-gather in tp, compute, all-reduce of the gradient
in dp, all-reduce of the loss in the default group, optimizer step.

--hang CASE from step --hang-at on rank --hang-rank:
  sleep     the rank sleeps in Python before its step (stalled_data_loader)
  gil       the rank holds the GIL in native code (native_tokenizer_holding_gil:
            libc sleep through ctypes.PyDLL, which does not release the GIL)
  exit      the rank's process exits (status 0, so torchrun waits for the
            rest) while a forked child keeps its sockets open, as a DataLoader
            worker does: its peers wait instead of seeing the connection close
  mismatch  the rank skips its dp all-reduce once (skip_gradient_sync) and
            goes on: its collectives no longer pair with its peers'
  slow      not a hang: the rank sleeps --slow-ms every step from then on
  none      healthy

--layout pp: the same 4 ranks as 2 pipeline stages x 2 data-parallel
ranks instead: stage 0 = {0,1}, stage 1 = {2,3}; pp = {0,2}, {1,3} (send
and recv between stages: activations forward, gradients back); dp = {0,1},
{2,3}. Each step: stage 0 computes and sends to its stage-1 peer, stage 1
receives, computes and sends the gradient back, then the dp all-reduce
within the stage and the loss all-reduce in the default group. gloo's
Flight Recorder records the collectives, not the sends and receives.

--dump-after-s S: every rank also writes its evidence (stacks, Flight
Recorder dump) S seconds after its first step into $HANG_DUMP_DIR, as the
online package does after a stall: what a healthy or a slow job looks like
to `whyslow hang`.
"""

import argparse
import ctypes
import os
import threading
import time

import torch
import torch.distributed as dist

import whyslow  # noqa: F401  (activates under torchrun)


def stalled_data_loader():
    time.sleep(3600)


def native_tokenizer_holding_gil():
    ctypes.PyDLL(None).sleep(3600)


def slow_storage_read(ms):
    time.sleep(ms / 1000.0)


def skip_gradient_sync():
    pass  # the dp all-reduce this rank should have issued


def dump_later(after_s, rank):
    from whyslow import _hang

    time.sleep(after_s)
    _hang.write_local(os.environ["HANG_DUMP_DIR"], rank, _hang.local_evidence(rank))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--hang", default="none")
    ap.add_argument("--hang-at", type=int, default=80)
    ap.add_argument("--hang-rank", type=int, default=2)
    ap.add_argument("--slow-ms", type=float, default=150.0)
    ap.add_argument("--dim", type=int, default=192)
    ap.add_argument("--dump-after-s", type=float, default=-1.0)
    ap.add_argument("--layout", choices=["tp", "pp"], default="tp")
    a = ap.parse_args()
    if a.layout == "pp":
        return pipeline(a)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, "the layout is 2 x 2"
    tp_groups = [dist.new_group([0, 1], group_desc="tp"), dist.new_group([2, 3], group_desc="tp")]
    dp_groups = [dist.new_group([0, 2], group_desc="dp"), dist.new_group([1, 3], group_desc="dp")]
    tp = tp_groups[rank // 2]
    dp = dp_groups[rank % 2]

    w, opt, loader = model_and_data(a, rank)
    for step, (x,) in enumerate(loader):
        if step == 1 and a.dump_after_s >= 0:
            threading.Thread(target=dump_later, args=(a.dump_after_s, rank), daemon=True).start()
        hit = step >= a.hang_at and rank == a.hang_rank
        inject(a, step, rank)
        opt.zero_grad()
        h = x @ w
        parts = [torch.empty_like(h) for _ in range(2)]
        dist.all_gather(parts, h, group=tp)
        loss = h.pow(2).mean() + 0.0 * torch.cat(parts).mean()
        for _ in range(3):
            (x @ x.T @ x).sum()  # compute between the collectives
        loss.backward()
        if hit and a.hang == "mismatch" and step == a.hang_at:
            skip_gradient_sync()
        else:
            dist.all_reduce(w.grad, group=dp)
        dist.all_reduce(loss.detach().reshape(1))
        opt.step()
    dist.destroy_process_group()


def model_and_data(a, rank):
    """The rank's weight, optimizer and batches (both layouts)."""
    torch.manual_seed(rank)
    w = torch.nn.Parameter(torch.randn(a.dim, a.dim) * 0.01)
    opt = torch.optim.SGD([w], lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(64 * a.steps, a.dim))
    return w, opt, torch.utils.data.DataLoader(data, batch_size=64)


def inject(a, step, rank):
    hit = step >= a.hang_at and rank == a.hang_rank
    if hit and a.hang == "sleep":
        stalled_data_loader()
    if hit and a.hang == "gil":
        native_tokenizer_holding_gil()
    if hit and a.hang == "exit":
        if os.fork() == 0:
            time.sleep(3600)  # the child keeps the sockets open
        os._exit(0)
    if hit and a.hang == "slow":
        slow_storage_read(a.slow_ms)


def pipeline(a):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, "the layout is 2 stages x 2"
    pp_groups = [dist.new_group([0, 2], group_desc="pp"), dist.new_group([1, 3], group_desc="pp")]
    dp_groups = [dist.new_group([0, 1], group_desc="dp"), dist.new_group([2, 3], group_desc="dp")]
    stage, peer = rank // 2, rank ^ 2
    pp = pp_groups[rank % 2]
    dp = dp_groups[stage]
    w, opt, loader = model_and_data(a, rank)
    for step, (x,) in enumerate(loader):
        if step == 1 and a.dump_after_s >= 0:
            threading.Thread(target=dump_later, args=(a.dump_after_s, rank), daemon=True).start()
        inject(a, step, rank)
        opt.zero_grad()
        if stage == 0:
            h = x @ w
            dist.send(h.detach(), dst=peer, group=pp)
            g = torch.empty_like(h)
            dist.recv(g, src=peer, group=pp)
            h.backward(g)
            loss = h.detach().pow(2).mean()
        else:
            h = torch.empty(x.shape[0], a.dim)
            dist.recv(h, src=peer, group=pp)
            h.requires_grad_(True)
            out = h @ w
            for _ in range(3):
                (x @ x.T @ x).sum()  # compute between the collectives
            loss = out.pow(2).mean()
            loss.backward()
            dist.send(h.grad, dst=peer, group=pp)
        dist.all_reduce(w.grad, group=dp)
        dist.all_reduce(loss.detach().reshape(1))
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""GPU workloads for the overhead benchmark: each prints one JSON line with its timings.

  seed     the DataLoader benchmark of the original report (direct indexing vs DataLoader)
  train    a training-like loop: MLP forward/backward/step on batches copied from pinned memory
  launch   a launch-heavy loop of tiny kernels: the added cost per traced CUDA call shows here
  idle     sleeps: what the collector costs with nothing to trace (its fixed start-up CPU)
Run on the GPU host by run_overhead.py, traced and untraced, interleaved.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from torch.utils.data import DataLoader


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(100, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).cuda()


def seed(n: int) -> dict[str, float]:
    """Direct tensor indexing vs DataLoader(shuffle) vs DataLoader(4 workers, pin_memory)."""
    bs = 1_048_576
    x = torch.randn(n, 100)
    model = _mlp()
    out: dict[str, float] = {}

    def run(name: str, batches) -> None:
        t = time.perf_counter()
        with torch.no_grad():
            for b in batches:
                model(b.cuda())
        torch.cuda.synchronize()
        out[name] = time.perf_counter() - t

    run("warmup", (x[i : i + bs] for i in range(0, bs * 2, bs)))
    out["t0_ns"] = time.time_ns()
    run("direct", (x[i : i + bs] for i in range(0, n, bs)))
    run("dataloader_shuffle", DataLoader(x, batch_size=bs, shuffle=True))
    run("dataloader_4workers_pin", DataLoader(x, batch_size=bs, shuffle=True, num_workers=4, pin_memory=True))
    out.pop("warmup")
    t0_ns = out.pop("t0_ns")
    out["total"] = sum(out.values())
    out["t0_ns"], out["t1_ns"] = t0_ns, time.time_ns()
    return out


def train(steps: int) -> dict[str, float]:
    """Forward, backward and optimizer step with a host->device copy and a loss read-back each step."""
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    xs = torch.randn(16, 8192, 100).pin_memory()
    ys = torch.randint(0, 10, (16, 8192)).pin_memory()
    loss_fn = torch.nn.CrossEntropyLoss()
    for i in range(20):  # warm-up: allocator, cuBLAS handles, kernels
        loss = loss_fn(model(xs[i % 16].cuda(non_blocking=True)), ys[i % 16].cuda(non_blocking=True))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    t0_ns = time.time_ns()
    t = time.perf_counter()
    for i in range(steps):
        loss = loss_fn(model(xs[i % 16].cuda(non_blocking=True)), ys[i % 16].cuda(non_blocking=True))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i % 10 == 0:
            loss.item()
    torch.cuda.synchronize()
    return {"total": time.perf_counter() - t, "steps": steps, "t0_ns": t0_ns, "t1_ns": time.time_ns()}


def launch(calls: int) -> dict[str, float]:
    """Tiny elementwise kernels back to back: the host cost of each launch dominates."""
    x = torch.zeros(16, device="cuda")
    for _ in range(1000):
        x.add_(1)
    torch.cuda.synchronize()
    t0_ns = time.time_ns()
    t = time.perf_counter()
    marks = []  # wall clock every 10,000 launches: with probe_gaps, the same process's pace attached vs detached
    for i in range(calls):
        x.add_(1)
        if i % 10_000 == 0:
            marks.append(time.time_ns())
    torch.cuda.synchronize()
    total = time.perf_counter() - t
    return {"total": total, "calls": calls, "per_call_ns": total / calls * 1e9, "t0_ns": t0_ns, "t1_ns": time.time_ns(),
            "marks_every": 10_000, "marks": marks}


def idle(seconds: int) -> dict[str, float]:
    """No CUDA work: the collector's own cost (compile, attach, sampling) with nothing to trace."""
    t = time.perf_counter()
    time.sleep(seconds)
    return {"total": time.perf_counter() - t}


if __name__ == "__main__":
    name, size = sys.argv[1], int(sys.argv[2])
    result = {"seed": seed, "train": train, "launch": launch, "idle": idle}[name](size)
    print(json.dumps({"workload": name, "size": size, **result}), flush=True)

"""GPU workloads for the overhead benchmark: each prints one JSON line with its timings.

  seed     the DataLoader benchmark of the original report (direct indexing vs DataLoader)
  train    a training-like loop: MLP forward/backward/step on batches copied from pinned memory
  launch   a launch-heavy loop of tiny kernels: the added cost per traced CUDA call shows here
  idle     sleeps: what the collector costs with nothing to trace (its fixed start-up CPU)
Run on the GPU host by run_overhead.py, traced and untraced, interleaved.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from perfcount import Counters
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
    return train_blocks()(steps)


def train_blocks():
    """The training loop's set-up (model, optimizer, pinned batches, 20 warm-up steps), then a function
    that runs one timed block of steps."""
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    xs = torch.randn(16, 8192, 100).pin_memory()
    ys = torch.randint(0, 10, (16, 8192)).pin_memory()
    loss_fn = torch.nn.CrossEntropyLoss()

    def steps_of(n: int, marks: list[int] | None = None, waits: list[int] | None = None) -> None:
        for i in range(n):
            if marks is not None and i % 10 == 0:
                marks.append(time.time_ns())
            loss = loss_fn(model(xs[i % 16].cuda(non_blocking=True)), ys[i % 16].cuda(non_blocking=True))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i % 10 == 0:
                t = time.perf_counter_ns()
                loss.item()  # waits for the GPU: how long says whether a slow stretch is the host or the GPU
                if waits is not None:
                    waits.append(time.perf_counter_ns() - t)

    steps_of(20)  # warm-up: allocator, cuBLAS handles, kernels
    torch.cuda.synchronize()

    def block(steps: int, warmup_s: float = 0.0) -> dict[str, float]:
        end = time.perf_counter() + warmup_s  # the same load just before every timed block (see blocks())
        while time.perf_counter() < end:
            steps_of(10)
        clocks = [sm_clock_mhz()] if warmup_s else []
        counters = Counters()
        t0_ns = time.time_ns()
        t = time.perf_counter()
        marks: list[int] = []  # wall clock every 10 steps: with probe_gaps, the pace attached vs detached
        waits: list[int] = []  # ns in each 10-step segment's loss.item(), the host waiting for the GPU
        steps_of(steps // 2, marks, waits)
        if warmup_s:
            clocks.append(sm_clock_mhz())
        steps_of(steps - steps // 2, marks, waits)
        torch.cuda.synchronize()
        total = time.perf_counter() - t
        return {"total": total, "steps": steps, "t0_ns": t0_ns, "t1_ns": time.time_ns(), "counters": counters.read(),
                "marks_every": 10, "marks_unit": "step", "marks": marks, "item_wait_ns": waits, "sm_clock_mhz": clocks}

    return block


def launch(calls: int, marks_every: int = 10_000) -> dict[str, float]:
    """Tiny elementwise kernels back to back: the host cost of each launch dominates."""
    return launch_blocks()(calls, marks_every)


def launch_blocks():
    """The launch loop's set-up (a tensor, 1,000 warm-up launches), then a function that runs one timed block."""
    x = torch.zeros(16, device="cuda")
    for _ in range(1000):
        x.add_(1)
    torch.cuda.synchronize()

    def block(calls: int, marks_every: int = 10_000, warmup_s: float = 0.0) -> dict[str, float]:
        end = time.perf_counter() + warmup_s  # the same load just before every timed block (see blocks())
        while time.perf_counter() < end:
            for _ in range(1000):
                x.add_(1)
        counters = Counters()
        t0_ns = time.time_ns()
        t = time.perf_counter()
        marks = []  # wall clock every `marks_every` launches: with probe_gaps, the pace attached vs detached
        clocks = []
        for i in range(calls):
            x.add_(1)
            if i % marks_every == 0:
                marks.append(time.time_ns())
                if warmup_s and i % (calls // 4) == 0:
                    clocks.append(sm_clock_mhz())
        torch.cuda.synchronize()
        total = time.perf_counter() - t
        return {"total": total, "calls": calls, "per_call_ns": total / calls * 1e9, "t0_ns": t0_ns,
                "t1_ns": time.time_ns(), "counters": counters.read(), "marks_every": marks_every,
                "marks": marks, "sm_clock_mhz": clocks}

    return block


def idle(seconds: int) -> dict[str, float]:
    """No CUDA work: the collector's own cost (compile, attach, sampling) with nothing to trace."""
    t = time.perf_counter()
    time.sleep(seconds)
    return {"total": time.perf_counter() - t}


# Untimed load just before every timed block. A traced block follows the collector's start (the GPU idle
# for ~10 s), an untraced one sometimes follows a block at once; the H200's launch pace and step time
# were bimodal (7.2 vs ~10 us per launch, 1.0 vs ~1.5 ms per step), so the GPU's clock must not depend
# on what came before.
WARMUP_S = 1.0


def sm_clock_mhz() -> int | None:
    """The GPU's current SM clock (NVML through ctypes; None where NVML is missing)."""
    global _NVML
    try:
        if _NVML is None:
            import ctypes

            lib = ctypes.CDLL("libnvidia-ml.so.1")
            lib.nvmlInit_v2()
            handle = ctypes.c_void_p()
            lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
            _NVML = (lib, handle, ctypes)
        lib, handle, ctypes = _NVML
        mhz = ctypes.c_uint()
        return mhz.value if lib.nvmlDeviceGetClockInfo(handle, 1, ctypes.byref(mhz)) == 0 else None  # 1: NVML_CLOCK_SM
    except OSError:
        return None


_NVML = None


def blocks(name: str, size: int) -> None:
    """One process, many timed blocks: set up once, say `ready`, then run a block for every `go` line on
    stdin (one JSON line each) until `stop`. bench/gpu/same_process.py starts and stops the collector
    between blocks, so traced and untraced blocks of the same process are compared."""
    if name == "launch":
        run_launch = launch_blocks()

        def block(n: int) -> dict[str, float]:
            return run_launch(n, 2_000, WARMUP_S)  # finer marks (~15 ms each): the pace attached vs detached
    elif name == "train":
        run_train = train_blocks()

        def block(n: int) -> dict[str, float]:
            return run_train(n, WARMUP_S)
    elif name == "seed":
        block = seed
    else:
        raise SystemExit(f"no blocks for {name}")
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "stop":
            break
        steal = _steal_ms()
        result = block(size)
        result["steal_ms"] = _steal_ms() - steal
        print(json.dumps({"workload": name, "size": size, "pid": os.getpid(), **result}), flush=True)


def _steal_ms() -> float:
    """Time stolen by the hypervisor from this process's CPUs so far (/proc/stat): a shared host's noise."""
    cpus = {f"cpu{c}" for c in os.sched_getaffinity(0)}
    with open("/proc/stat") as stat:
        ticks = sum(int(f[8]) for f in (line.split() for line in stat) if f[0] in cpus)
    return ticks * 1000 / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    if sys.argv[1] == "blocks":
        blocks(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    name, size = sys.argv[1], int(sys.argv[2])
    result = {"seed": seed, "train": train, "launch": launch, "idle": idle}[name](size)
    print(json.dumps({"workload": name, "size": size, "pid": os.getpid(), **result}), flush=True)

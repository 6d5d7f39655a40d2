"""Shared by the zoo's scenarios: arguments, CPU pinning, thread/process names, a step recorder,
phase timing, child processes, a small training loop, and the ground-truth file.

Each scenario stages ONE known cause on a real GPU host and writes what it staged (who, where,
when) as JSON, so that what the analysis says about the recorded trace can be checked against it.
A scenario runs its phases in wall-clock time: baseline (healthy), window (the cause), recovery.

    python3 bench/gpu/zoo/cpu_hog.py --truth /tmp/zoo/cpu_hog.truth.json            (GPU host)
    python3 bench/gpu/zoo/cpu_hog.py --truth /tmp/t.json --device cpu --scale 0.15   (smoke test)

With --device cpu the same code paths run on CPU tensors (CUDA-only calls are skipped and said so
in the truth's notes); --scale shortens every phase. CPU numbers are the GPU host's (16 CPUs; the
collector has 12-15): on a machine with fewer CPUs they are folded onto the CPUs it has.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

BIN_NS = 500_000_000
COLLECTOR_CPUS = frozenset({12, 13, 14, 15})
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_NAME = 15
# The CPUs this process could use when it started (before any pinning), for folding CPU numbers.
_START_CPUS = sorted(os.sched_getaffinity(0))


def set_thread_name(name: str) -> None:
    """Name the calling thread (the process's name too when called on its main thread)."""
    _LIBC.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def comm_of(pid: int, tid: int | None = None) -> str | None:
    path = f"/proc/{pid}/task/{tid}/comm" if tid else f"/proc/{pid}/comm"
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def tids_of(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def map_cpus(cpus: list[int]) -> list[int]:
    """The GPU host's CPU numbers, folded onto this machine's CPUs where it has fewer."""
    if all(c in _START_CPUS for c in cpus):
        return list(cpus)
    return sorted({_START_CPUS[c % len(_START_CPUS)] for c in cpus})


def pin(cpus: list[int], pid: int = 0) -> list[int]:
    mapped = map_cpus(cpus)
    os.sched_setaffinity(pid, mapped)
    return mapped


def now() -> int:
    return time.time_ns()


class Scenario:
    """One staged cause: parses the arguments, pins the job, times the phases, records steps, writes the truth."""

    def __init__(self, name: str, cause: str, description: str, job_cpus: list[int], *,
                 culprit_cpus: list[int] | None = None, baseline_s: float = 8.0, window_s: float = 10.0,
                 recovery_s: float = 3.0, control: bool = False) -> None:
        parser = argparse.ArgumentParser(description=description)
        parser.add_argument("--truth", type=Path, required=True, help="where to write the ground truth (JSON)")
        parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
        parser.add_argument("--scale", type=float, default=1.0, help="multiply every phase's length (smoke: 0.15)")
        self.args = parser.parse_args()
        assert not (set(job_cpus) & COLLECTOR_CPUS), "the collector owns CPUs 12-15"
        self.name, self.cause, self.description, self.control = name, cause, description, control
        self.device = self.args.device
        self.cuda = self.device == "cuda"
        self.scale = self.args.scale
        self.smoke = self.scale < 0.5 or not self.cuda
        if not self.cuda:  # CPU smoke on a small machine: one intra-op thread, so the phases compare like for like
            os.environ.setdefault("OMP_NUM_THREADS", "1")
        self.baseline_s, self.window_s, self.recovery_s = (x * self.scale for x in (baseline_s, window_s, recovery_s))
        self.host_cpus = {"job": list(job_cpus), "culprits": list(culprit_cpus or [])}
        self.job_cpus = pin(job_cpus)
        self.culprit_cpus = map_cpus(culprit_cpus) if culprit_cpus else []
        self.steps: list[int] = []
        self.marks: dict[str, int] = {}
        self.culprits: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.extra: dict[str, Any] = {}
        self.feeder = {"pid": os.getpid(), "tid": threading.get_native_id(), "comm": comm_of(os.getpid())}
        self.t_start = now()
        atexit.register(_exit_without_teardown)  # registered before torch's: runs after their handlers
        print(f"[{name}] pid {os.getpid()} on CPUs {self.job_cpus} device {self.device} scale {self.scale}", flush=True)

    # ---- time ----------------------------------------------------------------------------
    def mark(self, what: str) -> int:
        self.marks[what] = now()
        print(f"[{self.name}] {what} at +{(self.marks[what] - self.t_start) / 1e9:.2f} s, {len(self.steps)} steps",
              flush=True)
        return self.marks[what]

    def step(self, n: int = 1) -> None:
        t = now()
        self.steps.extend([t] * n)

    def run_for(self, seconds: float, step_fn: Callable[[], Any], until: Callable[[], bool] | None = None) -> int:
        """Call step_fn back to back for `seconds` (or until `until()`), recording a step each time."""
        n = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (until and until()):
            step_fn()
            self.step()
            n += 1
        return n

    # ---- who -----------------------------------------------------------------------------
    def add_culprit(self, pid: int, tids: list[int] | None = None, comm: str | None = None, **more: Any) -> None:
        self.culprits.append({"pid": pid, "tids": tids if tids is not None else tids_of(pid),
                              "comm": comm or comm_of(pid), **more})

    def note(self, text: str) -> None:
        self.notes.append(text)

    # ---- truth ---------------------------------------------------------------------------
    def _rate(self, span: tuple[int, int] | None) -> float | None:
        if not span:
            return None
        n = sum(1 for t in self.steps if span[0] <= t < span[1])
        return n / ((span[1] - span[0]) / 1e9) if span[1] > span[0] else None

    def write_truth(self, *, baseline: tuple[int, int], window: tuple[int, int] | None,
                    ratio_spans: tuple[tuple[int, int], tuple[int, int]] | None = None) -> dict[str, Any]:
        """Write the ground truth. ratio_spans (controls): the two spans whose rates make throughput_ratio."""
        t0 = min(self.marks.values()) if self.marks else self.t_start
        end = max(max(self.marks.values(), default=t0), max(self.steps, default=t0)) + 1
        counts = [0] * ((end - t0 + BIN_NS - 1) // BIN_NS)
        for t in self.steps:
            if t >= t0:
                counts[(t - t0) // BIN_NS] += 1
        # the name it has now (torch may rename it)
        self.feeder["comm"] = comm_of(self.feeder["pid"], self.feeder["tid"])
        a, b = ratio_spans if ratio_spans else (baseline, window)
        ra, rb = self._rate(a), self._rate(b)
        try:
            import torch

            torch_version = torch.__version__
            gpu = torch.cuda.get_device_name(0) if self.cuda and torch.cuda.is_available() else None
        except ImportError:
            torch_version, gpu = None, None
        truth = {
            "scenario": self.name, "cause": self.cause, "description": self.description,
            "feeder": self.feeder, "culprits": self.culprits,
            "window_ns": list(window) if window else None, "baseline_ns": list(baseline),
            "cpus": self.host_cpus, "cpus_used_here": {"job": self.job_cpus, "culprits": self.culprit_cpus},
            "steps": {"bin_ns": BIN_NS, "t0_ns": t0, "counts": counts, "total": len(self.steps)},
            "throughput_ratio": round(ra / rb, 3) if ra and rb else None,
            "steps_per_s": {"baseline": ra, "window": rb},
            "marks_ns": self.marks, "device": self.device, "gpu": gpu, "scale": self.scale,
            "torch": torch_version, "python": sys.version.split()[0], "host": os.uname().nodename,
            "notes": " ".join(self.notes), **self.extra,
        }
        self.args.truth.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.args.truth.with_name(self.args.truth.name + ".tmp")
        tmp.write_text(json.dumps(truth, indent=1) + "\n")
        os.replace(tmp, self.args.truth)
        ratio = truth["throughput_ratio"]
        print(f"[{self.name}] truth -> {self.args.truth}: {len(self.steps)} steps, baseline/window ratio {ratio}, "
              f"culprits {[(c['comm'], c['pid']) for c in self.culprits]}", flush=True)
        return truth

    def standard_phases(self, step_fn: Callable[[], Any], start_cause: Callable[[], Any],
                        stop_cause: Callable[[], Any], window_step: Callable[[], Any] | None = None,
                        before_truth: Callable[[], Any] | None = None) -> dict:
        """baseline -> cause (start_cause, window_step for window_s, stop_cause) -> recovery -> truth.
        before_truth: called after the recovery, before the truth is written (to add what it measured)."""
        b0 = self.mark("baseline")
        self.run_for(self.baseline_s, step_fn)
        w0 = self.mark("window")
        try:
            start_cause()
            self.run_for(self.window_s - (now() - w0) / 1e9, window_step or step_fn)
        finally:
            stop_cause()
        w1 = self.mark("recovery")
        self.run_for(self.recovery_s, step_fn)
        self.mark("end")
        if before_truth:
            before_truth()
        return self.write_truth(baseline=(b0, w0), window=(w0, w1))


def _exit_without_teardown() -> None:
    """The last atexit handler: leave without the interpreter's teardown of torch and CUDA (2-5 s of the
    device call per scenario, after the last phase). The script's own cleanup (finally blocks, children
    stopped) and the atexit handlers registered after this one (multiprocessing's, torch's) have run;
    an uncaught exception still exits 1 (a SystemExit's own status is not kept: scenarios fail by raising)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(1 if getattr(sys, "last_value", None) is not None else 0)


# ---- child processes ---------------------------------------------------------------------

def spawn_python(code: str, name: str, cpus: list[int], *, site: bool = False, stdin: bool = False,
                 stdout: bool = False) -> subprocess.Popen:
    """A python3 child pinned to `cpus` (already mapped) and named `name` before it runs `code`."""
    boot = (f"import os, ctypes\nos.sched_setaffinity(0, {list(cpus)!r})\n"
            f"ctypes.CDLL(None).prctl(15, ctypes.c_char_p({name.encode()[:15]!r}), 0, 0, 0)\n")
    argv = [sys.executable] + ([] if site else ["-S"]) + ["-c", boot + code]
    return subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else None,
                            stdout=subprocess.PIPE if stdout else None, text=True)


BUSY_LOOP = ("import time\nend = time.monotonic() + {seconds}\nx = 0\nwhile time.monotonic() < end:\n"
             "    for i in range(10000):\n        x += i\n")


def stop(procs: list[subprocess.Popen], timeout: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# ---- the training loop -------------------------------------------------------------------

class Trainer:
    """A small MLP trained from batches already on the device: forward, backward, fused AdamW step,
    loss.item() each step (the host waits for the GPU once a step). On the H200, fp32 without TF32,
    width 2048 and batch 8192 make a step of roughly 5-10 ms with ~60 CUDA calls."""

    def __init__(self, sc: Scenario, *, width: int = 2048, batch: int = 8192, in_dim: int = 512, nbatches: int = 8,
                 depth: int = 2) -> None:
        """depth: the hidden width x width layers (2: the zoo's usual MLP). With --device cpu the MLP is
        shrunk to width 64, batch 256 unless it is smaller already."""
        import torch

        self.torch = torch
        if not sc.cuda:
            width, batch = min(width, 64), min(batch, 256)
        self.batch, self.in_dim = batch, in_dim
        self.dev = torch.device(sc.device)
        if sc.cuda:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        torch.manual_seed(0)
        nn = torch.nn
        layers = [nn.Linear(in_dim, width), nn.ReLU()]  # created in this order: the seeded weights stay the same
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        layers.append(nn.Linear(width, 10))
        self.model = nn.Sequential(*layers).to(self.dev)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=sc.cuda or None)
        self.loss_fn = nn.CrossEntropyLoss()
        self.xs = torch.randn(nbatches, batch, in_dim, device=self.dev)
        self.ys = torch.randint(0, 10, (nbatches, batch), device=self.dev)
        self.i = 0

    def step(self, x: Any = None, y: Any = None) -> float:
        if x is None:
            x, y = self.xs[self.i % len(self.xs)], self.ys[self.i % len(self.ys)]
        elif x.device != self.dev:
            x, y = x.to(self.dev, non_blocking=True), y.to(self.dev, non_blocking=True)
        self.i += 1
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.item()

    def warmup(self, n: int = 20) -> None:
        for _ in range(n):
            self.step()
        self.sync()

    def sync(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize()


def gpu_seconds_queued(torch: Any, work: Callable[[Any], Any], prepare: Callable[[], Any] | None = None,
                       cycles: int = 50_000_000, tries: int = 3) -> float | None:
    """The GPU's own time for the kernels `work(prepare())` queues (it must not synchronise): measured with them held
    behind a spin kernel (`torch.cuda._sleep`) until the host has queued them all, so that no kernel waits for the host.
    That is the GPU's busy time for that work, without the gaps a host-bound loop leaves between its kernels (an event
    pair around a host-bound loop measures the host). `prepare` runs first, untimed and synchronised (a forward pass
    whose backward is the work). None where the spin ended before the host had queued everything, `tries` times with
    a spin 4x longer each time (or the launch queue filled and blocked the host)."""
    for _ in range(tries):
        arg = prepare() if prepare else None
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        start.record()
        work(arg)
        end.record()
        ahead = not start.query()  # the spin was still running when the last kernel had been queued
        torch.cuda.synchronize()
        if ahead:
            return start.elapsed_time(end) / 1e3
        cycles *= 4
    return None

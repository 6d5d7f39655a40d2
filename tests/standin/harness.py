"""Helpers shared by the collector tests and bench: build the stand-in CUDA libraries, start
workloads and the collector, and say what a `mix` workload must have produced.

The stand-ins (tests/standin/) export the real libcudart.so.13 / libcuda.so.1 symbol names and
signatures and are installed in a pip-like site-packages/nvidia/cu13/lib/, as PyTorch's wheels do.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"


@dataclass
class StandIn:
    """Built stand-ins: the two libraries and the workload binary."""

    root: Path
    lib_dir: Path
    workload: Path

    @property
    def cudart(self) -> Path:
        """The stand-in libcudart.so.13."""
        return self.lib_dir / "libcudart.so.13"

    @property
    def cuda(self) -> Path:
        """The stand-in libcuda.so.1."""
        return self.lib_dir / "libcuda.so.1"

    @property
    def stacks(self) -> Path:
        """The stand-in training loop built with frame pointers (stacks.c): functions with known names."""
        return self.root / "stacks"

    @property
    def runtime_only(self) -> Path:
        """A stand-in libcudart.so.13 with no libcuda beneath it: it neither links nor calls one."""
        return self.root / "runtime-only" / "libcudart.so.13"


def build_standin(out: Path) -> StandIn:
    """Compile the stand-ins with gcc into `out`."""
    subprocess.run(["sh", str(STANDIN / "build.sh"), str(out)], check=True, capture_output=True, text=True)
    return StandIn(out, out / "site-packages" / "nvidia" / "cu13" / "lib", out / "workload")


def require_ebpf() -> None:
    """Skip when not root outside CI; fail with what to install when the machine cannot run eBPF."""
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("collector tests load eBPF: run as root (they fail instead of skipping when CI is set)")
    from ingero_mcp.collector.preflight import blocking_failures, run_checks

    failures = blocking_failures(run_checks(include_optional=False))
    if failures:
        pytest.fail("the collector cannot run here: " + "; ".join(f"{c.name}: {c.detail} -> {c.fix}" for c in failures))


class Workload:
    """A stand-in workload process that waits for `go()` before calling anything."""

    def __init__(self, standin: StandIn, *args: str, cpu: int | None = None, fifo: bool = False,
                 env: dict[str, str] | None = None, binary: Path | None = None) -> None:
        env = {**os.environ, **(env or {}), "WL_WAIT": "1"}
        if cpu is not None:
            env["WL_CPU"] = str(cpu)
        if fifo:
            env["WL_FIFO"] = "1"
        self.proc = subprocess.Popen([str(binary or standin.workload), *args], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        assert line.startswith("ready"), \
            f"workload did not start: {line!r} {self.proc.stderr.read() if self.proc.stderr else ''}"
        self.pid = self.proc.pid
        self.out = ""

    def go(self) -> None:
        """Let it run."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait(self, timeout: float = 120) -> tuple[int, str]:
        """Exit status and stdout."""
        out, _err = self.proc.communicate(timeout=timeout)
        self.out = out  # what it printed, kept for the test after record() has waited
        return self.proc.returncode, out

    def kill(self) -> None:
        """Stop it if still running."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Hog:
    """A CPU burner pinned to one CPU (comm 'standin-hog'), not traced."""

    def __init__(self, standin: StandIn, cpu: int) -> None:
        self.proc = subprocess.Popen([str(standin.workload), "hog"], env={**os.environ, "WL_CPU": str(cpu)})
        self.pid = self.proc.pid

    def stop(self) -> None:
        """Kill it."""
        self.proc.kill()
        self.proc.wait()


class Collector:
    """`ingero-mcp trace` as a subprocess, its stderr read line by line in a thread."""

    # Every symbol of both libraries with entry + return probes and no governor: what the tests written
    # before the always-on defaults check (a runtime call and its nested driver call, launch durations).
    LEGACY = ("--api", "both", "--launch-probes", "full", "--max-overhead", "off")

    def __init__(self, db: Path, *extra: str, defaults: bool = False, quiet: bool = True) -> None:
        """`defaults`: the collector's own defaults (one layer, entry-only launches, the governor); `quiet`: no
        live view (without it, the live view's last frame is printed to stderr at the stop)."""
        mode = () if defaults else self.LEGACY
        cmd = [sys.executable, "-m", "ingero_mcp.cli", "trace", "--db", str(db), *(["--quiet"] if quiet else []),
               *mode, *extra]
        # The legacy mode's tests attach uprobes as perf events (the path for kernels before 6.6), the defaults'
        # as uprobe_multi links (collector/uprobelink.py): both paths run for real.
        env = {**os.environ, "INGERO_UPROBE_LINKS": "1" if defaults else "0"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                     env=env)
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            self._q.put(line)
        self._q.put(None)

    def wait_for(self, text: str, timeout: float = 60) -> str:
        """Block until a stderr line contains `text`."""
        for line in self.lines:
            if text in line:
                return line
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            if text in line:
                return line
        raise AssertionError(f"collector never said {text!r}; stderr:\n{''.join(self.lines)}")

    def wait(self, timeout: float = 60) -> int:
        """Exit status."""
        rc = self.proc.wait(timeout=timeout)
        self._t.join(timeout=5)
        return rc

    def output(self) -> str:
        """Everything it wrote to stderr so far."""
        return "".join(self.lines)

    def kill(self) -> None:
        """Stop it if still running."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def record(db: Path, workloads: list[Workload], *extra: str, defaults: bool = False, timeout: float = 60,
           quiet: bool = True) -> Collector:
    """`ingero-mcp trace --pid` of each workload, all let go at once and run to their end; the collector
    stops when they have exited. Returns it (its output says what it did)."""
    collector = Collector(db, *[a for w in workloads for a in ("--pid", str(w.pid))], *extra, defaults=defaults,
                          quiet=quiet)
    try:
        collector.wait_for("recording to", timeout=120)
        for w in workloads:
            w.go()
        for w in workloads:
            assert w.wait()[0] == 0
        assert collector.wait(timeout=timeout) == 0, collector.output()
    finally:
        for w in workloads:
            w.kill()
        collector.kill()
    return collector


def mix_expected(n: int, children: int) -> tuple[Counter[str], Counter[str], dict[tuple[str, str | None], int]]:
    """What `workload mix n ... children` calls: (calls per op by the parent, per child, bytes per (op, kind))."""
    kinds = ["H2H", "H2D", "D2H", "D2D", "default"]
    parent: Counter[str] = Counter()
    nbytes: Counter[tuple[str, str | None]] = Counter()
    for op in ("cudaLaunchKernel", "cudaMemcpy", "cudaMemcpyAsync", "cudaMalloc", "cudaFree", "cudaStreamSynchronize",
               "cuLaunchKernel", "cuLaunchKernelEx", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2",
               "cuMemcpyDtoDAsync_v2", "cuMemcpyAsync", "cuMemAlloc_v2", "cuMemFree_v2", "cuStreamSynchronize",
               "cuCtxSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"):
        parent[op] = n
    parent["cudaHostAlloc"] = len(range(0, n, 10))
    parent["cudaFreeHost"] = parent["cudaHostAlloc"]
    if n > 0:
        parent["cudaLaunchKernel"] += 10  # from the workload's second thread (stream 0x6000)
    nested = {1: "cuMemcpyHtoD_v2", 2: "cuMemcpyDtoH_v2", 3: "cuMemcpyDtoD_v2", 4: "cuMemcpy"}
    for i in range(n):
        k = i % 5
        nbytes[("cudaMemcpy", kinds[k])] += 1000 + i
        if k in nested:
            parent[nested[k]] += 1
            nbytes[(nested[k], kinds[k])] += 1000 + i
        nbytes[("cudaMemcpyAsync", "H2D")] += 2000 + i
        parent["cuMemcpyHtoD_v2"] += 1  # nested in cudaMemcpyAsync(H2D)
        nbytes[("cuMemcpyHtoD_v2", "H2D")] += 2000 + i
        nbytes[("cuMemcpyHtoDAsync_v2", "H2D")] += 5000 + i
        nbytes[("cuMemcpyDtoHAsync_v2", "D2H")] += 6000 + i
        nbytes[("cuMemcpyDtoDAsync_v2", "D2D")] += 7000 + i
        nbytes[("cuMemcpyAsync", "default")] += 8000 + i
        nbytes[("cudaMalloc", None)] += 4096 * (i + 1)
        nbytes[("cudaFree", None)] += 4096 * (i + 1)
        nbytes[("cuMemAlloc_v2", None)] += 8192 * (i + 1)
        nbytes[("cuMemFree_v2", None)] += 8192 * (i + 1)
    child: Counter[str] = Counter({"cudaMalloc": 3, "cudaFree": 3}) if children else Counter()
    return parent, child, dict(nbytes)

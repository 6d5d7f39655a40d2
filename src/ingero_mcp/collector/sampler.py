"""System snapshots once a second (/proc, and NVML when a GPU is present) and the host description.

NVML comes from nvidia-ml-py (optional extra `gpu`); without it, or without a GPU, the GPU columns
stay NULL rather than guessed.
"""

from __future__ import annotations

import os
import platform
import socket
import time
from pathlib import Path
from typing import Any


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out


def _cpu_times() -> tuple[int, int, int]:
    """(busy, total, procs_running) jiffies from /proc/stat."""
    busy = total = running = 0
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu "):
            vals = [int(v) for v in line.split()[1:]]
            idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
            total = sum(vals[:8])
            busy = total - idle
        elif line.startswith("procs_running"):
            running = int(line.split()[1])
    return busy, total, running


def gpu_process_rows(ts_ns: int, per_gpu: list[tuple[int, list[Any], list[Any]]]) -> dict[str, list[Any]]:
    """gpu_processes rows from what NVML said about each GPU at one moment.

    `per_gpu`: (gpu index, nvmlDeviceGetComputeRunningProcesses() entries (.pid, .usedGpuMemory: bytes,
    None when the driver does not say), nvmlDeviceGetProcessUtilization() samples (.pid, .smUtil %)).
    One row per (GPU, pid) seen in either list; sm_util_percent is the mean of that pid's samples
    since the previous query (NULL without one), used_memory_bytes NULL where not reported.
    """
    rows: dict[str, list[Any]] = {k: [] for k in ("ts_ns", "gpu_id", "pid", "used_memory_bytes", "sm_util_percent")}
    for gpu, procs, samples in per_gpu:
        util: dict[int, list[float]] = {}
        for sample in samples:
            util.setdefault(int(sample.pid), []).append(float(sample.smUtil))
        memory: dict[int, int | None] = {}
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            memory[int(proc.pid)] = int(used) if isinstance(used, int) and 0 <= used < 1 << 62 else None
        for pid in sorted(set(memory) | set(util)):
            rows["ts_ns"].append(ts_ns)
            rows["gpu_id"].append(gpu)
            rows["pid"].append(pid)
            rows["used_memory_bytes"].append(memory.get(pid))
            got = util.get(pid)
            rows["sm_util_percent"].append(sum(got) / len(got) if got else None)
    return rows


class Nvml:
    """GPU utilisation and memory through NVML, if nvidia-ml-py and a GPU are there."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.models: list[str] = []
        self.driver: str | None = None
        self.error: str | None = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._nvml = pynvml
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                self.handles.append(h)
                name = pynvml.nvmlDeviceGetName(h)
                self.models.append(name.decode() if isinstance(name, bytes) else str(name))
            drv = pynvml.nvmlSystemGetDriverVersion()
            self.driver = drv.decode() if isinstance(drv, bytes) else str(drv)
            self._util_since = [0] * len(self.handles)  # NVML timestamps (us) of the last samples read
        except Exception as exc:  # noqa: BLE001 - NVML is optional: no module, no driver, no GPU
            self.error = f"{type(exc).__name__}: {exc}"
            self.handles = []

    def sample(self) -> tuple[float | None, int | None, int | None]:
        """(mean utilisation %, memory used, memory total) over all GPUs, or Nones."""
        if not self.handles:
            return None, None, None
        try:
            utils = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self.handles]
            mems = [self._nvml.nvmlDeviceGetMemoryInfo(h) for h in self.handles]
        except Exception:  # noqa: BLE001 - a GPU fell off the bus: report nothing rather than fail
            return None, None, None
        return sum(utils) / len(utils), sum(m.used for m in mems), sum(m.total for m in mems)

    def processes(self, ts_ns: int) -> dict[str, list[Any]]:
        """gpu_processes rows now: every compute process on every GPU (traced or not), with its memory
        and its SM utilisation samples where the driver keeps them. Empty without NVML or a GPU."""
        per_gpu: list[tuple[int, list[Any], list[Any]]] = []
        for i, h in enumerate(self.handles):
            try:
                procs = list(self._nvml.nvmlDeviceGetComputeRunningProcesses(h))
            except Exception:  # noqa: BLE001 - not supported / GPU lost: nothing for this GPU
                continue
            samples: list[Any] = []
            try:
                samples = list(self._nvml.nvmlDeviceGetProcessUtilization(h, self._util_since[i]))
                if samples:
                    self._util_since[i] = max(int(x.timeStamp) for x in samples)
            except Exception:  # noqa: BLE001 - NVML_ERROR_NOT_FOUND: no sample since then; or unsupported
                pass
            per_gpu.append((i, procs, samples))
        return gpu_process_rows(ts_ns, per_gpu)


class SystemSampler:
    """One snapshot row per call: CPU % since the previous call, memory, swap, load, GPU."""

    def __init__(self, nvml: Nvml | None = None) -> None:
        self.nvml = nvml
        self._prev = _cpu_times()
        self.cpu_count = os.cpu_count() or 0
        self.samples = 0

    def sample(self) -> dict[str, Any]:
        """The host now."""
        busy, total, running = _cpu_times()
        pbusy, ptotal, _ = self._prev
        self._prev = (busy, total, running)
        cpu = 100.0 * (busy - pbusy) / (total - ptotal) if total > ptotal else None
        mem = _meminfo()
        mem_total = mem.get("MemTotal", 0)
        avail = mem.get("MemAvailable", 0)
        load1 = float(Path("/proc/loadavg").read_text().split()[0])
        gpu_util, gpu_used, gpu_total = self.nvml.sample() if self.nvml else (None, None, None)
        self.samples += 1
        return {
            "ts_ns": time.time_ns(),
            "cpu_percent": cpu,
            "cpu_count": self.cpu_count,
            "procs_running": running,
            "load1": load1,
            "mem_total_bytes": mem_total,
            "mem_available_bytes": avail,
            "mem_used_percent": 100.0 * (mem_total - avail) / mem_total if mem_total else None,
            "swap_used_bytes": mem.get("SwapTotal", 0) - mem.get("SwapFree", 0),
            "gpu_util_percent": gpu_util,
            "gpu_mem_used_bytes": gpu_used,
            "gpu_mem_total_bytes": gpu_total,
        }


def host_info(nvml: Nvml | None) -> dict[str, Any]:
    """The sessions row's description of the machine."""
    os_release = None
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_release = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    cpu_model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu_driver = nvml.driver if nvml and nvml.driver else None
    if gpu_driver is None and Path("/proc/driver/nvidia/version").exists():
        gpu_driver = Path("/proc/driver/nvidia/version").read_text().splitlines()[0].strip()
    return {
        "host": socket.gethostname(),
        "kernel": f"{platform.release()} {platform.version()}",
        "os_release": os_release,
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "memory_bytes": _meminfo().get("MemTotal"),
        "gpu_model": ", ".join(nvml.models) if nvml and nvml.models else None,
        "gpu_driver": gpu_driver,
        "python_version": platform.python_version(),
    }

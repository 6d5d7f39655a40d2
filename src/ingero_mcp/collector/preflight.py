"""Can this machine run the collector? The checks `ingero-mcp check` prints and `trace` requires.

Each check says PASS/FAIL (or WARN/INFO for things that are not required) and, when it fails,
what to install or run. Nothing here needs BCC to be importable, so `check` works everywhere.
"""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ingero_mcp.collector.discovery import auto_layer, scan_cuda_libraries

TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
REQUIRED_TRACEPOINTS = ("sched/sched_switch", "sched/sched_waking", "sched/sched_wakeup_new", "kmem/mm_page_alloc",
                        "sched/sched_process_exec", "sched/sched_process_exit", "task/task_newtask",
                        "task/task_rename", "irq/irq_handler_entry", "irq/irq_handler_exit", "irq/softirq_entry",
                        "irq/softirq_exit")


@dataclass
class Check:
    """One line of the report: what was checked, the result, and what to do if it is not PASS."""

    name: str
    status: str  # PASS, FAIL, WARN, INFO
    detail: str
    fix: str = ""
    required: bool = True
    data: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return asdict(self)


def tracefs_dir() -> Path | None:
    """The mounted tracefs events root, or None."""
    for d in TRACEFS_DIRS:
        if Path(d, "events", "sched", "sched_switch", "format").is_file():
            return Path(d)
    return None


def check_kernel() -> Check:
    """Kernel release: ring buffers need >= 5.8."""
    rel = platform.release()
    try:
        major, minor = (int(x) for x in rel.split(".")[:2])
    except ValueError:
        return Check("kernel", "WARN", f"cannot parse kernel release {rel!r}", required=False)
    ok = (major, minor) >= (5, 8)
    return Check("kernel", "PASS" if ok else "FAIL", f"Linux {rel}",
                 "" if ok else "BPF ring buffers need Linux >= 5.8: run on a newer kernel")


def check_root() -> Check:
    """Root (or CAP_BPF + CAP_PERFMON) is needed to load programs and attach probes."""
    if os.geteuid() == 0:
        return Check("privileges", "PASS", "running as root")
    return Check("privileges", "FAIL", f"running as uid {os.geteuid()}",
                 "run the collector as root: `sudo ingero-mcp trace ...` (keep the venv: "
                 "`sudo $(which ingero-mcp) trace ...`)")


def check_btf() -> Check:
    """Kernel BTF (/sys/kernel/btf/vmlinux): not needed by BCC with headers, reported for completeness."""
    ok = Path("/sys/kernel/btf/vmlinux").is_file()
    return Check("btf", "PASS" if ok else "WARN", "/sys/kernel/btf/vmlinux " + ("present" if ok else "missing"),
                 "" if ok else "not required (BCC compiles against kernel headers)", required=False)


def check_tracefs() -> Check:
    """tracefs mounted, with the tracepoints the collector attaches."""
    root = tracefs_dir()
    if root is None:
        return Check("tracefs", "FAIL", "tracefs is not mounted",
                     "mount it: `mount -t tracefs nodev /sys/kernel/tracing`")
    missing = [tp for tp in REQUIRED_TRACEPOINTS if not (root / "events" / tp / "format").is_file()]
    if missing:
        return Check("tracefs", "FAIL", f"{root}: missing tracepoints {', '.join(missing)}",
                     "the kernel lacks these tracepoints; a distribution kernel >= 5.8 has them")
    extra = [tp for tp in ("oom/mark_victim", "syscalls/sys_enter_exit_group")
             if not (root / "events" / tp / "format").is_file()]
    note = f" (optional missing: {', '.join(extra)})" if extra else ""
    return Check("tracefs", "PASS", f"{root}, tracepoints present{note}")


def check_bpf_permission() -> Check:
    """Whether this process may create BPF maps (the bpf() syscall, map create)."""
    libc = ctypes.CDLL(None, use_errno=True)
    # union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size, max_entries
    attr = (ctypes.c_uint32 * 32)(2, 4, 8, 1)  # BPF_MAP_TYPE_ARRAY
    sys_bpf = 321 if platform.machine() == "x86_64" else 280
    fd = libc.syscall(sys_bpf, 0, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd >= 0:
        os.close(fd)
        return Check("bpf", "PASS", "bpf() map creation allowed")
    err = ctypes.get_errno()
    unpriv = Path("/proc/sys/kernel/unprivileged_bpf_disabled")
    hint = f" (kernel.unprivileged_bpf_disabled={unpriv.read_text().strip()})" if unpriv.exists() else ""
    return Check("bpf", "FAIL", f"bpf() refused: {os.strerror(err)}{hint}",
                 "run as root; in a container add --privileged (or CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN)")


def check_bcc() -> Check:
    """BCC's Python bindings (system package), found even from a virtual environment."""
    from ingero_mcp.collector.bccload import BccMissing, import_bcc

    try:
        bcc = import_bcc()
    except BccMissing as exc:
        return Check("bcc", "FAIL", "BCC Python bindings not importable", str(exc))
    version = getattr(bcc, "__version__", "?")
    return Check("bcc", "PASS", f"bcc {version} from {Path(bcc.__file__).parent}")


def check_headers() -> Check:
    """Kernel headers where BCC looks for them (/lib/modules/$(uname -r)/build)."""
    build = Path("/lib/modules", platform.release(), "build")
    if (build / "include").is_dir() or (build / "Makefile").is_file():
        detail = f"{build} -> {build.resolve()}"
        uts = build / "include" / "generated" / "utsrelease.h"
        if uts.is_file():
            headers = uts.read_text().split('"')[1] if '"' in uts.read_text() else "?"
            if headers.split(".")[:2] != platform.release().split(".")[:2]:
                detail += (f" (headers {headers} for kernel {platform.release()}: fine for this collector, which "
                           "reads tracepoint fields as tracefs describes them and no kernel structs)")
        return Check("kernel_headers", "PASS", detail)
    if Path("/sys/kernel/kheaders.tar.xz").exists():
        return Check("kernel_headers", "PASS", "kernel provides /sys/kernel/kheaders.tar.xz")
    return Check("kernel_headers", "FAIL", f"no kernel headers at {build}",
                 "install them: Debian `apt-get install linux-headers-amd64` then link "
                 "/lib/modules/$(uname -r)/build to /usr/src/linux-headers-*-amd64 (see .ci/kernel-setup); "
                 "Ubuntu `apt-get install linux-headers-$(uname -r)`; or `modprobe kheaders`")


def check_nvidia() -> Check:
    """NVIDIA driver and GPUs (optional: the collector runs without them, e.g. on stand-ins)."""
    version_file = Path("/proc/driver/nvidia/version")
    if not version_file.exists():
        return Check("nvidia", "INFO", "no NVIDIA driver loaded (no GPU, or driver not installed)",
                     "only needed to trace real CUDA work", required=False)
    first = version_file.read_text().splitlines()[0] if version_file.read_text() else ""
    gpus: list[str] = []
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            gpus.append(name.decode() if isinstance(name, bytes) else str(name))
        pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - NVML is optional
        return Check("nvidia", "PASS", f"{first.strip()} (NVML unavailable: {exc})", required=False)
    return Check("nvidia", "PASS", f"{first.strip()}; GPUs: {', '.join(gpus) or 'none'}", required=False,
                 data={"gpus": gpus})


def check_cuda_libraries() -> Check:
    """libcudart / libcuda mapped by running processes, by which pids, and which layer `trace --api auto` probes for
    each (the driver's symbols, or the runtime's where no libcuda is beneath it)."""
    found = scan_cuda_libraries()
    if not found:
        return Check("cuda_libraries", "INFO", "no running process maps libcudart/libcuda now",
                     "start the CUDA job, or let `trace` pick it up when it starts (it rescans), "
                     "or force a library with --cuda-lib PATH", required=False)
    lines = [f"{lib.path} (pids {', '.join(map(str, sorted(lib.pids)[:8]))}{'...' if len(lib.pids) > 8 else ''})"
             for lib in found]
    per_pid: dict[int, list] = {}
    for lib in found:
        for pid in lib.pids:
            per_pid.setdefault(pid, []).append(lib)
    layers = {pid: auto_layer(pid, [lib for lib in libs if lib.api == "runtime"],
                              any(lib.api == "driver" for lib in libs)) for pid, libs in sorted(per_pid.items())}
    probed = "; ".join(f"pid {pid}: {layer} layer ({why})" for pid, (layer, why) in list(layers.items())[:16])
    return Check("cuda_libraries", "PASS", "; ".join(lines) + f". trace --api auto probes: {probed}", required=False,
                 data={"libraries": [{"path": lib.path, "pids": sorted(lib.pids)} for lib in found],
                       "layers": {str(pid): {"layer": layer, "why": why} for pid, (layer, why) in layers.items()}})


def check_uprobe_links() -> Check:
    """uprobe_multi BPF links (kernel >= 6.6): quicker detaches than perf events, tried for real (root only)."""
    if os.geteuid() != 0:
        return Check("uprobe_links", "INFO", "not tried (needs root)", required=False)
    from ingero_mcp.collector.uprobelink import supported

    ok, why = supported()
    return Check("uprobe_links", "PASS" if ok else "INFO", "uprobes attach as BPF links (uprobe_multi)" if ok else why,
                 "" if ok else "uprobes will be perf events: each detach ~0.1 s, one after another (kernel < 6.6)",
                 required=False)


def run_checks(*, include_optional: bool = True) -> list[Check]:
    """All checks, in the order a user fixes them."""
    checks = [check_kernel(), check_root(), check_bpf_permission(), check_tracefs(), check_headers(),
              check_bcc(), check_btf()]
    if include_optional:
        checks.append(check_uprobe_links())
        checks += [check_nvidia(), check_cuda_libraries()]
    return checks


def blocking_failures(checks: list[Check]) -> list[Check]:
    """The required checks that failed."""
    return [c for c in checks if c.required and c.status == "FAIL"]

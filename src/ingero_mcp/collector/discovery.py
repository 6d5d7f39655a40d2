"""Finds the CUDA libraries processes have mapped (/proc/PID/maps) and walks the process tree.

pip wheels put libcudart under site-packages/nvidia/*/lib/ and the driver lives wherever the
host put it, so the only reliable source is what each process really mapped. A library is keyed
by (device, inode): uprobes attach to a file, and the same file seen through two paths (symlinks,
another mount namespace via /proc/PID/root) must be probed once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from ingero_mcp.collector.ops import library_api


@dataclass
class CudaLibrary:
    """One CUDA library file in use: where to attach, which API it carries, who maps it."""

    path: str  # as the process sees it
    attach_path: str  # a path this process (the collector) can open
    api: str  # 'runtime' or 'driver'
    key: tuple[int, int]  # (st_dev, st_ino)
    pids: set[int] = field(default_factory=set)


def all_pids() -> list[int]:
    """Every process id in /proc."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _mapped_paths(pid: int) -> set[str]:
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:
            data = fh.read()
    except OSError:
        return set()
    if b"libcud" not in data:
        return set()
    paths = set()
    for line in data.splitlines():
        if b"libcud" not in line:
            continue
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith(b"/"):
            paths.add(parts[5].decode("utf-8", "replace").removesuffix(" (deleted)"))
    return paths


def resolve_library(path: str, pid: int | None = None) -> CudaLibrary | None:
    """A CudaLibrary for `path` (as seen by `pid`, if given), or None if not a CUDA library / unreadable."""
    api = library_api(path)
    if api is None:
        return None
    candidates = [path]
    if pid is not None:
        candidates.append(f"/proc/{pid}/root{path}")
    for candidate in candidates:
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        attach = os.path.realpath(candidate) if not candidate.startswith("/proc/") else candidate
        return CudaLibrary(path=path, attach_path=attach, api=api, key=(st.st_dev, st.st_ino))
    return None


def scan_cuda_libraries(pids: Iterable[int] | None = None) -> list[CudaLibrary]:
    """CUDA libraries mapped by `pids` (default: every process), merged by file."""
    found: dict[tuple[int, int], CudaLibrary] = {}
    for pid in (all_pids() if pids is None else pids):
        for path in _mapped_paths(pid):
            lib = resolve_library(path, pid)
            if lib is None:
                continue
            lib = found.setdefault(lib.key, lib)
            lib.pids.add(pid)
    return sorted(found.values(), key=lambda lib: lib.path)


def read_stat(pid: int) -> tuple[str, int] | None:
    """(comm, ppid) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    lpar, rpar = data.find(b"("), data.rfind(b")")
    if lpar < 0 or rpar < 0:
        return None
    comm = data[lpar + 1 : rpar].decode("utf-8", "replace")
    fields = data[rpar + 2 :].split()
    return comm, int(fields[1])


def read_cmdline(pid: int) -> str | None:
    """The command line of a live process (NUL separators as spaces), or None."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace") or None


def descendants(roots: Iterable[int]) -> set[int]:
    """`roots` and every live process below them in the process tree."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        st = read_stat(pid)
        if st is not None:
            children.setdefault(st[1], []).append(pid)
    out: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in out:
            continue
        out.add(pid)
        stack.extend(children.get(pid, ()))
    return out


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    rpar = data.rfind(b")")
    return data[rpar + 2 : rpar + 3] not in (b"Z", b"X")


def runtime_version(path: str) -> str | None:
    """The CUDA runtime version a libcudart file name or wheel directory states ('13', '12.4.127')."""
    base = path.rsplit("/", 1)[-1]
    if base.startswith("libcudart.so."):
        return base.removeprefix("libcudart.so.")
    for part in path.split("/"):
        if part.startswith("cu") and part[2:].isdigit():
            return part[2:]
    return None


# --- which layer --api auto probes for a process ----------------------------------------------------------------
# --api auto probes the driver's symbols (PyTorch's runtime calls enter them) and the runtime's two syncs. That is
# silence for a process whose runtime has no probed libcuda beneath it: a runtime that loads no libcuda (a stand-in,
# a shim), or a driver the collector cannot find or attach. Such a process gets the runtime's own symbols.

DRIVER_LAYER = "driver"
RUNTIME_LAYER = "runtime"
NO_CUDA_YET = "none yet"


def loads_driver(path: str) -> bool:
    """Whether a libcudart file names libcuda at all (a DT_NEEDED entry or the name it dlopens): the real runtime
    loads libcuda.so.1 at its first call; one that never names it has no driver beneath it. Read once per file."""
    try:
        st = os.stat(path)
    except OSError:  # unreadable: assume the usual runtime
        return True
    return _names_libcuda(path, st.st_dev, st.st_ino, st.st_mtime_ns)


@cache
def _names_libcuda(path: str, _dev: int, _ino: int, _mtime_ns: int) -> bool:
    import mmap

    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(b"libcuda.so") >= 0
    except (OSError, ValueError):  # unreadable, or empty: assume the usual runtime
        return True


def uses_gpu(pid: int) -> bool:
    """Whether the process has an NVIDIA device open (/dev/nvidia*, WSL's /dev/dxg): its driver is initialized."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(("/dev/nvidia", "/dev/dxg")):
                return True
        except OSError:
            continue
    return False


def auto_layer(pid: int, runtime: list[CudaLibrary], driver_probed: bool,
               probed: Callable[[CudaLibrary], bool] = lambda lib: True) -> tuple[str, str]:
    """(layer, why): what --api auto probes for a process that maps `runtime` libcudart files, and a probed libcuda
    when `driver_probed`. `probed` says whether a libcuda found only now would be probed (the collector's view)."""
    if driver_probed:
        return DRIVER_LAYER, "the driver's symbols, with the runtime's cudaDeviceSynchronize/cudaEventSynchronize"
    if not runtime:
        return NO_CUDA_YET, "no libcudart or probed libcuda mapped"
    if not any(loads_driver(lib.attach_path) for lib in runtime):
        return RUNTIME_LAYER, "its libcudart loads no libcuda"
    if uses_gpu(pid):
        # read after the device was seen open: the runtime maps libcuda before it opens the device, so a libcuda
        # loaded since the caller's scan shows here
        late = [lib for lib in scan_cuda_libraries([pid]) if lib.api == "driver"]
        if any(probed(lib) for lib in late):
            return DRIVER_LAYER, "its libcuda, loaded just now, is probed"
        return RUNTIME_LAYER, "it has the GPU open but maps no libcuda the collector probes"
    return NO_CUDA_YET, ("libcuda not loaded yet (the runtime loads it at its first call): the runtime's syncs "
                         "until then")

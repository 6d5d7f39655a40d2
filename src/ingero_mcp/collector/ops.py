"""The CUDA runtime and driver symbols the collector probes, and how each one's arguments are read.

One table drives both sides: the loader generates a tiny eBPF entry function per symbol (calling
the argument "shape" helper in collectors/ingero.bpf.c with the op id), and the decoder maps op ids
back to names. Optional symbols (per-thread-stream `_ptsz`/`_ptds` variants) are attached when a
library exports them and are not reported as missing when it does not.
"""

from __future__ import annotations

from dataclasses import dataclass

# cudaMemcpyKind + 1, as the eBPF side stores it (0: not a copy).
MEMCPY_KINDS: tuple[str | None, ...] = (None, "H2H", "H2D", "D2H", "D2D", "default")
_H2D, _D2H, _D2D, _DEFAULT = 2, 3, 4, 5


@dataclass(frozen=True)
class Op:
    """One probed symbol: its name, which library exports it, and how its arguments are read."""

    name: str
    api: str  # 'runtime' (libcudart) or 'driver' (libcuda)
    shape: str  # SHAPE_* helper in ingero.bpf.c
    kind: int = 0  # fixed memcpy kind for driver copies
    optional: bool = False

    @property
    def fn_name(self) -> str:
        """The generated eBPF entry function's name."""
        return f"e_{self.name}"

    @property
    def launch(self) -> bool:
        """A kernel or graph launch: asynchronous and frequent, probed entry-only by default."""
        return self.shape in _LAUNCH_SHAPES

    @property
    def entry_only_fn_name(self) -> str:
        """The generated entry-only variant (launches only): records the call at entry, no return probe."""
        return f"o_{self.name}"


def _rt(name: str, shape: str, optional: bool = False) -> Op:
    return Op(name, "runtime", shape, optional=optional)


def _drv(name: str, shape: str, kind: int = 0, optional: bool = False) -> Op:
    return Op(name, "driver", shape, kind, optional)


OPS: tuple[Op, ...] = (
    # runtime API (libcudart)
    _rt("cudaLaunchKernel", "rt_launch"),
    _rt("cudaMemcpy", "rt_memcpy"),
    _rt("cudaMemcpyAsync", "rt_memcpy_async"),
    _rt("cudaMalloc", "malloc"),
    _rt("cudaFree", "free"),
    _rt("cudaHostAlloc", "hostalloc"),
    _rt("cudaStreamSynchronize", "stream1"),
    _rt("cudaDeviceSynchronize", "none"),
    _rt("cudaEventSynchronize", "none"),
    _rt("cudaLaunchKernel_ptsz", "rt_launch", optional=True),
    _rt("cudaMemcpy_ptds", "rt_memcpy", optional=True),
    _rt("cudaMemcpyAsync_ptsz", "rt_memcpy_async", optional=True),
    _rt("cudaStreamSynchronize_ptsz", "stream1", optional=True),
    # launch/alloc paths newer code takes (attached when exported; not in the list)
    _rt("cudaLaunchKernelExC", "drv_launch_ex", optional=True),  # cudaLaunchConfig_t: stream at +32 too
    _rt("cudaGraphLaunch", "stream2", optional=True),
    _rt("cudaMallocAsync", "malloc", optional=True),
    _rt("cudaFreeAsync", "free", optional=True),
    # pinned host memory: where host_pinned of a copy comes from (optional: older runtimes, stand-ins)
    _rt("cudaMallocHost", "hostalloc", optional=True),
    _rt("cudaFreeHost", "hostptr1", optional=True),
    _rt("cudaHostRegister", "hostreg", optional=True),
    _rt("cudaHostUnregister", "hostptr1", optional=True),
    # driver API (libcuda): the versioned names are the ones current drivers export
    _drv("cuLaunchKernel", "drv_launch"),
    _drv("cuLaunchKernelEx", "drv_launch_ex"),
    _drv("cuMemcpyHtoD_v2", "drv_memcpy", _H2D),
    _drv("cuMemcpyDtoH_v2", "drv_memcpy", _D2H),
    _drv("cuMemcpyDtoD_v2", "drv_memcpy", _D2D),
    _drv("cuMemcpyHtoDAsync_v2", "drv_memcpy_async", _H2D),
    _drv("cuMemcpyDtoHAsync_v2", "drv_memcpy_async", _D2H),
    _drv("cuMemcpyDtoDAsync_v2", "drv_memcpy_async", _D2D),
    _drv("cuMemcpy", "drv_memcpy", _DEFAULT),
    _drv("cuMemcpyAsync", "drv_memcpy_async", _DEFAULT),
    _drv("cuMemAlloc_v2", "malloc"),
    _drv("cuMemFree_v2", "free"),
    _drv("cuMemHostAlloc", "hostalloc", optional=True),
    _drv("cuStreamSynchronize", "stream1"),
    _drv("cuCtxSynchronize", "none"),
    _drv("cuLaunchKernel_ptsz", "drv_launch", optional=True),
    _drv("cuLaunchKernelEx_ptsz", "drv_launch_ex", optional=True),
    _drv("cuMemcpyHtoD_v2_ptds", "drv_memcpy", _H2D, optional=True),
    _drv("cuMemcpyDtoH_v2_ptds", "drv_memcpy", _D2H, optional=True),
    _drv("cuMemcpyDtoD_v2_ptds", "drv_memcpy", _D2D, optional=True),
    _drv("cuMemcpyHtoDAsync_v2_ptsz", "drv_memcpy_async", _H2D, optional=True),
    _drv("cuMemcpyDtoHAsync_v2_ptsz", "drv_memcpy_async", _D2H, optional=True),
    _drv("cuMemcpyDtoDAsync_v2_ptsz", "drv_memcpy_async", _D2D, optional=True),
    _drv("cuMemcpy_ptds", "drv_memcpy", _DEFAULT, optional=True),
    _drv("cuMemcpyAsync_ptsz", "drv_memcpy_async", _DEFAULT, optional=True),
    _drv("cuStreamSynchronize_ptsz", "stream1", optional=True),
    _drv("cuGraphLaunch", "stream2", optional=True),
    _drv("cuMemAllocAsync", "malloc", optional=True),
    _drv("cuMemFreeAsync", "free", optional=True),
    _drv("cuMemAllocHost_v2", "hostalloc", optional=True),
    _drv("cuMemFreeHost", "hostptr1", optional=True),
    _drv("cuMemHostRegister_v2", "hostreg", optional=True),
    _drv("cuMemHostUnregister", "hostptr1", optional=True),
)

_LAUNCH_SHAPES = frozenset({"rt_launch", "drv_launch", "drv_launch_ex", "stream2"})
OP_NAMES: tuple[str, ...] = tuple(op.name for op in OPS)
# What each op does to the process's pinned host ranges (collector/pinned.py): +1 adds
# [host_ptr, host_ptr + bytes), -1 removes the range based at host_ptr.
PIN_EFFECT: dict[str, int] = {
    "cudaHostAlloc": 1, "cuMemHostAlloc": 1, "cudaMallocHost": 1, "cuMemAllocHost_v2": 1,
    "cudaHostRegister": 1, "cuMemHostRegister_v2": 1,
    "cudaFreeHost": -1, "cuMemFreeHost": -1, "cudaHostUnregister": -1, "cuMemHostUnregister": -1,
}
OP_APIS: tuple[str, ...] = tuple(op.api for op in OPS)

_KIND_SHAPES = frozenset({"drv_memcpy", "drv_memcpy_async"})
OP_ENTRY_ONLY = 0x8000  # OP_ENTRY_ONLY in ingero.bpf.c

# --api auto probes one layer per logical call. On CUDA 13 (H200 zoo recordings with both layers probed) every
# runtime call but these entered the exported driver symbol of the same call, nested: cudaLaunchKernel ->
# cuLaunchKernel, cudaMemcpyAsync -> cuMemcpy*Async_v2, cudaStreamSynchronize -> cuStreamSynchronize,
# cudaMalloc/Free -> cuMemAlloc_v2/cuMemFree_v2, cudaHostAlloc -> cuMemHostAlloc. cudaDeviceSynchronize did not
# enter cuCtxSynchronize, and cudaEventSynchronize has no probed driver counterpart: those stay on the runtime.
# The driver layer also sees direct driver users (cuBLAS's cuLaunchKernelEx, Triton, JAX).
AUTO_RUNTIME_OPS = frozenset({"cudaDeviceSynchronize", "cudaEventSynchronize"})


def ops_for(api: str, layer: str = "both") -> tuple[Op, ...]:
    """The ops one kind of library ('runtime' or 'driver') is probed for; with layer 'auto' (one layer per
    logical call) a runtime library is probed only for the calls that do not enter the driver's symbols."""
    if layer == "auto" and api == "runtime":
        return tuple(op for op in OPS if op.api == api and op.name in AUTO_RUNTIME_OPS)
    return tuple(op for op in OPS if op.api == api)


def entry_functions_c() -> str:
    """C source of one eBPF entry function per op, appended to ingero.bpf.c by the loader."""
    lines = []
    for op_id, op in enumerate(OPS):
        extra = f", {op.kind}" if op.shape in _KIND_SHAPES else ""
        lines.append(f"int {op.fn_name}(struct pt_regs *ctx) {{ return SHAPE_{op.shape}(ctx, {op_id}{extra}); }}")
        if op.launch:
            lines.append(f"int {op.entry_only_fn_name}(struct pt_regs *ctx) "
                         f"{{ return SHAPE_{op.shape}(ctx, {op_id | OP_ENTRY_ONLY}{extra}); }}")
    return "\n".join(lines) + "\n"


def library_api(path: str) -> str | None:
    """'runtime' for a libcudart, 'driver' for a libcuda, None for anything else (by file name)."""
    base = path.rsplit("/", 1)[-1]
    if base.startswith("libcudart.so"):
        return "runtime"
    if base.startswith("libcuda.so"):
        return "driver"
    return None

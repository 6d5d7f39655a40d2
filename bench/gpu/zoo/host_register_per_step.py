"""host_register_per_step: each step's batch is staged in a 64 MiB host buffer (numpy) and copied to the GPU.
Baseline: the buffer was page-locked once (cudaHostRegister), so the copy is pinned. For 10 s the code pins the
buffer on the fly every step and unpins it after the copy (cudaHostRegister / cudaHostUnregister per step, as a
helper that pins a numpy array for each transfer does): the driver locks and unlocks 16k pages every step, on the
CPU inside CUDA calls. CPUs 8-9. No culprit process: the feeder's own calls."""

import ctypes

import numpy as np

from common import Scenario, Trainer

sc = Scenario("host_register_per_step", "pinning_churn", "cudaHostRegister + cudaHostUnregister of a 64 MiB staging "
              "buffer every step for 10 s", job_cpus=[8, 9])
tr = Trainer(sc)
torch = tr.torch
BUF_BYTES = 64 << 20
buf = np.zeros(BUF_BYTES // 4, dtype=np.float32)
rng = np.random.default_rng(0)
buf[:] = rng.standard_normal(buf.size, dtype=np.float32)
n = tr.batch * tr.in_dim
labels = torch.randint(0, 10, (tr.batch,), device=tr.dev)


def _cudart():
    """cudaHostRegister / cudaHostUnregister: through torch's binding, or the process's libcudart by ctypes."""
    rt = torch.cuda.cudart()
    if hasattr(rt, "cudaHostRegister") and hasattr(rt, "cudaHostUnregister"):
        return rt.cudaHostRegister, rt.cudaHostUnregister, "torch.cuda.cudart()"
    path = next(line.split()[-1] for line in open("/proc/self/maps") if "libcudart" in line)
    lib = ctypes.CDLL(path)
    lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    return lib.cudaHostRegister, lib.cudaHostUnregister, path


if sc.cuda:
    register, unregister, via = _cudart()
    sc.extra["cudart"] = via
else:
    register = unregister = None
    sc.note("--device cpu: no cudaHostRegister (CPU smoke); the steps copy as before.")
ptr = buf.ctypes.data
pinned = {"now": False}


def pin() -> None:
    if register is not None and not pinned["now"]:
        rc = register(ptr, BUF_BYTES, 0)
        assert int(rc) == 0, f"cudaHostRegister returned {rc}"
        pinned["now"] = True


def unpin() -> None:
    if unregister is not None and pinned["now"]:
        rc = unregister(ptr)
        assert int(rc) == 0, f"cudaHostUnregister returned {rc}"
        pinned["now"] = False


def copy_step() -> None:
    k = (tr.i * n) % (buf.size - n)
    x = torch.from_numpy(buf[k:k + n]).view(tr.batch, tr.in_dim).to(tr.dev, non_blocking=True)
    tr.step(x, labels)


def churn_step() -> None:
    """Pin, copy and train, unpin: what a per-transfer pinning helper does."""
    pin()
    copy_step()
    unpin()


try:
    pin()
    tr.warmup()
    for _ in range(10):
        copy_step()
    sc.extra["buffer_bytes"] = BUF_BYTES
    sc.note(f"every step copies a {n * 4 >> 20} MiB slice of a {BUF_BYTES >> 20} MiB host buffer; baseline and "
            "recovery: the buffer registered once; window: registered and unregistered every step.")
    sc.standard_phases(copy_step, unpin, pin, churn_step)
finally:
    unpin()

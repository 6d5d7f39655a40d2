"""A training-like loop on the stand-in CUDA libraries, for same_process.py on a machine without a GPU: per step
~1.5 ms of host work (numpy, one thread) and the driver calls of workloads.py's train on the H200 (21 cuLaunchKernel,
3 cuMemcpyHtoDAsync_v2, a cuStreamSynchronize every 10 steps). Speaks `workloads.py blocks`' protocol.

    sh tests/standin/build.sh /tmp/stand; L=/tmp/stand/site-packages/nvidia/cu13/lib
    cd bench/gpu && STANDIN_LIB=$L WORKLOADS_PY=$PWD/standin_train.py CUDA_LIBS=$L/libcudart.so.13:$L/libcuda.so.1 \\
        COLLECTOR_CPUS=0 WORKLOAD_CPUS=1 python same_process.py /tmp/out --pairs 10 --workloads train --size train=2000
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402 - after the thread count is set

DRIVER = ctypes.CDLL(os.path.join(os.environ["STANDIN_LIB"], "libcuda.so.1"))  # PyTorch's launches end in the driver
DRIVER.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
DRIVER.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
DRIVER.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
INPUT, WEIGHT = np.random.rand(160, 160), np.random.rand(160, 160)
HOST_BUFFER = ctypes.create_string_buffer(4096)


def step(i: int, waits: list[int]) -> None:
    """21 small numpy ops, each followed by a launch; 3 copies; a sync every 10 steps (timed, like loss.item())."""
    x = INPUT
    for k in range(21):
        x = np.tanh(x @ WEIGHT) if k % 3 == 0 else x * 0.5 + 0.1
        DRIVER.cuLaunchKernel(None, 1, 1, 1, 32, 1, 1, 0, None, None, None)
    for _ in range(3):
        DRIVER.cuMemcpyHtoDAsync_v2(0, HOST_BUFFER, 64, None)
    if i % 10 == 0:
        t = time.perf_counter_ns()
        DRIVER.cuStreamSynchronize(None)
        waits.append(time.perf_counter_ns() - t)


def block(steps: int) -> dict:
    """One timed block, with a mark every 10 steps (what pace_states.py and attached_vs_detached.py read)."""
    marks: list[int] = []
    waits: list[int] = []
    t0_ns, t = time.time_ns(), time.perf_counter()
    for i in range(steps):
        if i % 10 == 0:
            marks.append(time.time_ns())
        step(i, waits)
    return {"pid": os.getpid(), "total": time.perf_counter() - t, "steps": steps, "t0_ns": t0_ns,
            "t1_ns": time.time_ns(),
            "marks_every": 10, "marks_unit": "step", "marks": marks, "item_wait_ns": waits, "sm_clock_mhz": []}


def main() -> None:
    """`standin_train.py blocks train STEPS`: 'ready', then one JSON line per 'go' on stdin."""
    steps = int(sys.argv[3])
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        print(json.dumps(block(steps)), flush=True)


if __name__ == "__main__":
    main()

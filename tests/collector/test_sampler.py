"""gpu_processes rows from NVML's answers, without a GPU: the conversion is a pure function."""

from __future__ import annotations

from types import SimpleNamespace as NS

from ingero_mcp.collector.sampler import Nvml, gpu_process_rows


def test_gpu_process_rows_from_nvml_like_answers() -> None:
    procs0 = [NS(pid=10, usedGpuMemory=1 << 30), NS(pid=11, usedGpuMemory=None)]  # None: the driver did not say
    samples0 = [NS(pid=10, timeStamp=5, smUtil=40), NS(pid=10, timeStamp=6, smUtil=60),
                NS(pid=12, timeStamp=6, smUtil=7)]
    procs1 = [NS(pid=20, usedGpuMemory=2 << 30)]
    rows = gpu_process_rows(123, [(0, procs0, samples0), (1, procs1, [])])
    got = list(zip(rows["gpu_id"], rows["pid"], rows["used_memory_bytes"], rows["sm_util_percent"], strict=True))
    assert got == [(0, 10, 1 << 30, 50.0), (0, 11, None, None), (0, 12, None, 7.0), (1, 20, 2 << 30, None)]
    assert rows["ts_ns"] == [123] * 4


def test_no_gpu_no_rows() -> None:
    assert gpu_process_rows(1, [])["pid"] == []
    nvml = Nvml()  # no driver on this machine (or no nvidia-ml-py): no handles, nothing written
    if not nvml.handles:
        assert nvml.processes(1)["pid"] == []

"""A slow phase at a busy GPU whose process was timing candidate kernels (cuDNN's benchmark mode at input shapes it had
not seen) is the GPU's work per step grown by trials the program asked for, said as such with the setting that makes
them, not 'no host-side cause' (natural_cudnn_benchmark_multiscale, held out in natural29: nothing above LOW while
iterations fell 24.6x and 97.6% of the run went to the trials). A saturated GPU whose steps' own kernels grew (staged
gpu_work_grows: no autotuning in its samples) stays the GPU's own pace. A window that is autotuning all through (no
slow phase stands out) says the trials beside the busy GPU, where it would have said 'GPU-bound'."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_held_out_words import NATURAL, _recomputed
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis.info import trace_info
from ingero_mcp.analysis.models import TimeWindow
from ingero_mcp.analysis.report import build_report
from ingero_mcp.store import open_store

CUDNN, GROWS, CONTROL = "natural_cudnn_benchmark_multiscale", "gpu_work_grows", "natural_healthy_niced_shard_prep"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = decompressed(NATURAL, [CUDNN, CONTROL], tmp_path_factory.mktemp("autotune"))
    return decompressed(NATURAL.parent / "zoo-v11", [GROWS], out)


def test_cudnn_autotuning_at_a_busy_gpu_is_named_with_its_setting(stores: Path) -> None:
    top = _top(_report(stores, CUDNN))
    assert top and top[0].root_cause == rc.GPU_SLOWER and top[0].severity == "HIGH", \
        [(c.root_cause, c.severity, c.summary) for c in top]
    assert "cuDNN's autotuning" in top[0].summary, top[0].summary
    assert "cudnn.benchmark = False" in " ".join(top[0].recommendations), top[0].recommendations
    share = next(e for e in top[0].evidence if "autotuning" in e.name)
    assert float(share.value) >= 50, share  # type: ignore[arg-type]
    _recomputed(stores, CUDNN, top)


def test_a_gpu_whose_own_kernels_grew_is_not_autotuning(stores: Path) -> None:
    report = _report(stores, GROWS)
    assert not any("autotuning" in c.summary for c in report.chains), [c.summary for c in report.chains]
    assert not any(c.root_cause == rc.GPU_SLOWER and c.severity != "LOW" for c in report.chains), \
        [(c.root_cause, c.severity, c.summary) for c in report.chains]


def test_a_window_autotuning_all_through_says_so_beside_the_busy_gpu(stores: Path) -> None:
    con = open_store(stores / f"{CUDNN}.duckdb")
    try:
        start = trace_info(con).window.start_ns  # type: ignore[union-attr]
        # +20 s to +24 s: inside the autotuning, steady at ~1 iteration/s, the GPU ~95% busy
        report = build_report(con, TimeWindow(start_ns=start + 20 * 10**9, end_ns=start + 24 * 10**9))
    finally:
        con.close()
    said = " ".join(report.verdict)
    assert "cuDNN's autotuning" in said and "benchmark" in said, report.verdict
    assert "the job is GPU-bound" not in said, report.verdict


def test_a_gpu_bound_job_without_autotuning_is_still_said_gpu_bound(stores: Path) -> None:
    said = " ".join(_report(stores, CONTROL).verdict)
    assert "the job is GPU-bound" in said and "autotuning" not in said, said

"""A slow phase at a busy GPU whose process was timing candidate kernels (cuDNN's benchmark mode at input shapes it had
not seen) is the GPU's work per step grown by trials the program asked for, said as such with the setting that makes
them, not 'no host-side cause' (natural_cudnn_benchmark_multiscale, held out in natural29: nothing above LOW while
iterations fell 24.6x and 97.6% of the run went to the trials). A saturated GPU whose steps' own kernels grew (staged
gpu_work_grows: no autotuning in its samples) stays the GPU's own pace."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_held_out_words import NATURAL, _recomputed
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis import recommend as rc

CUDNN, GROWS = "natural_cudnn_benchmark_multiscale", "gpu_work_grows"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = decompressed(NATURAL, [CUDNN], tmp_path_factory.mktemp("autotune"))
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

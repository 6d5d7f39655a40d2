"""The iteration marker on a recorded job with an outer loop (analysis/progress.py): natural_cpu_eval_metrics trains
1,313 steps in its 20 s run and evaluates every ~150 steps, copying 2 MB of predictions to the host each time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import REPO
from test_zoo import _report, decompressed

NATURAL = REPO / "investigations" / "zoo-natural"
EVAL = "natural_cpu_eval_metrics"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("marker")
    decompressed(NATURAL, [EVAL], out)
    return out


def test_the_steps_mark_iterations_not_the_outer_loop(stores: Path) -> None:
    """The evaluation's copy recurs 9 times (a mark every ~2.5 s) and the step's sync 1,528 times: the marker is the
    step's, whose count is within a fifth of the job's own steps over the trace's span, not the outer loop's."""
    truth = json.loads((NATURAL / f"{EVAL}.truth.json").read_text())
    marker = next(p for p in _report(stores, EVAL).accounting.progress if p.pid == truth["feeder"]["pid"])
    assert marker.median_gap_ns < 1_000_000_000, (marker.label, marker.marks, marker.median_gap_ns)
    assert marker.marks >= 0.8 * truth["self"]["steps"], (marker.label, marker.marks, truth["self"]["steps"])

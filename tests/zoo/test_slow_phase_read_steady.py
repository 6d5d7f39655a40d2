"""A slow phase no part stood out in (every part slower alike, against a baseline host-bound too) is read as the rest of
the run is, by the steady findings: natural_compile_dynamic_shapes, whose recompiles filled its whole measured run and
whose baseline was its last 2 s, had no HIGH or MEDIUM finding. And a wait walked through PyTorch's autograd thread
into a child process is the backward pass waiting on that process, not a wait on a loader's workers."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_held_out_words import NATURAL, _recomputed
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis import recommend as rc

COMPILE = "natural_compile_dynamic_shapes"
JOB, POOL = 2145, 2160  # the training process; inductor's compile-worker pool, a child process of it


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decompressed(NATURAL, [COMPILE], tmp_path_factory.mktemp("slow_phase_read_steady"))


def test_a_slow_phase_no_part_explains_is_read_as_steady(stores: Path) -> None:
    report = _report(stores, COMPILE)
    slow = [p for p in report.accounting.phases if p.pid == JOB and p.kind == "slow"]
    assert len(slow) == 1 and slow[0].window.duration_ns >= 20e9, slow  # the measured run, 2.9x the baseline's pace
    top = _top(report)
    assert top, [c.summary for c in report.chains]  # before: none HIGH or MEDIUM
    inside = [c for c in top if c.window.start_ns < slow[0].window.end_ns and c.window.end_ns > slow[0].window.start_ns]
    assert {c.root_cause for c in inside} >= {rc.WAITING_ON_PROCESS, rc.HOST_BOUND}, [c.root_cause for c in inside]
    # the host-bound part said as the compiles it was, with their fix
    host = next(c for c in inside if c.root_cause == rc.HOST_BOUND)
    assert "compiling GPU code at run time" in host.summary, host.summary
    assert any("compiled as the job runs" in r for r in host.recommendations), host.recommendations
    _recomputed(stores, COMPILE, top)


def test_a_wait_through_the_autograd_thread_is_not_a_loaders(stores: Path) -> None:
    """The main thread slept in backward() until pt_autograd_0 woke it, and that thread waited on the compile pool:
    the pool sets the pace, and DataLoader workers (which never wake the backward pass) are not the fix."""
    chain = next(c for c in _top(_report(stores, COMPILE)) if c.root_cause == rc.WAITING_ON_PROCESS)
    assert chain.severity == "HIGH", chain.severity
    assert "woken by pt_autograd_0" in chain.summary and f"itself waiting on python3[{POOL}/" in chain.summary, \
        chain.summary
    assert chain.culprits[0].pid == POOL, chain.culprits
    assert not any(c.root_cause == rc.INPUT_WAIT for c in _top(_report(stores, COMPILE)))
    fixes = " ".join(chain.recommendations)
    assert "num_workers" not in fixes and "DataLoader" not in fixes, fixes

"""A phase that lost progress leads and the steady state around it is its context, unless that steady state is the
phase's lead cause and explains more seconds than the phase: then the phase was a worse stretch of it, and the cause
all along leads, with its own severity. natural_pk_sampler_label_scan (natural27, scored blind) led with a 1.3x stall
of 2.5 s, MEDIUM, above the sampler's scan, 12.5 s of the run, demoted to MEDIUM: the report's order contradicted its
own heading (the one that explains most first)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_held_out_words import NATURAL, _recomputed
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis.causes.findings import steady_context

PK = "natural_pk_sampler_label_scan"


def test_a_steady_cause_is_context_to_a_phase_unless_it_is_the_phase_cause_and_larger() -> None:
    host, other = rc.HOST_BOUND, rc.OWN_THREADS_CPU
    # the same cause, larger all along than in the phase: not context
    assert steady_context([("contrast", host, "MEDIUM", 2.5), ("steady", host, "HIGH", 12.5)]) == [False, False]
    # the same cause, smaller: context
    assert steady_context([("contrast", host, "MEDIUM", 8.0), ("steady", host, "HIGH", 3.0)]) == [False, True]
    # another cause, however large: the phase is the news
    assert steady_context([("contrast", other, "MEDIUM", 2.5), ("steady", host, "HIGH", 10.5)]) == [False, True]
    # the phase's second cause is not its cause: the phase led by another is the news (zoo-v5 affinity_narrowed)
    assert steady_context([("contrast", other, "HIGH", 7.3), ("contrast", host, "MEDIUM", 2.2),
                           ("steady", host, "HIGH", 6.3)]) == [False, False, True]
    # the phase's cause, larger than that cause's share of the phase but not than the whole phase: context
    assert steady_context([("contrast", host, "HIGH", 4.0), ("contrast", other, "MEDIUM", 3.0),
                           ("steady", host, "HIGH", 6.0)]) == [False, False, True]
    # the GPU's own pace all along is no host-side story to lead with (gpu_work_grows without NVML's rows)
    slower = rc.GPU_SLOWER
    assert steady_context([("contrast", slower, "MEDIUM", 6.5), ("steady", slower, "HIGH", 10.4)]) == [False, True]
    # a phase said LOW lost no progress worth leading with: nothing is context
    assert steady_context([("contrast", host, "LOW", 0.4), ("steady", host, "HIGH", 12.5)]) == [False, False]
    assert steady_context([("steady", host, "HIGH", 12.5)]) == [False]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decompressed(NATURAL, [PK], tmp_path_factory.mktemp("steady_cause_leads"))


def test_the_sampler_scan_all_along_leads_its_worse_stretch(stores: Path) -> None:
    report = _report(stores, PK)
    top = _top(report)
    assert [c.root_cause for c in top] == [rc.HOST_BOUND, rc.HOST_BOUND], [c.summary for c in top]
    lead, stall = top
    assert lead.severity == "HIGH" and stall.severity == "MEDIUM", (lead.severity, stall.severity)
    assert (lead.seconds_lost or 0) > (stall.seconds_lost or 0) > 0, (lead.seconds_lost, stall.seconds_lost)
    assert "stalled" in stall.summary and "stalled" not in lead.summary, (lead.summary, stall.summary)
    assert lead.frames is not None and "PKSampler.__iter__" in lead.frames.sentence, lead.frames
    _recomputed(stores, PK, top)

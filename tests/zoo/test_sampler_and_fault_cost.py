"""Two readings the natural27 and natural28 jobs showed wrong. A DataLoader's sampler runs in the main process on the
thread that iterates the loader, whatever num_workers: host work there is said as the sampler's, with a fix for the
sampler, not 'more workers' (natural_pk_sampler_label_scan, natural_weighted_sampler_epochs: four workers idle). And
page faults are the cause only where the memory allocated could have cost at least half the time it must explain, at
a generous 4 KiB per 2 us: the weighted sampler's epoch-start draws allocated 26,000-36,000 pages/s (a few hundredths
of each second at most) and were said as page faults, with the fix to reuse host buffers."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_held_out_words import NATURAL, _recomputed
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis import recommend as rc

PK, WEIGHTED, STORM = "natural_pk_sampler_label_scan", "natural_weighted_sampler_epochs", "page_fault_storm"
STAGED = NATURAL.parent / "zoo"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = decompressed(NATURAL, [PK, WEIGHTED], tmp_path_factory.mktemp("sampler_and_fault_cost"))
    return decompressed(STAGED, [STORM], out)


@pytest.mark.parametrize("name", [PK, WEIGHTED])
def test_a_samplers_work_gets_the_samplers_fix(stores: Path, name: str) -> None:
    top = _top(_report(stores, name))
    assert top and top[0].root_cause == rc.HOST_BOUND, [(c.root_cause, c.summary) for c in top]
    for c in (c for c in top if c.root_cause == rc.HOST_BOUND):
        assert "in a DataLoader's sampler" in c.summary, c.summary
        fix = " ".join(c.recommendations)
        assert "whatever num_workers" in fix and "num_workers=N" not in fix, fix
    assert not any(c.root_cause == rc.PAGE_FAULTS for c in top), [(c.root_cause, c.summary) for c in top]
    _recomputed(stores, name, top)


def test_a_fault_storm_that_fills_the_time_is_still_page_faults(stores: Path) -> None:
    top = _top(_report(stores, STORM))
    assert top and top[0].root_cause == rc.PAGE_FAULTS and top[0].severity == "HIGH", \
        [(c.root_cause, c.severity, c.summary) for c in top]

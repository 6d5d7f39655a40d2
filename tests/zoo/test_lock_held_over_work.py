"""A thread that sleeps on a lock of the program's own while another thread of its process holds it over slow work
waits for the lock, not for the work: said as the lock, where it is taken, and the fix that moves the work outside it
(natural_registry_lock_export, held out in natural31: each step's record() waited on the registry's lock while the
exporter thread gzipped the registry under it, said as 'the thread waited on metrics_export's work' with the fix to
make that work smaller). A thread woken by a pool whose own waits are the standard library's (a multiprocessing pool's
results, natural_pool_map_augment) is not read as a lock, and the job's own process is not one of that pool's."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_held_out_words import NATURAL, _recomputed
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis import recommend as rc

LOCKED, POOL = "natural_registry_lock_export", "natural_pool_map_augment"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decompressed(NATURAL, [LOCKED, POOL], tmp_path_factory.mktemp("lock_held_over_work"))


def test_a_lock_held_over_another_threads_work_is_said_as_the_lock(stores: Path) -> None:
    top = _top(_report(stores, LOCKED))
    assert top and top[0].root_cause == rc.LOCK_OR_GIL, [(c.root_cause, c.summary) for c in top]
    lead = top[0]
    assert "lock of the program's own (taken in MetricsRegistry.record" in lead.summary, lead.summary
    assert any(k.comm == "metrics_export" for k in lead.culprits), lead.culprits
    fix = " ".join(lead.recommendations)
    assert "outside it" in fix and "MetricsRegistry.record" in fix, fix
    assert any("stacked sleep in one Python function" in e.name for e in lead.evidence), [e.name for e in lead.evidence]
    _recomputed(stores, LOCKED, top)


def test_a_wait_on_a_pools_results_is_not_a_lock(stores: Path) -> None:
    top = _top(_report(stores, POOL))
    assert top and top[0].root_cause == rc.INPUT_WAIT, [(c.root_cause, c.summary) for c in top]
    assert not any(c.root_cause == rc.LOCK_OR_GIL for c in top), [(c.root_cause, c.summary) for c in top]
    # the pool's processes are its children: the job's own process (its result-handler thread, named as the pool's
    # processes are, woke the walk's hop too) is not listed among them
    job = top[0].pids[0]
    assert not any(k.pid == job and k.relation == "child process" for k in top[0].culprits), top[0].culprits
    assert f"python3[{job}," not in top[0].summary, top[0].summary

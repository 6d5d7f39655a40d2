"""What the read of the held-out natural jobs (natural19-21 and the spawn job) found the reports saying that the jobs
did not do, fixed after their one score: each on the store that showed it."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_fixtures import check_evidence_sql
from paths import REPO
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis.models import CausalChain
from ingero_mcp.store import open_store
from ingero_mcp.store.views import lay_views

NATURAL = REPO / "investigations" / "zoo-natural"
SPAWN, ONE_CPU, CACHE = "natural_spawn_workers_each_epoch", "natural_inherited_one_cpu", "natural_locked_sample_cache"
MANAGER, PNG = "natural_manager_dict_counters", "natural_png_snapshots_main_thread"


def _recomputed(stores: Path, name: str, chains: list[CausalChain]) -> None:
    """Every evidence SQL of the chains, run on a fresh read-only connection, gives back the value shown."""
    con = open_store(stores / f"{name}.duckdb")
    try:
        lay_views(con)
        assert check_evidence_sql(con, chains) == sum(1 for c in chains for e in c.evidence if e.sql)
    finally:
        con.close()


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decompressed(NATURAL, [SPAWN, ONE_CPU, CACHE, MANAGER, PNG], tmp_path_factory.mktemp("held_out_words"))


def test_workers_starting_up_are_not_said_to_fall_behind(stores: Path) -> None:
    """DataLoader workers spawned anew each epoch spent 58-63% of their samples in Python's import system while the
    main thread waited on them: said as starting up, with a fix that keeps them alive, not one that adds more (which
    would start alike)."""
    chain = next(c for c in _top(_report(stores, SPAWN)) if c.root_cause == rc.INPUT_WAIT)
    assert "starting up, importing modules" in chain.summary and "not keep up" not in chain.summary, chain.summary
    fix = chain.recommendations[0]
    assert "persistent_workers=True" in fix and "run more of them" not in fix and "cannot keep up" not in fix, fix


def test_a_waker_renamed_after_it_woke_is_named_alike_by_text_and_sql(stores: Path) -> None:
    """A spawned worker woke the main thread as python3 and was named pt_data_worker later: the text names it by its
    latest name, so the evidence SQL that recomputes the wakers does too (the fresh-clone CI caught the two apart)."""
    report = _report(stores, SPAWN)
    own = [c for c in report.chains if c.origin == "ingero-mcp"]
    named = [e for c in own for e in c.evidence if e.name.startswith("who ended the sleeps") and e.sql]
    assert named and any("pt_data_worker" in str(e.value) for e in named)
    _recomputed(stores, SPAWN, own)


def test_a_job_held_to_one_cpu_is_said_so(stores: Path) -> None:
    """The whole job narrowed to one CPU at its start (a mis-set launcher's binding): the main thread's workers waited
    for a CPU behind each other on CPU 2, never moved to the host's other 15, most of them idle. The report says where
    they ran, that other CPUs were free, and that a CPU mask likely keeps them there, with SQL that recomputes it."""
    chain = next(c for c in _top(_report(stores, ONE_CPU)) if c.root_cause == rc.OWN_WORKERS_CPU)
    assert "threads ran on CPU 2 only, of the host's 16, while" in chain.summary, chain.summary
    assert "other CPUs were idle half that time or more: a CPU mask" in chain.summary, chain.summary
    ev = next(e for e in chain.evidence if e.name.startswith("CPUs the job's threads ran on"))
    _recomputed(stores, ONE_CPU, [chain])
    con = open_store(stores / f"{ONE_CPU}.duckdb")
    try:
        lay_views(con)
        cpus, threads, host, n, idle, recorded = con.execute(ev.sql).fetchall()[0]
    finally:
        con.close()
    assert (cpus, n, host) == ("CPU 2", 1, 16) and f"{threads} threads" in str(ev.value), ev.value
    assert 1 <= idle < recorded and f"; {idle} idle" in str(ev.value), (idle, ev.value)  # the scheduler had free CPUs


def test_a_pool_queued_for_its_own_lock_is_not_given_the_gils_fix(stores: Path) -> None:
    """Four pool threads took turns at the cache's threading.Lock, held while a miss was inflated (zlib, which lets
    the GIL go): their stacks slept in CachedDataset._decoded on a semaphore, 1% in the GIL's timed wait. Said as the
    program's own lock, where it is taken, with the lock's fix, not the GIL's."""
    chain = next(c for c in _top(_report(stores, CACHE)) if c.root_cause == rc.LOCK_OR_GIL)
    assert "a lock of the program's own, taken in CachedDataset._decoded" in chain.summary, chain.summary
    fix = chain.recommendations[0]
    assert "GIL" not in fix and "hold that lock only around" in fix, fix
    _recomputed(stores, CACHE, [chain])


def test_the_gaps_work_is_read_in_the_gaps(stores: Path) -> None:
    """The step kept its counters and every loss in a Manager's dict and list: six proxy round trips a step, in the
    gaps after each sync where nothing was queued. Over the window the main thread ran the model's code (72% of its
    samples); in the gaps, 54% of them talked to the manager, whose thread ended all its sleeps there. The gaps'
    finding says what ran in the gaps, with the fix for shared objects, not the model's."""
    chain = next(c for c in _report(stores, MANAGER).chains if c.root_cause == rc.HOST_BOUND)
    assert "in the gaps with nothing queued talking to another process" in chain.summary, chain.summary
    fix = chain.recommendations[0]
    assert "pickled, sent to another process" in fix, fix
    # the gaps' sleeps were the manager's replies: the window's wait (the backward's) lends them no fix
    assert not any("many small kernels" in r for r in chain.recommendations), chain.recommendations
    _recomputed(stores, MANAGER, [chain])


def test_compressing_is_not_said_as_decompressing(stores: Path) -> None:
    """PNG snapshots encoded on the main thread every few steps: zlib's deflate under PIL's encoder. Said as data
    compressed on the thread, with a fix that lowers the level or moves it, not one about data stored compressed."""
    chain = next(c for c in _top(_report(stores, PNG)) if c.root_cause == rc.HOST_BOUND)
    assert "compressing data (zlib's deflate" in chain.summary and "decompressing" not in chain.summary, chain.summary
    fix = chain.recommendations[0]
    assert "compress_level=1" in fix and "inflated again" not in fix, fix

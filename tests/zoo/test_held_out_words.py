"""What the read of the held-out natural jobs (natural19-21 and the spawn job) found the reports saying that the jobs
did not do, fixed after their one score: each on the store that showed it."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_fixtures import check_evidence_sql
from paths import REPO
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.store import open_store
from ingero_mcp.store.views import lay_views

NATURAL = REPO / "investigations" / "zoo-natural"
SPAWN, ONE_CPU = "natural_spawn_workers_each_epoch", "natural_inherited_one_cpu"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decompressed(NATURAL, [SPAWN, ONE_CPU], tmp_path_factory.mktemp("held_out_words"))


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
    con = open_store(stores / f"{SPAWN}.duckdb")
    try:
        lay_views(con)
        own = [c for c in report.chains if c.origin == "ingero-mcp"]
        named = [e for c in own for e in c.evidence if e.name.startswith("who ended the sleeps") and e.sql]
        assert named and any("pt_data_worker" in str(e.value) for e in named)
        assert check_evidence_sql(con, own) == sum(1 for c in own for e in c.evidence if e.sql)
    finally:
        con.close()


def test_a_job_held_to_one_cpu_is_said_so(stores: Path) -> None:
    """The whole job narrowed to one CPU at its start (a mis-set launcher's binding): the main thread's workers waited
    for a CPU behind each other on CPU 2, never moved to the host's other 15. The report says where they ran and that
    a CPU mask likely keeps them there, with SQL that recomputes it."""
    chain = next(c for c in _top(_report(stores, ONE_CPU)) if c.root_cause == rc.OWN_WORKERS_CPU)
    assert "threads ran on CPU 2 only, of the host's 16: a CPU mask" in chain.summary, chain.summary
    ev = next(e for e in chain.evidence if e.name.startswith("CPUs the job's threads ran on"))
    con = open_store(stores / f"{ONE_CPU}.duckdb")
    try:
        lay_views(con)
        cpus, threads, host = con.execute(ev.sql).fetchall()[0]
    finally:
        con.close()
    assert cpus == [2] and host == 16 and f"{threads} threads" in str(ev.value), (cpus, threads, host, ev.value)

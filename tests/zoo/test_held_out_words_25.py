"""What the held-out group natural25 showed a report saying wrong, fixed after its one score: on the store that showed
it, the share recomputed by SQL, and on a store whose workers did not take turns."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_held_out_words import NATURAL, _recomputed
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis.causes.turns import TURNS_SHARE, turns_sql
from ingero_mcp.analysis.models import TimeWindow
from ingero_mcp.store import open_store
from ingero_mcp.store.views import lay_views

FLOCK, COLLATE = "natural_flock_hdf5_workers", "natural_text_collate"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decompressed(NATURAL, [FLOCK, COLLATE], tmp_path_factory.mktemp("held_out_words_25"))


def _turns(db: Path, job: int, w: TimeWindow) -> tuple[float | None, str | None]:
    con = open_store(db)
    try:
        lay_views(con)
        return con.execute(turns_sql(job, "pt_data_worker", w)).fetchall()[0]
    finally:
        con.close()


def test_workers_that_take_turns_at_a_lock_are_not_told_to_be_more(stores: Path) -> None:
    """Four DataLoader workers took an exclusive flock around every read: one worked at a time, the others slept
    until it let go, and the loader ran about as fast as one worker. The report said they could not keep up, with
    the fix to add workers. Each worker's sleep ended by another worker of the pool says they took turns: said so,
    with the fix to give each its own file and take no lock around reads."""
    chain = next(c for c in _top(_report(stores, FLOCK)) if c.root_cause == rc.INPUT_WAIT)
    assert chain.severity == "HIGH", chain.severity
    assert "they took turns" in chain.summary and "more of them would not help" in chain.summary, chain.summary
    assert "more of them will not help" in chain.recommendations[0], chain.recommendations
    assert not any("Add workers" in r or "run more of them" in r for r in chain.recommendations), chain.recommendations
    turns = next(e for e in chain.evidence if "slept until another of them woke it" in e.name)
    share, _syscall = _turns(stores / f"{FLOCK}.duckdb", 675, chain.window)
    assert share == turns.value >= TURNS_SHARE, (share, turns.value)
    _recomputed(stores, FLOCK, [chain])


def test_workers_that_each_work_alone_do_not_take_turns(stores: Path) -> None:
    """Two workers collating text batches, each busy on its own: no worker's sleep was ended by the other, and the
    report's fix still says they do not keep up."""
    chain = next(c for c in _top(_report(stores, COLLATE)) if c.root_cause == rc.INPUT_WAIT)
    assert "took turns" not in chain.summary, chain.summary
    share, _syscall = _turns(stores / f"{COLLATE}.duckdb", 890, chain.window)
    assert share is None or share < TURNS_SHARE, share

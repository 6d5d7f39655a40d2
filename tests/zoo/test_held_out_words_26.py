"""What the held-out group natural26 showed a report saying wrong, fixed after its one score: on the store that showed
it, the share recomputed by SQL, and on a store whose workers took turns among themselves (not at a server)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_held_out_words import NATURAL, _recomputed
from test_zoo import _report, _top, decompressed

from ingero_mcp.analysis import recommend as rc
from ingero_mcp.analysis.causes.turns import TURNS_SHARE, turns_sql
from ingero_mcp.store import open_store
from ingero_mcp.store.views import lay_views

SERVER, FLOCK = "natural_manager_dict_sample_cache", "natural_flock_hdf5_workers"
JOB, MANAGER = 685, 689  # the training process; the multiprocessing.Manager's server, a child process of it


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decompressed(NATURAL, [SERVER, FLOCK], tmp_path_factory.mktemp("held_out_words_26"))


def test_workers_that_wait_on_one_server_are_not_told_to_be_more(stores: Path) -> None:
    """Four DataLoader workers asked a multiprocessing.Manager's server for every sample (a dict proxy shared as a
    cache): the walk went through them to the server, and the report said they could not keep up, with the fix to
    add workers, who would queue at the server too. Their sleeps ended by that process say they wait on it: said so,
    the server named, with the fix to keep what they share where each reads it directly."""
    chain = next(c for c in _top(_report(stores, SERVER)) if c.root_cause == rc.INPUT_WAIT)
    assert chain.severity == "HIGH", chain.severity
    assert f"the workers waited on python3[{MANAGER}]" in chain.summary, chain.summary
    assert "more workers would queue there too" in chain.summary, chain.summary
    assert chain.culprits[0].pid == MANAGER, chain.culprits
    fix = chain.recommendations[0]
    assert f"themselves waited on python3[{MANAGER}]" in fix and "more workers will not help" in fix, fix
    assert not any("Add workers" in r or "run more of them" in r for r in chain.recommendations), chain.recommendations
    server = next(e for e in chain.evidence if f"slept until python3[{MANAGER}] woke it" in e.name)
    con = open_store(stores / f"{SERVER}.duckdb")
    try:
        lay_views(con)
        share, _syscall = con.execute(turns_sql(JOB, "pt_data_worker", chain.window, server=MANAGER)).fetchall()[0]
        among, _ = con.execute(turns_sql(JOB, "pt_data_worker", chain.window)).fetchall()[0]
    finally:
        con.close()
    assert share == server.value >= TURNS_SHARE, (share, server.value)
    assert among is None or among < TURNS_SHARE, among  # not each other: the server woke them
    _recomputed(stores, SERVER, [chain])


def test_workers_that_take_turns_among_themselves_still_say_so(stores: Path) -> None:
    """The flock workers' walk ends at one of them: no server between, their turns said as before."""
    chain = next(c for c in _top(_report(stores, FLOCK)) if c.root_cause == rc.INPUT_WAIT)
    assert "they took turns" in chain.summary and "waited on python3" not in chain.summary, chain.summary
    assert "themselves waited on" not in chain.recommendations[0], chain.recommendations

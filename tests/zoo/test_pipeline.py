"""Who sets the pace in a pipeline (waits.py: a waker with slack passes the wait on to the stage that was saturated),
on two recorded jobs: a DataLoader whose pin-memory thread stood between the trainer and two saturated workers, and a
data server whose helper process ran whenever the server waited on it but was otherwise idle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import REPO
from test_zoo import _report, _top, decompressed

from ingero_mcp.store import open_store

NATURAL = REPO / "investigations" / "zoo-natural"
ZOO_V11 = REPO / "investigations" / "zoo-v11"
PIN = "natural_pin_memory_thread"
SHM = "natural_big_batches_shm"
PREFETCH = "natural_thread_prefetch_python"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pipeline")
    decompressed(NATURAL, [PIN], out)
    decompressed(NATURAL, [SHM, PREFETCH], out)
    decompressed(ZOO_V11, ["healthy_socket_chain"], out)
    return out


def test_the_saturated_workers_behind_the_pin_thread_set_the_pace(stores: Path) -> None:
    """The pin-memory thread ran 68% of the run and waited on the workers, which ran 98-99%: the finding blames a
    worker first (waiting-on-workers), says the pin-memory thread is the hop between, and does not say the pin-memory
    thread's own work set the pace."""
    truth = json.loads((NATURAL / f"{PIN}.truth.json").read_text())
    workers = {w["pid"] for w in truth["workers"]}
    own = truth["self"]
    assert own["workers_run_share_min"] >= 0.9 > own["pin_run_share"] + 0.1, own  # the premise, as measured
    chain = _top(_report(stores, PIN))[0]
    assert chain.root_cause == "waiting-on-workers", chain.summary
    assert chain.culprits[0].pid in workers, chain.culprits[:2]
    assert f"through pt_data_pin[{truth['feeder']['pid']}/{truth['pin_thread']['tid']}]" in chain.summary, chain.summary
    assert "pt_data_pin" not in chain.summary.split("which were")[-1], chain.summary
    named = chain.summary.split("its worker processes pt_data_worker[")[1].split("]")[0]
    assert named == ",".join(map(str, sorted(workers))), (named, workers)  # both saturated workers, not the one reached


def test_a_helper_busy_only_while_waited_on_is_not_the_pace(stores: Path) -> None:
    """healthy_socket_chain: the trainer waits on batchsrv, which waits on featd ~1 ms a request; featd runs whenever
    batchsrv waits on it, yet is idle most of the run: the walk stops at batchsrv (unchanged from before the slack
    rule), featd is not named first."""
    chain = _top(_report(stores, "healthy_socket_chain"))[0]
    assert chain.culprits[0].comm == "batchsrv", (chain.summary, chain.culprits[:2])
    assert "featd" not in chain.summary, chain.summary


def test_the_fix_names_the_dataloader_only_where_the_workers_are_one(stores: Path) -> None:
    """The wait-on-workers fix: PyTorch's DataLoader knobs (prefetch_factor, persistent_workers) are the fix where the
    workers are a DataLoader's (pt_data_worker); for a data server over a socket (batchsrv, a process of the job's own)
    the fix says what holds for any worker (cheaper work, more of them, ask ahead) and names the DataLoader only as a
    condition."""
    loader = _top(_report(stores, PIN))[0]
    server = _top(_report(stores, "healthy_socket_chain"))[0]
    assert loader.root_cause == server.root_cause == "waiting-on-workers", (loader.summary, server.summary)
    assert "prefetch_factor" in loader.recommendations[0] and "If they are" not in loader.recommendations[0]
    fix = server.recommendations[0]
    assert "ask for the next before using this one" in fix, fix
    assert fix.index("If they are a PyTorch DataLoader's") < fix.index("prefetch_factor"), fix


def test_work_hidden_behind_saturated_workers_is_said_not_asserted(stores: Path) -> None:
    """natural_big_batches_shm: the trainer waited 55% on two DataLoader workers that ran 92-100% (they set the pace),
    and spent ~21% of each second in pageable copies (17-29% a second, around the 20% a second needs): the copies are
    found over the steady stretch as a whole, and said LOW with the pace, its share recomputed by its SQL."""
    report = _report(stores, SHM)
    lead = _top(report)[0]
    assert lead.root_cause == "waiting-on-workers" and lead.severity == "HIGH", lead.summary
    copies = [c for c in report.chains if c.root_cause == "pageable-copies"]
    assert copies and copies[0].severity == "LOW", [(c.severity, c.root_cause) for c in report.chains]
    assert (copies[0].seconds_lost or 0) >= 3.0, copies[0].seconds_lost  # ~21% of a 22 s stretch
    assert "not what set the pace: it waited on pt_data_worker[" in copies[0].summary, copies[0].summary
    pace = next(e for e in copies[0].evidence if e.name.startswith("the pace"))
    con = open_store(stores / f"{SHM}.duckdb")
    try:
        assert con.execute(pace.sql).fetchall()[0][0] == pace.value >= 90, (pace.sql, pace.value)
    finally:
        con.close()


def test_a_thread_of_the_same_process_does_not_hide_the_work(stores: Path) -> None:
    """natural_thread_prefetch_python: the trainer waits on its own prefetch thread (one GIL between them), so its own
    Python work takes the producer's turns: its host-bound finding stays MEDIUM."""
    report = _report(stores, PREFETCH)
    host = [c for c in report.chains if c.root_cause == "host-bound" and (c.seconds_lost or 0) > 1.0]
    assert host and host[0].severity == "MEDIUM", [(c.severity, c.root_cause, c.seconds_lost) for c in report.chains]
    assert "not what set the pace" not in host[0].summary

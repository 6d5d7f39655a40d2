"""Who sets the pace in a pipeline (waits.py: a waker with slack passes the wait on to the stage that was saturated),
on two recorded jobs: a DataLoader whose pin-memory thread stood between the trainer and two saturated workers, and a
data server whose helper process ran whenever the server waited on it but was otherwise idle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import REPO
from test_zoo import _report, _top, decompressed

NATURAL = REPO / "investigations" / "zoo-natural"
ZOO_V11 = REPO / "investigations" / "zoo-v11"
PIN = "natural_pin_memory_thread"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pipeline")
    decompressed(NATURAL, [PIN], out)
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

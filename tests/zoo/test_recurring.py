"""Stalls that recur, on a recorded natural job: told once, as often as they came, with every occurrence's culprit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import REPO
from test_zoo import _report, _top, decompressed

NATURAL = REPO / "investigations" / "zoo-natural"
EVALS = "natural_subprocess_eval"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("recurring")
    decompressed(NATURAL, [EVALS], out)
    return out


def test_an_evaluation_run_at_every_stall_is_one_story_naming_every_run(stores: Path) -> None:
    """natural_subprocess_eval: every ~4 s the main thread runs an evaluation script with subprocess.run and waits for
    it (5 runs in the measured run, 6.3 s asleep in them by the job's clocks; truth `children`). One finding says the
    stalls after the start-up together, and names each run's child, not only the worst one's."""
    truth = json.loads((NATURAL / f"{EVALS}.truth.json").read_text())
    top = _top(_report(stores, EVALS))
    assert len(top) == 1, [(c.severity, c.root_cause, c.summary) for c in top]
    chain = top[0]
    assert chain.root_cause == "waiting-on-process" and "stalled 5 times" in chain.summary, chain.summary
    assert chain.seconds_lost is not None and 0.8 * truth["self"]["sub_sleep_s"] <= chain.seconds_lost, chain
    named = {c.pid for c in chain.culprits if c.relation == "child process"}
    assert named == set(truth["children"]["pids"]), (named, truth["children"])

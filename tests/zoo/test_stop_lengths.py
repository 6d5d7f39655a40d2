"""A recurrent stall's length, from the marks: its episodes are read in bins (or whole seconds where slow phases
recurred), so their mean length rounds each stop up to the bins around it. natural_subprocess_eval's evaluations
took 1.30 s on average by the job's clock (1,303 ms) and the report said "1.80 s each"; natural_sync_torch_save_ckpt's
checkpoints 1.87 s, said "2.25 s each". The longest pause between two iterations in each episode is the stop itself."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest
from paths import REPO
from test_zoo import _report, _top, decompressed

NATURAL = REPO / "investigations" / "zoo-natural"
EVAL, CKPT = "natural_subprocess_eval", "natural_sync_torch_save_ckpt"
MEAN_MS = {EVAL: "eval_ms_mean", CKPT: "ckpt_ms_mean"}
EACH = re.compile(r"\(([0-9.]+)(?:-([0-9.]+))? s each by the longest pause between two iterations")


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decompressed(NATURAL, [EVAL, CKPT], tmp_path_factory.mktemp("stops"))


@pytest.mark.parametrize("name", [EVAL, CKPT])
def test_a_stop_is_said_as_long_as_the_job_timed_it(stores: Path, name: str) -> None:
    """The range said holds the job's own mean (each pause spans one step more than the stop: one step's slack), and
    the evidence's SQL gives the range's ends back from the store."""
    own = json.loads((NATURAL / f"{name}.truth.json").read_text())["self"]
    report = _report(stores, name)
    chain = next((c for c in _top(report) if EACH.search(c.summary)), None)
    assert chain is not None, [c.summary[:160] for c in _top(report)]
    got = EACH.search(chain.summary)
    lo, hi = float(got.group(1)), float(got.group(2) or got.group(1))
    step_s = own["wall_s"] / own["steps"]
    assert lo - step_s - 0.01 <= own[MEAN_MS[name]] / 1e3 <= hi + 0.01, (lo, hi, own[MEAN_MS[name]], step_s)
    ends = {e.name.rsplit(" ", 1)[-1]: e for e in chain.evidence if e.name.startswith("the longest pause")}
    con = duckdb.connect(str(stores / f"{name}.duckdb"), read_only=True)
    try:
        for end, said in (("shortest", lo), ("longest", hi)):
            value = con.execute(ends[end].sql).fetchall()[0][0]
            assert value == ends[end].value and abs(value - said) < 0.006, (end, value, said)
    finally:
        con.close()
